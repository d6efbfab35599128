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
# # 第 4 课：抢占、取消与请求生命周期
#
# ## 本课目标与通过标准
#
# 本课产出：沿源码说清请求的每一次状态转移由谁、在一步的哪个阶段写下；V1 为什么按**重算**（recompute）抢占；客户端断开怎样变成 `Scheduler.finish_requests`；停止判断的顺序与边界。
#
# 通过要求：代码断言全部通过；Q1～Q3 沿源码对象给出因果链；总分至少 8/10。
#
# | 部分 | 分值 | 评分方式 |
# |---|---|---|
# | 代码·主路径：按重算抢占 1 分，接入真实 EngineCore 的 KV 压力与取消 1 分 | 2 | 自动 |
# | 代码·边界条件：各状态下的取消 1 分，停止条件 1 分 | 2 | 自动 |
# | Q1～Q3 | 各 2 | 人工，按评分规则 |
#
# 没有 nbgrader 时（如 Colab），运行“自检”单元格或 `python -m autograder check lesson04`，得分与 nbgrader 的自动部分一致。

# %% [markdown]
# ## 源码版本与阅读方法
#
# 本课对照 vLLM {{VLLM_VERSION}} 发布包，只读状态的几个写点：谁改成什么，在一步里的哪一刻改（约 100 行，长函数只摘几段）：
#
# | 顺序 | vLLM 文件与入口（{{VLLM_VERSION}}，`vllm/v1/`） | minivllm 对应 | 带着什么问题读 |
# |---|---|---|---|
# | 1 | `request.py`：`RequestStatus`（L348–L371） | `minivllm/request.py`：`RequestStatus` | 哪些状态算“已结束”？为什么用 `IntEnum` 的大小比较？ |
# | 2 | `core/sched/scheduler.py`：`Scheduler._preempt_request`（L1287–L1296、L1313–L1315） | `minivllm/core/sched/scheduler.py`：`Scheduler._preempt_request` | 被抢占的请求丢掉什么、保留什么？为何放回队首？ |
# | 3 | 同文件：`Scheduler.finish_requests`（L2263–L2283、L2295–L2296）、`Scheduler._free_blocks`（L2329–L2332） | 同文件：`Scheduler.finish_requests` | 请求可能在哪个队列里？已结束的 id 怎么处理？ |
# | 4 | `engine/core.py`：`EngineCore.step`（L606–L611）；`scheduler.py`：`Scheduler.update_from_output`（L1747–L1755） | `minivllm/engine/core.py`：`EngineCore.step` | 取消为什么在 update 之前处理？ |
# | 5 | `core/sched/utils.py`：`check_stop`（L100–L117） | `minivllm/core/sched/utils.py`：`check_stop` | 停止条件按什么顺序检查？ |
#
# 课程的 dense 模型在 {{VLLM_VERSION}} 默认由 Model Runner V2 运行，minivllm 对应 V1 runner。

# %%
# 上表各行在 vLLM {{VLLM_VERSION}} 源码里的样子：文件路径、行号与逐行原文（行号与上表一致；源码由第一个单元格获取并校验）。
from autograder.vllm_source import show_vllm

show_vllm("vllm/v1/request.py", "RequestStatus", lines=(348, 371))
show_vllm("vllm/v1/core/sched/scheduler.py", "Scheduler._preempt_request", lines=(1287, 1296))
show_vllm("vllm/v1/core/sched/scheduler.py", "Scheduler._preempt_request", lines=(1313, 1315))
show_vllm("vllm/v1/core/sched/scheduler.py", "Scheduler.finish_requests", lines=(2263, 2283))
show_vllm("vllm/v1/core/sched/scheduler.py", "Scheduler.finish_requests", lines=(2295, 2296))
show_vllm("vllm/v1/core/sched/scheduler.py", "Scheduler._free_blocks")
show_vllm("vllm/v1/engine/core.py", "EngineCore.step", lines=(606, 611))
show_vllm("vllm/v1/core/sched/scheduler.py", "Scheduler.update_from_output", lines=(1747, 1755))
show_vllm("vllm/v1/core/sched/utils.py", "check_stop", lines=(100, 117))

# %% nbgrader={"grade": false, "grade_id": "l04_setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
# 准备（锁定）：静音无害的警告（评分单元格不能写 stderr），导入本课的图、演示与检查。
import logging
import os
import warnings

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

from autograder import lesson04 as L04  # noqa: E402
from autograder.common import ______, report, self_check, short_errors  # noqa: E402,F401

short_errors("lesson04")  # 评分单元格失败时只显示三行：哪一部分、错在哪、第一处不符（完整 traceback：%tb）
from minivllm.request import RequestStatus  # noqa: E402

# %% [markdown]
# ## 核心心智模型
#
# ### 1. 它是什么，解决什么问题
#
# `Scheduler` 是 `Request.status` 和 `Request.num_computed_tokens` 的唯一写者。状态机：
#
# ```
# WAITING ──► RUNNING ──► PREEMPTED    schedule()：接纳；allocate_slots 失败时抢占优先级最低的
#               ▲            │
#               └────────────┘         schedule()：重新接纳
# RUNNING ──► FINISHED_STOPPED / FINISHED_LENGTH_CAPPED    update_from_output()：check_stop 为真
# WAITING / RUNNING / PREEMPTED ──► FINISHED_ABORTED    finish_requests()
# ```
#
# 它解决三个问题：KV 池不够时怎样**让路**（抢占），客户端走了怎样**立刻停下**、归还资源（取消），请求**什么时候算完**（停止判断）。抢占在 `schedule()` 里，执行期间到达的取消在 `update_from_output()` 之前，停止在它里面。
#
# ### 2. 它如何工作
#
# **抢占（按重算）。** `schedule()` 给一个 running 请求要块，`allocate_slots` 返回 `None`，就选出优先级最低的 running 请求（FCFS 下是 `self.running.pop()`，即最后加入的），交给 `_preempt_request`：
#
# 1. `_free_request_blocks`：经 `kv_cache_manager.free` 把**全部** KV 块还给 `BlockPool`（prefix cache 下满块的哈希留着）；
# 2. `status = PREEMPTED`，`num_computed_tokens = 0`：KV 没了，进度也就没了。已生成的 token **保留**在 `output_token_ids` 里，恢复时与 prompt 一起重新 prefill；
# 3. `waiting.prepend_request(request)`：放回 waiting **队首**，有空就最先恢复。
#
# 恢复走普通的 waiting 路径：`get_computed_blocks` 先查 prefix cache，被抢占前算满、未被驱逐的块直接命中。
#
# **取消。** 客户端断开时，`AsyncLLM.generate` 收到 `asyncio.CancelledError` 或 `GeneratorExit`，调用 `AsyncLLM.abort`：先在 `OutputProcessor` 里删掉请求（迟到的输出被丢弃），再经 `EngineCoreClient` 发一条 ABORT 消息。
#
# 一步之内，`EngineCore.step` 等到 worker 的结果后，先 `_process_aborts_queue`，再 `update_from_output`。前者收齐队列里的 id，经 `abort_requests` 调用 `Scheduler.finish_requests(ids, FINISHED_ABORTED)`：
#
# - 把请求从 running 或 waiting 里拿掉，PREEMPTED 的请求在 waiting 里；
# - 状态改为 `FINISHED_ABORTED`，`_free_request` 把它记进 `finished_req_ids`（下一步的 `SchedulerOutput` 据此让 worker 丢掉它的缓存行）；
# - `_free_blocks` 释放 KV 块，并把它从 `self.requests` 删除：随后的 `update_from_output` 取到 `None` 就跳过，这一步**已经算出来**的 token 不会发出。
#
# **停止判断。** `update_from_output` 每追加一个采样出的 token，就调用一次 `check_stop`（`v1/core/sched/utils.py`），顺序是：
#
# 1. 输出 token 数 < `min_tokens`：一律不停，采样端也屏蔽 EOS 和 stop token；
# 2. 最后一个 token 是 EOS，且没有 `ignore_eos` → `FINISHED_STOPPED`；
# 3. 最后一个 token 在 `stop_token_ids` 里 → `FINISHED_STOPPED`，`stop_reason` 记下它；
# 4. `num_tokens >= max_model_len` 或输出数 `>= max_tokens` → `FINISHED_LENGTH_CAPPED`。
#
# 所以 EOS 恰是第 `max_tokens` 个 token 时，结束原因为 `stop`。每次只看**最后一个** token：`min_tokens` 之前出现的 EOS，之后不算数。
#
# 下面是引擎上的两次运行：9 个可用 KV 块（每块 16 个 token），6 个请求陆续到达。左边跑到结束；右边在第 4～7 步之后（第 5～8 步开始前）分别取消一个正在 decode、正在 prefill、在等待、已被抢占的请求（×）。

# %%
runs = L04.demo_runs()  # 两次真实引擎运行（默认模型，CPU，几秒）
L04.fig_swimlane(runs)
print(L04.caption_swimlane(runs))

# %% [markdown]
# 图 4-1：每个请求每步 `update` 之后的状态（灰等待、青绿运行、橙红被抢占、深蓝结束、紫取消）。
#
# 左边那次运行每步之后在用的 KV 块数如下，红色三角是抢占：

# %%
L04.fig_blocks(runs[0]);

# %% [markdown]
# 图 4-2：在用块数到了上限 9，下一个要新块的 running 请求（decode，或如第 32、40 步 p 的下一个 prefill 块）就触发抢占，被抢占者的块立刻回到池里。
#
# ### 3. 正确性条件与常见误区
#
# - **块守恒**：每一步之后，空闲块 + 被持有的块 = 总块数；不在 RUNNING 的请求不持有块。抢占或取消时忘了 `free`，块就泄漏。
# - **重算从 0 开始**：抢占后 `num_computed_tokens` 若不归零，恢复时调度器以为前面的 KV 还在，worker 用新分到、内容是别人的块做 attention，输出悄悄变错。
# - **队首，不是队尾**：放回队尾，后到的请求先被接纳，FCFS 被打破，尾延迟变坏。
# - **取消要清干净**：留在队列里，下一步又被调度。
# - **取消不存在或已结束的 id 不做任何事**：取消与自然结束可能同时发生。
# - **停止的边界**：输出数 `>= max_tokens` 就停，多一个就是 off-by-one；`ignore_eos` 只关掉 EOS，不关 `stop_token_ids` 和长度上限。
#
# ### 4. 性能与工程取舍
#
# 一次抢占要把**整个上下文**（prompt 加已生成的 token）重新 prefill：计算随长度增长（attention 部分随长度平方增长），还占之后几步的 token budget；prefix cache 省下其中算满、未被驱逐的块（实测见附录）。

# %% [markdown]
# ## 具体演示：生命周期的 trace
#
# `minivllm/tracing.py` 的 `Tracer` 把每次状态变化记成事件 `OLD->NEW`（带步号和请求 id），与引擎的阶段事件在同一个 trace 里；检查读的就是它。
#
# 下面是带取消那次运行的前 12 个转移。`d` 的取消在第 4 步之后入队，minivllm 在第 5 步 `schedule` **之后**的 `aborts` 阶段才处理它（执行期间到达的路径）；vLLM 会由 `_process_input_queue` 在第 5 步 `schedule` 之前处理这种步间到达的取消。

# %%
L04.print_transitions(runs[1], 12)

# %% [markdown]
# ## 实践任务：唯一代码填空题
#
# 补齐调度器这一侧的生命周期：三个函数，`sched` 是 minivllm 的 `Scheduler` 实例。评分时它们替换 `_preempt_request`、`finish_requests` 和 `check_stop`；`schedule()` 与 `update_from_output()` 仍是引擎自己的。
#
# - `preempt(sched, request)`：按重算抢占一个**已经从 `sched.running` 取出**的请求：归还 KV 块，状态改为 PREEMPTED，进度归零，放回 `sched.waiting`（一个 deque）的正确位置。
# - `finish_requests(sched, request_ids, finished_status)`：结束一批请求（取消时是 `FINISHED_ABORTED`），它们在 running 或 waiting 里；不认识的 id 什么都不做。
# - `check_stop(request, max_model_len)`：新 token 追加到 `request.output_token_ids` 之后调用，`request.max_tokens` 可能是 `None`。
#   - 该停就写 `FINISHED_STOPPED`（stop token 还要设 `stop_reason`）或 `FINISHED_LENGTH_CAPPED`，返回 `True`；否则返回 `False`、什么都不改。
#
# 只能修改 TODO/______ 位置，不得删除断言或放宽通过条件。

# %% nbgrader={"grade": false, "grade_id": "l04_lifecycle", "locked": false, "schema_version": 3, "solution": true, "task": false}
from minivllm.request import RequestStatus


def preempt(sched, request):
    # TODO：按重算抢占：块全部归还、进度归零、放回 waiting 的队首。
    sched.kv_cache_manager.free(request)  ### BLANK
    request.status = RequestStatus.PREEMPTED
    request.num_computed_tokens = 0  ### BLANK
    request.spec_token_ids = []
    request.num_output_placeholders = 0
    request.num_preemptions += 1
    sched.num_preemptions += 1
    sched.waiting.appendleft(request)  ### BLANK


def finish_requests(sched, request_ids, finished_status):
    for request_id in request_ids:
        request = sched.requests.get(request_id)
        if request is None:
            continue  # 已经结束（或从来没有）：与自然结束赛跑的取消什么都不做
        # TODO：离开它所在的队列；写上结束状态；归还 KV 块；从 sched.requests 删除。
        in_running = request.status == RequestStatus.RUNNING  ### BLANK
        if in_running:
            sched.running.remove(request)
        else:
            sched.waiting.remove(request)  ### BLANK
        request.status = finished_status  ### BLANK
        sched.kv_cache_manager.free(request)  ### BLANK
        sched.finished_req_ids.add(request_id)
        del sched.requests[request_id]  ### BLANK


def check_stop(request, max_model_len):
    params = request.sampling_params
    num_output_tokens = len(request.output_token_ids)
    # TODO：min_tokens 之前不停；EOS（ignore_eos 时不算）与 stop token → STOPPED；长度上限 → LENGTH_CAPPED。
    # （minivllm 的 EOS id 在 request.eos_token_id；它的 SamplingParams 没有 vLLM 的 eos_token_id 属性）
    too_early = num_output_tokens < params.min_tokens  ### BLANK
    if too_early:
        return False
    last = request.output_token_ids[-1]
    is_eos = not params.ignore_eos and last == request.eos_token_id  ### BLANK
    if is_eos:
        request.status = RequestStatus.FINISHED_STOPPED
        return True
    if params.stop_token_ids and last in params.stop_token_ids:
        request.status = RequestStatus.FINISHED_STOPPED
        request.stop_reason = last
        return True
    hit_max_tokens = request.max_tokens is not None and num_output_tokens >= request.max_tokens  ### BLANK
    if request.num_tokens >= max_model_len or hit_max_tokens:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    return False


# %%
# 逐项报告（不会中断 Run All）：每个自动评分部分一行，✗ 后面是第一处不符合的地方。
report("lesson04", globals())

# %% nbgrader={"grade": true, "grade_id": "l04_preempt", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# 7 个可用块，三个 40-token prompt（各输出 24 个 token）：两个先跑，decode 用光块后最后加入的 r1 被抢占
sched, life, tokens, log = L04.preemption_scenario(preempt, finish_requests, check_stop)
first = next(x for x in log if x["preempted"])
assert first["preempted"] == ["r1"]
assert first["waiting"][0] == "r1"                       # 队首
assert "r1" not in first["blocks"]["holders"]             # 块已归还
assert first["blocks"]["free"] + first["blocks"]["used"] == first["blocks"]["total"]
resumed = next(x for x in log if x["resumed"])
assert resumed["resumed"] == ["r1"]                      # 最先恢复
_, _, unpreempted, _ = L04.preemption_scenario(preempt, finish_requests, check_stop, num_gpu_blocks=64)
assert tokens == unpreempted                             # 恢复后的输出与不抢占时相同
### BEGIN HIDDEN TESTS
L04.check_preempt(preempt, finish_requests, check_stop)
### END HIDDEN TESTS

# %% [markdown]
# 第二项检查把三个函数接进真实的 minivllm `EngineCore`，跑上面演示的两次运行，读 `Tracer` 记下的每个状态转移：转移合法、每步块守恒、取消后没有输出、贪心输出等于 HF transformers 的逐位置 argmax。

# %% nbgrader={"grade": true, "grade_id": "l04_real_engine", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
student_runs = L04.check_real_engine(preempt, finish_requests, check_stop)
print("真实引擎检查通过：", [f"{r.num_steps} 步、{r.num_preemptions} 次抢占、取消 {sorted(r.aborted)}" for r in student_runs])

# %% nbgrader={"grade": true, "grade_id": "l04_abort", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# 取消一个还在等待的请求 b（a 在 running）；再取消一个不存在的 id：什么都不做
sched, life = L04.abort_setup(preempt, finish_requests, check_stop)
a, b = L04.make_request("a", 40), L04.make_request("b", 60)
sched.add_request(a)
sched.add_request(b)
L04.fake_step(sched)
assert a.status == RequestStatus.RUNNING and b.status == RequestStatus.WAITING
sched.finish_requests(["b", "nobody"], RequestStatus.FINISHED_ABORTED)
assert b.status == RequestStatus.FINISHED_ABORTED
assert list(sched.waiting) == [] and sched.running == [a]
assert "b" not in sched.requests and "b" in sched.finished_req_ids
# 取消正在 decode 的 a：它的块归还，running 清空
L04.fake_step(sched)
sched.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
assert sched.running == [] and sched.kv_cache_manager.block_pool.get_num_free_blocks() == 8
### BEGIN HIDDEN TESTS
L04.check_abort(preempt, finish_requests, check_stop)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "l04_stop", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
req = L04.make_request("s", 5, max_tokens=3, eos=2)
for t in (70, 71):
    req.append_output_token_ids(t)
    assert check_stop(req, 256) is False
req.append_output_token_ids(72)
assert check_stop(req, 256) is True and req.status == RequestStatus.FINISHED_LENGTH_CAPPED
req = L04.make_request("e", 5, max_tokens=10, eos=2, ignore_eos=True)
req.append_output_token_ids(2)
assert check_stop(req, 256) is False                     # ignore_eos：EOS 不停
### BEGIN HIDDEN TESTS
L04.check_stop_rules(check_stop)
### END HIDDEN TESTS

# %% [markdown]
# ## 检查方法
#
# 运行断言；再用 64、8（默认，含 1 个 null block）、7 块重跑抢占场景，打印每一步的抢占与恢复。用两三句话解释：64 块时为什么没有抢占？8 块时第 11 步为什么抢占的是 r1，它为什么比 r2 先恢复？恢复后的输出为什么不变？

# %%
for blocks in (64, 8, 7):
    _, _, _, log = L04.preemption_scenario(preempt, finish_requests, check_stop, num_gpu_blocks=blocks)
    print(f"num_gpu_blocks={blocks}:", [(x["step"], x["preempted"], x["resumed"]) for x in log if x["preempted"] or x["resumed"]])

# %% [markdown]
# 你的解释：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l04_q1", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q1（2 分）
#
# 请求 r 的 prompt 有 100 个 token，已输出 30 个（`num_computed_tokens` 为 129），这时被抢占，块大小 16。它恢复时要重新 prefill，到能采样下一个 token 为止，调度器一共要为它计算多少个 token？分别回答关闭 prefix cache，和开启 prefix cache 且它的块都没被驱逐两种情况，并说明依据。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 两种情况的数与依据都对：关闭时 130 个（`_preempt_request` 把 `num_computed_tokens` 归零，已输出的 30 个 token 留在 `output_token_ids` 里，与 prompt 一起重新 prefill）；开启时 2 个（恢复走普通的 waiting 路径，`get_computed_blocks` 命中被抢占前算满的 8 个块、128 个 token，只剩最后一个不满的块里的 2 个）。把 130 写成 129、2 写成 1（都漏了从没算过的最后一个 token）而依据正确的，不扣分。1 分 = 只有一种情况对，或数对而依据缺失、错误。0 分 = 认为只需重算输出的 30 个，或认为进度/KV 保留、不用重算。
#
# **参考答案**
#
# 关闭 prefix cache：抢占时 `_free_request_blocks` 归还全部块，`num_computed_tokens = 0`，但 `output_token_ids` 没动，所以恢复时 `num_tokens - num_computed_tokens` = 130 − 0 = 130，这 130 个 token（prompt 100 + 输出 30）都要重新 prefill（按 token budget 可能分几步），最后一个算完才采样第 31 个输出。其中 129 个是被抢占前算过的，重算的代价就是这些。
#
# 开启 prefix cache：被归还的块里，算满的 8 块（129 // 16 = 8，共 128 个 token，包括输出 token 填满的块）带着哈希留在 `BlockPool`。恢复时调度器像对待新请求一样先 `get_computed_blocks`，命中这 8 块，`num_computed_tokens` 从 128 开始，只需计算第 129、130 个 token 共 2 个（命中上限是 `num_tokens - 1` = 129，仍是 8 个满块）。如果这些块在等待期间被别的请求驱逐，命中就变少，最坏退回 130。
#
# **附：检查方法的参考解释**（不单独计分，供批改时核对学生在“检查方法”下写的解释）：64 块时每个请求最多 4 块（40 + 24 = 64 个 token），三个请求一共 12 块，一开始就都放得下，`allocate_slots` 从不失败，也就没有抢占。8 块（7 个可用）时 r0、r1 各用 3 块进来，r2 被挡在外面；第 10 步 r0 拿走最后一块，第 11 步 r1 要第 4 块时池空，FCFS 下 running 里最后加入的 r1 被抢占（块归还、`num_computed_tokens` 归零），放回 waiting **队首**，排在 r2 前面，所以 r0 结束后第 25 步最先恢复。恢复后输出不变：重算用的是同样的 token 序列（prompt + 已输出的 token），重建出同样的 KV，“模型”是确定的（真实引擎里是贪心解码），下一个 token 也一样。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l04_q2", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q2（2 分）
#
# 请求 d 在一步执行期间被取消，worker 已经为它采样了一个 token。`EngineCore.step` 先处理取消、再 `update_from_output`（表中第 4 行）：这个 token 最后怎样了？如果两者顺序反过来，会出什么问题？
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**（两部分各 1 分）：
#
# - **现在的顺序（1 分）**：`finish_requests` 把 d 移出队列、写 `FINISHED_ABORTED`，`_free_blocks` 把它从 `Scheduler.requests` 删除；`update_from_output` 取到 `None`（或已结束）就 `continue`，这个 token 被丢弃，取消之后没有它的输出。
# - **反过来（1 分）**：`update_from_output` 先把 token 追加进 d 的 `output_token_ids`、为一个已被取消的请求发出 `EngineCoreOutput`（取消后还有输出、白做序列化与传输）；或者这个 token 恰好让 `check_stop` 为真，d 以 STOPPED / LENGTH_CAPPED 结束，随后的取消找不到它，结束原因不是 abort。答出任一后果即可。
# - 写“客户端收到了多余的 token”而其余正确的，不扣分（vLLM 前端的 `AsyncLLM.abort` 已先删除请求、会丢弃这条输出，写出这一点同样得分）。指出 vLLM 里步与步之间到达的取消由 `_process_input_queue` 在 `schedule` 之前处理、问题只涉及执行期间到达的取消，同样得满分。
# - 0 分 = 认为顺序无关紧要。
#
# **参考答案**
#
# 现在的顺序：`_process_aborts_queue` 经 `abort_requests` 调用 `finish_requests(["d"], FINISHED_ABORTED)`，d 离开 `running`，`_free_request` 把它记进 `finished_req_ids`，`_free_blocks` 归还块并 `del self.requests["d"]`。随后 `update_from_output` 遍历这一步调度过的请求，`self.requests.get("d")` 是 `None`，直接 `continue`：worker 为 d 算出的 token 被丢弃，前端不会再收到 d 的输出。
#
# 反过来：`update_from_output` 先把这个 token 追加进 `d.output_token_ids`、为它生成 `EngineCoreOutput` 发给前端——一个已取消的请求还在产生输出（trace 里取消之后还有它的 token）。若这个 token 恰好让 `check_stop` 为真，d 在 update 里以 `FINISHED_LENGTH_CAPPED`/`STOPPED` 结束、离开 `requests`，随后的取消找不到它，结束原因成了 length/stop 而不是 abort。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l04_q3", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q3（2 分）
#
# 取消可能与自然结束撞在一起：请求 e 在第 t 步的 `update_from_output` 里因达到 `max_tokens` 结束，而它的取消在第 t+1 步才被处理。这时 `finish_requests` 对 e 做了什么？为什么必须这样？
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 说清“做了什么”并给出理由：(a) 第 t 步 e 结束时已经释放了块、离开了 `running`，并从 `Scheduler.requests` 删除，所以第 t+1 步 `self.requests.get` 得到 `None`（vLLM 还检查 `is_finished()`），`finish_requests` 直接 `continue`，什么都不改；(b) 理由：取消是异步发来的，与自然结束赛跑是常态，所以它必须是无害的空操作——不能把已经发给前端的结束原因 length 改成 abort、再计一次 abort，也不能抛异常（异常会让引擎循环停下，连累所有请求）。理由答出其中一条即可。1 分 = 只说“跳过/什么都不做”而没有理由，或只有理由而说不清靠什么发现 e 已结束。0 分 = 认为 e 会被改成 `FINISHED_ABORTED`，或认为这里报错也无妨。
#
# **参考答案**
#
# 第 t 步，`check_stop` 把 e 写成 `FINISHED_LENGTH_CAPPED`，`update_from_output` 调用 `_free_request`：记进 `finished_req_ids`，`_free_blocks` 归还块并从 `self.requests` 删除，e 也离开了 `running`，这一步的输出已带着 `finish_reason="length"` 发给前端。第 t+1 步 `finish_requests(["e"], FINISHED_ABORTED)` 里 `self.requests.get("e")` 是 `None`，命中 L2268 的 `continue`，什么都不做。
#
# 必须这样：客户端断开、超时都是异步的，取消消息可能在请求自然结束前就已经发出，这种赛跑是常态。如果不跳过，要么对一个已经不存在的对象操作而抛出异常，让引擎循环停下、连累所有请求；要么把已经发出的结束原因改成 abort，请求的记录与前端收到的不一致。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown]
# ## 评分规则
#
# - 代码 4 分：主路径 2 分（按重算抢占 1 分、真实 EngineCore 的 trace 检查 1 分）、边界条件 2 分（各状态下的取消 1 分、停止条件 1 分）；
# - Q1～Q3 各 2 分：每题 3～5 句即可，答到题目所问的全部要点得 2 分，只答对一部分得 1 分。
#
# 总分 10 分，至少 8 分通过。参考答案只在教师分支（solutions/）中，先独立完成。
#
# ### 自检
#
# 下面的单元格用与 nbgrader 相同的检查函数给代码部分打分，Q1～Q3 显示为待人工评分。

# %%
self_check("lesson04", globals());

# %% [markdown]
# ← 上一课：第 3 课

# %% [markdown]
# ## 附录（选读）
#
# 不计分，可以跳过：在真实 vLLM 上对照、重算的实测、参考资料与差异清单。

# %% [markdown]
# ### 在真实 vLLM {{VLLM_VERSION}} 上看同一件事
#
# 演示的负载和四个取消交给 vLLM {{VLLM_VERSION}} 自己的 `Scheduler`（不带模型，由仿照 `EngineCore` 循环的驱动 `autograder/vllm_oracle/scheduler_harness.py` 推进），每个请求一行，每步一格。mini 行不是上面的演示，而是 minivllm 的 `Scheduler` 由同一个驱动推进：取消在 `schedule` 之前处理。
#
# 抢占、取消、停止三项评分也跑 `autograder/lesson04/vllm_view.py` 的场景，并逐 token 调用 vLLM 的 `check_stop`：你的函数接进 minivllm 后，每步都要与 vLLM 录下的相同。

# %%
L04.vllm_side_by_side()

# %% [markdown]
# ### 实测：重算的代价
#
# 同一负载上交替运行关、开 prefix cache：`computed` 是调度的 token 总数，`recomputed` 是每个 prompt 与输出 token 各算一次之外多算的部分。

# %%
cost = L04.recompute_cost()  # 每种配置 2 次，交替运行（引擎已由上面的演示预热；约 1 秒）
L04.print_recompute_cost(cost)

# %% [markdown]
# 表 4-1：开启 prefix cache 后重算的 token 少得多：恢复时算满的块大多还在缓存里。表里的墙钟时间只作参考：这台共用 CPU 上每步的固定开销占主导。
#
# 抢占频繁说明 KV 池太小：vLLM 文档建议加大 `gpu_memory_utilization`，减小 `max_num_seqs` 或 `max_num_batched_tokens`，或增加并行度，而不是指望抢占便宜。
#
# ### 补充细节
#
# - **priority 策略**：被抢占的是 (priority, arrival_time) 最大的 running 请求，放回时按优先级重新入队。
# - **stop 字符串**要看文本，由前端的 detokenizer 发现，再像取消一样通知 `EngineCore`。

# %% [markdown]
# ### 参考资料
#
# - [vLLM request.py](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/request.py)
# - [vLLM scheduler.py](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/core/sched/scheduler.py)
# - [vLLM sched/utils.py](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/core/sched/utils.py)
# - [vLLM engine/core.py](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/engine/core.py)
# - [vLLM async_llm.py](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/engine/async_llm.py)
# - [vLLM Optimization and Tuning：Preemption（current docs）](https://docs.vllm.ai/en/latest/configuration/optimization/)
#
# 源码链接固定到本课对照的 commit；current docs 与默认参数会变化，部署前按目标版本重新核对。
#
# ### 与 vLLM {{VLLM_VERSION}} 的差异
#
# 本课评分的机制与 vLLM 相同：按重算抢占、放回队首、`finish_requests` 的清理、`check_stop` 的顺序。其余差别：
#
# - **取消什么时候生效**：vLLM 的输入线程把 ABORT 同时放进 `aborts_queue` 和 `input_queue`。步与步之间，`_process_input_queue` 调用同步的 `EngineCore.abort_requests`，在下一次 `schedule` 之前结束请求。
#   - 步间到达的取消已由 `input_queue` 处理，`aborts_queue` 里的同一条随后什么也不做，真正起作用的是执行期间到达的那些；minivllm 只有 `aborts_queue`。
# - **异步调度**：vLLM {{VLLM_VERSION}} 默认开启，busy loop 跑 `step_with_batch_queue`，取消同样在 `update_from_output` 之前处理；本课画的是同步的 `step`。
# - **`RequestStatus`**：vLLM 还有 `WAITING_FOR_REMOTE_KVS`、`WAITING_FOR_STREAMING_REQ`（KV connector 与流式输入）；其余同名、同序，`is_finished` 都是“大于 PREEMPTED”。
# - **重复检测**：vLLM 的 `check_stop` 在长度上限之后还查 `repetition_detection`，命中时状态为 `FINISHED_REPETITION`、`stop_reason` 为 `"repetition_detected"`；minivllm 的 `check_stop` 同样如此，本课的练习不要求这一条。
# - **EOS**：vLLM 在 `ignore_eos` 时不设 `sampling_params._eos_token_id`，`check_stop` 只做比较；minivllm 用 `Request.eos_token_id`，显式检查 `ignore_eos`。行为相同。
# - **`max_tokens=None`**：vLLM 的 `InputProcessor` 在请求进入 `EngineCore` 前把它换成上下文剩余长度，`check_stop` 不会见到 `None`；练习要处理它。
# - **`_preempt_request`**：还释放 encoder cache、处理异步调度的 stale output，并把 id 记进 `reset_preempted_req_ids`，经 `SchedulerOutput.preempted_req_ids` 让 Model Runner V2 清掉请求状态。minivllm 在 `schedule()` 里收集这些 id。
# - **`finish_requests`**：vLLM 还跳过已 `is_finished()` 的请求，处理 `skipped_waiting` 队列和远端 KV 的延迟释放；minivllm 里已结束的请求不在 `Scheduler.requests` 里。
#   - vLLM 的 `_free_request` 记下 `finished_req_ids`，再由 `_free_blocks` 归还块、从 `requests` 删除；minivllm 的 `_free_request` 一次做完。
# - **调度策略**：minivllm 只有 FCFS；vLLM 的 `PriorityRequestQueue` 是一个堆，队首就是堆顶，`prepend_request` 并不插到最前，而是按 (priority, arrival_time) 重新入堆。

