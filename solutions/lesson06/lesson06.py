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
# # 第 6 课：PagedAttention：Triton decode kernel
#
# ## 本课目标与通过标准
#
# 本课产出：补全分页 KV cache 上 decode attention 块循环里的 6 行，接进 minivllm 的 Triton 后端，让真实引擎用它生成文本。这 6 行做三件事：
#
# - 按块表把逻辑块翻译成物理块；
# - 挡掉 `seq_len` 之后的槽位；
# - 用 online softmax（running max、分母、累加器重缩放）一次扫过整段上下文。
#
# 你还应能说清 decode 为何受带宽限制，kernel 要把什么降到最少。
#
# 通过要求：代码断言全部通过；Q1～Q3 各用 3～5 句回答一个问题；总分至少 8/10。
#
# | 部分 | 分值 | 评分方式 |
# |---|---|---|
# | 代码·主路径（对照 torch 参考实现 1 分 + 接入真实引擎 1 分） | 2 | 自动 |
# | 代码·边界条件（空行、整块、跨块、未写槽位为 NaN、超大注意力分数、GQA 比例 3） | 1 | 自动 |
# | 代码·能映射回源码对象（`SOURCE_MAP`） | 1 | 自动 |
# | Q1～Q3 | 各 2 | 人工，按评分规则 |
#
# CPU 上 kernel 在 Triton 解释器里运行（`TRITON_INTERPRET=1`）；有 GPU 时直接编译运行。没有 nbgrader 时，运行最后的“自检”单元格（或 `python -m autograder check lesson06`）。

# %% [markdown]
# ## 源码版本与阅读方法
#
# 源码固定在 vLLM commit {{VLLM_COMMIT}}（{{VLLM_VERSION}} 发布后一天）。下表约 90 行，都在同一个文件里。先看 grid 每一维是谁，再看循环每次读哪些字节，最后看数值细节。
#
# | 顺序 | vLLM 文件与入口 | minivllm 对应 | 带着什么问题读 |
# |---|---|---|---|
# | 1 | `vllm/v1/attention/ops/chunked_prefill_paged_decode.py`：`chunked_prefill_paged_decode`（L447–L452） | `minivllm/attention/ops/triton_decode_attention.py`：`paged_decode_attention` | grid 的两维？ |
# | 2 | `kernel_paged_attention_2d`（L90–L104、L123–L136） | kernel 开头 | 一个 program 负责哪些 query 头？三个 online softmax 状态的初值是什么？ |
# | 3 | `kernel_paged_attention_2d`（L147–L167） | 填空 ①② | 物理块号从哪里读？哪些槽位被挡掉？ |
# | 4 | `kernel_paged_attention_2d`（L212–L218、L228–L251） | 打分与填空 ④ | 出现新的 max 时，哪些量要重缩放？ |
#
# > **谁调用谁**：NVIDIA GPU 上默认选 FlashAttention（计算能力 10.x 的因果注意力先选 FlashInfer），Triton 后端在其后（`vllm/platforms/cuda.py`：`_get_backend_priorities`）。`kernel_paged_attention_2d` 是 ROCm 后端的 Triton 回退，循环与本课相同。

# %%
# 上表各行在 vLLM {{VLLM_VERSION}} 源码里的样子：文件路径、行号与逐行原文（行号与上表一致；源码由第一个单元格获取并校验）。
from autograder.vllm_source import show_vllm

show_vllm("vllm/v1/attention/ops/chunked_prefill_paged_decode.py", "chunked_prefill_paged_decode", lines=(447, 452))
show_vllm("vllm/v1/attention/ops/chunked_prefill_paged_decode.py", "kernel_paged_attention_2d", lines=(90, 104))
show_vllm("vllm/v1/attention/ops/chunked_prefill_paged_decode.py", "kernel_paged_attention_2d", lines=(123, 136))
show_vllm("vllm/v1/attention/ops/chunked_prefill_paged_decode.py", "kernel_paged_attention_2d", lines=(147, 167))
show_vllm("vllm/v1/attention/ops/chunked_prefill_paged_decode.py", "kernel_paged_attention_2d", lines=(212, 218))
show_vllm("vllm/v1/attention/ops/chunked_prefill_paged_decode.py", "kernel_paged_attention_2d", lines=(228, 251))

# %% nbgrader={"grade": false, "grade_id": "l06_setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
# 准备（锁定）：没有 GPU 时在导入 triton 之前打开解释器；静音无害的警告（评分单元格不能写 stderr）。
import logging
import os
import shutil
import warnings

if shutil.which("nvidia-smi") is None and not os.path.exists("/dev/nvidia0"):
    os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

import torch  # noqa: E402

from autograder import lesson06 as L06  # noqa: E402
from autograder.common import ______, report, self_check, short_errors  # noqa: E402,F401

short_errors("lesson06")  # 评分单元格失败时只显示三行：哪一部分、错在哪、第一处不符（完整 traceback：%tb）

print("Triton 解释器（CPU）" if L06.interpreting() else "CUDA", "| 设备：", L06.device())

# %% [markdown]
# ## 核心心智模型
#
# ### 1. 它是什么，解决什么问题
#
# Decode 阶段每个请求每步只有 1 个新 query token，但它要和此前的全部 token 做注意力：$o = \mathrm{softmax}(q K^\top / \sqrt{d})\,V$。vLLM 以固定大小的**块**分配 KV cache，每个请求持有一张**块表**：第 $j$ 个逻辑块存在物理块 `block_table[seq, j]` 里。
#
# 分页消除了按最大长度预留造成的碎片，同样的显存能装下更多并发请求。代价是 K/V 不再连续，kernel 必须边读块表边取数。
#
# PagedAttention kernel 要做到：**在分散的物理块上一次扫完 softmax 注意力，既不把 K/V 拷成连续张量，也不把整行注意力分数写回显存。** 参考实现 `paged_attention_ref` 走的正是被省掉的那条路：先 gather 出连续的 K/V，再算 softmax。
#
# ### 2. 它如何工作
#
# 读懂 kernel 与填空要用的 Triton 写法：
#
# - **program**：kernel 按 grid 启动许多 program，每个用 `tl.program_id(axis)` 得知自己负责哪一份；
# - **指针**：指针加整数按元素移动，`tl.load(ptr + i)` 读一个元素；
# - **块与 mask**：`tl.arange(0, N)` 给出块内下标（N 为 2 的幂）；`tl.load(ptrs, mask=m, other=0.0)` 一次读一块，m 为假处不读、取 `other`；
# - **二维地址**：`行[:, None] * 行步长 + 列[None, :]` 广播成一块；每一维乘自己的 stride 再相加；
# - **逐元素与按行归约**：`tl.maximum(a, b)`、`tl.exp(x)`；`tl.max(x, axis=1)`、`tl.sum(x, axis=1)`；每行一个数的向量 `r` 乘二维块时写 `r[:, None]`；
# - **`tl.dot`**：两个块的矩阵乘；NVIDIA GPU 上归约维 K 至少 16（fp32 为 8），M、N 可以更小。
#
# **`tl.dot` 的陷阱**：两个操作数都要先 `.to(COMPUTE_DTYPE)`，并带 `input_precision=DOT_PRECISION`。否则 GPU 上 fp32 输入按 tf32 算（差约 1e-3），bf16 cache 时 fp32 乘 bf16 编译不过。CPU 解释器一律按 fp32 算，测不出来，所以启动器静态检查每个 `tl.dot`。
#
# minivllm 的 decode kernel 对应 vLLM 的 `kernel_paged_attention_2d`：
#
# - **grid = (序列数, kv 头数)**：一个 program 负责一条序列的一个 kv 头和共享它的 `QUERIES_PER_KV` 个 query 头（GQA 分组），补到至少 16 行（vLLM 的 `num_queries_per_kv_padded`）。
# - **沿逻辑块循环**：从块表读物理块号，构造 K/V 指针并掩掉 `seq_len` 之后的槽位，一次 `tl.dot` 算出组内各头的分数，再做 online softmax 更新。
# - 循环结束后输出 `acc / running_sum`，只写一次。
#
# 下面的图来自真实引擎：Triton 后端在默认模型（8 个 query 头、2 个 kv 头）上贪心生成时，每次 decode 调用的块表与长度。

# %%
ref_run = L06.reference_run()   # minivllm 自己的 decode kernel；记录每次调用的块表、长度（最后一次还有输入张量）
L06.print_engine_run(ref_run)
L06.plot_block_tables(ref_run);

# %% [markdown]
# 图 6-1：每个 decode 步交给 kernel 的块表（取第 0 层）。格内是物理块号；绿色是写满的块，黄色是最后一个未满的块，斜线是 `seq_len` 之后尚未写入、必须掩掉的槽位。物理块号与逻辑块号无关；物理块 0 是引擎保留的空块。

# %%
fig, head, rows = L06.plot_online_softmax(ref_run.calls[-1], seq=0)
for r in rows:
    print({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()})

# %% [markdown]
# 图 6-2：把最后一次 decode 调用的块循环在 torch 里重放。点是注意力分数，黑线是 running max。后面的块抬高 max 时，此前的分母与累加器都乘上 `rescale < 1`；标题里的误差说明结果与整行 softmax 相同。
#
# 一个块的更新（$m$ 为 running max，$\ell$ 为分母，$a$ 为累加器，$s$ 为本块的注意力分数）：
#
# $$m' = \max(m, \max_j s_j),\quad r = e^{m - m'},\quad p_j = e^{s_j - m'},\quad \ell' = \ell\,r + \sum_j p_j,\quad a' = a\,r + \sum_j p_j v_j$$
#
# ### 3. 正确性条件与常见误区
#
# - **物理块，不是逻辑块**：逻辑块号当物理块号，在块恰好按顺序分配的测试里碰巧通过，在真实引擎里读错块（下一个单元格）。
# - **最后一个块必须掩码**：未写入的槽位可能是旧值，甚至 NaN。掩码要同时作用于 K/V 的加载（`0 * NaN` 仍是 NaN）和注意力分数（置为 $-\infty$）。
# - **先减 max 再 exp**：fp32 的 `exp` 在输入超过约 88.7 时溢出为 inf，inf/inf 得 NaN。
# - **分母和累加器都要重缩放**：只缩放一个，在 max 出现在第一个块时碰巧正确，后面的块抬高 max 就错。
# - **空行**：`seq_len = 0` 的填充行一个块也不读，输出 0。

# %%
# 把逻辑块号当物理块号会读哪些块？用图 6-1 最后一次调用的块表算出来（块 0 是 null block）。
last = ref_run.calls[-1]
for seq, (table, n) in enumerate(zip(last.block_table, last.seq_lens)):
    used = -(-n // last.k_cache.shape[1])
    print(f"r{seq}（seq_len={n}）：应读物理块 {list(table[:used])}，把逻辑块号当物理块号会读 {list(range(used))}")

# %% [markdown]
# 这里 r0 的逻辑块 0 读到物理块 0（全零的空块）：没读到别人的 K/V，结果却全错；cache 更满时就会读到别的请求的 K/V。
#
# ### 4. 性能与工程取舍
#
# - **受带宽限制**：每个（query 头, token）约 $4d$ 次浮点运算，每个（kv 头, token）读 $2d$ 个元素，算术强度为 $2G/\text{elt}$ FLOP/B（$G$ = `QUERIES_PER_KV`）。bf16、GQA 4 时约 4 FLOP/B，比 H100 SXM 的拐点（约 295）低约 70 倍（图 6-3）。
# - **每个字节只读一次**：不读 `seq_len` 之后的槽位，不写中间结果；组内 query 头共用一次 K/V 加载。
# - **并行度**：只有 `batch × num_kv_heads` 个 program，小 batch、长上下文时吃不满带宽；vLLM 在纯 decode 的小批上把序列切段并行再合并（见附录）。

# %%
L06.plot_roofline();

# %% [markdown]
# 图 6-3：图 1-1 的 roofline（H100 SXM：BF16 约 989 TFLOP/s，HBM3 约 3.35 TB/s）上，decode attention 的算术强度只有 1～8 FLOP/B，落在带宽斜线上，与峰值算力无关。

# %% [markdown]
# ## 具体演示：一次 decode 调用读了什么
#
# 用 Triton 解释器数 minivllm 的 decode kernel 读了多少字节、调用多少次 `tl.dot` 与 `exp`，再模拟每个 query 头一个 program 的读法。GPU 上改为用 `do_bench` 实测带宽。

# %%
from minivllm.attention.ops.triton_decode_attention import _paged_decode_attention_kernel  # noqa: E402

if L06.interpreting():
    demo_case, grouped, per_head, minimum = L06.interpreter_profile(_paged_decode_attention_kernel)
    print(demo_case.describe())
    print(L06.op_count_table(grouped, per_head, minimum))
else:
    L06.print_bandwidth(L06.measure_bandwidth(_paged_decode_attention_kernel))

# %% [markdown]
# 读表：分组 kernel 读的 K/V 字节正好是“每个字节一次”（`1.00x`），不分组时是 `QUERIES_PER_KV` 倍（这里 4 倍）。按图 6-3 推算，时间由读的字节决定（尚无 GPU 实测）。

# %% [markdown]
# ## 实践任务：唯一代码填空题
#
# 下面是 minivllm `_paged_decode_attention_kernel` 的副本。kernel 开头、③ K/V 的地址与加载、打分和收尾都已给出；块循环里只有 6 行是 `______`：
#
# - ① `physical_block`：这个逻辑块存在哪个物理块；
# - ② `token_mask`：本块的 `BLOCK_SIZE` 个槽位里，哪些是序列里的 token；
# - ④ `rescale`、`probs`、`running_sum`、`acc`：把图 6-2 下的公式写成 Triton，`acc` 一行照上面的 `tl.dot` 陷阱写。
#
# 只改 `______` 处，不删断言、不放宽条件。`tl.dot` 不合规则时，三项代码检查都判失败。

# %% nbgrader={"grade": false, "grade_id": "l06_kernel", "locked": false, "schema_version": 3, "solution": true, "task": false}
import triton
import triton.language as tl


@triton.jit
def paged_decode_kernel(
    out_ptr,                         # [num_seqs, num_heads, head_size]
    query_ptr,                       # [num_seqs, num_heads, head_size]
    k_cache_ptr, v_cache_ptr,        # [num_blocks, BLOCK_SIZE, num_kv_heads, head_size]
    block_table_ptr,                 # [num_seqs, max_blocks_per_seq] int32
    seq_lens_ptr,                    # [num_seqs] int32
    scale,                           # softmax scale, head_size ** -0.5
    stride_out_seq, stride_out_head,
    stride_query_seq, stride_query_head,
    stride_cache_block, stride_cache_slot, stride_cache_head,
    stride_block_table_seq,
    head_size,
    QUERIES_PER_KV: tl.constexpr,    # query heads per kv head (GQA ratio)
    GROUP_PAD: tl.constexpr,         # QUERIES_PER_KV padded to a power of two >= 16
    HEAD_DIM_PAD: tl.constexpr,      # head_size padded to a power of two >= 16
    BLOCK_SIZE: tl.constexpr,        # tokens per cache block
    COMPUTE_DTYPE: tl.constexpr,     # dtype fed to tl.dot
    DOT_PRECISION: tl.constexpr,     # "ieee" for fp32 inputs
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq)

    group = tl.arange(0, GROUP_PAD)          # row r = query head kv_head * QUERIES_PER_KV + r
    dims = tl.arange(0, HEAD_DIM_PAD)
    slots = tl.arange(0, BLOCK_SIZE)         # token offsets inside one cache block
    head_mask = group < QUERIES_PER_KV
    dim_mask = dims < head_size
    heads = kv_head * QUERIES_PER_KV + group

    q_offsets = seq * stride_query_seq + heads[:, None] * stride_query_head + dims[None, :]
    q = tl.load(query_ptr + q_offsets, mask=head_mask[:, None] & dim_mask[None, :], other=0.0)
    q = q.to(COMPUTE_DTYPE)                  # [GROUP_PAD, HEAD_DIM_PAD]

    # Online softmax state, one entry per query head of the group, all fp32.
    running_max = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    running_sum = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], dtype=tl.float32)

    num_logical_blocks = tl.cdiv(seq_len, BLOCK_SIZE)
    for logical_block in range(0, num_logical_blocks):
        # TODO 1. The physical block that holds this logical block (row `seq` of the block table).
        physical_block = tl.load(block_table_ptr + seq * stride_block_table_seq + logical_block)  ### BLANK
        physical_block = physical_block.to(tl.int64)   # block * stride can pass 2**31 in a big cache

        # TODO 2. Which of the block's BLOCK_SIZE slots hold tokens of the sequence?
        token_pos = logical_block * BLOCK_SIZE + slots   # each slot's position in the sequence
        token_mask = token_pos < seq_len  ### BLANK

        # 3. This kv head's K and V in the block, [BLOCK_SIZE, HEAD_DIM_PAD] (given): block, slot, kv head and
        #    dim, each times its stride; masked slots are not read (0 instead: an unwritten slot may hold NaN).
        kv_offsets = (physical_block * stride_cache_block + slots[:, None] * stride_cache_slot
                      + kv_head * stride_cache_head + dims[None, :])
        kv_mask = token_mask[:, None] & dim_mask[None, :]
        k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0).to(COMPUTE_DTYPE)
        v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0).to(COMPUTE_DTYPE)
        # Scores of every query head of the group against the block's tokens; masked slots get -inf.
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale   # [GROUP_PAD, BLOCK_SIZE]
        scores = tl.where(token_mask[None, :], scores, float("-inf"))

        # TODO 4. Online softmax (the formula under Figure 6-2): rescale what was summed under the old max,
        # then add this block. new_max is the m' of the formula.
        block_max = tl.max(scores, axis=1)
        new_max = tl.maximum(running_max, block_max)
        rescale = tl.exp(running_max - new_max)  ### BLANK
        probs = tl.exp(scores - new_max[:, None])  ### BLANK
        running_sum = running_sum * rescale + tl.sum(probs, axis=1)  ### BLANK
        acc = acc * rescale[:, None] + tl.dot(probs.to(COMPUTE_DTYPE), v, input_precision=DOT_PRECISION)  ### BLANK
        running_max = new_max

    running_sum = tl.where(running_sum == 0.0, 1.0, running_sum)   # seq_len 0 (a padded row): output 0
    out = acc / running_sum[:, None]
    out_offsets = seq * stride_out_seq + heads[:, None] * stride_out_head + dims[None, :]
    tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=head_mask[:, None] & dim_mask[None, :])


# %%
# 逐项报告（不会中断 Run All）：每个自动评分部分一行，✗ 后面是第一处不符合的地方。
report("lesson06", globals())

# %% [markdown]
# 第一项检查：在块被打散的序列上对照 torch 参考实现 `paged_attention_ref`。长度 5、16、17、40 分别是不足一块、恰好一块、刚跨过块边界、跨过两条边界；GQA 4。输出先填 NaN，没写到的位置会暴露出来。
#
# 隐藏测试也用块步长不连续的 K/V。

# %% nbgrader={"grade": true, "grade_id": "l06_main_path", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
case = L06.make_case(seq_lens=[5, 16, 17, 40], num_heads=8, num_kv_heads=2, head_size=32, block_size=16, seed=0)
print("block_table =", case.block_table.tolist())
assert case.queries_per_kv == 4                          # GQA：每个 kv 头服务 4 个 query 头
assert int(case.block_table[0, 0]) != 0                  # 逻辑块 0 不在物理块 0：必须查块表
out = L06.run_decode(paged_decode_kernel, case)
ref = L06.reference(case)
assert not torch.isnan(out).any(), "有输出位置没有被写到"
assert torch.allclose(out, ref, atol=1e-4), f"max error {(out - ref).abs().max().item():.3g}"
### BEGIN HIDDEN TESTS
L06.check_main_path(paged_decode_kernel)
### END HIDDEN TESTS

# %% [markdown]
# 第二项检查暂时把 Triton 后端的 `paged_decode_attention` 换成“启动你的 kernel”的函数，新建 `LLM(attention_backend="triton")`，对两个 prompt 贪心生成 6 个 token，退出时恢复。它检查：
#
# - 每一次 decode 调用的输出都与 torch 参考一致；
# - 生成的 token 与用 minivllm 自己的 kernel 时相同；
# - 一次 launch 恰好把每个 K/V 字节读一次（只在 CPU 的解释器下检查）。

# %% nbgrader={"grade": true, "grade_id": "l06_real_engine", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
student_run = L06.check_real_engine(paged_decode_kernel)
L06.print_engine_run(student_run, L06.reference_run())
print("真实引擎检查通过：每次 decode 调用与 torch 参考一致，贪心 token 与参考 kernel 相同，K/V 每字节只读一次。")

# %% [markdown]
# ### 你的 kernel 的 profiler 输出
#
# GPU 上用 `do_bench` 测你的 kernel（head_dim 128、bf16、上下文 4096）在不同 batch 下的有效带宽，画到 roofline 上；CPU 上给出解释器的计数（图 6-4）。

# %%
if L06.interpreting():
    _, grouped, per_head, minimum = L06.interpreter_profile(paged_decode_kernel)
    L06.plot_op_counts(grouped, per_head, minimum)
    print("CPU：上面是解释器的计数。实测带宽与 roofline 上的实测点需要 GPU（在 Colab 选 GPU 运行时重跑本单元格）。")
else:
    bw = L06.measure_bandwidth(paged_decode_kernel)
    L06.print_bandwidth(bw)
    L06.plot_roofline([(f"B={r['batch']}: {r['gbs']:.0f} GB/s", r["ai"], r["tflops"]) for r in bw["rows"]],
                      bw["peak_tflops"], bw["copy_gbs"] / 1e3, bw["device"])

# %% [markdown]
# 图 6-4（CPU）或图 6-3 实测版（GPU）。预期（尚待 GPU 实测）：batch 越大，实测点越接近带宽斜线；batch=1 时只有 8 个 program，远少于 SM 数。

# %% [markdown]
# ## 检查方法
#
# 运行断言；再运行下一个单元格：它在 query 放大 1 倍和 200 倍时各算一次打分，看朴素的 `exp(s)` 是否出现 inf，再用你的 kernel 跑放大 200 倍的批。Q2 要你解释这个结果。

# %%
for q_scale in (1.0, 200.0):
    hot = L06.make_case([20, 37], q_scale=q_scale, seed=6)
    k0 = hot.k_cache[hot.block_table[0, :2].long()].flatten(0, 1)[:20, 0]    # seq 0 的 20 个 key（kv 头 0）
    s = (k0 @ hot.query[0, 0]) * hot.scale                                   # query 头 0 的打分
    print(f"q_scale={q_scale:g}：最大打分 {s.max().item():.1f}；exp(s) 中 inf 的个数 "
          f"{torch.isinf(torch.exp(s)).sum().item()}；exp(s - max) 之和 {torch.exp(s - s.max()).sum().item():.3f}")
out_hot = L06.run_decode(paged_decode_kernel, hot)
print("q_scale=200 时 kernel 与参考的最大误差：", (out_hot - L06.reference(hot)).abs().max().item())

# %% nbgrader={"grade": true, "grade_id": "l06_boundary", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
edge = L06.make_case([0, 1, 16, 17], seed=4)
out_edge = L06.run_decode(paged_decode_kernel, edge)
assert torch.equal(out_edge[0], torch.zeros_like(out_edge[0]))          # seq_len=0：填充行输出 0
assert torch.allclose(out_edge[1:], L06.reference(edge)[1:], atol=1e-4)  # 1 个 token、整一块、跨一块
hot = L06.make_case([20, 37], q_scale=200.0, seed=6)                      # 上面“检查方法”里的放大打分
assert torch.allclose(L06.run_decode(paged_decode_kernel, hot), L06.reference(hot), atol=1e-4)  # 打分上百也不溢出
### BEGIN HIDDEN TESTS
L06.check_boundary(paged_decode_kernel)
### END HIDDEN TESTS

# %% [markdown]
# ## 映射回源码对象
#
# 这一部分自动评分（1 分）：在阅读表第 3、4 行显示的 `kernel_paged_attention_2d` 片段里，找出与每个空存放同一个量的变量名（单元格里的注释写了在哪一段找）。
#
# 答案是字符串，大小写不限；`kernel_unified_attention` 里的不同名字也接受。

# %% nbgrader={"grade": false, "grade_id": "l06_source_map_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
SOURCE_MAP = {
    # 阅读表第 3 行（L147–L167）
    "physical_block": "p_block_idx",  ### BLANK
    "token_mask": "kv_load_mask",  ### BLANK
    # 阅读表第 4 行（L228–L251）
    "rescale": "alpha",  ### BLANK
    "probs": "p",  ### BLANK
    "running_sum": "L",  ### BLANK
}

# %% nbgrader={"grade": true, "grade_id": "l06_source_map", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
L06.check_source_map(SOURCE_MAP)

# %% [markdown] nbgrader={"grade": false, "grade_id": "l06_q1", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q1（2 分）
#
# 用图 6-3 的数字说明：为什么 decode attention 的耗时由从显存读的字节数决定，而不是由浮点运算量决定？
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：
#
# - 2 分：给出算术强度与拐点的比较（decode attention 约 1～8 FLOP/B，bf16、GQA 4 约 4 FLOP/B，或写成 $2G/\text{elt}$；H100 SXM 的拐点约 295 FLOP/B，差约 70 倍），并由此得出结论：kernel 落在 roofline 的带宽斜线上，耗时 ≈ 读的字节数 / 显存带宽，算力大部分闲置。
# - 1 分：结论对（受带宽限制、耗时看读的字节），但没有用强度与拐点的比较说明；或给了比较，没有落到“耗时由字节数决定”。
# - 0 分：认为 decode 受算力限制、优化 FLOP（更快的 exp、tensor core）是主要手段，或把 H100 的峰值算力当成 decode 能达到的速度。
#
# **参考答案**
#
# decode 时每条序列只有 1 个 query token。对每个上下文 token，每个 query 头做约 $4d$ 次浮点运算（$q\cdot k$ 与 $p\,v$），每个 kv 头却要从显存读 $k$、$v$ 共 $2d$ 个元素，强度为 $2G/\text{elt}$ FLOP/B，bf16、GQA 4 约 4 FLOP/B。H100 SXM 的拐点约 989 TFLOP/s ÷ 3.35 TB/s ≈ 295 FLOP/B，高出约 70 倍，所以 decode attention 落在图 6-3 的带宽斜线上：耗时 ≈ 必读字节 / 带宽，算力大部分闲置。加大 batch 不改变强度，因为每条序列读的是自己的 K/V。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l06_q2", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q2（2 分）
#
# 检查方法的单元格里，q_scale=200 时朴素的 `exp(s)` 出现 inf，你的 kernel 却与参考一致；q_scale=1 时没有 inf。为什么你写的 `probs` 不会溢出？为什么只用 q_scale=1 这样的普通输入测不出“不减 max”的错误？
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：
#
# - 2 分：两点都对。① kernel 先减 running max 再取 exp，exp 的参数都 ≤ 0，值在 (0, 1]，分母至少为 1，不会出现 inf 或 NaN；朴素的 `exp(s)` 在 fp32 里超过约 88.7 就溢出为 inf，inf/inf 得 NaN。② 普通输入的打分只有个位数，`exp` 不溢出；不溢出时两种写法是同一个 softmax（分子分母同乘 $e^{-m}$，约掉），结果几乎相同，所以测试照样通过。说出“不溢出时两种写法是同一个 softmax”即可，不要求推导约分。
# - 1 分：只答对其中一点（只说减 max 防溢出，或只说普通输入不溢出、两种写法相同）。
# - 0 分：认为减 max 是近似、会改变结果，或把它说成性能优化。
#
# **不扣分的说法**：提到 vLLM 在整行分数为 $-\infty$ 时把重缩放因子和概率置 0（L234、L241），是对的；本课补齐行的分数为 0，不需要。
#
# **参考答案**
#
# fp32 的 `exp` 在参数超过约 88.7 时溢出为 inf；q_scale=200 时打分有几百，朴素的 `exp(s)` 出现 inf，分母和累加器都成 inf，`acc / sum` = inf/inf = NaN。kernel 的 `probs` 减的是 running max，参数都 ≤ 0，最大的一项是 1，所以分母至少为 1；`rescale` 的参数 `running_max - new_max` 也 ≤ 0。减去 max 相当于分子分母同乘 $e^{-m}$，数学上结果不变。q_scale=1 时打分只有个位数，`exp` 不溢出，漏掉这一步的写法与正确写法结果几乎相同，所以普通的随机测试抓不到它；边界检查专门用放大 200 倍的 query 造出几百的打分。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l06_q3", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q3（2 分）
#
# 本课 kernel 的 grid 是（序列数, kv 头数），一个 program 算共享同一 kv 头的整组 query 头。对照演示里的计数表（或图 6-4），与每个 query 头一个 program 相比，它少读了什么、少了几倍？为什么这能直接省时间？
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：
#
# - 2 分：指出少读的是 K/V：每个 kv 头的 K/V 每步只从显存读一次，而不是组内每个 query 头各读一次，少 `QUERIES_PER_KV` 倍（表里 4.00x → 1.00x）；并说明 decode 受带宽限制（Q1），耗时随读的字节数走，所以少读几倍就省下相应的时间。
# - 1 分：只说“省带宽/少读”而没说少的是哪份读取或几倍；或说对了倍数，没有联系到带宽限制。
# - 0 分：只说省了 FLOP 或显存占用，没有指出 K/V 被重复读取。
#
# **不扣分的说法**：提到计数表里分组版的 `tl.dot` 运算量与 `exp` 次数也少 4 倍（逐头版每个头也补到 16 行）；提到重复的读取可能部分命中 L2 缓存（没有保证）。
#
# **参考答案**
#
# GQA 模型里 `QUERIES_PER_KV` 个 query 头共享一个 kv 头的 K/V。每个 query 头一个 program 时，同一段 K/V 被 `QUERIES_PER_KV` 个 program 各读一遍；分组后一个 program 读一次 K/V，组内的 query 头作为 `tl.dot` 的行共用它。表里 K/V 读取字节从 4.00x 降到 1.00x（GQA 4），块表读取也少了 4 倍。decode 受带宽限制（Q1），耗时约等于读的字节除以带宽，所以 K/V 流量少 4 倍，这部分时间也少约 4 倍。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown]
# ## 评分规则
#
# - 代码 4 分：主路径 2 分（对照 torch 参考实现 1 分、接入真实引擎 1 分）、边界条件 1 分、能映射回源码对象 1 分；
# - Q1～Q3 各 2 分：每题 3～5 句，答到题目所问的全部要点得 2 分，只答对一部分得 1 分；
# - 一票否决：把峰值算力当成 decode 能达到的速度；混淆算法正确性与性能（如把减 max 说成提速手段）。
#
# 总分 10 分，至少 8 分通过。引擎的版本在 `minivllm/` 里，先独立完成再读。
#
# ### 自检
#
# 下面的单元格用与 nbgrader 相同的检查函数给代码部分打分（Q1～Q3 显示为待人工评分）。

# %%
self_check("lesson06", globals());

# %% [markdown]
# ## 附录（选读）
#
# 选读，不计分：在真实 vLLM 上运行、与 vLLM 的全部差异和参考资料。

# %% [markdown]
# ### 在真实 vLLM {{VLLM_VERSION}} 上看同一件事
#
# vLLM 的 paged attention Triton kernel（`kernel_paged_attention_2d`、`unified_attention`）要 GPU；本机的 vLLM 是 CPU 版：Triton 虽已安装，但没有 CPU 后端，vLLM 将其禁用，这些 kernel 不运行。
#
# 能跑的最近的东西是它的 CPU 注意力后端：照 `CPUAttentionBackendImpl.forward` 的调用，`cpu_attn_reshape_and_cache` 把 K/V 写进它自己的缓存布局，`cpu_attention_with_kv_cache` 在同一张块表上做 decode。
#
# 下表是两个 decode 批（本课的批和一个 head_dim 64 的批，块同样打散）上 vLLM 的 CPU 算子、minivllm 的 torch 参考与你的 kernel 两两的最大差。`make vllm` 之后，vLLM 的源码在 `.venv-vllm` 的 site-packages/vllm 下。

# %%
L06.vllm_side_by_side(paged_decode_kernel);

# %% [markdown]
# ### 参考资料
#
# - [vLLM Triton attention backend](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/attention/backends/triton_attn.py)
# - [vLLM `kernel_paged_attention_2d`](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/attention/ops/chunked_prefill_paged_decode.py)
# - [vLLM unified attention kernel](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/attention/ops/triton_unified_attention.py)
# - [PagedAttention（Kwon et al., SOSP 2023）](https://arxiv.org/abs/2309.06180)
# - [Online normalizer calculation for softmax（Milakov & Gimelshein, 2018）](https://arxiv.org/abs/1805.02867)
# - 图 6-3 的 H100 SXM5 规格（BF16 矩阵 989.4 TFLOP/s、HBM3 3.35 TB/s，均为理论峰值）：[Glenn Lockwood 的 H100 笔记](https://glennklockwood.com/garden/processors/h100)。本课还没有 GPU 上的带宽实测；本机的数字只有 Triton 解释器的计数（CPU）。
#
# 这些 kernel 以前在 `vllm/attention/ops/`，参数名随版本变化；current docs、支持矩阵和默认参数也会变，部署前按目标版本重新核对。
#
# ### 与 vLLM {{VLLM_VERSION}} 的差异
#
# 本课评分的块循环与 `kernel_paged_attention_2d` 一一对应。其余差别：
#
# - **调用的 kernel**：V1 的 Triton 后端在 `TritonAttentionImpl.forward` 里对整批 decode 行与 prefill 行调用一次 `unified_attention`，编码器注意力另走 `context_attention_fwd`；minivllm 的 Triton 后端先 decode、后 prefill，调用两个 kernel。
# - **写 cache**：vLLM 由 `TritonAttentionImpl.do_kv_cache_update` 在计算之前单独写新 token 的 K/V；minivllm 的 `forward` 先写后算，两步在同一个方法里。
# - **cache 布局**：vLLM Triton 后端的逻辑形状是 `(num_blocks, num_kv_heads, block_size, 2*head_size)`，默认 NHD 布局下按 token 排，K 与 V 打包在最后一维；minivllm 用 `[2, num_blocks, block_size, num_kv_heads, head_size]`。
# - **`kernel_paged_attention_2d`**：由 ROCm 后端 `rocm_attn.py` 调用，用按头排的旧 cache 布局。
# - **按 token 查块**：它的循环单位是 Triton 的块，不一定等于 cache 的块（`PHYSICAL_BLOCK_SIZE`），所以为每个 token 查一次物理块号；minivllm 的循环单位就是 cache 块，每块查一次。
# - **$-\infty$ 保护**：vLLM 把补齐的 query 头的注意力分数置为 $-\infty$，整行都是 $-\infty$ 时 `exp(-inf - (-inf))` 是 NaN，所以它把这时的重缩放因子和概率置 0。minivllm 补齐的行 query 为 0、分数为 0，第一个块总有有效 token，不会出现整行 $-\infty$。
# - **分段**：`unified_attention` 在批次全是 decode、且序列数不超过 `seq_threshold_3D` 时，把一条序列切成多段（3D 路径），再由 `reduce_segments` 合并；minivllm 不分段。
# - **`triton_decode_attention.py`**：服务 MLA 后端（`triton_mla.py`）。分组时 grid 第二维是 `cdiv(head_num, min(BLOCK_H, kv_group_num))`，一个 program 至多 16 个头；MLA 只有一个 KV 头，每个 rank 超过 16 个头时，同一份 K/V 被几个 program 各读一遍。
# - **块大小**：vLLM 的 Triton 后端要求块大小是 16 的倍数；minivllm 要求 2 的幂，在 CUDA 上至少 16。
# - **后端优先级**：NVIDIA GPU 上默认 FlashAttention；只有计算能力 10.x（如 B200）的因果注意力先选 FlashInfer，12.x 仍先选 FlashAttention；Triton 后端选中时对整批只调用一次 `unified_attention`。
# - **不分组的代价**：每个 query 头一个 program 时，同一份 K/V 被请求 `QUERIES_PER_KV` 次，L2 缓存能挡住多少没有保证。
# - **块大小的取舍**：块越大，块表读取和循环越少；块越小，最后一块浪费的槽位越少，前缀缓存的粒度越细。
#
# ← 上一课：第 5 课：GPUModelRunner：持久批与 varlen 输入准备　｜　下一课 →：第 7 课：采样器：temperature、top-k/top-p、种子与 logprobs
