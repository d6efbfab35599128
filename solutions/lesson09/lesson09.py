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
# # 第 9 课：投机解码：n-gram 提议与拒绝采样
#
# ## 本课目标与通过标准
#
# 本课产出：
#
# - 说清一个草稿 token 从提议、调度、验证到回滚的一生，每一步由哪个对象负责；
# - 写出拒绝采样器：贪心与随机两条路径、从归一化的 $(p-q)^+$ 恢复、奖励 token，并把它接进真实引擎做投机解码。
#
# 通过要求：代码断言全部通过；Q1～Q3 沿源码对象给出因果链；能指出下面三条；总分至少 8/10。
#
# - 正确性不变量：贪心时投机与不投机逐 token 相同；随机时每个输出 token 的分布仍是目标分布 $p$。
# - 性能边界：每步最多多出 k 个 token，代价是每个请求多算 k 个位置。
# - 要靠 benchmark 的结论：在什么工作负载上投机真的更快。
#
# | 部分 | 分值 | 评分方式 |
# |---|---|---|
# | 代码·主路径（构造用例与卡方分布检验 1 分 + 接入真实引擎 1 分） | 2 | 自动 |
# | 代码·边界条件（没有草稿、全部接受、第一个就被拒、p/q > 1） | 1 | 自动 |
# | 代码·能映射回源码对象（`SOURCE_MAP`） | 1 | 自动 |
# | Q1～Q3 | 各 2 | 人工，按评分规则 |
#
# 没有 nbgrader 时（例如 Colab），运行最后的“自检”单元格，或在终端执行 `python -m autograder check lesson09`，得分与 nbgrader 评出的自动部分一致。

# %% [markdown]
# ## 源码版本与阅读方法
#
# 源码固定在 vLLM 0.27.1（commit 8e958902eee5）。沿着一个草稿 token 的一生读下面四段。
#
# | 顺序 | vLLM 文件与入口 | minivllm 对应 | 带着什么问题读 |
# |---|---|---|---|
# | 1 | `vllm/v1/spec_decode/ngram_proposer.py`：`_find_longest_matched_ngram_and_propose_tokens`（L215–218、L283–293） | `minivllm/spec_decode/ngram_proposer.py` | 草稿从哪里来？为什么不需要 q？ |
# | 2 | `vllm/v1/worker/gpu_model_runner.py`：`GPUModelRunner._calc_spec_decode_metadata`（L2856–2884） | `minivllm/worker/gpu_model_runner.py` | k 个草稿为什么要 k+1 行 logits？ |
# | 3 | `vllm/v1/sample/rejection_sampler.py`：`rejection_random_sample_kernel`（L796–845） | `minivllm/sample/rejection_sampler.py` | 接受条件是什么？拒绝后取哪个 token？ |
# | 4 | `vllm/v1/core/sched/scheduler.py`：`Scheduler.update_from_output`（L1761–1791） | `minivllm/core/sched/scheduler.py` | 被拒时 `num_computed_tokens` 退回多少？ |
#
# **runner**：n-gram 投机在 0.27.1 走 V1 的 `gpu_model_runner.py`，因为 `_get_v2_model_runner_unsupported_features` 把 n-gram 列为 Model Runner V2 不支持的特性。minivllm 的 runner 对应 V1。

# %%
# 上表各行在 vLLM 0.27.1 源码里的样子：文件路径、行号与逐行原文（行号与上表一致；源码由第一个单元格获取并校验）。
from autograder.vllm_source import show_vllm

show_vllm("vllm/v1/spec_decode/ngram_proposer.py", "_find_longest_matched_ngram_and_propose_tokens", lines=(215, 218))
show_vllm("vllm/v1/spec_decode/ngram_proposer.py", "_find_longest_matched_ngram_and_propose_tokens", lines=(283, 293))
show_vllm("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner._calc_spec_decode_metadata", lines=(2856, 2884))
show_vllm("vllm/v1/sample/rejection_sampler.py", "rejection_random_sample_kernel", lines=(796, 845))
show_vllm("vllm/v1/core/sched/scheduler.py", "Scheduler.update_from_output", lines=(1761, 1791))

# %% nbgrader={"grade": false, "grade_id": "l09_setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
# 准备（锁定）：静音无害的警告（评分单元格不能写 stderr）。
import logging
import os
import warnings

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

import torch  # noqa: E402

from autograder import lesson09 as L09  # noqa: E402
from autograder.common import ______, report, self_check, short_errors  # noqa: E402,F401

short_errors("lesson09")  # 评分单元格失败时只显示三行：哪一部分、错在哪、第一处不符（完整 traceback：%tb）

# %% [markdown]
# ## 核心心智模型
#
# ### 1. 它是什么，解决什么问题
#
# Decode 每步每个请求只产出 1 个 token，却要把全部权重和整段 KV 读一遍（第 6 课：decode 受带宽限制）。一次前向若能验证多个 token，读一遍权重就能产出多个 token。
#
# 投机解码先用便宜的办法猜出 k 个 token（草稿），再让目标模型一次前向算出这 k+1 个位置的 logits，用拒绝采样决定接受草稿的哪一段前缀。输出分布与目标模型自己采样相同，投机只改变速度。
#
# n-gram 提议（prompt lookup）不需要草稿模型：在请求自己的序列里找与结尾匹配的 n-gram 更早出现在哪里，把它后面的 k 个 token 当草稿。它对复述已有文本的负载有效，对全新内容几乎无效。
#
# ### 2. 它如何工作
#
# 一个草稿 token 的一生：
#
# 1. **提议**：第 t 步采样后，runner 调 `NgramProposer.propose` 提出至多 k 个草稿；`EngineCore.post_step` 经 `update_draft_token_ids` 存进 `request.spec_token_ids`。
# 2. **调度**：第 t+1 步，调度器把 1 个已知 token 和草稿一起排进本步（`num_new_tokens = 1 + k`），占 token budget 和 KV 槽位；草稿记在 `scheduled_spec_decode_tokens`。
# 3. **验证**：runner 把这 1+k 个 token 当作一个短 prefill 块跑一次前向，取 k+1 行 logits。第 j 行是看到前 j 个草稿后的目标分布 $p_j$，验证草稿 $x_j$；最后一行是奖励（bonus）行。
# 4. **拒绝采样**：贪心在 $x_j = \arg\max p_j$ 时接受；随机在 $p_j(x_j)/q_j(x_j) \ge u$（u 是这个草稿的均匀数）时接受，概率即 $\min(1, p_j/q_j)$。第一次拒绝时从归一化的 $(p_j - q_j)^+$ 采一个恢复 token 并停止。
# 5. **奖励**：全部接受时加上奖励行采出的 token。每个请求本步产出 `num_accepted + 1` 个 token，其余位置填 `PLACEHOLDER_TOKEN_ID`（-1）。
# 6. **回滚**：`update_from_output` 由产出的 token 数减 1 得到 `num_accepted`，`num_rejected = k - num_accepted`，把 `num_computed_tokens` 减去 `num_rejected`。被拒草稿的 KV 留在槽位里，下一步覆盖；块不用释放。
#
# n-gram 草稿没有概率分布，q 是草稿 token 上的 one-hot：接受概率就是 $p(x)$，恢复分布是去掉 x 后重新归一化的 p。
#
# ### 3. 正确性条件与常见误区
#
# - **第一次拒绝后必须停止**：第 j+1 行以草稿 $x_j$ 在序列里为前提；$x_j$ 被拒，后面各行的前缀都错了。
# - **恢复分布是归一化的 $(p - q)^+$，不是 p**：从 p 重采会让被拒的 x 再次出现，输出偏离 p（Q1）。
# - **接受个数决定 KV 回滚**：多算一个，被拒草稿的 KV 不回滚，后面接在错误的前缀上；少算一个，接受统计错了。
# - **贪心必须与不投机逐 token 相同**：这是最强的回归测试。算法上严格成立；GPU 上只在数值精度内成立（见附录）。
#
# ### 4. 性能与工程取舍
#
# - 每个请求每步多算 k 个位置，换来期望 $1 + \sum_{j=1}^{k} \prod_{i \le j} \alpha_i$ 个 token，$\alpha_i$ 是前面都接受时第 i 个位置的接受率。
# - decode 受带宽限制时，多算几个位置几乎不增加时间；batch 大到计算受限时，多算的位置就是真实成本（Q2）。
# - k 越大上限 k+1 越高，但越靠后的草稿越难被接受，而每个草稿都占 token budget 和算力（Q3）。

# %%
sweep = L09.k_sweep()
L09.print_sweep(sweep)
L09.plot_sweep(sweep);

# %% [markdown]
# 图 9-1：3 个 prompt、每个 40 个 token，贪心；不投机时 40 步、每步 3 个 token。左：接受率（接受的草稿 / 提出的草稿）随 k 增大而下降。中：每次验证平均产出的 token 数（`mean_acceptance_length`）随 k 上升，但远低于上限 k+1。右：每个引擎步产出的 token 数。
#
# `== plain` 一列说明每个 k 的贪心输出都与不投机时相同。这个小模型只在陷入循环时草稿才会命中，收益有限：n-gram 投机的收益取决于负载里有多少重复。

# %%
L09.plot_per_position(sweep);

# %% [markdown]
# 图 9-2：逐位置接受率的两种分母。
#
# - 左，vLLM 的算法（`SpecDecodingLogging.log`）：`num_accepted_tokens_per_pos[j] / num_drafts`，分母是验证次数。第 j 个草稿只有前面都被接受时才会被接受，所以这条曲线必然单调不增。
# - 右：分母是真有第 j 个草稿的次数（`num_draft_tokens_per_pos[j]`）。n-gram 草稿可以短于 k，短草稿多时它可以不单调；这里两边几乎重合。
#
# ## 具体演示：一个验证步里发生了什么
#
# 图 9-1 中 k = 3 的那次运行：引擎自带的 `RejectionSampler`，3 个 prompt 同批贪心生成 40 个 token。每一行是某一步里一个请求的草稿和这一步实际产出的 token。

# %%
L09.print_trace(L09.verification_trace())

# %% [markdown]
# 读表：
#
# - `no draft`：n-gram 没有找到匹配，这一步与不投机时一样只产出 1 个 token；
# - `recovered`：在某个位置被拒，产出已接受的草稿加 1 个恢复 token，被拒草稿的 KV 位置由调度器回滚；
# - `bonus`：3 个草稿全部接受，一次前向产出 4 个 token。
#
# 同一步里三个请求的草稿数可以不同，这正是练习里的批。这台 CPU 上省下的步数近似就是省下的时间，GPU 上大 batch 时未必如此（Q2）。

# %% [markdown]
# ## 实践任务：唯一代码填空题
#
# 下面是 vLLM `rejection_greedy_sample_kernel` 与 `rejection_random_sample_kernel` 的逐请求版本，恢复 token 在循环里就地采。
#
# - 输入布局与 minivllm 的 `SpecDecodeMetadata` 相同：请求 i 的 $k_i$ 个草稿行、然后它的奖励行，一个请求接一个请求；$k_i$ 可以不同，也可以是 0。
# - 6 处 `______` 是决策点：贪心的接受条件、随机的接受条件、接受后累计的个数、恢复分布、拒绝之后做什么、奖励 token。
#
# > 与 vLLM 的差异（评分涉及）：vLLM 的 `rejection_sample` 只拿草稿行，奖励 token 由普通采样器另行采好；q(x) = 0 时直接拒绝，练习不查（草稿从 q 抽出，q(x) > 0），详见附录。
#
# 只能修改 TODO/______ 位置，不得删除断言或放宽通过条件。

# %% nbgrader={"grade": false, "grade_id": "l09_rejection_sample", "locked": false, "schema_version": 3, "solution": true, "task": false}
import torch

PLACEHOLDER_TOKEN_ID = -1


def rejection_sample(draft_token_ids, target_probs, draft_probs, bonus_token_ids, is_greedy, uniform_probs,
                     generator=None):
    """Verify each request's drafts against the target model; returns (output_token_ids, num_accepted).

    draft_token_ids: list (batch) of lists, request i has k_i drafts (k_i may be 0)
    target_probs:    [sum(k_i + 1), V]  request i's k_i draft rows, then its bonus row
    draft_probs:     [sum(k_i), V] or None (n-gram drafts: q is one-hot on the draft)
    bonus_token_ids: [batch]  the target's own sample at each request's bonus row
    is_greedy:       list (batch) of bool
    uniform_probs:   [sum(k_i)]  one U(0, 1) draw per draft
    output_token_ids: [batch, max_k + 1], PLACEHOLDER_TOKEN_ID after each request's last emitted token
    """
    batch = len(draft_token_ids)
    max_k = max((len(d) for d in draft_token_ids), default=0)
    out = torch.full((batch, max_k + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.long)
    num_accepted = []
    row = 0                              # request i's first row in target_probs
    flat = 0                             # request i's first draft in draft_probs / uniform_probs
    for i, drafts in enumerate(draft_token_ids):
        k = len(drafts)
        n = 0                            # drafts accepted so far
        for j, x in enumerate(drafts):
            p = target_probs[row + j]
            if draft_probs is None:
                q = torch.zeros_like(p)
                q[x] = 1.0
            else:
                q = draft_probs[flat + j]
            # TODO 1. Accept the draft? Greedy: only the target's own choice. Random: as vLLM, accept when
            #         p(x) / q(x) >= u, this draft's uniform draw (so with probability min(1, p(x) / q(x))).
            if is_greedy[i]:
                accept = int(p.argmax()) == x  ### BLANK
            else:
                accept = float(uniform_probs[flat + j]) <= min(1.0, float(p[x]) / float(q[x]))  ### BLANK
            if accept:
                out[i, j] = x
                # TODO 2. How many drafts of this request are accepted now?
                n = j + 1  ### BLANK
                continue
            # TODO 3. Rejected: emit the recovered token. A random row draws it from which distribution?
            if is_greedy[i]:
                out[i, j] = int(p.argmax())
            else:
                residual = (p - q).clamp(min=0)  ### BLANK
                out[i, j] = int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
            # TODO 4. And the drafts after a rejected one?
            break  ### BLANK
        # TODO 5. Every draft accepted: what does the last row give for free?
        if n == k:
            out[i, k] = int(bonus_token_ids[i])  ### BLANK
        num_accepted.append(n)
        row += k + 1
        flat += k
    return out, num_accepted


# %%
# 逐项报告（不会中断 Run All）：每个自动评分部分一行，✗ 后面是第一处不符合的地方。
report("lesson09", globals())

# %% [markdown]
# 第一项检查：构造的用例，结果完全确定：贪心批的草稿数是 k = 3, 0, 2, 1；随机批的每个决定由均匀数 u 唯一确定。隐藏测试再对 1500 个请求做卡方检验。

# %% nbgrader={"grade": true, "grade_id": "l09_main_path", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
drafts, target, bonus, want, want_n = L09.greedy_case()
out, n = rejection_sample(drafts, target, None, torch.tensor(bonus), [True] * 4, torch.full((6,), 0.5))
print(out.tolist(), n)
assert out.tolist() == [[1, 2, 7, -1], [12, -1, -1, -1], [4, 5, 13, -1], [9, -1, -1, -1]]
assert n == [2, 0, 2, 0]
drafts, p, q, bonus, u, want, want_n, _ = L09.random_case()
out, n = rejection_sample(drafts, p, q, torch.tensor(bonus), [False, False], torch.tensor(u, dtype=torch.float64))
assert out.tolist() == [[0, 2, -1], [1, 2, 3]] and n == [1, 2]
### BEGIN HIDDEN TESTS
L09.check_main_path(rejection_sample)
### END HIDDEN TESTS

# %%
L09.plot_distribution(rejection_sample);

# %% [markdown]
# 图 9-3：你的函数输出的第一个 token 的频率（蓝：有草稿分布 q；橙：n-gram）与目标分布 p（黑）、草稿分布 q（灰）。草稿按 q 抽出，输出却按 p 分布：q > p 的质量被拒掉，不足的质量由 $(p-q)^+$ 补上。

# %% [markdown]
# 第二项检查：`L09.check_real_engine` 临时替换 runner 的 `RejectionSampler`，用你的 `rejection_sample` 把每个请求的前 `num_accepted + 1` 个 token 交给引擎。你的 `num_accepted` 直接决定调度器回滚多少 KV 位置。
#
# 检查两件事：贪心输出与不投机的运行逐 token 相同；引擎的 `SpecDecodingStats` 与用引擎自己的 `RejectionSampler` 时完全相同。

# %% nbgrader={"grade": true, "grade_id": "l09_real_engine", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
L09.check_real_engine(rejection_sample)
print("真实引擎检查通过：贪心输出与不投机相同，接受统计与引擎自带的拒绝采样器相同。")

# %% [markdown]
# ## 检查方法
#
# 运行断言；再用你的函数对三种草稿分布 q 测第一个草稿的接受率：q = p、图 9-3 的 q、只在 p 的尾部有质量的 q。与理论值 $\sum_x \min(p(x), q(x))$ 比较，并解释为什么 q = p 时每个草稿都被接受、而输出分布仍然是 p。

# %%
for name, measured, theory in L09.acceptance_vs_overlap(rejection_sample):
    print(f"{name:<26} 实测接受率 {measured:.3f}   理论 sum min(p, q) = {theory:.3f}")

# %% [markdown]
# 你的解释：

# %% nbgrader={"grade": true, "grade_id": "l09_boundary", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
out, n = rejection_sample([[], []], L09.one_hot_rows([[], []], 5, [3, 1]), None, torch.tensor([3, 1]), [True, False],
                          torch.zeros(0, dtype=torch.float64))
assert out.tolist() == [[3], [1]] and n == [0, 0]            # 没有草稿：只有奖励 token
out, n = rejection_sample([[2, 2, 2]], L09.one_hot_rows([[2, 2, 2]], 5, [4]), None, torch.tensor([4]), [True],
                          torch.full((3,), 0.5))
assert out.tolist() == [[2, 2, 2, 4]] and n == [3]           # 全部接受：奖励 token 紧跟最后一个草稿
out, n = rejection_sample([[5, 1, 2]], L09.one_hot_rows([[4, 1, 2]], 6, [0]), None, torch.tensor([0]), [True],
                          torch.full((3,), 0.5))
assert out.tolist() == [[4, -1, -1, -1]] and n == [0]        # 第一个就被拒：之后什么都没有
### BEGIN HIDDEN TESTS
L09.check_boundary(rejection_sample)
### END HIDDEN TESTS

# %% [markdown]
# ## 映射回源码对象
#
# “能映射回源码对象”（1 分）在这里自动评分：在 vLLM 8e958902eee5 中找到实现每个概念的名字（函数、常量或变量名，字符串，大小写不限）。
#
# - `per_request_to_per_token`：把按请求的张量（例如 temperature）按各自的草稿数展开成按 token 的张量的函数（`vllm/v1/sample/rejection_sampler.py`）；
# - `cumulative_drafts`：`SpecDecodeMetadata` 里各请求草稿数的前缀和字段，kernel 用它找到第 i 个请求的草稿；
# - `no_q_flag`：接受检验 kernel 的编译期常量：没有草稿概率时把 q(x) 当作 1；
# - `parse`：`RejectionSampler` 把 [batch, max_spec_len + 1] 的输出去掉占位、变成每个请求一个列表的静态方法；
# - `parallel_ngram`：`NgramProposer` 用 numba 并行地为一批请求找 n-gram 的函数；
# - `fixed_acceptance`：`SpeculativeConfig`（`vllm/config/speculative.py`）里按配置的逐位置接受率、而不是按 p/q 决定接受的字段。

# %% nbgrader={"grade": false, "grade_id": "l09_source_map_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
SOURCE_MAP = {
    "per_request_to_per_token": "expand_batch_to_tokens",  ### BLANK
    "cumulative_drafts": "cu_num_draft_tokens",  ### BLANK
    "no_q_flag": "NO_DRAFT_PROBS",  ### BLANK
    "parse": "RejectionSampler.parse_output",  ### BLANK
    "parallel_ngram": "batch_propose_numba",  ### BLANK
    "fixed_acceptance": "synthetic_acceptance_rates",  ### BLANK
}

# %% nbgrader={"grade": true, "grade_id": "l09_source_map", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
L09.check_source_map(SOURCE_MAP)

# %% [markdown] nbgrader={"grade": false, "grade_id": "l09_q1", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q1（2 分）
#
# 为什么“以 $\min(1, p/q)$ 接受草稿、拒绝时从归一化的 $(p-q)^+$ 重采”之后，输出 token 的分布恰好是目标分布 p，与草稿分布 q 无关？如果拒绝后直接从 p 重采，会错成什么样？请结合本课的函数和图 9-3 说明。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 写出（或说清）某个 token y 的输出概率的两部分：被草稿抽中并被接受 $q(y)\min(1, p(y)/q(y)) = \min(p(y), q(y))$，加上被拒后恢复成 y 的 $(1-\beta)\cdot (p(y)-q(y))^+/(1-\beta)$，其中拒绝概率 $1-\beta = 1 - \sum_x \min(p,q) = \sum_x (p-q)^+$，两部分相加 $\min(p,q) + (p-q)^+ = p(y)$；并说出从 p 重采的后果（y 的概率变成 $\min(p,q) + (1-\beta)p(y)$，q 偏大的 token 被多采，分布偏向草稿；卡方检验拒绝）；1 分 = 只有“接受 + 恢复 = p”的结论没有推导、或不能说出从 p 重采错在哪；0 分 = 认为只有贪心或 q = p 时分布才不变，或认为拒绝采样这个**算法**只是“近似”保持分布（一票否决：混淆算法正确性与性能）。题目只问单个位置，多个位置不作要求；说出论证逐位置成立、第一次拒绝后必须停止，是正确的补充，不另加分。不扣分的补充：指出实现只在浮点数值精度内无损（vLLM 文档原话：lossless up to the precision limits of hardware numerics；k+1 个位置一起前向时 kernel 与归约顺序不同，GPU 上偶有 argmax 翻转）是正确的，与“算法保持分布”并不矛盾；说 vLLM 在 q(x) = 0 时直接拒绝（`draft_prob > 0`）也对。
#
# **参考答案**
#
# 1. 单个位置：草稿 x ~ q，以 $\min(1, p(x)/q(x))$ 接受。某个 token y 作为输出有两条路：
#    - 被抽中且被接受：$q(y)\cdot\min(1, p(y)/q(y)) = \min(p(y), q(y))$；
#    - 草稿（任意 x）被拒，再从恢复分布抽中 y。拒绝的总概率是 $1-\beta$，$\beta = \sum_x \min(p(x), q(x))$；而 $\sum_x (p-q)^+ = \sum_x (p - \min(p,q)) = 1-\beta$，所以归一化的恢复分布是 $(p(y)-q(y))^+/(1-\beta)$，这条路的概率是 $(p(y)-q(y))^+$。
#    - 相加：$\min(p,q) + (p-q)^+ = p(y)$。与 q 无关，q 只影响接受率 β。n-gram 时 q 是 one-hot，公式退化为“以 p(x) 接受，拒绝后从去掉 x 的 p 重采”。
# 2. 多个位置：第 j 行 logits 是以前 j-1 个草稿都在序列里为条件的目标分布。只要前面都被接受，这个条件就是真实前缀，上面的论证逐位置成立；一旦某个位置被拒、换成了恢复 token，后面各行的条件就是错的，所以必须在第一次拒绝处停止（本课的 `break`）。全部接受时，奖励行正是以全部草稿为前缀的 p，直接采样即可。
# 3. 从 p 重采：y 的概率变成 $\min(p,q) + (1-\beta)\,p(y)$。对 q > p 的 token（草稿偏爱的），它已经通过接受路径拿到了 p(y)，又从重采拿到额外的 $(1-\beta)p(y)$，被过采；p > q 的 token 被欠采。图 9-3 的卡方检验会拒绝它（本课的 `recover_from_p` 变异体）。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l09_q2", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q2（2 分）
#
# 投机解码在什么情况下会让一个 batch 变慢？请从一步的成本（前向的 token 数、token budget、KV 槽位）和收益（每步产出的 token）两边说明，并指出什么工作负载、什么 batch 大小最容易出现这种情况。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 成本链完整：每个带草稿的请求本步前向 1+k 个位置（`num_new_tokens` 包含草稿，占 token budget，分配 KV 槽位），还有提议本身（n-gram 在 CPU 上查找）和拒绝采样的开销；收益是期望产出 $1+\sum_j\prod_{i\le j}\alpha_i$ 个 token；小 batch decode 受带宽限制，多算 k 个位置几乎免费，所以只要有接受就赚；大 batch 或长 prompt 混批时前向已计算受限（或 token budget 用满），多出的 k 个位置是真实的 FLOP 与 budget，接受率低时每步时间上升而产出不增，甚至挤占其他请求的 prefill（budget 被草稿吃掉，TTFT 变差）；并给出工作负载：全新内容、随机采样温度高、n-gram 找不到重复时接受率接近 0；1 分 = 只说“接受率低就慢”而没有成本链，或没有区分带宽受限与计算受限；0 分 = 认为投机解码总是更快，或把接受率低说成输出会出错（一票否决：混淆算法正确性与性能）。
#
# **参考答案**
#
# 1. 成本：请求有 k 个草稿时，调度器本步为它调度 1+k 个 token（`scheduled_spec_decode_tokens` 计入 `num_scheduled_tokens`，占 `max_num_batched_tokens` 的 budget），KVCacheManager 为它分配 1+k 个槽位，runner 前向 1+k 个位置并多取 k 行 logits；此外每步要跑一次提议（n-gram 查找在 CPU 上、与前向串行）和拒绝采样。
# 2. 收益：每步产出 `num_accepted + 1` 个 token，期望 $1+\sum_{j}\prod_{i\le j}\alpha_i$（图 9-1 中间，k=5 时也只有约 2.1）。被拒草稿的计算是白做的，它们的 KV 位置被回滚（`num_rejected`）。
# 3. 何时变慢：
#    - 小 batch 的 decode 受带宽限制（读一遍权重和 KV），多算几个位置几乎不增加时间——此时只要偶有接受就赚；
#    - batch 大到前向已经计算受限时，1+k 倍的 token 数就是接近 1+k 倍的 FLOP；接受率低（新内容、高温度、n-gram 无匹配）时每步时间上升而产出几乎不变，吞吐下降；
#    - token budget 有限时，草稿挤占同一步里其他请求的 prefill 块，等待请求的 TTFT 变差；草稿占用的 KV 槽位也让并发请求数更早碰到上限（更早抢占）；
#    - 提议和拒绝采样在 CPU 上的开销在步时间很短时（小模型、GPU 很快）占比可观。
# 4. 所以 vLLM 把接受率、平均接受长度暴露在指标里（`SpecDecodingLogging`、Prometheus），是否开启投机、k 取多少要在目标工作负载上 benchmark 确认（`benchmarks/spec_decode.py` 同时报告重复与不重复两种负载的比值）。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l09_q3", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q3（2 分）
#
# 接受率和 k 如何取舍？用图 9-1、9-2 的实测数字说明：k 增大时接受率、平均接受长度、每步 token 数分别怎么变，为什么；再说明你会如何为一个线上服务选 k。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 引用实测数字（本机图 9-1：k=1 接受率约 0.46、平均长度约 1.46；k=5 接受率约 0.22、平均长度约 2.1；每步 token 从 3.0 升到约 3.9；以学生自己运行的数字为准）并给出因果：接受率 = 接受数 / 草稿数，第 j 个草稿只在前 j-1 个都被接受时才可能被接受，所以 k 增大时新增的尾部草稿接受率低，拉低平均接受率（逐位置接受率：按 vLLM 的分母 `num_drafts`，它必然单调不增；按 `num_draft_tokens_per_pos` 的分母不一定单调——学生用哪一种、说明是哪个系统的定义，都给分）；平均接受长度单调增但边际收益递减（上限 k+1），而成本（前向位置、budget、KV 槽位）按 k 线性增长；选 k 要在目标负载上测吞吐/延迟，在边际收益小于边际成本处停止，并随 batch 大小调整；1 分 = 趋势正确但没有数字或没有说明逐位置递减的原因；0 分 = 认为 k 越大越好、不计成本；把本机这一个小模型、这批 prompt 的数字说成任何负载都如此（一票否决：把单一负载的实测写成普遍结论）。指出 n-gram 草稿越靠后越可能偏离（匹配只保证前缀一致）是正确的补充，不扣分。
#
# **参考答案**
#
# 1. 实测（图 9-1，3 个 prompt × 40 token，贪心，n-gram 1..3）：k=1 时接受率约 0.46、平均每次验证 1.46 个 token；k=2 约 0.33 / 1.66；k=3 约 0.29 / 1.87；k=5 约 0.22 / 2.09。每步 token 从不投机的 3.0 升到 3.5～3.9，引擎步数从 40 降到 31～34。
# 2. 为什么接受率随 k 下降：接受率的分母是所有提出的草稿。第 j 个草稿要被接受，前 j-1 个必须都被接受（第一次拒绝就停），所以它的无条件接受率（vLLM 的逐位置接受率：第 j 位接受次数 / `num_drafts`）是 $\prod_{i\le j}\alpha_i$，随 j 单调不增（图 9-2 左，k=5：约 0.35、0.26、0.24、0.15、0.09）。增大 k 只是在尾部加上越来越难被接受的草稿，平均接受率自然下降；n-gram 草稿越往后也越可能偏离（匹配只保证前缀一致）。
# 3. 为什么平均接受长度仍上升但收益递减：期望产出 $1+\sum_{j\le k}\prod_{i\le j}\alpha_i$，每多一个位置加上一个越来越小的项；上限是 k+1（图中虚线），实测远低于它。
# 4. 成本随 k 线性：每个请求每步 1+k 个前向位置、budget 和 KV 槽位；受带宽限制时成本几乎不变，k 可以稍大；计算受限（大 batch）时应减小 k 甚至关闭。
# 5. 选 k：在目标工作负载（重复程度、温度、batch 大小）上测吞吐与延迟（benchmark，而不是接受率本身），观察逐位置接受率，在边际位置的接受概率乘以一个 token 的价值低于多算一个位置的成本处截断；线上负载变化时监控 `acceptance_rate` 与 `mean_acceptance_length`。本机数字只对这个小模型和这批 prompt 成立，不能外推。
#
# **附：检查方法的参考解释**（不单独计分）：第一个草稿的接受概率是 $\sum_x q(x)\min(1,p(x)/q(x)) = \sum_x\min(p(x),q(x))$。q = p 时它等于 1：每个草稿都被接受，而草稿本身就是按 p 抽的，所以输出仍按 p 分布；q 集中在 p 的尾部时重叠很小（这里 0.10），几乎总是被拒、从 $(p-q)^+$ 恢复，输出依然按 p 分布——q 只影响速度（接受率），不影响分布。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown]
# ## 评分规则
#
# - 代码 4 分：主路径 2 分（构造用例与分布检验 1 分、接入真实引擎 1 分）、边界条件 1 分、能映射回源码对象 1 分；
# - Q1～Q3 各 2 分：必须包含对象、状态变化、正确性或成本链；
# - 一票否决：把论文峰值写成普遍生产结论；把源码支持写成所有模型/硬件可用；混淆算法正确性与性能；只背类名而说不清状态所有权。
#
# 总分 10 分，至少 8 分通过。先独立完成；核对后换一个 batch、工作负载或 k 重新推演。
#
# ### 自检
#
# 下面的单元格用与 nbgrader 相同的检查函数给代码部分打分，Q1～Q3 显示为待人工评分。

# %%
self_check("lesson09", globals());

# %% [markdown]
# ## 附录（选读）
#
# 选读：在真实 vLLM 上运行你的函数、与 vLLM 0.27.1 的全部差异和参考资料，不计入核心路径。

# %% [markdown]
# ### 在真实 vLLM 0.27.1 上看同一件事
#
# CPU 上 vLLM 没有 Triton。V1 的 `CPUModelRunner` 构造时用 `_postprocess_triton` 把 `rejection_sampler.py` 的 kernel 换成 `vllm/utils/cpu_triton_utils.py` 的 C++ 实现。下面照做后调用 vLLM 的 `rejection_sample`。
#
# 第一张表是边界条件评分用的录制批，两边必须逐 token 相同。`greedy_with_q` 的贪心行带着 q：vLLM 的贪心 kernel 不读 q，恢复 token 就是 argmax p。
#
# 第二张表由 vLLM 自抽 400 个请求的均匀数和恢复 token，你的函数用同一串均匀数，接受个数相同；恢复 token 抽法不同（vLLM 用指数噪声），只在统计上一致。

# %%
L09.vllm_side_by_side(rejection_sample);

# %% [markdown]
# ### 与 vLLM 0.27.1 的差异
#
# - **n 的取法**：n-gram 提议的 n 取 `[prompt_lookup_min, prompt_lookup_max]` 里能匹配的最长值，同样长时取最早的一处。
# - **输入布局**：vLLM 的 `RejectionSampler.forward` 按 `target_logits_indices` 只把草稿行交给 `rejection_sample`，奖励行按 `bonus_logits_indices` 取出、由普通 `Sampler` 采样。练习把奖励行插在各请求的草稿行之后。
# - **接受条件**：vLLM 写 `draft_prob > 0 and target_prob / draft_prob >= uniform_prob`；练习没有 q(x) > 0 的保护，草稿从 q 抽出时两者相同。id 为负的草稿（如被 grammar 截掉的位置）vLLM 直接判拒。
# - **p 的处理**：验证前 vLLM 先施加 penalties、bad words（`apply_logits_processors`），再施加温度与 top-k / top-p（`apply_sampling_constraints`）。minivllm 验证时不施加 penalties，但施加 min-p。
# - **数值精度**：vLLM 文档说投机只在硬件数值精度内无损；GPU 上 k+1 个位置一起前向可能换 kernel 与归约顺序，近乎并列的 argmax 偶尔翻转。
# - **实现**：vLLM 的 kernel 每个请求一个 program，恢复 token 在 kernel 之前采好；minivllm 用批量 torch 运算。
# - **异步调度**：CPU n-gram（`method="ngram"`）关掉默认的异步调度，走本课的同步路径；GPU 版 `ngram_gpu` 保留它。EAGLE、MTP 开异步调度时，`AsyncScheduler` 先排 -1 占位草稿，worker 把草稿直接写进下一步输入（V1：`_prepare_input_ids`）。
# - **runner**：不开投机、或开 EAGLE / MTP 时，课程的 dense 模型走 Model Runner V2（`v1/worker/gpu/`）。
# - **统计**：vLLM 的 `SpecDecodingStats` 每步新建、由前端的 `SpecDecodingLogging` 累加；minivllm 在调度器里累计。`SpecDecodeMetadata` 在 vLLM 位于 `v1/spec_decode/metadata.py`，minivllm 放在 `sample/rejection_sampler.py`。

# %% [markdown]
# ### 参考资料
#
# - [vLLM n-gram proposer](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/spec_decode/ngram_proposer.py)
# - [vLLM rejection sampler](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/sample/rejection_sampler.py)
# - [vLLM scheduler](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/core/sched/scheduler.py)
# - [vLLM spec decode metrics](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/spec_decode/metrics.py)
# - [Leviathan et al., Fast Inference from Transformers via Speculative Decoding (ICML 2023)](https://arxiv.org/abs/2211.17192)
# - [Chen et al., Accelerating LLM Decoding with Speculative Sampling (2023)](https://arxiv.org/abs/2302.01318)
# - [Prompt Lookup Decoding (Saxena, 2023)](https://github.com/apoorvumang/prompt-lookup-decoding)
# - [vLLM speculative decoding (current docs)](https://docs.vllm.ai/en/latest/features/spec_decode.html)
#
# current docs、支持的投机方法和默认参数会变化，部署前要按目标版本重新核对。
#
# ← 上一课：第 8 课：结构化输出：grammar bitmask 与 CPU/GPU 重叠　｜　下一课 →：第 10 课：分布式执行：张量并行、Executor 与 all-reduce
