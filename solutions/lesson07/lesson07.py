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
# # 第 7 课：采样器：temperature、top-k/top-p、种子与 logprobs
#
# ## 本课目标与通过标准
#
# 本课产出：写出批量的 top-k/top-p/min-p 掩码和带种子的随机采样，接进真实引擎；说清一行 logits 怎样变成一个 token：
#
# - logprobs 为何在任何变换之前算；
# - 采样参数为何以每个请求一行的张量进入采样器（`SamplingMetadata`）；
# - 带种子的请求为何各有一个 `torch.Generator`；
# - 为何用“指数竞赛”而不用 `torch.multinomial`；
# - 哪些工作可以跳过（全贪心的批、没有 top-p 的批）。
#
# 通过要求：代码断言全部通过；Q1～Q3 沿源码对象给出因果链；总分至少 8/10。
#
# | 部分 | 分值 | 评分方式 |
# |---|---|---|
# | 代码·主路径（精确掩码、logprobs、卡方检验、与 vLLM 的 `Sampler` 逐行相同 1 分 + 接入真实引擎 1 分） | 2 | 自动 |
# | 代码·边界条件（并列值、top_p = 1、top_k = 词表大小、相差 100 nats 以上的 logits、不排序的快速路径） | 1 | 自动 |
# | 代码·能映射回源码对象（`SOURCE_MAP`） | 1 | 自动 |
# | Q1～Q3 | 各 2 | 人工，按评分规则 |
#
# 没有 nbgrader 时，运行最后的“自检”单元格（或 `python -m autograder check lesson07`）。

# %% [markdown]
# ## 源码版本与阅读方法
#
# 源码固定在 vLLM commit 8e958902eee5（0.27.1 发布后一天）。先读 `Sampler` 的类 docstring，它按顺序列出全部步骤；FlashInfer 与 Triton 分支先跳过。
#
# | 顺序 | vLLM 文件与入口 | minivllm 对应 | 带着什么问题读 |
# |---|---|---|---|
# | 1 | `v1/sample/sampler.py`：`Sampler.forward`（L79–L103）、`Sampler.sample`（L243–L302） | `minivllm/sample/sampler.py` | logprobs 为何在 temperature 之前算？贪心行与随机行怎样同批？ |
# | 2 | `v1/sample/ops/topk_topp_sampler.py`：`apply_top_k_top_p`（L349–L364）、`apply_top_k_top_p_pytorch`（L380–L408） | 同上：`apply_top_k_top_p` | top-k 与 top-p 怎样共用一次排序？什么时候不排序？ |
# | 3 | `v1/sample/ops/topk_topp_sampler.py`：`random_sample`（L450–L472） | 同上：`random_sample` | 为什么不用 `torch.multinomial`？带种子的行从哪取噪声？ |
# | 4 | `v1/worker/gpu_model_runner.py`：`_update_states`（L1276–L1284） | `minivllm/worker/gpu_input_batch.py` | generator 在哪创建？跟着请求还是行号？ |
#
# > **哪个 runner**：本课讲 V1 runner 的采样器，minivllm 照它实现；dense 模型在 0.27.1 上默认走 Model Runner V2，采样器不同（见附录）。

# %%
# 上表各行在 vLLM 0.27.1 源码里的样子：文件路径、行号与逐行原文（行号与上表一致；源码由第一个单元格获取并校验）。
from autograder.vllm_source import show_vllm

show_vllm("vllm/v1/sample/sampler.py", "Sampler.forward", lines=(79, 103))
show_vllm("vllm/v1/sample/sampler.py", "Sampler.sample")
show_vllm("vllm/v1/sample/ops/topk_topp_sampler.py", "apply_top_k_top_p")
show_vllm("vllm/v1/sample/ops/topk_topp_sampler.py", "apply_top_k_top_p_pytorch", lines=(380, 408))
show_vllm("vllm/v1/sample/ops/topk_topp_sampler.py", "random_sample")
show_vllm("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner._update_states", lines=(1276, 1284))

# %% nbgrader={"grade": false, "grade_id": "l07_setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
# 准备（锁定）：静音无害的警告（评分单元格不能写 stderr）。
import logging
import os
import warnings

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

import torch  # noqa: E402

from autograder import lesson07 as L07  # noqa: E402
from autograder.common import ______, report, self_check, short_errors  # noqa: E402,F401

short_errors("lesson07")  # 评分单元格失败时只显示三行：哪一部分、错在哪、第一处不符（完整 traceback：%tb）

# %% [markdown]
# ## 核心心智模型
#
# ### 1. 它是什么，解决什么问题
#
# 模型每步给每个请求一行 logits（V 个实数，V 是词表大小）。采样器做两件事：
#
# - **报告**：用户要的 logprobs 必须是模型本身的分布；
# - **选择**：按这个请求自己的 temperature、top-k、top-p、min-p 和种子挑出一个 token。
#
# 难点是每个请求参数不同，逐请求循环让 GPU 跑一串小 kernel。vLLM 把参数变成每行一个值的张量（`SamplingMetadata`），整批一次算完；只有带种子的行各有一个 `torch.Generator`。
#
# ### 2. 它如何工作
#
# 一行 logits 的一生，按 `Sampler` 类 docstring 的顺序：
#
# 1. **原始 logprobs**：`logits.log_softmax(-1)`，在任何变换之前算（默认 `logprobs_mode = "raw_logprobs"`）。所以 temperature、top-p 都不改变响应里的 logprobs。
# 2. **会改变 argmax 的处理**：allowed_token_ids、bad words、min_tokens、logit_bias、惩罚。贪心请求也受它们影响，所以在贪心之前。
# 3. **贪心**：批里不是全随机时先算 argmax；全贪心（`all_greedy`）就此返回。混合批的贪心行照样走完下面几步。
# 4. **temperature**：`logits / T`（贪心行的 T 换成 1），$\mathrm{softmax}(z/T) \propto p^{1/T}$，T < 1 让分布更尖。
# 5. **min-p**：概率低于 `min_p × 该行最大概率` 的 token 设为 -inf。它不改变 argmax，所以放在贪心之后。
# 6. **top-k 与 top-p**（PyTorch 版 `apply_top_k_top_p_pytorch`）：一次升序排序。top-k 以第 k 大的值为阈值，并列的都留；top-p 在剩下的 token 上重新 softmax、累积，丢掉累积和 ≤ 1 − p 的 token，最大的 token 永远保留。
# 7. **采样**（`random_sample`）：指数竞赛 `argmax(probs / q)`，`q ~ Exp(1)`。无种子的行整批一次 `q.exponential_()`，带种子的行用自己的 generator 重填该行。
# 8. **合并**：温度低于 `_SAMPLING_EPS = 1e-5` 的行，由 `torch.where` 换回第 3 步的 argmax。
#
# ### 3. 正确性条件与常见误区
#
# - **logprobs=0 也要算**：只报告被采 token 的 logprob（`max_num_logprobs` 是 0，不是 None）。
# - **在 logit 空间里算**：logits 相差约 104 nats 以上时，float32 的概率下溢成 0。
# - **temperature 在 softmax 之前**：概率除以 T 只是整行缩放，胜者不变。
# - **top-p 保留跨过 p 的 token**：否则少一个，p 很小时一个不剩。
# - **top-p 在 top-k 之后重新归一化**：在整个词表的概率上做 top-p 会多砍。
# - **min-p 相对最大概率**：概率总和永远是 1，相对总和的阈值就成了固定的 min_p。
# - **每个带种子的请求一个 generator**：整批共用时，随机数取决于前面排了几行；每步从 seed 重来，则每步噪声相同。
#
# ### 4. 性能与工程取舍
#
# - **排序**：PyTorch 路径上 top-p 整行排序，每行 $O(V\log V)$（V 约 3.2 万～25 万）。都不用时 `top_p`、`top_k` 是 None，“没人用”是一次 Python 判断，不启动 kernel。
# - **平台**：CUDA 上 vLLM 多半不排序：无带种子请求时交给 FlashInfer 拒绝采样，否则 batch ≥ 8 用基于 pivot 的 Triton kernel。CPU 上有 Triton 也用它，否则只有 top-k 时走不排序的 `apply_top_k_only`（读 `k.max()`，GPU 上是一次同步）。
# - **不用 `torch.multinomial`**：它在 CUDA 上引起 CPU-GPU 同步（`random_sample` 的 docstring）；指数竞赛只是逐元素运算加 argmax。

# %% [markdown]
# ## 实践任务：唯一代码填空题
#
# 下面是 vLLM `Sampler.sample`、`apply_top_k_top_p_pytorch`、`apply_top_k_only`、`MinPLogitsProcessor.apply` 与 `random_sample` 的精简版。
#
# `md` 是 minivllm 的 `SamplingMetadata`：`temperature`、`top_k`、`top_p`、`min_p` 每行一个值，没人用时为 None（`top_k` 的 0 表示关闭）；另有 `all_greedy`、`generators`、`max_num_logprobs`。
#
# 只改 `______` 处，不删断言、不放宽条件。

# %% nbgrader={"grade": false, "grade_id": "l07_sampler", "locked": false, "schema_version": 3, "solution": true, "task": false}
import torch

SAMPLING_EPS = 1e-5                      # vLLM's _SAMPLING_EPS: temperature below it means greedy


def apply_min_p(logits, min_p):
    """Mask tokens whose probability is below min_p times the row's top probability (min_p: [n], 0 = off)."""
    probs = logits.softmax(dim=-1)
    # TODO 1. The threshold each row compares its probabilities with.
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)  ### BLANK
    return logits.masked_fill(probs < threshold, float("-inf"))


def apply_top_k_top_p(logits, k, p):
    """k: [n] int64 (0 = off) or None; p: [n] float (1 = off) or None. Masked logits become -inf."""
    vocab = logits.shape[-1]
    if p is None:
        if k is None:
            return logits
        # TODO 2. No row uses top-p: the k-th largest value per row without sorting the vocabulary.
        off = (k <= 0) | (k >= vocab)
        k_idx = torch.where(off, torch.ones_like(k), k).long() - 1
        kth = logits.topk(int(k_idx.max()) + 1, dim=-1).values.gather(1, k_idx.unsqueeze(1))  ### BLANK
        kth = kth.masked_fill(off.unsqueeze(1), float("-inf"))
        return logits.masked_fill(logits < kth, float("-inf"))
    logits_sort, logits_idx = logits.sort(dim=-1)                  # ascending: the largest is last
    if k is not None:
        k_eff = torch.where(k > 0, k, torch.full_like(k, vocab)).clamp(max=vocab)
        # TODO 3. The k-th largest value of each row, read from the ascending sort.
        kth = logits_sort.gather(1, (vocab - k_eff).long().unsqueeze(1))  ### BLANK
        logits_sort = logits_sort.masked_fill(logits_sort < kth, float("-inf"))
    # TODO 4. Top-p: which probabilities, and which tokens are dropped?
    probs_sort = logits_sort.softmax(dim=-1)  ### BLANK
    cum = probs_sort.cumsum(dim=-1)
    drop = cum <= 1 - p.unsqueeze(1)  ### BLANK
    drop[:, -1] = False                                            # the most likely token always stays
    logits_sort = logits_sort.masked_fill(drop, float("-inf"))
    return logits.scatter(1, logits_idx, logits_sort)


def random_sample(probs, generators):
    """One token per row by the exponential race: argmax(probs / q), q ~ Exp(1) i.i.d. (vLLM's random_sample).

    generators: row -> torch.Generator of a seeded request; the other rows use the global RNG."""
    q = torch.empty_like(probs)
    if len(generators) != probs.shape[0]:
        q.exponential_()
    for i, gen in generators.items():
        # TODO 5. Row i's noise, reproducible whatever else is in the batch.
        q[i].exponential_(generator=gen)  ### BLANK
    # TODO 6. Return the winner of the race, one token id per row.
    return (probs / q).argmax(dim=-1)  ### BLANK


def sample(logits, md):
    """vLLM's Sampler.forward for one batch: returns (sampled [n], raw logprobs [n, V] or None)."""
    logits = logits.float()
    # TODO 7. The logprobs the response reports (vLLM's default logprobs_mode = "raw_logprobs").
    raw_logprobs = logits.log_softmax(dim=-1) if md.max_num_logprobs is not None else None  ### BLANK
    greedy = logits.argmax(dim=-1)
    if md.all_greedy:
        return greedy, raw_logprobs
    is_greedy = md.temperature < SAMPLING_EPS
    temp = torch.where(is_greedy, torch.ones_like(md.temperature), md.temperature)
    # TODO 8. Temperature.
    x = logits / temp.unsqueeze(1)  ### BLANK
    if md.min_p is not None:
        x = apply_min_p(x, md.min_p)
    x = apply_top_k_top_p(x, md.top_k, md.top_p)
    probs = x.softmax(dim=-1)
    sampled = random_sample(probs, md.generators)
    # TODO 9. Return (sampled, raw_logprobs): which rows keep the greedy token?
    return torch.where(is_greedy, greedy, sampled), raw_logprobs  ### BLANK


# %%
# 逐项报告（不会中断 Run All）：每个自动评分部分一行，✗ 后面是第一处不符合的地方。
report("lesson07", globals())

# %% [markdown]
# 第一项检查：构造的 logits，结果完全确定。
#
# - 8 行、词表 10，各行参数不同，保留的 token 集合与逐行的 float64 参考比较；
# - 贪心行取 argmax，temperature → 0 等于贪心，logprobs 是原始 logits 的 log_softmax（含 logprobs=0、相差 100 nats 以上）；
# - 隐藏测试：频数与精确的截断分布做卡方检验；六个录制的批上与 vLLM 0.27.1 的 `Sampler` 逐行相同。

# %% nbgrader={"grade": true, "grade_id": "l07_main_path", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
x = torch.tensor([[3.0, 1.0, 2.0, 0.0, 2.5], [0.0, 4.0, 1.0, 1.0, -1.0]])
out = apply_top_k_top_p(x.clone(), torch.tensor([2, 0]), torch.tensor([1.0, 0.95]))
print(torch.isfinite(out).int().tolist())
assert torch.isfinite(out).tolist() == [[True, False, False, False, True], [False, True, True, True, False]]
assert torch.isfinite(apply_min_p(x.clone(), torch.tensor([0.3, 0.0]))).tolist()[0] == [True, False, True, False, True]
md = L07.make_md([0.0, 1.0], logprobs=1)
sampled, raw = sample(x.clone(), md)
assert sampled[0] == 0 and torch.allclose(raw, x.log_softmax(-1))
### BEGIN HIDDEN TESTS
L07.check_main_path(apply_min_p, apply_top_k_top_p, random_sample, sample)
### END HIDDEN TESTS

# %% [markdown]
# 第二项检查把你的 `sample` 接进 runner：
#
# - 带种子的请求（含 seed=0）单独跑、与参数各异的请求同批、在每步 4 个 token 的 chunked prefill 下输出相同；temperature 1e-4 等于贪心；
# - profiler 只在有 top-p 的步里看到 `aten::sort`；logprobs 等于 HF 原始 logits 的 log_softmax，没人要时为 None。

# %% nbgrader={"grade": true, "grade_id": "l07_real_engine", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
L07.check_real_engine(sample)
print("真实引擎检查通过：种子输出与批组成、分块无关；T→0 等于贪心；只有 top-p 时才排序；logprobs 等于 HF 的原始分布。")

# %% [markdown]
# ## 具体演示：一行真实 logits 经过每一步
#
# 把你的 `sample` 接进真实引擎，截下 prompt `"JULIET:\nO Romeo"` 生成第 6 个 token 时的那行 logits（V = 4096），依次做 temperature 0.8、min_p 0.1、top_k 12、top_p 0.6。

# %%
row = L07.engine_logits(sample)
stages = L07.transform_stages(row, apply_min_p, apply_top_k_top_p)
L07.print_stages(stages)
L07.plot_stages(stages);

# %% [markdown]
# 图 7-1：同一行 logits 每步之后的分布（横轴：原始概率前 30 的 token；标题：剩几个 token）。每步重新归一化，柱子越砍越高；top-p 0.6 留下跨过 0.6 的那个 token。

# %% [markdown]
# ## 检查方法
#
# 运行断言，再解释下面两组真实运行：
#
# - 同一个 seed=1234 的请求：单独跑、与 3 个参数各异的请求同批、在 chunked prefill 下跑；再不带种子跑两次。为什么带种子的三行相同，不带种子的不同？
# - profiler 看到的算子（每次相同）：top-p 一栏为什么多了 `sort`、排多少个元素？计时只看方向（负载下 5 次：2.8×–26×）
#
# > **minivllm ≠ vLLM**：只有 top-k 时一律不排序是 minivllm 的规则，边界检查按它评。

# %%
runs = L07.seed_demo(sample)
L07.print_seed_demo(runs)
L07.plot_seed_demo(runs);

# %% [markdown]
# 图 7-2：每个位置是否与“seed, alone”的 token 相同（绿色）。带种子的请求只在产出 token 的步从自己的 generator 取噪声（minivllm 分块 prefill 的中间块不采样），所以三行全绿；不带种子的两次在第一个随机分叉处不同。

# %%
L07.print_sort_cost(L07.sort_cost(apply_top_k_top_p))

# %% [markdown]
# 你的解释：

# %% nbgrader={"grade": true, "grade_id": "l07_boundary", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
x = torch.tensor([[1.0, 2.0, 2.0, 0.5], [0.0, 0.1, 0.2, 0.3]])
assert torch.equal(apply_top_k_top_p(x.clone(), torch.tensor([2, 4]), None), x.masked_fill(torch.tensor([[True, False, False, True], [False] * 4]), float("-inf")))  # 并列都留；k = 词表大小不砍
assert torch.equal(apply_top_k_top_p(x.clone(), None, torch.tensor([1.0, 1.0])), x)   # top_p = 1：全部保留
assert torch.equal(apply_top_k_top_p(x.clone(), None, None), x)                      # 都不用：原样返回
### BEGIN HIDDEN TESTS
L07.check_boundary(apply_min_p, apply_top_k_top_p)
### END HIDDEN TESTS

# %% [markdown]
# ## 映射回源码对象
#
# 这 1 分自动评分：找到 vLLM 里实现每个概念的名字（括号里是它的文件），写成字符串，大小写不限。
#
# - `greedy_pick`：`Sampler` 里给 temperature 低于阈值的行取 argmax 的静态方法；
# - `no_seed_fast_path`（`topk_topp_sampler.py`）：CUDA 上批里有 top-k/top-p、没有带种子的请求时，`TopKTopPSampler` 把整批交给的函数；
# - `argmax_safe`（`logits_processor/interface.py`）：logits processor 接口里声明“不会改变 argmax”的方法；
# - `processed_mode`（`config/model.py`）：`logprobs_mode` 的一个取值，返回 temperature、top-k/top-p 等处理之后的 log 概率（不是 logits）；
# - `sampled_rank`（`ops/logprobs.py`）：`Sampler` 算被采 token 名次（一行里 logprob 不小于它的 token 数）的函数；
# - `fp64_noise`（`topk_topp_sampler.py`）：`TopKTopPSampler` 的构造参数，让竞赛的指数噪声以 float64 生成。

# %% nbgrader={"grade": false, "grade_id": "l07_source_map_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
SOURCE_MAP = {
    "greedy_pick": "greedy_sample",  ### BLANK
    "no_seed_fast_path": "flashinfer_sample",  ### BLANK
    "argmax_safe": "is_argmax_invariant",  ### BLANK
    "processed_mode": "processed_logprobs",  ### BLANK
    "sampled_rank": "batched_count_greater_than",  ### BLANK
    "fp64_noise": "use_fp64_gumbel",  ### BLANK
}

# %% nbgrader={"grade": true, "grade_id": "l07_source_map", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
L07.check_source_map(SOURCE_MAP)

# %% [markdown] nbgrader={"grade": false, "grade_id": "l07_q1", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q1（2 分）
#
# 为什么 vLLM 的 V1 runner 给每个带种子的请求一个自己的 `torch.Generator`（`SamplingMetadata.generators`，按批内行号索引），而不是在每步开始时 `torch.manual_seed(...)` 一次、或整批共用一个 generator？
#
# 请结合图 7-2 和 chunked prefill 说明“同一个种子、同样的输出”要成立需要哪些条件。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**（两部分各 1 分）：
#
# - **为什么不共用（1 分）**：批的组成（谁同批、排第几行）每步由调度器决定、对用户不可见；共用一个 generator 时某行拿到的随机数取决于前面各行消耗了多少（本课 `one_generator_for_the_batch`），每步全局 `manual_seed` 则同批两个种子无法兼顾、且每步拿到同一段噪声。每请求一个 generator，状态随请求走，行号变了只是 `generators` 的键变。
# - **成立条件（1 分）**：chunked prefill 的中间块不能推进这个请求的随机流（minivllm：不采样；vLLM V1：采样后丢弃并回拨 generator 偏移；V2：`num_sampled = 0`、噪声由 seed 与位置决定；哪种都给分，只要说清是哪个系统）。再说出 logits 须与批组成无关（vLLM 默认不承诺，要 `VLLM_BATCH_INVARIANT=1`）或抢占后 generator 跟着请求的，是加深，不是必需。
# - generator 由哪个方法创建（`_update_states`，不是 `add_request`）不计分。以 Model Runner V2 的 (seed, 位置) Gumbel 噪声回答同一个问题的，同样给满分。1 分 = 只答对其中一部分；只说“为了可复现”而说不清共用为什么依赖批组成，为什么不共用这 1 分不给。0 分 = 认为设一次全局种子就够了（一票否决：只背类名而说不清状态所有权）。
#
# **参考答案**
#
# 1. 种子的承诺是请求级的：同一个 prompt + 参数 + seed，不论服务端此刻还在处理什么，输出都相同。批的组成由调度器每步决定：这个请求可能单独跑，也可能排在第 4 行、前面有贪心、无种子、另一种子的请求。
# 2. 共用一个 generator：`q` 的每一行按顺序从同一个随机流取数，第 i 行拿到哪一段取决于前面 i 行消耗了多少——批一变，噪声就变，token 就变。每步全局 `manual_seed(seed)` 也不行：同批有两个不同种子的请求时无法同时满足，而且同一个种子的请求每一步都会拿到同一段噪声。
# 3. vLLM V1 的做法：`GPUModelRunner._update_states` 为带 seed 的新请求创建 `torch.Generator` 并 `manual_seed(seed)`，放在 `CachedRequestState.generator` 里，`InputBatch.add_request` 把它存进 `generators[行号]`；请求在批内换行（condense、有请求结束）时只是字典的键变了，generator 的状态跟着请求走。`random_sample` 先对整批 `q.exponential_()`（无种子的行），再对每个带种子的行用它自己的 generator 覆盖 `q[i]`：每产出一个 token，恰好消耗 V 个指数数。
# 4. 成立条件：chunked prefill 的中间块不能推进随机流——minivllm 不为它取 logits、不进采样器（图 7-2：chunked 一行与 alone 完全相同）；vLLM V1 照样为它采样，再丢掉结果（`discard_request_mask`）并在 `_bookkeeping_sync` 里把 generator 偏移回拨（`gen.set_offset(gen.get_offset() - 4)`）；V2 给这些请求 `num_sampled = 0`，噪声是 (seed, 位置) 的函数，不受影响。logits 在不同批组成下要数值相同：CPU 上本课成立；GPU 上不同 batch 形状可能选不同 kernel、产生浮点差异，vLLM 的 reproducibility 文档明说默认不保证可复现，要批不变（`VLLM_BATCH_INVARIANT=1`）等设置。另外 vLLM V1 在 CPU 上只要批里不是每行都带种子，就整批走 `compiled_random_sample`、不读 `generators`。无种子的行则不需要可复现，整批一次生成噪声最快。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l07_q2", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q2（2 分）
#
# vLLM 的 `random_sample` 为什么不用 `torch.multinomial`，而是 `argmax(probs / q)`、`q ~ Exp(1)`？请说明为什么这样抽出的 token 恰好服从 probs，以及它在 GPU 上省掉了什么；本课的卡方检验为什么能拒绝“把概率乘以噪声再取 argmax”（$\arg\max p\cdot q$）的写法，这说明了什么。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：
#
# - **正确性（1 分）**：$q_i \sim \mathrm{Exp}(1)$ 时 $q_i/p_i \sim \mathrm{Exp}(p_i)$，argmax $p_i/q_i$ = argmin $q_i/p_i$，独立指数变量中第 i 个最小的概率是 $p_i$（指数竞赛；说等价于 Gumbel-max 并给出理由也可）。
# - **成本与卡方（1 分）**：说出 `torch.multinomial` 在 CUDA 上引起 CPU-GPU 同步（vLLM 源码注释），打断异步执行与 async scheduling，而竞赛只是逐元素 kernel 加一次 argmax；并说明卡方检验拒绝 $\arg\max p\cdot q$ 是因为它偏向高概率 token、不是从 p 抽样（“看起来随机”不等于按 p 抽样）。两点都要有；只说“更快”、没有同步这条因果链的，这 1 分不给。带种子的行各用自己的 generator 是加深，不是必需。
# - 0 分：认为竞赛是近似采样或改变了分布（一票否决：混淆算法正确性与性能）。
#
# **参考答案**
#
# 1. 正确性：若 $q_i \sim \mathrm{Exp}(1)$ 独立，则 $E_i = q_i/p_i \sim \mathrm{Exp}(\text{rate}=p_i)$。独立指数变量里第 i 个最先“到达”（最小）的概率是 $p_i/\sum_j p_j$。$\arg\max_i p_i/q_i = \arg\min_i E_i$，所以抽到 i 的概率正好是 $p_i$（$p_i = 0$ 的 token 永远不会赢，所以 -inf 掩码直接生效）。这与 Gumbel-max（$\arg\max \log p_i + g_i$）等价。
# 2. 成本：vLLM 的 docstring 写明 `torch.multinomial` 会引起 CPU-GPU 同步。采样在每步的关键路径上，一次同步会让 CPU 等 GPU 跑完前向，打断 async scheduling（下一步的调度与这一步的 GPU 计算重叠）和 kernel 排队；竞赛只是 `exponential_`、`div`、`argmax` 三个逐元素/归约 kernel，没有同步，CPU 不必等它。
# 3. 种子：噪声是一个与 probs 同形的张量，带种子的行用自己的 generator 覆盖自己那一行即可（`q[i].exponential_(generator=gen)`），批量和逐请求可复现同时成立；multinomial 每次调用只接受一个 generator。
# 4. 本课：卡方检验在四组参数下（3000 次、固定种子）检验你的输出频数与精确的截断分布一致；`multiply_by_noise`（argmax $p\cdot q$）偏向高概率 token，被卡方检验拒绝——“看起来随机”不等于按 p 抽样。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l07_q3", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q3（2 分）
#
# top-p 在 minivllm 和 vLLM 的 PyTorch 路径上代价是什么，什么时候被跳过？请用“检查方法”里 profiler 的算子与排序元素数说明，并指出 `SamplingMetadata` 的哪个设计让“没人用”的判断不花一次 kernel。再说明 vLLM 在 CUDA 和 CPU 上怎样处理只有 top-k 或有 top-p 的批。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 以下三点都说清。
#
# - 代价：PyTorch 路径上 top-p 要把每行按 logits 排序（`logits.sort`，$O(V\log V)$），再 softmax、cumsum、scatter 回原位；引用 profiler：top-p 一栏出现 `aten::sort`、整批 8 × 32000 个元素都排序，只有 top-k 时只有 `topk`、不排序。计时只需说方向（top-p 更慢）；用某一次的倍数当结论不给这一点。批里只要有一个请求用 top-p，整批都排序，top_p = 1 的行也一样，这是对的。
# - 跳过：批里没有请求用 top-p 时 `top_p` 是 None（`top_k` 同理），`apply_top_k_top_p` 在两者都是 None 时原样返回；全贪心时 `Sampler.sample` 在 temperature 之前就返回。说 Model Runner V2 的 `Sampler` 先查有没有请求需要处理、没有就跳过，也对。
# - 平台：CUDA 上默认多半不排序——没有带种子请求时走 FlashInfer 的拒绝采样（`flashinfer_sample`），否则 batch ≥ 8 时走基于 pivot 的 Triton kernel（`apply_top_k_top_p_triton`），只有小 batch 的 PyTorch 版排序，而且只有 top-k 时它也排序；CPU 上没有 Triton 时走 `apply_top_k_top_p_pytorch(allow_cpu_sync=True)`，只有 top-k 时用不排序的 `apply_top_k_only`，因为读 `k.max()` 是一次同步，只有 CPU 上可以接受。
#
# 回答“GPU 上 vLLM 的 top-p 代价不在排序，而在 FlashInfer / Triton 的 kernel 里”并给出上面的路径，代价这一点同样给分。
#
# 1 分 = 只说“排序慢”，没有数字，或没有说明 None 的判断，或没有平台差异；0 分 = 把本机毫秒数当作 GPU 上的结论（一票否决：把单一负载的实测写成普遍结论）。
#
# **参考答案**
#
# 1. 代价：`apply_top_k_top_p` 对 [batch, V] 的 logits 整行升序排序，记下 `logits_idx`，在排好的值上做 top-k 阈值、softmax、cumsum、比较，再 `scatter` 回原顺序。排序是 $O(V\log V)$，还要额外一份 [batch, V] 的值和下标。本机 [8, 32000]：top-p 一栏有 `sort`（256,000 个元素），只有 top-k 时只有 `topk`、`gather`、`masked_fill`，不排序。计时上 top-p 总是更慢，但倍数随机器负载在 2.8× 到 26× 之间变化，不能当结论；GPU 上要在目标硬件上测。
# 2. 跳过：minivllm 的 `_sampling_metadata` 与 vLLM V1 的 `InputBatch._make_sampling_metadata` 只在批里有请求用 top-p 时才给出 `top_p` 张量，否则是 None；vLLM 用 `top_p_reqs` 集合和 `no_top_p` 属性判断。`if p is None` 是一次 Python 判断，不启动 kernel。只要有一个请求用 top-p，整批都排序，其余行 p = 1，不砍 token，但排序照做。全贪心时掩码与竞赛全部跳过；混合批里的贪心行参与竞赛，结果再被 `torch.where` 换成 argmax。
# 3. 平台：`apply_top_k_top_p` 在 CPU 上有 Triton 时用 `apply_top_k_top_p_triton`，没有时用 `apply_top_k_top_p_pytorch(allow_cpu_sync=True)`，只有 top-k 时走 `apply_top_k_only`：`topk(max k)` 取阈值，不排序整个词表，但要读 `k.max()`，在 GPU 上是一次同步。CUDA 上支持 FlashInfer 时，没有带种子请求的 top-k/top-p 批交给 `flashinfer_sample`，用拒绝采样，不排序；一有带种子的请求就退回 `forward_native`：batch ≥ 8 且有 Triton 时走基于 pivot 的 Triton kernel，否则排序，只有 top-k 也排序。minivllm 只有 PyTorch 版，只有 top-k 时一律走 `apply_top_k_only`。
#
# **附：检查方法的参考解释**（不单独计分）：带种子的三行相同，因为噪声来自请求自己的 generator，且只在产出 token 的步取一次；不带种子的两次运行用全局随机流，在第一个有多个候选的位置就分叉。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown]
# ## 评分规则
#
# - 代码 4 分：主路径 2 分（构造 logits 上的精确掩码与卡方分布检验 1 分、接入真实引擎 1 分）、边界条件 1 分、能映射回源码对象 1 分；
# - Q1～Q3 各 2 分：必须包含对象、状态变化、正确性或成本链；
# - 一票否决：把论文峰值写成普遍生产结论；把源码支持写成所有模型/硬件可用；混淆算法正确性与性能；只背类名而说不清状态所有权。
#
# 总分 10 分，至少 8 分通过。引擎自己的版本在 `minivllm/sample/sampler.py`，先独立完成再读。
#
# ### 自检
#
# 下面的单元格用与 nbgrader 相同的检查函数给代码部分打分（Q1～Q3 显示为待人工评分）。

# %%
self_check("lesson07", globals());

# %% [markdown]
# ## 附录（选读）
#
# 选读，不计分：在真实 vLLM 上运行、与 vLLM 的全部差异和参考资料。

# %% [markdown]
# ### 在真实 vLLM 0.27.1 上看同一件事
#
# 第一张表：演示那行 logits（vLLM 一侧用 HF transformers 算）逐步经过 vLLM 的 `Sampler.apply_temperature`、`MinPLogitsProcessor`、`apply_top_k_top_p` 和你的函数。
#
# 第二张表是主路径评分的六个录制批之一：每行的掩码、带种子行的 token、原始 logprobs 都要与 vLLM 的 `Sampler` 相同。
#
# 这里直接构造 vLLM 的 `Sampler`，不经过 model runner。CPU 上它的 `forward_cpu` 不读 `generators`（见下面的差异），所以第二张表用 `forward_native`。vLLM 源码在 `.venv-vllm` 的 site-packages/vllm 下。

# %%
L07.vllm_side_by_side(row, apply_min_p, apply_top_k_top_p, sample);

# %% [markdown]
# ### 参考资料
#
# - [vLLM sampler](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/sample/sampler.py)
# - [vLLM top-k/top-p sampler](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/sample/ops/topk_topp_sampler.py)
# - [vLLM built-in logits processors](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/sample/logits_processor/builtin.py)
# - [vLLM SamplingMetadata](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/sample/metadata.py)
# - [Model Runner V2 的采样器](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/worker/gpu/sample/sampler.py)
# - [The Curious Case of Neural Text Degeneration（top-p，Holtzman et al., ICLR 2020）](https://arxiv.org/abs/1904.09751)
# - [Turning Up the Heat: Min-p Sampling（Nguyen et al., 2024）](https://arxiv.org/abs/2407.01082)
# - [vLLM sampling parameters (current docs)](https://docs.vllm.ai/en/latest/api/vllm/sampling_params.html)
#
# 源码链接固定到本课对照的 commit；current docs 与默认参数会变化，部署前按目标版本重新核对。
#
# ### 与 vLLM 0.27.1 的差异
#
# 本课评分的机制与 vLLM V1 采样器的 PyTorch 版相同：步骤顺序、掩码、指数竞赛、每个带种子请求一个 generator。其余差别：
#
# - **runner**：`VllmConfig.use_v2_model_runner` 为真时用 Model Runner V2；V2 不支持的特性（如 n-gram 投机）、多数 MoE 模型或没有 Triton 时用 V1。
# - **V2 的采样器**：随机采样是 Triton 的 Gumbel-max（`gumbel_sample`），噪声由每请求的 seed 和 token 位置决定，没有 `torch.Generator`。
# - **V2 与 FlashInfer**：V2 只在批里没有贪心行、没有显式 seed 时用 FlashInfer；它与 `random_sample` 只在统计上等价，输出不一定逐 token 相同。
# - **只有 top-k 时不排序**：vLLM 的 `apply_top_k_only` 只在 CPU 上、没有 Triton 时使用；GPU 上落到 PyTorch 版（不足 8 行又用不了 FlashInfer，如有带种子的行）时，只有 top-k 也整行排序。minivllm 只有 top-k 时一律不排序。
# - **CPU 上的随机采样**：批里不是每行都带种子时，vLLM 的 `forward_cpu` 整批走编译的 `compiled_random_sample`、不读 `generators`；minivllm 给无种子的行每行取一个均匀数、按累积分布抽样。
# - **分块 prefill**：V1 对中间块也采样，用 `discard_request_mask` 丢掉结果，并在 `_bookkeeping_sync` 里把这个请求 generator 的偏移往回拨；V2 给这些请求 `num_sampled = 0`，噪声不依赖状态。minivllm 的中间块不进采样器。
# - **可复现性**：vLLM 默认不承诺输出与批组成无关（GPU 上不同批形状可能选到不同 kernel），批不变要设 `VLLM_BATCH_INVARIANT=1`。本课的 CPU 运行里 logits 与批组成无关。
# - **logits processor**：minivllm 没有 bad words；min_tokens、logit_bias 等按 vLLM 的顺序在 `Sampler.forward` 里做，vLLM 用 `MinTokensLogitsProcessor` 等。
# - **min-p 的状态**：vLLM 在 `MinPLogitsProcessor` 里，minivllm 在 `SamplingMetadata.min_p`。
# - **top-k 的“关闭”**：`SamplingParams.top_k` 默认都是 0；vLLM 的 `InputBatch.add_request` 把关闭的行存成词表大小，minivllm 存 0。
# - **种子的代价**：带种子的行逐行调用 `exponential_(generator=...)`，vLLM 的注释说它 “can be slow”；FlashInfer 不支持逐请求 generator。
# - **logprobs**：vLLM 另有 `logprobs=-1`（整个词表）和返回处理后 logits/logprobs 的模式；minivllm 只有原始 logprobs。
#
# ← 上一课：第 6 课：PagedAttention：Triton decode kernel　｜　下一课 →：第 8 课：结构化输出：grammar bitmask 与 CPU/GPU 重叠
