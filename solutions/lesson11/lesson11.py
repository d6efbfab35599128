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
# 本课产出：说清一个 decode 批次怎样从每步几百次 kernel launch 变成一次 graph replay，并亲手写出其中三步：
#
# - **选尺寸**：这一步跑哪个捕获尺寸；
# - **填充**：把真实行和无害的填充行写进 graph 读的静态缓冲；
# - **取行**：replay 之后只把真实行交给采样。
#
# 通过要求：代码断言全部通过；Q1～Q3 沿源码对象给出因果链；能指出下面三件事；总分至少 8/10。
#
# - 正确性不变量：填充行不写 KV、不进入真实行的结果（本课在 CPU 上查 token 与不填充逐个相同；GPU 上可能有舍入级差别）；
# - 性能边界：填充行也要算，5 个请求的批次按 8 行算；
# - 需要 benchmark 才能确认的结论：在哪些 batch 大小上 graph 真的比 eager 快。
#
# | 部分 | 分值 | 评分方式 |
# |---|---|---|
# | 代码·主路径（选尺寸与填充一个批次 1 分 + 接入真实引擎 1 分） | 2 | 自动 |
# | 代码·边界条件（正好一个尺寸、超过最大尺寸、非 2 的幂的尺寸、上一批的残留、填充行不写 KV） | 1 | 自动 |
# | 代码·能映射回源码对象（`SOURCE_MAP`） | 1 | 自动 |
# | Q1～Q3 | 各 2 | 人工，按评分规则 |
#
# 本课在 CPU 上运行：minivllm 在 `enforce_eager=False` 时走与 GPU 相同的填充路径，只把 replay 换成 eager 前向；launch 次数见附录。
#
# 没有 nbgrader 时（例如 Colab），运行最后的“自检”单元格（或 `python -m autograder check lesson11`）。

# %% [markdown]
# ## 源码版本与阅读方法
#
# 源码固定在 vLLM {{VLLM_VERSION}}（commit {{VLLM_COMMIT}}）。沿“一个 decode 批次的一步”读：选哪个捕获尺寸、填充行写什么、replay 后哪几行交给采样。
#
# | 顺序 | vLLM 文件与入口 | minivllm 对应文件 | 带着什么问题读 |
# |---|---|---|---|
# | 1 | `vllm/config/vllm.py`：`VllmConfig._set_cudagraph_sizes`（L1831–1835、L1863–1876） | `minivllm/config.py`：`set_cudagraph_sizes` | 默认捕获哪些尺寸？为什么不是每个大小都捕获？ |
# | 2 | `vllm/v1/cudagraph_dispatcher.py`：`CudagraphDispatcher`（L82–91、L211–222、L274–281、L302–311） | `minivllm/compilation/cuda_graph.py`：`CudagraphDispatcher` | 5 个请求跑哪个 graph？超过最大尺寸呢？ |
# | 3 | `vllm/compilation/cuda_graph.py`：`CUDAGraphWrapper.__call__`（L279–282、L313–319、L346–360） | `minivllm/compilation/cuda_graph.py`：`CUDAGraphWrapper.capture` | graph 记下了什么？为什么只能改缓冲的内容？ |
# | 4 | `vllm/v1/worker/gpu_model_runner.py`：`_preprocess`（L3663–3664）、`_get_slot_mappings`（L4128–4130）、`_get_block_table`（L2338–2340） | `minivllm/worker/gpu_model_runner.py` | 填充行的位置、slot、块表填什么？ |
#
# **哪个 runner**：vLLM {{VLLM_VERSION}} 对课程的 dense 模型默认选 Model Runner V2；minivllm 的 runner 对应 V1。选尺寸、填充、取行两个 runner 都做。

# %%
# 上表各行在 vLLM {{VLLM_VERSION}} 源码里的样子：文件路径、行号与逐行原文（行号与上表一致；源码由第一个单元格获取并校验）。
from autograder.vllm_source import show_vllm

show_vllm("vllm/config/vllm.py", "VllmConfig._set_cudagraph_sizes", lines=(1831, 1835))
show_vllm("vllm/config/vllm.py", "VllmConfig._set_cudagraph_sizes", lines=(1863, 1876))
show_vllm("vllm/v1/cudagraph_dispatcher.py", "CudagraphDispatcher._compute_bs_to_padded_graph_size", lines=(82, 91))
show_vllm("vllm/v1/cudagraph_dispatcher.py", "CudagraphDispatcher.initialize_cudagraph_keys", lines=(211, 222))
show_vllm("vllm/v1/cudagraph_dispatcher.py", "CudagraphDispatcher.dispatch", lines=(274, 281))
show_vllm("vllm/v1/cudagraph_dispatcher.py", "CudagraphDispatcher.dispatch", lines=(302, 311))
show_vllm("vllm/compilation/cuda_graph.py", "CUDAGraphWrapper.__call__", lines=(279, 282))
show_vllm("vllm/compilation/cuda_graph.py", "CUDAGraphWrapper.__call__", lines=(313, 319))
show_vllm("vllm/compilation/cuda_graph.py", "CUDAGraphWrapper.__call__", lines=(346, 360))
show_vllm("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner._preprocess", lines=(3663, 3664))
show_vllm("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner._get_slot_mappings", lines=(4128, 4130))
show_vllm("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner._build_attention_metadata._get_block_table",
          lines=(2338, 2340))

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
# 一次 decode 前向每层有 10～20 个 kernel：RMSNorm、QKV 投影、rotary、写 KV、attention、输出投影、MLP，几十层就是几百个。CPU 每发一次 launch（Python、PyTorch 调度、驱动）约 5～10 µs（估计）。
#
# 小模型或小 batch 时，norm、rotary、写 KV、激活这类 kernel 只跑几微秒，比一次 launch 还短，GPU 在它们之间空等。7B 以上模型的 GEMM 每个要读几十到上百 MB 权重、跑十几到几十微秒，能部分盖住 launch：graph 的收益随模型变大而变小。
#
# CUDA graph 把一次前向的全部 kernel **录制**一次，之后每步只调用一次 `cudaGraphLaunch` **replay**。CPU 开销从每个 kernel 一次降到每步一次。
#
# 代价是 graph 是**静态**的：录制时每个 kernel 的张量地址、形状、grid 大小都固定了。于是：
#
# - 输入必须放在录制时的那组张量里（静态缓冲），每步只改内容；
# - 形状必须与录制时相同。batch 大小是动态的，所以只录几个尺寸（`cudagraph_capture_sizes`），每个批次**填充**到能装下它的最小尺寸。
#
# ### 2. 它如何工作
#
# 一个 decode 批次的一步：
#
# 1. **启动时捕获**：`capture_model` 对每个捕获尺寸预热一次、再录一个 graph，按 `BatchDescriptor` 存起来。
# 2. **分派**：每步 `CudagraphDispatcher.dispatch(num_tokens, uniform_decode)`。`FULL_DECODE_ONLY` 模式下，uniform decode 批次分到能装下它的**最小**尺寸；decode 整图只录不超过 `max_num_seqs` 的尺寸（不投机时），装不下的批次这一步 eager。
# 3. **填充**：把真实的 n 行写进静态缓冲的前 n 行，把 `n..size` 的填充行设成无害的值（minivllm：`_pad_for_cudagraph`；vLLM V1：上表第 4 行三个函数就地写持久缓冲）。
# 4. **replay**：回放 `size` 行的 graph。
# 5. **只取真实行**：输出有 `size` 行，只有前 n 行交给 logits 和采样（vLLM：`logits_indices` 只指向真实请求）。
#
# 捕获尺寸不一定是 2 的幂。vLLM 的默认列表是 `[1, 2, 4]`、8 到 248 每隔 8 一个、再往上每隔 16 一个，截到 `max_cudagraph_capture_size`；17 个请求填到 24，而不是 32。
#
# ### 3. 正确性条件与常见误区
#
# 填充行的每个字段都要无害：
#
# - **slot 为 `PAD_SLOT_ID`（-1）**：写 KV 的 kernel 见到 -1 就跳过。slot 0 属于 `BlockPool` 留出的 null block（块 0），填充行也不应往里写。
# - **长度为 0**：attention 什么都不读。
# - **位置为 0**：rotary 用位置查 cos/sin 表。填 -1 时，minivllm 的 `cos_cache[positions]` 悄悄取最后一行；vLLM V1 在 `_preprocess` 里把填充行的位置清零。
# - **块表行为 0**：指向 null block（V1：`NULL_BLOCK_ID`）。
# - **token 为 0**：任何合法 token 都无害，本课检查要求 0。
#
# 静态缓冲残留上一批的内容，所以填充行每步要重写。
#
# 只返回真实行：否则引擎会以为有 `size` 个请求，或把填充行采出的 token 给真实请求。
#
# 选最小的能装下的尺寸：选更大的不会算错，但小批次白算许多行（Q3）。
#
# ### 4. 性能与工程取舍
#
# - 填充行也要算。小 batch 的 decode 受带宽限制，GEMM 的时间主要花在读一遍权重上，多几行几乎不增加时间；batch 大到计算受限时，填充行就是真实的计算（Q3）。
# - 捕获尺寸越密，填充浪费越少；但每个尺寸一个 graph，启动时间和 graph 显存随尺寸数增长。vLLM 的默认列表在小 batch 处密、大 batch 处疏。
# - 混合与 prefill 批次 vLLM 也按 token 数录图，只到 `max_cudagraph_capture_size`（默认不超过 512）：默认的 `FULL_AND_PIECEWISE` 把它们填充后走分段图（attention 不在图里）。
# - 更大的批次不录：kernel 已够长、盖住了 launch；按 token 数覆盖到几千，要么图太多、要么填充太多（Q2）。
# - 默认模式不为混合批次录整图：其 `query_start_loc`、`max_query_len` 每步都变，许多后端的元数据与 kernel 随之变；声明 `ALWAYS` 的后端也默认让 attention 在图外跑（一般更快），只有显式 `cudagraph_mode=FULL` 才录。

# %%
SIZES = [1, 2, 4, 8, 16, 24, 32, 40]
table = L11.padding_table(SIZES, 42)
L11.plot_padding(table, SIZES);

# %% [markdown]
# 图 11-1：只按列表 `[1, 2, 4, 8, 16, 24, 32, 40]`（vLLM 默认列表的开头）选尺寸，decode 批次 1～42 个请求。左：每个批次实际算多少行，虚线是不填充；右：填充行占计算行的比例。
#
# - 3 个请求按 4 行算（25% 白算），5 个按 8 行（37.5%），9 个按 16 行（44%），17 个按 24 行（29%）；
# - 41、42 个请求超过最大尺寸，eager（没有柱）。vLLM 的 decode 整图还只录不超过 `max_num_seqs` 的尺寸（附录）；
# - 浪费的上限由相邻两个尺寸的间隔决定：最坏是刚过一个尺寸的批次。
#
# CPU 上不计时：小模型的前向主要是调度开销，说明不了填充的代价；Q3 从图 11-1 和成本链推理。

# %% [markdown]
# ## 实践任务：唯一代码填空题
#
# 下面三个函数是 minivllm `CudagraphDispatcher.padded_size` 与 `GPUModelRunner._pad_for_cudagraph` 的核心，外加采样前的取行：
#
# - `choose_capture_size(num_reqs, capture_sizes)`：能装下 `num_reqs` 行的最小捕获尺寸；一个都装不下时返回 None（这一步 eager）。列表不一定升序，也不一定是 2 的幂。
# - `fill_static_buffers(bufs, input_ids, positions, slot_mapping, seq_lens, block_table, size)`：`bufs` 是 runner 的静态缓冲，字段与参数同名。
#
#   把 n 个真实行写进前 n 行，把 `n..size` 的填充行设成无害的值。
# - `real_rows(hidden, num_reqs)`：replay 输出 `size` 行 hidden states；只把真实行交给 `compute_logits` 与采样（vLLM：`hidden_states[logits_indices]`）。
#
# 检查时 `L11.plug` 把它们接进 `enforce_eager=False` 的 runner：分派、填充和前向之后各调一个。
#
# 只改 `______` 处，不删断言、不放宽条件。

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
    # TODO 2. bufs.block_table still holds the previous batch's block ids: the padded rows must not keep them.
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


def real_rows(hidden, num_reqs):
    """Only the real requests' hidden rows go on to compute_logits and sampling."""
    # TODO 4. The replay computed `size` rows; which of them belong to requests?
    rows = hidden[:num_reqs]  ### BLANK
    return rows


# %%
# 逐项报告（不会中断 Run All）：每个自动评分部分一行，✗ 后面是第一处不符合的地方。
report("lesson11", globals())

# %% [markdown]
# 第一项检查（1 分）：尺寸的选择，包括 24、40 这样不是 2 的幂的尺寸；一个 5 请求的批次填进一组刚分配的缓冲、填充到 8 行后每个字段的值；`real_rows` 只留前 5 行。

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
# 第二项检查（1 分）：同一批 prompt 分别用 eager 和接了你的函数的填充路径贪心生成，逐 token 比较：3 个请求填充到 4；8 个请求陆续结束，依次填到 8、4、2、1。
#
# 每步还查填充行的位置不越界、`real_rows` 只返回 n 行。

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
# 第三项检查（1 分）：8 个请求正好是一个尺寸，9 个超过最大尺寸（None，eager）；上面这组残留 77 的缓冲。隐藏测试还查尺寸 24、40、41、捕获尺寸 `[1, 3, 6]` 的引擎，以及填充行没写本批之外的 KV 块。

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
# 这 1 分自动评分：写出 vLLM {{VLLM_COMMIT}} 中下面每个概念的方法名（字符串；大小写不限，可带类名前缀）。每项都给了位置，看一眼即可。
#
# - `padded_descriptor`：把一步的 token 数换成填充后的 `BatchDescriptor` 的方法：上面 `dispatch` 摘录 L303 调用的那个；
# - `sorted_sizes`：把 `cudagraph_capture_sizes` 排成升序并核对最大尺寸的 `CompilationConfig` 方法：`vllm/config/vllm.py` L1943（`_set_cudagraph_sizes` 最后一行）调用它；
# - `uniform_check`：判断本步是不是 uniform decode 批次的 `GPUModelRunner` 方法：`vllm/v1/worker/gpu_model_runner.py` L3954（`_determine_batch_execution_and_padding` 第一条语句）调用它。

# %% nbgrader={"grade": false, "grade_id": "l11_source_map_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
SOURCE_MAP = {
    "padded_descriptor": "CudagraphDispatcher._create_padded_batch_descriptor",  ### BLANK
    "sorted_sizes": "CompilationConfig.post_init_cudagraph_sizes",  ### BLANK
    "uniform_check": "GPUModelRunner._is_uniform_decode",  ### BLANK
}

# %% nbgrader={"grade": true, "grade_id": "l11_source_map", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
L11.check_source_map(SOURCE_MAP)

# %% [markdown] nbgrader={"grade": false, "grade_id": "l11_q1", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q1（2 分）
#
# CUDA graph 让一个 decode 步省掉了哪部分时间、哪部分省不掉？据此说明它的收益为什么在小模型、小 batch 时最大。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 三点都有：（1）省掉的是 CPU 逐个发 kernel 的开销（每次约 5～10 µs；几百次 launch 换成一次 `cudaGraphLaunch`）和 GPU 在 kernel 之间等 CPU 的空隙；（2）省不掉的是 kernel 本身的执行时间（读权重与 KV、计算），以及 graph 之外的 CPU 工作（调度、准备输入、采样），只说 kernel 执行时间即得此点；（3）小模型、小 batch 时许多 kernel 只跑几 µs，比一次 launch 还短，步时间由 launch 开销决定，graph 省得最多；模型变大（GEMM 读几十 MB 权重、跑几十 µs）或 batch 变大（attention 读的 KV 与逐 token 的计算增长，直到计算受限）后，GPU 执行时间盖住 launch，收益变小。1 分 = 三点缺一（例如说对省掉与省不掉的部分，但没说收益为什么随规模变小；或说了规模的影响，但把省不掉的部分说成也被省掉）；0 分 = 认为 graph 让 kernel 本身算得更快或减少了计算量，或三点缺二。不计分的补充：用 profiler 数 `cudaLaunchKernel` 与 `cudaGraphLaunch`（附录）验证。
#
# **参考答案**
#
# CUDA graph 把一次前向的几百次 kernel launch 换成一次 `cudaGraphLaunch`，省掉的是 CPU 逐个发 kernel 的开销（每次约 5～10 µs，估计）和 GPU 在 kernel 之间等 CPU 的空隙。省不掉的是每个 kernel 本身的执行时间（读权重与 KV、计算），以及 graph 之外的调度、准备输入和采样。小模型、小 batch 时 norm、rotary、写 KV 这类 kernel 只跑几 µs，比一次 launch 还短，步时间由 launch 决定，graph 省下的比例最大。模型变大后 GEMM 读几十 MB 权重、跑几十 µs；batch 变大后 attention 读的 KV 与逐 token 的计算增长，直到计算受限。两者都让 GPU 执行时间盖住 launch，步时间 ≈ max(launch 总开销, 读权重与计算的时间)，graph 的收益随之变小。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l11_q2", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q2（2 分）
#
# 混合与 prefill 批次，vLLM 默认只把不超过 `max_cudagraph_capture_size` 个 token 的填充后走分段图（attention 在图外）。为什么不录整图，更大的也不录？
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：（a）attention：混合批次的 `query_start_loc`、`max_query_len` 每步变化，多数 attention 后端的元数据与 kernel（或 grid）随之变化，一组静态缓冲录不下，所以 attention 留在图外；只有声明 `AttentionCGSupport.ALWAYS` 的后端在 `cudagraph_mode=FULL` 下录整图；（b）收益小：上限之上的批次 kernel 处理成百上千个 token，执行时间远大于 launch 开销；（c）尺寸与填充：按 token 数覆盖到几千，要么 graph 太多（捕获时间、显存），要么间隔大、填充行多，而 prefill 计算受限，填充行是真实的计算。2 分 = （a）说出变化的对象及其后果，再加（b）或（c）之一；1 分 = 只有（a），或只有（b）、（c）而没有（a）；0 分 = 没有成立的理由，或说 vLLM 从不为混合、prefill 批次用 graph。
#
# **参考答案**
#
# 混合批次的 `query_start_loc`、`max_query_len` 每步都变，多数 attention 后端的元数据和 kernel（或 grid）随之变化，无法用一组静态缓冲录成一张图；所以默认把 attention 留在图外、只录分段图，只有声明 `AttentionCGSupport.ALWAYS` 的后端在 `cudagraph_mode=FULL` 下才录整图。上限之上不录：几百上千个 token 的 kernel 已经跑得够长，盖住了 launch，graph 省不了多少；要按 token 数覆盖到几千，要么 graph 太多（捕获时间、显存），要么间隔大、填充行多，而 prefill 计算受限，填充行是真实的计算。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l11_q3", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q3（2 分）
#
# 图 11-1 里 9 个请求按 16 行算，多出 7 个填充行。它们让一步变慢多少？分两种情况说明：小 batch 的 decode，以及同样的填充比例出现在计算受限的大 batch 上。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 两种情况都对并说出原因：（1）小 batch 的 decode 受带宽限制，一步的时间主要是读一遍权重，与行数几乎无关，7 个填充行几乎不增加时间；（2）计算受限时（同样 16/9 的比例）填充行在每层 QKV、o_proj、MLP 里都是真实的计算，线性层（QKV、o_proj、MLP）的时间约按 16/9 ≈ 1.8 倍增长；答“约 1.8 倍”，或“线性层约 1.8 倍，层与整步都少于此（填充行的 attention 不读 KV，lm_head 只算真实行，采样与调度不变）”都对。说出填充行的 attention 因 `seq_lens = 0` 不读 KV、slot 为 -1 不写 KV，是好的补充，不要求。1 分 = 只说对一种情况（例如只说“多算 7/9 的行、慢约 1.8 倍”，或只说“填充几乎免费”），或两种情况的结论对但没有原因；0 分 = 两种情况都不对，或认为填充行的输出会进入真实请求的结果（说 GPU 上填充改变矩阵乘法的形状、可能带来舍入级差别是对的）。
#
# **参考答案**
#
# 填充行走完每层的 QKV、o_proj、MLP（attention 因 `seq_lens = 0` 不读 KV，slot 为 -1 不写 KV）；lm_head 只对 `logits_indices` 的真实行计算，填充行由 `real_rows` 丢掉。小 batch 的 decode 受带宽限制，一步的时间主要是把权重读一遍，16 行和 9 行读的权重一样多，所以几乎不变慢。同样的比例出现在计算受限的大 batch 上时，填充行就是真实的计算，decoder 层的矩阵乘法约按 16/9 ≈ 1.8 倍增长；整步慢得少于 1.8 倍，因为 lm_head、采样与调度不变。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown]
# ## 评分规则
#
# - 代码 4 分：主路径 2 分（选尺寸与填充一个批次 1 分、接入真实引擎 1 分）、边界条件 1 分、能映射回源码对象 1 分；
# - Q1～Q3 各 2 分：必须包含对象、状态变化、正确性或成本链；
#
# 总分 10 分，至少 8 分通过。
#
# ### 自检
#
# 下面的单元格用与 nbgrader 相同的检查函数给代码部分打分（Q1～Q3 显示为待人工评分）。

# %%
self_check("lesson11", globals());

# %% [markdown]
# ## 附录（选读）
#
# 选读：GPU 上的 launch 次数、在真实 vLLM 上分派同一批次、与 vLLM {{VLLM_VERSION}} 的全部差异和参考资料，不计入核心路径。

# %% [markdown]
# ### CPU 看不到的：GPU 上的 launch 次数
#
# CPU 上的检查证明了填充路径的**正确性**，证明不了它为什么**快**：CPU 没有 kernel launch，也没有 graph。
#
# 下面的单元格在有 CUDA 时用 `torch.profiler` 数一次 8 请求 decode 前向的 CUDA 运行时调用：eager 每个 kernel 一次 `cudaLaunchKernel`，graph 整个前向一次 `cudaGraphLaunch`。
#
# 本课还没有 GPU 上的记录（计数与耗时都没有）。正文“每次 launch 5～10 µs”是估计，含 Python 与 PyTorch 的调度。
#
# 一个公开的裸 CUDA 测量（RTX 5070 Ti，CUDA 13）是每次提交约 4～6 µs：[pegainfer (3): From Launch Overhead to CUDA Graph](https://susun-blog.com/blog/pegainfer-3-cuda-graph)。

# %%
L11.print_launch_counts(L11.launch_counts(8))

# %% [markdown]
# ### 在真实 vLLM {{VLLM_VERSION}} 上看同一件事
#
# 本课的几组设置交给 vLLM 自己的 `VllmConfig`。CPU 上 `CpuPlatform.check_and_update_config` 清空捕获列表（“vLLM on CPU” 一列）。
#
# 于是在同一个配置上换回 `FULL_DECODE_ONLY`、重跑 vLLM 的 `_set_cudagraph_sizes`，再问 V1 的 `CudagraphDispatcher.dispatch` 每个 decode 批次跑多少行：这是 GPU 上会发生的事。
#
# 看 `default_20_seqs`：vLLM 的列表到 2 × max_num_seqs = 40，但整图 decode 只录不超过 max_num_seqs 的尺寸（`initialize_cudagraph_keys`），17～20 个请求在这个模式下 eager（默认的 `FULL_AND_PIECEWISE` 把它们填到 24、走分段图）；minivllm 把 20 本身加进列表。
#
# 主路径评分的最后一步就是这张表：给你的 `choose_capture_size` vLLM 录下的 decode 尺寸，每个批次大小都要与 `dispatch` 相同。

# %%
L11.vllm_side_by_side(choose_capture_size);

# %% [markdown]
# ### 与 vLLM {{VLLM_VERSION}} 的差异
#
# - **runner**：Model Runner V2（`v1/worker/gpu/`）的 `ModelCudaGraphManager` 在启动时为每个 `BatchExecutionDescriptor` 录图，每步 `dispatch` 返回匹配的描述符，不匹配时这一步 eager。
# - **静态缓冲**：vLLM 的静态缓冲就是 runner 的持久输入，在准备输入时就地写入；minivllm 另设一组 `cg_*` 缓冲，在 `_pad_for_cudagraph` 里一次填好。
# - **填充行的 token**：vLLM V1 不重写填充行的 token，留着之前的合法 token id；本课的检查要求 0，使答案唯一。
# - **块表**：minivllm 把前 `size` 行整片清零；V1 把填充行填成 `NULL_BLOCK_ID`，V2 的 `_gather_block_tables_kernel` 把填充行清零、真实行只拷前 `num_blocks` 列，其余列由 `seq_lens` 挡住不读。检查接受两种做法。
# - **分派的返回值**：minivllm 不用 graph 时返回 None；V1 的 `CudagraphDispatcher.dispatch` 总是返回 `(CUDAGraphMode, BatchDescriptor)`；V2 返回 `BatchExecutionDescriptor`。
# - **尺寸表**：vLLM 的 `_bs_to_padded_graph_size` 是预先算好的数组，一次查表；minivllm 用 `padded_size` 现算。
# - **在哪里录图**：minivllm 用显式的 `CUDAGraphWrapper.capture`；V1 的 `CUDAGraphWrapper` 在 `__call__` 里第一次见到某个描述符时录制，由 `_dummy_run` 触发；V2 用 `ModelCudaGraphManager.capture`。
# - **uniform decode**：minivllm 只认每个请求恰好 1 个 token；vLLM 是每个请求 `1 + num_speculative_tokens` 个，尺寸按 token 数算。
# - **混合批次的整图**：`cudagraph_mode=FULL` 配合声明 `AttentionCGSupport.ALWAYS` 的后端时，vLLM 把混合批次也录成整图。
# - **CPU**：minivllm 在 CPU 上把 replay 换成 eager 前向以便检查；vLLM 在 CPU 上不用 CUDA graph。

# %% [markdown]
# ### 参考资料
#
# - [vLLM CUDA graph dispatcher](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/cudagraph_dispatcher.py)
# - [vLLM CUDAGraphWrapper](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/compilation/cuda_graph.py)
# - [vLLM CompilationConfig（捕获尺寸、cudagraph_mode）](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/config/compilation.py)
# - [vLLM GPUModelRunner（V1：填充、捕获）](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/worker/gpu_model_runner.py)
# - [vLLM Model Runner V2 的 graph 管理](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/worker/gpu/cudagraph_utils.py)
# - [CUDA Graphs（CUDA C++ Programming Guide）](https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#cuda-graphs)
# - [PyTorch CUDA Graphs](https://pytorch.org/docs/stable/notes/cuda.html#cuda-graphs)
# - [vLLM CUDA Graphs design doc (current docs)](https://docs.vllm.ai/en/latest/design/cuda_graphs.html)
#
# 源码链接固定到本课审阅的 commit；current docs、默认捕获尺寸与 cudagraph_mode 会变化，部署前按目标版本重新核对。
#
# ← 上一课：第 10 课：分布式执行：张量并行、Executor 与 all-reduce　｜　下一课 →：第 12 课：前端与在线服务：AsyncLLM、ZMQ/msgspec、SSE 与基准测试
