# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %%
# COLAB INSTALL CELL: autograder/build.py writes INSTALL_CELL here

# %% [markdown]
# # 第 1 课：vLLM V1 源码地图：AsyncLLM、EngineCore 与 Worker
#
# ## 本课目标与通过标准
#
# 本课产出：能从在线请求入口沿真实调用链追到一次模型执行和输出回传，并准确说明 frontend、EngineCore、Scheduler、Executor/Worker 的状态所有权。
#
# 通过要求：唯一代码填空题通过全部断言；Q1～Q3 都能沿源码对象给出因果链；能指出一个正确性不变量、一个性能边界和一个需要 benchmark 才能确认的结论（自查，不计分）；总分至少 8/10。
#
# | 部分 | 分值 | 评分方式 |
# |---|---|---|
# | 代码·主路径（种子断言 1 分 + 接入真实 EngineCore 1 分） | 2 | 自动 |
# | 代码·边界条件（`has_requests=False`、`scheduled_tokens=0`） | 1 | 自动 |
# | 代码·能映射回源码对象（`SOURCE_MAP`） | 1 | 自动 |
# | Q1～Q3 | 各 2 | 人工，按评分规则 |
#
# 没有 nbgrader 时（例如 Colab），运行评分规则下的“自检”单元格（或 `python -m autograder check lesson01`），得分与 nbgrader 自动部分一致。

# %% [markdown]
# ## 源码版本与阅读方法
#
# 本课读 vLLM {{VLLM_VERSION}}（commit {{VLLM_COMMIT}}）。先画调用图和状态所有权，再进入分支；不要从 2500 行的 core.py 第一行顺读，只读下表四个函数（约 65 行）：
#
# | 顺序 | vLLM 文件与入口（{{VLLM_VERSION}}） | minivllm 对应文件 | 带着什么问题读 |
# |---|---|---|---|
# | 1 | `vllm/v1/engine/async_llm.py`：`AsyncLLM.abort`（L729–L741） | `minivllm/engine/async_llm.py`：`AsyncLLM` | 取消为何先删前端的请求，再通知 EngineCore？ |
# | 2 | `vllm/v1/engine/core.py`：`EngineCoreProc.run_busy_loop`（L1378–L1389） | `minivllm/engine/core.py`：`EngineCoreProc` | 每轮先处理哪个队列，再走一步？ |
# | 3 | `core.py`：`EngineCore.step`（L584–L614） | `minivllm/engine/core.py`：`EngineCore.step` | 一次迭代为何是 schedule → execute → update？ |
# | 4 | `core.py`：`EngineCore._process_aborts_queue`（L741–L749） | `minivllm/engine/core.py`：`EngineCore` | forward 期间到达的取消何时生效？ |

# %%
# 上表各行在 vLLM {{VLLM_VERSION}} 源码里的样子：文件路径、行号与逐行原文（行号与上表一致；源码由第一个单元格获取并校验）。
from autograder.vllm_source import show_vllm

show_vllm("vllm/v1/engine/async_llm.py", "AsyncLLM.abort")
show_vllm("vllm/v1/engine/core.py", "EngineCoreProc.run_busy_loop")
show_vllm("vllm/v1/engine/core.py", "EngineCore.step")
show_vllm("vllm/v1/engine/core.py", "EngineCore._process_aborts_queue")

# %% nbgrader={"grade": false, "grade_id": "l01_setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
# 准备（锁定）：静音无害的警告（评分单元格不能写 stderr），导入本课的图、演示与检查。
import logging
import os
import warnings

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

from autograder import lesson01 as L01  # noqa: E402
from autograder.common import ______, report, self_check, short_errors  # noqa: E402,F401

short_errors("lesson01")  # 评分单元格失败时只显示三行：哪一部分、错在哪、第一处不符（完整 traceback：%tb）

# %% [markdown]
# ## 核心心智模型
#
# ### 1. 它是什么，解决什么问题
#
# vLLM V0 的调度、输入准备、输出处理与 GPU 前向基本串行（0.6 起的异步输出处理只重叠一部分），共用一个 GIL。decode 一步只需几毫秒，CPU 侧的调度开销可能超过 GPU 计算，GPU 只好等 CPU。
#
# vLLM V1 因此分成三层（图 1-2）：

# %%
L01.fig_architecture();

# %% [markdown]
# 图 1-2：vLLM V1 三层架构（Frontend → EngineCore → Workers）。
#
# - **AsyncLLM（前端）**：API server 调用的异步引擎客户端。HTTP 路径上 chat 模板与分词由 serving 层的 `OnlineRenderer` 完成；AsyncLLM 的 `InputProcessor` 把结果（原始 prompt 则在此分词）变成 `EngineCoreRequest`，维护流式输出与增量解码，转告取消；
# - **EngineCore / EngineCoreProc（调度核心）**：独立进程，一个 busy loop 线程推进每一步，独占 Scheduler（及其 KV 块账本 KVCacheManager）；
#   - 另有两个 IO 线程：输入线程收 ZMQ 消息、反序列化，并预处理新请求（构造 `Request`、算块哈希、提交 grammar 编译）；输出线程序列化并发送 `EngineCoreOutputs`；
# - **Worker / GPUModelRunner（设备执行）**：按 TP/PP 并行执行（单卡时经 `UniProcExecutor` 跑在 EngineCore 进程内），独占 GPU 张量、KV cache 张量与 CUDA Graph（块号归 Scheduler）。
#
# 它解决的问题：每份状态只有一个写者，进程间只传消息；CPU 每步的控制开销被压低，并尽量与 GPU 执行重叠（用 profiler 测）。
#
# ### 2. 它如何工作
#
# 先看图 1-1（推导在附录）：

# %%
L01.fig_arithmetic_intensity();

# %% [markdown]
# 图 1-1（d×d 线性层）：一次前向的 token 过几百即受算力限制（prefill 常如此）；decode 的小 batch 受带宽限制，attention 各读各的 KV，总受带宽限制。
#
# `EngineCore.step()`（默认的 async scheduling 改走 `step_with_batch_queue`，见附录）每一步是 Schedule → Execute → Update：
#
# 1. **Schedule**：busy loop 在 step 之前已把新请求交给 Scheduler（`_process_input_queue`）。`scheduler.schedule()` 从 waiting/running 队列出发，按 token 预算产出本步计划 `SchedulerOutput`；
# 2. **Execute**：`model_executor.execute_model(plan, non_block=True)` 发射 forward（单卡在本线程发射 kernel，返回已完成的 future；多卡的未完成）；GPU 在算时，CPU 用 `get_grammar_bitmask` 算掩码；
# 3. **Wait 与 aborts**：`future.result()` 等 `execute_model` 返回，`sample_tokens` 屏蔽 logits、采样，拷回结果时才真正等 GPU；再用 `_process_aborts_queue()` 处理执行期间到达的取消；
# 4. **Update**：`scheduler.update_from_output(plan, model_output)` 把新 token 追加到各请求、做停止检查、产出 `EngineCoreOutputs`，并释放本步完结请求的 KV 块。
#
# step 返回 `(outputs, total_num_scheduled_tokens > 0)`：第二项告诉 busy loop 是否执行了模型。端到端的路径见图 1-3：

# %%
L01.fig_request_flow();

# %% [markdown]
# 图 1-3：HTTP 请求 → 分词 → EngineCore 请求队列 → `EngineCore.step()` → 前向 → 采样 → 解码并流式回传 SSE。
#
# ### 3. 正确性条件与常见误区
#
# - **单写者状态所有权**：每份状态只有一个写者。
#   - AsyncLLM 独占每个请求的输出流与解码状态；
#   - EngineCore 与 Scheduler 独占请求生命周期（WAITING、RUNNING、PREEMPTED、FINISHED_*；V1 没有 SWAPPED，被抢占的请求释放 KV 块，恢复时重算（仍命中缓存的块免算）），Worker 不改请求状态；
#   - GPUModelRunner 独占显存与 kernel 执行。共享可变对象会引发竞争。
# - **abort 在 update 之前**：forward 期间被取消的请求，EngineCore 在 `update_from_output` 之前处理取消，本步 token 不会追加给它。
# - 顺序颠倒时，引擎为已取消的请求白做一次更新，输出被前端丢弃；这个 token 若触发停止，引擎内部以 stop/length 而非 abort 结束它。块不会被重复释放。
# - **计划与结果属于同一步**：`SchedulerOutput` 与 `ModelRunnerOutput` 同属一步。worker 出错时 vLLM 不伪造空输出：EngineCore 退出，在途请求得到 `EngineDeadError`。
#
# ### 4. 性能与工程取舍
#
# - **进程解耦**：EngineCore 独立成进程，不与前端的分词、解码争 GIL；代价是序列化。
# - **grammar 与 forward 重叠**：结构化输出的 bitmask 可能很耗 CPU。在 `execute_model(non_block=True)` 之后立即算它，与 GPU forward 重叠；bitmask 比 forward 慢时仍有空泡，用 profiler 测。

# %% [markdown]
# ## 具体演示：单请求执行取消与控制流跟踪演练
#
# 考虑一个典型的并发取消场景：
#
# 1. 请求 $R_0$ 被调度进入当前批次，调度计划为 `{"scheduled_tokens": 4}`；
# 2. `execute_async` 向 GPU 发射 forward；
# 3. forward 还没结束，客户端断开了连接，取消进入待处理队列；
# 4. `get_grammar(plan)` 准备约束，`future()` 取结果；随后 `process_aborts()`，把 $R_0$ 标为已取消并回收它的 KV 块（vLLM：`_process_aborts_queue` → `finish_requests` → `_free_request`）；
# 5. 最后 `update(plan, model_output)`：$R_0$ 已取消，它的 token 被丢弃，不输出。
#
# 下面在 minivllm 的 `EngineCore` 上跑这个场景：两个贪心请求 r0、r1；第 3 步 forward 结束前，调用 `core.abort_requests(["r0"])`。

# %%
run = L01.run_engine()  # minivllm 自带的 EngineCore.step；r0 在第 3 步 execute 发射后、forward 结束前被取消
print(f"第 {run.abort_step} 步 EngineCore 线程上的 trace：", L01.engine_phases(run, run.abort_step))
assert L01.engine_phases(run, run.abort_step) == ["schedule", "execute", "grammar", "wait", "aborts", "update"]
L01.print_outputs(run)
L01.plot_timeline(run);

# %% [markdown]
# 读图：红色虚线是取消到达时刻。grammar 紧跟 execute，早于 forward 结束。wait 之后先 aborts 再 update：r0 第 3 步算出的 token 没有输出（已 `FINISHED_ABORTED`）；r1 照常生成。
#
# 下面把 aborts 挪到 update 之后再跑一次，并列出 minivllm `EngineCoreProc` 的 IO 线程。

# %%
L01.print_late_abort(L01.late_abort_run())
print("minivllm 的 EngineCoreProc 构造时启动的 IO 线程（forward 另在 executor 的 worker 线程上）：", L01.engine_core_threads())

# %% [markdown]
# ## 实践任务：唯一代码填空题
#
# 补齐一个最小 EngineCore.step 控制流模型。重点不是模拟 GPU，而是保持官方源码中的顺序合同。
#
# 只能修改 TODO/______ 位置，不得删除断言或放宽通过条件。

# %% nbgrader={"grade": false, "grade_id": "l01_engine_core_step", "locked": false, "schema_version": 3, "solution": true, "task": false}
def engine_core_step(has_requests, schedule, execute_async,
                     get_grammar, process_aborts, update):
    trace = []
    if not has_requests:
        return {}, False, trace

    # TODO：保持 schedule → async execute/grammar → wait → aborts → update。
    plan = schedule()  ### BLANK
    trace.append("schedule")
    future = execute_async(plan)  ### BLANK
    trace.append("execute")
    grammar = get_grammar(plan)  ### BLANK
    trace.append("grammar")
    model_output = future()  ### BLANK
    trace.append("wait")
    process_aborts()  ### BLANK
    trace.append("aborts")
    outputs = update(plan, model_output)  ### BLANK
    trace.append("update")
    return outputs, plan["scheduled_tokens"] > 0, trace


# %%
# 逐项报告（不会中断 Run All）：每个自动评分部分一行，✗ 后面是第一处不符合的地方。
report("lesson01", globals())

# %% nbgrader={"grade": true, "grade_id": "l01_main_path", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
events = []
schedule = lambda: {"scheduled_tokens": 4}
execute = lambda plan: (lambda: {"tokens": [7]})
grammar = lambda plan: {"mask": None}
aborts = lambda: events.append("abort-queue-drained")
update = lambda plan, output: {"r0": output["tokens"]}

out, ran, trace = engine_core_step(True, schedule, execute, grammar, aborts, update)
assert out == {"r0": [7]} and ran
assert trace == ["schedule", "execute", "grammar", "wait", "aborts", "update"]
assert events == ["abort-queue-drained"]
assert engine_core_step(False, schedule, execute, grammar, aborts, update) == ({}, False, [])
### BEGIN HIDDEN TESTS
L01.check_main_path(engine_core_step)
### END HIDDEN TESTS

# %% [markdown]
# 第二项检查：把你的 `engine_core_step` 换下一个真实 minivllm `EngineCore` 的 `step`，重放上面的取消场景，检查每一步的调用顺序与输出：
#
# - grammar 在 execute 返回之后、等待结果之前，与 forward 重叠；
# - aborts 在 update 之前；
# - r0 在 forward 期间被取消之后，不再输出任何 token。
#
# 判定只看调用顺序和输出，不看时钟。

# %% nbgrader={"grade": true, "grade_id": "l01_real_engine", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
student_run = L01.check_real_engine(engine_core_step)
print("真实引擎检查通过：aborts 先于 update；grammar 与 forward 重叠；r0 取消后没有再输出 token。")

# %% [markdown]
# ## 检查方法
#
# 运行断言；再让 `scheduled_tokens=0`，解释为什么仍可能走完控制路径但 `ran=False`。

# %%
schedule0 = lambda: {"scheduled_tokens": 0}
out0, ran0, trace0 = engine_core_step(True, schedule0, execute, grammar, aborts, update)
print("ran =", ran0, "trace =", trace0)

# %% [markdown]
# 你的解释（不计分）：

# %% nbgrader={"grade": true, "grade_id": "l01_boundary", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
out0, ran0, trace0 = engine_core_step(True, lambda: {"scheduled_tokens": 0}, execute, grammar, aborts, update)
assert ran0 is False
assert trace0 == ["schedule", "execute", "grammar", "wait", "aborts", "update"]
assert engine_core_step(False, schedule, execute, grammar, aborts, update) == ({}, False, [])
### BEGIN HIDDEN TESTS
L01.check_boundary(engine_core_step)
### END HIDDEN TESTS

# %% [markdown]
# ## 映射回源码对象
#
# “能映射回源码对象”（1 分）在这里自动评分。沿着练习的每个空在 vLLM {{VLLM_COMMIT}} 里再走一步，写出下面每一项的名字：类、方法或字段，字符串。可以带 `obj.` 前缀和括号，大小写不限；本课正文没有印出它们。
#
# - `plan`：`scheduler.schedule()` 返回的 `SchedulerOutput` 里，按 KV cache 组给出“所有 running 请求共享的前缀块数”的那个字段，cascade attention 用它（`vllm/v1/core/sched/output.py`）；
# - `future`：多进程 executor（`vllm/v1/executor/multiproc_executor.py`）的 `execute_model(..., non_block=True)` 返回的那个 future 的类；
# - `grammar`：`scheduler.get_grammar_bitmask` 返回的对象的类；
# - `model_output`：`future.result()`（或 `sample_tokens`）返回的 `ModelRunnerOutput` 里，按请求记录本步 logits 中 NaN 个数的那个字段（`vllm/v1/outputs.py`）；
# - `aborts`：`EngineCoreProc` 的输入线程按哪个枚举的 `ABORT` 成员，把一条消息额外放进 `aborts_queue`（`vllm/v1/engine/__init__.py`）；
# - `outputs`：`scheduler.update_from_output` 返回一个值为 `EngineCoreOutputs` 的 dict，它的键是 `Request` 的哪个字段？它说明输出要发回哪个前端进程。

# %% nbgrader={"grade": false, "grade_id": "l01_source_map_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
SOURCE_MAP = {
    # plan = scheduler.schedule()：SchedulerOutput 的一个字段
    "plan": "num_common_prefix_blocks",  ### BLANK
    # future = model_executor.execute_model(..., non_block=True)：多进程 executor 返回的 future 的类
    "future": "FutureWrapper",  ### BLANK
    # grammar = scheduler.get_grammar_bitmask(...)：返回值的类
    "grammar": "GrammarOutput",  ### BLANK
    # model_output = future.result()：ModelRunnerOutput 的一个字段（按请求计数）
    "model_output": "num_nans_in_logits",  ### BLANK
    # _process_aborts_queue() 读的 aborts_queue 由哪个枚举的 ABORT 成员填入
    "aborts": "EngineCoreRequestType",  ### BLANK
    # outputs = scheduler.update_from_output(...)：返回的 dict 以请求的哪个字段为键
    "outputs": "client_index",  ### BLANK
}

# %% nbgrader={"grade": true, "grade_id": "l01_source_map", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
L01.check_source_map(SOURCE_MAP)

# %% [markdown] nbgrader={"grade": false, "grade_id": "l01_q1", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q1（2 分）
#
# AsyncLLM、EngineCore、Scheduler 和 GPU worker 各自拥有什么状态？为什么不能把它们合成一个全局可变对象？
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**（两部分各 1 分）：
#
# - **状态（1 分）**：四个对象各说出自己的主要状态：前端的请求输出流/分词与取消，EngineCore 的 busy loop 与 input/abort 队列，Scheduler 的 waiting/running 队列、请求状态机与 KV 块账本，Worker 的 GPU 张量与 KV cache 张量（答“块号归 Scheduler 的 `BlockPool`”更准确，不扣分）。KV 块账本（`KVCacheManager`）归 Scheduler 或归 EngineCore（经它的 Scheduler 拥有）都算对。EngineCore 答“busy loop、IO 线程与 Scheduler”即可，不必说出 `input_queue`。漏掉一个对象或把状态归错主人，这 1 分不给。
# - **为何不能合并（1 分）**：一条成立的因果链即可。成立的理由：每份状态只有一个写者，改动沿 `SchedulerOutput` → `ModelRunnerOutput` 这样的显式消息发生，避免竞争、便于定位故障；前端与 EngineCore 分进程，分词/解码不与 busy loop 争 GIL。把“进程隔离/GIL”当作全部四者分开的唯一理由的，这 1 分不给：Scheduler 与 EngineCore 同在一个进程，单卡时 Worker 也在其中（`UniProcExecutor`），GIL 说明不了它们为何分开。
# - 0 分：只背类名，说不清状态所有权（一票否决）。
#
# 以下答案按 vLLM {{VLLM_VERSION}} 是正确的，不扣分：HTTP/SSE 属于 API server 而不是 AsyncLLM；等待调度的队列在 Scheduler；单卡时 Worker 在 EngineCore 进程内；默认没有容错降级（`ParallelConfig.enable_fault_tolerance` 默认 False，worker 出错时引擎退出，前端抛 `EngineDeadError`）。
#
# **参考答案**
#
# 1. 各层核心对象的状态所有权矩阵（State Ownership Matrix）：
#    - AsyncLLM（前端服务层）：拥有每个请求的异步输出流（`OutputProcessor` 里的请求状态与增量 detokenizer）、把输入变成 `EngineCoreRequest` 的 `InputProcessor`，以及取消入口 `AsyncLLM.abort`。HTTP/SSE 连接属于调用它的 API server；尚未调度的请求在 Scheduler 的 `waiting` 里；
#    - EngineCore（调度协调层）：拥有主事件循环（Busy Loop）、`input_queue` 与 `aborts_queue`、跨进程 IPC 通信通道与两个 IO 线程、输入/输出序列化协议栈，以及对 Executor 的协调控制逻辑；
#    - Scheduler（权威裁决层）：拥有全局请求状态机（WAITING、RUNNING、PREEMPTED、FINISHED_*，抢占采用重算而非换出，前缀缓存仍命中的块可免算）、逻辑 Token 计数（`num_computed_tokens`、`num_tokens`）、逻辑 KV Block 映射账本以及请求抢占（Preemption）决策权；
#    - GPUModelRunner / Worker（设备执行层）：独占物理 GPU 显存张量、物理 KV cache 张量（按调度器分配的块号寻址；worker 的 block table 只是 `KVCacheManager` 分配结果的镜像）、CUDA Graph 预热与执行环境、采样器状态以及分布式通信（NCCL TP/PP）组。
# 2. 严禁合成全局可变对象的深层因果：
#    - 进程隔离与 GIL：Frontend 与 EngineCore 是两个进程（`VLLM_ENABLE_V1_MULTIPROCESSING` 默认开启），分词与增量解码不与 busy loop 争 GIL。Worker 只在多卡（`MultiprocExecutor`）时是独立进程；单卡时 `UniProcExecutor` 把它放在 EngineCore 进程里，Scheduler 也一直在这个进程里。所以“Worker 不写 Scheduler 状态”靠的是消息契约（`SchedulerOutput` → `ModelRunnerOutput`），不是进程边界；
#    - 杜绝多写者脑裂（Brain-Split & Race Condition）：若允许 Worker 越权修改 Scheduler 状态，在分布式流水线或异步执行中会产生无序状态竞争，无法确定哪个组件持有真值；
#    - 故障边界与可审计契约：单写者加显式消息契约（IPC / Message Queue）使得每个组件的输入输出严格成对可审计。某个 GPU Worker 发生 OOM 或 NCCL 崩溃时，故障停在清楚的边界上：vLLM {{VLLM_VERSION}} 默认不降级（`enable_fault_tolerance` 默认 False），EngineCore 退出，前端把在途请求以 `EngineDeadError` 结束，而不是带着不一致的状态继续运行。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l01_q2", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q2（2 分）
#
# 为什么源码先 `execute_model(non_block=True)`，再取得 grammar bitmask，最后等待 future？这是否意味着 grammar 可以晚于采样？
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 说清重叠（非阻塞发射后 CPU 计算 bitmask，与 GPU forward 同时进行，再等 future）并明确否定“grammar 可晚于采样”（bitmask 必须在采样前作用于 logits）；1 分 = 只答对其中一半；0 分 = 把重叠当成算法正确性的来源，或认为 grammar 可以晚于采样（混淆算法正确性与性能，一票否决）。
#
# **参考答案**
#
# 1. 时序与计算重叠机制（CPU-GPU Pipeline Overlap）：
#    - 在结构化输出（JSON Schema / Regex 约束解码）中，根据语法树或有限状态机（FSM）计算下一个合法 Token 的 Bitmask 是纯 CPU 密集型任务，计算耗时可能长达数毫秒；
#    - 源码采用 `execute_model(non_block=True)` 是为了实现控制流与设备执行的异步解耦：系统将本次 Batch 的张量元数据发射给 GPU Worker，发射完 kernel 即返回（单卡在同一线程内），GPU 开始执行耗时的自注意力与 GEMM 计算；
#    - 此时 CPU 主线程并没有空转等待，而是立即并发执行 `get_grammar(plan)`，在本地内存中完成 Bitmask 的推导与位运算；
#    - 随后 `future.result()` / `sample_tokens` 取回结果（真正与 GPU 同步在采样结果拷回时）。bitmask 比 forward 先算完时，CPU 的开销全部藏在 forward 里；比 forward 慢时仍有空泡。
# 2. Grammar 绝不能晚于采样（Sampling Constraint）：
#    - 这并不意味着 Grammar 可以晚于采样。GPU ModelRunner 在执行 Transformer Forward 产出未归一化的 Logits 后，必须等待 Grammar Mask 的位掩码注入（将非法 Token 的 Logits 强行置为 $-\infty$），然后才能执行 Softmax 和采样操作；
#    - `non_block=True` 仅仅是将 Python 端的等待时机从“发射瞬间”推迟到了“提取最终输出之前”，在不破坏数据因果依赖的前提下，把 CPU 侧的 bitmask 开销尽量藏到 forward 后面（藏住多少要实测）。
#    - 固定 commit 里这条依赖写在代码结构上：`EngineCore.step` 先 `future.result()` 拿到 forward 的结果，若它是 `None`（采样被拆开），再调用 `model_executor.sample_tokens(grammar_output)`，bitmask 作为参数进入采样；`step_with_batch_queue` 里 `sample_tokens(grammar_output, non_block=True)` 同样带着 bitmask；若本批有结构化输出请求还在等上一步的 token（`pending_structured_output_tokens`），整批的 `sample_tokens` 推迟到处理完上一步输出、算出 bitmask 之后。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l01_q3", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q3（2 分）
#
# 某请求在 GPU forward 期间被取消。为何 `EngineCore.step` 要在 `update_from_output` 前处理 abort？
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 指出 model output 里已有该请求本步的 token（本步是 decode 或 prefill 最后一块时；不要求提到 chunked prefill 中间块的例外）；先 abort 使请求在 update 之前成为 `FINISHED_ABORTED`，update 因而跳过它、不再为它追加 token 或产生输出；并说明反序的后果：引擎为已取消的请求更新状态并输出本步 token（在 vLLM 里前端已由 `AsyncLLM.abort` 移除该请求，这条输出被丢弃，客户端收不到）。1 分 = 三点中只给出一到两点（例如只有结论或只有后果）；0 分 = 没有沿对象与状态变化给出因果链。
#
# KV 块在哪一步释放不是本题所问：写“abort 时释放”（正确，`finish_requests` → `_free_request`）或没有提及的，都不影响得分。不要求、也不奖励“反序会 use-after-free”：先 update 后 abort 时每个块仍只释放一次（本课演示）。写“输出推给了已断开的客户端”而因果链其余正确的，不扣分；写出前端丢弃这条输出的，同样得分。
#
# **参考答案**
#
# 若某请求在 GPU Forward 期间被客户端主动取消（Abort），EngineCore.step 必须严格在调用 scheduler.update_from_output 之前优先消费并清空 Abort 队列，因果链如下：
#
# 1. 防止已取消请求产出“幽灵 Token”并破坏前端流：
#    - GPU 执行的是发射时刻快照决定的批次，因此若本步是 decode 或 prefill 的最后一块，Model Output 中已有该请求刚刚生成的下一个 Token（非最后一块的 prefill 采样结果会被丢弃）；
#    - 若先调用 update_from_output，调度器会将该新生成的 Token 视作有效计算结果，追加到请求里、做停止检查，并在 `EngineCoreOutputs` 里为它输出。vLLM 的 `AsyncLLM.abort` 先调用 `OutputProcessor.abort_requests` 再通知 EngineCore，所以这条迟到的输出在前端被丢弃（`output_processor.py`：“Ignore output for already-aborted request”），客户端收不到；浪费的是引擎对一个已死请求的更新和一次输出；
# 2. 保障物理显存与逻辑账本原子释放：
#    - 优先执行 process_aborts() 会将该请求在调度器的活动集合中正式注销，并向 KVCacheManager 宣告其占有的所有逻辑与物理 KV Block 可以被安全回收；
#    - 随后执行 update_from_output 时，调度器便能根据最新的“存活请求子集”做过滤，直接将已取消请求的输出丢弃。反序并不会造成 use-after-free：update 时被取消的请求仍持有自己的块，随后的 abort 才释放它们，每个块只释放一次（本课演示）；
# 3. 提供清晰的串行化审计点：先处理事件、再应用批次更新，保证了每一次迭代步的结束状态都是自洽、闭合且全局一致的。
#
# **附：检查方法（`scheduled_tokens=0`）的参考解释**（不单独计分，供批改时核对学生在“检查方法”下写的解释）：`has_requests` 只说明 scheduler 里还有请求（包括上一步刚结束、其 id 还要随下一个 `SchedulerOutput` 发给 worker 清理缓存的请求，`has_finished_requests`），不保证本步有 token 可算（例如 KV 块不够、请求都在等待）。此时 `schedule()` 仍产出一个空计划，execute/grammar/wait/aborts/update 照常走完：空计划把 `finished_req_ids` 带给 worker；aborts 仍要清空；update 没有 token 可追加；但模型没有处理任何 token，所以 `ran = plan["scheduled_tokens"] > 0` 为 False（vLLM：`scheduler_output.total_num_scheduled_tokens > 0`），busy loop 据此知道这一步没有执行模型。上面演示的最后一步正是这种情况：r1 已在上一步结束、释放块并输出 `length`，这一步只让 worker 移除它，没有输出 token。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown]
# ## 评分规则
#
# - 代码 4 分：主路径 2 分（种子断言 1 分、接入真实 EngineCore 的 trace 检查 1 分）、边界条件 1 分、能映射回源码对象 1 分；
# - Q1～Q3 各 2 分：必须包含对象、状态变化、正确性或成本链；
# - 一票否决：把论文峰值写成普遍生产结论；把源码支持写成所有模型/硬件可用；混淆算法正确性与性能；只背类名而说不清状态所有权。
#
# 总分 10 分，至少 8 分通过。参考答案只在教师分支（solutions/）中；引擎自己的 `EngineCore.step` 就在 `minivllm/engine/core.py`，先独立完成再读。核对后请更换一个 batch、cache 或硬件条件重新推演，不能只复制。
#
# ### 自检
#
# 下面的单元格用与 nbgrader 相同的检查函数给代码部分打分（Q1～Q3 显示为待人工评分）。

# %%
self_check("lesson01", globals());

# %% [markdown]
# 下一课 →：第 2 课

# %% [markdown]
# ## 附录（选读）
#
# 不计分，可以跳过：在真实 vLLM 上对照本课、图 1-1 的推导、参考资料与差异清单。

# %% [markdown]
# ### 在真实 vLLM {{VLLM_VERSION}} 上看同一件事
#
# vLLM 的 `EngineCore.step`（`vllm/v1/engine/core.py`）约 30 行（代码约 20 行），对照你的 `engine_core_step` 读（装了 `.venv-vllm` 才印出源码，否则给链接）：

# %%
from autograder import vllm_oracle  # noqa: E402

site = vllm_oracle.vllm_site_packages()
if site:
    lines = (site / "vllm/v1/engine/core.py").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("def step(self)"))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].strip().startswith("def "))
    print("\n".join(lines[start:end]).rstrip())
else:
    print("https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/engine/core.py 中的 EngineCore.step")

# %% [markdown]
# 比练习多出的只有：`_should_throttle_prefills()`、forward 返回 `None` 时另调 `sample_tokens`（见下方差异）、两个记录细节的 `with` 与 update 之后的 `_attach_iteration_details`。
#
# 再把演示的两个请求交给 vLLM 自己的 `EngineCore`（进程内，CPU 上的 runner 是 `CPUModelRunner`），同样在第 3 步 forward 中取消 r0。第二行是 vLLM 源码的位置：装好 `.venv-vllm` 后 `SOURCE_MAP` 可以离线查。
#
# CPU 平台关掉了 async scheduling，所以最后两行不是 `EngineCore` 在跑：仿照 `step_with_batch_queue` 的驱动 `autograder/vllm_oracle/scheduler_harness.py` 分别驱动两边的 `AsyncScheduler`。

# %%
L01.vllm_side_by_side(run)

# %% [markdown]
# ### 图 1-1 的推导：Prefill 与 Decode
#
# 图中是一个 $d \times d$ 的 FP16 线性层，横轴是一次前向处理的 token 数。
#
# - **Prefill（处理 prompt）**：一次计算全部 $S$ 个 token，是 GEMM；算术强度约 $B \cdot S$ FLOP/Byte（FP16，$B \cdot S \ll d$ 时）。
# - $B \cdot S$ 到几百即越过 H100 SXM 的 BF16 拐点（约 295，即稠密峰值与 HBM 带宽之比；PCIe 版与 FP8 各不相同）。
# - **Decode（逐 token 生成）**：每个请求每步只算 1 个 token，是 GEMV；算术强度约 $B$ FLOP/Byte；每步都要读完整权重和全部 KV Cache。
# - 对策：Continuous Batching 增大 $B$；PagedAttention 减少 KV 碎片以容纳更多请求；投机解码把多步 decode 合成一次验证前向。
#
# ### 补充细节
#
# - 已计算 token 数在 `schedule()` 里已推进（`_update_after_schedule`）；`update_from_output` 只在投机 token 被拒或外部 KV 加载失败（`_handle_invalid_blocks`）时往回拨。
# - 前端经 ZMQ socket 把 msgspec 序列化的 `EngineCoreRequest` 发给 EngineCore，输出以 `EngineCoreOutputs` 发回。
# - 多卡时 Executor 用共享内存消息队列（`MessageQueue`）向各 Worker 广播调度结果；前端与 EngineCore 之间的大张量可走 msgspec 的零拷贝附加缓冲区。
# - 容错降级默认关闭（`ParallelConfig.enable_fault_tolerance` 默认 False）。
#
# ### 参考资料
#
# - [vLLM AsyncLLM source](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/engine/async_llm.py)
# - [vLLM EngineCore source](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/engine/core.py)
# - [vLLM Scheduler interface](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/core/sched/interface.py)
# - [vLLM V1 guide](https://docs.vllm.ai/en/latest/usage/v1_guide/)
# - [vLLM optimization and process architecture](https://docs.vllm.ai/en/latest/design/arch_overview/)
#
# 源码链接固定在 commit {{VLLM_COMMIT}}；current docs、支持矩阵和默认参数会变化，部署前按目标版本核对。

# %% [markdown]
# ### 与 vLLM {{VLLM_VERSION}} 的差异
#
# 本课评分的顺序与 vLLM 的 `EngineCore.step` 相同。其余差别：
#
# - **runner**：课程的 dense 模型在 {{VLLM_VERSION}} 默认由 Model Runner V2（`v1/worker/gpu/model_runner.py`）运行，minivllm 对应 V1 runner（`v1/worker/gpu_model_runner.py`）；本课读的代码在 runner 之上。
# - **V1 runner 的用途**：`gpu_model_runner.py` 用于 V2 不支持的特性（例如 n-gram 投机）、没有 Triton 的机器，以及 `VllmConfig._is_default_v2_model_runner_model` 排除的模型：pooling、attention-free 模型，以及不在 V2 默认架构列表里的 MoE 与 hybrid 模型。
# - **默认的 step**：vLLM 默认开启 async scheduling（`AsyncScheduler`），busy loop 调用 `step_with_batch_queue`：先发射第 N+1 步，再处理第 N 步。minivllm 默认关闭。
# - **forward 与采样**：`execute_model` 的 future 返回 `None` 后，vLLM 再调用 `sample_tokens(grammar_output)`。练习把两者合成一次。
# - **executor**：单卡默认 `UniProcExecutor`，worker 在 EngineCore 的调用线程上同步执行，重叠来自 CUDA kernel 的异步执行。minivllm 把 forward 放在 worker 线程上。
# - **输入线程**：vLLM 的输入线程还预处理新请求（`preprocess_add_request`）；minivllm 的只解码消息，`Request` 在 busy loop 的 `EngineCore.add_request` 里构造。
# - **取消**：vLLM 的 ABORT 同时进入 `aborts_queue` 和 `input_queue`；步间到达的在下一次 `schedule` 之前处理，forward 期间到达的由 `_process_aborts_queue` 处理。minivllm 同样放进两个队列；它的 `abort_requests` 只入队（vLLM 直接 `finish_requests`）。
# - **请求状态**：minivllm 的 `RequestStatus` 没有 `WAITING_FOR_REMOTE_KVS` 和 `WAITING_FOR_STREAMING_REQ`（它没有 KV 传输和流式输入）。
# - **worker 出错**：vLLM 的 EngineCore 退出，前端抛 `EngineDeadError`；minivllm 的 `_fail_step` 以 `FINISHED_ERROR` 结束本步的请求，继续服务其他请求。
