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
# 源码固定在 vLLM {{VLLM_VERSION}}（commit {{VLLM_COMMIT}}）。沿着一个草稿 token 的一生读下面四段。
#
# | 顺序 | vLLM 文件与入口 | minivllm 对应 | 带着什么问题读 |
# |---|---|---|---|
# | 1 | `vllm/v1/spec_decode/ngram_proposer.py`：`_find_longest_matched_ngram_and_propose_tokens`（L215–218、L283–293） | `minivllm/spec_decode/ngram_proposer.py` | 草稿从哪里来？为什么不需要 q？ |
# | 2 | `vllm/v1/worker/gpu_model_runner.py`：`GPUModelRunner._calc_spec_decode_metadata`（L2856–2868） | `minivllm/worker/gpu_model_runner.py` | k 个草稿为什么要 k+1 行 logits？ |
# | 3 | `vllm/v1/sample/rejection_sampler.py`：`rejection_random_sample_kernel`（L804–845） | `minivllm/sample/rejection_sampler.py` | 接受条件是什么？拒绝后取哪个 token？ |
# | 4 | `vllm/v1/core/sched/scheduler.py`：`Scheduler.update_from_output`（L1766–1784） | `minivllm/core/sched/scheduler.py` | 被拒时 `num_computed_tokens` 退回多少？ |
#
# **runner**：n-gram 投机在 {{VLLM_VERSION}} 走 V1 的 `gpu_model_runner.py`，因为 `_get_v2_model_runner_unsupported_features` 把 n-gram 列为 Model Runner V2 不支持的特性。minivllm 的 runner 对应 V1。

# %%
# 上表各行在 vLLM {{VLLM_VERSION}} 源码里的样子：文件路径、行号与逐行原文（行号与上表一致；源码由第一个单元格获取并校验）。
from autograder.vllm_source import show_vllm

show_vllm("vllm/v1/spec_decode/ngram_proposer.py", "_find_longest_matched_ngram_and_propose_tokens", lines=(215, 218))
show_vllm("vllm/v1/spec_decode/ngram_proposer.py", "_find_longest_matched_ngram_and_propose_tokens", lines=(283, 293))
show_vllm("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner._calc_spec_decode_metadata", lines=(2856, 2868))
show_vllm("vllm/v1/sample/rejection_sampler.py", "rejection_random_sample_kernel", lines=(804, 845))
show_vllm("vllm/v1/core/sched/scheduler.py", "Scheduler.update_from_output", lines=(1766, 1784))

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
# Decode 每步只给每个请求产出 1 个 token，却要把全部权重（整批共用一次）和各请求的整段 KV 读一遍（decode 受带宽限制）。一次前向若能验证多个 token，读一遍权重就能产出多个 token。
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
# 3. **验证**：runner 把 1+k 个 token 放进同一次前向，像 1+k 长的 prefill 块那样做因果注意力（部分后端仍按 decode 处理：`supports_spec_as_decode`），取 k+1 行 logits。第 j 行（j 从 1 起）是看过前 j−1 个草稿的目标分布 $p_j$，验证 $x_j$；最后一行是奖励（bonus）行。
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
# - decode 受带宽限制时，多算几个位置几乎不增加前向时间；batch 大到计算受限时，多算的位置就是真实成本（Q2）。
# - `method="ngram"` 关掉默认的异步调度，在 CPU 上同步提议草稿：小 batch 每步也多一份固定开销。
# - k 越大上限 k+1 越高，但越靠后的草稿越难被接受，而每个草稿都占 token budget 和算力（Q3）。

# %%
sweep = L09.k_sweep()
L09.print_sweep(sweep)
L09.plot_sweep(sweep);

# %% [markdown]
# 图 9-1：3 个 prompt、每个 40 个 token，贪心；不投机时 40 步、每步 3 个 token。左：接受率（接受的草稿 / 提出的草稿）随 k 增大而下降。中：每次验证平均产出的 token 数（`mean_acceptance_length`）随 k 上升，但远低于上限 k+1。右：每个引擎步产出的 token 数。
#
# `== plain` 一列：每个 k 的贪心输出都与不投机时相同。这个小模型只在陷入循环时草稿才会命中：n-gram 投机的收益取决于负载里有多少重复。

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
# 图 9-1 中 k = 3 的运行：引擎自带的 `RejectionSampler`，3 个 prompt 同批贪心生成 40 个 token。每一行是某一步里一个请求的草稿和这一步实际产出的 token。`step` 是第几次验证（从 0 起），不是引擎步号。

# %%
L09.print_trace(L09.verification_trace())

# %% [markdown]
# 读表：
#
# - `no draft`：n-gram 没找到匹配，这一步与不投机时一样只产出 1 个 token；
# - `recovered`：在某个位置被拒，产出已接受的草稿加 1 个恢复 token，被拒草稿的 KV 位置由调度器回滚；
# - `bonus`：3 个草稿全部接受，一次前向产出 4 个 token。
#
# 同一步里三个请求的草稿数可以不同，这正是练习里的批。
#
# k = 3 时引擎步从 40 减到 32，但每步多了 n-gram 查找、拒绝采样和多算的位置：省下的步数只是上限，省没省时间要在目标硬件上测（Q2）。

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
# 第一项检查：构造的用例，结果确定：贪心批的草稿数是 k = 3, 0, 2, 1；随机批的每个决定由均匀数 u 唯一确定。隐藏测试再对 1500 个请求做卡方检验。

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
# “能映射回源码对象”（1 分）在这里自动评分：写出 vLLM {{VLLM_COMMIT}} 中实现每个概念的名字（函数、常量或变量名，字符串，大小写不限）。括号里是去哪里找。
#
# - `cumulative_drafts`：`SpecDecodeMetadata` 里各请求草稿数的前缀和字段（第 2 段摘录的注释）；
# - `no_q_flag`：没有草稿概率时把 q(x) 当作 1 的编译期常量（第 3 段摘录）；
# - `per_request_to_per_token`：把按请求的张量（如 temperature）按草稿数展开成按 token 的函数（`rejection_sampler.py` 的 `apply_sampling_constraints` 调用它）；
# - `parse`：把 [batch, max_spec_len + 1] 的输出去掉占位、变成每个请求一个列表的静态方法（`RejectionSampler` 类里）；
# - `parallel_ngram`：用 numba 并行地为一批请求找 n-gram 的函数（`ngram_proposer.py` 的 `NgramProposer.batch_propose` 调用它）。

# %% nbgrader={"grade": false, "grade_id": "l09_source_map_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
SOURCE_MAP = {
    "cumulative_drafts": "cu_num_draft_tokens",  ### BLANK
    "no_q_flag": "NO_DRAFT_PROBS",  ### BLANK
    "per_request_to_per_token": "expand_batch_to_tokens",  ### BLANK
    "parse": "RejectionSampler.parse_output",  ### BLANK
    "parallel_ngram": "batch_propose_numba",  ### BLANK
}

# %% nbgrader={"grade": true, "grade_id": "l09_source_map", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
L09.check_source_map(SOURCE_MAP)

# %% [markdown] nbgrader={"grade": false, "grade_id": "l09_q1", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q1（2 分）
#
# 随机采样的一行，n-gram 草稿 x（q 是 one-hot），目标分布 p(x) = 0.3。按本课的规则，输出 token 是 x 的概率、是另一个 token y 的概率各是多少？若被拒后改从 p 重采，输出 x 的概率变成多少，错在哪里？（3～5 句）
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 三处都对：输出 x 的概率是 0.3（x 只能经接受得到，接受概率 $\min(1, p(x)/1) = 0.3$；恢复分布 $(p-q)^+$ 里 x 的质量为 0）；输出 y 的概率是 $0.7 \cdot p(y)/0.7 = p(y)$（拒绝概率 0.7 乘以去掉 x 后归一化的 p），所以输出分布就是 p；从 p 重采时输出 x 的概率是 $0.3 + 0.7 \times 0.3 = 0.51$，草稿 token 被过采、输出偏向草稿。1 分 = 只答对“输出分布是 p”的两问，或只答对从 p 重采的后果；或思路都对但算错一个数。0 分 = 两部分都没有；或认为拒绝采样这个**算法**只是近似保持分布（一票否决：混淆算法正确性与性能）。不扣分、不另加分的补充：一般 q 时两条路径相加 $\min(p,q) + (p-q)^+ = p$；实现只在硬件数值精度内无损。
#
# **参考答案**：x 只能经接受输出，概率是 $\min(1, p(x)/q(x)) = 0.3$；恢复分布是 $(p-q)^+$ 归一化，x 处为 0，所以被拒时不会再出 x。y ≠ x 只能经拒绝输出：0.7 × p(y)/0.7 = p(y)。两者合起来输出分布正是 p。若从 p 重采，输出 x 的概率是 0.3 + 0.7 × 0.3 = 0.51：x 在接受路径上已经拿到了 p(x)，重采又给它一份，被过采，其余 token 被欠采。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l09_q2", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q2（2 分）
#
# 假设每步每个请求都有 k 个草稿，但几乎全被拒。为什么这时投机在小 batch 上（只看前向）几乎不亏，在大 batch 上却让吞吐下降？从这个请求在这一步多占了什么说起。（3～5 句）
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 两件事都说到：（1）成本：这个请求本步调度 1+k 个 token（`num_new_tokens = 1 + k`），占 token budget 和 KV 槽位，前向算 1+k 个位置，而草稿全被拒时仍只产出 1 个 token；（2）小 batch 的 decode 受带宽限制（每步要读一遍权重和 KV），多算 k 个位置几乎不增加步时间，所以几乎不亏；大 batch 前向已计算受限（或 token budget 用满），1+k 个位置就是真实的算力与 budget，步时间上升而产出不变，吞吐下降。1 分 = 只说到其中一件：成本写具体了但没有区分带宽受限与计算受限，或只说“大 batch 计算受限所以慢”而没有说多算的是什么。0 分 = 只说“接受率低就慢”；或认为投机总是更快；或把草稿被拒说成输出会出错（一票否决：混淆算法正确性与性能）。不扣分、不另加分的补充：n-gram 查找与拒绝采样的 CPU 开销；`method="ngram"` 关掉异步调度，小 batch 上每步也有固定开销；草稿挤占同一步里其他请求的 prefill，TTFT 变差。
#
# **参考答案**：带 k 个草稿的请求本步被调度 1+k 个 token，占 1+k 份 token budget 和 KV 槽位，runner 前向 1+k 个位置、取 k+1 行 logits；草稿全被拒时只产出 1 个恢复 token，被拒位置由调度器回滚。小 batch 的 decode 受带宽限制，步时间主要花在读权重和 KV 上，多算几个位置几乎不花时间，所以步时间和产出都几乎不变。大 batch 时前向已经计算受限，1+k 倍的位置接近 1+k 倍的计算，budget 也被草稿吃掉；步时间变长而每步产出不变，吞吐下降。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l09_q3", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q3（2 分）
#
# 用你运行出的图 9-1 的数字：k 从 1 增到 5 时，接受率下降，平均接受长度却上升。为什么两者同时成立？（3～5 句）
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 引用自己运行的数字（本机：k=1 接受率约 0.46、平均接受长度约 1.46；k=5 约 0.22、约 2.1），并给出两条原因：（1）接受率的分母是所有提出的草稿，第 j 个草稿只有前 j-1 个都被接受时才可能被接受（第一次拒绝就停），所以新增的靠后草稿很少被接受，拉低平均；（2）平均接受长度是 1 加上每个位置“前 j 个都被接受”的概率之和 $1+\sum_{j\le k}\prod_{i\le j}\alpha_i$，在各位置条件接受率不变的理想模型里，多一个位置只多加一个非负项；实测中前面的项也会变（图 9-2 左：位置 1 从 k=1 的约 0.46 降到 k=5 的约 0.35），平均接受长度仍上升，是因为新增的项大于前面项的损失。两种说法都算对；加的项越来越小、远低于上限 k+1。1 分 = 只讲清其中一条原因；或两条都对但没有引用数字。0 分 = 两条原因都没有；或据此说 k 越大越好、不计成本；或把这个小模型、这批 prompt 的数字说成任何负载都如此（一票否决：把单一负载的实测写成普遍结论）。不扣分、不另加分的补充：n-gram 草稿越靠后越可能偏离；成本按 k 线性增长，选 k 要在目标负载上 benchmark。
#
# **参考答案**：本机 k=1 时接受率约 0.46、平均接受长度约 1.46；k=5 时约 0.22、约 2.1。接受率 = 接受的草稿 / 提出的草稿；第 j 个草稿要被接受，前面的必须都被接受，所以它被接受的概率 $\prod_{i\le j}\alpha_i$ 随 j 下降（图 9-2 左），k 增大只是在尾部加上越来越难被接受的草稿，平均接受率下降。平均接受长度是这些概率之和加 1。若各位置的条件接受率不随 k 变，多一个位置只多加一个非负项；实测中前面的项也会变（位置 1 从约 0.46 降到约 0.35），但新增各项之和大于这点损失，所以仍上升，边际收益递减、远低于上限 k+1。
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
# - Q1～Q3 各 2 分：答到题目所问的全部要点得 2 分，只答对一部分得 1 分；
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
# 选读：在真实 vLLM 上运行你的函数、与 vLLM {{VLLM_VERSION}} 的全部差异和参考资料，不计入核心路径。

# %% [markdown]
# ### 在真实 vLLM {{VLLM_VERSION}} 上看同一件事
#
# CPU 上通常没有 Triton。`HAS_TRITON` 为假时，V1 的 `CPUModelRunner` 构造时用 `_postprocess_triton` 把 `rejection_sampler.py` 的 kernel 换成 `vllm/utils/cpu_triton_utils.py` 的 C++ 实现。下面照做后调用 vLLM 的 `rejection_sample`。
#
# 第一张表是边界条件评分用的录制批，两边必须逐 token 相同。`greedy_with_q` 的贪心行带着 q：vLLM 的贪心 kernel 不读 q，恢复 token 就是 argmax p。
#
# 第二张表由 vLLM 自抽 400 个请求的均匀数和恢复 token，你的函数用同一串均匀数，接受个数相同；恢复 token 抽法不同（vLLM 用指数噪声），只在统计上一致。

# %%
L09.vllm_side_by_side(rejection_sample);

# %% [markdown]
# ### 与 vLLM {{VLLM_VERSION}} 的差异
#
# - **n 的取法**：n-gram 提议的 n 取 `[prompt_lookup_min, prompt_lookup_max]` 里能匹配的最长值，同样长时取最早的一处。
# - **输入布局**：vLLM 的 `RejectionSampler.forward` 按 `target_logits_indices` 只把草稿行交给 `rejection_sample`，奖励行按 `bonus_logits_indices` 取出、由普通 `Sampler` 采样。练习把奖励行插在各请求的草稿行之后。
# - **接受条件**：vLLM 写 `draft_prob > 0 and target_prob / draft_prob >= uniform_prob`；练习没有 q(x) > 0 的保护，草稿从 q 抽出时两者相同。id 为负的草稿（如被 grammar 截掉的位置）vLLM 直接判拒。
# - **p 的处理**：验证前 vLLM 先施加 penalties、bad words（`apply_logits_processors`），再施加温度与 top-k / top-p（`apply_sampling_constraints`）；minivllm 同样施加（`_spec_logits`）：第 j 行（j 从 1 起）看到输出加前 j−1 个草稿，奖励行看到全部 k 个。
# - **min-p 与 logit_bias**：vLLM 不对草稿行施加这两者，开投机时带它们的请求直接被拒（`SamplingParams._validate_spec_decode`）；minivllm 同样拒绝。
# - **数值精度**：vLLM 文档说投机只在硬件数值精度内无损；GPU 上 k+1 个位置一起前向可能换 kernel 与归约顺序，近乎并列的 argmax 偶尔翻转。
# - **实现**：vLLM 的 kernel 每个请求一个 program，恢复 token 在 kernel 之前采好；minivllm 用批量 torch 运算。
# - **异步调度**：GPU 版 `ngram_gpu` 保留默认的异步调度。EAGLE、MTP 开异步调度时，`AsyncScheduler` 先排 -1 占位草稿，worker 把草稿直接写进下一步输入（V1：`_prepare_input_ids`）。
# - **runner**：不开投机、或开 EAGLE / MTP 时，课程的 dense 模型走 Model Runner V2（`v1/worker/gpu/`）。
# - **统计**：vLLM 的 `SpecDecodingStats` 每步新建、由前端的 `SpecDecodingLogging` 累加；minivllm 在调度器里累计。`SpecDecodeMetadata` 在 vLLM 位于 `v1/spec_decode/metadata.py`，minivllm 放在 `sample/rejection_sampler.py`。

# %% [markdown]
# ### 参考资料
#
# - [vLLM n-gram proposer](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/spec_decode/ngram_proposer.py)
# - [vLLM rejection sampler](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/sample/rejection_sampler.py)
# - [vLLM scheduler](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/core/sched/scheduler.py)
# - [vLLM spec decode metrics](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/spec_decode/metrics.py)
# - [Leviathan et al., Fast Inference from Transformers via Speculative Decoding (ICML 2023)](https://arxiv.org/abs/2211.17192)
# - [Chen et al., Accelerating LLM Decoding with Speculative Sampling (2023)](https://arxiv.org/abs/2302.01318)
# - [Prompt Lookup Decoding (Saxena, 2023)](https://github.com/apoorvumang/prompt-lookup-decoding)
# - [vLLM speculative decoding (current docs)](https://docs.vllm.ai/en/latest/features/spec_decode.html)
#
# current docs、支持的投机方法和默认参数会变化，部署前要按目标版本重新核对。
#
# ← 上一课：第 8 课：结构化输出：grammar bitmask 与 CPU/GPU 重叠　｜　下一课 →：第 10 课：分布式执行：张量并行、Executor 与 all-reduce
