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
# # 第 5 课：GPUModelRunner：持久批与 varlen 输入准备
#
# ## 本课目标与通过标准
#
# 本课产出：能说清调度器的一个 `SchedulerOutput` 怎样变成模型前向的输入张量——runner 怎样把调度器的增量（新请求、继续的请求、结束的请求）写进**持久批** `InputBatch`（行跨步保留：`add_request`、`remove_request`、`condense`、`swap_states`），再把一个参差不齐的混合批（新 prefill、分块 prefill、prefix cache 命中后的 prefill、decode）摊平成一串 varlen 张量：`input_ids`、`positions`、`query_start_loc`、`seq_lens`、`slot_mapping`、`logits_indices`；亲手写出向量化的输入准备（vLLM V1 runner `GPUModelRunner._prepare_inputs` 的非投机部分），把它接进真实引擎，让 minivllm 用你的张量生成文本。
#
# 通过要求：唯一代码填空题通过全部断言；Q1～Q3 都能沿源码对象给出因果链；能指出一个正确性不变量（每个 token 的 K/V 写进它所属请求的**物理**块、位置从 `num_computed_tokens` 接着数；只在请求到达已知 token 末尾时取 logits）、一个性能边界（输入准备在 CPU 上、每步一次、与 token 数线性，不能有按 token 的 Python 循环）和一个需要 benchmark 才能确认的结论（输入准备占一步的多少，取决于模型大小与 batch，而不是一个常数）；总分至少 8/10。
#
# | 部分 | 分值 | 评分方式 |
# |---|---|---|
# | 代码·主路径（引擎每一步的混合批，张量逐项相等 1 分 + 接入真实引擎 == HF、追踪与向量化 1 分） | 2 | 自动 |
# | 代码·边界条件（中途结束的块、命中后块内开始、打乱的块、被交换的行） | 1 | 自动 |
# | 代码·能映射回源码对象（`SOURCE_MAP`） | 1 | 自动 |
# | Q1～Q3 | 各 2 | 人工，按评分规则 |
#
# 没有 nbgrader 时（例如 Colab），运行本课最后的“自检”单元格，或在终端执行 `python -m autograder check lesson05`（在本笔记本所在的文件夹或仓库根目录都可以），得分与教师用 nbgrader 评出的自动部分一致。

# %% [markdown]
# ## 源码版本与阅读方法
#
# 本课程使用固定 commit 的永久链接保证行号可复现，同时链接 current docs 供核对最新变化。读 runner 时沿着“一个 token 从调度结果到前向输入”的路线读：先看调度器的增量怎样落进持久批，再看持久批怎样被摊平；不要从 CUDA graph、M-RoPE、多模态这些分支开始读。
#
# | 顺序 | vLLM 文件与入口（8e958902eee5） | minivllm 对应文件 | 带着什么问题读 |
# |---|---|---|---|
# | 1 | [`vllm/v1/core/sched/output.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/core/sched/output.py)：`SchedulerOutput`、`NewRequestData`、`CachedRequestData` | `minivllm/core/sched/output.py`：`SchedulerOutput`、`NewRequestData`、`CachedRequestData` | 调度器每步只发“增量”：新请求发全量，继续的请求只发新块和 `num_computed_tokens`。runner 靠什么把增量拼回完整状态？ |
# | 2 | [`vllm/v1/worker/gpu_input_batch.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/worker/gpu_input_batch.py)：`CachedRequestState`、`InputBatch.add_request`、`remove_request`、`swap_states`、`condense` | `minivllm/worker/gpu_input_batch.py`：`CachedRequestState`、`InputBatch`、`add_request`、`remove_request`、`swap_states`、`condense` | 哪些状态按行存成 numpy 数组？一个请求结束后留下的空洞怎样被填上，谁的行号因此改变？ |
# | 3 | [`vllm/v1/worker/gpu_model_runner.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/worker/gpu_model_runner.py)：`_update_states`、`_may_reorder_batch`；[`vllm/v1/attention/backends/utils.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/attention/backends/utils.py)：`reorder_batch_to_split_decodes_and_prefills` | `minivllm/worker/gpu_model_runner.py`：`_update_states`、`_reorder_batch` | 为什么 decode 排在前面？vLLM 只在注意力后端给出 `reorder_batch_threshold` 时才重排（FlashInfer、MLA 后端给 1；FlashAttention、Triton 后端不给，默认 `None`，不重排），重排之后行序与调度器的顺序还一样吗？ |
# | 4 | [`vllm/v1/worker/gpu_model_runner.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/worker/gpu_model_runner.py)：`_prepare_inputs`、`_get_cumsum_and_arange`、`discard_request_mask` | `minivllm/worker/gpu_model_runner.py`：`_prepare_inputs` | `req_indices`、`query_pos`、`positions`、`token_indices` 怎样只用 `np.repeat` / `np.cumsum` 得到？哪些请求这一步不该采样？ |
# | 5 | [`vllm/v1/worker/block_table.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/worker/block_table.py)：`BlockTable.compute_slot_mapping`、`_compute_slot_mapping_kernel`、`commit_block_table` | `minivllm/worker/gpu_model_runner.py`：`_prepare_inputs`（`slot_mapping`）；`minivllm/worker/gpu_input_batch.py`：`block_table` | 逻辑块号 `pos // block_size` 怎样变成物理块号？为什么 vLLM 在 GPU 上算它？ |
# | 6 | [`vllm/v1/attention/backend.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/attention/backend.py)：`CommonAttentionMetadata`；[`vllm/v1/utils.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/utils.py)：`CpuGpuBuffer` | `minivllm/attention/backends/abstract.py`：`AttentionMetadata` | kernel 需要哪些张量？哪些有 CPU 副本（字段 `query_start_loc_cpu`；`seq_lens_cpu` 在 vLLM 里是**已弃用**的属性，读它会把 GPU 上的 `seq_lens` 同步拷回 CPU）、哪些异步拷到 GPU？ |
#
# ### 你的模型在 vLLM 0.27.1 里由哪个 runner 跑
#
# > **minivllm ≠ vLLM：本课讲的持久批是 V1 runner 的设计，课程的模型在 vLLM 0.27.1 上默认不走它。**
# > `VllmConfig.use_v2_model_runner`（`vllm/config/vllm.py`）决定 worker 建哪个 runner（`vllm/v1/worker/gpu_worker.py` 读它）：环境变量 `VLLM_USE_V2_MODEL_RUNNER` 设了就听它的；否则 `_is_default_v2_model_runner_model` 要求 `runner_type == "generate"`、不是 attention-free，且架构在 `DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES` 里或不是 MoE（dense 的 Llama、Qwen3 都满足；不在该列表里的 MoE 回到 V1）；再要求装了 Triton（`HAS_TRITON`），且 `_get_v2_model_runner_unsupported_features` 为空——n-gram 投机（`ngram`/`ngram_gpu`）、自定义 logits processor、prompt embeds、stock torch.compile 等任一开启都回到 V1（日志 “Model Runner V2 does not yet support …; using the V1 model runner instead”）。
# > - **Model Runner V2**（`vllm/v1/worker/gpu/model_runner.py`，类名同样是 `GPUModelRunner`）：每个请求在请求状态表 `RequestState`（`vllm/v1/worker/gpu/states.py`）里占一个固定槽位，从 `free_indices.pop()` 拿到、到结束或被抢占时才还；每一步 `prepare_inputs` 新建一个 `InputBatch`（`vllm/v1/worker/gpu/input_batch.py`），批内顺序由 `sort_batch_req_ids` 决定（decode 在前，再按 token 数），`idx_mapping[批内第 i 行] = 槽位号`，Triton kernel 通过它去状态表里取数据。没有 `condense`、没有 `swap_states`。CUDA graph 由 `ModelCudaGraphManager` / `BatchExecutionDescriptor`（`vllm/v1/worker/gpu/cudagraph_utils.py`）管理。
# > - **V1 runner**（`vllm/v1/worker/gpu_model_runner.py` + `gpu_input_batch.py`）：本课和 minivllm 讲的持久批。一个 V2 不支持的特性打开时（例如第 9 课的 n-gram 投机），或 MoE 模型、没有 Triton 时，跑的是它。
# >
# > 本课先按 V1（也是 minivllm）讲持久批和 varlen 摊平——摊平的数学在两个 runner 里相同；“V1 的持久批与 V2 的请求状态表”一节把两种做法放在同一次运行上对比。
#
# 源码快照：vLLM 8e958902eee5。与 vLLM 的差异（本课会反复用到）：
#
# - **slot mapping 在哪里算**：vLLM 先把块表异步拷到 GPU（`commit_block_table`），再由 `BlockTable.compute_slot_mapping` 启动 Triton kernel `_compute_slot_mapping_kernel` 在 GPU 上算；`positions`、`seq_lens` 也由 GPU 上的 `num_computed_tokens` 算出（为异步调度和投机解码的“乐观”长度服务）。minivllm 全部在 CPU 上用 numpy 算，再 `non_blocking` 拷过去——语义相同，少了重叠。
# - **哪些请求取 logits**：vLLM 对每个请求都取最后一个 token 的 logits（`logits_indices = query_start_loc[1:] - 1`），再用 `discard_request_mask`（`seq_len < num_tokens` 的请求）丢掉中途分块的采样结果；minivllm 只对到达已知 token 末尾的请求取 logits（`emit`），少算几行 LM head。本课的练习按 minivllm 的做法。
# - **投机解码**：有草稿时 vLLM 用 `_calc_spec_decode_metadata` 为每个请求取 k+1 行 logits；minivllm 的 `_prepare_inputs` 也这样做（第 9 课），本课的练习只做非投机的情形。
# - **持久批的存储**：vLLM V1 的 `InputBatch` 里，token 表 `token_ids_cpu_tensor` **不是** pinned 的（`pin_memory=False`，也没有 GPU 副本：它只在 CPU 上被索引出本步的 `input_ids`）；采样参数（temperature 等）是 pinned CPU 张量配一份 GPU 张量；块表在单独的类 `BlockTable`（按 KV cache 组可有多个）里，是一个 `CpuGpuBuffer`，`commit_block_table(num_reqs)` **每步把前 `num_reqs` 行整个拷到 GPU**（不是只拷变化的部分）。minivllm 的 `InputBatch` 只有 numpy 数组，块表是其中一个二维数组。vLLM 的 `condense` 把末尾的行移进空洞（不交换），minivllm 用 `swap_states`，效果相同。
# - **decode 排前面**：minivllm 的 `_reorder_batch` 每步都把 decode 换到前面；vLLM V1 的 `_may_reorder_batch` 只在 `reorder_batch_threshold` 不是 `None` 时调用 `reorder_batch_to_split_decodes_and_prefills`（由注意力后端的 metadata builder 给出：FlashInfer、MLA 等给 1，FlashAttention、Triton 后端不给，于是不重排——它们的 varlen kernel 直接处理混合批），重排时分四段：decode、short_extend、long_extend、prefill（首块）。
# - **写入采样结果**：minivllm 用 `append_token`（minivllm 的名字）把上一步采样的 token 写进行；vLLM V1 在 `_bookkeeping_sync` 里写 `token_ids_cpu`。
# - **runner 本身**：见上面的方框——课程的模型在 vLLM 0.27.1 上默认由 Model Runner V2 跑，它没有持久批。
# - CUDA graph 的 padding（第 11 课）在 minivllm 里发生在 `_prepare_inputs` 之后（`_pad_for_cudagraph`），本课不涉及。

# %% nbgrader={"grade": false, "grade_id": "l05_setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
# 准备（锁定）：静音无害的警告（评分单元格不能写 stderr）。
import logging
import os
import warnings

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

import numpy as np  # noqa: E402

from autograder import lesson05 as L05  # noqa: E402
from autograder.common import ______, report, self_check, short_errors  # noqa: E402,F401

short_errors("lesson05")  # 评分单元格失败时只显示三行：哪一部分、错在哪、第一处不符（完整 traceback：%tb）

# %% [markdown]
# ## 核心心智模型
#
# ### 1. 它是什么，解决什么问题
#
# 调度器决定“这一步每个请求算几个 token”（`num_scheduled_tokens`），但模型要的是张量：一串 token id、每个 token 的位置、每个 token 的 K/V 写到 KV cache 的哪个槽、注意力怎样按请求分段、最后取哪几行算 logits。`GPUModelRunner` 负责这个翻译，每步一次，在 CPU 上完成，而且**必须在 GPU 开始前**完成——GPU 在这段时间里是空闲的。所以它要做到两件事：
#
# 1. **不重建状态**：一个请求活几百步，大多数步里它只多了 1 个 token，偶尔多 1 个块。runner 把每个请求的 token、块表、`num_computed_tokens`、采样参数放在持久批 `InputBatch` 的一行里，跨步保留；调度器只发增量（`CachedRequestData` 里的 `new_block_ids`、`num_computed_tokens`），runner 在 CPU 上只改变化的那几个数（Q1）。（vLLM V1 之后仍把块表的前 `num_reqs` 行整个拷到 GPU；V2 没有持久批，见后面的对比。）
# 2. **不 padding**：一个批里有 1 个 token 的 decode，也有几百个 token 的 prefill 块。把它们补齐成 `[batch, max_len]` 会让大部分计算浪费在填充上；vLLM 把所有 token 接成一条扁平序列（varlen），用 `query_start_loc`（每个请求在扁平序列里的起点）告诉注意力 kernel 哪些 token 属于同一个请求（Q2）。
#
# ### 2. 它如何工作
#
# 每一步 `execute_model` 先 `_update_states`，再 `_prepare_inputs`：
#
# 1. **`_update_states`**（持久批的增删改）：结束的请求 `remove_request`（行变成空洞）；没被调度的（被抢占的）也移出批，但保留 `CachedRequestState`；新请求 `add_request`（优先填空洞）；继续的请求更新 `num_computed_tokens_cpu` 并追加新块 `append_block_ids`；然后 `condense` 把末尾的行移进空洞，使 `[0, num_reqs)` 全是活的行；最后 minivllm 的 `_reorder_batch` 用 `swap_states` 把 decode（本步 1 个 token）换到前面（vLLM V1 只在注意力后端设了 `reorder_batch_threshold` 时这样做，见差异列表）。**所以行序 ≠ 调度器的顺序**：后面的一切都按 `input_batch.req_ids` 的行序来。
# 2. **`_prepare_inputs`**（摊平），对行 i、本步 `n_i` 个 token、已算 `c_i` 个：
#    - `query_start_loc = [0, cumsum(n)]`：第 i 个请求的 token 在扁平序列的 `[qsl[i], qsl[i+1])`；
#    - `req_indices = repeat(arange(num_reqs), n)`：每个 token 属于哪一行；本请求内的偏移 `arange(total) - repeat(qsl[:-1], n)`；
#    - `positions = c[req_indices] + 偏移`：位置从已经算过的 token 数接着数（prefix cache 命中后 `c_i` 就是命中的长度）；
#    - `input_ids = token_ids_cpu[req_indices, positions]`；
#    - `slot_mapping = block_table[req_indices, positions // block_size] * block_size + positions % block_size`：逻辑块号 `pos // block_size` 查块表得到**物理**块号，再加块内偏移；
#    - `seq_lens = c + n`：本步之后的上下文长度（注意力看多长的 KV）；
#    - `logits_indices`：只有 `seq_lens >= num_tokens` 的请求（本步到达了已知 token 的末尾）要采样，取它在扁平序列里的最后一个 token `qsl[i+1] - 1`；一个没走到 prompt 末尾的 prefill 块不采样。
# 3. 这些数组变成 `AttentionMetadata`（`minivllm/attention/backends/abstract.py`）和 `input_ids`、`positions`，拷到设备，前向，`hidden[logits_indices]` 进 LM head。
#
# ### 3. 正确性条件与常见误区
#
# - **物理块而不是逻辑块**：`pos // block_size` 是请求内的第几个块；KV cache 里的块由 BlockPool 分配，分散、可共享（prefix cache）。把逻辑块号当槽位会把 K/V 写进别人的块。
# - **位置从 `num_computed_tokens` 开始**：分块 prefill 的第二块、decode、prefix 命中后的 prefill，位置都不是从 0 开始；位置错了 RoPE 就错了，注意力的因果边界也错了。
# - **logits 只取每个请求的最后一个 token，且只在到达末尾时取**：取第一个 token 会用错误的上下文预测；为中途的 prefill 块取 logits 会采出一个 token，把一个还没读完 prompt 的请求当成生成了输出。
# - **`query_start_loc` 是前缀和**：它是偏移，不是长度；kernel 用 `qsl[i+1] - qsl[i]` 得到长度。
# - **按持久批的行序**：`num_computed_tokens_cpu`、`block_table`、`token_ids_cpu` 都按行存；用调度器字典的顺序去配行，就把别人的长度配给了这一行（本课的引擎运行里，分块 prefill 的请求排在 decode 前面，重排后两个顺序不同）。
#
# ### 4. 性能与工程取舍
#
# - 输入准备与 token 数线性：一步 8k 个 token 时，按 token 的 Python 循环要几十毫秒，足以让 GPU 空等；`np.repeat`、`np.cumsum`、花式索引把它降到几十微秒。vLLM V1 进一步把 `positions`、`seq_lens`、`slot_mapping` 放到 GPU 上算，并用 pinned 内存异步拷贝（`CpuGpuBuffer.copy_to_gpu`），让 CPU 的工作与拷贝重叠；Model Runner V2 把更多准备工作写成 Triton kernel（`vllm/v1/worker/gpu/input_batch.py` 的 `prepare_prefill_inputs`、`prepare_pos_seq_lens` 等都按 `idx_mapping` 读状态表）（Q3）。
# - 持久批让每步的 CPU 写入与“变化量”成正比，而不是与“批里所有请求的全部 token”成正比；代价是行会移动（`condense`、`swap_states`），每次移动都要搬一整行的状态。
# - 输入准备占一步的比例不是常数：小模型、CPU 上前向很快时它占得多，大模型 GPU 上前向慢时占得少；要用步骤追踪实测（图 5-2）。

# %% [markdown]
# ## 具体演示：一次引擎运行里的每一步
#
# 4 个 prompt（prompt 2 与 prompt 0 开头相同），token budget 24、长 prefill 阈值 16（所以 prompt 被分块）、block_size 8；prompt 2 在第 6 步、prompt 3 在第 10 步才到。下表是引擎自己的 `_prepare_inputs` 每一步看到的持久批：`req:调度数@已算数`，按行序；最后一列是调度器字典的顺序。

# %%
run = L05.engine_run()
L05.print_steps(run)

# %% [markdown]
# 读表：第 1～3 步 prompt 0 被分成 16 + 16 + 10 的块，prompt 1 是 8 + 6；第 3 步起 prompt 1 在 decode 而 prompt 0 还在 prefill，runner 把 decode 换到第 0 行（`order_differs`：行序与调度器的顺序不同，`moved_row`：某个请求换了行）。prompt 2 到达时 `prefix_hit`：它的前 24 个 token（3 个块）已在 prefix cache 里，`num_computed_tokens` 一开始就是 24，只需算剩下的部分。请求结束后 `condense` 把最后一行移进空洞（`moved_row`）。
#
# 下面是最“混合”的那一步：持久批的每一行，和它摊平后的 6 个张量（引擎自己算的）。

# %%
step = L05.pick_mixed_step(run)
L05.print_flat(step)
L05.plot_mixed_batch(step);

# %% [markdown]
# 图 5-1：上：持久批的行（灰：KV 已在缓存里；彩色：本步调度的 token；斜线：留给以后步的 prompt）；中：扁平的 varlen 批，一列一个 token，数字是它的位置，`qsl` 标出每行的起点，箭头是取 logits 的 token；下：每个 token 的 K/V 写进哪个物理块的哪个槽——块号分散，不按请求连续。

# %%
L05.plot_step_breakdown(run);

# %% [markdown]
# 图 5-2：步骤追踪（`trace=True`，`Tracer` 的 `prepare_inputs`、`forward`、`sample` 三个阶段）里每一步的时间。这个小模型在 CPU 上的前向只要几毫秒，输入准备仍只占百分之几；换成 GPU 上的大模型，前向变快（或变慢）都会改变这个比例——这是需要在目标硬件上实测的结论，不能从这张图外推。
#
# # V1 的持久批与 V2 的请求状态表：同一次运行
#
# 上面那次运行里，`L05.engine_run()` 还记下了 minivllm 的 `_update_states` 每一步对持久批做了什么：哪些行被 `condense` 从末尾移进空洞（`C 从->到`），哪些行被 `_reorder_batch` 的 `swap_states` 交换（`S`）。同一串 `SchedulerOutput` 再按 Model Runner V2 的规则记账（`L05.v2_tables`，规则取自 `vllm/v1/worker/gpu/states.py` 的 `RequestState.add_request` / `remove_request` 与 `model_runner.py` 的 `finish_requests`、`add_requests`、`prepare_inputs`、`sort_batch_req_ids`）：请求第一次被调度时从 `free_indices.pop()` 拿一个槽位，结束或被抢占时还回去；每一步新建的批按“decode 在前、再按 token 数”排序，`idx_mapping` 给出批内每一行对应的槽位。V2 的数字是由记录推出来的（本机没有跑 vLLM），minivllm 的数字是引擎真实的行。
#
# > **minivllm ≠ vLLM**：minivllm 只实现了 V1 的持久批；V2 的表是按 vLLM 源码规则从同一次运行的调度输出推算的示意，不是 minivllm 的代码路径。

# %%
L05.print_v1_v2(run)
print(L05.moved_rows(run))
L05.plot_v1_vs_v2(run);

# %% [markdown]
# 图 5-3：上：minivllm（V1 设计）的持久批，每列一步、每格一行，箭头是本步移动的行（黑：`condense`，红：`swap_states`）；下：同样的步骤在 V2 的请求状态表里——一个请求从进入到结束一直待在同一个槽位，每步变的只是下面那一列 `idx_mapping`（批内第 0、1、… 行各自的槽位号）。
#
# 读图（上面打印的 “V1 row moves” 逐条列出本次运行的每次移动）：V1 里一个请求从 prefill 变成 decode 时可能被 `swap_states` 换到前面，一个请求结束后末尾的行被 `condense` 搬进它的空洞；每次移动都要搬这一行的 token、块表、`num_computed_tokens` 和采样参数，并让按行号索引的一切（generator、min_tokens、上一步的行号映射）跟着改。V2 里这些都不发生：行序变了只是 `idx_mapping` 换了顺序。
#
# ### 检查方法
#
# 对照图 5-3 回答：vLLM 的 Model Runner V2 为什么放弃持久批，改成“固定槽位的状态表 + 每步新建的 `InputBatch` + `idx_mapping`”？至少说出 V1 的两种代价（用图里的移动说明）和 V2 为此付出的东西（提示：谁在读 `idx_mapping`；异步调度时上一步的行号怎样对上这一步的行号——V1 的 `_prepare_inputs` 里为此有 `prev_positions`）。

# %% [markdown]
# 你的解释：

# %% [markdown]
# ## 实践任务：唯一代码填空题
#
# 写出 `prepare_inputs(scheduler_output, input_batch, block_size)`：从调度结果和（已经 `_update_states` 过的）持久批算出 6 个 numpy 数组 `(input_ids, positions, query_start_loc, seq_lens, slot_mapping, logits_indices)`，与 minivllm `GPUModelRunner._prepare_inputs` 的结果逐项相等。要求**向量化**：不能有按 token 的 Python 循环（按请求的列表推导可以）。7 处 `______` 是决策点：行的顺序、`query_start_loc`、位置、物理块号、槽位、哪些请求取 logits、取哪个 token。
#
# 用得到的字段：`input_batch.req_ids[:num_reqs]`（行序）、`num_computed_tokens_cpu`、`token_ids_cpu`（`[max_num_reqs, max_model_len]`）、`num_tokens`（每行已知 token 数：prompt + 已生成）、`block_table`（`[max_num_reqs, max_blocks]`，物理块号）；`scheduler_output.num_scheduled_tokens`（`{req_id: n}`）。
#
# 只能修改 TODO/______ 位置，不得删除断言或放宽通过条件。

# %% nbgrader={"grade": false, "grade_id": "l05_prepare_inputs", "locked": false, "schema_version": 3, "solution": true, "task": false}
import numpy as np


def prepare_inputs(scheduler_output, input_batch, block_size):
    """Flat varlen inputs of one step: (input_ids, positions, query_start_loc, seq_lens, slot_mapping,
    logits_indices), numpy arrays, rows in the persistent batch's order."""
    num_reqs = input_batch.num_reqs
    # TODO 1. Which order do the rows take (the arrays below are indexed by row)?
    req_ids = input_batch.req_ids[:num_reqs]  ### BLANK
    num_scheduled = np.array([scheduler_output.num_scheduled_tokens[r] for r in req_ids], dtype=np.int64)
    total = int(num_scheduled.sum())
    cu_num_tokens = np.cumsum(num_scheduled)
    # TODO 2. Where does each request start in the flat batch?
    query_start_loc = np.zeros(num_reqs + 1, dtype=np.int32)
    query_start_loc[1:] = cu_num_tokens  ### BLANK
    req_indices = np.repeat(np.arange(num_reqs), num_scheduled)             # [2, 5, 3] -> [0 0 1 1 1 1 1 2 2 2]
    query_pos = np.arange(total) - np.repeat(query_start_loc[:-1], num_scheduled)  # -> [0 1 0 1 2 3 4 0 1 2]
    num_computed = input_batch.num_computed_tokens_cpu[:num_reqs]
    # TODO 3. Each token's position in its request.
    positions = num_computed[req_indices] + query_pos  ### BLANK
    input_ids = input_batch.token_ids_cpu[req_indices, positions]
    # TODO 4. The block that holds each token's K/V, and its slot in the paged cache.
    block_numbers = input_batch.block_table[req_indices, positions // block_size].astype(np.int64)  ### BLANK
    slot_mapping = block_numbers * block_size + positions % block_size  ### BLANK
    seq_lens = (num_computed + num_scheduled).astype(np.int32)
    # TODO 5. Which requests sample a token this step, and from which flat-batch row?
    sampled = seq_lens >= input_batch.num_tokens[:num_reqs]  ### BLANK
    logits_indices = cu_num_tokens[sampled] - 1  ### BLANK
    return input_ids, positions, query_start_loc, seq_lens, slot_mapping, logits_indices


# %%
report("lesson05", globals())

# %% [markdown]
# 第一项检查：一个手算得出的批（block_size 4）。第 0 行是 decode（已算 6、本步 1）；第 1 行是一个分块 prefill，本步算位置 4～8，prompt 有 13 个 token，所以**不取** logits；第 2 行是 prefix 命中后的最后一块（已算 6、本步 4、prompt 10 个 token），块表分散（`[3, 8, 12]`）。注意调度器字典的顺序与行序相反。隐藏测试再拿引擎运行（上面的演示）里的每一步逐项比较。

# %% nbgrader={"grade": true, "grade_id": "l05_main_path", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
name, so, batch = L05.boundary_cases()[0]
print(list(so.num_scheduled_tokens.items()), batch.req_ids)
ids, pos, qsl, seq_lens, slots, logits = prepare_inputs(so, batch, 4)
assert qsl.tolist() == [0, 1, 6, 10]
assert pos.tolist() == [6, 4, 5, 6, 7, 8, 6, 7, 8, 9]
assert ids.tolist() == [106, 204, 205, 206, 207, 208, 306, 307, 308, 309]
assert slots.tolist() == [2 * 4 + 2, 11 * 4 + 0, 45, 46, 47, 0 * 4 + 0, 8 * 4 + 2, 35, 12 * 4 + 0, 49]
assert seq_lens.tolist() == [7, 9, 10]
assert logits.tolist() == [0, 9]
### BEGIN HIDDEN TESTS
_ = L05.check_main_path(prepare_inputs)  # a list of the checked cases: not echoed
### END HIDDEN TESTS

# %% [markdown]
# 第二项检查：把你的函数接进真实引擎。`L05.check_real_engine` 在一个上下文管理器里把 `GPUModelRunner._prepare_inputs` 换成一个包装：它调用你的 `prepare_inputs`，用你的 6 个数组构造 `AttentionMetadata`、`input_ids`、`positions` 和取 logits 的行，退出时恢复原来的方法。检查三件事：演示里那批请求的贪心输出与引擎自己的 `_prepare_inputs` 跑出的逐 token 相同（那次运行与 HF transformers 的贪心逐 token 相同，课程的测试 `tests/test_lesson05_grading.py` 保证这一点）；步骤追踪里每个有前向的步都有 `prepare_inputs` 阶段；在一个 8 个请求、16k 个 token 的批上，你的函数执行的 Python 行数有上限（200 行：按 token 的循环要执行上万行）。数的是行而不是秒，所以判定与机器快慢无关。

# %% nbgrader={"grade": true, "grade_id": "l05_real_engine", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
plugged_run = L05.check_real_engine(prepare_inputs)
print("真实引擎检查通过：", plugged_run.tokens)
print(L05.share_of_step(plugged_run.trace))

# %%
L05.vectorised_vs_loop(prepare_inputs)

# %% [markdown]
# 上表：同一个 16k token 的批，你的函数、一个按 token 循环的版本（结果相同）、引擎自己的 `_prepare_inputs`。“Python lines”是 `sys.settrace` 数出的、在函数所在文件里执行的行数——它与机器快慢无关，所以评分用它判断“是否向量化”；时间只作参考，不参与评分。
#
# ## 检查方法
#
# 运行断言；再做一个变化：把同一个请求的 `num_computed_tokens` 加 1（少算一个 token），看 `positions`、`slot_mapping`、`seq_lens`、`logits_indices` 分别怎样变，解释为什么这一行这一步不再取 logits（或仍然取）。

# %%
name, so, batch = L05.boundary_cases()[0]
before = prepare_inputs(so, batch, 4)
batch.num_computed_tokens_cpu[2] += 1
so.num_scheduled_tokens["final"] -= 1
after = prepare_inputs(so, batch, 4)
for k, a, b in zip(L05.NAMES, before, after):
    print(f"{k:<16}{a.tolist()}  ->  {b.tolist()}")

# %% [markdown]
# 你的解释：

# %% nbgrader={"grade": true, "grade_id": "l05_boundary", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
name, so, batch = L05.boundary_cases()[1]                  # two chunks, neither reaches its prompt's end
assert prepare_inputs(so, batch, 4)[5].tolist() == []
name, so, batch = L05.boundary_cases()[2]                  # rows swapped: decodes first, scheduler order differs
ids, pos, qsl, seq_lens, slots, logits = prepare_inputs(so, batch, 4)
assert qsl.tolist() == [0, 1, 2, 11] and pos.tolist()[:2] == [2, 4]
name, so, batch = L05.boundary_cases()[3]                  # one token at position 0
assert [a.tolist() for a in prepare_inputs(so, batch, 4)] == [[42], [0], [0, 1], [1], [20], [0]]
### BEGIN HIDDEN TESTS
L05.check_boundary(prepare_inputs)
### END HIDDEN TESTS

# %% [markdown]
# ## 映射回源码对象
#
# 评分规则中的“能映射回源码对象”（1 分）在这里自动评分：在 vLLM 8e958902eee5 中找到实现每个概念的名字（类、函数、属性名，字符串；大小写不限）。
#
# - `block_tables`：`InputBatch.block_table` 的类型：为每个 KV cache 组各持有一个 `BlockTable` 的那个类（`vllm/v1/worker/block_table.py`）；
# - `condense_rows`：`InputBatch.condense` 把末尾的行移进空洞时，对块表调用的那个方法；
# - `swap_pair`：`InputBatch.swap_states` 交换两行时，对块表调用的那个方法；
# - `split_counts`：假定批已按 decode 在前重排好，attention 的 metadata builder 用来数出 decode、extend、prefill 三类请求各有多少个、各有多少 token（返回六个数）的那个函数（`vllm/v1/attention/backends/utils.py`）；
# - `sample_rows`：`GPUModelRunner` 里存放 `num_computed_tokens + num_scheduled_tokens` 的 CPU 张量，`discard_request_mask` 就是拿它与 `num_tokens` 比较得到的——这个属性的名字；
# - `async_input_ids`：`GPUModelRunner` 里写 `input_ids` 的方法：异步调度时把上一步还留在 GPU 上的采样 token 拷进它们在本步的位置。

# %% nbgrader={"grade": false, "grade_id": "l05_source_map_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
SOURCE_MAP = {
    "block_tables": "MultiGroupBlockTable",  ### BLANK
    "condense_rows": "move_row",  ### BLANK
    "swap_pair": "swap_row",  ### BLANK
    "split_counts": "split_decodes_prefills_and_extends",  ### BLANK
    "sample_rows": "optimistic_seq_lens_cpu",  ### BLANK
    "async_input_ids": "_prepare_input_ids",  ### BLANK
}

# %% nbgrader={"grade": true, "grade_id": "l05_source_map", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
L05.check_source_map(SOURCE_MAP)

# %% [markdown] nbgrader={"grade": false, "grade_id": "l05_q1", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q1（2 分）
#
# 为什么 runner 要维护一个跨步保留的持久批（`InputBatch`），而不是每步从调度器的输出重新构造所有请求的输入？请说明每步省下了什么（CPU 工作量、拷贝的数据量与什么成正比），以及代价是什么（哪些操作因此变得必要，行号什么时候会变）。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 说清调度器只发增量（`NewRequestData` 全量只在请求第一次被调度时发；`CachedRequestData` 只发 `new_block_ids`、`num_computed_tokens`），runner 把 token、块表、`num_computed_tokens`、采样参数（temperature/top_p/top_k、generator）放在持久批的一行里，一个 decode 步每个请求只写 1 个 token（minivllm 的 `append_token`；vLLM V1 在 `_bookkeeping_sync` 里写 `token_ids_cpu`）和偶尔 1 个块号，所以每步的 CPU 写入和 IPC 与变化量成正比，而不是与全部请求的全部 token、全部块表成正比（长上下文时相差几个数量级）；采样参数张量（temperature 等）也不用每步重建；并说出代价：结束/抢占留下空洞，需要 `condense` 移动行、`_reorder_batch` 用 `swap_states` 把 decode 换到前面，所以**行号会变**，一切按行存的状态（包括 generator、min_tokens 这类按行号索引的字典）必须一起移动，输入准备必须按持久批的行序而不是调度器的顺序；1 分 = 只说“避免重复计算/更快”，没有说清省下的是与什么成正比的工作，或没有提到行移动的代价；0 分 = 认为持久批保存的是 KV cache 或模型激活（一票否决：只背类名而说不清状态所有权）。**不扣分的说法**：指出 vLLM V1 的 `commit_block_table` 每步把块表前 `num_reqs` 行整个拷到 GPU（拷贝量与请求数×块表宽度成正比，并非只拷变化的部分）是正确的；回答“持久批只拷变化的部分到 GPU”不得这一点。说明 vLLM 0.27.1 默认的 Model Runner V2 没有持久批（固定槽位的 `RequestState` + 每步新建 `InputBatch` + `idx_mapping`，没有 condense/swap），并以此说明同样的“只发增量、状态按请求跨步保留”和不同的代价，同样给分——只要说清描述的是 V1（或 minivllm）还是 V2。
#
# **参考答案**
#
# 1. 增量协议：调度器（状态的唯一写者）每步只发变化：新请求的 prompt、采样参数和块表只在 `scheduled_new_reqs` 里发一次；之后每步 `scheduled_cached_reqs` 只有 `num_computed_tokens` 和新分配的块 `new_block_ids`。runner 要能把增量拼回完整状态，就得自己保存一份——`CachedRequestState`（可在抢占后重建行）和 `InputBatch` 的一行。
# 2. 省下什么：一个 decode 步，每个请求只变了 1 个 token（上一步采样结果，`append_token`）和 `num_computed_tokens`，偶尔多 1 个块。持久批只写这几个数；如果每步重建，就要把每个请求的全部 token（`token_ids_cpu` 的一整行）、全部块表、采样参数重新写一遍，工作量与 Σ 上下文长度成正比——长上下文、几百个请求时是每步几十万个数，而 GPU 在等。vLLM V1 的 token 表 `token_ids_cpu_tensor` 只在 CPU 上（不 pinned，没有 GPU 副本）；块表是 `CpuGpuBuffer`，`commit_block_table(num_reqs)` 每步把前 `num_reqs` 行整个异步拷到 GPU——CPU 上的写入与变化量成正比，这次拷贝与请求数×块表宽度成正比；采样参数张量只在批成员变化时刷新（`refresh_metadata`）。
# 3. 代价：行是固定容量的槽位。请求结束或被抢占时 `remove_request` 留下空洞；`add_request` 优先填空洞；`condense` 把末尾的行移进空洞，保证 `[0, num_reqs)` 连续；minivllm 的 `_reorder_batch` 用 `swap_states` 把 decode 换到前面（vLLM V1 的 `reorder_batch_to_split_decodes_and_prefills` 只在注意力后端设了 `reorder_batch_threshold` 时这样做）。于是一个请求的行号会在结束、抢占、新请求到达、prefill 变 decode 时改变，所有按行存的状态（token、块表、`num_computed_tokens`、温度、generator、min_tokens）必须一起移动；输入准备必须按 `input_batch.req_ids` 的行序取 `num_scheduled_tokens`（本课 `rows_in_scheduler_order` 变异体在第 3 步就错了）。vLLM 0.27.1 的 Model Runner V2（课程的 dense 模型默认用它）正是为了去掉这些代价而不用持久批：请求在 `RequestState` 里占固定槽位，每步新建 `InputBatch`，用 `idx_mapping` 把批内行映射到槽位（图 5-3）。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l05_q2", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q2（2 分）
#
# 为什么 vLLM 把一个混合批摊平成一条 varlen 序列（`query_start_loc` + `seq_lens` + `slot_mapping`），而不是补齐成 `[batch, max_len]` 的矩阵？用本课演示里的一步（例如一个 16 token 的 prefill 块和几个 decode 同批）算一算 padding 浪费了多少，并说明 varlen 对注意力 kernel 和 KV 写入提出了什么要求。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 用实际数字算出浪费（例如 1 个 16 token 块 + 3 个 decode：varlen 19 个 token，padding 成 4×16 = 64 个，约 70% 是填充；chunked prefill 与 decode 混批时 max_len 由最长的块决定，decode 越多浪费越大），指出填充位置在所有逐 token 的层（QKV/MLP 投影、LM head 之前的一切）里都要计算和搬运，而 varlen 让矩阵乘的行数就是真实 token 数；说清 varlen 的代价/要求：注意力 kernel 必须按 `query_start_loc` 分段（每个 token 只看自己请求的 KV，因果边界在 `seq_lens` 和位置上），KV 通过 `slot_mapping` 按 token 散写进分页的物理块（不连续），decode 排在前面让 kernel 可以分两类处理（minivllm 与 FlashInfer/MLA 后端；说 FlashAttention 后端不重排、一个 kernel 处理混合批也对）；并说出正确性条件（`positions` 从 `num_computed_tokens` 开始、`qsl` 是前缀和）；1 分 = 只说“padding 浪费算力”没有数字，或没有说清 kernel 怎样知道请求边界；0 分 = 认为 varlen 改变了模型的数学结果，或认为 padding 只是多用内存不影响计算（一票否决：混淆算法正确性与性能）。
#
# **参考答案**
#
# 1. 以演示第 3 步为例：prompt 1 decode 1 个 token，prompt 0 的最后一个 prefill 块 10 个 token。varlen：11 个 token；padding 成 `[2, 10]`：20 个位置，45% 是填充。再如 1 个 16 token 块 + 3 个 decode：19 对 64，约 70% 浪费。chunked prefill 让每一步几乎都是这种“一个长块 + 许多 decode”的混合，batch 越大浪费越大。
# 2. 除注意力外，模型的每一层（embedding、QKV 投影、O 投影、MLP、norm）都是逐 token 的：它们只看 `[num_tokens, hidden]` 的矩阵，不关心 token 属于哪个请求。varlen 让这些矩阵乘的行数正好是真实 token 数（`num_actual_tokens`），padding 则在每一层都为填充位置做乘法、搬运激活。
# 3. 只有注意力需要知道请求边界：`query_start_loc` 给出每个请求的 query 段 `[qsl[i], qsl[i+1])`，`seq_lens` 给出它能看的上下文长度，块表给出它的 KV 在哪些物理块；新 token 的 K/V 由 `slot_mapping` 散写进分页缓存（块分散、prefix cache 的块共享）。kernel 必须支持 varlen（FlashAttention 的 `cu_seqlens_q`、minivllm 的 `paged_attention_ref` 与 Triton 的 `chunked_prefill_paged_attention`），minivllm 和设了 `reorder_batch_threshold` 的 vLLM 后端（FlashInfer、MLA）把 decode 排在前面（`num_decodes`），让纯 decode 的部分走专门的 kernel；FlashAttention 后端不重排，一个 varlen kernel 处理整个混合批。
# 4. 正确性不依赖布局：每个 token 的位置是 `num_computed_tokens + 偏移`，它的 K/V 写进自己请求的物理槽，注意力只在自己的段和上下文里做——与单独跑每个请求结果相同（本课的检查：接入引擎后 == HF greedy）。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l05_q3", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q3（2 分）
#
# 一步里，GPU 开始前向之前 CPU 必须做完哪些事？用图 5-2 和检查里的向量化对比说明这段时间与什么成正比；再说明 vLLM 用哪些手段让 CPU 的工作与 GPU 重叠或缩短（至少两种，说出源码对象）。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 列出关键路径：调度（`Scheduler.schedule`）、`_update_states`（增删行、condense、重排）、`_prepare_inputs`（6 个数组 + `AttentionMetadata`）、H2D 拷贝，之后才能 launch 前向；说出成本与 token 数和请求数线性（向量化后是几次 numpy 调用，按 token 的循环则是每 token 若干微秒，16k token 时几十毫秒 vs 亚毫秒，引用检查里的实测数字），占步时间的比例取决于模型与硬件（图 5-2 在 CPU 小模型上是百分之几）；并给出 vLLM 的至少两种重叠手段，带源码对象：pinned 内存 + `non_blocking` 的 `CpuGpuBuffer.copy_to_gpu`、先 `commit_block_table` 再做其余 CPU 工作；`positions`/`seq_lens`/`slot_mapping` 在 GPU 上算（`_compute_slot_mapping_kernel`）；异步调度（`async_scheduling`：第 t+1 步的调度与第 t 步的前向重叠，采样结果留在 GPU 上）；CUDA graph 减少 launch 开销；结构化输出的 bitmask 在前向期间计算（第 8 课）；1 分 = 只列出步骤或只说“异步”，没有对象或没有成本链；0 分 = 认为 GPU 可以在输入准备完成前开始这一步的前向，或把输入准备说成在 GPU 上做所以不占时间（一票否决：混淆算法正确性与性能）。
#
# **参考答案**
#
# 1. 关键路径（CPU，每步）：`Scheduler.schedule` 决定 `num_scheduled_tokens` 和块；runner 的 `_update_states` 把增量写进持久批（`add_request`/`remove_request`/`condense`/`swap_states`）；`_prepare_inputs` 算 `input_ids`、`positions`、`query_start_loc`、`seq_lens`、`slot_mapping`、`logits_indices` 并构造 `AttentionMetadata`；把它们拷到 GPU。前向的第一个 kernel 就要读 `input_ids`，注意力要读 `slot_mapping` 和块表，所以这些都要先准备好——这段时间里 GPU 空闲。
# 2. 成本：与本步 token 数、请求数线性。向量化后是十几次 numpy 调用（检查里 16k token 的批不到 1 ms，执行的 Python 行数是常数）；按 token 的 Python 循环每 token 几微秒，16k token 就是几十毫秒——比一个 decode 步的 GPU 时间还长。图 5-2 里它占 prepare+forward+sample 的百分之几（CPU 上的小模型）；GPU 上前向只要几毫秒时，这个比例会大得多，要实测。
# 3. vLLM 的手段：
#    - pinned 内存的 `CpuGpuBuffer` + `copy_to_gpu(non_blocking=True)`：拷贝异步进行，CPU 继续算；`_prepare_inputs` 第一件事就是 `commit_block_table`，让块表的拷贝与后面的 CPU 计算重叠；
#    - 把 `positions`、`seq_lens`、`slot_mapping` 放到 GPU 上算（`num_computed_tokens` 常驻 GPU，`BlockTable.compute_slot_mapping` 启动 `_compute_slot_mapping_kernel`），CPU 只拷小数组；Model Runner V2 把更多输入准备写成按 `idx_mapping` 读状态表的 Triton kernel，也算一种；
#    - 异步调度（`async_scheduling`）：第 t 步的前向还在 GPU 上跑时，CPU 已经调度并准备第 t+1 步（采样的 token 留在 GPU 上，下一步直接读；`discard_request_mask` 和乐观的 `seq_lens` 为此服务）；
#    - CUDA graph：把一步的几百次 kernel launch 变成一次 replay，缩短 CPU 侧的 launch 时间（第 11 课）；结构化输出的 bitmask 在前向期间由 EngineCore 计算（第 8 课）。
#    minivllm 在 CPU 上用 numpy 算全部数组再 `non_blocking` 拷贝，异步调度见 `async_scheduling`；它没有在 GPU 上算 slot mapping。
#
# **附：图 5-3 检查方法的参考解释**（不单独计分）：V1 的代价：(1) 每次 `condense`/`swap_states` 都要在 CPU 上搬一整行（token 行长 `max_model_len`、块表行、采样参数）并改所有按行号索引的状态，本次运行的次数见 `L05.moved_rows(run)` 的输出，批越大、请求进出越频繁移动越多；(2) 行号一变，异步调度时上一步留在 GPU 上的结果（采样 token、`num_computed_tokens`）要用 `prev_positions` 之类的映射重新对齐，重排与 `reorder_batch_threshold`、后端耦合；(3) 块表等仍要按行整段拷到 GPU。V2：请求一直在自己的槽位，行序变化只改 `idx_mapping` 这一个小数组，状态表可以常驻 GPU / UVA、由 Triton kernel 按 `idx_mapping` 间接读取，和异步调度、投机解码配合更简单；代价是每步要建新的 `InputBatch` 和 `idx_mapping`，kernel 多一次间接寻址，状态表按 `max_num_reqs` 预分配（`all_token_ids` 用 UVA 放在主机内存，源码注释说它可达数 GB）。
#
# **附：检查方法的参考解释**（不单独计分）：`final` 行已算 7、本步 3：`positions` 变成 7～9，`slot_mapping` 少了第一个槽（34），`query_start_loc` 最后一项变成 9，`seq_lens` 仍是 10；因为 10 ≥ prompt 长度 10，它仍到达末尾，仍取 logits，只是扁平序列里最后一个 token 的下标从 9 变成 8。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown]
# ## 评分规则
#
# - 代码 4 分：主路径 2 分（引擎混合批逐项相等 1 分、接入真实引擎 == HF 且向量化 1 分）、边界条件 1 分、能映射回源码对象 1 分；
# - Q1～Q3 各 2 分：必须包含对象、状态变化、正确性或成本链；
# - 一票否决：把论文峰值写成普遍生产结论；把源码支持写成所有模型/硬件可用；混淆算法正确性与性能；只背类名而说不清状态所有权。
#
# 总分 10 分，至少 8 分通过。参考答案与参考代码只在教师分支（solutions/）中：先独立完成；核对后请更换一个 batch（改 block_size、token budget 或到达时间）重新推演，不能只复制。
#
# ### 自检
#
# 下面的单元格用与 nbgrader 相同的检查函数给代码部分打分（Q1～Q3 显示为待人工评分）。

# %%
self_check("lesson05", globals());

# %% [markdown]
# ## 参考资料
#
# - [vLLM GPUModelRunner](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/worker/gpu_model_runner.py)
# - [vLLM InputBatch](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/worker/gpu_input_batch.py)
# - [vLLM BlockTable](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/worker/block_table.py)
# - [vLLM CommonAttentionMetadata](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/attention/backend.py)
# - [vLLM V1 architecture (current docs)](https://docs.vllm.ai/en/latest/design/arch_overview.html)
# - [FlashAttention varlen（`flash_attn_varlen_func`）](https://github.com/Dao-AILab/flash-attention)
#
# 源码链接固定到本课审阅 commit；runner 的实现（尤其异步调度与 GPU 上的输入准备）变化很快，current docs 与默认值会变，面试或部署前必须按目标版本重新核对。
#
# ← 上一课：第 4 课：抢占、取消与请求生命周期　｜　下一课 →：第 6 课：PagedAttention：Triton decode kernel
