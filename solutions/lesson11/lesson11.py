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
# - 正确性不变量：填充后生成的 token 与不填充逐个相同，填充行不写任何 KV 块；
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
# 本课在 CPU 上运行：minivllm 在 `enforce_eager=False` 时走与 GPU 相同的填充路径，只把 replay 换成一次 eager 前向。launch 次数只有 GPU 能给出（见附录）。
#
# 没有 nbgrader 时（例如 Colab），运行最后的“自检”单元格（或 `python -m autograder check lesson11`）。

# %% [markdown]
# ## 源码版本与阅读方法
#
# 源码固定在 vLLM 0.27.1（commit 8e958902eee5）。沿“一个 decode 批次的一步”读：选哪个捕获尺寸、填充行写什么、replay 后哪几行交给采样。
#
# | 顺序 | vLLM 文件与入口 | minivllm 对应文件 | 带着什么问题读 |
# |---|---|---|---|
# | 1 | `vllm/config/vllm.py`：`VllmConfig._set_cudagraph_sizes`（L1831–1837、L1858–1884） | `minivllm/config.py`：`set_cudagraph_sizes` | 默认捕获哪些尺寸？为什么不是每个大小都捕获？ |
# | 2 | `vllm/v1/cudagraph_dispatcher.py`：`CudagraphDispatcher`（L82–91、L207–222、L274–281、L302–324） | `minivllm/compilation/cuda_graph.py`：`CudagraphDispatcher` | 5 个请求跑哪个 graph？含 prefill 时呢？ |
# | 3 | `vllm/compilation/cuda_graph.py`：`CUDAGraphWrapper.__call__`（L279–283、L313–319、L346–361） | `minivllm/compilation/cuda_graph.py`：`CUDAGraphWrapper.capture` | graph 记下了什么？为什么只能改缓冲的内容？ |
# | 4 | `vllm/v1/worker/gpu_model_runner.py`：`_get_slot_mappings`（L4124–4132）、`_get_block_table`（L2334–2341） | `minivllm/worker/gpu_model_runner.py`：`_pad_for_cudagraph` | 填充行的 slot、块表填什么？ |
#
# **哪个 runner**：vLLM 0.27.1 对课程的 dense 模型默认选 Model Runner V2；minivllm 的 runner 对应 V1。选尺寸、填充、取行两个 runner 都做（V2 见附录）。

# %%
# 上表各行在 vLLM 0.27.1 源码里的样子：文件路径、行号与逐行原文（行号与上表一致；源码由第一个单元格获取并校验）。
from autograder.vllm_source import show_vllm

show_vllm("vllm/config/vllm.py", "VllmConfig._set_cudagraph_sizes", lines=(1831, 1837))
show_vllm("vllm/config/vllm.py", "VllmConfig._set_cudagraph_sizes", lines=(1858, 1884))
show_vllm("vllm/v1/cudagraph_dispatcher.py", "CudagraphDispatcher._compute_bs_to_padded_graph_size", lines=(82, 91))
show_vllm("vllm/v1/cudagraph_dispatcher.py", "CudagraphDispatcher.initialize_cudagraph_keys", lines=(207, 222))
show_vllm("vllm/v1/cudagraph_dispatcher.py", "CudagraphDispatcher.dispatch", lines=(274, 281))
show_vllm("vllm/v1/cudagraph_dispatcher.py", "CudagraphDispatcher.dispatch", lines=(302, 324))
show_vllm("vllm/compilation/cuda_graph.py", "CUDAGraphWrapper.__call__", lines=(279, 283))
show_vllm("vllm/compilation/cuda_graph.py", "CUDAGraphWrapper.__call__", lines=(313, 319))
show_vllm("vllm/compilation/cuda_graph.py", "CUDAGraphWrapper.__call__", lines=(346, 361))
show_vllm("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner._get_slot_mappings", lines=(4124, 4132))
show_vllm("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner._build_attention_metadata._get_block_table",
          lines=(2334, 2341))

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
# 一次 decode 前向每层有 10～20 个小 kernel：RMSNorm、QKV 投影、rotary、写 KV、attention、输出投影、MLP，几十层就是几百个。batch 小时每个 kernel 在 GPU 上只跑几微秒，而 CPU 每发一次 launch（Python、PyTorch 调度、驱动）要 5～10 微秒：GPU 大部分时间在等 CPU。
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
# 3. **填充**：`_pad_for_cudagraph` 把真实的 n 行写进静态缓冲的前 n 行，把 `n..size` 的填充行设成无害的值。
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
# - **位置为 0**：rotary 用位置查 cos/sin 表。填 -1 时，PyTorch 索引（minivllm 的 `cos_cache[positions]`）在任何设备上都悄悄取最后一行；vLLM 的 rotary kernel 不查边界，越界读。
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
# - 捕获尺寸越密，填充浪费越少；但每个尺寸一个 graph，启动时间和 graph 显存随尺寸数增长。vLLM 的默认列表在小 batch 处密、大 batch 处疏：小 batch 正是 launch 开销占比最大处（Q1）。
# - `FULL_DECODE_ONLY` 只为 decode 批次录整图。prefill 的 token 数从几个到几千，按 token 数捕获要么尺寸太多、要么填充太大；prefill 的 kernel 也够大，launch 开销不显著（Q2）。
# - vLLM 默认的 `FULL_AND_PIECEWISE` 让其余批次走分段图；`cudagraph_mode=FULL` 且 attention 后端声明 `AttentionCGSupport.ALWAYS` 时，混合批次也录整图。

# %%
SIZES = [1, 2, 4, 8, 16, 24, 32, 40]
table = L11.padding_table(SIZES, 42)
L11.plot_padding(table, SIZES);

# %% [markdown]
# 图 11-1：只按列表 `[1, 2, 4, 8, 16, 24, 32, 40]`（vLLM 默认列表的开头）选尺寸，decode 批次 1～42 个请求。左：每个批次实际算多少行，虚线是不填充；右：填充行占计算行的比例。
#
# - 3 个请求按 4 行算（25% 白算），5 个按 8 行（37.5%），9 个按 16 行（44%），17 个按 24 行（29%）；
# - 41、42 个请求超过最大尺寸，不填充、eager（没有柱）。默认设置下 vLLM 的列表止于 40 意味着 `max_num_seqs = 20`，这时 17～20 个请求走 eager（附录的 `default_20_seqs`）；
# - 浪费的上限由相邻两个尺寸的间隔决定：最坏是刚过一个尺寸的批次。
#
# 这里不在 CPU 上计时填充的代价：小模型在 2 核 CPU 上的前向主要是调度开销，耗时比随负载大幅波动，说明不了填充的代价。Q3 从图 11-1 和成本链推理。

# %% [markdown]
# ## 实践任务：唯一代码填空题
#
# 下面三个函数是 minivllm `CudagraphDispatcher.padded_size` 与 `GPUModelRunner._pad_for_cudagraph` 的核心，外加采样前的取行：
#
# - `choose_capture_size(num_reqs, capture_sizes)`：能装下 `num_reqs` 行的最小捕获尺寸；一个都装不下时返回 None（这一步 eager）。列表不一定升序，也不一定是 2 的幂。
# - `fill_static_buffers(bufs, input_ids, positions, slot_mapping, seq_lens, block_table, size)`：`bufs` 是 runner 的静态缓冲，字段与参数同名。
#
#   把 n 个真实行写进前 n 行，把 `n..size` 的填充行设成无害的值。
# - `real_rows(logits, num_reqs)`：replay 输出 `size` 行，只返回真实请求的那些行。
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


def real_rows(logits, num_reqs):
    """Only the real requests' rows go on to sampling."""
    # TODO 4. The replay computed `size` rows; which of them belong to requests?
    rows = logits[:num_reqs]  ### BLANK
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
# 第二项检查（1 分）：同一批 prompt 用 `enforce_eager=True` 和接了你的函数的 `enforce_eager=False` 贪心生成，逐 token 比较。3 个请求填充到 4；8 个请求陆续结束，依次填充到 8、4、2、1。
#
# 每步还检查填充行的位置在 `[0, max_model_len)`、`real_rows` 只返回 n 行。

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
# 第三项检查（1 分）：8 个请求正好是一个尺寸，9 个超过最大尺寸（None，eager）；上面这组残留 77 的缓冲。隐藏测试还查尺寸 24、40、41 和捕获尺寸 `[1, 3, 6]` 的引擎，并核对每次带填充行的前向没有写本批块表之外的 KV 块。
#
# > 真实行超出本批块表宽度的列不检查（见附录）。

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
# 这 1 分自动评分：在 vLLM 8e958902eee5 中找到下面每个概念的名字（方法或属性名，字符串；大小写不限，可带类名前缀）。
#
# - `padded_descriptor`：`CudagraphDispatcher` 里把一步的 token 数换成填充后的 `BatchDescriptor` 的方法；
# - `sorted_sizes`：`CompilationConfig`（`vllm/config/compilation.py`）里把 `cudagraph_capture_sizes` 排成升序并核对最大尺寸的方法。所以 vLLM 的尺寸表总是升序，而你的 `choose_capture_size` 不能指望这一点；
# - `decode_query_len`：`CudagraphDispatcher` 里“一个 uniform decode 请求每步有几个 query token”的属性。

# %% nbgrader={"grade": false, "grade_id": "l11_source_map_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
SOURCE_MAP = {
    "padded_descriptor": "CudagraphDispatcher._create_padded_batch_descriptor",  ### BLANK
    "sorted_sizes": "CompilationConfig.post_init_cudagraph_sizes",  ### BLANK
    "decode_query_len": "uniform_decode_query_len",  ### BLANK
}

# %% nbgrader={"grade": true, "grade_id": "l11_source_map", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
L11.check_source_map(SOURCE_MAP)

# %% [markdown] nbgrader={"grade": false, "grade_id": "l11_q1", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q1（2 分）
#
# 为什么小 batch 的 decode 一步的时间常常由 kernel launch 开销而不是计算决定？CUDA graph 去掉了哪一部分成本、没去掉哪一部分？请用一次 decode 前向的 kernel 数和每个 kernel 的时间粗略估算，并说明 batch 变大时这个比例怎样变化。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 成本链完整：一次 decode 前向每层约 10～20 个 kernel（norm、QKV、rotary、写 KV、attention、o_proj、norm、gate/up、act、down、残差），几十层就是几百个 launch；每次 launch 的 CPU 端开销（Python + PyTorch 调度 + 驱动）约 5～10 µs，而小 batch 时每个 kernel 在 GPU 上只跑几 µs（受带宽限制：读一遍该层权重），所以 GPU 在 kernel 之间空等 CPU，步时间 ≈ launch 次数 × 单次开销；CUDA graph 把几百次 launch 换成一次 `cudaGraphLaunch`，去掉的是 CPU 端的逐 kernel 开销与 kernel 之间的空隙，没去掉的是 kernel 本身的执行时间（读权重与 KV 的带宽）以及 graph 之外的工作（调度、准备输入、采样、填充行的计算）；batch 变大时每个 kernel 变长而 launch 数不变，launch 开销占比下降，graph 的收益随之变小；能提到用 profiler 的 launch 计数验证；1 分 = 只说“launch 有开销、graph 减少 launch”而没有量级或没有说 batch 增大时的变化；0 分 = 认为 CUDA graph 让 kernel 本身算得更快、或减少了 FLOP（一票否决：混淆算法正确性与性能）。
#
# **参考答案**
#
# 1. 一次前向的 kernel 数：每个 decoder 层约 10～20 个 kernel，32 层的模型就是 300～600 个 launch；再加 embedding、最后的 norm 与 lm_head。
# 2. 每个 kernel 的时间：小 batch 的 decode 受带宽限制，一个 kernel 读一层的一部分权重只要几 µs；而 CPU 发一次 launch 要 5～10 µs。CPU 发得比 GPU 算得慢，GPU 在 kernel 之间空等，一步的时间 ≈ launch 数 × 单次开销。
# 3. graph 去掉什么：录制一次之后，每步只调用一次 `cudaGraphLaunch`，CPU 开销从几百次变成一次，kernel 之间的空隙消失。没去掉的：kernel 本身的执行时间、graph 之外的 CPU 工作（调度、`_prepare_inputs`、拷进静态缓冲、采样），以及填充行多算的那一点。
# 4. batch 变大：每个 kernel 处理更多行，执行时间变长（最终计算受限），launch 数不变，开销占比下降；所以 graph 的收益在 batch 1～几十时最大，vLLM 的默认尺寸也在小 batch 处最密。
# 5. 验证：“CPU 看不到的”一节的 profiler 计数；速度结论要在目标 GPU 上用交替的 benchmark 确认。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l11_q2", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q2（2 分）
#
# minivllm 和 vLLM 的 `FULL_DECODE_ONLY` 模式只为 uniform decode 批次录整图。为什么不把 prefill 或混合批次也录成整图？请从形状、填充成本、launch 开销占比和 attention 元数据四个方面说明；再说出 vLLM 默认的 `FULL_AND_PIECEWISE` 怎样处理其余批次、什么条件下混合批次也录整图。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 四方面都有因果：（形状）uniform decode 批次的形状只由请求数决定，请求数有界（`max_num_seqs`），几个尺寸就能覆盖；prefill 批次的 token 数从 1 到 `max_num_batched_tokens`，还取决于每个请求的 query 长度分布；（填充）按 token 数填充时间隔要么密到 graph 数量爆炸（启动时间、显存），要么疏到填充浪费巨大，而 prefill 是计算受限的，填充行就是真实 FLOP；（开销占比）prefill 的 kernel 处理成百上千个 token，launch 开销占比很小，graph 收益小；（元数据）混合批次的 attention 要按 `query_start_loc` 分段、prefill 与 decode 可能走不同 kernel、max_query_len 变化，grid 随之变化的 kernel 无法用一组静态缓冲录成一张图；并说出这一步 eager（minivllm 的 `dispatch` 返回 None，vLLM V1 返回 `(CUDAGraphMode.NONE, BatchDescriptor(num_tokens))`，V2 返回 `cg_mode` 为 NONE 的描述符——说清是哪个系统即可）；`FULL_AND_PIECEWISE` 对其余批次用 torch.compile 切出的分段图（attention 之外录成 piecewise graph，attention 本身 eager），按 token 数填充；整图装下混合批次的条件：attention 后端声明 `AttentionCGSupport.ALWAYS`（Triton 后端、FlashAttention 3）且 `cudagraph_mode=FULL`。答 uniform decode 在投机解码时是每个请求 1 + k 个 token 也对。**学生若说某些后端的整图用于混合批次会算错，并举出 vLLM 自己的限制（FlashAttention 2 只声明 `UNIFORM_BATCH`：`v1/attention/backends/flash_attn.py` 的注释说它的 max_query_len=1 packed-GQA 处理使整图不能用于非投机的混合批次），这是正确的，给分。** 1 分 = 只说“prefill 形状多变”而缺少成本或元数据的理由；0 分 = 笼统地认为“录成 graph 就会算错、所以 prefill 不能录”，而说不出是哪个后端的哪条限制（一票否决：混淆算法正确性与性能）。
#
# **参考答案**
#
# 1. 形状：一个 uniform decode 批次有 n 个请求、n 个 token，形状只由 n 决定，n ≤ `max_num_seqs`，几个尺寸就覆盖了。prefill 或混合批次的 token 数可以是 1 到 `max_num_batched_tokens` 之间的任何数，同样的 token 数还可以由不同的请求数和 query 长度组成。
# 2. 填充成本：要覆盖这么大的范围，尺寸要么很密（几百个 graph：启动时捕获很久、每个 graph 占显存），要么很疏（一个 2049 token 的批次填到 4096）。prefill 是计算受限的，填充行是真实的 FLOP。
# 3. 开销占比：prefill 的每个 kernel 处理成百上千个 token，执行时间远大于几 µs 的 launch 开销，graph 能省的比例很小；decode 小 batch 恰恰相反（Q1）。
# 4. attention 元数据：decode 批次的元数据可以用固定形状的静态缓冲表示，长度变化只改内容；对多数后端，混合批次的 `query_start_loc`、`max_query_len`、prefill/decode 的分界会改变走哪个 kernel、grid 多大。声明 `AttentionCGSupport.ALWAYS` 的后端（Triton、FlashAttention 3）例外：`cudagraph_mode=FULL` 时混合批次也按 token 数填充后录进整图。FlashAttention 2 只声明 `UNIFORM_BATCH`。
# 5. 所以在 `FULL_DECODE_ONLY` 下，非 uniform decode 或填充后超过 `max_num_seqs` 的批次 eager。vLLM 默认的 `FULL_AND_PIECEWISE` 对其余批次用 torch.compile 把模型在 attention 处切开，attention 之外的部分按 token 数录成分段图，attention 在分段之间 eager 执行。minivllm 没有 torch.compile，不做这一步。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l11_q3", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q3（2 分）
#
# 填充的代价是什么？用图 11-1 的数字说明哪些批次大小浪费最多；再说明这些多算的行在带宽受限和计算受限时各花多少时间、为什么本机 CPU 上测不出来，以及你会怎样为一个线上服务选捕获尺寸、用什么 benchmark 验证。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 引用图 11-1 的数字（例如 3→4 浪费 25%，5→8 浪费 37.5%，9→16 浪费 44%，17→24 浪费 29%；最坏是刚过一个尺寸的批次，上限由相邻尺寸的间隔决定）；给出成本链：填充行也做完整的前向（embedding、每层的投影与 MLP、lm_head），attention 因长度 0 不读 KV，也不写 KV（slot -1）；带宽受限（小 batch decode）时一步的时间主要是读一遍权重，与行数几乎无关，填充几乎免费；计算受限（大 batch）时填充行是真实 FLOP，时间约按 `size / n` 增长；再加上每个尺寸一个 graph 的启动时间与显存；说明 CPU 上测不出：这个小模型在 CPU 上的前向由 Python/torch 调度开销主导，比值在噪声里；选尺寸：在实际的 batch 大小分布上放尺寸，小 batch 处密、大 batch 处疏，用 `max_cudagraph_capture_size` 限制最大尺寸；验证：在目标 GPU 上对常见 batch 大小交替测量每步时间（多轮，看中位数与离散范围）；1 分 = 只有“填充浪费计算”而没有数字或没有区分带宽/计算受限；0 分 = 认为填充会改变输出（一票否决：混淆算法正确性与性能）；或认为尺寸越多越好、没有代价；或把填充在小 batch 上几乎免费说成在任何 batch 上都免费（一票否决：把单一负载的结论写成普遍结论）。
#
# **参考答案**
#
# 1. 浪费多少（图 11-1）：3 个请求按 4 行算（25%），5 个按 8 行（37.5%），9 个按 16 行（44%），17 个按 24 行（29%）；恰好是一个尺寸的批次不浪费。最坏情况是刚过一个尺寸的批次，浪费比例上限约为 `间隔 / 下一个尺寸`。
# 2. 浪费的行做什么：它们走完整的前向——embedding、每层的 QKV、o_proj、MLP、lm_head 都多算 `size - n` 行；attention 因为 `seq_lens = 0` 不读 KV，slot 为 -1 不写 KV；输出由 `real_rows` 丢掉。
# 3. 花多少时间：小 batch decode 受带宽限制，一步的时间是读一遍权重，多几行几乎免费；batch 大到计算受限时，填充行是真实 FLOP，时间约乘 `size / n`（9→16 接近 1.8 倍）。另有固定成本：每个尺寸录一个 graph，启动时间和 graph 显存随尺寸数增长。
# 4. 本机测不出：这个小模型在 2 核 CPU 上一次前向主要是调度开销，与行数几乎无关，而且多人共用时噪声远大于差别。
# 5. 选尺寸与验证：看线上 decode batch 大小的分布，在常见大小处放尺寸，小 batch 处密、大 batch 处疏，并用 `max_cudagraph_capture_size` 截断；在目标 GPU 上对这些 batch 大小交替测量每步时间，多轮取中位数并看离散范围。
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
# 总分 10 分，至少 8 分通过。引擎自己的版本在 `minivllm/compilation/cuda_graph.py` 与 runner 里，先独立完成再去读；核对后换一组捕获尺寸或 batch 大小重新推演。
#
# ### 自检
#
# 下面的单元格用与 nbgrader 相同的检查函数给代码部分打分（Q1～Q3 显示为待人工评分）。

# %%
self_check("lesson11", globals());

# %% [markdown]
# ## 附录（选读）
#
# 选读：GPU 上的 launch 次数、在真实 vLLM 上分派同一批次、与 vLLM 0.27.1 的全部差异和参考资料，不计入核心路径。

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
# ### 在真实 vLLM 0.27.1 上看同一件事
#
# 本课的几组设置交给 vLLM 自己的 `VllmConfig`。CPU 上 `CpuPlatform.check_and_update_config` 清空捕获列表（“vLLM on CPU” 一列）。
#
# 于是在同一个配置上换回 `FULL_DECODE_ONLY`、重跑 vLLM 的 `_set_cudagraph_sizes`，再问 V1 的 `CudagraphDispatcher.dispatch` 每个 decode 批次跑多少行：这是 GPU 上会发生的事。
#
# 看 `default_20_seqs`：vLLM 的列表到 2 × max_num_seqs = 40，但整图 decode 只录不超过 max_num_seqs 的尺寸（`initialize_cudagraph_keys`），17～20 个请求在这个模式下 eager；minivllm 把 20 本身加进列表。vLLM 默认的 `FULL_AND_PIECEWISE` 让它们走分段图。
#
# 主路径评分的最后一步就是这张表：给你的 `choose_capture_size` vLLM 录下的 decode 尺寸，每个批次大小都要与 `dispatch` 相同。

# %%
L11.vllm_side_by_side(choose_capture_size);

# %% [markdown]
# ### 与 vLLM 0.27.1 的差异
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
# - [vLLM CUDA graph dispatcher](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/cudagraph_dispatcher.py)
# - [vLLM CUDAGraphWrapper](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/compilation/cuda_graph.py)
# - [vLLM CompilationConfig（捕获尺寸、cudagraph_mode）](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/config/compilation.py)
# - [vLLM GPUModelRunner（V1：填充、捕获）](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/worker/gpu_model_runner.py)
# - [vLLM Model Runner V2 的 graph 管理](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/worker/gpu/cudagraph_utils.py)
# - [CUDA Graphs（CUDA C++ Programming Guide）](https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#cuda-graphs)
# - [PyTorch CUDA Graphs](https://pytorch.org/docs/stable/notes/cuda.html#cuda-graphs)
# - [vLLM CUDA Graphs design doc (current docs)](https://docs.vllm.ai/en/latest/design/cuda_graphs.html)
#
# 源码链接固定到本课审阅的 commit；current docs、默认捕获尺寸与 cudagraph_mode 会变化，部署前按目标版本重新核对。
#
# ← 上一课：第 10 课：分布式执行：张量并行、Executor 与 all-reduce　｜　下一课 →：第 12 课：前端与在线服务：AsyncLLM、ZMQ/msgspec、SSE 与基准测试
