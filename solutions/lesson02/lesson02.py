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
# 本课产出：能沿 `Scheduler.schedule()` 说清 token budget 怎样在 running 与 waiting 请求之间分配、长 prompt 怎样切成 chunk、KV 块不够时谁被抢占，以及 chunked prefill 的取舍。
#
# 通过要求：代码填空题（含 `SOURCE_MAP`）通过全部断言；Q1～Q3 都能沿源码对象给出因果链；总分至少 8/10。
#
# | 部分 | 分值 | 评分方式 |
# |---|---|---|
# | 代码·主路径（调度器场景 1 分 + 接入真实 EngineCore 1 分） | 2 | 自动 |
# | 代码·边界条件（KV 块不够时的抢占） | 1 | 自动 |
# | 代码·能映射回源码对象（`SOURCE_MAP`） | 1 | 自动 |
# | Q1～Q3 | 各 2 | 人工，按评分规则 |
#
# 没有 nbgrader 时（如 Colab），运行评分规则下的“自检”单元格或 `python -m autograder check lesson02`，得分与 nbgrader 的自动部分一致。

# %% [markdown]
# ## 源码版本与阅读方法
#
# 本课读 vLLM {{VLLM_VERSION}}（commit {{VLLM_COMMIT}}）。`scheduler.py` 有两千多行，只读下表的约 95 行（跳过 encoder、priority、spec 分支）：
#
# | 顺序 | vLLM 文件与入口（{{VLLM_VERSION}}） | minivllm 对应文件 | 带着什么问题读 |
# |---|---|---|---|
# | 1 | `vllm/v1/core/sched/scheduler.py`：`Scheduler.schedule` 开头的 `NOTE(woosuk)` 注释（L441–L450） | `minivllm/core/sched/scheduler.py`：`Scheduler` | 为什么没有 “prefill 阶段” 和 “decode 阶段”？ |
# | 2 | 同文件：RUNNING 循环的 token 数（L516–L523）与要块、抢占（L577–L590、L614–L629） | 同上 | 每个请求本步拿多少 token？块不够时抢占谁？ |
# | 3 | 同文件：WAITING 循环入口（L683–L697）与它的 `allocate_slots` 调用（L973–L994） | 同上 | 抢占过的一步为何不接纳？为何要整个请求放得下？ |
# | 4 | 同文件：`Scheduler._preempt_request` 的主体（L1287–L1294、L1313–L1315） | `minivllm/core/sched/scheduler.py`：`Scheduler._preempt_request` | 被抢占的请求交出什么、回到哪？ |
#
# 课程的 dense 模型在 vLLM {{VLLM_VERSION}} 默认由 Model Runner V2（`v1/worker/gpu/model_runner.py`）运行，minivllm 对应 V1 runner；调度器在 runner 之上。

# %%
# 上表各行在 vLLM {{VLLM_VERSION}} 源码里的样子：文件路径、行号与逐行原文（行号与上表一致；源码由第一个单元格获取并校验）。
from autograder.vllm_source import show_vllm

show_vllm("vllm/v1/core/sched/scheduler.py", "Scheduler.schedule", lines=(441, 450))
show_vllm("vllm/v1/core/sched/scheduler.py", "Scheduler.schedule", lines=(516, 523))
show_vllm("vllm/v1/core/sched/scheduler.py", "Scheduler.schedule", lines=(577, 590))
show_vllm("vllm/v1/core/sched/scheduler.py", "Scheduler.schedule", lines=(614, 629))
show_vllm("vllm/v1/core/sched/scheduler.py", "Scheduler.schedule", lines=(683, 697))
show_vllm("vllm/v1/core/sched/scheduler.py", "Scheduler.schedule", lines=(973, 994))
show_vllm("vllm/v1/core/sched/scheduler.py", "Scheduler._preempt_request", lines=(1287, 1294))
show_vllm("vllm/v1/core/sched/scheduler.py", "Scheduler._preempt_request", lines=(1313, 1315))

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
# V0 的默认调度器把 prefill 批和 decode 批分开，并优先 prefill：长 prompt 一来，正在生成的请求就拿不到 token。
#
# V1 的 `Scheduler` 没有 prefill 阶段，也没有 decode 阶段。每个请求只有两个数：KV 已算好的 `num_computed_tokens` 和全部 token 数 `num_tokens_with_spec`。每一步，调度器给请求分 token，让前者追赶后者：
#
# - 新请求差一整个 prompt，拿到的是 prefill 或它的一个 chunk；
# - 正在生成的请求只差 1 个 token，拿到的就是 decode；
# - prefix cache 命中的请求被接纳时，`num_computed_tokens` 从命中的 token 数起步，不是 0。
#
# 一步能分出去的 token 总数是 **token budget**（`self.max_num_scheduled_tokens`，默认等于 `max_num_batched_tokens`）。预算不够一个完整的 prompt，就先算一部分：这就是 chunked prefill。
#
# ### 2. 它如何工作
#
# `schedule()` 的骨架是两个循环：
#
# 1. **先 RUNNING**：按加入顺序遍历 `self.running`。一个请求本步拿到的 token 数不超过它还差的数目，不超过单请求上限 `long_prefill_token_threshold`（0 表示不设；免得一个长 prompt 独占一步），也不超过预算的剩余。再用 `kv_cache_manager.allocate_slots` 为它们要 KV 块。
#    - 失败（返回 `None`）就抢占优先级最低的 running 请求，然后重试；被抢占的若是当前请求本身，循环结束。
#    - `_preempt_request` 按重算（recompute）处理：释放全部块、状态改为 `PREEMPTED`、`num_computed_tokens = 0`、放回 waiting 队首。
# 2. **再 WAITING**：本步抢占过，就不再接纳新请求。否则对队首请求先查 prefix cache（`get_computed_blocks`），按同样的三条限制定 token 数，再调用 `allocate_slots`：成功就移入 running；失败就停止，FCFS 不跳过队首。running 数到了 `max_num_seqs` 也停止。
#    - **准入检查**（`scheduler_reserve_full_isl`，默认 `True`）：请求已有的全部 token（`request.num_tokens`，含被抢占前的输出）除去命中部分所需的块，当前空闲块都要放得下。
#
# 结果装进 `SchedulerOutput` 交给 worker，`num_computed_tokens` 随即推进。
#
# 下图是 vLLM 测试 `test_schedule_concurrent_partial_requests` 的例子（budget 1024、threshold 400、三个 800-token prompt），minivllm 跑出。

# %%
L02.fig_concurrent_partial();

# %% [markdown]
# 图 2-1：每步三个请求各分到的 token。第 1、2 步都是 400 + 400 + 224 = 1024，第三个请求只拿到剩余预算。第 3 步请求 0、1 已算完 prompt，各只要 1 个 token，请求 2 拿到剩下的 352。prefill 与 decode 在同一步、同一个 batch 里。
#
# ### 3. 正确性条件与常见误区
#
# - **预算不变量**：每步 token 总数 ≤ `max_num_batched_tokens`，threshold > 0 时每个 chunk ≤ threshold；worker 按预算预留缓冲。
# - **running 优先**：decode 中的请求每步都应拿到 1 个 token（除非被抢占或预算已分完）；先接纳 waiting，长 prompt 会吃光预算。
# - **`allocate_slots` 全有或全无**：要么分到全部的块，要么返回 `None` 且不改块表，调度器才能“先试、失败再抢占、再试”（全注意力层）。
# - **抢占最低优先级的那个**：FCFS 下 running 末尾的请求本步还没分到 token；从头部抢占，会踢出已分好 token 的请求，计划自相矛盾。
# - **抢占过的一步不接纳**：抢占说明 KV 池已不够分；这时接纳只会把刚释放的块再分出去，下一步又要抢占（thrashing）。
# - **准入检查不能代替上一条**：它只保证这个请求已有的 token 放得下当前空闲块，不为 running 请求以后的 decode 留块。
#
# ### 4. 性能与工程取舍
#
# - **budget**：一步的耗时大致随 token 数增长。budget 越大，吞吐越高、长 prompt 的 TTFT 越短，同一步里 decode 的 ITL 越长。
# - **threshold**：长 prompt 不能独占 budget；代价是多走几步，每步一次固定开销，后面的 chunk 重读前面的 KV；chunk 太小时 GEMM 低于硬件拐点。取值要在目标硬件与负载上用 benchmark 决定（附录有实测）。

# %% [markdown]
# ## 具体演示：真实引擎上的 budget、chunked prefill 与抢占
#
# 在真实的 minivllm `EngineCore` 上看评分用的混合负载 W1 的每步计划：budget 96、threshold 48、21 个可用 KV 块，每块 16 个 token，准入检查开启。
#
# a0、a1、a2 一开始到达；b0（150 个 token）、b1（104 个，前 64 个与 a1 相同）第 4 步到达；c0、c1 第 7、10 步到达。
#
# 每行是一步：`请求:token 数`，`d` 表示 decode，`p` 表示 prefill 或重算的 chunk。

# %%
w1, w2 = L02.reference_runs()  # minivllm 自带的 Scheduler；后面的评分也拿它作参考
L02.print_steps(w1, 1, 5)
print("...")
L02.print_steps(w1, 18, 31)

# %% [markdown]
# 读法：
#
# - 第 1 步三个新请求分掉整个 budget，a1 的 120 个 token 被 threshold 截成 48。
# - 第 4 步 b0、b1 到达却没被接纳：b0 的整段 prompt（10 个块）放不进空闲块，FCFS 下 b1 不能越过 b0。
# - 第 19 步 a1 结束、释放块，b0、b1 才进来；b1 前 4 个块命中 prefix cache，只需算 40 个 token。
# - 第 21 步 KV 池又不够，最后加入的 b1 被抢占。它的 106 个 token 占 7 块（6 个满块有哈希），链尾 3 块在 b0 要新块时被驱逐；第 25 步恢复时只有前 3 块（48 个 token）命中，重算 58 个。

# %% [markdown]
# ## 实践任务：唯一代码填空题
#
# 补齐 `schedule()` 的核心：上文“它如何工作”里一步之内的两个循环。
#
# 接口如下（评分时接到 minivllm 的 `Scheduler` 上）：
#
# - `running`：running 请求的 list，按加入顺序，最后一个优先级最低；`waiting`：waiting 请求的 deque（FCFS）。二者都原地修改。
# - `token_budget`：本步的 token 预算；`threshold`：单个请求本步最多拿多少 token，关闭时传入的就是 budget；`max_num_seqs`：running 的上限。
# - `num_new_tokens(req)`：请求还差多少 token；waiting 请求已扣除 prefix cache 命中的部分。
# - `allocate(req, n)`：为 `n` 个新 token 分配 KV 块，成功返回 `True`，失败返回 `False` 且什么都不改。准入检查和 watermark 在它里面。
# - `preempt(req)`：按重算抢占一个已经从 running 里取出的请求：释放块、状态改为 PREEMPTED、放回 `waiting` 队首。
# - 返回 `(scheduled, preempted)`：`{request_id: 本步 token 数}`，以及本步被抢占的请求列表。
#
# 只能修改 TODO/______ 位置，不得删除断言或放宽通过条件。
#
# > **minivllm ≠ vLLM**：练习只考 FCFS，省去 vLLM 循环里的几个分支（见附录的差异）。

# %% nbgrader={"grade": false, "grade_id": "l02_schedule_step", "locked": false, "schema_version": 3, "solution": true, "task": false}
def schedule_step(running, waiting, token_budget, threshold, max_num_seqs,
                  num_new_tokens, allocate, preempt):
    scheduled = {}  # request_id -> 本步计算的 token 数
    preempted = []  # 本步被抢占（按重算）的请求

    # TODO：先 running 后 waiting；每个请求本步的 token 数受三条限制（见“它如何工作”）；
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
# 第二项检查：把你的 `schedule_step` 接进真实的 minivllm `EngineCore`，跑 W1（上面的演示）和 W2（一个长 prompt 在两个 decode 请求旁反复被抢占），逐步核对 `SchedulerOutput` 与贪心输出。

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
# “能映射回源码对象”（1 分）在这里自动评分。下面每个名字都在上面打印的 vLLM 摘录里，照位置提示找到它，写成字符串（可以带 `self.`）：
#
# - `queue_factory`：WAITING 循环入口（L683–L697）里构造 `step_skipped_waiting` 的函数（`Scheduler.__init__` 也用它构造 `self.waiting`）；
# - `pick_queue`：同一段里，每接纳一个请求前选定从哪个 waiting 队列取请求的 `Scheduler` 方法；
# - `peek`：同一段里，查看队首请求、但不把它取出的队列方法；
# - `hit_tokens`：WAITING 的 `allocate_slots` 调用（L973–L994）里，告诉它 prefix cache 已命中多少 token 的那个关键字参数；
# - `preempted_list`：RUNNING 循环（L614–L629）里收集本步被抢占请求的局部 list，L684 据它决定接不接纳。

# %% nbgrader={"grade": false, "grade_id": "l02_source_map_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
SOURCE_MAP = {
    "queue_factory": "create_request_queue",  ### BLANK
    "pick_queue": "_select_waiting_queue_for_scheduling",  ### BLANK
    "peek": "peek_request",  ### BLANK
    "hit_tokens": "num_new_computed_tokens",  ### BLANK
    "preempted_list": "preempted_reqs",  ### BLANK
}

# %% nbgrader={"grade": true, "grade_id": "l02_source_map", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
L02.check_source_map(SOURCE_MAP)

# %% [markdown] nbgrader={"grade": false, "grade_id": "l02_q1", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q1（2 分）
#
# 几个请求正在 decode，这时来了一个长 prompt。如果 `schedule()` 先接纳 waiting、再遍历 running，这一步里正在 decode 的请求会怎样？沿 token budget（或 KV 块）说明原因。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 沿预算说清因果：新 prompt 先被接纳，它的 chunk 拿走至多 threshold 个 token（threshold 关闭时可以是整个预算），`token_budget` 被吃光或所剩不多 → 轮到 running 循环时预算不够（循环条件 `token_budget > 0` 不成立）→ decode 请求这一步拿不到它们各自的 1 个 token → 输出流停一步、ITL 变长；running 优先时每个 decode 请求先拿到这 1 个 token。另一条同样完整的链也给 2 分：新请求先分走 KV 块 → running 请求要块时 `allocate_slots` 返回 `None` → 被抢占、重算。1 分 = 只说 “decode 被饿死 / 卡住” 而没有预算（或 KV 块）的因果；或只描述预算怎么分，没说 decode 请求的后果。0 分 = 只说 FCFS、公平或优先级。
#
# **参考答案**
#
# 预算按循环顺序分出去。先接纳 waiting 时，长 prompt 的第一个 chunk 先拿走最多 `long_prefill_token_threshold` 个 token（threshold 关闭时是整个预算），预算可能一下就用完。轮到 `self.running` 时 `token_budget` 已经是 0，正在 decode 的请求这一步一个 token 都拿不到：它们的输出流停一步，ITL 出现尖峰（本课真实引擎检查的 W2 里，这样的循环在第 3 步让长 prompt 拿走全部 48 个 token，两个 decode 请求为 0）。先遍历 running，每个 decode 请求只要 1 个 token，一定先拿到，长 prompt 只用剩下的预算。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l02_q2", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q2（2 分）
#
# 一步里只要发生过抢占，`schedule()` 就不再接纳 waiting 请求（L684），即使 token budget 还有剩余。为什么？
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 沿 KV 块的流向说清：抢占说明 KV 块不够（`allocate_slots` 返回 `None`），而 token budget 约束的是计算量，有剩余不代表有块；被抢占请求交还的块是给 running 里更早的请求腾的，这时接纳（队首往往正是刚被抢占的请求）会把这些块再分出去 → 下一步 running 请求又要块 → 再抢占，请求来回跳、反复重算（thrashing）。1 分 = 只说 “避免抖动” 而没有块的流向；或只说 budget 与 KV 块是两种资源。0 分 = 只说公平或性能优化，没有因果链。答 “有了准入检查（`scheduler_reserve_full_isl`）就不需要这条规则” 是错的（它只看这个请求放不放得下，不为 running 请求以后的 decode 留块），这样答最多 1 分；不提准入检查不扣分。
#
# **参考答案**
#
# token budget 限制一步的计算量，KV 块限制所有 running 请求的总上下文；抢占发生，说明 `allocate_slots` 已经返回过 `None`，块不够了，budget 剩多少无关。`_preempt_request` 把被抢占请求的块全部交还、`num_computed_tokens` 归零、放回 waiting 队首，这些块是给 running 里更早的请求腾的。如果同一步接着接纳，队首往往就是刚被抢占的请求，它把刚腾出的块又拿走；下一步 running 请求再要块，又得抢占。请求在 running 与 waiting 之间来回跳，每次都从头重算，算力浪费、延迟变坏（thrashing）。本课 W2 关掉了准入检查，这样的循环会在第 5 步抢占长 prompt 后立刻把它接纳回来。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l02_q3", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q3（2 分）
#
# 把 `long_prefill_token_threshold` 从 0（不设）调到一个较小的值（比如 64）：正在 decode 的请求得到什么，一个长 prompt 付出什么？
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 收益与代价各一条，各带因果。收益：单个请求一步最多 threshold 个 token → 长 prompt 不能把整个 budget 塞进一步 → 与它同批的 decode 请求等的那一步变短 → ITL 的尖峰变小。代价：长度 L 的 prompt 要 ⌈L/threshold⌉ 步 → 每步一次固定开销、后面的 chunk 重读前面的 KV、chunk 太小时 GEMM 低于硬件拐点（答出其一即可）→ 长 prompt 的 TTFT 可能变长、吞吐可能下降。1 分 = 只答对一边，或两边都只有结论没有因果。0 分 = 方向说反，或把某个取值说成普遍最佳（一票否决）。不要求写出具体毫秒数或“该取多少”。
#
# **参考答案**
#
# threshold 限制单个请求一步拿到的 token，一个长 prompt 不再能占满一步的 budget。一步的耗时大致随 token 数增长，所以与长 prompt 同批的 decode 请求等的那一步变短，ITL 的最大值下降（附录实测：一步最多的 token 从 484 降到 69）。代价是长 prompt 要分成 ⌈L/threshold⌉ 步（480 个 token、threshold 64 要 8 步），每步都付一次调度和 forward 的固定开销，后面的 chunk 还要重读前面 chunk 的 KV；chunk 太小时 GPU 上的 GEMM 低于算术强度拐点。于是长 prompt 的 TTFT 可能变长、整体吞吐可能下降，具体多少要在目标硬件与负载上 benchmark。
#
# **附：检查方法（threshold 关闭）的参考解释**（不计分）：threshold 为 0 时单个请求只受剩余预算限制。第 1 步请求 0 拿到 800 个 token，请求 1 拿到剩下的 224，预算用完，请求 2 留在 waiting；第 2 步请求 0 只要 1 个（decode），请求 1 拿 576 个算完 prompt，请求 2 被接纳，拿到 1024 − 1 − 576 = 447；第 3 步请求 0、1 各 1 个，请求 2 拿 353。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown]
# ## 评分规则
#
# - 代码 4 分：主路径 2 分（调度器场景 1 分、接入真实 EngineCore 的每步计划与贪心输出检查 1 分）、边界条件 1 分（抢占）、能映射回源码对象 1 分；
# - Q1～Q3 各 2 分：必须包含对象、状态变化、正确性或成本链；
#
# 总分 10 分，至少 8 分通过。参考答案只在教师分支（solutions/）；引擎的版本在 `minivllm/` 里，先独立完成再读；核对后更换一个 batch、cache 或硬件条件重新推演。
#
# ### 自检
#
# 下面的单元格用与 nbgrader 相同的检查函数给代码部分打分（Q1～Q3 显示为待人工评分）。

# %%
self_check("lesson02", globals());

# %% [markdown]
# ← 上一课：第 1 课

# %% [markdown]
# ## 附录（选读）
#
# 不计分，可以跳过：在真实 vLLM 上对照、chunked prefill 的实测、更多取舍、参考资料与差异清单。

# %% [markdown]
# ### 在真实 vLLM {{VLLM_VERSION}} 上看同一件事
#
# 本课两个场景（3 × 800 / 1024 / 400 和 KV 池耗尽的抢占）交给 vLLM {{VLLM_VERSION}} 自己的 `Scheduler`（按 vLLM 测试的 `create_scheduler` 在 CPU 上构造），与 minivllm 的逐步对照：`!` 是抢占，free 是调度后的空闲块。
#
# 主路径与边界两项评分也跑这两个场景和另外八个（5 个 main_、3 个 boundary_，见 `autograder/lesson02/vllm_view.py`）：你的循环每步都要与 vLLM 录下的相同。

# %%
L02.vllm_side_by_side()

# %% [markdown]
# ### 实测：chunked prefill 的取舍
#
# 四个短请求正在 decode，第 5、15 步各来一个 480-token 的长 prompt。比较关闭 chunked prefill（budget 512）和几个 threshold，数字是这台机器上实测的。

# %%
runs = L02.run_demo()  # 约 10 秒：一个引擎，每种配置跑两遍（第一遍兼作预热）
rows = L02.latency_table(runs)
L02.print_latency_table(rows)
L02.fig_prefill_decode(runs);

# %% [markdown]
# 图 2-2：每步调度的 decode token（蓝）与 prefill token（橙），黑线是这一步的墙钟时间。上图关闭 chunked prefill，长 prompt 那一步比 decode 步慢许多倍；下图 threshold = 128，同样的 prompt 分 4 步算完。

# %%
L02.fig_tradeoff(rows);

# %% [markdown]
# 图 2-3：左边是长 prompt 的 TTFT，右边是 decode 请求的 ITL。表里 `prefill steps` 与 `max tokens`（decode 请求要等的最大一步）由调度决定，每次相同；毫秒数随负载波动，在负载下的 2 核机器上 TTFT 与 ITL 的大小次序会颠倒（例如 threshold 128 的 TTFT 一次 220 ms、另一次低于不分块）。
#
# 读图只读确定的部分：threshold 越小，一步最多的 token 越少（484 → 260 → 132 → 69），decode 等的那一步就越小；长 prompt 则多走几步（1 → 2 → 4 → 8），每步都付一次固定开销。TTFT 是升是降取决于一步的毫秒数怎样随 token 数变，这台机器在负载下两种次序都出现过，要在目标硬件上多次测量才能比较。

# %% [markdown]
# ### 更多取舍
#
# - **watermark**（默认 `0.0`，即关闭）：running 非空时，`allocate_slots` 为 WAITING/PREEMPTED 请求在所需块数上再加 `watermark × 总块数` 个空闲块；running 请求不受影响。
# - **重算（V1 唯一的抢占方式）**：V0 曾有 swap；重算浪费计算，但不需要 CPU 内存和 PCIe 带宽。被抢占的是最后加入的请求，它的 KV 未必少（可能已生成很长的输出），重算代价随它的 token 数增长。
# - **准入检查的代价**：长 prompt 可能在 waiting 里多等几步；换来的只是接纳那一刻整段放得下，块不被预留，接纳后仍可能被抢占（W1 第 21 步的 b1）。
# - **`num_computed_tokens` 在调度时推进**（`_update_after_schedule`）：没算完 prompt 的 chunk 不产生输出 token，`update_from_output` 收到的是空列表。
#
# ### 参考资料
#
# - [vLLM Scheduler source](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/core/sched/scheduler.py)
# - [vLLM SchedulerOutput](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/core/sched/output.py)
# - [vLLM KVCacheManager](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/core/kv_cache_manager.py)
# - [vLLM SchedulerConfig](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/config/scheduler.py)：各选项的默认值
# - [vLLM scheduler tests](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/tests/v1/core/test_scheduler.py)
# - [vLLM Optimization and Tuning（Preemption、Chunked Prefill）](https://docs.vllm.ai/en/latest/configuration/optimization/)
#
# 源码链接固定在 commit {{VLLM_COMMIT}}；current docs、支持矩阵和默认参数会变化，部署前按目标版本核对。

# %% [markdown]
# ### 与 vLLM {{VLLM_VERSION}} 的差异
#
# 本课评分的循环与 vLLM FCFS 下 `Scheduler.schedule` 的骨架相同（上面逐步对照过）。其余差别：
#
# - **async scheduling**：vLLM 默认开启（第 1 课），调度器是 `AsyncScheduler`，剩余 token 还要算上结果未回的 `num_output_placeholders`。本课的计划都是同步调度下的。
# - **没算完的 prefill chunk**：Model Runner V2（课程模型的默认）对这些请求取 `num_sampled = 0`（`v1/worker/gpu/input_batch.py`）。V1 runner 照常采样，再用 `discard_request_mask` 丢弃结果并倒回随机数生成器的 offset。minivllm 的 worker 直接返回空列表。
# - **投机解码的 budget**：只有 draft model 或并行 drafting 时，`VllmConfig._set_max_num_scheduled_tokens` 才把 budget 减去 drafter 可能插入的槽位数；n-gram、EAGLE、MTP 默认不减。
# - **priority 策略**：抢占 `max(self.running, key=...)`，它可能本步已分到 token，vLLM 把这些 token 还给 budget。练习与评分只用 FCFS。
# - **`allocate_slots` 的例外**：接纳 waiting 请求且开启准入检查时，vLLM 先做整段放得下的检查，再调用 `remove_skipped_blocks`，然后做第二道检查（running 请求只有第二道）；滑动窗口层的块在第二道检查返回 `None` 时也已释放。minivllm 只有全注意力。
# - **练习省去的分支**：running 请求 0 个新 token 时跳过它、看下一个（`continue`）；running 请求的 chunk 还受 `max_model_len` 限制；不开 chunked prefill 时，waiting 请求超出剩余预算就停止接纳；引擎暂停时不接纳；还有 encoder、KV connector 等分支。
