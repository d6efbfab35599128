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
# 本课产出：能沿源码说清一个请求从进入 `EngineCore` 到结束的每一次状态转移（WAITING → RUNNING → PREEMPTED → RUNNING → FINISHED_*）由谁、在一步里的哪个阶段写下；说清 V1 为什么按**重算**（recompute）抢占、一次客户端断开怎样一路变成 `Scheduler.finish_requests`，以及每一步之后的停止判断（`max_tokens`、`max_model_len`、EOS、`stop_token_ids`、`min_tokens`）的顺序与边界。
#
# 通过要求：唯一代码填空题通过全部断言；Q1～Q3 都能沿源码对象给出因果链；能指出一个正确性不变量（例如每一步之后空闲块 + 在用块 = 总块数、不在 RUNNING 的请求不持有 KV 块、取消之后这个请求不再有任何输出）、一个性能边界（例如一次抢占要把被抢占请求的全部上下文重新 prefill，代价随上下文长度线性增长，prefix cache 命中时大部分可以省掉）和一个需要 benchmark 才能确认的结论（例如重算与换出到 CPU 哪个更快、KV 池多大时抢占不再频繁）；总分至少 8/10。
#
# | 部分 | 分值 | 评分方式 |
# |---|---|---|
# | 代码·主路径（按重算抢占 1 分 + 接入真实 EngineCore：KV 压力与取消 1 分） | 2 | 自动 |
# | 代码·边界条件（各状态下的取消 1 分 + 停止条件 1 分） | 2 | 自动 |
# | Q1～Q3 | 各 2 | 人工，按评分规则 |
#
# 没有 nbgrader 时（例如 Colab），运行本课最后的“自检”单元格，或在终端执行 `python -m autograder check lesson04`（在本笔记本所在的文件夹或仓库根目录都可以），得分与教师用 nbgrader 评出的自动部分一致。

# %% [markdown]
# ## 源码版本与阅读方法
#
# 本课程使用固定 commit 的永久链接保证行号可复现。本课只读请求生命周期的几个写点：谁把状态改成什么、在一步里的哪一刻改。
#
# | 顺序 | vLLM 文件与入口（8e958902eee5） | minivllm 对应文件 | 带着什么问题读 |
# |---|---|---|---|
# | 1 | [`vllm/v1/request.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/request.py)：`RequestStatus`（注释 “anything after PREEMPTED will be considered as a finished status”）、`RequestStatus.is_finished`、`Request.num_computed_tokens` | `minivllm/request.py`：`RequestStatus`、`Request` | 哪些状态算 “已结束”？为什么用 `IntEnum` 的大小比较？ |
# | 2 | [`vllm/v1/core/sched/scheduler.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/core/sched/scheduler.py)：`schedule()` 里 `allocate_slots` 失败后的 `self.running.pop()` 与 `Scheduler._preempt_request` | `minivllm/core/sched/scheduler.py`：`Scheduler.schedule`、`Scheduler._preempt` | 被抢占的请求丢掉了什么、保留了什么？为什么放回 waiting **队首**（`waiting.prepend_request`：FCFS 队列是队首，priority 策略按优先级重新插入）？ |
# | 3 | 同文件 `Scheduler.finish_requests`、`Scheduler._free_request` | `minivllm/core/sched/scheduler.py`：`Scheduler.finish_requests`、`Scheduler._free_request` | 一个请求可能在哪些队列里？取消一个已经结束的请求会怎样？ |
# | 4 | [`vllm/v1/engine/core.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/engine/core.py)：`EngineCore.abort_requests`、`EngineCore._process_aborts_queue`、`EngineCore.step` 里 “Before processing the model output, process any aborts” | `minivllm/engine/core.py`：`EngineCore.abort_requests`、`EngineCore._process_aborts_queue`、`engine_core_step` | 取消为什么要在 `update_from_output` **之前**处理？ |
# | 5 | [`vllm/v1/engine/async_llm.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/engine/async_llm.py)：`AsyncLLM.generate` 的 `except (asyncio.CancelledError, GeneratorExit)`、`AsyncLLM.abort` | `minivllm/engine/async_llm.py`：`AsyncLLM.generate`、`AsyncLLM.abort`；`minivllm/engine/core_client.py`：`abort_requests` | 客户端断开是怎样变成一条 abort 消息的？前端自己先做了什么？ |
# | 6 | [`vllm/v1/core/sched/utils.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/core/sched/utils.py)：`check_stop`；`scheduler.py`：`Scheduler.update_from_output` | `minivllm/core/sched/scheduler.py`：`Scheduler._check_stop`、`Scheduler.update_from_output` | 几个停止条件按什么顺序检查？EOS 恰好是第 `max_tokens` 个 token 时结束原因是什么？ |
#
# 源码快照：vLLM 8e958902eee5（本课逐条对照了前一天构建的 vLLM 0.27.1 发布包）。minivllm 与它的差别：
#
# - `RequestStatus`：vLLM 还有 `WAITING_FOR_REMOTE_KVS`、`WAITING_FOR_STREAMING_REQ`（KV connector 与流式输入）和 `FINISHED_REPETITION`（重复检测），minivllm 没有这些功能，也就没有这些状态；其余状态同名、同顺序，`is_finished` 同样是 “大于 PREEMPTED”。
# - EOS：vLLM 把 EOS 存在 `sampling_params._eos_token_id` 上，`update_from_generation_config` 在 `ignore_eos` 时干脆不设它，`check_stop` 只比较 `last_token_id == sampling_params.eos_token_id`；minivllm 把 EOS 放在 `Request.eos_token_id`，在 `_check_stop` 里显式检查 `ignore_eos`。两者行为相同。
# - `_preempt_request` 还要释放 encoder cache、处理 async scheduling 的 “stale output”（`num_stale_output_tokens`）与 KV connector；minivllm 只有 KV 块、`spec_token_ids` 与 `num_output_placeholders` 要清。
# - `finish_requests`：vLLM 还跳过已经 `is_finished()` 的请求、处理 `skipped_waiting` 队列和远端 KV 的延迟释放；minivllm 里已结束的请求已经不在 `Scheduler.requests` 里。
# - 放回 waiting：vLLM 调用 `self.waiting.prepend_request(request)`；FCFS 的 `FCFSRequestQueue` 是 `appendleft`（队首），`priority` 策略的 `PriorityRequestQueue` 没有“队首”，按 (priority, arrival_time) 重新入堆。minivllm 只有 FCFS，直接 `waiting.appendleft`。
# - **取消什么时候生效（minivllm ≠ vLLM）**：vLLM 的输入线程把一条 ABORT **同时**放进 `aborts_queue` 和 `input_queue`（`process_input_sockets` 的注释：“Aborts are added to *both* queues”）。步与步之间 `_process_input_queue` 处理 `input_queue`，`_handle_client_request` 调用 `EngineCore.abort_requests`——它是**同步的**，直接 `scheduler.finish_requests(..., FINISHED_ABORTED)`，所以在下一次 `schedule` 之前就结束了请求；`aborts_queue` 只是让一步**执行期间**到达的取消在 `update_from_output` 之前被提前处理（`finish_requests` 幂等，处理两次无害）。minivllm 的 `EngineCore.abort_requests` 只是把 id 放进 `aborts_queue`，只在一步的 aborts 阶段（`schedule` 之后、`update_from_output` 之前）处理；所以本课 trace 里“步前入队的取消在下一步 `schedule` 之后才生效、这一步还为它算了一次”是 minivllm 的行为，vLLM 里只有执行期间到达的取消才这样。
#
# 方法会继续演进，面试回答应先声明所读版本。

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
# 一个请求在 `EngineCore` 里的一生只由 `Scheduler` 书写：它是 `Request.status` 和 `Request.num_computed_tokens` 的唯一写者（第 1 课的 “一个状态一个写者”）。状态机很小：
#
# ```
#            schedule()              schedule(): allocate_slots 失败，它是优先级最低的 running
#  WAITING ─────────────► RUNNING ─────────────────────────────────────► PREEMPTED
#     │                    │   ▲                                           │
#     │                    │   └──────────── schedule()：重新接纳 ─────────┘
#     │                    │ update_from_output()：check_stop 为真
#     │                    ▼
#     │          FINISHED_STOPPED / FINISHED_LENGTH_CAPPED (/ FINISHED_ERROR)
#     └─── finish_requests(FINISHED_ABORTED)：WAITING、RUNNING、PREEMPTED 都可以 ───┘
# ```
#
# 它要解决三个问题：KV 池不够时怎样**让路**（抢占），客户端走了怎样**立刻停下**并归还资源（取消），以及一个请求**什么时候算完**（停止判断）。三者都只在 `Scheduler` 里改状态，但发生在一步的不同阶段：抢占在 `schedule()` 里，取消在 `_process_aborts_queue()` 里（`update` 之前），停止在 `update_from_output()` 里。
#
# ### 2. 它如何工作
#
# **抢占（按重算）。** `schedule()` 给一个 running 请求要块，`allocate_slots` 返回 `None`，就 `self.running.pop()` 取出优先级最低（FCFS 下最后加入）的请求，交给 `_preempt_request`（minivllm：`_preempt`）：
#
# 1. `kv_cache_manager.free(request)`：它的**全部** KV 块立刻回到 `BlockPool`（引用计数减一；开启 prefix cache 时，已经算满并哈希过的块留在缓存里，只是变成可驱逐的）；
# 2. `status = PREEMPTED`，`num_computed_tokens = 0`：KV 没了，进度也就没了——它已经生成的输出 token **保留**在 `output_token_ids` 里，恢复时连同 prompt 一起重新 prefill；
# 3. `waiting.appendleft(request)`（vLLM：`waiting.prepend_request(request)`）：放回 waiting **队首**，内存一有空就最先恢复，不被后来者插队（第 2 课：这一步也不再接纳任何请求）。“队首”只在 FCFS 策略下成立；`--scheduling-policy priority` 时它按优先级和到达时间重新排队。
#
# 恢复时它走的是普通的 waiting 路径：`get_computed_blocks` 先查 prefix cache——被抢占前算满的块如果还没被驱逐，直接命中，只需重算最后不满的那一块和之后的 token。所以在有 prefix cache 的 V1 里，重算往往比听起来便宜。V0 还有 “换出到 CPU”（swap）这种抢占方式；V1 只保留重算，原因是 Q1 的内容。
#
# **取消。** 客户端断开（HTTP 连接关闭）时，`AsyncLLM.generate` 这个 async generator 收到 `asyncio.CancelledError` / `GeneratorExit`，前端先在 `OutputProcessor` 里丢掉这个请求的输出状态，再经 `EngineCoreClient.abort_requests` 发出一条 ABORT 消息；`EngineCore` 的输入线程把它放进队列（vLLM：`aborts_queue` 和 `input_queue` 都放；minivllm：只进 `aborts_queue`，见上面的差异列表）。一步之内的顺序是：
#
# ```
# schedule → execute_model（异步） → grammar bitmask → 等 worker → _process_aborts_queue → update_from_output
# ```
#
# > **minivllm ≠ vLLM**：在 vLLM 里，步与步之间到达的取消由 `_process_input_queue` → `EngineCore.abort_requests`（同步）在下一次 `schedule` **之前**处理；上图的 `_process_aborts_queue` 只接住一步执行期间到达的取消。minivllm 只有后者，所以任何取消都在某一步的 `schedule` 之后才生效。
#
# `_process_aborts_queue` 调用 `Scheduler.finish_requests(ids, FINISHED_ABORTED)`：把请求从它所在的队列（running 或 waiting——PREEMPTED 的请求也在 waiting 里）中拿掉、状态改为 `FINISHED_ABORTED`、释放 KV 块、记进 `finished_req_ids`（下一步的 `SchedulerOutput` 据此让 worker 丢掉它的缓存行）、从 `self.requests` 删除。随后的 `update_from_output` 在 `self.requests` 里找不到它，于是这一步**已经算出来**的 token 也不会发出去。
#
# **停止判断。** `update_from_output` 每追加一个采样出的 token，就调用一次 `check_stop`，顺序是（vLLM `v1/core/sched/utils.py:check_stop`）：
#
# 1. 输出 token 数 < `min_tokens`：一律不停（采样时 EOS 和 stop token 也被屏蔽）；
# 2. 最后一个 token 是 EOS（`ignore_eos` 时不算）→ `FINISHED_STOPPED`；
# 3. 最后一个 token 在 `stop_token_ids` 里 → `FINISHED_STOPPED`，`stop_reason` 记下这个 token；
# 4. `num_tokens >= max_model_len` 或输出 token 数 `>= max_tokens` → `FINISHED_LENGTH_CAPPED`。
#
# 所以 EOS 恰好是第 `max_tokens` 个 token 时，结束原因是 `stop` 而不是 `length`。停下的请求随即离开 running、释放块。（stop **字符串**不在这里：它要看文本，由前端的 detokenizer 发现，再像取消一样通知 `EngineCore`。）
#
# 下面是真实引擎上的一次运行：默认模型、9 个可用 KV 块（每块 16 个 token），6 个请求陆续到达。左边一直跑到结束，右边在第 4～7 步之前分别取消一个正在 decode、正在 prefill、还在等待、已被抢占的请求（×）。

# %%
runs = L04.demo_runs()  # 两次真实引擎运行（默认模型，CPU，几秒）
L04.fig_swimlane(runs)
print(L04.caption_swimlane(runs))

# %% [markdown]
# 图 4-1：每个请求每一步 `update` 之后的状态（灰：等待；青绿：运行；橙红：被抢占；深蓝：正常结束；紫：取消）。上面单元格打印的说明由这两次运行本身算出：每个请求被抢占了几次、在哪几步，取消在哪一步、请求当时处于什么状态，以及最后一次取消之后是否还有抢占——读图时以它为准。KV 池一满，调度器就从 running 的末尾（FCFS 下最晚加入的）抢占；取消让块提前回到池里，抢占随之变少。
#
# 同一次运行（左）每一步之后在用的 KV 块数，红色三角是发生抢占的步：

# %%
L04.fig_blocks(runs[0]);

# %% [markdown]
# 图 4-2：在用块数一碰到池的上限（9），下一次要块的 decode 就触发抢占，被抢占的请求的块立刻回到池里（曲线下降）。空闲块 + 在用块在每一步都等于 9——这是本课真实引擎检查的不变量之一。
#
# ### 3. 正确性条件与常见误区
#
# - **块守恒**：每一步之后，空闲块 + 被请求持有的块 = 总块数；不在 RUNNING 的请求（WAITING、PREEMPTED、已结束）不持有块。抢占或取消时忘了 `free`，块就泄漏了：池越来越小，最后谁都跑不动。
# - **重算必须从 0 开始**：抢占后 `num_computed_tokens` 不归零，恢复时调度器以为前面的 KV 还在，worker 会拿着新分到的、内容是别人的块去做 attention——输出悄悄变错，不会报错。
# - **队首，不是队尾**：被抢占的请求放回队尾，后到的请求会先被接纳，而它已经等过、也已经输出过一部分——FCFS 被打破，尾延迟变坏，还可能被反复插队。
# - **取消要清干净**：请求必须离开 running / waiting，否则下一步它又被调度；必须离开 `self.requests`，否则同一步里已经算出来的 token 仍被发给一个已经走了的客户端。取消一个不存在（或已经结束）的 id 必须什么都不做：取消与请求自然结束可能同时发生。
# - **停止的边界**：`max_tokens` 是 “已输出 >= max_tokens 就停”，多一个就是 off-by-one；`ignore_eos` 只关掉 EOS，不关掉 `stop_token_ids` 和长度上限；`min_tokens` 之前什么都不停。
#
# ### 4. 性能与工程取舍
#
# 一次抢占的代价是把被抢占请求的**整个上下文**（prompt + 已生成的 token）重新 prefill 一遍：代价随上下文长度线性增长，并占用之后几步的 token budget。prefix cache 把其中 “已经算满、还没被驱逐” 的块变成命中。下表在同一个负载上比较关闭与开启 prefix cache（交替运行，取墙钟时间的中位数）：`computed` 是整个运行中调度的 token 总数，`recomputed` 是它超出最少需要量（每个 prompt 与输出 token 各算一次）的部分。

# %%
cost = L04.recompute_cost()  # 每种配置 2 次，交替运行（引擎已由上面的演示预热；约 5 秒）
L04.print_recompute_cost(cost)

# %% [markdown]
# 表 4-1：开启 prefix cache 后重算的 token 少得多：被抢占请求恢复时，它的 prompt 与已生成部分中算满的块大多还在缓存里，直接命中；抢占次数也可能变化（恢复更快，队列的形状就不同了）。墙钟时间在这台 CPU 上不能用来比较：每步的固定开销占主导，机器又是多人共用的，同一配置的两次运行可以差出一倍（表里的秒数是两次的中位数，只作参考）。在 GPU 上，一次长上下文的重算是实打实的 prefill 计算，代价要靠目标硬件上的 benchmark 来定；抢占本身是 “KV 池太小” 的信号——vLLM 的文档建议先加大 `gpu_memory_utilization`、减小 `max_num_seqs` / `max_num_batched_tokens` 或增加并行度，而不是指望抢占便宜。
#
# ## 具体演示：生命周期的 trace
#
# 检查不是看最终结果，而是读 trace：本课把第 1 课的 `Tracer` 打开，每次状态变化记成一个事件（名字是 `OLD->NEW`，带上步号和请求 id），和引擎自己的阶段事件（schedule、execute、wait、aborts、update）放在同一个 trace 里。下面是带取消那次运行的前 12 个转移：注意 `d` 的取消（第 4 步之后入队）出现在第 5 步的 `schedule` **之后**——minivllm 在这一步的 `aborts` 阶段才处理它。在 vLLM 里，步与步之间到达的这条取消会被 `_process_input_queue` 在第 5 步 `schedule` 之前同步处理，`d` 不会再被调度；只有在一步执行期间到达的取消才走 `aborts` 阶段。

# %%
L04.print_transitions(runs[1], 12)

# %% [markdown]
# ## 实践任务：唯一代码填空题
#
# 补齐调度器这一侧的生命周期：三个函数，签名与 minivllm 的方法一致（`sched` 就是 `Scheduler` 实例本身）。评分时 `autograder` 把它们装到一个真实的 minivllm `Scheduler` 上，分别替换 `_preempt`、`finish_requests` 和 `_check_stop`；`schedule()` 与 `update_from_output()` 仍是引擎自己的。
#
# - `preempt(sched, request)`：按重算抢占一个**已经从 `sched.running` 里取出**的请求：归还它的 KV 块（`sched.kv_cache_manager.free`）、状态改为 PREEMPTED、进度归零、放回 `sched.waiting`（一个 deque）的正确位置。
# - `finish_requests(sched, request_ids, finished_status)`：结束一批请求（取消时 `finished_status` 是 `RequestStatus.FINISHED_ABORTED`）；请求可能在 running 里，也可能在 waiting 里（WAITING 或 PREEMPTED）；不认识的 id 什么都不做。结束的请求要离开它的队列、写上状态、归还 KV 块、记进 `sched.finished_req_ids`、从 `sched.requests` 删除。
# - `check_stop(request, max_model_len)`：新 token 已经追加到 `request.output_token_ids` 之后调用；该停就把状态改为 `FINISHED_STOPPED`（EOS、stop token，后者还要设 `stop_reason`）或 `FINISHED_LENGTH_CAPPED` 并返回 `True`，否则返回 `False` 且什么都不改。`request.max_tokens` 可能是 `None`（不限）。
#
# 只能修改 TODO/______ 位置，不得删除断言或放宽通过条件。

# %% nbgrader={"grade": false, "grade_id": "l04_lifecycle", "locked": false, "schema_version": 3, "solution": true, "task": false}
from minivllm.request import RequestStatus


def preempt(sched, request):
    # TODO：按重算抢占：块全部归还、进度归零、放回 waiting 的队首。
    sched.kv_cache_manager.free(request)  ### BLANK
    request.status = RequestStatus.PREEMPTED  ### BLANK
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
# 第二项检查：把三个函数接进真实的 minivllm `EngineCore`（默认模型，9 个可用 KV 块），跑上面演示的负载两遍：一遍到结束（反复抢占、恢复），一遍在第 4～7 步之前经 `EngineCore.abort_requests`（客户端断开走的同一个输入队列）分别取消一个正在 decode、正在 prefill、还在等待、已被抢占的请求。检查读第 1 课的 `Tracer` 里记下的每一个状态转移：每一步之后每个转移都合法、空闲块 + 在用块 = 总块数且不在 RUNNING 的请求不持有块、取消后不再有这个请求的输出，所有请求的贪心输出都是 HF transformers 的贪心选择（一次 HF forward 逐位置核对 argmax）。

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
# 运行断言；再把 KV 池放大到 64 块重跑抢占场景，打印每步的抢占与恢复：为什么这时一次抢占都没有？然后把池缩到 7 块（6 个可用块）：谁在第几步被抢占、第几步恢复？为什么 r2 这次也被抢占了，而 8 块时它要晚得多？被抢占的请求恢复后为什么输出不变？

# %%
for blocks in (64, 7):
    _, _, _, log = L04.preemption_scenario(preempt, finish_requests, check_stop, num_gpu_blocks=blocks)
    print(f"num_gpu_blocks={blocks}:", [(x["step"], x["preempted"], x["resumed"]) for x in log if x["preempted"] or x["resumed"]])

# %% [markdown]
# 你的解释：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l04_q1", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q1（2 分）
#
# vLLM V1 为什么按重算（recompute）抢占，而不是像 V0 那样可以把 KV 换出（swap）到 CPU 内存？什么条件下重算反而更贵？
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 说清重算的状态变化（`_preempt_request`：块全部还给 `BlockPool`、`num_computed_tokens = 0`、PREEMPTED、waiting 队首；输出 token 保留，恢复时作为 prompt 的延续重新 prefill），说清它为什么在 V1 合适（统一调度器里恢复就是一个普通的 prefill，不需要换入换出的第二条数据通路、CPU 内存管理与同步；prefix cache 让算满的块在恢复时常常直接命中；chunked prefill 让重算与 decode 同批，GPU 上 prefill 计算受限、吞吐高），并给出重算更贵的条件（上下文很长、prefix cache 已被驱逐、抢占频繁 → 重复付出 prefill；swap 的代价是 PCIe 传输，与长度同样线性，但不占 GPU 计算），指出哪个更快要在目标硬件上 benchmark。1 分 = 只说 “实现简单” 或只说 prefix cache 的作用，没有状态变化或代价比较。0 分 = 声称重算总是更快或 swap 不存在代价（一票否决：把某一种硬件上的结论写成普遍结论）。
#
# **参考答案**
#
# 1. 重算做什么：`schedule()` 里 `allocate_slots` 返回 `None`，`self.running.pop()` 取出优先级最低的请求，`_preempt_request` 把它的块还给 `BlockPool`（prefix cache 开启时，算满并哈希过的块留在缓存里变成可驱逐）、`num_computed_tokens = 0`、状态 PREEMPTED、`waiting` 队首。已生成的 token 还在 `output_token_ids` 里；恢复时调度器只看到一个 `num_tokens - num_computed_tokens` 很大的请求，按普通 waiting 请求接纳：先 `get_computed_blocks` 查 prefix cache，剩下的按 chunked prefill 算。
# 2. 为什么在 V1 合适：V1 的调度器没有 prefill / decode 阶段，“恢复” 不需要任何特殊路径；swap 需要 CPU 上的块池、换出/换入的拷贝流与同步、worker 侧的块表重映射，以及 “换入完成前不能调度” 的状态——这是一条额外的数据通路和一整类 bug。重算的代价则被两件事压低：prefix cache 让被抢占前算满的块在恢复时直接命中（本课表 4-1：开启后重算的 token 从几百降到几十），chunked prefill 让重算与别人的 decode 同批进行，GPU 上 prefill 是计算受限的，单位 token 很便宜。
# 3. 什么时候重算更贵：上下文很长（重算与长度成正比，attention 部分还是平方）、prefix cache 已被其他请求挤掉、抢占频繁（同一个请求反复重算，本课左图里同一个请求被抢占了好几次，次数见图 4-1 那个单元格打印的说明）。swap 的代价是 KV 字节数 / PCIe 带宽，同样与长度线性，但不占 GPU 计算、也不挤占 token budget。哪个更快取决于模型（每 token 的 KV 字节数 vs 每 token 的 FLOPs）、GPU 与互连，要在目标硬件上 benchmark；工程上更重要的是别让抢占频繁发生（加大 KV 池、限制 `max_num_seqs` / `max_num_batched_tokens`）。
#
# **附：检查方法的参考解释**（不单独计分，供批改时核对学生在“检查方法”下写的解释）：64 块时每个请求最多 4 块（40 + 24 = 64 个 token），三个请求一共 12 块，一开始就都放得下，`allocate_slots` 从不失败，也就没有抢占。7 块（6 个可用）时 r0、r1 各用 3 块进来，r2 被准入检查挡在外面；第 10 步 r0 要第 4 个块，池空了，最后加入的 r1 被抢占（3 块归还、`num_computed_tokens` 归零、waiting 队首）；r0 结束后第 25 步 r1 最先恢复，r2 跟着进来，第 26 步两者再争块，这次最新的 r2 被抢占，第 41 步才恢复。8 块时多出的一个块让 r1、r2 晚一些才相撞。恢复后输出不变，是因为重算用的是同样的 token 序列（prompt + 已输出的 token），重建出同样的 KV；“模型”是确定的（真实引擎里是贪心解码），所以下一个 token 也一样——这也是为什么 `num_computed_tokens` 必须归零：少算一段，KV 就不是这个序列的 KV 了。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l04_q2", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q2（2 分）
#
# 第 1 课问过：如果 `EngineCore` 在一步里先 `update_from_output`、后处理取消队列，会出什么问题？现在用本课的 trace 回答：具体哪个请求、哪个对象会出错？
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 指出在这一步的 `schedule` 与 `update` 之间到达的取消（worker 已经在为它算 token）：先 update 会把这一步采样出的 token 追加进 `output_token_ids` 并作为 `EngineCoreOutput` 发给前端——一个客户端已经断开的请求又收到了输出（trace 里 `FINISHED_ABORTED` 之后还有这个请求的输出）；若这个 token 恰好触发了停止，请求以 STOPPED/LENGTH 结束、其块已在 update 里释放，随后的取消什么都不做，结束原因与统计（abort 计数）都错了；并说明先处理取消的保证：`finish_requests` 把它从 `self.requests` 删除，`update_from_output` 里 `requests.get(req_id) is None` 直接跳过，worker 算出的 token 被丢弃，块只释放一次。1 分 = 只说 “多输出一个 token” 或 “浪费” 而没有沿对象说明。0 分 = 认为顺序无关紧要。**minivllm 与 vLLM 的差别不扣分**：本课 trace 的故事（步前入队的取消在下一步 `schedule` 之后才生效）是 minivllm 的；学生若指出 vLLM 在步与步之间经 `_process_input_queue` → 同步的 `EngineCore.abort_requests` 在 `schedule` 之前处理取消、只有执行期间到达的取消才落到 `_process_aborts_queue`，并据此说明问题只出现在“执行期间到达”的取消上，同样给满分——只要说清描述的是哪个系统。
#
# **参考答案**
#
# 1. 一步的顺序：`schedule`（这一步要算 `d` 的一个 token）→ `execute_model` → 等 worker → `_process_aborts_queue` → `update_from_output`。本课带取消的那次运行里（minivllm），`d` 的取消在第 5 步之前入队，trace 显示它在第 5 步 `schedule` 之后（`after aborts`）才变成 `FINISHED_ABORTED`：这一步 worker 已经为 `d` 采样了一个 token。vLLM 里这条步前到达的取消会先被 `_process_input_queue` 同步处理；同样的情形发生在一步执行期间到达的取消上（`aborts_queue` 正是为它准备的）。
# 2. 现在的顺序：取消先到，`finish_requests` 把 `d` 从 `running` 拿掉、释放块、记进 `finished_req_ids`、从 `Scheduler.requests` 删除；`update_from_output` 遍历 `num_scheduled_tokens` 时 `self.requests.get("d")` 是 `None`，跳过——这一步为它算出的 token 丢弃，前端不会再收到 `d` 的任何输出（检查 “取消后不再有输出” 读的就是这个）。
# 3. 反过来：`update` 先把 token 追加到 `d.output_token_ids`、生成 `EngineCoreOutput` 发给前端——一个已经走了的客户端还收到了输出，`OutputProcessor` 里这个请求的状态已经被前端清掉，最好的情况是白做、最坏是报错；如果这个 token 恰好让 `check_stop` 为真，`d` 会以 `FINISHED_LENGTH_CAPPED`/`STOPPED` 结束并在 update 里释放块、离开 `requests`，随后的取消找不到它，结束原因变成了 length 而不是 abort（指标里 abort 计数也少一次）。第 1 课只能从代码推断，这里是可观察的：trace 里 `FINISHED_ABORTED` 之后出现这个请求的输出，就是顺序错了。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l04_q3", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q3（2 分）
#
# 取消与一步引擎是并发的：客户端可能在任何时刻断开，而一步可能正在执行。一个与一步 “赛跑” 的取消必须保证什么？minivllm / vLLM 用哪些对象保证它们？
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 至少说出并对应到对象的三条保证：(a) 状态只由引擎循环所在的线程写（输入线程只把取消入队；vLLM 里 ABORT 同时进 `input_queue` 和 `aborts_queue`，引擎循环在步与步之间由 `_process_input_queue` 调用同步的 `EngineCore.abort_requests`，在一步执行期间到达的则由 `_process_aborts_queue` 在 `update_from_output` 之前处理；minivllm 只有 `aborts_queue` 这一处——两种描述都给分，只要说清是哪个系统；不要求说“vLLM 的 abort_requests 只入队”，说它同步调用 `finish_requests` 是对的），(b) 取消之后不再有输出（在 `update_from_output` 之前处理；`update` 跳过不在 `requests` 里的请求），(c) 资源恰好释放一次、不影响别人（块归还、`finished_req_ids` 让 worker 丢掉缓存行；取消一个已经自然结束或不存在的 id 是无操作——取消与停止同时发生是常态），并指出取消可能落在任一状态（WAITING、prefill 中、decode 中、PREEMPTED），每种都要离开正确的队列。1 分 = 只说出其中一两条或没有对应对象。0 分 = 认为可以在收到取消时立即从输入线程修改调度器状态。
#
# **参考答案**
#
# 1. **一个写者**：前端（`AsyncLLM.generate` 捕获 `CancelledError`/`GeneratorExit`）先在 `OutputProcessor` 里丢掉这个请求的输出状态，再经 `EngineCoreClient.abort_requests` 发消息；`EngineCore` 的输入线程只把消息入队（线程安全的 `queue.Queue`；vLLM 把 ABORT 同时放进 `input_queue` 和 `aborts_queue`，minivllm 只放进 `aborts_queue`），真正改 `Scheduler` 的只有引擎循环自己，而且只在固定的位置：vLLM 在步与步之间（`_process_input_queue` → `EngineCore.abort_requests`，同步调用 `finish_requests`，下一次 `schedule` 之前）和一步之内（`_process_aborts_queue`，`update_from_output` 之前）；minivllm 只在后者。于是调度器看到的永远是一致的快照：一个请求不会在 `schedule()` 遍历 `running` 时凭空消失。
# 2. **取消之后没有输出**：worker 可能已经为它算了这一步的 token；先处理取消、把它从 `Scheduler.requests` 删除，`update_from_output` 就跳过它。异步调度下前端也会丢掉迟到的输出（`OutputProcessor` 里已经没有这个请求）。
# 3. **恰好一次、各状态都对**：取消可能落在 WAITING（只在 `waiting` 里，没有块）、prefill 中或 decode 中（在 `running` 里，持有块）、PREEMPTED（在 `waiting` 里、块已在抢占时还掉）。`finish_requests` 要按状态离开正确的队列、写 `FINISHED_ABORTED`、`kv_cache_manager.free` 一次、记进 `finished_req_ids`（下一步的 `SchedulerOutput` 让 worker 删掉它的 `CachedRequestState` 与块表行）。请求可能在同一步自然结束（`check_stop` 为真后已离开 `requests`），或 id 根本不存在：这时取消必须什么都不做，不能重复释放块、不能报错。本课的真实引擎检查在每一步之后核对块守恒与状态转移的合法性，读的正是这些保证。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown]
# ## 评分规则
#
# - 代码 4 分：主路径 2 分（按重算抢占的调度器场景 1 分、接入真实 EngineCore 在 KV 压力与取消下的 trace 检查 1 分）、边界条件 2 分（各状态下的取消 1 分、停止条件 1 分）；
# - Q1～Q3 各 2 分：必须包含对象、状态变化、正确性或成本链；
# - 一票否决：把论文峰值写成普遍生产结论；把源码支持写成所有模型/硬件可用；混淆算法正确性与性能；只背类名而说不清状态所有权。
#
# 总分 10 分，至少 8 分通过。参考答案与参考代码只在教师分支（solutions/）中：先独立完成；核对后请更换一个 KV 池大小、负载或取消时刻重新推演，不能只复制。
#
# ### 自检
#
# 下面的单元格用与 nbgrader 相同的检查函数给代码部分打分（Q1～Q3 显示为待人工评分）。

# %%
self_check("lesson04", globals());

# %% [markdown]
# ## 参考资料
#
# - [vLLM Request / RequestStatus](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/request.py)
# - [vLLM Scheduler（`_preempt_request`、`finish_requests`、`update_from_output`）](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/core/sched/scheduler.py)
# - [vLLM `check_stop`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/core/sched/utils.py)
# - [vLLM EngineCore（`abort_requests`、`_process_aborts_queue`）](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/engine/core.py)
# - [vLLM AsyncLLM（`generate` 的取消、`abort`）](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/engine/async_llm.py)
# - [vLLM Optimization and Tuning（Preemption）](https://docs.vllm.ai/en/latest/configuration/optimization/)
#
# 源码链接固定到本课审阅 commit；current docs、支持矩阵和默认参数会变化，面试或部署前必须按目标版本重新核对。
#
# ← 上一课：第 3 课：BlockPool 与 Prefix Caching：块哈希链、命中与 LRU 驱逐　｜　下一课 →：第 5 课：GPUModelRunner：持久批与 varlen 输入准备
