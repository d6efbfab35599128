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
# 本课讲 `SchedulerOutput` 怎样变成前向的输入张量。学完你应能：
#
# - 说清 runner 怎样把调度器的增量写进**持久批** `InputBatch`；
# - 说清一个混合批（prefill 块与 decode）怎样摊平成 varlen 张量；
# - 写出向量化的输入准备（`GPUModelRunner._prepare_inputs` 的非投机部分），接进真实引擎。
#
# 通过要求：代码断言全部通过；Q1～Q3 沿源码对象给出因果链；总分至少 8/10。
#
# | 部分 | 分值 | 评分方式 |
# |---|---|---|
# | 代码·主路径（引擎混合批逐项相等 1 分；接入真实引擎与向量化 1 分） | 2 | 自动 |
# | 代码·边界条件（中途结束的块、命中后块内开始、打乱的块、被交换的行） | 1 | 自动 |
# | 代码·能映射回源码对象（`SOURCE_MAP`） | 1 | 自动 |
# | Q1～Q3 | 各 2 | 人工，按评分规则 |
#
# 没有 nbgrader 时，运行最后的“自检”单元格（或 `python -m autograder check lesson05`）。

# %% [markdown]
# ## 源码版本与阅读方法
#
# 本课读 vLLM {{VLLM_VERSION}}（commit {{VLLM_COMMIT}}）。按序读下面三段（约 95 行）；kernel 按 CP=1、`BLOCKS_PER_KV_BLOCK`=1 读：`virtual_block_size` 就是块大小，`local_block_offsets` 就是块内偏移，`is_local` 恒真；`BLOCK_SIZE` 是一次处理的 token 数。
#
# | 顺序 | vLLM 文件与入口 | minivllm 对应 | 带着什么问题读 |
# |---|---|---|---|
# | 1 | `vllm/v1/worker/gpu_input_batch.py`：`InputBatch.__init__`（L185–L186）、`swap_states`（L653–L654）、`condense`（L733–L755、L783–L786） | 同名文件与方法 | 空洞怎样填上，谁的行号因此改变？ |
# | 2 | `vllm/v1/worker/gpu_model_runner.py`：`_prepare_inputs`（L1981–L1995、L2081–L2089、L2097–L2104、L2234–L2239） | `minivllm/worker/gpu_model_runner.py`：同名 | `[2, 5, 3]` 怎样变成每个 token 的位置？谁不该采样？ |
# | 3 | `vllm/v1/worker/block_table.py`：`_compute_slot_mapping_kernel`（L410–L420、L430–L442） | `_prepare_inputs` 的 `slot_mapping` | 逻辑块号怎样变成物理块号？ |
#
# > **哪个 runner**：本课讲 V1 runner 的持久批，minivllm 照它写；dense 模型在 GPU 上默认走 Model Runner V2（见附录），摊平的数学一样。

# %%
# 上表各行在 vLLM {{VLLM_VERSION}} 源码里的样子：文件路径、行号与逐行原文（行号与上表一致；源码由第一个单元格获取并校验）。
from autograder.vllm_source import show_vllm

show_vllm("vllm/v1/worker/gpu_input_batch.py", "InputBatch.__init__", lines=(185, 186))
show_vllm("vllm/v1/worker/gpu_input_batch.py", "InputBatch.swap_states", lines=(653, 654))
show_vllm("vllm/v1/worker/gpu_input_batch.py", "InputBatch.condense", lines=(733, 755))
show_vllm("vllm/v1/worker/gpu_input_batch.py", "InputBatch.condense", lines=(783, 786))
show_vllm("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner._prepare_inputs", lines=(1981, 1995))
show_vllm("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner._prepare_inputs", lines=(2081, 2089))
show_vllm("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner._prepare_inputs", lines=(2097, 2104))
show_vllm("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner._prepare_inputs", lines=(2234, 2239))
show_vllm("vllm/v1/worker/block_table.py", "_compute_slot_mapping_kernel", lines=(410, 420))
show_vllm("vllm/v1/worker/block_table.py", "_compute_slot_mapping_kernel", lines=(430, 442))

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
# 调度器给出每个请求本步算几个 token（`num_scheduled_tokens`）；模型要的是张量：token id、位置、K/V 的槽、取哪几行算 logits。`GPUModelRunner` 每步做这个翻译。
#
# 下标数组与 `positions_np`（取 `input_ids`）在 CPU 上用 numpy 算；`positions`、`seq_lens` 在 GPU 上再算一遍，`slot_mapping` 由 Triton kernel 算。
#
# 1. **不重建状态**：请求的 token、块表、`num_computed_tokens`、采样参数放在持久批的一行里跨步保留，每步只改变化的几个数（Q1）。
# 2. **不 padding**：decode 与长 prefill 块同批时，不补齐成 `[batch, max_len]`，而是接成一条扁平序列（varlen），`query_start_loc` 标出每个请求的起点，`seq_lens` 给出上下文长度（Q2）。CUDA graph 只在尾部补齐总 token 数（第 11 课）。
#
# ### 2. 它如何工作
#
# 每步 `execute_model` 先用 `_update_states` 改持久批：
#
# - 结束的请求 `remove_request` 留下空洞；新请求 `add_request` 优先填空洞；
# - 继续的请求更新 `num_computed_tokens_cpu`、追加新块（采样的 token 已在上一步末尾由 `_bookkeeping_sync` 写进 `token_ids_cpu`，异步调度写 -1）；
# - `condense` 把末尾的行移进空洞；有的注意力后端还要求 decode 排在前面，就用 `swap_states` 交换两行。
#
# 所以**行序不一定等于调度器的顺序**。`_prepare_inputs` 按行序摊平，第 i 行本步 `n_i` 个 token、已算 `c_i` 个：
#
# - `query_start_loc`（`qsl`）：请求 i 占扁平序列的 `[qsl[i], qsl[i+1])`；
# - `req_indices = repeat(arange(num_reqs), n)`；请求内偏移是 `arange(total) - repeat(qsl[:-1], n)`；
# - `positions`：接在已算好的 `c_i` 个 token 之后；`input_ids` 按行号和位置从 `token_ids_cpu` 取（异步调度时 decode 行的新 token 在 GPU 上补，见附录）；
# - `slot_mapping`：K/V 写进的物理槽；位置给出逻辑块和块内偏移，物理块号从这一行的块表查；
# - `seq_lens = c + n`：注意力看的上下文长度；
# - `logits_indices`：下一个 token 由一行本步**最后一个** token 的隐藏状态预测；vLLM 每行都取，没读完 prompt 的行采样出的 token 随后由 `discard_request_mask` 丢弃。
#
# `input_ids`、`positions` 进模型，`qsl`、`seq_lens`、块表与 `slot_mapping` 组成注意力元数据；前向后 `hidden[logits_indices]` 进 LM head。
#
# ### 3. 正确性条件与常见误区
#
# - **物理块**：块由 BlockPool 分配，分散且可共享；把逻辑块号当物理块号，K/V 会写进别人的块。
# - **位置从 `num_computed_tokens` 开始**：分块 prefill 的后续块、decode、命中后的 prefill 都不从 0 开始。
# - **只在到达末尾时采样**：否则没读完 prompt 的请求就有了输出。
# - **按持久批的行序**：按调度器字典的顺序配行，会把别人的长度配给这一行。
#
# ### 4. 性能与工程取舍
#
# - 输入准备与 token 数线性：16k token 时，按 token 的循环执行 65,603 行 Python，向量化后是常数行、不到 1 毫秒（见检查）。
# - vLLM {{VLLM_VERSION}} 默认异步调度：CPU 准备第 t+1 步时 GPU 还在跑第 t 步，只有准备比前向慢 GPU 才等；拷贝也异步（pinned `CpuGpuBuffer`，块表先拷 `commit_block_table`）。
# - 持久批让每步 CPU 写入与变化量成正比；代价是行会移动，按行号索引的状态都要跟着搬。

# %% [markdown]
# ## 具体演示：一次引擎运行里的每一步
#
# 4 个 prompt，prompt 2 与 prompt 0 开头相同；token budget 24，长 prefill 阈值 16（会分块），block_size 8；prompt 2 在第 6 步、prompt 3 在第 10 步到达。
#
# 下表是引擎的 `_prepare_inputs` 每步看到的持久批：`req:调度数@已算数`，按行序；最后一列是调度器字典的顺序。

# %%
run = L05.engine_run()
L05.print_steps(run)

# %% [markdown]
# 读表：
#
# - 第 1～3 步，prompt 0 分成 16 + 16 + 10 的块，prompt 1 是 8 + 6；
# - 第 3 步起 prompt 1 在 decode，换到第 0 行：`order_differs`：行序与调度器顺序不同，`moved_row`：有行移动；
# - prompt 2 到达时 `prefix_hit`：前 24 个 token 已在 prefix cache 里，`num_computed_tokens` 从 24 开始；
# - 请求结束后，`condense` 把最后一行移进空洞。
#
# 下面是最“混合”的一步：每一行和引擎算出的 6 个张量。

# %%
step = L05.pick_mixed_step(run)
L05.print_flat(step)
L05.plot_mixed_batch(step);

# %% [markdown]
# 图 5-1：上：持久批的行（灰：已缓存的 KV，彩色：本步调度的 token）。中：扁平的 varlen 批（一列一个 token，数字是位置），`qsl` 标每行起点，箭头指向取 logits 的 token。下：每个 token 的 K/V 写进的物理块与槽。

# %%
L05.plot_step_breakdown(run);

# %% [markdown]
# 图 5-2：每步 `prepare_inputs`、`forward`、`sample` 三段时间。标题：输入准备每步占比的中位数（不计第 1 步）：小模型在 CPU 上低于 10%（负载下 5 次 1.6%–7.4%）；GPU 上的大模型不能外推。

# %% [markdown]
# ## 实践任务：唯一代码填空题
#
# 写出 `prepare_inputs(scheduler_output, input_batch, block_size)`：从调度结果和已更新的持久批算出 6 个 numpy 数组，与引擎的逐项相等。
#
# 要求**向量化**：不能有按 token 的 Python 循环，按请求的列表推导可以。7 处 `______` 是决策点。可用的字段：
#
# - `input_batch.req_ids[:num_reqs]`（行序）、`num_computed_tokens_cpu`、`num_tokens`（prompt + 已生成的 token 数）；
# - `token_ids_cpu`（`[行, 位置]`）、`block_table`（`[行, 逻辑块]`，值是物理块号）；
# - `scheduler_output.num_scheduled_tokens`（`{req_id: n}`）。
#
# > **与 vLLM 不同**：vLLM 给每个请求都取 logits，再丢掉中途 prefill 块的采样结果；本练习只为到达末尾的请求取。留下的 token 相同。
#
# 只改 `______` 处，不删断言、不放宽条件。

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
# 第一项检查：一个手算的批（block_size 4），调度器字典的顺序与行序相反。
#
# - 第 0 行：decode，已算 6，本步 1；
# - 第 1 行：分块 prefill，本步算位置 4～8，prompt 13 个 token，所以**不取** logits；
# - 第 2 行：命中后的最后一块，已算 6，本步 4，prompt 10 个 token，块表分散（`[3, 8, 12]`）。
#
# 隐藏测试再逐项比较演示的每一步，以及开投机解码（调度的 token 含草稿）时的每一步。

# %% nbgrader={"grade": true, "grade_id": "l05_main_path", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
name, so, batch = L05.boundary_cases()[0]
print(list(so.num_scheduled_tokens.items()), batch.req_ids)
ids, pos, qsl, seq_lens, slots, logits = prepare_inputs(so, batch, 4)
assert qsl.tolist() == [0, 1, 6, 10]
assert pos.tolist() == [6, 4, 5, 6, 7, 8, 6, 7, 8, 9]
assert ids.tolist() == [106, 204, 205, 206, 207, 208, 306, 307, 308, 309]
assert slots.tolist() == [2 * 4 + 2, 11 * 4 + 0, 45, 46, 47, 14 * 4 + 0, 8 * 4 + 2, 35, 12 * 4 + 0, 49]
assert seq_lens.tolist() == [7, 9, 10]
assert logits.tolist() == [0, 9]
### BEGIN HIDDEN TESTS
_ = L05.check_main_path(prepare_inputs)  # a list of the checked cases: not echoed
### END HIDDEN TESTS

# %% [markdown]
# 第二项检查暂时把 `GPUModelRunner._prepare_inputs` 换成调用你函数的包装（退出时恢复），检查：
#
# - 演示那批请求的贪心输出与引擎自己的 `_prepare_inputs` 逐 token 相同（后者与 HF 相同），开 n-gram 投机时也一样；
# - 每个有前向的步都有 `prepare_inputs` 追踪阶段；
# - 16k token 的批上，你的函数执行的 Python 行数不超过 200（数行不计时，与机器快慢无关）。

# %% nbgrader={"grade": true, "grade_id": "l05_real_engine", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
plugged_run = L05.check_real_engine(prepare_inputs)
print("真实引擎检查通过：", plugged_run.tokens)
print(L05.share_of_step(plugged_run.trace))

# %%
L05.vectorised_vs_loop(prepare_inputs)

# %% [markdown]
# 上表：同一 16k token 批上的三种实现。评分只看“Python lines”（`sys.settrace` 数出的行数，每次相同）。时间取三者交替 9 轮的中位数：按 token 的循环比引擎慢一个数量级以上（本机负载下多次 18×–72×）。
#
# ## 检查方法
#
# 运行断言；下面的单元格把 `final` 行的已算数加 1、本步调度数减 1：这一行的位置从 7 开始，`seq_lens` 仍是 10，仍到达 prompt 末尾，所以仍取 logits，只是下标从 9 变成 8。

# %%
name, so, batch = L05.boundary_cases()[0]
before = prepare_inputs(so, batch, 4)
batch.num_computed_tokens_cpu[2] += 1
so.num_scheduled_tokens["final"] -= 1
after = prepare_inputs(so, batch, 4)
for k, a, b in zip(L05.NAMES, before, after):
    print(f"{k:<16}{a.tolist()}  ->  {b.tolist()}")

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
# 这 1 分自动评分：写出 vLLM {{VLLM_VERSION}} 里每个概念的名字（字符串，大小写不限）。都在上面的摘录里，括号里是哪一段。
#
# - `block_tables`：`InputBatch.block_table` 的类，为每个 KV cache 组各持有一个 `BlockTable`（`__init__` 的摘录）；
# - `condense_rows`：`condense` 把末尾的行移进空洞时，对块表调用的方法（`condense` 的第二段）；
# - `swap_pair`：`swap_states` 交换两行时，对块表调用的方法（`swap_states` 的摘录）；
# - `sample_rows`：存 `num_computed_tokens + num_scheduled_tokens` 的 CPU 张量，`discard_request_mask` 由它与 `num_tokens` 比较得到（`_prepare_inputs` 的第二、三段）；
# - `flat_offsets`：一次算出 `cumsum(n)` 与每个 token 在请求内偏移的 `GPUModelRunner` 方法（`_prepare_inputs` 的第一段）。

# %% nbgrader={"grade": false, "grade_id": "l05_source_map_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
SOURCE_MAP = {
    "block_tables": "MultiGroupBlockTable",  ### BLANK
    "condense_rows": "move_row",  ### BLANK
    "swap_pair": "swap_row",  ### BLANK
    "sample_rows": "optimistic_seq_lens_cpu",  ### BLANK
    "flat_offsets": "_get_cumsum_and_arange",  ### BLANK
}

# %% nbgrader={"grade": true, "grade_id": "l05_source_map", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
L05.check_source_map(SOURCE_MAP)

# %% [markdown] nbgrader={"grade": false, "grade_id": "l05_q1", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q1（2 分）
#
# 一个纯 decode 步里，持久批 `InputBatch` 中一个继续运行的请求的那一行要改写哪些数？如果不用持久批，每步为所有请求从头重建这些状态（token 表、块表、采样参数），CPU 的写入量与什么成正比？
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**（两部分各 1 分）：
#
# - **改写哪些数（1 分）**：上一步采样出的 1 个 token 追加进 `token_ids_cpu` 的这一行（minivllm 的 `append_token`），`num_computed_tokens_cpu` 更新；只有跨进新块时块表这一行多 1 个块号。其余的 token、块号和采样参数都不动。写出 vLLM V1 默认异步调度时 `token_ids_cpu` 里写的是占位 -1、真实 token 留在 GPU 上的，或写出这个 token 在上一步末尾（`_bookkeeping_sync`）已写入的，同样得分。
# - **重建的代价（1 分）**：每步把每个请求的全部 token 和全部块表重写一遍，写入量与所有请求的上下文长度之和成正比；持久批只与变化量（大约请求数）成正比。只说“更慢/重复计算”而没说与什么成正比的，这 1 分不给。
# - 指出代价是行会移动（`condense`、`swap_states`），或 V1 的 `commit_block_table` 每步仍把块表前 `num_reqs` 行拷到 GPU 的，正确，不要求。
# - 0 分：认为持久批保存的是 KV cache 或激活。
#
# **参考答案**
#
# 调度器每步只发增量：继续运行的请求只有新的 `num_computed_tokens` 和偶尔新分配的块。runner 把它们写进持久批的同一行：上一步采样出的 token 追加到 `token_ids_cpu` 这一行的末尾，`num_computed_tokens_cpu` 更新，每 `block_size` 个 token 才在块表这一行多写 1 个块号；prompt、已有的块号、温度等采样参数都已在这一行里。若每步重建，就要把每个请求的全部 token 和全部块表重新写一遍，写入量与 Σ 上下文长度成正比，长上下文、几百个请求时是每步几十万个数；持久批只写几个数乘以请求数。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l05_q2", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q2（2 分）
#
# 一步里有 3 个 decode（各 1 个 token）和 1 个 16 token 的 prefill 块。摊平成 varlen 时这一步算多少个 token，补齐成 `[batch, max_len]` 时算多少个位置？摊平之后，注意力 kernel 靠哪两个数组知道每个请求的 query 段和上下文长度？
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**（两部分各 1 分）：
#
# - **算一算（1 分）**：varlen 19 个 token；补齐成 4 × 16 = 64 个位置，约 70% 是填充，QKV/MLP 等逐 token 的层都要为填充位置计算。两个数都对才给分。
# - **两个数组（1 分）**：`query_start_loc`：请求 i 的 query 段是 `[qsl[i], qsl[i+1])`；`seq_lens`：它能看的上下文长度。两个都说出并说清作用才给分。另提块表（找到 KV 所在的块）或 `slot_mapping`（写新 K/V）的，正确，不要求。
# - 提到开 CUDA graph 时 19 会补到捕获尺寸 24 的，正确，不要求；那只补尾部，与按请求补齐不同。
# - 0 分：认为 varlen 改变了模型的数学结果。
#
# **参考答案**
#
# varlen：3 + 16 = 19 个 token，embedding、QKV 投影、MLP 等逐 token 的层只算这 19 行（开 CUDA graph 时总 token 数还会补到最近的捕获尺寸，如 24，只补尾部，不按请求补齐）。补齐：4 个请求都补到 16，共 64 个位置，45 个（约 70%）是填充，每一层都要为它们计算、搬运激活。摊平后，只有注意力需要请求边界：`query_start_loc` 说明第 i 个请求的 query 是扁平序列的 `[qsl[i], qsl[i+1])`，`seq_lens` 说明它能看多少个 token 的上下文，块表再给出这些 KV 在哪些物理块。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l05_q3", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q3（2 分）
#
# vLLM {{VLLM_VERSION}} 默认开启异步调度：CPU 准备第 t+1 步的输入时，GPU 还在跑第 t 步的前向。什么情况下 GPU 仍会空等？用检查里 16k token 批上的对比说明，为什么输入准备仍要向量化。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**（两部分各 1 分）：
#
# - **何时空等（1 分）**：CPU 这一段（调度、`_update_states`、`_prepare_inputs`、发起拷贝）比一步前向还慢时，GPU 做完第 t 步就要等下一步的输入（小模型、短的 decode 步更容易如此）。
# - **为什么向量化（1 分）**：输入准备的工作量与 token 数成正比；引用检查的数字：按 token 的 Python 循环在 16k token 时执行 6.5 万行、比引擎慢一个数量级以上（学生测到的倍数都算），向量化是常数行、不到 1 毫秒，开销几乎不随 token 数增长，更容易藏在前向后面。只说“循环慢”而没有数字的，这 1 分不给。
# - 0 分：认为 GPU 可以在这一步的输入准备完成前开始这一步的前向。
#
# **参考答案**
#
# 异步调度下，GPU 跑第 t 步的前向时，CPU 已经在调度第 t+1 步、更新持久批、用 numpy 算下标数组，并发起拷贝和算 `positions`、`slot_mapping` 的 GPU kernel，采样结果留在 GPU 上。只要这段 CPU 时间短于一步前向，GPU 不用等；反之 GPU 做完第 t 步就空等输入。这段时间与本步 token 数、请求数线性：检查里 16k token 的批，按 token 的循环执行 65,603 行 Python、比引擎慢几十倍，向量化是常数行、不到 1 毫秒。按 token 循环每个 token 约 0.3–1 µs，与小模型每个 token 的前向时间同一量级，加上调度与记账就可能超过一步前向；向量化几乎是常数开销，更容易藏在前向后面。
#
# **附：图 5-3“想一想”的参考解释**（不单独计分）：V1 的代价：(1) 每次 `condense`/`swap_states` 都要在 CPU 上搬一行的状态并改所有按行号索引的状态（vLLM V1 的 `condense` 只搬有效 token 与已用的块，`swap_states` 只换有效 token 前缀、块表整行交换；minivllm 交换整行）；(2) 行号一变，异步调度时上一步留在 GPU 上的结果要用 `prev_positions` 重新对齐；(3) 块表仍要每步按行整段拷到 GPU。V2：请求一直在自己的槽位，行序变化只改 `idx_mapping` 这一个小数组，状态表由 Triton kernel 按 `idx_mapping` 间接读取；代价是每步要建新的 `InputBatch` 和 `idx_mapping`，kernel 多一次间接寻址，状态表按 `max_num_reqs` 预分配。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown]
# ## 评分规则
#
# - 代码 4 分：主路径 2 分（引擎混合批逐项相等 1 分、接入真实引擎 == HF 且向量化 1 分）、边界条件 1 分、能映射回源码对象 1 分；
# - Q1～Q3 各 2 分：每题 3～5 句即可，答到题目所问的全部要点得 2 分，只答对一部分得 1 分。
#
# 总分 10 分，至少 8 分通过。引擎的版本在 `minivllm/` 里，先独立完成再读。
#
# ### 自检
#
# 下面的单元格用与 nbgrader 相同的检查函数给代码部分打分（Q1～Q3 显示为待人工评分）。

# %%
self_check("lesson05", globals());

# %% [markdown]
# ## 附录（选读）
#
# 选读，不计分：在真实 vLLM 上运行、V1 与 V2 的对照、与 vLLM 的全部差异和参考资料。

# %% [markdown]
# ### 在真实 vLLM {{VLLM_VERSION}} 上看同一件事
#
# 本课的 4 个 prompt、到达时间与调度参数交给 vLLM {{VLLM_VERSION}} 自己的引擎（CPU，进程内，V1 的 `CPUModelRunner`）。包装它的 `_prepare_inputs`，从它自己的缓冲区读出六个数组，按请求与 minivllm 对照。
#
# vLLM 的 CPU 注意力后端只支持 16 的倍数的 block_size，两边都用 16。表里看得到下面差异列表的“重排”与“取 logits”两条。`make vllm` 之后，vLLM 的源码在 `.venv-vllm` 的 site-packages/vllm 下。

# %%
L05.vllm_side_by_side();

# %% [markdown]
# ### V1 的持久批与 V2 的请求状态表
#
# `L05.engine_run()` 还记下了每一步对持久批的改动：`condense` 移动的行（`C 从->到`），`swap_states` 交换的行（`S`）。`L05.v2_tables` 把同一串 `SchedulerOutput` 按 Model Runner V2 的规则记账（`vllm/v1/worker/gpu/states.py` 的 `RequestState`）：
#
# - 请求第一次被调度时从 `free_indices.pop()` 拿一个槽位，结束或被抢占时还回去；
# - 每步新建的 `InputBatch` 按“decode 在前，再按 token 数”排序，`idx_mapping` 给出批内每一行的槽位号。
#
# minivllm 只实现了 V1 的持久批；V2 的表是按 vLLM 的规则从同一次运行推算的示意。

# %%
L05.print_v1_v2(run)
print(L05.moved_rows(run))
L05.plot_v1_vs_v2(run);

# %% [markdown]
# 图 5-3：上：minivllm（V1 设计）的持久批，每列一步，箭头是本步移动的行（黑：`condense`，红：`swap_states`）。下：V2 的状态表：请求一直在同一个槽位，每步只变最下面一列 `idx_mapping`。
#
# #### 想一想（不计分）
#
# V2 为什么放弃持久批，改用“固定槽位 + 每步新建的 `InputBatch` + `idx_mapping`”？用图里的移动说出 V1 的两种代价，再说 V2 的代价。提示：谁在读 `idx_mapping`？异步调度时，上一步的行号怎样对上这一步的（V1 为此有 `prev_positions`）？

# %% [markdown]
# 你的解释：

# %% [markdown]
# ### 参考资料
#
# - [vLLM GPUModelRunner（V1）](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/worker/gpu_model_runner.py)
# - [vLLM InputBatch（V1）](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/worker/gpu_input_batch.py)
# - [vLLM Model Runner V2](https://github.com/vllm-project/vllm/tree/{{VLLM_COMMIT}}/vllm/v1/worker/gpu)
# - [vLLM V1 architecture (current docs)](https://docs.vllm.ai/en/latest/design/arch_overview.html)
#
# runner 的实现变化很快，current docs 与默认值会变，部署前按目标版本重新核对。
#
# ### 与 vLLM {{VLLM_VERSION}} 的差异
#
# 本课评分的摊平公式与 vLLM V1 runner 相同。其余差别：
#
# - **哪个 runner**：由 `VllmConfig.use_v2_model_runner` 决定。dense 模型默认走 V2，前提是装了 Triton、没开 V2 不支持的特性（如 n-gram 投机）；默认列表外的 MoE 与 hybrid 模型走 V1。
# - **V2 没有持久批**：请求在 `RequestState` 里占固定槽位；每步新建 `InputBatch`，准备输入的 Triton kernel 按 `idx_mapping` 读状态表。
# - **取 logits**：vLLM 给每个请求取最后一个 token 的 logits。V1 用 `discard_request_mask` 丢掉中途 prefill 块的采样，V2 在 `get_num_sampled_and_rejected` 里把它们的采样数置 0。minivllm 只为到达末尾的请求取。
# - **在哪里算**：V1 在 CPU 上算 `positions_np` 取 `input_ids`；送进模型的 `positions`、`seq_lens` 由 GPU 端的 `num_computed_tokens` 再算（L2188–L2195；异步投机时先在 L2156–L2173 修正 `num_computed_tokens`）。
# - **slot_mapping**：V1 由 `BlockTable.compute_slot_mapping` 的 Triton kernel 算。minivllm 全在 CPU 上用 numpy 算，再 `non_blocking` 拷贝。
# - **存储**：V1 的 token 表 `token_ids_cpu_tensor` 只在 CPU 上；块表在单独的 `BlockTable` 里，`commit_block_table(num_reqs)` 每步把前 `num_reqs` 行整个拷到 GPU。minivllm 的 `InputBatch` 只有 numpy 数组。
# - **移动行**：V1 的 `condense` 只拷有效的 token 和块，`swap_states` 只交换有效的 token 前缀（块表整行交换）；minivllm 的 `condense` 调用 `swap_states`，交换整行。
# - **重排**：minivllm 每步把 decode 换到前面；V1 只在注意力后端设了 `reorder_batch_threshold` 时重排（如 FlashInfer），FlashAttention、Triton 与 CPU 后端不重排。
# - **写入采样结果**：minivllm 用 `append_token`。V1 默认异步调度，`_bookkeeping_sync` 只在 `token_ids_cpu` 里写占位的 -1；真实 token 留在 GPU 上（`prev_sampled_token_ids`），下一步由 `_prepare_input_ids` 写进 `input_ids`。
#
# ← 上一课：第 4 课：抢占、取消与请求生命周期　｜　下一课 →：第 6 课：PagedAttention：Triton decode kernel
