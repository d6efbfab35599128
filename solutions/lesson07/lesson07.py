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
# - logprobs 为何在采样器的任何变换之前算；
# - 采样参数为何以每个请求一行的张量进入采样器（`SamplingMetadata`）；
# - 带种子的请求为何各有一个 `torch.Generator`；
# - “指数竞赛”为何精确按 p 抽样；
# - 哪些工作可以跳过（全贪心的批、没有 top-p 的批）。
#
# 通过要求：代码断言全部通过；Q1～Q3 各用 3～5 句回答；总分至少 8/10。
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
# 源码固定在 vLLM commit {{VLLM_COMMIT}}（{{VLLM_VERSION}} 发布后一天）。下面只摘主路径用到的约 100 行；FlashInfer 与 Triton 分支先跳过。
#
# | 顺序 | vLLM 文件与入口 | minivllm 对应 | 带着什么问题读 |
# |---|---|---|---|
# | 1 | `v1/sample/sampler.py`：`Sampler.forward`（L84–L93）、`Sampler.sample`（L257–L261、L275–L302） | `minivllm/sample/sampler.py` | logprobs 为何在 temperature 之前算？贪心行与随机行怎样同批？ |
# | 2 | `v1/sample/ops/topk_topp_sampler.py`：`apply_top_k_top_p_pytorch`（L380–L408） | 同上：`apply_top_k_top_p` | top-k 与 top-p 怎样共用一次排序？什么时候不排序？ |
# | 3 | `v1/sample/ops/topk_topp_sampler.py`：`random_sample`（L455–L472） | 同上：`random_sample` | 为什么不用 `torch.multinomial`？带种子的行从哪取噪声？ |
# | 4 | `v1/worker/gpu_model_runner.py`：`_update_states`（L1276–L1284） | `minivllm/worker/gpu_model_runner.py`：`_update_states`（`gpu_input_batch.py` 只按行号存放） | generator 在哪创建？跟着请求还是行号？ |
#
# > **哪个 runner**：本课讲 V1 runner 的采样器，minivllm 照它实现；dense 模型在 {{VLLM_VERSION}} 上默认走 Model Runner V2，采样器不同（见附录）。

# %%
# 上表各行在 vLLM {{VLLM_VERSION}} 源码里的样子：文件路径、行号与逐行原文（行号与上表一致；源码由第一个单元格获取并校验）。
from autograder.vllm_source import show_vllm

show_vllm("vllm/v1/sample/sampler.py", "Sampler.forward", lines=(84, 93))
show_vllm("vllm/v1/sample/sampler.py", "Sampler.sample", lines=(257, 261))
show_vllm("vllm/v1/sample/sampler.py", "Sampler.sample", lines=(275, 302))
show_vllm("vllm/v1/sample/ops/topk_topp_sampler.py", "apply_top_k_top_p_pytorch", lines=(380, 408))
show_vllm("vllm/v1/sample/ops/topk_topp_sampler.py", "random_sample", lines=(455, 472))
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
# 1. **原始 logprobs**：`logits.log_softmax(-1)`，在 Sampler 的任何变换之前算（默认 `logprobs_mode = "raw_logprobs"`），所以 temperature、top-p 都不改变响应里的 logprobs。结构化输出的 grammar bitmask 在进入 Sampler 前施加，不在此列：logprobs 已含它。
# 2. **会改变 argmax 的处理**：allowed_token_ids、bad words、min_tokens、logit_bias、惩罚。贪心请求也受它们影响，所以在贪心之前。
# 3. **贪心**：批里不是全随机时先算 argmax；全贪心（`all_greedy`）就此返回。混合批的贪心行照样走完下面几步。
# 4. **temperature**：`logits / T`（贪心行的 T 换成 1），$\mathrm{softmax}(z/T) \propto p^{1/T}$，T < 1 让分布更尖。
# 5. **min-p**：概率低于 `min_p × 该行最大概率` 的 token 设为 -inf。它不改变 argmax，所以放在贪心之后。
# 6. **top-k 与 top-p**（PyTorch 版 `apply_top_k_top_p_pytorch`）：一次升序排序。top-k 以第 k 大的值为阈值，并列的都留；top-p 在剩下的 token 上重新 softmax、累积，丢掉累积和 ≤ 1 − p 的 token，最大的 token 永远保留。
# 7. **采样**（`random_sample`）：指数竞赛 `argmax(probs / q)`，`q ~ Exp(1)`。无种子的行整批一次 `q.exponential_()`，带种子的行用自己的 generator 重填该行。
#    - 两个事实（Q2 用）：$q_i \sim \mathrm{Exp}(1)$ 时，$q_i/p_i$ 服从速率为 $p_i$ 的指数分布；几个独立指数变量中，第 i 个最小的概率是 $p_i/\sum_j p_j$。
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
# - **平台**：CUDA 上 vLLM 多半不走这条排序路径：无带种子请求时交给 FlashInfer，否则 batch ≥ 8 用 Triton kernel。上面 L384–L386 的 `apply_top_k_only` 只在 CPU 上、没有 Triton 时用：它读 `k.max()`，GPU 上是一次同步。
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
        # TODO 2. No row uses top-p: each row's k-th largest value without sorting the vocabulary
        #         (torch.topk of the batch's largest k, then pick column k_idx of each row).
        off = (k <= 0) | (k >= vocab)
        k_idx = torch.where(off, torch.ones_like(k), k).long() - 1  # 0-based; an off row reads column 0
        kth = logits.topk(int(k_idx.max()) + 1, dim=-1).values.gather(1, k_idx.unsqueeze(1))  ### BLANK
        kth = kth.masked_fill(off.unsqueeze(1), float("-inf"))
        return logits.masked_fill(logits < kth, float("-inf"))
    logits_sort, logits_idx = logits.sort(dim=-1)                  # ascending: the largest is last
    if k is not None:
        k_eff = torch.where(k > 0, k, torch.full_like(k, vocab)).clamp(max=vocab)
        kth = logits_sort.gather(1, (vocab - k_eff).long().unsqueeze(1))  # k-th largest: ascending order
        logits_sort = logits_sort.masked_fill(logits_sort < kth, float("-inf"))
    # TODO 3. Top-p: which probabilities, and which tokens are dropped?
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
        # TODO 4. Row i's noise, reproducible whatever else is in the batch.
        q[i].exponential_(generator=gen)  ### BLANK
    # TODO 5. Return the winner of the race, one token id per row.
    return (probs / q).argmax(dim=-1)  ### BLANK


def sample(logits, md):
    """vLLM's Sampler.forward for one batch: returns (sampled [n], raw logprobs [n, V] or None)."""
    logits = logits.float()
    # TODO 6. The logprobs the response reports (vLLM's default logprobs_mode = "raw_logprobs").
    raw_logprobs = logits.log_softmax(dim=-1) if md.max_num_logprobs is not None else None  ### BLANK
    greedy = logits.argmax(dim=-1)
    if md.all_greedy:
        return greedy, raw_logprobs
    is_greedy = md.temperature < SAMPLING_EPS
    temp = torch.where(is_greedy, torch.ones_like(md.temperature), md.temperature)
    # TODO 7. Temperature.
    x = logits / temp.unsqueeze(1)  ### BLANK
    if md.min_p is not None:
        x = apply_min_p(x, md.min_p)
    x = apply_top_k_top_p(x, md.top_k, md.top_p)
    probs = x.softmax(dim=-1)
    sampled = random_sample(probs, md.generators)
    # TODO 8. Return (sampled, raw_logprobs): which rows keep the greedy token?
    return torch.where(is_greedy, greedy, sampled), raw_logprobs  ### BLANK


# %%
# 逐项报告（不会中断 Run All）：每个自动评分部分一行，✗ 后面是第一处不符合的地方。
report("lesson07", globals())

# %% [markdown]
# 第一项检查：构造的 logits，结果完全确定。
#
# - 8 行、词表 10，各行参数不同，保留的 token 集合与逐行的 float64 参考比较；
# - 贪心行取 argmax，temperature → 0 等于贪心，logprobs 是原始 logits 的 log_softmax（含 logprobs=0、相差 100 nats 以上）；
# - 隐藏测试：频数与精确的截断分布做卡方检验；六个录制的批上与 vLLM {{VLLM_VERSION}} 的 `Sampler` 逐行相同。

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
# 运行断言，再看下面两组真实运行（Q1 用图 7-2，Q3 用 profiler 表）：
#
# - 同一个 seed=1234 的请求：单独跑、与 3 个参数各异的请求同批、在 chunked prefill 下跑；再不带种子跑两次。
# - profiler 看到的算子（每次相同）：只有 top-k 与有 top-p 各一栏。计时只看方向，倍数随机器负载变化。
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
# 这 1 分自动评分：写出 vLLM 里每个概念的名字（字符串，大小写不限）。括号里是去哪找，每个约一分钟。
#
# - `greedy_pick`：给贪心行取 argmax 的静态方法（上面 `Sampler.sample` 的 L257–L261）；
# - `no_seed_fast_path`：CUDA 上没有带种子的请求时，整批交给的函数（`topk_topp_sampler.py` 里 `TopKTopPSampler.forward_cuda` 的最后一行）；
# - `argmax_safe`：声明“不会改变 argmax”的方法（`logits_processor/interface.py` 的 `LogitsProcessor`）；
# - `processed_mode`：返回 temperature、top-k/top-p 之后 log 概率的 `logprobs_mode` 取值（`config/model.py` 的 `LogprobsMode`）；
# - `sampled_rank`：算被采 token 名次的函数（`Sampler.gather_logprobs` 里给 `token_ranks` 赋值的那行）；
# - `fp64_noise`：让竞赛噪声以 float64 生成的开关（上面 `random_sample` 第 460 行传入的参数）。

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
# 如果 `random_sample` 让所有带种子的行共用一个 `torch.Generator`，图 7-2 里“seed, batch”那一行还会与“seed, alone”相同吗？为什么像 vLLM 的 `random_sample` 那样，每个带种子的请求用自己的 generator 重填自己那一行，就能保证相同？
#
# === BEGIN MARK SCHEME ===
#
# **评分**：
#
# - 2 分：说清两点。(a) 共用时不会相同：`q` 的各行按顺序从同一个随机流取数，某行拿到哪一段取决于排在它前面、也从这个流取数的行有几行，而批的组成和行号由调度器每步决定，所以同批时噪声变了、token 跟着变。(b) 每请求一个 generator 时，它由 `_update_states` 按这个请求的 seed 创建、跟着请求走（`generators` 按当前行号索引，换行只是键变），只在这个请求产出 token 时取一行噪声，所以它的噪声序列只由 seed 和它自己产出过几个 token 决定，与同批是谁无关。
# - 1 分：只说清 (a) 或 (b) 中的一点；或只说“为了可复现”，没有说出共用时噪声为什么依赖批组成。
# - 0 分：认为共用也会相同，或认为每步全局 `torch.manual_seed` 一次就够了。
#
# 提到 chunked prefill 的中间块不能推进随机流（minivllm 不采样；vLLM V1 采样后回拨 generator 偏移）是加深，不要求。
#
# **参考答案**
#
# 不会相同。共用一个 generator 时，带种子的各行依次从同一个随机流各取 V 个数：“seed, batch”里还有另一个带种子的请求（seed=7），这个请求拿到的不再是单独跑时那一段，噪声不同，token 就不同。批里有谁、排第几行每步由调度器决定，用户看不到，所以“同一个种子、同样的输出”无从保证。vLLM 的 `_update_states` 为每个带 seed 的新请求创建 `torch.Generator` 并 `manual_seed(seed)`，`InputBatch` 按当前行号把它放进 `generators`；`random_sample` 先整批 `q.exponential_()`，再用每行自己的 generator 重填 `q[i]`。这个 generator 只在它的请求产出 token 时前进，所以单独、同批、分块三行全绿。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l07_q2", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q2（2 分）
#
# `random_sample` 取 $\arg\max_i p_i / q_i$，$q_i \sim \mathrm{Exp}(1)$ 独立。为什么这样抽到 token i 的概率恰好是 $p_i$？
#
# === BEGIN MARK SCHEME ===
#
# **评分**：
#
# - 2 分：两步都对。(a) $q_i/p_i$ 是速率为 $p_i$ 的指数变量（$P(q_i/p_i > t) = e^{-p_i t}$），且 $\arg\max_i p_i/q_i = \arg\min_i q_i/p_i$；(b) 独立指数变量中第 i 个最小的概率是 $p_i/\sum_j p_j = p_i$（指数竞赛）。用 Gumbel-max 推导并说明 $-\log q_i$ 服从 Gumbel 分布、$\arg\max(\log p_i - \log q_i)$ 即原式，同样 2 分。
# - 1 分：只有其中一步，或只说出“指数竞赛 / Gumbel-max 技巧”而没有理由，或推导中有一处实质错误。
# - 0 分：认为它只是近似按 p 抽样，或只回答速度（`torch.multinomial` 的同步）而没有回答分布。
#
# **参考答案**
#
# 令 $E_i = q_i/p_i$。$P(E_i > t) = P(q_i > p_i t) = e^{-p_i t}$，所以 $E_i$ 是速率 $p_i$ 的指数变量，彼此独立。$p_i/q_i = 1/E_i$，取最大就是取 $E_i$ 最小。独立指数变量中第 i 个最小（最先“到达”）的概率是 $p_i/\sum_j p_j$，而 probs 一行和为 1，所以正好是 $p_i$。$p_i = 0$（被掩码的 token）时 $E_i = \infty$，永远不会赢。这与 Gumbel-max 等价，是精确抽样，不是近似。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l07_q3", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q3（2 分）
#
# “检查方法”的 profiler 表里，为什么 top-p 一栏有 `aten::sort`、排了多少个元素，而只有 top-k 的一栏没有？请对照上面 `apply_top_k_top_p_pytorch` 的代码说明。
#
# === BEGIN MARK SCHEME ===
#
# **评分**：
#
# - 2 分：说清两点。(a) top-p 要按概率从大到小累加（softmax 后 `cumsum`，丢掉累积和 ≤ 1 − p 的 token），必须先把每行排好序（L388 的 `logits.sort`，每行 $O(V\log V)$）；表里是 [8, 32000]，排了 8 × 32000 = 256,000 个元素。(b) 只有 top-k 时只需每行第 k 大的值当阈值，`topk` 取前 k 个再比较即可，不必排整个词表（vLLM 的 PyTorch 版在允许同步时走 L384–L386 的 `apply_top_k_only`，minivllm 一律如此）。
# - 1 分：只说清其中一点；或只说“排序慢”，没有说出 top-p 为什么需要顺序或排了多少元素。
# - 0 分：把本机计时的倍数当作普遍结论（例如当作 GPU 上的结论），或说 top-k 一栏也排序。
#
# 指出 vLLM 只在允许同步（CPU）时才走不排序的 top-k、GPU 上只有 top-k 也排序，是加深，不要求。
#
# **参考答案**
#
# top-p 的定义是“按概率从大到小，留到累积概率越过 p 为止”，累积和要求概率已经排好序，所以 `apply_top_k_top_p_pytorch` 在有 top-p 时先 `logits.sort`（L388），再 softmax、`cumsum`、比较，最后 `scatter` 回原顺序。表里 [8, 32000] 的 logits 整行排序，共 256,000 个元素，每行 $O(V\log V)$。只有 top-k 时只要每行第 k 大的值：`topk` 取前 max k 个、`gather` 出第 k 个当阈值，再 `masked_fill`，不排序整个词表；vLLM 的 `apply_top_k_only`（L384–L386）就是这条路，它要读 `k.max()`，所以只在 CPU 上（没有 Triton 时）用。计时上 top-p 更慢，但倍数随负载变化，只看方向。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown]
# ## 评分规则
#
# - 代码 4 分：主路径 2 分（构造 logits 上的精确掩码与卡方分布检验 1 分、接入真实引擎 1 分）、边界条件 1 分、能映射回源码对象 1 分；
# - Q1～Q3 各 2 分，按每题的评分规则；
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
# ### 在真实 vLLM {{VLLM_VERSION}} 上看同一件事
#
# 第一张表：演示那行 logits（vLLM 一侧用 HF transformers 算）逐步经过 vLLM 的 `Sampler.apply_temperature`、`MinPLogitsProcessor`、`apply_top_k_top_p` 和你的函数。
#
# 第二张表是主路径评分的六个录制批之一：每行的掩码、带种子行的 token、原始 logprobs 都要与 vLLM 的 `Sampler` 相同。
#
# 这里直接构造 vLLM 的 `Sampler`，不经过 model runner。CPU 上批里不是每行都带种子时，`forward_cpu` 不读 `generators`（见下面的差异），所以第二张表用 `forward_native`。vLLM 源码在 `.venv-vllm` 的 site-packages/vllm 下。

# %%
L07.vllm_side_by_side(row, apply_min_p, apply_top_k_top_p, sample);

# %% [markdown]
# ### 参考资料
#
# - [vLLM sampler](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/sample/sampler.py)
# - [vLLM top-k/top-p sampler](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/sample/ops/topk_topp_sampler.py)
# - [vLLM built-in logits processors](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/sample/logits_processor/builtin.py)
# - [vLLM SamplingMetadata](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/sample/metadata.py)
# - [Model Runner V2 的采样器](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/worker/gpu/sample/sampler.py)
# - [The Curious Case of Neural Text Degeneration（top-p，Holtzman et al., ICLR 2020）](https://arxiv.org/abs/1904.09751)
# - [Turning Up the Heat: Min-p Sampling（Nguyen et al., 2024）](https://arxiv.org/abs/2407.01082)
# - [vLLM sampling parameters (current docs)](https://docs.vllm.ai/en/latest/api/vllm/sampling_params.html)
#
# 源码链接固定到本课对照的 commit；current docs 与默认参数会变化，部署前按目标版本重新核对。
#
# ### 与 vLLM {{VLLM_VERSION}} 的差异
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
# - **logits processor**：minivllm 的 allowed_token_ids、bad words、min_tokens、logit_bias、惩罚都按 vLLM 的顺序在 `apply_logits_processors`（由 `Sampler.forward` 调用）里直接做；vLLM 用 `MinTokensLogitsProcessor` 等对象。
# - **min-p 的状态**：vLLM 在 `MinPLogitsProcessor` 里，minivllm 在 `SamplingMetadata.min_p`。
# - **top-k 的“关闭”**：`SamplingParams.top_k` 默认都是 0；vLLM 的 `InputBatch.add_request` 把关闭的行存成词表大小，minivllm 存 0。
# - **种子的代价**：带种子的行逐行调用 `exponential_(generator=...)`，vLLM 的注释说它 “can be slow”；FlashInfer 不支持逐请求 generator。
# - **logprobs**：vLLM 另有 `logprobs=-1`（整个词表）和返回处理后 logits/logprobs 的模式；minivllm 只有原始 logprobs。
#
# ← 上一课：第 6 课：PagedAttention：Triton decode kernel　｜　下一课 →：第 8 课：结构化输出：grammar bitmask 与 CPU/GPU 重叠
