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
# 源码固定在 vLLM commit 8e958902eee5（0.27.1 发布后一天）。按序读下面三段，跳过 M-RoPE、投机解码与上下文并行（CP）的分支。
#
# | 顺序 | vLLM 文件与入口 | minivllm 对应 | 带着什么问题读 |
# |---|---|---|---|
# | 1 | `vllm/v1/worker/gpu_input_batch.py`：`InputBatch.condense`（L708–L838） | `minivllm/worker/gpu_input_batch.py`：`condense`、`swap_states` | 空洞怎样填上，谁的行号因此改变？ |
# | 2 | `vllm/v1/worker/gpu_model_runner.py`：`_prepare_inputs`（L1981–L1993、L2081–L2105、L2239） | `minivllm/worker/gpu_model_runner.py`：`_prepare_inputs` | `[2, 5, 3]` 怎样变成每个 token 的位置？谁不该采样？ |
# | 3 | `vllm/v1/worker/block_table.py`：`_compute_slot_mapping_kernel`（L410–L442） | `_prepare_inputs` 的 `slot_mapping` | 逻辑块号怎样变成物理块号？ |
#
# > **哪个 runner**：本课讲 V1 runner 的持久批，minivllm 照它写；dense 模型在 GPU 上默认走没有持久批的 Model Runner V2（`v1/worker/gpu/`，见附录），摊平的数学一样。

# %%
# 上表各行在 vLLM 0.27.1 源码里的样子：文件路径、行号与逐行原文（行号与上表一致；源码由第一个单元格获取并校验）。
from autograder.vllm_source import show_vllm

show_vllm("vllm/v1/worker/gpu_input_batch.py", "InputBatch.condense")
show_vllm("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner._prepare_inputs", lines=(1981, 1993))
show_vllm("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner._prepare_inputs", lines=(2081, 2105))
show_vllm("vllm/v1/worker/block_table.py", "_compute_slot_mapping_kernel", lines=(410, 442))

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
# 调度器给出每个请求这一步算几个 token（`num_scheduled_tokens`）；模型要的是张量：token id、位置、K/V 的槽、取哪几行算 logits。`GPUModelRunner` 每步在 CPU 上做这个翻译。
#
# 1. **不重建状态**：请求的 token、块表、`num_computed_tokens`、采样参数放在持久批的一行里跨步保留，每步只改变化的几个数（Q1）。
# 2. **不 padding**：decode 与长 prefill 块同批时，不补齐成 `[batch, max_len]`，而是接成一条扁平序列（varlen），用 `query_start_loc` 标出每个请求的起点（Q2）。
#
# ### 2. 它如何工作
#
# 每步 `execute_model` 先用 `_update_states` 改持久批：
#
# - 结束的请求 `remove_request` 留下空洞；新请求 `add_request` 优先填空洞；
# - 继续的请求更新 `num_computed_tokens_cpu`，追加新块；
# - `condense` 把末尾的行移进空洞；有的注意力后端还要求 decode 排在前面，就用 `swap_states` 交换两行。
#
# 所以**行序 ≠ 调度器的顺序**。`_prepare_inputs` 按行序摊平，第 i 行本步 `n_i` 个 token、已算 `c_i` 个：
#
# - `query_start_loc`（`qsl`）：请求 i 占扁平序列的 `[qsl[i], qsl[i+1])`；
# - `req_indices = repeat(arange(num_reqs), n)`；请求内偏移是 `arange(total) - repeat(qsl[:-1], n)`；
# - `positions`：接在已算好的 `c_i` 个 token 之后；`input_ids` 按行号和位置从 `token_ids_cpu` 取（异步调度时 decode 行的新 token 在 GPU 上补，见附录）；
# - `slot_mapping`：K/V 写进的物理槽；位置给出逻辑块和块内偏移，物理块号从这一行的块表查；
# - `seq_lens = c + n`：注意力看的上下文长度；
# - `logits_indices`：vLLM 为每一行取本步最后一个 token（`query_start_loc[1:] - 1`），没读完 prompt 的行的采样随后由 `discard_request_mask` 丢弃。
#
# 这些数组组成 `AttentionMetadata` 拷到设备；前向后 `hidden[logits_indices]` 进 LM head。
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
# - vLLM 0.27.1 默认异步调度：CPU 准备第 t+1 步时 GPU 还在跑第 t 步，只有准备比前向慢 GPU 才等；拷贝也异步：pinned 的 `CpuGpuBuffer` 非阻塞拷，块表先拷（`commit_block_table`，Q3）。
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
# 图 5-1：上：持久批的行（灰：已缓存的 KV，彩色：本步调度的 token，斜线：后续 prompt）。中：扁平的 varlen 批（一列一个 token，数字是位置），`qsl` 标每行起点，箭头指向取 logits 的 token。下：每个 token 的 K/V 写进的物理块与槽，块号散开。

# %%
L05.plot_step_breakdown(run);

# %% [markdown]
# 图 5-2：每步 `prepare_inputs`、`forward`、`sample` 三个追踪阶段的时间。标题：输入准备每步占比的中位数（不计含预热的第 1 步）：小模型在 CPU 上低于 10%（负载下 5 次 1.6%–7.4%）；GPU 上的大模型不能外推。

# %% [markdown]
# ## 实践任务：唯一代码填空题
#
# 写出 `prepare_inputs(scheduler_output, input_batch, block_size)`：从调度结果和已更新的持久批算出 6 个 numpy 数组，与引擎的 `_prepare_inputs` 逐项相等。
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
assert slots.tolist() == [2 * 4 + 2, 11 * 4 + 0, 45, 46, 47, 0 * 4 + 0, 8 * 4 + 2, 35, 12 * 4 + 0, 49]
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
# 上表：同一 16k token 批上的三种实现。评分只看“Python lines”（`sys.settrace` 数出的行数，每次相同）。时间取三者交替 9 轮的中位数：按 token 的循环总比引擎慢几十倍（负载下 5 次 36×–72×）。
#
# ## 检查方法
#
# 运行断言；再把一个请求的 `num_computed_tokens` 加 1、本步调度数减 1。看 `positions`、`slot_mapping`、`seq_lens`、`logits_indices` 怎样变，解释这一行为什么仍取（或不再取）logits。

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
# 这 1 分自动评分：在 vLLM 8e958902eee5 中找到每个概念的名字（字符串，大小写不限）。
#
# - `block_tables`：`InputBatch.block_table` 的类型，为每个 KV cache 组各持有一个 `BlockTable` 的类；
# - `condense_rows`：`InputBatch.condense` 把末尾的行移进空洞时，对块表调用的方法；
# - `swap_pair`：`InputBatch.swap_states` 交换两行时，对块表调用的方法；
# - `split_counts`：批已按 decode 在前重排后，数出 decode、extend、prefill 各有多少请求和 token 的函数（`vllm/v1/attention/backends/utils.py`）；
# - `sample_rows`：`GPUModelRunner` 里存 `num_computed_tokens + num_scheduled_tokens` 的 CPU 张量，`discard_request_mask` 由它与 `num_tokens` 比较得到；
# - `flat_offsets`：`_prepare_inputs` 调用的 `GPUModelRunner` 方法，一次算出 `cumsum(n)` 与每个 token 在请求内的偏移（`[2, 5, 3]` 得到 `[0, 1, 0, 1, 2, 3, 4, 0, 1, 2]`）。

# %% nbgrader={"grade": false, "grade_id": "l05_source_map_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
SOURCE_MAP = {
    "block_tables": "MultiGroupBlockTable",  ### BLANK
    "condense_rows": "move_row",  ### BLANK
    "swap_pair": "swap_row",  ### BLANK
    "split_counts": "split_decodes_prefills_and_extends",  ### BLANK
    "sample_rows": "optimistic_seq_lens_cpu",  ### BLANK
    "flat_offsets": "_get_cumsum_and_arange",  ### BLANK
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
# **评分要点**：2 分 = 说清调度器只发增量（`NewRequestData` 全量只在请求第一次被调度时发；`CachedRequestData` 只发 `new_block_ids`、`num_computed_tokens`），runner 把 token、块表、`num_computed_tokens`、采样参数（temperature/top_p/top_k、generator）放在持久批的一行里，一个 decode 步每个请求只写 1 个 token（minivllm 的 `append_token`；vLLM V1 的 `_bookkeeping_sync` 写 `token_ids_cpu`，默认异步调度时写的是占位 -1，真实 token 留在 GPU）和偶尔 1 个块号，所以每步的 CPU 写入和 IPC 与变化量成正比，而不是与全部请求的全部 token、全部块表成正比（长上下文时相差几个数量级）；采样参数张量（temperature 等）也不用每步重建；并说出代价：结束/抢占留下空洞，需要 `condense` 移动行、`_reorder_batch` 用 `swap_states` 把 decode 换到前面，所以**行号会变**，一切按行存的状态（包括 generator、min_tokens 这类按行号索引的字典）必须一起移动，输入准备必须按持久批的行序而不是调度器的顺序；1 分 = 只说“避免重复计算/更快”，没有说清省下的是与什么成正比的工作，或没有提到行移动的代价；0 分 = 认为持久批保存的是 KV cache 或模型激活（一票否决：只背类名而说不清状态所有权）。**不扣分的说法**：指出 vLLM V1 的 `commit_block_table` 每步把块表前 `num_reqs` 行整个拷到 GPU（拷贝量与请求数×块表宽度成正比，并非只拷变化的部分）是正确的；回答“持久批只拷变化的部分到 GPU”不得这一点。说明 vLLM 0.27.1 默认的 Model Runner V2 没有持久批（固定槽位的 `RequestState` + 每步新建 `InputBatch` + `idx_mapping`，没有 condense/swap），并以此说明同样的“只发增量、状态按请求跨步保留”和不同的代价，同样给分——只要说清描述的是 V1（或 minivllm）还是 V2。
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
# 为什么 vLLM 把一个混合批摊平成一条 varlen 序列（`query_start_loc` + `seq_lens` + `slot_mapping`），而不是补齐成 `[batch, max_len]` 的矩阵？
#
# 用本课演示里的一步（例如一个 16 token 的 prefill 块和几个 decode 同批）算一算 padding 浪费了多少，并说明 varlen 对注意力 kernel 和 KV 写入提出了什么要求。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**（两部分各 1 分）：
#
# - **浪费多少（1 分）**：用演示里一步的实际数字算出 padding 的比例（例如 1 个 16 token 块 + 3 个 decode：varlen 19 个 token，padding 成 4×16 = 64 个，约 70% 是填充），并说明填充位置在逐 token 的层（QKV/MLP 投影等）里都要计算和搬运，而 varlen 让矩阵乘的行数就是真实 token 数。只说“padding 浪费算力”而没有数字，这 1 分不给。
# - **对 kernel 与 KV 写入的要求（1 分）**：注意力 kernel 必须按 `query_start_loc` 分段、按 `seq_lens` 看上下文（每个 token 只看自己请求的 KV）；新 K/V 按 `slot_mapping` 逐 token 散写进分页的物理块。两样都说到才给分。
# - 不要求、但可加深的：decode 排在前面让 kernel 分两类处理（minivllm 与 FlashInfer/MLA；说 FlashAttention 后端不重排也对）、正确性不依赖布局。
# - 0 分：认为 varlen 改变了模型的数学结果，或认为 padding 只是多用内存不影响计算（一票否决：混淆算法正确性与性能）。
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
# 这一步的前向开始之前，CPU 必须做完哪些事？用图 5-2 和检查里的向量化对比说明这段时间与什么成正比；再说明 vLLM 让 CPU 工作与 GPU 重叠或缩短的手段，至少两种，说出源码对象。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 列出关键路径：调度（`Scheduler.schedule`）、`_update_states`（增删行、condense、重排）、`_prepare_inputs`（6 个数组 + `AttentionMetadata`）、H2D 拷贝，之后才能启动这一步的前向；说出成本与 token 数和请求数线性（向量化后是几次 numpy 调用；按 token 的循环执行的 Python 行数与 token 数成正比，16k token 时 6.5 万行对常数行，时间上慢几十倍，引用检查里的行数或同一轮的比值），占步时间的比例取决于模型与硬件（图 5-2 在 CPU 小模型上中位数低于 10%）；并给出至少两种带源码对象的手段：pinned 内存 + `non_blocking` 的 `CpuGpuBuffer.copy_to_gpu`、先 `commit_block_table` 再做其余 CPU 工作；`positions`/`seq_lens`/`slot_mapping` 在 GPU 上算（`BlockTable.compute_slot_mapping`）；异步调度（`async_scheduling`，vLLM 0.27.1 默认开启：第 t+1 步的调度与输入准备和第 t 步的前向重叠，采样结果留在 GPU 上）；CUDA graph 减少 launch 开销；结构化输出的 bitmask 与前向重叠（第 8 课）。1 分 = 只列出步骤或只说“异步”，没有对象或没有成本链。0 分 = 认为 GPU 可以在这一步的输入准备完成前开始这一步的前向，或把输入准备说成在 GPU 上做所以不占时间（一票否决：混淆算法正确性与性能）。**不扣分的说法**：指出“准备期间 GPU 空闲”只在没有异步调度时成立、默认配置下 GPU 此时在跑上一步，是正确的；只说“GPU 空闲”而没有提异步调度，不因此扣分。
#
# **参考答案**
#
# 1. 关键路径（CPU，每步）：`Scheduler.schedule` 决定 `num_scheduled_tokens` 和块；runner 的 `_update_states` 把增量写进持久批（`add_request`/`remove_request`/`condense`/`swap_states`）；`_prepare_inputs` 算 `input_ids`、`positions`、`query_start_loc`、`seq_lens`、`slot_mapping`、`logits_indices` 并构造 `AttentionMetadata`；把它们拷到 GPU。这一步前向的第一个 kernel 就要读 `input_ids`，注意力要读 `slot_mapping` 和块表，所以这些都要先准备好。没有异步调度时，这段时间里 GPU 空闲；vLLM 0.27.1 默认开启异步调度，此时 GPU 在跑上一步的前向，只要准备比前向快就不空等。
# 2. 成本：与本步 token 数、请求数线性。向量化后是十几次 numpy 调用（检查里 16k token 的批不到 1 ms，执行的 Python 行数是常数）；按 token 的 Python 循环执行 65,603 行，本机约 8–19 毫秒（随负载），比一个 decode 步的 GPU 时间还长。图 5-2 里它每步占 prepare+forward+sample 的中位数低于 10%（CPU 上的小模型）；GPU 上前向只要几毫秒时，这个比例会大得多，要实测。
# 3. vLLM 的手段：
#    - pinned 内存的 `CpuGpuBuffer` + `copy_to_gpu(non_blocking=True)`：拷贝异步进行，CPU 继续算；`_prepare_inputs` 第一件事就是 `commit_block_table`，让块表的拷贝与后面的 CPU 计算重叠；
#    - 把 `positions`、`seq_lens`、`slot_mapping` 放到 GPU 上算（`num_computed_tokens` 常驻 GPU，`BlockTable.compute_slot_mapping` 启动 Triton kernel），CPU 只拷小数组；Model Runner V2 把更多输入准备写成按 `idx_mapping` 读状态表的 Triton kernel（`prepare_prefill_inputs`、`prepare_pos_seq_lens`），也算一种；
#    - 异步调度（`async_scheduling`，默认开启）：第 t 步的前向还在 GPU 上跑时，CPU 已经调度并准备第 t+1 步（采样的 token 留在 GPU 上，下一步由 runner 直接拷进 `input_ids`；`discard_request_mask` 和乐观的 `seq_lens` 为此服务）；
#    - CUDA graph：把一步的几百次 kernel launch 变成一次 replay，缩短 CPU 侧的 launch 时间（第 11 课）；结构化输出的 bitmask 在前向期间由 EngineCore 计算（第 8 课）。
#    minivllm 在 CPU 上用 numpy 算全部数组再 `non_blocking` 拷贝，异步调度见 `async_scheduling`；它没有在 GPU 上算 slot mapping。
#
# **附：图 5-3“想一想”的参考解释**（不单独计分）：V1 的代价：(1) 每次 `condense`/`swap_states` 都要在 CPU 上搬一行的状态并改所有按行号索引的状态。vLLM V1 只搬有效部分：`swap_states` 交换两行中较长的有效 token 前缀（`max_active_token_count`，源码注释说拷整行 `max_model_len` 太贵），`condense` 拷 `[:num_tokens]` 的 token 和已用的块；minivllm 交换整行。本次运行的移动次数见 `L05.moved_rows(run)` 的输出，批越大、请求进出越频繁，移动越多。(2) 行号一变，异步调度时上一步留在 GPU 上的结果（采样 token、`num_computed_tokens`）要用 `prev_positions` 重新对齐；重排还与 `reorder_batch_threshold`、注意力后端耦合。(3) 块表仍要每步按行整段拷到 GPU。V2：请求一直在自己的槽位，行序变化只改 `idx_mapping` 这一个小数组，状态表可以常驻 GPU 或 UVA，由 Triton kernel 按 `idx_mapping` 间接读取，与异步调度、投机解码配合更简单；代价是每步要建新的 `InputBatch` 和 `idx_mapping`，kernel 多一次间接寻址，状态表按 `max_num_reqs` 预分配（`all_token_ids` 用 UVA 放在主机内存，源码注释说它可达数 GB）。
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
# ### 在真实 vLLM 0.27.1 上看同一件事
#
# 本课的 4 个 prompt、到达时间与调度参数交给 vLLM 0.27.1 自己的引擎（CPU，进程内，V1 的 `CPUModelRunner`）。包装它的 `_prepare_inputs`，从它自己的缓冲区读出六个数组，按请求与 minivllm 对照。
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
# - [vLLM GPUModelRunner（V1）](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/worker/gpu_model_runner.py)
# - [vLLM InputBatch（V1）](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/worker/gpu_input_batch.py)
# - [vLLM Model Runner V2](https://github.com/vllm-project/vllm/tree/8e958902eee5/vllm/v1/worker/gpu)
# - [vLLM V1 architecture (current docs)](https://docs.vllm.ai/en/latest/design/arch_overview.html)
#
# runner 的实现变化很快，current docs 与默认值会变，部署前按目标版本重新核对。
#
# ### 与 vLLM 0.27.1 的差异
#
# 本课评分的摊平公式与 vLLM V1 runner 相同。其余差别：
#
# - **哪个 runner**：由 `VllmConfig.use_v2_model_runner` 决定。dense 模型默认走 V2，前提是装了 Triton、没开 V2 不支持的特性（如 n-gram 投机）；默认列表外的 MoE 与 hybrid 模型走 V1。
# - **V2 没有持久批**：请求在 `RequestState` 里占固定槽位；每步新建 `InputBatch`，准备输入的 Triton kernel 按 `idx_mapping` 读状态表。
# - **取 logits**：vLLM 给每个请求取最后一个 token 的 logits。V1 用 `discard_request_mask` 丢掉中途 prefill 块的采样，V2 在 `get_num_sampled_and_rejected` 里把它们的采样数置 0。minivllm 只为到达末尾的请求取。
# - **在哪里算**：V1 的 `positions`、`seq_lens` 在 GPU 上由 `num_computed_tokens` 算出，`slot_mapping` 由 `BlockTable.compute_slot_mapping` 的 Triton kernel 算。minivllm 全在 CPU 上用 numpy 算，再 `non_blocking` 拷贝。
# - **存储**：V1 的 token 表 `token_ids_cpu_tensor` 只在 CPU 上；块表在单独的 `BlockTable` 里，`commit_block_table(num_reqs)` 每步把前 `num_reqs` 行整个拷到 GPU。minivllm 的 `InputBatch` 只有 numpy 数组。
# - **移动行**：V1 的 `condense` 只拷有效的 token 和块，`swap_states` 只交换有效的 token 前缀；minivllm 的 `condense` 调用 `swap_states`，交换整行。
# - **重排**：minivllm 每步把 decode 换到前面；V1 只在注意力后端设了 `reorder_batch_threshold` 时重排（如 FlashInfer），FlashAttention、Triton 与 CPU 后端不重排。
# - **写入采样结果**：minivllm 用 `append_token`。V1 默认异步调度，`_bookkeeping_sync` 只在 `token_ids_cpu` 里写占位的 -1；真实 token 留在 GPU 上（`prev_sampled_token_ids`），下一步由 `_prepare_input_ids` 写进 `input_ids`。
#
# ← 上一课：第 4 课：抢占、取消与请求生命周期　｜　下一课 →：第 6 课：PagedAttention：Triton decode kernel
