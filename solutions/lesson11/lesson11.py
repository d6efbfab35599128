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
# # 第 11 课：CUDA Graph 与动态形状
#
# ## 本课目标与通过标准
#
# 本课产出：能说清一个 decode 批次怎样从“每步几十上百次 kernel launch”变成“一次 graph replay”——谁决定这一步跑哪个捕获尺寸（V1 runner 的 `CudagraphDispatcher`；Model Runner V2 的 `ModelCudaGraphManager`）、graph 读的静态输入缓冲属于谁（vLLM：runner 的持久输入缓冲；minivllm：`GPUModelRunner` 的 `cg_*` 张量）、填充行为什么必须无害（slot 为 `PAD_SLOT_ID`、长度为 0、位置在范围内）、采样前怎样只留下真实行；亲手写出这三步，并把它们接进真实引擎，让 minivllm 的 `enforce_eager=False` 路径用你的函数填充每个 decode 批次。
#
# 通过要求：唯一代码填空题通过全部断言；Q1～Q3 都能沿源码对象给出因果链；能指出一个正确性不变量（填充后生成的 token 与不填充逐个相同，填充行不写任何 KV 块）、一个性能边界（填充行也要算：一个 5 请求的批次按 8 行算）和一个需要 benchmark 才能确认的结论（在哪些 batch 大小上 graph 真的比 eager 快）；总分至少 8/10。
#
# | 部分 | 分值 | 评分方式 |
# |---|---|---|
# | 代码·主路径（选尺寸与填充一个批次 1 分 + 接入真实引擎：填充后的贪心 token 与不填充相同 1 分） | 2 | 自动 |
# | 代码·边界条件（正好一个尺寸、超过最大尺寸、上一批的残留、填充行不写 KV） | 1 | 自动 |
# | 代码·能映射回源码对象（`SOURCE_MAP`） | 1 | 自动 |
# | Q1～Q3 | 各 2 | 人工，按评分规则 |
#
# 本课在 CPU 上运行：CPU 没有 CUDA graph，但 minivllm 在 `enforce_eager=False` 时走与 GPU 完全相同的填充路径，只是把 “replay” 换成对同一组静态缓冲的一次 eager 前向（`CUDAGraphWrapper` 的 CPU 分支）。所以选尺寸、填缓冲、取真实行这三步在 CPU 上就能完整检查；launch 次数和真正的加速只有 GPU 能给出（本课最后一节）。没有 nbgrader 时（例如 Colab），运行本课最后的“自检”单元格，或在终端执行 `python -m autograder check lesson11`（在本笔记本所在的文件夹或仓库根目录都可以）。

# %% [markdown]
# ## 源码版本与阅读方法
#
# 本课程使用固定 commit 的永久链接保证行号可复现，同时链接 current docs 供核对最新变化。读 CUDA graph 时沿着“一个 decode 批次的一步”读：它有几个 token、被映射到哪个捕获尺寸、真实行和填充行各写进静态缓冲的哪里、replay 之后哪几行交给采样；不要从 torch.compile 的 piecewise 切分开始读。
#
# | 顺序 | vLLM 文件与入口（8e958902eee5） | minivllm 对应文件 | 带着什么问题读 |
# |---|---|---|---|
# | 1 | [`vllm/config/compilation.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/config/compilation.py)：`CompilationConfig.cudagraph_capture_sizes`、`max_cudagraph_capture_size`、`cudagraph_mode`（`FULL_DECODE_ONLY`） | `minivllm/config.py`：`CompilationConfig`、`set_cudagraph_sizes`、`cudagraph_capture_sizes`、`enforce_eager` | 默认捕获哪些尺寸（`[1, 2, 4]` + 8 的倍数 + 16 的倍数），上限由什么决定？为什么不是每个 batch 大小都捕获？ |
# | 2 | [`vllm/v1/cudagraph_dispatcher.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/cudagraph_dispatcher.py)：`CudagraphDispatcher._compute_bs_to_padded_graph_size`、`_bs_to_padded_graph_size`、`dispatch`、`get_capture_descs` | `minivllm/compilation/cuda_graph.py`：`CudagraphDispatcher`、`padded_size`、`dispatch`、`get_capture_descs`、`BatchDescriptor` | 一个 5 请求的 decode 批次跑哪个 graph？超过最大尺寸、或含 prefill 的批次呢？ |
# | 3 | [`vllm/compilation/cuda_graph.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/compilation/cuda_graph.py)：`CUDAGraphWrapper.__call__`（capture 与 replay 两条分支）；[`vllm/forward_context.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/forward_context.py)：`BatchDescriptor` | `minivllm/compilation/cuda_graph.py`：`CUDAGraphWrapper`、`capture`、`CUDAGraphEntry` | graph 记录的是哪些张量的地址？replay 时为什么只能改这些张量的内容、不能换张量？ |
# | 4 | [`vllm/v1/worker/gpu_model_runner.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/worker/gpu_model_runner.py)：`_determine_batch_execution_and_padding`、`_prepare_inputs`（`seq_lens[num_reqs:].fill_(0)`、`logits_indices`）、`_get_slot_mappings`（填充行的 slot 为 -1）、`capture_model`、`_capture_cudagraphs`、`_dummy_run` | `minivllm/worker/gpu_model_runner.py`：`_init_cudagraph_state`、`_pad_for_cudagraph`、`_model_forward`、`capture_model` | 静态缓冲由谁拥有、何时分配？填充行的 token、位置、slot、长度各填什么才无害？replay 之后怎样只取真实行？ |
# | 5 | [`vllm/config/vllm.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/config/vllm.py)：`VllmConfig.use_v2_model_runner`；[`vllm/v1/worker/gpu/cudagraph_utils.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/worker/gpu/cudagraph_utils.py)：`BatchExecutionDescriptor`、`CudaGraphManager.dispatch`、`ModelCudaGraphManager.capture`、`CudaGraphManager.run_fullgraph`、`get_uniform_token_count` | —（minivllm 的 runner 与图管理对应 V1） | 本课的模型在 vLLM 0.27.1 上由哪个 runner 跑？V2 的分派返回什么、在哪里录图？ |
#
# 源码快照：vLLM 8e958902eee5。与 vLLM 的差异：vLLM 默认 `FULL_AND_PIECEWISE`——decode 批次用整图（FULL），其余批次用 torch.compile 切出的分段图（PIECEWISE）；minivllm 没有 torch.compile，只实现 `FULL_DECODE_ONLY`：只有“每个请求恰好 1 个 token”的 decode 批次被填充并 replay，其余批次 eager。vLLM 的静态缓冲就是 runner 的持久输入（`input_ids`、`positions`、`seq_lens`、块表与 slot mapping），在 `_prepare_inputs` 里就地写入；minivllm 另设一组 `cg_*` 缓冲，在 `_pad_for_cudagraph` 里一次填好（本课的练习正是这一步）。vLLM 的尺寸表是数组 `_bs_to_padded_graph_size`（批大小 → 尺寸，一次查表），minivllm 用 `padded_size` 现算。CPU 上 minivllm 的 “replay” 是对同一组缓冲的 eager 调用，vLLM 在 CPU 上不用 CUDA graph。
#
# > **vLLM 0.27.1 实际用哪个 graph 管理器？** 上表第 2～4 行是 V1 runner（`gpu_model_runner.py`）的路径。在 0.27.1，`VllmConfig.use_v2_model_runner`（`config/vllm.py`）对 dense 的 generate 模型（本课程加载的每个模型）在装有 Triton、且没有打开 V2 尚不支持的特性（`_get_v2_model_runner_unsupported_features`：n-gram 投机等；MoE 模型默认也不走 V2）时选 Model Runner V2（`v1/worker/gpu/model_runner.py`）。V2 不用 `CudagraphDispatcher`：它的 `ModelCudaGraphManager`（`v1/worker/gpu/cudagraph_utils.py`）在启动时用显式的 `capture` 为每个 `BatchExecutionDescriptor`（`cg_mode`、`num_tokens`、`num_reqs`、`uniform_token_count`）录一个 graph；每步 `dispatch(num_reqs, num_tokens, uniform_token_count, num_active_loras)` 返回匹配的描述符，没有匹配时返回 `cg_mode` 为 `NONE` 的描述符（这一步 eager）；整图由 `run_fullgraph` 直接 replay，分段图由 `run_pw_graph` 交给 torch.compile 过的模型。选尺寸、填充无害行、只取真实行这三件事两个 runner 都做；本课的练习与表格沿 V1 的名字讲（minivllm 对应 V1），而你在 GPU 上用 vLLM 0.27.1 跑 Llama 时，执行的是 V2 这一套。
# >
# > **minivllm ≠ vLLM（本课涉及的差异）**
# > - 分派的返回值：minivllm 的 `dispatch` 在不用 graph 时返回 None；vLLM V1 的 `CudagraphDispatcher.dispatch` 总是返回 `(CUDAGraphMode, BatchDescriptor)`，不用 graph 时是 `(CUDAGraphMode.NONE, BatchDescriptor(num_tokens))`；V2 返回一个 `BatchExecutionDescriptor`。
# > - 在哪里录图：minivllm 用显式的 `CUDAGraphWrapper.capture`；vLLM V1 的 `CUDAGraphWrapper` 在 `__call__` 里录——`capture_model` → `_capture_cudagraphs` 用每个尺寸调 `_dummy_run`，包装器第一次见到某个 `BatchDescriptor` 时录制，之后同一描述符直接 replay。
# > - 什么是 uniform decode：minivllm 只认“每个请求恰好 1 个 token”；vLLM 里 uniform decode 的每请求 query 长度是 `1 + num_speculative_tokens`，投机解码时每个请求 1 + k 个 token 的批次也是 uniform decode，尺寸按 token 数（请求数 × (1 + k)）算。
# > - 混合批次也能录整图：minivllm 只实现 `FULL_DECODE_ONLY`；vLLM 的 attention 后端声明自己的 `AttentionCGSupport`，`ALWAYS`（Triton 后端、FlashAttention 3）表示整图也能装下 prefill 与 decode 混合的批次，`cudagraph_mode=FULL` 时混合批次按 token 数填充后 replay 整图；默认的 `FULL_AND_PIECEWISE` 对 decode 批次用整图、其余批次用分段图。

# %% nbgrader={"grade": false, "grade_id": "l11_setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
# 准备（锁定）：静音无害的警告（评分单元格不能写 stderr）。
import logging
import os
import warnings

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

import torch  # noqa: E402

from autograder import lesson11 as L11  # noqa: E402
from autograder.common import ______, report, self_check, short_errors  # noqa: E402,F401

short_errors("lesson11")  # 评分单元格失败时只显示三行：哪一部分、错在哪、第一处不符（完整 traceback：%tb）
from minivllm.compilation.cuda_graph import PAD_SLOT_ID  # noqa: E402,F401

# %% [markdown]
# ## 核心心智模型
#
# ### 1. 它是什么，解决什么问题
#
# 一次 decode 前向是几十上百个小 kernel（每层的 RMSNorm、QKV 投影、rotary、写 KV、attention、输出投影、MLP……）。batch 小时每个 kernel 只跑几微秒，而 CPU 端每次 launch（Python、PyTorch 调度、CUDA 驱动）也要几微秒：GPU 大部分时间在等 CPU 发下一个 kernel。CUDA graph 把一次前向的全部 kernel **录制**一次，之后每步只需一次 `cudaGraphLaunch` **replay**，CPU 开销从“每个 kernel 一次”降到“每步一次”。
#
# 代价是 graph 是**静态**的：录制时每个 kernel 的参数（张量地址、形状、grid 大小）都被固定下来。于是 (1) 输入必须放在录制时的那组张量里（静态缓冲），每步只改内容；(2) 形状必须与录制时相同——batch 大小是动态的，所以只录制几个尺寸（`cudagraph_capture_sizes`），每个批次**填充**到能装下它的最小尺寸。
#
# ### 2. 它如何工作
#
# 一个 decode 批次的一步（括号里是 minivllm / vLLM 的名字）：
#
# 1. **启动时捕获**：`capture_model` 对每个捕获尺寸（从大到小，`get_capture_descs`）用静态缓冲做一次预热前向、再录制一个 graph，按 `BatchDescriptor` 存起来（minivllm：显式的 `CUDAGraphWrapper.capture`；vLLM V1：`_dummy_run` 调用包装器，`CUDAGraphWrapper.__call__` 第一次见到这个描述符时录制）。
# 2. **分派**：每步 `CudagraphDispatcher.dispatch(num_tokens, uniform_decode)`：在 `FULL_DECODE_ONLY` 下，只有 uniform decode 批次（minivllm：每个请求恰好 1 个 token；vLLM：每个请求 `1 + num_speculative_tokens` 个）且 `num_tokens` 不超过最大尺寸，才分到一个 `BatchDescriptor(size)`，`size` 是能装下它的**最小**捕获尺寸；否则这一步 eager（minivllm 返回 None；vLLM 返回 `(CUDAGraphMode.NONE, BatchDescriptor(num_tokens))`）。
# 3. **填充**：`_pad_for_cudagraph` 把真实的 n 行（token、位置、slot、序列长度、块表）拷进静态缓冲的前 n 行，把 `n..size` 的填充行设成无害的值：token 0、位置 0、slot `PAD_SLOT_ID`（-1：写 KV 时跳过）、长度 0（attention 什么都不读，输出 0）；块表先整片清零，不留上一批的块号。
# 4. **replay**：`CUDAGraphWrapper(desc, ...)` 回放 `size` 行的 graph（CPU 上是对同一组缓冲的一次 eager 前向）。
# 5. **只取真实行**：输出有 `size` 行，只有前 n 行交给 logits 和采样（vLLM：`logits_indices` 只指向真实请求）；填充行的结果丢掉。
#
# ### 3. 正确性条件与常见误区
#
# - **填充行不能写 KV**：slot 0 是物理块 0 的第 0 个槽位。minivllm 和 vLLM 都在 `BlockPool` 初始化时把块 0 取出作 `null_block`，永远不分给请求——这是有意的设计，所以即使写进块 0 也不会破坏别人的 KV。但填充行仍应写 slot `PAD_SLOT_ID`（-1，vLLM 在 `v1/attention/backends/utils.py` 定义）：写 KV 的 kernel 见到 -1 就跳过，什么都不写，不依赖“块 0 恰好是 null block”，也不会在 null block 里留下垃圾（vLLM 的 `_get_slot_mappings` 正是把填充行的 slot 填成 -1）。
# - **静态缓冲会残留上一批的内容**：缓冲是持久的，上一步 8 行的数据在这一步 4 行的批次里仍然在那里。填充行的长度、token、块表必须每步重写，否则 attention 会按上一批的长度读上一批的块。
# - **位置必须在 `[0, max_model_len)`**：rotary 用位置去查 cos/sin 表。把位置也填成 -1 在 CPU 上会被 torch 的负索引“悄悄”接受，在 GPU 的 gather 里是越界访问。
# - **只返回真实行**：填充行的 logits 交给采样，引擎会以为有 `size` 个请求（形状不符），或者把填充行采出的 token 塞给真实请求。
# - **选最小的能装下的尺寸**：选最大的同样“正确”，但每步都按最大尺寸计算，小批次白算许多行（Q3）。
#
# ### 4. 性能与工程取舍
#
# - 捕获尺寸越密，填充浪费越少，但每个尺寸一个 graph：启动时间和 graph 占用的显存（`profile_cudagraph_memory`）随尺寸数增长。vLLM 的默认列表在小 batch 处密（1、2、4、8、16……）、大 batch 处疏（每 8、每 16）：小 batch 正是 launch 开销占比最大的地方（Q1）。
# - 只为 decode 录整图（minivllm、vLLM 的 `FULL_DECODE_ONLY`）：prefill 批次的 token 数从几个到几千，按 token 数捕获要么尺寸爆炸、要么填充巨大；而且 prefill 的 kernel 足够大，launch 开销本来就不显著（Q2）。vLLM 的其他模式并不止于此：`FULL_AND_PIECEWISE`（默认）让其余批次走分段图，`FULL` 配合 `AttentionCGSupport.ALWAYS` 的后端连混合批次也录整图（尺寸上限仍是 `max_cudagraph_capture_size`）。

# %%
SIZES = [1, 2, 4, 8, 16, 24, 32]
table = L11.padding_table(SIZES, 34)
L11.plot_padding(table, SIZES);

# %% [markdown]
# 图 11-1：vLLM 默认列表的开头部分 `[1, 2, 4, 8, 16, 24, 32]`，decode 批次 1～34 个请求。左：每个批次实际按多少行计算（阶梯），虚线是不填充；右：填充行占计算行的比例。3 个请求按 4 行算（25% 白算），5 个请求按 8 行算（37.5%），17 个按 24 行算（29%）；33、34 个请求超过最大尺寸，不填充、eager（没有柱）。浪费的上限由相邻两个尺寸的间隔决定：间隔为 8 时，最坏是刚过一个尺寸的批次。

# %% [markdown]
# ## 具体演示：填充的代价（实测）
#
# 用真实引擎的模型和 KV cache，在同一个 decode 批次上比较两种前向：只算 n 个真实行，和填充到捕获尺寸后算 `size` 行（填充行长度为 0、slot 为 -1）。A B A B 交替，各取中位数（毫秒）。

# %%
cost = L11.padding_cost(batch_sizes=(3, 5, 9), capture_sizes=(1, 2, 4, 8, 16), pairs=3)
L11.print_cost(cost)

# %% [markdown]
# 读表：在这台 2 核 CPU 上，这个很小的模型一次前向的时间主要是 Python 与 torch 的调度开销，多算几行几乎不花时间，所以比值在 1 附近随机起伏（机器繁忙时噪声很大，单次运行不能下结论）。在 GPU 上，小 batch 的 decode 受带宽限制：权重每步读一遍，与行数无关，填充行额外的只是它们自己的激活和极少的 attention（长度 0，什么都不读），所以填充的代价也很小——这正是“填充到最小的能装下的尺寸、换掉全部 launch 开销”划算的原因。batch 大到计算受限时，填充行就是真实的 FLOP：`size / n` 倍（Q3）。

# %% [markdown]
# ## 实践任务：唯一代码填空题
#
# 下面三个函数就是 minivllm `CudagraphDispatcher.padded_size` 与 `GPUModelRunner._pad_for_cudagraph` 的核心，外加采样前的取行：
#
# - `choose_capture_size(num_reqs, capture_sizes)`：能装下 `num_reqs` 行的最小捕获尺寸；一个都装不下时返回 None（这一步 eager）。
# - `fill_static_buffers(bufs, input_ids, positions, slot_mapping, seq_lens, block_table, size)`：`bufs` 是 runner 的静态缓冲（字段 `input_ids`、`positions`、`slot_mapping`、`seq_lens`、`block_table`，长度为最大尺寸）；把 n 个真实行写进前 n 行，把 `n..size` 的填充行设成无害的值。缓冲里可能还留着上一批的内容。
# - `real_rows(logits, num_reqs)`：replay 输出 `size` 行，只返回真实请求的那些行。
#
# 检查时 `L11.plug` 把它们接进 `LLM(enforce_eager=False, cudagraph_capture_sizes=[1, 2, 4, 8])` 的 runner：`dispatch` 调你的 `choose_capture_size`，`_pad_for_cudagraph` 调你的 `fill_static_buffers`，前向之后调你的 `real_rows`。
#
# 只能修改 TODO/______ 位置，不得删除断言或放宽通过条件。

# %% nbgrader={"grade": false, "grade_id": "l11_padding", "locked": false, "schema_version": 3, "solution": true, "task": false}
def choose_capture_size(num_reqs, capture_sizes):
    """The capture size this decode batch runs at; None when no size holds it (the step runs eagerly)."""
    # TODO 1. Which sizes can hold the batch, and which of them wastes the fewest rows?
    fits = [s for s in capture_sizes if s >= num_reqs]  ### BLANK
    size = min(fits) if fits else None  ### BLANK
    return size


def fill_static_buffers(bufs, input_ids, positions, slot_mapping, seq_lens, block_table, size):
    """Real rows first, then rows n..size that read nothing, write nothing and index nothing out of range."""
    n = input_ids.shape[0]
    # TODO 2. bufs.block_table still holds the previous batch's block ids in rows this batch will read.
    bufs.block_table[:size] = 0  ### BLANK
    bufs.input_ids[:n] = input_ids
    bufs.positions[:n] = positions
    bufs.slot_mapping[:n] = slot_mapping
    bufs.seq_lens[:n] = seq_lens
    bufs.block_table[:n, :block_table.shape[1]] = block_table
    # TODO 3. The padded rows n..size: which token, position, slot and length make them harmless
    #         (no KV written, nothing attended to, no table indexed out of range)?
    pad_token = 0  ### BLANK
    pad_position = 0  ### BLANK
    pad_slot = PAD_SLOT_ID  ### BLANK
    pad_seq_len = 0  ### BLANK
    bufs.input_ids[n:size] = pad_token
    bufs.positions[n:size] = pad_position
    bufs.slot_mapping[n:size] = pad_slot
    bufs.seq_lens[n:size] = pad_seq_len


def real_rows(logits, num_reqs):
    """Only the real requests' rows go on to sampling."""
    # TODO 4. The replay computed `size` rows; which of them belong to requests?
    rows = logits[:num_reqs]  ### BLANK
    return rows


# %%
# 逐项报告（不会中断 Run All）：每个自动评分部分一行，✗ 后面是第一处不符合的地方。
report("lesson11", globals())

# %% [markdown]
# 第一项检查（1 分）：尺寸的选择；一个 5 请求的批次填进一组刚分配的缓冲（与 runner 分配时一样：全 0、slot 全为 `PAD_SLOT_ID`）、填充到 8 行后每个字段的值；`real_rows` 只留前 5 行。

# %% nbgrader={"grade": true, "grade_id": "l11_main_path", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
assert choose_capture_size(3, [1, 2, 4, 8]) == 4
assert choose_capture_size(5, [1, 2, 4, 8]) == 8
assert choose_capture_size(1, [1, 2, 4, 8]) == 1
bufs, batch = L11.fresh_case()
fill_static_buffers(bufs, *batch, 8)
assert bufs.slot_mapping.tolist() == [16, 36, 64, 84, 113, PAD_SLOT_ID, PAD_SLOT_ID, PAD_SLOT_ID]
assert bufs.seq_lens.tolist() == [1, 5, 17, 21, 34, 0, 0, 0]
assert real_rows(torch.arange(8.0).view(4, 2), 3).tolist() == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
### BEGIN HIDDEN TESTS
L11.check_main_path(choose_capture_size, fill_static_buffers, real_rows)
### END HIDDEN TESTS

# %% [markdown]
# 第二项检查（1 分）：把三个函数接进真实引擎。同一批 prompt 分别用 `enforce_eager=True`（不填充）和接了你的函数的 `enforce_eager=False`（3 个请求填充到 4；8 个请求正好一个尺寸，随着请求陆续结束变成 7、6……再被填充到 8、4、2、1）贪心生成，逐 token 比较。每一步还检查填充行的位置都在 `[0, max_model_len)`、`real_rows` 只返回 n 行。

# %% nbgrader={"grade": true, "grade_id": "l11_real_engine", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
L11.check_real_engine(choose_capture_size, fill_static_buffers, real_rows)
print("真实引擎检查通过：填充后生成的 token 与不填充逐个相同。")

# %% [markdown]
# ## 检查方法
#
# 运行断言；再把一个 3 请求的批次填进一组“上一批留下 77”的缓冲，看每个字段的前 4 行。解释每个填充值为什么无害：哪个 kernel 读它、读到它时做什么。

# %%
bufs, batch = L11.stale_case()
fill_static_buffers(bufs, *batch, 4)
for name in ("input_ids", "positions", "slot_mapping", "seq_lens", "block_table"):
    print(f"{name:<13}", getattr(bufs, name)[:4].tolist())

# %% [markdown]
# 你的解释：

# %% [markdown]
# 第三项检查（1 分）：8 个请求正好是一个尺寸（不填充），9 个超过最大尺寸（None，eager）；上面这组残留 77 的缓冲（可见断言）；隐藏测试再在真实引擎里给每次带填充行的前向加一道守卫：本批真实行块表之外的每个 KV 块，在前向前后的校验和必须不变。

# %% nbgrader={"grade": true, "grade_id": "l11_boundary", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
assert choose_capture_size(8, [1, 2, 4, 8]) == 8
assert choose_capture_size(9, [1, 2, 4, 8]) is None
bufs, batch = L11.stale_case()
fill_static_buffers(bufs, *batch, 4)
assert bufs.input_ids[:4].tolist() == [5, 6, 7, 0]
assert bufs.slot_mapping[:4].tolist() == [51, 97, 168, PAD_SLOT_ID]
assert bufs.seq_lens[:4].tolist() == [4, 18, 41, 0]
### BEGIN HIDDEN TESTS
L11.check_boundary(choose_capture_size, fill_static_buffers, real_rows)
### END HIDDEN TESTS

# %% [markdown]
# ## 映射回源码对象
#
# 评分规则中的“能映射回源码对象”（1 分）在这里自动评分：在 vLLM 8e958902eee5 中找到下面每个概念的名字（方法或属性名，字符串；大小写不限，可带类名前缀）。
#
# - `padded_descriptor`：`CudagraphDispatcher` 里把一步的 token 数换成填充后的 `BatchDescriptor`（填充后的 token 数与请求数）的方法；
# - `sorted_sizes`：`CompilationConfig` 里把 `cudagraph_capture_sizes` 排成升序（并核对最大尺寸）的方法——所以 vLLM 的尺寸表总是升序，而你的 `choose_capture_size` 不能指望这一点；
# - `decode_query_len`：`CudagraphDispatcher` 里“一个 uniform decode 请求每步有几个 query token”（1 + 投机 token 数）的属性。

# %% nbgrader={"grade": false, "grade_id": "l11_source_map_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
SOURCE_MAP = {
    "padded_descriptor": "CudagraphDispatcher._create_padded_batch_descriptor",  ### BLANK
    "sorted_sizes": "CompilationConfig.post_init_cudagraph_sizes",  ### BLANK
    "decode_query_len": "uniform_decode_query_len",  ### BLANK
}

# %% nbgrader={"grade": true, "grade_id": "l11_source_map", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
L11.check_source_map(SOURCE_MAP)

# %% [markdown]
# ## CPU 看不到的：GPU 上的 launch 次数
#
# CPU 上的检查证明了填充路径的**正确性**（同样的 token、不写别人的 KV、选对尺寸），但证明不了它为什么**快**：CPU 没有 kernel launch，也没有 graph。下面的单元格在有 CUDA 时用 `torch.profiler` 数一次 8 请求 decode 前向的 CUDA 运行时调用：eager 路径每个 kernel 一次 `cudaLaunchKernel`，graph 路径整个前向一次 `cudaGraphLaunch`。GPU 还会多给出两件 CPU 给不了的事：graph 真的录制了静态缓冲的地址（换一个张量就读不到新输入），以及 capture 与 replay 在同一尺寸下逐位相同的 logits（`make gpu-check` 里的 `tests/test_cudagraph.py` GPU 部分）。在没有 GPU 的机器上它只打印一句说明。

# %%
L11.print_launch_counts(L11.launch_counts(8))

# %% [markdown] nbgrader={"grade": false, "grade_id": "l11_q1", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q1（2 分）
#
# 为什么小 batch 的 decode 一步的时间常常由 kernel launch 开销而不是计算决定？CUDA graph 把哪一部分成本去掉了、哪一部分没有去掉？请用一次 decode 前向的 kernel 数和每个 kernel 的时间粗略估算，并说明 batch 变大时这个比例怎样变化。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 成本链完整：一次 decode 前向每层约 10～20 个 kernel（norm、QKV、rotary、写 KV、attention、o_proj、norm、gate/up、act、down、残差），几十层就是几百个 launch；每次 launch 的 CPU 端开销（Python + PyTorch 调度 + 驱动）约 5～10 µs，而小 batch 时每个 kernel 在 GPU 上只跑几 µs（受带宽限制：读一遍该层权重），所以 GPU 在 kernel 之间空等 CPU，步时间 ≈ launch 次数 × 单次开销；CUDA graph 把几百次 launch 换成一次 `cudaGraphLaunch`（replay），去掉的是 CPU 端的逐 kernel 开销与 kernel 之间的空隙，没去掉的是 kernel 本身的执行时间（读权重与 KV 的带宽）以及 graph 之外的工作（调度、准备输入、采样、填充行的计算）；batch 变大时每个 kernel 变长（计算增长）而 launch 数不变，launch 开销占比下降，graph 的收益随之变小；能提到用 profiler 的 launch 计数（本课最后一节）或 `make gpu-check` 验证；1 分 = 只说“launch 有开销、graph 减少 launch”而没有量级或没有说 batch 增大时的变化；0 分 = 认为 CUDA graph 让 kernel 本身算得更快、或减少了 FLOP（一票否决：混淆算法正确性与性能）。
#
# **参考答案**
#
# 1. 一次前向的 kernel 数：每个 decoder 层约 10～20 个 kernel，32 层的模型就是 300～600 个 launch；再加 embedding、最后的 norm 与 lm_head。
# 2. 每个 kernel 的时间：小 batch 的 decode 受带宽限制，一个 kernel 读一层的一部分权重（几 MB）只要几 µs；而 CPU 发一次 launch（Python 调用、PyTorch 分派、CUDA 驱动）要 5～10 µs。CPU 发得比 GPU 算得慢，GPU 在 kernel 之间空等，一步的时间 ≈ launch 数 × 单次开销，而不是 FLOP 或字节数决定。
# 3. graph 去掉什么：录制一次之后，每步只调用一次 `cudaGraphLaunch`，所有 kernel 由 GPU 端连续发射，CPU 开销从几百次变成一次，kernel 之间的空隙消失。没去掉的：kernel 本身的执行时间（仍要读一遍权重和 KV）、graph 之外的 CPU 工作（调度、`_prepare_inputs`、拷进静态缓冲、采样），以及填充行多算的那一点。
# 4. batch 变大：每个 kernel 处理更多行，执行时间变长（最终计算受限），launch 数不变，开销占比下降；所以 graph 的收益在 batch 1～几十时最大，vLLM 的默认尺寸也在小 batch 处最密。
# 5. 验证：本课最后一节的 profiler 计数（eager 的 `cudaLaunchKernel` 数 vs graph 的 1 次 `cudaGraphLaunch`）；速度结论要在目标 GPU 上用交替的 benchmark 确认。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l11_q2", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q2（2 分）
#
# minivllm（以及 vLLM 的 `FULL_DECODE_ONLY` 模式）只对 uniform decode 批次（minivllm：每个请求恰好 1 个 token）捕获整图。这些模式为什么不把 prefill 或 decode 与 prefill 混合的批次也捕获整图？请从形状、填充成本、launch 开销占比和 attention 元数据四个方面说明；再说出 vLLM 默认的 `FULL_AND_PIECEWISE` 怎样处理其余批次，以及 vLLM 在什么条件下也为混合批次录整图。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 四方面都有因果：（形状）uniform decode 批次的形状只由请求数决定，请求数有界（`max_num_seqs`），几个尺寸就能覆盖；prefill 批次的 token 数从 1 到 `max_num_batched_tokens`，还取决于每个请求的 query 长度分布；（填充）按 token 数填充时间隔要么密到 graph 数量爆炸（启动时间、显存），要么疏到填充浪费巨大，而 prefill 是计算受限的，填充行就是真实 FLOP；（开销占比）prefill 的 kernel 处理成百上千个 token、每个跑很久，launch 开销占比很小，graph 收益小；（元数据）混合批次的 attention 要按 `query_start_loc` 分段、prefill 与 decode 可能走不同 kernel、max_query_len 变化，grid 随之变化的 kernel 无法用一组静态缓冲录成一张图；并说出这一步 eager（minivllm 的 `dispatch` 返回 None；vLLM 的返回 `(CUDAGraphMode.NONE, BatchDescriptor(num_tokens))`——两种说法都给分，只要说清是哪个系统）；vLLM 的 `FULL_AND_PIECEWISE` 对其余批次用 torch.compile 切出的分段图（attention 之外的部分录成 piecewise graph，attention 本身 eager），按 token 数填充；并说出整图也能装下混合批次的条件：attention 后端声明 `AttentionCGSupport.ALWAYS`（Triton 后端、FlashAttention 3）且 `cudagraph_mode=FULL`。学生若答“vLLM 也能为混合批次录整图”并给出这个条件，是正确的，不扣分；答 uniform decode 在投机解码时是每个请求 1 + k 个 token 也对。1 分 = 只说“prefill 形状多变”而缺少成本或元数据的理由；0 分 = 认为 prefill 捕获后会算错所以不能捕获（一票否决：混淆算法正确性与性能）。
#
# **参考答案**
#
# 1. 形状：一个 uniform decode 批次有 n 个请求、n 个 token，形状只由 n 决定，n ≤ `max_num_seqs`，`[1, 2, 4, 8, 16, …]` 几个尺寸就覆盖了。prefill 或混合批次的 token 数可以是 1 到 `max_num_batched_tokens` 之间的任何数，而且同样的 token 数可以由不同的请求数和 query 长度组成。
# 2. 填充成本：要覆盖这么大的范围，尺寸要么很密（几百个 graph：启动时捕获很久、每个 graph 占显存，`profile_cudagraph_memory`），要么很疏（一个 2049 token 的批次填到 4096）。prefill 是计算受限的，填充行是真实的 FLOP，填充一倍就慢一倍。
# 3. 开销占比：prefill 的每个 kernel 处理成百上千个 token，执行时间远大于几 µs 的 launch 开销，graph 能省的比例很小；decode 小 batch 恰恰相反（Q1）。
# 4. attention 元数据：graph 录下了每个 kernel 的 grid 和参数。decode 批次的 attention 元数据可以用固定形状的静态缓冲表示（每行 1 个 query、`seq_lens`、块表、slot），长度变化只改内容；对多数 kernel，混合批次的 `query_start_loc`、`max_query_len`、prefill/decode 的分界都会改变走哪个 kernel、grid 多大，不能用一张 graph 表示。例外是声明 `AttentionCGSupport.ALWAYS` 的后端（vLLM 的 Triton 后端、FlashAttention 3）：`AttentionCGSupport.ALWAYS` 的定义就是“整图支持 prefill 与 decode 混合的批次”，`cudagraph_mode=FULL` 时混合批次也按 token 数填充后录进整图。
# 5. 所以在 `FULL_DECODE_ONLY` 下，非 uniform decode（或超过最大尺寸）的批次 eager：minivllm 的 `dispatch` 返回 None，vLLM 的 `CudagraphDispatcher.dispatch` 返回 `(CUDAGraphMode.NONE, BatchDescriptor(num_tokens))`。vLLM 默认的 `FULL_AND_PIECEWISE` 对其余批次用 torch.compile 把模型在 attention 处切开，attention 之外的部分按 token 数录成分段（PIECEWISE）graph，attention 在分段之间 eager 执行——省下大部分 launch，又不用把变化的 attention 元数据录进 graph。minivllm 没有 torch.compile，不做这一步。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l11_q3", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q3（2 分）
#
# 填充的代价是什么？用图 11-1 和“填充的代价”表里你测到的数字说明：哪些批次大小浪费最多、这些浪费的行在带宽受限和计算受限时分别花多少时间，以及你会怎样为一个线上服务选捕获尺寸。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 引用图 11-1 的数字（例如 3→4 浪费 25%，5→8 浪费 37.5%，9→16 浪费 44%，17→24 浪费 29%；最坏是刚过一个尺寸的批次，上限由相邻尺寸的间隔决定）和自己测到的表（以学生自己的数字为准；在 2 核 CPU 上比值在 1 附近起伏、噪声大，要说明不能凭一次运行下结论）；并给出成本链：填充行也做完整的前向（embedding、每层的投影与 MLP、lm_head），attention 因长度 0 几乎不读 KV，也不写 KV（slot -1）；带宽受限（小 batch decode）时一步的时间主要是读一遍权重，与行数几乎无关，填充几乎免费；计算受限（大 batch）时填充行是真实 FLOP，时间约按 `size / n` 增长；再加上每个尺寸一个 graph 的启动时间与显存；选尺寸：在实际的 batch 大小分布上测，把尺寸放在常见的 batch 大小上，小 batch 处密、大 batch 处疏，用 `max_cudagraph_capture_size` 限制最大尺寸；1 分 = 只有“填充浪费计算”而没有数字或没有区分带宽/计算受限；0 分 = 认为填充会改变输出（一票否决：混淆算法正确性与性能）；或认为尺寸越多越好、没有代价；或把本机 CPU 上比值在 1 附近的结果说成 GPU 上填充也总是免费（一票否决：把单一负载的实测写成普遍结论）。
#
# **参考答案**
#
# 1. 浪费多少（图 11-1，尺寸 `[1, 2, 4, 8, 16, 24, 32]`）：3 个请求按 4 行算（25%），5 个按 8 行（37.5%），9 个按 16 行（44%），17 个按 24 行（29%）；恰好是一个尺寸的批次不浪费。最坏情况是刚过一个尺寸的批次，浪费比例上限约为 `间隔 / 下一个尺寸`。
# 2. 浪费的行做什么：它们走完整的前向——embedding、每层的 QKV、o_proj、MLP、lm_head 都多算 `size - n` 行；attention 因为 `seq_lens = 0` 不读 KV，slot 为 -1 不写 KV，所以 KV 带宽不增加；输出由 `real_rows` 丢掉。
# 3. 花多少时间：小 batch decode 受带宽限制，一步的时间是读一遍权重（与行数几乎无关），多几行几乎免费——本机实测的比值在 1 附近起伏（这个小模型在 CPU 上由调度开销主导，噪声大，要 A B A B 交替取中位数，多次运行才能说话）；batch 大到计算受限时，填充行是真实 FLOP，时间约乘 `size / n`（9→16 接近 1.8 倍）。另有固定成本：每个尺寸录一个 graph，启动时间和 graph 显存随尺寸数增长。
# 4. 选尺寸：看线上 decode batch 大小的分布（受 `max_num_seqs` 与负载影响），在常见大小处放尺寸，小 batch 处密（launch 开销占比最大、填充又几乎免费）、大 batch 处疏，并用 `max_cudagraph_capture_size` 截断（更大的批次 eager，launch 开销占比已经小）；在目标 GPU 上 benchmark 每步时间来验证，而不是只看浪费比例。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown]
# ## 评分规则
#
# - 代码 4 分：主路径 2 分（选尺寸与填充一个批次 1 分、接入真实引擎 1 分）、边界条件 1 分、能映射回源码对象 1 分；
# - Q1～Q3 各 2 分：必须包含对象、状态变化、正确性或成本链；
# - 一票否决：把论文峰值写成普遍生产结论；把源码支持写成所有模型/硬件可用；混淆算法正确性与性能；只背类名而说不清状态所有权。
#
# 总分 10 分，至少 8 分通过。参考答案与参考代码只在教师分支（solutions/）中：先独立完成；核对后请更换一组捕获尺寸或 batch 大小重新推演，不能只复制。
#
# ### 自检
#
# 下面的单元格用与 nbgrader 相同的检查函数给代码部分打分（Q1～Q3 显示为待人工评分）。

# %%
self_check("lesson11", globals());

# %% [markdown]
# ## 参考资料
#
# - [vLLM CUDA graph dispatcher](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/cudagraph_dispatcher.py)
# - [vLLM CUDAGraphWrapper](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/compilation/cuda_graph.py)
# - [vLLM CompilationConfig（捕获尺寸、cudagraph_mode）](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/config/compilation.py)
# - [vLLM GPUModelRunner（填充、捕获）](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/worker/gpu_model_runner.py)
# - [CUDA Graphs（CUDA C++ Programming Guide）](https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#cuda-graphs)
# - [PyTorch CUDA Graphs](https://pytorch.org/docs/stable/notes/cuda.html#cuda-graphs)
# - [vLLM CUDA Graphs design doc (current docs)](https://docs.vllm.ai/en/latest/design/cuda_graphs.html)
#
# 源码链接固定到本课审阅 commit；current docs、默认捕获尺寸与 cudagraph_mode 会变化，面试或部署前必须按目标版本重新核对。
#
# ← 上一课：第 10 课：分布式执行：张量并行、Executor 与 all-reduce　｜　下一课 →：第 12 课：前端与在线服务：AsyncLLM、ZMQ/msgspec、SSE 与基准测试
