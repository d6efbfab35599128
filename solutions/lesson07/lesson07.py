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
# 本课产出：能说清一行 logits 从模型出来到变成一个 token 的全过程——先算响应里要报告的 logprobs（原始 logits 的 log_softmax），再做 logits processor / 惩罚、temperature、min-p、top-k、top-p，最后采样；知道这些参数为什么以**每个请求一行的张量**进入采样器（`SamplingMetadata`），带种子的请求为什么各有一个 `torch.Generator`，vLLM 为什么用“指数竞赛”而不是 `torch.multinomial` 采样，以及两条快速路径（没有请求用 top-p 时不排序；贪心行不参与随机采样）。亲手写出批量的 top-k/top-p/min-p 掩码和带种子的随机采样，并把它接进真实引擎。
#
# 通过要求：唯一代码填空题通过全部断言；Q1～Q3 都能沿源码对象给出因果链；能指出一个正确性不变量（带种子的请求无论和谁同批、是否分块 prefill，输出都相同；logprobs 与 temperature 无关）、一个性能边界（top-p 要对整个词表排序）和一个需要 benchmark 才能确认的结论（排序在多大的 batch × 词表上真正显著）；总分至少 8/10。
#
# | 部分 | 分值 | 评分方式 |
# |---|---|---|
# | 代码·主路径（构造 logits 上的精确掩码与卡方分布检验 1 分 + 接入真实引擎 1 分） | 2 | 自动 |
# | 代码·边界条件（并列值、top_p = 1、top_k = 词表大小、各行混合、不排序的快速路径） | 1 | 自动 |
# | 代码·能映射回源码对象（`SOURCE_MAP`） | 1 | 自动 |
# | Q1～Q3 | 各 2 | 人工，按评分规则 |
#
# 没有 nbgrader 时（例如 Colab），运行本课最后的“自检”单元格，或在终端执行 `python -m autograder check lesson07`（在本笔记本所在的文件夹或仓库根目录都可以），得分与教师用 nbgrader 评出的自动部分一致。

# %% [markdown]
# ## 源码版本与阅读方法
#
# 本课程使用固定 commit 的永久链接保证行号可复现。读采样器时沿着“一行 logits 的一生”读：先读 `Sampler` 的类 docstring（它按顺序列出了全部步骤），再读 `forward` 和 `sample`，最后才读 `topk_topp_sampler.py` 里的掩码与采样细节；不要从 FlashInfer / Triton 的分支开始读。
#
# | 顺序 | vLLM 文件与入口（8e958902eee5） | minivllm 对应文件 | 带着什么问题读 |
# |---|---|---|---|
# | 1 | [`vllm/v1/sample/sampler.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/sample/sampler.py)：`Sampler`（类 docstring 的 9 步）、`forward`、`apply_logits_processors`、`sample`、`apply_temperature`、`_SAMPLING_EPS` | `minivllm/sample/sampler.py`：`Sampler.forward` | logprobs 为什么在 temperature 之前算？贪心行和随机行在同一批里怎样各取所需？ |
# | 2 | [`vllm/v1/sample/ops/topk_topp_sampler.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/sample/ops/topk_topp_sampler.py)：`TopKTopPSampler.forward_native`、`apply_top_k_top_p_pytorch`、`apply_top_k_only`、`random_sample`、`sample_with_exponential_noise` | `minivllm/sample/sampler.py`：`apply_top_k_top_p`、`apply_top_k_only`、`random_sample` | top-k 和 top-p 在同一次排序里怎样先后执行？什么时候不排序？为什么不用 `torch.multinomial`？ |
# | 3 | [`vllm/v1/sample/logits_processor/builtin.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/sample/logits_processor/builtin.py)：`MinPLogitsProcessor.apply`、`MinTokensLogitsProcessor`、`LogitBiasLogitsProcessor`；`logits_processor/state.py`：`argmax_invariant` | `minivllm/sample/sampler.py`：`apply_min_p`；`Sampler.forward` 里的 `md.min_tokens` | 为什么 min-p 是“argmax 不变”的 processor，放在 temperature 之后，而 min_tokens 在贪心之前？ |
# | 4 | [`vllm/v1/sample/metadata.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/sample/metadata.py)：`SamplingMetadata`（`temperature`、`all_greedy`、`all_random`、`top_p`、`top_k`、`generators`、`max_num_logprobs`） | `minivllm/sample/metadata.py`：`SamplingMetadata`；`minivllm/worker/gpu_model_runner.py`：`_sampling_metadata` | 参数为什么是每行一个值的张量？不用 top-p 时 `top_p` 为什么是 None 而不是全 1？ |
# | 5 | [`vllm/v1/worker/gpu_input_batch.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/worker/gpu_input_batch.py)：`InputBatch.generators`、`add_request`（`request.generator`） | `minivllm/worker/gpu_input_batch.py`：`InputBatch.generators` | 带种子请求的 generator 在哪里创建（V1：`GPUModelRunner._update_states` 为 `SamplingType.RANDOM_SEED` 的新请求建 `torch.Generator` 并 `manual_seed`，放进 `CachedRequestState.generator`，`InputBatch.add_request` 再存进 `generators[req_index]`）、跟着请求还是跟着批内行号？ |
#
# ### 你的模型在 vLLM 0.27.1 里由哪个采样器采样
#
# > **minivllm ≠ vLLM：本课讲的是 V1 runner 的采样器。** `VllmConfig.use_v2_model_runner`（`vllm/config/vllm.py`）对 dense 的生成模型（课程的 Llama、Qwen3）在装了 Triton、且没有打开 V2 不支持的特性（n-gram 投机、自定义 logits processor、prompt embeds 等，见 `_get_v2_model_runner_unsupported_features`）时为真，这时跑的是 Model Runner V2（`vllm/v1/worker/gpu/model_runner.py`），它的采样器是 `vllm/v1/worker/gpu/sample/sampler.py` 的 `Sampler`：采样参数存在按槽位索引的 `SamplingStates`（`sample/states.py`，经 `idx_mapping` 读取），随机采样是 Triton 的 Gumbel-max（`sample/gumbel.py` 的 `gumbel_sample`）：每个请求一个 64 位 seed（用户没给就随机抽一个），噪声由 (seed, 该 token 的位置) 生成（`tl.randint(seed, pos)`）——**没有 `torch.Generator`**，可复现性来自“同一个 seed、同一个位置，同样的噪声”。本课下面讲的 `vllm/v1/sample/sampler.py`、`SamplingMetadata.generators`、`random_sample` 是 V1 runner（`gpu_model_runner.py`）的路径：V2 不支持的特性打开时、MoE 模型（不在 `DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES` 里）或没有 Triton 时走它；minivllm 实现的是它。
#
# 源码快照：vLLM 8e958902eee5。vLLM 在 `Sampler.forward` 里的顺序（类 docstring 第 1～8 步）：① 需要 logprobs 时先在**原始 logits** 上算（默认 `logprobs_mode = "raw_logprobs"`）；② 转 float32；③ allowed_token_ids 白名单；④ bad words；⑤ 非 argmax 不变的 logits processor（min_tokens、logit_bias）；⑥ 惩罚（repetition / frequency / presence）；⑦ `sample`：不是全随机时先算贪心 argmax（全贪心就直接返回）→ temperature（贪心行用 1 代替，避免除 0）→ argmax 不变的 processor（默认就是 min-p）→ top-k/top-p → 采样 → 温度低于 `_SAMPLING_EPS` 的行取贪心结果；⑧ 收集 top-n 与被采 token 的 logprobs。
#
# 与 vLLM 的差异：minivllm 没有惩罚、logit_bias、bad words、allowed_token_ids，min_tokens 直接在 `Sampler.forward` 里掩码（vLLM 是 `MinTokensLogitsProcessor`），min-p 是一个函数而不是 processor 对象；top-k 的“关闭”：`SamplingParams.top_k` 在两边的默认值都是 0（= 关闭；vLLM 仍接受旧写法 -1，温度低于 `_SAMPLING_EPS` 时也把它置 0），minivllm 批里也存 0，vLLM 的 `InputBatch.add_request` 则把关闭的行存成词表大小（`0 < top_k < vocab_size` 以外的都换成 `vocab_size`）；min-p 不是 `SamplingMetadata` 的字段，vLLM 把它放在内置的 `MinPLogitsProcessor` 自己的状态里，minivllm 的 `SamplingMetadata` 有 `min_p` 字段；vLLM 的掩码函数 `apply_top_k_top_p` 在 CPU 上有 Triton 时、或 GPU 上 batch ≥ 8 且有 Triton 时用 Triton 版 `apply_top_k_top_p_triton`，其余用 PyTorch 版 `apply_top_k_top_p_pytorch`（只有 top-k 时，它只在 `allow_cpu_sync`——CPU 上无 Triton——时走不排序的 `apply_top_k_only`，因为读 `k.max()` 是一次 GPU→CPU 同步；GPU 上照样排序）；CUDA 上支持 FlashInfer 采样时（`TopKTopPSampler.forward_cuda`），用了 top-k/top-p 且**没有任何带种子请求**的批交给 FlashInfer，批里一有种子就整批退回 PyTorch 版；CPU 上（`TopKTopPSampler.forward_cpu`）只要不是**每一行**都带种子（`len(generators) != logits.shape[0]`）就整批用 `compiled_random_sample`（torch.compile 过的竞赛，不读 `generators`——混合批里带种子的行在 CPU 上也不用自己的 generator）；minivllm 只有 PyTorch 版，只有 top-k 时一律走 `apply_top_k_only`（本课为此给引擎补上了这条快速路径）。

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
# 模型每步给每个请求一行 logits（词表大小 V 个实数）。采样器要做两件事：**报告**（用户要的 logprobs，必须是模型本身的分布）和**选择**（按该请求自己的参数——temperature、top-k、top-p、min-p、种子——挑出一个 token）。难点在于一批里每个请求的参数都不同：有的贪心、有的随机、有的带种子、有的用 top-p。逐请求循环会让 GPU 做一串小 kernel；vLLM 把参数变成**每行一个值的张量**（`SamplingMetadata.temperature[i]`、`top_k[i]`、`top_p[i]`；min-p 在 vLLM 里是 `MinPLogitsProcessor` 自己按行存的张量，minivllm 放在 `SamplingMetadata.min_p`），整批一次算完，只有带种子的行需要各自的 `torch.Generator`（V1；V2 用每请求的 seed，见上面的方框）。
#
# ### 2. 它如何工作
#
# 一行 logits 的一生（括号里是 vLLM / minivllm 的名字）：
#
# 1. **原始 logprobs**：`raw_logprobs = logits.log_softmax(-1)`，在任何变换之前（`compute_logprobs`，`logprobs_mode = "raw_logprobs"`）。所以 temperature、top-p 都不改变响应里的 logprobs。
# 2. **改变 argmax 的处理**：min_tokens（还没到最少 token 数时屏蔽 EOS/停止 token）、logit_bias、惩罚。它们必须在贪心 argmax 之前，因为贪心请求也受它们影响。
# 3. **贪心**：不是全随机时先算 `argmax`；全贪心（`all_greedy`）就此返回——随机采样整段被跳过。
# 4. **temperature**：`logits / T`（贪心行的 T 换成 1，避免除 0）。T < 1 让分布更尖，T > 1 更平。它作用在 **logits** 上：$\mathrm{softmax}(z/T) \propto p^{1/T}$。
# 5. **min-p**（argmax 不变）：概率低于 `min_p × 该行最大概率` 的 token 设为 -inf。阈值随分布的“自信程度”伸缩。
# 6. **top-k 与 top-p**（`apply_top_k_top_p`）：一次升序排序；top-k 用第 k 大的值做阈值（并列的都保留）；top-p 在**top-k 剩下的 token 上重新 softmax**，累积概率，丢掉累积和 ≤ 1 − p 的那些小 token——跨过 p 的那个 token 保留，最大的 token 永远保留。没有任何行用 top-p 时不排序：只有 top-k 时用 `topk(max k)` 取阈值（`apply_top_k_only`）。
# 7. **采样**：`probs = softmax(x)`，然后指数竞赛 `argmax(probs / q)`，`q ~ Exp(1)`：无种子的行整批一次 `q.exponential_()`，带种子的行用自己的 generator 覆盖自己那一行（`random_sample`）。
# 8. **合并**：温度低于 `_SAMPLING_EPS = 1e-5` 的行取第 3 步的贪心结果。
#
# ### 3. 正确性条件与常见误区
#
# - **logprobs 在 temperature 之前**：它描述模型，而不是采样器；放到 temperature 之后，同一个 prompt 换个温度，报告的 logprob 就变了。
# - **temperature 在 softmax 之前**：把概率除以 T 只是整行缩放，不改变竞赛的胜者，温度等于没有作用。
# - **top-p 保留跨过 p 的 token**：“最小的、累积概率 ≥ p 的集合”包含让累积和跨过 p 的那个 token；只保留累积和严格 < p 的 token 会少一个，p 很小时甚至一个都不剩（所以最大的 token 强制保留）。
# - **top-p 在 top-k 之后、在剩下的 token 上重新归一化**：vLLM 把 top-k 填成 -inf 之后再 softmax；在整个词表的概率上做 top-p 会多砍。
# - **min-p 对最大概率，不是对总和**：总和永远是 1，那样阈值就成了固定的 min_p。
# - **每个带种子的请求一个 generator**：整批共用一个 generator 时，一个请求拿到的随机数取决于它前面排了几行。
#
# ### 4. 性能与工程取舍
#
# - 排序是 top-p 的主要成本：每行 $O(V\log V)$，V 常是 15 万；top-k 单独时 `topk(max k)` 便宜得多；都不用时整段跳过（`top_p`、`top_k` 是 None，而不是全 1 / 全 0 的张量——“没人用”是一个 Python 判断，不是一次 kernel）。
# - `torch.multinomial` 在 CUDA 上会引起 CPU-GPU 同步（vLLM `random_sample` 的注释），而指数竞赛只是逐元素运算加一次 argmax，能和其他 kernel 排队异步执行；它也让“带种子的行”只是用另一个 generator 填自己那一行噪声。
# - 带种子的行要逐行调用 `exponential_(generator=...)`（vLLM 的 TODO：“can be slow”），种子请求多时这是一个 Python 循环；FlashInfer 的采样 kernel 不支持逐请求 generator，有种子时 vLLM 退回 PyTorch 版。

# %% [markdown]
# ## 具体演示：一行真实 logits 经过每一步
#
# 下面的图和表由真实引擎产生：把你的 `sample` 接进引擎，截下 prompt `"JULIET:\nO Romeo"` 贪心生成到第 6 个 token 时的那行 logits（词表 V = 4096），再按采样器的顺序依次做 temperature 0.8、min_p 0.1、top_k 12、top_p 0.6（用你在练习里写的函数；先完成练习再运行本节）。

# %% [markdown]
# ## 实践任务：唯一代码填空题
#
# 下面是 vLLM `Sampler.sample`、`apply_top_k_top_p_pytorch`、`apply_top_k_only`、`MinPLogitsProcessor.apply` 与 `random_sample` 的精简版，接口与 minivllm 的 `SamplingMetadata` 相同（`md.temperature`、`md.top_k`（0 = 关闭）、`md.top_p`、`md.min_p`、`md.generators`、`md.max_num_logprobs`；不用某个参数时它是 None）。10 处 `______` 都是决策点：min-p 的阈值、不排序的 top-k 阈值、排序后的 top-k 阈值、top-p 用哪些概率、丢哪些 token、带种子行的噪声、竞赛的胜者（整行 return）、logprobs 在哪里算、temperature 作用在哪里、返回时哪些行取贪心结果（整行 return）。
#
# 只能修改 TODO/______ 位置，不得删除断言或放宽通过条件。

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

# %%
row = L07.engine_logits(sample)
stages = L07.transform_stages(row, apply_min_p, apply_top_k_top_p)
L07.print_stages(stages)
L07.plot_stages(stages);

# %% [markdown]
# 图 7-1：同一行真实 logits 在每一步之后的分布（横轴按原始概率排名的前 30 个 token，标题里是还剩多少个 token 有概率）。temperature 0.8 让头部更高、尾部更低（token 数不变）；min-p 按“最大概率的 10%”砍掉长尾；top-k 12 只留 12 个（并列的会多留）；top-p 0.6 在剩下的 token 上重新归一化后，只留累积到 0.6 的最前几个——包括跨过 0.6 的那个。每一步之后剩下的 token 都重新归一化，所以柱子越砍越高。

# %% [markdown]
# 第一项检查：构造的 logits，结果完全确定。8 行、词表 10，每行自己的 top_k / top_p / min_p（0、1 表示关闭，混在一批），与一个按定义逐行计算的 float64 参考比较保留下来的 token 集合；再检查贪心行取 argmax、temperature → 0 等于贪心、logprobs 等于原始 logits 的 log_softmax、种子相同的两行抽出相同的序列。隐藏测试再做分布检验：同一行 logits 复制 3000 行（每 3 行一行带种子），四组参数下的频数与精确的截断分布做卡方检验（固定种子）。

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
# 第二项检查：把你的 `sample` 接进真实引擎。`L07.check_real_engine` 在一个上下文管理器里把 runner 使用的 `Sampler`（`minivllm/worker/gpu_model_runner.py` 模块里的名字）换成一个包装：它调用你的 `sample(logits, md)`，再用引擎的 `gather_logprobs` 从你返回的 `raw_logprobs` 里取 top-n 与被采 token 的 logprob；退出时恢复原来的类。检查：带种子的请求单独跑、与贪心/无种子/另一种子的请求同批、在 chunked prefill（每步 4 个 token）下，输出完全相同；temperature 1e-4 等于贪心；profiler 在只有 top-k 的步里看不到 `aten::sort`、在有 top-p 的步里看得到；logprobs 等于 HF transformers 在同一序列上原始 logits 的 log_softmax（采样时 temperature = 0.7）。

# %% nbgrader={"grade": true, "grade_id": "l07_real_engine", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
L07.check_real_engine(sample)
print("真实引擎检查通过：种子输出与批组成、分块无关；T→0 等于贪心；只有 top-p 时才排序；logprobs 等于 HF 的原始分布。")

# %% [markdown]
# ## 检查方法
#
# 运行断言；再看下面两组真实运行。第一组：同一个 seed=1234 的请求，单独跑、和 3 个参数各异的请求同批（它排在第 4 行）、在每步只有 4 个 token 的 chunked prefill 下跑，以及不带种子跑两次。第二组：profiler 看到的算子与中位时间，top-k 单独 vs top-p，[8, 32000] 的 logits，A B A B 交替、预热后取中位数。解释：为什么带种子的三行完全相同、不带种子的两行不同；为什么 top-p 一栏多出了 `sort`，它贵多少。

# %%
runs = L07.seed_demo(sample)
L07.print_seed_demo(runs)
L07.plot_seed_demo(runs);

# %% [markdown]
# 图 7-2：每个输出位置上是否与“seed, alone”的 token 相同（绿 = 相同）。带种子的请求不论同批的是谁、prefill 分几步，都从自己的 generator 取噪声，而且只在产出 token 的那一步取一次（minivllm 的分块 prefill 中间块不采样），所以三行全绿；不带种子的请求用全局随机数，两次运行在第一个随机分叉处就不同了。
#
# > **minivllm ≠ vLLM**：vLLM V1 对分块 prefill 的中间块**也采样**（每个请求都取最后一个 token 的 logits），再用 `discard_request_mask` 丢掉结果，并在 `_bookkeeping_sync` 里把这个请求的 generator 的偏移往回拨（`gen.set_offset(gen.get_offset() - 4)`），让丢掉的那次采样不推进它的随机流；Model Runner V2 的噪声只由 (seed, 位置) 决定，不存在要回拨的状态。“与批组成无关”也不是 vLLM 默认承诺的：它的 reproducibility 文档说默认为了性能不保证可复现（批不变的 kernel 要 `VLLM_BATCH_INVARIANT=1`），GPU 上不同的批形状可能选到不同的 kernel，logits 本身就可能有浮点差异；本课的 CPU 运行里 logits 与批组成无关，所以图里全绿。

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
# 评分规则中的“能映射回源码对象”（1 分）在这里自动评分：在 vLLM 8e958902eee5 中找到实现每个概念的名字（函数、类、常量、字段名或取值，字符串；大小写不限）。
#
# - `greedy_pick`：`Sampler` 里给 temperature 低于阈值的行取 argmax 的静态方法；
# - `no_seed_fast_path`：CUDA 上一批请求用了 top-k/top-p、又没有任何带种子的请求时，`TopKTopPSampler` 把整批交给的函数；
# - `argmax_safe`：logits processor 接口里声明“这个 processor 不会改变 argmax”的方法（min-p 就是这样，全贪心的批因此不必调用它）；
# - `processed_mode`：`logprobs_mode` 的一个取值：返回的 logprobs 来自经过 temperature 与掩码处理之后的 logits；
# - `sampled_rank`：`Sampler` 用来算被采 token 名次（一行里 logprob 不小于它的 token 个数）的函数；
# - `fp64_noise`：`TopKTopPSampler` 的一个构造参数：竞赛用的指数噪声以 float64 生成。

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
# 为什么 vLLM 给每个带种子的请求一个自己的 `torch.Generator`（`SamplingMetadata.generators`，按批内行号索引），而不是在每步开始时 `torch.manual_seed(...)` 一次、或整批共用一个 generator？请结合图 7-2 和 chunked prefill 说明“同一个种子、同样的输出”要成立需要哪些条件。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 说清种子的语义是“这个请求的输出只由它自己的 prompt、参数和 seed 决定”，而批的组成（谁同批、排在第几行、batch 多大）每步都由调度器决定、对用户不可见；共用一个 generator（或每步全局设种子）时，某行拿到的随机数取决于它前面有多少行消耗了随机数，批一变输出就变（本课 `one_generator_for_the_batch`）；每个请求一个 generator，状态随请求走（vLLM V1：`GPUModelRunner._update_states` 用 `SamplingParams.seed` 创建并 `manual_seed`，经 `CachedRequestState.generator` 由 `InputBatch.add_request` 存进 `generators[行号]`；说“在 add_request 时创建”只得一半的对象分——它只存，不建；行号变了只是 `generators` 字典的键变），每产出一个 token 从它取一次 V 个指数数；并指出成立条件：chunked prefill 的中间块不消耗随机流（minivllm：不采样；vLLM V1：采样后丢弃并把 generator 偏移回拨，`gen.set_offset(gen.get_offset() - 4)`——两种说法都给分，只要说清是哪个系统），抢占后重算（generator 跟着请求状态，恢复后继续同一序列），以及 logits 本身在不同批组成下数值相同（批不变性；vLLM 默认**不**承诺跨批组成可复现，reproducibility 文档要求批不变模式 `VLLM_BATCH_INVARIANT=1` 等设置；回答“vLLM 默认保证与批组成无关”不得这一点）。指出 vLLM 0.27.1 的 Model Runner V2（课程的 dense 模型默认用它）不用 `torch.Generator`、而是按 (每请求 seed, 位置) 生成 Gumbel 噪声（`vllm/v1/worker/gpu/sample/gumbel.py`），并以此回答同一个问题，同样给满分；1 分 = 只说“为了可复现”，没有说清共用时为什么依赖批组成，或没有提到 chunked prefill / 行号变化；0 分 = 认为设一次全局种子就够了（一票否决：只背类名而说不清状态所有权）。
#
# **参考答案**
#
# 1. 种子的承诺是请求级的：同一个 prompt + 参数 + seed，不论服务端此刻还在处理什么，输出都相同。批的组成由调度器每步决定：这个请求可能单独跑，也可能排在第 4 行、前面有贪心、无种子、另一种子的请求。
# 2. 共用一个 generator：`q` 的每一行按顺序从同一个随机流取数，第 i 行拿到哪一段取决于前面 i 行消耗了多少——批一变，噪声就变，token 就变。每步全局 `manual_seed(seed)` 也不行：同批有两个不同种子的请求时无法同时满足，而且同一个种子的请求每一步都会拿到同一段噪声。
# 3. vLLM V1 的做法：`GPUModelRunner._update_states` 为带 seed 的新请求创建 `torch.Generator` 并 `manual_seed(seed)`，放在 `CachedRequestState.generator` 里，`InputBatch.add_request` 把它存进 `generators[行号]`；请求在批内换行（condense、有请求结束）时只是字典的键变了，generator 的状态跟着请求走。`random_sample` 先对整批 `q.exponential_()`（无种子的行），再对每个带种子的行用它自己的 generator 覆盖 `q[i]`：每产出一个 token，恰好消耗 V 个指数数。
# 4. 成立条件：chunked prefill 的中间块不能推进随机流——minivllm 不为它取 logits、不进采样器（图 7-2：chunked 一行与 alone 完全相同）；vLLM V1 照样为它采样，再丢掉结果（`discard_request_mask`）并把 generator 偏移回拨（`gen.set_offset(gen.get_offset() - 4)`）；V2 的噪声是 (seed, 位置) 的函数，不受影响。logits 在不同批组成下要数值相同：CPU 上本课成立；GPU 上不同 batch 形状可能选不同 kernel、产生浮点差异，vLLM 的 reproducibility 文档明说默认不保证可复现，要批不变（`VLLM_BATCH_INVARIANT=1`）等设置。另外 vLLM V1 在 CPU 上只要批里不是每行都带种子，就整批走 `compiled_random_sample`、不读 `generators`。无种子的行则不需要可复现，整批一次生成噪声最快。
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
# **评分要点**：2 分 = 正确性：$q_i \sim \mathrm{Exp}(1)$ 时 $q_i/p_i \sim \mathrm{Exp}(p_i)$，argmax $p_i/q_i$ = argmin $q_i/p_i$，独立指数变量中第 i 个最小的概率是 $p_i/\sum_j p_j = p_i$（指数竞赛；等价于 Gumbel-max）；成本：`torch.multinomial` 在 CUDA 上会引起 CPU-GPU 同步（vLLM 源码注释），打断异步执行与 CUDA graph / async scheduling 的流水，而竞赛只是逐元素的 exponential_、除法和一次 argmax，全在 GPU 上排队；带种子的行只需用自己的 generator 填自己那一行噪声，批量与种子两全；并说出卡方检验（3000 次、精确截断分布）能区分正确与错误的竞赛（乘以噪声不是从 p 抽样：`multiply_by_noise` 被拒）；1 分 = 只说“更快”或只给出正确性而无成本链；0 分 = 认为竞赛是近似采样或改变了分布（一票否决：混淆算法正确性与性能）。
#
# **参考答案**
#
# 1. 正确性：若 $q_i \sim \mathrm{Exp}(1)$ 独立，则 $E_i = q_i/p_i \sim \mathrm{Exp}(\text{rate}=p_i)$。独立指数变量里第 i 个最先“到达”（最小）的概率是 $p_i/\sum_j p_j$。$\arg\max_i p_i/q_i = \arg\min_i E_i$，所以抽到 i 的概率正好是 $p_i$（$p_i = 0$ 的 token 永远不会赢，所以 -inf 掩码直接生效）。这与 Gumbel-max（$\arg\max \log p_i + g_i$）等价。
# 2. 成本：vLLM 的 docstring 写明 `torch.multinomial` 会引起 CPU-GPU 同步。采样在每步的关键路径上，一次同步会让 CPU 等 GPU 跑完前向，打断 async scheduling（下一步的调度与这一步的 GPU 计算重叠）和 kernel 排队；竞赛只是 `exponential_`、`div`、`argmax` 三个逐元素/归约 kernel，没有同步，可以进 CUDA graph。
# 3. 种子：噪声是一个与 probs 同形的张量，带种子的行用自己的 generator 覆盖自己那一行即可（`q[i].exponential_(generator=gen)`），批量和逐请求可复现同时成立；multinomial 每次调用只接受一个 generator。
# 4. 本课：卡方检验在四组参数下（3000 次、固定种子）检验你的输出频数与精确的截断分布一致；`multiply_by_noise`（argmax $p\cdot q$）偏向高概率 token，被卡方检验拒绝——“看起来随机”不等于按 p 抽样。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l07_q3", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q3（2 分）
#
# top-p 的代价是什么，vLLM 什么时候跳过它？请用“检查方法”里 profiler 的算子列表和中位时间说明，并指出 `SamplingMetadata` 的哪个设计让“没人用”的判断不花一次 kernel；再说明只用 top-k 时 vLLM 在 CUDA 和 CPU 上分别做什么。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 代价：top-p 需要每行按概率排序（`logits.sort`，$O(V\log V)$，V 常达 15 万）再 softmax、cumsum、scatter 回原位，引用本机实测（profiler 在 top-p 一栏出现 `aten::sort`，中位时间是只有 top-k 的若干倍，以学生自己的数字为准）；跳过：runner 构造 `SamplingMetadata` 时，批里没有任何请求 `top_p < 1` 就把 `top_p` 设为 None（`top_k` 同理），`apply_top_k_top_p` 在 p、k 都是 None 时原样返回，p 是 None 而 k 不是时走 `apply_top_k_only`（`topk(max k)` 取第 k 大的值，无全排序），全贪心时整个随机采样（含掩码）都被跳过；并说出 vLLM 的平台差异：CUDA 上 batch ≥ 8 且有 Triton 时用 Triton 版，小 batch 用 PyTorch 版且只有 top-k 时仍排序（`apply_top_k_only` 要读 max k，需要一次 GPU→CPU 同步，只在 `allow_cpu_sync`（CPU 平台）时用），CUDA 上支持 FlashInfer 且批里没有带种子请求时走 FlashInfer；一个 top-p 请求就让整批排序（说 Model Runner V2 的 `Sampler` 也是先查有没有请求用 top-k/top-p、没有就跳过，也对）；1 分 = 只说“排序慢”没有数字或没有说明 None 的判断；0 分 = 认为 top-p=1 的请求也要排序且无法避免，或把本机毫秒数当作 GPU 上的结论（一票否决：把单一负载的实测写成普遍结论）。
#
# **参考答案**
#
# 1. 代价：`apply_top_k_top_p` 对 [batch, V] 的 logits 整行升序排序（记下 `logits_idx`），在排好的值上做 top-k 阈值、softmax、cumsum、比较，再 `scatter` 回原顺序。排序是 $O(V\log V)$ 且要额外一份 [batch, V] 的值和下标。本机 [8, 32000]：top-p 一栏的算子里有 `sort`，只有 top-k 时只有 `topk`、`gather`、`masked_fill`，中位时间约是后者的数倍（以你的输出为准；GPU 上比例不同，要在目标硬件上测）。
# 2. 跳过：minivllm 的 `_sampling_metadata`、vLLM V1 的 `InputBatch._make_sampling_metadata`（`InputBatch` 维护 `top_p_reqs` 集合，`no_top_p` 属性判断它是否为空）只在批里有请求用 top-p 时才给出 `top_p` 张量，否则是 None；`apply_top_k_top_p` 开头的 `if p is None` 是一次 Python 判断，不启动任何 kernel。只要批里有一个请求用 top-p，整批都排序（其余行 p = 1，不砍任何 token，但排序照做）。全贪心时 `Sampler.sample` 在 temperature 之前就返回了，掩码与竞赛全部跳过；混合批里的贪心行参与竞赛但结果被 `torch.where` 换成 argmax。
# 3. 只有 top-k：`apply_top_k_only` 用 `topk(max k)` 取每行第 k 大的值做阈值，不排序整个词表；它要读 `k.max()`，是一次 GPU→CPU 同步，所以 vLLM 只在 CPU 平台（`allow_cpu_sync=True`）走它，CUDA 上无 Triton 的小 batch 仍排序，batch ≥ 8 时用 Triton 版 `apply_top_k_top_p_triton`；CUDA 上支持 FlashInfer 时，没有带种子请求的 top-k/top-p 批走 `forward_cuda` 里的 FlashInfer 采样，不做全词表排序；批里有一个带种子的请求就整批退回 PyTorch 版（FlashInfer 不支持逐请求 generator）。minivllm 只有 PyTorch 版，只有 top-k 时一律走 `apply_top_k_only`。
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
# 总分 10 分，至少 8 分通过。参考答案与参考代码只在教师分支（solutions/）中：先独立完成；核对后请换一组参数（另一个 temperature、k、p、min_p）重新推演，不能只复制。
#
# ### 自检
#
# 下面的单元格用与 nbgrader 相同的检查函数给代码部分打分（Q1～Q3 显示为待人工评分）。

# %%
self_check("lesson07", globals());

# %% [markdown]
# ## 参考资料
#
# - [vLLM sampler](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/sample/sampler.py)
# - [vLLM top-k/top-p sampler](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/sample/ops/topk_topp_sampler.py)
# - [vLLM built-in logits processors](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/sample/logits_processor/builtin.py)
# - [vLLM SamplingMetadata](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/sample/metadata.py)
# - [The Curious Case of Neural Text Degeneration（top-p，Holtzman et al., ICLR 2020）](https://arxiv.org/abs/1904.09751)
# - [Turning Up the Heat: Min-p Sampling（Nguyen et al., 2024）](https://arxiv.org/abs/2407.01082)
# - [vLLM sampling parameters (current docs)](https://docs.vllm.ai/en/latest/api/vllm/sampling_params.html)
#
# 源码链接固定到本课审阅 commit；current docs 与默认参数会变化，面试或部署前必须按目标版本重新核对。
#
# ← 上一课：第 6 课：PagedAttention：Triton decode kernel　｜　下一课 →：第 8 课：结构化输出：grammar bitmask 与 CPU/GPU 重叠
