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
# # 第 2 课：统一调度器与 KVCacheManager：token budget 与 chunked prefill
#
# ## 本课目标与通过标准
#
# 本课产出：能沿 `Scheduler.schedule()` 的源码说清一步之内 token budget 怎样在 running 与 waiting 请求之间分配、长 prompt 怎样被切成 chunk、KV 块不够时谁被抢占，并能用真实引擎的测量说明 chunked prefill 用什么换来了什么。
#
# 通过要求：唯一代码填空题通过全部断言；Q1～Q3 都能沿源码对象给出因果链；能指出一个正确性不变量（例如每步调度的 token 数不超过 budget、正在 decode 的请求每步都拿到 token）、一个性能边界（例如一步的耗时随调度的 token 数增长，长 prefill 会拉高同一步里所有 decode 的 inter-token latency）和一个需要 benchmark 才能确认的结论（例如 `long_prefill_token_threshold` 取多少最合适）；总分至少 8/10。
#
# | 部分 | 分值 | 评分方式 |
# |---|---|---|
# | 代码·主路径（调度器场景 1 分 + 接入真实 EngineCore 1 分） | 2 | 自动 |
# | 代码·边界条件（KV 块不够：抢占、抢占自己、抢占后不接纳） | 1 | 自动 |
# | 代码·能映射回源码对象（`SOURCE_MAP`） | 1 | 自动 |
# | Q1～Q3 | 各 2 | 人工，按评分规则 |
#
# 没有 nbgrader 时（例如 Colab），运行本课最后的“自检”单元格，或在终端执行 `python -m autograder check lesson02`（在本笔记本所在的文件夹或仓库根目录都可以），得分与教师用 nbgrader 评出的自动部分一致。

# %% [markdown]
# ## 源码版本与阅读方法
#
# 本课程使用固定 commit 的永久链接保证行号可复现，同时链接 current docs 供核对最新变化。`scheduler.py` 有两千多行，大部分是多模态、KV connector、投机解码、LoRA 等分支；本课只读 `schedule()` 的骨架：两个循环、一次 `allocate_slots`、一次抢占、一个 `SchedulerOutput`。先找到下表中的注释和变量名，再看分支。
#
# | 顺序 | vLLM 文件与入口（8e958902eee5） | minivllm 对应文件 | 带着什么问题读 |
# |---|---|---|---|
# | 1 | [`vllm/v1/core/sched/scheduler.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/core/sched/scheduler.py)：`Scheduler.schedule` 开头的 `NOTE(woosuk)` 注释与 `token_budget = self.max_num_scheduled_tokens` | `minivllm/core/sched/scheduler.py`：`Scheduler.schedule` | 为什么调度器里没有 “prefill 阶段” 和 “decode 阶段”？ |
# | 2 | 同文件 `# First, schedule the RUNNING requests.`：`long_prefill_token_threshold`、`while True` 里的 `kv_cache_manager.allocate_slots`、`self.running.pop()`（FCFS）或 `max(self.running, key=...)`（priority）与 `_preempt_request` | `minivllm/core/sched/scheduler.py`：`Scheduler.schedule`、`Scheduler._preempt` | 每个请求本步拿多少 token？块不够时抢占谁，为什么是它？ |
# | 3 | 同文件 `# Next, schedule the WAITING requests.`：`if not preempted_reqs and self._pause_state == PauseState.UNPAUSED`、`get_computed_blocks`、`enable_chunked_prefill`、`allocate_slots(..., full_sequence_must_fit=self.scheduler_reserve_full_isl, has_scheduled_reqs=bool(self.running))` | `minivllm/core/sched/scheduler.py`：`Scheduler.schedule` | 为什么抢占过的一步不接纳新请求？为什么要整段 prompt 放得下才接纳？prefix cache 命中怎样减少本步要算的 token？ |
# | 4 | [`vllm/v1/core/kv_cache_manager.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/core/kv_cache_manager.py)：`KVCacheManager.allocate_slots`（`full_sequence_must_fit`、`watermark_blocks`）、`get_computed_blocks`；[`single_type_kv_cache_manager.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/core/single_type_kv_cache_manager.py)：`SingleTypeKVCacheManager.req_to_blocks`、`get_num_blocks_to_allocate` | `minivllm/core/kv_cache_manager.py`：`KVCacheManager.allocate_slots`、`KVCacheManager.get_computed_blocks`、`KVCacheManager.req_to_blocks` | `allocate_slots` 返回 `None` 意味着什么？为什么失败时（对全注意力模型）什么都不改？ |
# | 5 | [`vllm/v1/core/sched/output.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/core/sched/output.py)：`SchedulerOutput`、`NewRequestData`、`CachedRequestData` | `minivllm/core/sched/output.py`：`SchedulerOutput`、`NewRequestData`、`CachedRequestData` | worker 从一步的计划里拿到什么？`num_scheduled_tokens` 与 `preempted_req_ids` 各告诉它什么？ |
# | 6 | `scheduler.py`：`_update_after_schedule`、`update_from_output` | `minivllm/core/sched/scheduler.py`：`Scheduler.update_from_output` | `num_computed_tokens` 在哪一刻推进？为什么一个没算完的 prefill chunk 不产生输出 token？ |
#
# 源码快照：vLLM 8e958902eee5（本课逐条对照了前一天构建的 vLLM 0.27.1 发布包）。这个版本里抢占由 `Scheduler._preempt_request` 完成，`schedule()` 里有 priority 策略的分支，running 循环用 `num_output_placeholders` 处理 async scheduling 的占位 token（async scheduling 在这个版本是默认开启的：`SchedulerConfig.async_scheduling=None` 在没有不兼容选项时被 `VllmConfig.__post_init__` 设为 `True`，调度器类随之换成 `AsyncScheduler`，见第 1 课；minivllm 的调度器目前是同步的，本课的每步计划都是同步调度下的计划），waiting 循环在接纳前做整段 prompt 的准入检查（`scheduler_reserve_full_isl`）；这些都在骨架之外，骨架不变。方法会继续演进，面试回答应先声明所读版本。
#
# > **勘误（对照 vLLM 0.27.1）**：本课早先的版本说 `_preempt_request`、priority 策略和 async 占位 token 是“较新版本”才有的——不对，它们都在固定的 commit 里。

# %% nbgrader={"grade": false, "grade_id": "l02_setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
# 准备（锁定）：静音无害的警告（评分单元格不能写 stderr），导入本课的图、演示与检查。
import logging
import os
import warnings

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

from collections import deque  # noqa: E402
from types import SimpleNamespace  # noqa: E402

from autograder import lesson02 as L02  # noqa: E402
from autograder.common import ______, report, self_check, short_errors  # noqa: E402,F401

short_errors("lesson02")  # 评分单元格失败时只显示三行：哪一部分、错在哪、第一处不符（完整 traceback：%tb）

# %% [markdown]
# ## 核心心智模型
#
# ### 1. 它是什么，解决什么问题
#
# V0 的默认调度器把一步分成 “prefill 批” 和 “decode 批”，并优先 prefill：一个长 prompt 到来时，整步都被它占住，所有正在生成的请求在这一步里一个 token 也拿不到。（V0 打开 chunked prefill 后的调度器已经能把 decode 和 prefill chunk 放进同一步：先排 decode、再用剩余预算排 prefill chunk；但它仍按 prefill / decode 两类请求分别处理，是一个可选模式。）V1 的 `Scheduler` 换了一个更简单、总是生效的模型（源码开头 `NOTE(woosuk)` 的注释）：**调度器里没有 prefill 阶段，也没有 decode 阶段**。每个请求只有两个数：`num_computed_tokens`（KV 已经算好的 token 数）和 `num_tokens_with_spec`（prompt + 已生成 + 投机 token）。每一步，调度器给请求分 token，让前者追赶后者：
#
# - 新请求差一整个 prompt，拿到的 token 就是 prefill（或 prefill 的一个 chunk）；
# - 正在生成的请求只差 1 个 token，拿到的就是 decode；
# - prefix cache 命中的请求，`num_computed_tokens` 一开始就不是 0，只差剩下的部分；
# - 被抢占的请求 `num_computed_tokens` 归零，重新追（recompute）。
#
# 一步能分出去的 token 总数是 **token budget**（源码里是 `self.max_num_scheduled_tokens`：默认等于 `max_num_batched_tokens`；开启投机解码时 `VllmConfig._set_max_num_scheduled_tokens` 会减去 drafter 在一步里可能插入的槽位数 `max_num_new_slots_for_drafting × max_num_seqs`，所以更小）。它同时约束了一步 forward 的计算量和 worker 要准备的输入大小。chunked prefill 不是一个独立的机制，而是这条规则的自然结果：预算不够一个完整的 prompt，就先算一部分，下一步接着算。
#
# ### 2. 它如何工作
#
# `schedule()` 的骨架只有两个循环：
#
# 1. **先 RUNNING**：按加入顺序遍历 `self.running`。每个请求本步拿 `min(剩余 token, long_prefill_token_threshold, 剩余预算)`（threshold 为 0 表示不设上限），再调用 `kv_cache_manager.allocate_slots(request, num_new_tokens)` 为这些 token 要 KV 块。失败（返回 `None`）就抢占 **优先级最低** 的 running 请求——FCFS 下是最后加入的那个，`self.running.pop()`；priority 策略下是 `max(self.running, key=lambda r: (r.priority, r.arrival_time))`——再由 `_preempt_request` 按重算处理：释放它的全部块、状态改为 `PREEMPTED`、`num_computed_tokens = 0`、放回 waiting 队首；然后重试。如果被抢占的正是当前请求本身，说明没有别人可让，本请求也无法调度，循环结束。（async scheduling 下 running 请求的剩余 token 还要算上 `num_output_placeholders`：上一步已调度、结果还没回来的 token。）
# 2. **再 WAITING**：只有本步**没有发生抢占**时才接纳新请求（`if not preempted_reqs`，外加引擎未暂停）。对队首请求先查 prefix cache（`get_computed_blocks`），同样取 `min(剩余, threshold, 剩余预算)`，再调用 `allocate_slots(..., full_sequence_must_fit=self.scheduler_reserve_full_isl, has_scheduled_reqs=bool(self.running))`：
#    - **准入检查**（`scheduler_reserve_full_isl`，固定 commit 的默认值是 `True`）：不仅本步的 chunk，**整段 prompt** 除去 prefix cache 命中后需要的块，当前空闲块都要放得下，否则不接纳。否则 chunked prefill 下几个长 prompt 凭各自的第一个 chunk 同时进来，算到一半 KV 池就干了，只能互相抢占、反复重算；
#    - **watermark**（`watermark`，默认 `0.0` 即关闭）：本步已有请求被调度时，接纳 waiting / preempted 请求还要额外留出 `int(watermark × 总块数)` 个空闲块，给 running 请求继续生长；
#    - 成功才把它移入 running；失败就停止（FCFS：不跳过队首去接纳后面的请求）。
#    minivllm 的 `SchedulerConfig` / `EngineArgs` 有同名、同默认值的 `scheduler_reserve_full_isl` 与 `watermark`。
#
# 最后把结果装进 `SchedulerOutput`（每个请求本步的 `num_scheduled_tokens`、新请求的完整数据、老请求的增量、被抢占的 id），并立刻把 `num_computed_tokens` 推进（`_update_after_schedule`），worker 按这个计划执行。
#
# vLLM 的测试 `test_schedule_concurrent_partial_requests` 给出了一个精确的例子：budget 1024、threshold 400、三个 800-token 的 prompt。下图直接由 minivllm 的 `Scheduler` 跑出来（没有模型：用假的 worker 输出推进请求，和 vLLM 的调度器单测一样）。

# %%
L02.fig_concurrent_partial();

# %% [markdown]
# 图 2-1：每一步三个请求各分到的 token。第 1 步 400 + 400 + 224 = 1024，第三个请求只拿到剩余预算；第 2 步三个请求都已在 running 里，同样是 400、400、224；此时请求 0、1 的 800 个 prompt token 全部算完并采样出第一个 token，第 3 步它们各只要 1 个 token（decode），请求 2 拿到剩下的 800 − 224 − 224 = 352；第 4 步三者都在 decode。prefill 与 decode 在同一步、同一个 batch 里。
#
# ### 3. 正确性条件与常见误区
#
# - **预算不变量**：每步 `sum(num_scheduled_tokens) ≤ max_num_batched_tokens`，每个请求的 chunk ≤ threshold（threshold > 0 时）。worker 按 `max_num_batched_tokens` 预留输入缓冲和激活内存，超出预算不只是 “慢一点”。
# - **running 优先**：正在 decode 的请求每步都应拿到它的 1 个 token（除非被抢占）。如果先接纳 waiting，一批长 prompt 就能吃光预算，所有在线请求的输出流在这一步停住。
# - **`allocate_slots` 全有或全无（对全注意力模型）**：它要么为这批 token 分到全部所需的块，要么返回 `None` 且不改请求的块表。所以调度器可以放心地 “先试、失败再抢占、再试”。严格说这只对全注意力层成立：vLLM 的 `allocate_slots` 在检查空闲块之前先调用 `coordinator.remove_skipped_blocks`，把滑动窗口（sliding window）等层已经移出窗口的块释放掉——即使随后返回 `None`，这些块也已经还回去了（源码注释：“We can do this even if we cannot schedule this request”）。minivllm 只有全注意力，失败时什么都不改。
# - **抢占最低优先级的那个**：FCFS 下 running 列表按加入顺序排列，末尾的请求最新、优先级最低，也是本步还没被分到 token 的那个（循环从头往后走），被抢占的请求本步还没拿到任何东西。priority 策略下优先级最低的请求可能排在前面、本步已经分到了 token：vLLM 这时把它从 `scheduled_running_reqs` 里删掉、把它的 token 还给 `token_budget`、删掉它本步的新块记录、`req_index -= 1`——这是簿记，计划并不矛盾。练习只考 FCFS：从尾部 `pop()`；从头部抢占最老的请求会把已经分好 token 的请求踢出去而不做这笔簿记，本步计划就自相矛盾了。
# - **抢占按重算（recompute）**：V1 没有 swap，被抢占请求的 KV 块全部释放，恢复时从头算（prefix cache 可能命中其中一部分）；它放回 waiting 的**队首**，下一步优先恢复。
# - **抢占过的一步不接纳新请求**：抢占说明 KV 池已经不够分；这时接纳新请求只会把刚释放的块再分出去，下一步 running 请求又要块，又得抢占，形成抖动（thrashing）。准入检查（整段 prompt 放得下才接纳）从另一头防同一件事：它只保证新请求自己的 prompt 放得下当前的空闲块，不为 running 请求以后的 decode 留块（那是 `watermark` 的事），所以两条规则都需要。
# - **`num_computed_tokens` 在调度时推进**（`_update_after_schedule`）：一个没算完 prompt 的 chunk 也会被 worker 采样，但这个 token 没有意义。vLLM 里由 runner 丢弃它：`GPUModelRunner._prepare_inputs` 把 “本步算完后仍短于请求长度” 的请求记进 `discard_request_mask`，`_bookkeeping_sync` 清掉这些请求的采样结果（并把它们随机数生成器的 offset 倒回去），所以 `update_from_output` 收到的是空列表。minivllm 的 worker 同样对 partial prefill 返回空列表。
#
# ### 4. 性能与工程取舍
#
# - **budget 决定一步的大小**：一步的耗时大致随调度的 token 数增长（GPU 上在越过算术强度拐点之后），所以 budget 越大，吞吐越高、长 prompt 的 TTFT 越短，但同一步里 decode 请求的 inter-token latency（ITL）越长；budget 越小则相反。
# - **threshold 限制单个请求**：`long_prefill_token_threshold` 让一个长 prompt 不能独占 budget，几个长 prompt 可以并行推进，短请求也能挤进来；代价是长 prompt 需要更多步才算完。
# - **chunk 的额外成本**：每多一步就多一次调度、一次 forward 的固定开销、一次采样；后面的 chunk 还要在 attention 里重新读取前面 chunk 的 KV。chunk 太小时，GEMM 的算术强度低于硬件拐点，GPU 在读权重而不是在算。
# - **重算 vs. 交换**：重算浪费计算，但不需要 CPU 内存和 PCIe 带宽，也不需要 swap 的状态机；被抢占的大多是刚加入、KV 还不多的请求，重算代价有限——但 KV 池太小、又只看第一个 chunk 就接纳时，会反复抢占同一个请求（下面的真实引擎负载 W2 关掉了准入检查，就是这样；vLLM 正是为此加了默认开启的 `scheduler_reserve_full_isl`）。
# - **准入检查的代价**：整段 prompt 放得下才接纳，长 prompt 可能在 waiting 里多等几步（下面 W1 的 b0、b1 就等到 a1 结束才进来），换来的是不再中途被抢占、不再重算；watermark 再用一部分 KV 池换更少的抢占。两者的取值都要在目标负载上测。

# %% [markdown]
# ## 具体演示：真实引擎上的 budget、chunked prefill 与抢占
#
# 下面在真实的 minivllm `EngineCore`（默认模型 `data/models/shakespeare-llama`，CPU，torch attention 后端）上跑两件事。
#
# **一、混合负载上的每步计划。** 这是本课评分用的负载 W1（budget 96、threshold 48、只有 21 个可用 KV 块，每块 16 个 token，准入检查按默认开启）：a0、a1、a2 一开始到达，b0（150 个 token）、b1（104 个 token，前 64 个与 a1 相同，prefix cache 命中）在第 4 步到达，c0、c1 在第 7、10 步到达。每行是一步：`请求:token 数`，`d` 表示 decode，`p` 表示 prefill（或重算）chunk。

# %%
w1, w2 = L02.reference_runs()  # minivllm 自带的 Scheduler；后面的评分也拿它作参考
L02.print_steps(w1, 1, 5)
print("...")
L02.print_steps(w1, 18, 31)

# %% [markdown]
# 读法：第 1 步三个新请求分掉整个 budget（a1 的 120 个 token 被 threshold 截成 48）；第 2 步 a0 已在 decode，a1、a2 继续 prefill，第 3 步 a1 算完最后 24 个 token。第 4 步 b0、b1 到达，budget 还剩 93 个 token，却一个也没有接纳：**准入检查**要求 b0 的整段 150-token prompt（10 个块）放得下当前的空闲块，而三个 running 请求正占着大部分 KV 池；FCFS 下 b1 也不能越过队首的 b0。它们一直等到第 19 步 a1 结束、块被释放，才一起进来（b1 前 4 个块命中 prefix cache，只需算 40 个 token）。准入检查只管接纳那一刻的 prompt，不为以后生成的 token 留块：running 请求继续生长，第 21 步 KV 池又不够，最后加入的 b1 被抢占，本步不再接纳任何请求；第 25 步 a0 结束后 b1 恢复，它之前算好的完整块又从 prefix cache 命中，只需重算 58 个 token（48 + 10）。c0、c1 同样在 waiting 里等到第 30 步才被接纳。对比关掉准入检查的同一负载：b0、b1 会在第 4 步凭第一个 chunk 进来，再在 KV 池耗尽时被抢占、重算——这就是 vLLM 把 `scheduler_reserve_full_isl` 默认打开要防的事。
#
# **二、chunked prefill 的取舍。** 四个短请求正在 decode，第 5 步和第 15 步各来一个 480-token 的长 prompt。比较 “关闭 chunked prefill”（`enable_chunked_prefill=False`，budget 512，长 prompt 一步算完）和几个 `long_prefill_token_threshold`（budget 同为 512）：每步调度多少 prefill、多少 decode token，每步的墙钟时间，以及长 prompt 的 TTFT 和 decode 请求的 ITL。所有数字都是这台机器上实测的。

# %%
runs = L02.run_demo()  # 约 10 秒：一个引擎，每种配置跑两遍（第一遍兼作预热）
rows = L02.latency_table(runs)
L02.print_latency_table(rows)
L02.fig_prefill_decode(runs);

# %% [markdown]
# 图 2-2：每步调度的 decode token（蓝）与 prefill token（橙），黑线是这一步的墙钟时间（右轴，两幅图同一刻度）。上图关闭 chunked prefill：长 prompt 到达的那一步一次算完 480 个 token，这一步的耗时是普通 decode 步的许多倍，四个 decode 请求在这一步里都在等；下图 threshold = 128：同样的 prompt 分 4 步算完，每步只多出一百多个 token，decode 请求每步照常拿到 token。

# %%
L02.fig_tradeoff(rows);

# %% [markdown]
# 图 2-3：左边是长 prompt 的 TTFT（到达到第一个输出 token），右边是 decode 请求的 ITL：所有步的中位数、同时带着 prefill（或 chunk）的那些步的平均值（表中 `in prefill steps`）、最大值。表中 `prefill steps` 是长 prompt 从第一个 chunk 到算完用了几步：off 是 1 步，threshold 256、128、64 分别是 2、4、8 步——这是确定的；毫秒数由每步的墙钟时间算出（每种配置跑两遍，每步取较快的一次），会随机器负载波动，在多人共用的机器上尤其如此。
#
# 读图：带 prefill 的步里 decode 的 ITL（橙线）随 threshold 变小而下降，最大值也大体如此（最大值只由一步决定，容易被机器上别的负载的一次抖动左右，看趋势）；中位数几乎不变，因为大多数步本来就只有 decode——这就是 chunked prefill 买到的东西：一步的大小有了上界，decode 不再被一个长 prefill 卡住。它的代价是长 prompt 要多走几步：每一步都有固定开销，还要在 attention 里重读前面 chunk 的 KV，所以 threshold 小到一定程度时 TTFT 会上升。在这台 CPU 上，这个代价几乎看不出来：固定开销很小，而一个 480-token 的大步并不比几个小步加起来快（大矩阵超出缓存，attention 的开销随长度平方增长），测得的 TTFT 往往不升反降；在 GPU 上，一个只有几个 decode token 的步和一个 256-token 的步耗时相差无几（decode 受带宽限制，每步都要读一遍权重），每多一个 chunk 就几乎多出一整步，TTFT 的代价要大得多。这正是为什么 threshold 和 budget 的取值必须在目标硬件、目标负载上用 benchmark 决定，不能照搬这里（或任何一篇文章）的数字。

# %% [markdown]
# ## 实践任务：唯一代码填空题
#
# 补齐 `schedule()` 的核心：一步之内的 token-budget 循环。先 running、后 waiting；每个请求拿 `min(剩余 token, threshold, 剩余预算)`；`allocate` 失败时按重算抢占优先级最低的 running 请求；本步抢占过就不再接纳新请求。
#
# 函数只看到一个很小的接口（评分时由 `autograder` 把它接到真实的 minivllm `Scheduler` 上）：
#
# - `running`：running 请求的 list，按加入顺序（最后一个优先级最低）；`waiting`：waiting 请求的 deque（FCFS）。二者就是 `Scheduler.running` / `Scheduler.waiting` 本身，原地修改。
# - `token_budget`：本步的 token 预算；`threshold`：单个请求本步最多拿多少 token（`long_prefill_token_threshold`，为 0 即关闭时传入的就是 budget）；`max_num_seqs`：running 的上限。
# - `num_new_tokens(req)`：请求还差多少 token（waiting 请求已扣除 prefix cache 命中的部分）。
# - `allocate(req, n)`：为 `req` 的 `n` 个新 token 分配 KV 块（`KVCacheManager.allocate_slots`），成功返回 `True`，失败返回 `False` 且什么都不改。对 waiting 请求它已经包含了准入检查（`full_sequence_must_fit=scheduler_reserve_full_isl`）和 watermark，和 vLLM 一样在 `allocate_slots` 里面做，不是这个循环的事。
# - `preempt(req)`：按重算抢占一个**已经从 running 里取出**的请求：释放 KV 块、状态改为 PREEMPTED、放回 `waiting` 队首。
# - 返回 `(scheduled, preempted)`：`{request_id: 本步 token 数}`，以及本步被抢占的请求列表。
#
# 只能修改 TODO/______ 位置，不得删除断言或放宽通过条件。

# %% nbgrader={"grade": false, "grade_id": "l02_schedule_step", "locked": false, "schema_version": 3, "solution": true, "task": false}
def schedule_step(running, waiting, token_budget, threshold, max_num_seqs,
                  num_new_tokens, allocate, preempt):
    scheduled = {}  # request_id -> 本步计算的 token 数
    preempted = []  # 本步被抢占（按重算）的请求

    # TODO：先 running 后 waiting；每个请求拿 min(剩余 token, threshold, 剩余预算)；
    #       allocate 失败就抢占优先级最低的 running 请求；本步抢占过就不再接纳新请求。
    i = 0
    while i < len(running) and token_budget > 0:
        req = running[i]
        n = min(num_new_tokens(req), threshold, token_budget)  ### BLANK
        ok = allocate(req, n)
        while not ok:
            victim = running.pop()  ### BLANK
            preempt(victim)
            preempted.append(victim)
            if victim is req:
                break
            ok = allocate(req, n)
        if not ok:
            break
        scheduled[req.request_id] = n
        token_budget -= n  ### BLANK
        i += 1

    admit = not preempted  ### BLANK
    while admit and waiting and token_budget > 0 and len(running) < max_num_seqs:
        req = waiting[0]
        n = min(num_new_tokens(req), threshold, token_budget)  ### BLANK
        if not allocate(req, n):
            break
        running.append(waiting.popleft())
        scheduled[req.request_id] = n
        token_budget -= n  ### BLANK
    return scheduled, preempted


# %%
# 逐项报告（不会中断 Run All）：每个自动评分部分一行，✗ 后面是第一处不符合的地方。
report("lesson02", globals())

# %% nbgrader={"grade": true, "grade_id": "l02_main_path", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# budget 1024、threshold 400、三个 800-token prompt，在 minivllm 的 Scheduler 上逐步调度
steps = L02.run_scenario(schedule_step, prompt_lens=(800, 800, 800), num_steps=3,
                         max_num_batched_tokens=1024, long_prefill_token_threshold=400)
assert steps[0] == {"0": 400, "1": 400, "2": 224}
assert steps[1] == {"0": 400, "1": 400, "2": 224}
assert steps[2] == {"0": 1, "1": 1, "2": 352}

# running 先于 waiting：r0 被 threshold 截成 4，预算用完，w0 等下一步
running = [SimpleNamespace(request_id=r, todo=t) for r, t in (("r0", 5), ("r1", 1), ("r2", 1))]
waiting = deque([SimpleNamespace(request_id="w0", todo=9)])
scheduled, preempted = schedule_step(running, waiting, 6, 4, 8, lambda r: r.todo, lambda r, n: True, None)
assert scheduled == {"r0": 4, "r1": 1, "r2": 1} and preempted == []
assert [r.request_id for r in waiting] == ["w0"]
### BEGIN HIDDEN TESTS
L02.check_main_path(schedule_step)
### END HIDDEN TESTS

# %% [markdown]
# 第二项检查：把你的 `schedule_step` 接进真实的 minivllm `EngineCore` 的 `Scheduler`（只替换这个实例的 `schedule`，其余——prefix cache 查询、`allocate_slots`、抢占、`SchedulerOutput`——都是引擎自己的），在默认模型上跑两个混合负载：W1 是上面演示的负载；W2 没有 threshold、没有 prefix cache、KV 池很小，并且关掉了准入检查（`scheduler_reserve_full_isl=False`），一个长 prompt 凭第一个 chunk 被接纳，又在两个 decode 请求旁边反复被抢占——这正是准入检查要防的抖动，也是错误的循环（例如抢占后又接纳）最容易暴露的地方。检查读取每一步的 `SchedulerOutput`：token 总数不超过 budget、chunk 不超过 threshold、正在 decode 的请求每步都拿到 token、抢占的一步没有接纳新请求、每步调度与 minivllm 自带的调度器完全一致；最后所有请求的贪心输出必须与参考引擎相同。

# %% nbgrader={"grade": true, "grade_id": "l02_real_engine", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
student_runs = L02.check_real_engine(schedule_step)
print("真实引擎检查通过：", [f"{len(r.steps)} 步、{r.num_preemptions} 次抢占" for r in student_runs])

# %% [markdown]
# ## 检查方法
#
# 运行断言；再把 threshold 关掉（`long_prefill_token_threshold=0`），解释每一步的分配：为什么第 1 步只有两个请求拿到 token，第三个请求什么时候、拿到多少？

# %%
for k, s in enumerate(L02.run_scenario(schedule_step, prompt_lens=(800, 800, 800), num_steps=3,
                                       max_num_batched_tokens=1024, long_prefill_token_threshold=0)):
    print(f"step {k + 1}: {s}")

# %% [markdown]
# 你的解释：

# %% nbgrader={"grade": true, "grade_id": "l02_boundary", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# 三个请求都在 decode；KV 池只剩一个块：r1 的第一次 allocate 失败
running = [SimpleNamespace(request_id=r, todo=1) for r in ("r0", "r1", "r2")]
waiting = deque([SimpleNamespace(request_id="w0", todo=5)])
calls = []

def allocate(req, n):
    calls.append(req.request_id)
    return n > 0 and calls != ["r0", "r1"]

scheduled, preempted = schedule_step(running, waiting, 100, 100, 8, lambda r: r.todo, allocate,
                                     lambda req: waiting.appendleft(req))
assert scheduled == {"r0": 1, "r1": 1}
assert [r.request_id for r in preempted] == ["r2"]          # 最后加入的 r2 被抢占（重算）
assert [r.request_id for r in running] == ["r0", "r1"]
assert [r.request_id for r in waiting] == ["r2", "w0"]      # 本步抢占过：w0 不被接纳
assert calls == ["r0", "r1", "r1"]
### BEGIN HIDDEN TESTS
L02.check_boundary(schedule_step)
### END HIDDEN TESTS

# %% [markdown]
# ## 映射回源码对象
#
# 评分规则中的“能映射回源码对象”（1 分）在这里自动评分：打开 vLLM 8e958902eee5 的 `vllm/v1/core/sched/scheduler.py`，在 `Scheduler`（`__init__`、`schedule()`、`_preempt_request`）和 `vllm/v1/core/sched/request_queue.py` 里找到下面每一项的名字（字符串，例如 `"obj.attr"`；可以带 `self.`，调用的括号和参数可省略；本课正文没有印出它们）：
#
# - `queue_factory`：`Scheduler.__init__` 按调度策略（FCFS 或 priority）构造 `self.waiting` 的那个函数；
# - `peek`：waiting 循环查看队首请求、但不把它取出的那个队列方法；
# - `requeue`：`schedule()` 一轮遍历 waiting 时跳过的请求（例如还在等远端 KV 的），在这一轮结束时被整批放回 `skipped_waiting` 队首所用的那个队列方法；
# - `pick_queue`：每接纳一个请求前，选择从 `self.waiting` 还是另一个 waiting 队列里取请求的那个方法；
# - `new_blocks`：`schedule()` 里记录本步每个请求新分到的 KV 块（`KVCacheBlocks`）的那个局部 dict；
# - `cached_data`：为本步继续运行（和恢复）的请求构造 `CachedRequestData` 的那个 `Scheduler` 方法。

# %% nbgrader={"grade": false, "grade_id": "l02_source_map_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
SOURCE_MAP = {
    "queue_factory": "create_request_queue",  ### BLANK
    "peek": "peek_request",  ### BLANK
    "requeue": "prepend_requests",  ### BLANK
    "pick_queue": "_select_waiting_queue_for_scheduling",  ### BLANK
    "new_blocks": "req_to_new_blocks",  ### BLANK
    "cached_data": "_make_cached_request_data",  ### BLANK
}

# %% nbgrader={"grade": true, "grade_id": "l02_source_map", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
L02.check_source_map(SOURCE_MAP)

# %% [markdown] nbgrader={"grade": false, "grade_id": "l02_q1", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q1（2 分）
#
# 为什么 `schedule()` 先给 running 请求分预算、再接纳 waiting 请求？如果反过来，在什么负载下会出什么问题？
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 说清 running 请求已经持有 KV 块、正在向客户端输出（decode 每步只要 1 个 token），先服务它们保证每个在线请求每步都有进展、ITL 有界，并让请求尽快结束、释放块；并给出反序的具体后果（一批长 prompt 吃光预算 → 所有 decode 在这一步拿不到 token；新请求先占块 → running 请求要块时被迫抢占，重算浪费）。1 分 = 只答对原因或后果之一。0 分 = 只说 “FCFS” 或 “优先级”，没有对象与状态变化。
#
# **参考答案**
#
# 1. running 请求是已经投入成本的请求：`Scheduler.running` 里的每个请求都持有 KV 块（vLLM：`KVCacheManager` 之下每个 KV-cache 组的 `SingleTypeKVCacheManager.req_to_blocks`；minivllm 只有一组，直接放在 `KVCacheManager.req_to_blocks`），其中 decode 请求每步只差 1 个 token（`num_tokens_with_spec - num_computed_tokens == 1`）。先遍历 `self.running`，它们每步都一定拿到这 1 个 token（budget 远大于 running 数），输出流的 inter-token latency 有上界；请求越早结束，块越早回到 `BlockPool`，后面的请求越早能进来。
# 2. running 列表按加入顺序排列，也就是优先级顺序。从头往后分预算、从尾部抢占，保证被抢占的总是本步还没拿到 token、优先级最低的那个，计划不会自相矛盾。
# 3. 反过来（先 waiting）：在 “很多请求在线生成、突然来了几个长 prompt” 的负载下，新 prompt 的 chunk 先把 budget 吃光，所有 decode 请求在这一步拿不到 token——用户看到输出流卡住（本课真实引擎检查里 W2 的第 3 步就是这样：长 prompt 拿走 48 个 token，两个 decode 请求为 0）。同时新请求先分走 KV 块，轮到 running 请求要新块时只能抢占，被抢占的请求要重算，算力浪费、延迟更坏。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l02_q2", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q2（2 分）
#
# 为什么一步之内只要发生了抢占，`schedule()` 就不再接纳任何 waiting 请求（`if not preempted_reqs`）？即使这一步的 token budget 还有剩余。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 指出抢占的含义是 KV 池已不够分（`allocate_slots` 返回 `None`），刚释放的块是为 running 请求腾的；此时接纳（常常就是刚被抢占、排在 waiting 队首的请求）会把块再分出去，下一步 running 请求又要块 → 再抢占 → 抖动与重复重算；说明 budget 有剩余不代表 KV 有剩余（两种资源）；并说清它与准入检查（`scheduler_reserve_full_isl`，固定 commit 默认开启）的关系：准入检查只看新请求自己的整段 prompt 是否放得下当前空闲块，不为 running 请求以后的增长留块，刚释放的块足以让它通过，所以抢占过的一步仍要停止接纳（答 “有了准入检查就不需要这条规则” 不得 2 分）。1 分 = 只说 “避免抖动” 而没有沿块的流向解释，或只说两种资源不同，或没有提到准入检查。0 分 = 认为是为了公平或性能优化而没有因果链。
#
# **参考答案**
#
# 1. token budget 约束的是一步的计算量，KV 块约束的是所有 running 请求的总上下文长度；`allocate_slots` 返回 `None` 说明后者已经用尽——这时 budget 还剩多少无关紧要。
# 2. 抢占是按重算做的：vLLM 的 `Scheduler._preempt_request`（minivllm：`Scheduler._preempt`）把被抢占请求的块全部还给 `BlockPool`、`num_computed_tokens` 归零、放回 `waiting` 队首。这些块是给 running 里更早的请求腾的。
# 3. 如果同一步继续接纳，waiting 队首往往正是刚被抢占的请求（或其他新请求）；它把刚释放的块又拿走，下一步 running 请求再要块，又要抢占：请求在 running 与 waiting 之间来回跳，每次都从头重算，算力浪费在丢弃的 KV 上，ITL/TTFT 都变坏（thrashing）。准入检查（`allocate_slots(..., full_sequence_must_fit=True)`）挡不住这种情况：刚释放的块正好够这个请求的 prompt，检查会通过；它不知道 running 请求下一步还要块。关掉准入检查时更糟：chunked prefill 下只要第一个 chunk 放得下就能进来。本课真实引擎检查的 W2（关掉了准入检查）里，这样的答案会在第 5 步抢占长 prompt 后又立刻把它接纳回来。
# 4. 不接纳还保证了 FCFS：被抢占的请求留在队首，下一步内存压力缓解后优先恢复，而不是被后来者插队。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l02_q3", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q3（2 分）
#
# chunked prefill 用什么换来了什么？`long_prefill_token_threshold`（以及 `max_num_batched_tokens`）该取多少，哪些部分可以从源码推出，哪些必须用 benchmark 决定？
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 换来的：一步的 token 数有上界 → 步长有上界 → decode 的 ITL 有界、长 prompt 不再阻塞在线请求，prefill 与 decode 同批（GPU 上计算受限与带宽受限的工作互补）；付出的：长 prompt 多走 ⌈L/threshold⌉ 步，每步有固定开销并要重读前面 chunk 的 KV，chunk 太小 GEMM 低于算术强度拐点 → TTFT 上升、吞吐下降；并明确：步数、预算不变量可由源码推出，而具体取值依赖硬件（拐点位置）、模型大小、prompt 长度分布与 TTFT/ITL 目标，必须在目标硬件与负载上 benchmark（指出本课 CPU 的测量不能外推到 GPU）。1 分 = 只说清一边的收益或代价，或没有区分 “可推出” 与 “需测量”。0 分 = 把本课 CPU 上的数字或某个 “最佳值” 写成普遍结论（一票否决）。
#
# **参考答案**
#
# 1. 换来的：`schedule()` 里每个请求拿 `min(剩余, threshold, 剩余预算)`，所以一步调度的 token 数 ≤ `max_num_batched_tokens`，单个请求 ≤ threshold。一步的耗时随 token 数增长，于是一步的长度有了上界：正在 decode 的请求不会因为一个长 prompt 整步等待，ITL 的尾部被压住（图 2-2、2-3：关闭时那一步的耗时是普通 decode 步的许多倍，threshold 越小 ITL 最大值越低）。GPU 上，受带宽限制的 decode 搭上受计算限制的 prefill chunk，一次读权重做更多的事。
# 2. 付出的：长度为 L 的 prompt 需要 ⌈L/threshold⌉ 步（本课：480 个 token，threshold 64 要 8 步）；每步都有调度、forward 启动、采样的固定开销，后面的 chunk 在 attention 里还要重读前面 chunk 的 KV；chunk 太小时 GEMM 的 M 维太小，低于硬件的算术强度拐点（H100 SXM 的 BF16 稠密峰值 / HBM 带宽约 295 FLOP/Byte，对应约数百个 token；PCIe 版不同），GPU 在读权重而不是在算 → 长 prompt 的 TTFT 变长、整体吞吐下降。
# 3. 可由源码推出的：预算与 threshold 的不变量、每个 prompt 需要的步数、decode 每步必得 1 个 token。必须 benchmark 的：一步的耗时与 token 数的关系（CPU 上固定开销小、大步不比几个小步快，所以本课测得的 TTFT 代价不明显甚至为负；GPU 上小步几乎与中等步一样贵，代价明显）、模型与并发下的拐点、真实流量的 prompt 长度分布，以及服务的 TTFT/ITL 目标——要在目标硬件上用真实或有代表性的负载（例如 `vllm bench serve`）扫 threshold 与 budget，画出 TTFT–ITL 曲线再选。本课 CPU 上的数字不能外推到 GPU。
#
# **附：检查方法（threshold 关闭）的参考解释**（不单独计分，供批改时核对学生在“检查方法”下写的解释）：threshold 为 0 时单个请求只受剩余预算限制。第 1 步请求 0 拿到全部 800 个 token，请求 1 拿到剩下的 224，预算用完，请求 2 留在 waiting；第 2 步请求 0 的 prompt 已算完，只要 1 个 token（decode），请求 1 拿 576 个把 prompt 算完，请求 2 才被接纳，拿到剩下的 1024 − 1 − 576 = 447；第 3 步请求 0、1 各 1 个，请求 2 拿 353。对比 threshold = 400：一个长 prompt 可以独占整步预算，后到的请求要多等一步才开始，这正是 threshold 要限制的情况。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown]
# ## 评分规则
#
# - 代码 4 分：主路径 2 分（调度器场景 1 分、接入真实 EngineCore 的每步计划与贪心输出检查 1 分）、边界条件 1 分（抢占）、能映射回源码对象 1 分；
# - Q1～Q3 各 2 分：必须包含对象、状态变化、正确性或成本链；
# - 一票否决：把论文峰值写成普遍生产结论；把源码支持写成所有模型/硬件可用；混淆算法正确性与性能；只背类名而说不清状态所有权。
#
# 总分 10 分，至少 8 分通过。参考答案与参考代码只在教师分支（solutions/）中：先独立完成；核对后请更换一个 batch、cache 或硬件条件重新推演，不能只复制。
#
# ### 自检
#
# 下面的单元格用与 nbgrader 相同的检查函数给代码部分打分（Q1～Q3 显示为待人工评分）。

# %%
self_check("lesson02", globals());

# %% [markdown]
# ## 参考资料
#
# - [vLLM Scheduler source](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/core/sched/scheduler.py)
# - [vLLM SchedulerOutput](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/core/sched/output.py)
# - [vLLM KVCacheManager](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/core/kv_cache_manager.py)（`allocate_slots` 的 `full_sequence_must_fit` 与 watermark）
# - [vLLM SchedulerConfig](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/config/scheduler.py)（`scheduler_reserve_full_isl`、`watermark`、`async_scheduling` 的默认值）
# - [vLLM scheduler tests（`test_schedule_concurrent_partial_requests` 等）](https://github.com/vllm-project/vllm/blob/8e958902eee5/tests/v1/core/test_scheduler.py)
# - [vLLM Optimization and Tuning（Preemption、Chunked Prefill）](https://docs.vllm.ai/en/latest/configuration/optimization/)
#
# 源码链接固定到本课审阅 commit；current docs、支持矩阵和默认参数会变化，面试或部署前必须按目标版本重新核对。
#
# ← 上一课：第 1 课：vLLM V1 源码地图：AsyncLLM、EngineCore 与 Worker　｜　下一课 →：第 3 课：BlockPool 与 Prefix Caching：块哈希链、命中与 LRU 驱逐
