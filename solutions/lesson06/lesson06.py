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
# 本课产出：写出分页 KV cache 上 decode attention 的块循环，接进 minivllm 的 Triton 后端，让真实引擎用它生成文本。循环要做三件事：
#
# - 按块表把逻辑块翻译成物理块；
# - 构造带掩码的 K/V 指针；
# - 用 online softmax（running max、分母、累加器重缩放）一次扫过整段上下文。
#
# 你还应能说清 decode 为何受带宽限制，kernel 要把什么降到最少。
#
# 通过要求：代码断言全部通过；Q1～Q3 沿源码对象给出因果链；总分至少 8/10。
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
# 源码固定在 vLLM commit 8e958902eee5（0.27.1 发布后一天）。读 kernel 时先看 grid 的每一维是谁，再看循环每次读哪些字节，最后看数值细节。
#
# | 顺序 | vLLM 文件与入口 | minivllm 对应 | 带着什么问题读 |
# |---|---|---|---|
# | 1 | `vllm/v1/attention/backends/triton_attn.py`：`TritonAttentionImpl.do_kv_cache_update`（L819–L834） | `minivllm/attention/backends/triton_attn.py`：`forward` | 新 token 的 K/V 何时写进 cache？ |
# | 2 | `vllm/v1/attention/ops/chunked_prefill_paged_decode.py`：`kernel_paged_attention_2d`（L90–L104、L123–L251） | `minivllm/attention/ops/triton_decode_attention.py` | grid 为何是（序列, kv 头）？未写的槽位怎样挡掉？ |
# | 3 | `vllm/v1/attention/ops/triton_decode_attention.py`：`_decode_att_m_fwd`（L229–L233）、`_decode_grouped_att_m_fwd`（L510–L519） | 本课的 kernel 是“分组”的那种 | 两个 grid 的第二维各是什么，各读几遍 K/V？（第三维是分段，略） |
#
# > **谁调用谁**：NVIDIA GPU 上注意力后端默认 FlashAttention，Triton 排在其后（`vllm/platforms/cuda.py`：`_get_backend_priorities`）。`kernel_paged_attention_2d` 是 ROCm 的回退路径，块循环与本课一一对应。

# %%
# 上表各行在 vLLM 0.27.1 源码里的样子：文件路径、行号与逐行原文（行号与上表一致；源码由第一个单元格获取并校验）。
from autograder.vllm_source import show_vllm

show_vllm("vllm/v1/attention/backends/triton_attn.py", "TritonAttentionImpl.do_kv_cache_update", lines=(819, 834))
show_vllm("vllm/v1/attention/ops/chunked_prefill_paged_decode.py", "kernel_paged_attention_2d", lines=(90, 104))
show_vllm("vllm/v1/attention/ops/chunked_prefill_paged_decode.py", "kernel_paged_attention_2d", lines=(123, 251))
show_vllm("vllm/v1/attention/ops/triton_decode_attention.py", "_decode_att_m_fwd", lines=(229, 233))
show_vllm("vllm/v1/attention/ops/triton_decode_attention.py", "_decode_grouped_att_m_fwd", lines=(510, 519))

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
# 填空要用的 Triton 写法：
#
# - **program**：kernel 按 grid 启动许多 program，每个用 `tl.program_id(axis)` 得知自己负责哪一份；
# - **块与 mask**：`tl.arange(0, N)` 给出块内下标（N 为 2 的幂）；`tl.load(ptrs, mask=m, other=0.0)` 一次读一块，m 为假处取 `other`；
# - **二维地址**：`ptr + 行[:, None] * 行步长 + 列[None, :]` 广播成一块；每一维乘自己的 stride 再相加；
# - **逐元素与按行归约**：`tl.maximum(a, b)`、`tl.exp(x)`；`tl.max(x, axis=1)`、`tl.sum(x, axis=1)`；
# - **`tl.dot`**：两个块的矩阵乘，每一维至少 16，走 tensor core；两个操作数都先 `.to(COMPUTE_DTYPE)`，并带 `input_precision=DOT_PRECISION`，否则 GPU 上 fp32 按 tf32 算，差约 1e-3。
#
# minivllm 的 decode kernel 对应 vLLM 的 `kernel_paged_attention_2d`：
#
# - **grid = (序列数, kv 头数)**：一个 program 负责一条序列的一个 kv 头和共享它的 `QUERIES_PER_KV` 个 query 头（GQA 分组），补到至少 16 行（vLLM 的 `num_queries_per_kv_padded`）。
# - **沿逻辑块循环**：从块表读物理块号，构造 K/V 指针并掩掉 `seq_len` 之后的槽位，一次 `tl.dot` 算出组内各头的分数，再做 online softmax 更新。
# - 循环结束后输出 `acc / running_sum`，只写一次。
#
# 下面的图来自真实引擎：Triton 后端在默认模型（8 个 query 头、2 个 kv 头）上贪心生成，记录每次 decode 调用的块表与长度。

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
# - **GQA 映射**：组内第 r 行是 query 头 `kv_head * QUERIES_PER_KV + r`。错配不报错，只会读错头。
# - **空行与越界**：`seq_len = 0` 的填充行输出 0；块号乘步长要转成 int64。

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
# - **受带宽限制**：每个（query 头, token）约 $4d$ 次浮点运算，每个（kv 头, token）读 $2d$ 个元素，算术强度为 $2G/\text{elt}$ FLOP/B（$G$ = `QUERIES_PER_KV`）。bf16、GQA 4 时约 4 FLOP/B，比 H100 SXM 的拐点（约 295）低两个数量级（图 6-3）。
# - **每个字节只读一次**：不读 `seq_len` 之后的槽位，不写中间结果；组内 query 头共用一次 K/V 加载。
# - **并行度**：只有 `batch × num_kv_heads` 个 program，小 batch、长上下文时吃不满带宽；vLLM 在纯 decode 的小批上把序列切段并行再合并（见附录）。

# %%
L06.plot_roofline();

# %% [markdown]
# 图 6-3：图 1-1 的 roofline（H100 SXM：BF16 约 989 TFLOP/s，HBM3 约 3.35 TB/s）上，decode attention 的算术强度只有 1～8 FLOP/B，落在带宽斜线上，与峰值算力无关。实测点需要 GPU。

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
# 读表：分组 kernel 读的 K/V 字节正好是“每个字节一次”（`1.00x`），不分组时是 `QUERIES_PER_KV` 倍（这里 4 倍）。`exp` 的次数含补齐到 16 行的空头：计算有浪费；按图 6-3 推算，时间由读的字节决定（尚无 GPU 实测）。

# %% [markdown]
# ## 实践任务：唯一代码填空题
#
# 下面是 minivllm `_paged_decode_attention_kernel` 的副本，块循环里 8 处被挖成了 `______`：① 从块表读物理块号；② 本块的 token 掩码与 K/V 指针偏移；④ online softmax 的更新（新 max、重缩放因子、本块概率、分母、累加器）。其余代码都已给出。
#
# 只改 `______` 处，不删断言、不放宽条件。
#
# 解释器测不出 tf32 的误差，所以启动器静态检查每个 `tl.dot` 是否照上面的规则写，不符则三项代码检查都判失败。

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
        # TODO 1. Where does this block of the sequence live in the cache? (row `seq` of the block table)
        physical_block = tl.load(block_table_ptr + seq * stride_block_table_seq + logical_block)  ### BLANK
        physical_block = physical_block.to(tl.int64)   # block * stride can pass 2**31 in a big cache

        # TODO 2. Its BLOCK_SIZE tokens of this kv head: which are inside the sequence, and their offsets.
        token_pos = logical_block * BLOCK_SIZE + slots
        token_mask = token_pos < seq_len  ### BLANK
        kv_offsets = physical_block * stride_cache_block + slots[:, None] * stride_cache_slot + kv_head * stride_cache_head + dims[None, :]  ### BLANK
        kv_mask = token_mask[:, None] & dim_mask[None, :]
        k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0).to(COMPUTE_DTYPE)
        v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0).to(COMPUTE_DTYPE)

        # 3. Scores of every query head of the group against the block's tokens (given).
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale   # [GROUP_PAD, BLOCK_SIZE]
        scores = tl.where(token_mask[None, :], scores, float("-inf"))

        # TODO 4. Online softmax: raise the running max, rescale what was summed under the old max.
        block_max = tl.max(scores, axis=1)
        new_max = tl.maximum(running_max, block_max)  ### BLANK
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
# 图 6-4（CPU）或图 6-3 实测版（GPU）。batch 越大，实测点越接近带宽斜线；batch=1 时只有 8 个 program，远少于 SM 数。

# %% [markdown]
# ## 检查方法
#
# 运行断言；再把 query 放大 200 倍，让注意力分数到几百，看看“不减 max 直接 exp”会怎样，解释你的 kernel 为什么不受影响。然后把 `q_scale` 改回 1 重跑，解释为什么那时两种写法结果一样，因而普通的随机测试抓不到这个错误。

# %%
hot = L06.make_case([20, 37], q_scale=200.0, seed=6)
k0 = hot.k_cache[hot.block_table[0, :2].long()].flatten(0, 1)[:20, 0]    # seq 0 的 20 个 key（kv 头 0）
s = (k0 @ hot.query[0, 0]) * hot.scale                                   # query 头 0 的打分
print(f"最大打分 {s.max().item():.1f}；exp(s) 中 inf 的个数 {torch.isinf(torch.exp(s)).sum().item()}；"
      f"exp(s - max) 之和 {torch.exp(s - s.max()).sum().item():.3f}")
out_hot = L06.run_decode(paged_decode_kernel, hot)
print("kernel 与参考的最大误差：", (out_hot - L06.reference(hot)).abs().max().item())

# %% [markdown]
# 你的解释：

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
# 这一部分自动评分（1 分）：打开 vLLM 8e958902eee5 的 `vllm/v1/attention/ops/chunked_prefill_paged_decode.py`，在 `kernel_paged_attention_2d` 的块循环里找到每个空对应的变量名，以及本课参数 `stride_block_table_seq` 在那里的参数名。
#
# 答案是字符串，大小写不限；`kernel_unified_attention` 里的不同名字也接受。

# %% nbgrader={"grade": false, "grade_id": "l06_source_map_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
SOURCE_MAP = {
    "physical_block": "p_block_idx",  ### BLANK
    "token_mask": "kv_load_mask",  ### BLANK
    "kv_offsets": "k_offset",  ### BLANK
    "new_max": "m_j",  ### BLANK
    "rescale": "alpha",  ### BLANK
    "probs": "p",  ### BLANK
    "running_sum": "L",  ### BLANK
    "stride_block_table_seq": "block_table_stride",  ### BLANK
}

# %% nbgrader={"grade": true, "grade_id": "l06_source_map", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
L06.check_source_map(SOURCE_MAP)

# %% [markdown] nbgrader={"grade": false, "grade_id": "l06_q1", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q1（2 分）
#
# 为什么 decode attention 受显存带宽限制而不是算力限制？一个 decode kernel 应当把什么降到最少？请用本课的 kernel 与图 6-3/6-4 说明。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 算出或说清算术强度（每个 query token 对每个上下文 token 只做约 $4d$ FLOP，却要读 $2d$ 个 K/V 元素；强度 $2G/\text{elt}$，bf16 下约 QUERIES_PER_KV FLOP/B，远低于 H100 SXM 的拐点 ~295）⇒ 时间 ≈ 读取字节数 / 带宽；并指出要最少化的是从显存读写的字节：每个 K/V 字节每步只读一次（GQA 组内共享、不读 seq_len 之后的槽位）、不把打分/概率写回显存、不先 gather 成连续张量、只写一次输出；1 分 = 只说“decode 是 GEMV/受带宽限制”而没有落到 kernel 该少读什么，或只列措施没有因果；0 分 = 认为优化 FLOP（如更快的 exp、tensor core）是主要手段，或把 H100 峰值当成 decode 能达到的速度（一票否决：把论文峰值写成普遍结论）。
#
# **参考答案**
#
# 1. 算术强度：decode 时每条序列只有 1 个 query token。对每个上下文 token，每个 query 头做 $q\cdot k$ 与 $p\,v$ 共约 $4d$ 次浮点运算，而每个 kv 头要从显存读 $k$、$v$ 共 $2d$ 个元素（bf16 为 $4d$ 字节）。GQA 比例为 $G$ 时强度为 $4dG/(2d\cdot\text{elt}) = 2G/\text{elt}$ FLOP/B，GQA 4、bf16 约 4 FLOP/B。H100 SXM 的拐点约 295 FLOP/B（图 1-1；PCIe 版约 378），差两个数量级，所以 kernel 落在 roofline 的带宽斜线上（图 6-3）：耗时 ≈ 必读字节 / 显存带宽，算力大部分闲置。batch 变大也不改变这个强度——每条序列有自己的 K/V，增加的是要读的字节，而不是复用。
# 2. 必须最少化的是显存流量：
#    - 每个 K/V 字节每步只读一次：一组共享 kv 头的 query 头在同一个 program 里复用一次加载（图 6-4：分组 1.00x，不分组 4x）；`seq_len` 之后的槽位不读（掩码同时省流量和保证正确性）。
#    - 不产生中间显存流量：online softmax 让打分、概率和累加器都留在寄存器里，不写回整行打分再读回来做 softmax；也不像参考实现那样先把块 gather 成连续 K/V（那是一次额外的读+写）。
#    - 输出只写一次；块表、query 的流量与 K/V 相比可忽略。
# 3. 成本边界：即使做到每字节只读一次，上限也是“带宽 × 强度”；实际能达到多少拷贝带宽（例如 ≥70%）要靠 do_bench 实测确认，而且 program 数（batch × kv 头）太少时吃不满带宽，需要 split-KV。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l06_q2", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q2（2 分）
#
# 为什么要用 online softmax？如果去掉 running max（直接 `exp(scores)`），或者只重缩放分母、不重缩放累加器，分别在什么输入上出错、错成什么样？
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 说清动机（整行打分要等读完所有块才有 max 和分母；两遍扫描要么读两遍 K/V、要么把打分写回显存，都增加带宽；online softmax 一遍扫描、状态只有每个头的 $m,\ell$ 和累加器）并给出两个错误各自的触发条件与后果（不减 max：数学上等价，普通打分下测试照样通过，打分超过 ~88 时 `exp` 溢出为 inf，inf/inf → NaN；不重缩放累加器：max 只在第一个块时碰巧正确，后续块抬高 max 后旧累加器相对分母放大了 $e^{m'-m}$ 倍，输出偏向前面的块）；1 分 = 只说动机或只说一种错误；0 分 = 认为 online softmax 改变了结果（它与整行 softmax 数学等价），或把数值稳定性与性能混为一谈（一票否决：混淆算法正确性与性能）。**不扣分的说法**：指出 vLLM 的 `kernel_paged_attention_2d` 还要对整行为 $-\infty$ 的情形做保护（`M` 为 $-\infty$ 时 `alpha` 置 0，`m_j` 为 $-\infty$ 时 `p` 置 0，因为补齐的 query 头被掩成 $-\infty$，`exp(-inf - (-inf))` 是 NaN），是正确的；本课 kernel 的补齐行分数为 0、第一个块总有有效 token，所以不需要。
#
# **参考答案**
#
# 1. 为什么：softmax 的分母和 max 依赖整行打分，而 decode kernel 是一块一块读 K/V 的。朴素做法要么扫两遍（第一遍求 max 与分母，第二遍再读一遍 K/V 求加权和——K/V 流量翻倍），要么把整行打分写回显存再读（额外流量，且长上下文时放不进寄存器/共享内存）。Online softmax 维护每个 query 头的 running max $m$、分母 $\ell$ 与累加器 $a$，每个块到来时用 $r=e^{m-m'}$ 把旧状态换算到新 max 下，一遍扫描、K/V 只读一次、状态常驻寄存器——这直接服务于 Q1 的“每字节只读一次”。结果与整行 softmax 数学等价（图 6-2 的误差 ~1e-7）。
# 2. 不减 max：`exp(s)` 在 $s \gtrsim 88.7$（fp32）时溢出为 inf，分母与累加器出现 inf，`acc / sum` = inf/inf = NaN；打分为很大的负数时则下溢为 0，分母为 0。打分在 ±10 以内时与正确写法结果相同，所以随机小输入的测试抓不到它（本课的边界检查用放大 200 倍的 query 造出几百的打分）。
# 3. 只重缩放分母、不重缩放累加器：若最大的打分恰好在第一个块，之后 $m$ 不变、$r=1$，结果碰巧正确；一旦后面的块抬高了 max，旧累加器仍是相对旧 max 计算的，比应有值大 $e^{m'-m}$ 倍，而分母已被正确缩小，输出被前面的块“放大”，偏离正确值。反之只缩放累加器、不缩放分母，输出整体偏小。两者都不会报错，只有对照参考实现（或真实引擎生成的 token 变了）才会发现。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l06_q3", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q3（2 分）
#
# 本课的 kernel 让一个 program 处理共享同一 kv 头的整组 query 头（GQA 分组）。这省下了什么？代价和边界是什么？对照阅读表第 3 行的两个 grid 说明。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 指出省下的是 K/V 的重复读取（每个 kv 头的 K/V 每步只从显存读一次，而不是每个 query 头读一次，省 QUERIES_PER_KV 倍流量，图 6-4 实测 4x→1x）以及块表读取与循环开销，并把组内 query 头做成 `tl.dot` 的行，让打分与 $p\,v$ 走矩阵乘；同时说出代价/边界（组被补到 16 行，与 vLLM 的 `num_queries_per_kv_padded` 相同，QUERIES_PER_KV 小时浪费计算，但在带宽受限下几乎免费；说这是为 `tl.dot` 或 tensor core 形状所做的选择也可；program 数从 B×H 降到 B×Hkv，小 batch 时并行度更低，需要 split-KV；正确性要求组内第 r 行对应 query 头 `kv_head*QUERIES_PER_KV + r`）；对应到 vLLM：`_decode_att_m_fwd` 的 grid 是 `(batch, head_num, NUM_KV_SPLITS)`，每个 query 头一个 program，但 `decode_attention_fwd` 只在 `kv_group_num == 1` 时走它，GQA 时走 `_decode_grouped_att_m_fwd`，grid 第二维是 `cdiv(head_num, min(BLOCK_H, kv_group_num))`，一个 program 处理 `min(16, kv_group_num)` 个头（说“vLLM 的 GQA decode 每个 query 头读一遍 K/V”的不得 2 分）；1 分 = 只说“省带宽”没有说省的是哪份读取、或没有代价；0 分 = 认为分组减少的是 FLOP 或显存占用（KV cache 大小由 kv 头数决定，与 kernel 是否分组无关），或把“GQA 模型省 KV cache”与“kernel 分组省读取”混为一谈而说不清后者。
#
# **参考答案**
#
# 1. 省下了什么：GQA 模型里 QUERIES_PER_KV 个 query 头共享一个 kv 头的 K/V。若 kernel 每个 query 头一个 program，同一段 K/V 会被 kv_group_num 个 program 各读一遍——能否命中 L2 取决于调度与上下文长度，不能保证；decode 受带宽限制（Q1），这几乎就是 kv_group_num 倍的时间。vLLM `triton_decode_attention.py`（在 V1 里服务 MLA 后端）的 `decode_attention_fwd` 正是按这一点选 kernel：`kv_group_num == 1`（MHA，没有可共享的 K/V）时经 `_decode_att_m_fwd` 启动每个 query 头一个 program 的 kernel（grid 为 (batch, head_num, NUM_KV_SPLITS)）；有分组时经 `_decode_grouped_att_m_fwd` 启动分组 kernel，grid 第二维是 `cdiv(head_num, min(BLOCK_H, kv_group_num))`，一个 program 处理 `min(16, kv_group_num)` 个共享 K/V 的头；MLA 只传一个 KV 头，每个 rank 超过 16 个头时，仍有 `cdiv(head_num, 16)` 个 program 各读一遍同一份 K/V。分组后（本课 kernel；`kernel_paged_attention_2d` 与 `kernel_unified_attention` 的 grid 第二维也是 kv 头），每个 kv 头的 K/V 每步只读一次：图 6-4 中解释器数出的 K/V 字节从 4x（把 K/V 按 query 头展开、模拟不分组的读法）降到 1.00x。块表读取、循环与地址计算也只做一次。
# 2. 顺带的好处：组内 query 头成为矩阵的行，打分 `q @ k^T` 和 `p @ v` 变成真正的 `tl.dot`，可以上 tensor core，而不是逐头的向量点积。
# 3. 代价与边界：
#    - 组被补到 16 行（`GROUP_PAD`，vLLM 的 `num_queries_per_kv_padded` 同样至少 16），让组内的 query 头作为 `tl.dot` 的行；QUERIES_PER_KV=4 时 3/4 的行是空的，exp 与 dot 的计算有浪费，但 kernel 受带宽限制，这部分几乎不花时间；
#    - program 数从 batch×num_heads 降到 batch×num_kv_heads，小 batch 长上下文时 SM 吃不满，要靠 split-KV（vLLM 的 3D 路径、NUM_KV_SPLITS）补回并行度；
#    - 正确性：第 r 行必须是 query 头 `kv_head * QUERIES_PER_KV + r`，输出也写回这些头；映射错不会报错，只会读错头（本课的 GQA 变异体）。
# 4. 不要混淆：GQA 让 KV cache 变小是模型结构决定的（kv 头少），与 kernel 是否分组无关；kernel 分组省的是“同一份 K/V 被重复读”的流量。
#
# **附：检查方法的参考解释**（不单独计分）：打分到几百时 `exp(s)` 溢出为 inf（fp32 上限约 $e^{88.7}$），朴素 softmax 得 inf/inf = NaN；kernel 先减 running max，`exp` 的参数都 ≤ 0，分母至少为 1，所以结果正确。q_scale=1 时打分只有个位数，`exp` 不溢出，两种写法数学等价、数值几乎相同，所以随机小输入的测试区分不了它们——边界检查必须专门构造大打分。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown]
# ## 评分规则
#
# - 代码 4 分：主路径 2 分（对照 torch 参考实现 1 分、接入真实引擎 1 分）、边界条件 1 分、能映射回源码对象 1 分；
# - Q1～Q3 各 2 分：必须包含对象、状态变化、正确性或成本链；
# - 一票否决：把论文峰值写成普遍生产结论；把源码支持写成所有模型/硬件可用；混淆算法正确性与性能；只背类名而说不清状态所有权。
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
# ### 在真实 vLLM 0.27.1 上看同一件事
#
# vLLM 的 paged attention Triton kernel（`kernel_paged_attention_2d`、`unified_attention`）要 GPU；本机的 vLLM 是 CPU 版，没有 Triton，这些 kernel 不运行。
#
# 能跑的最近的东西是它的 CPU 注意力后端：照 `CPUAttentionBackendImpl.forward` 的调用，`cpu_attn_reshape_and_cache` 把 K/V 写进它自己的缓存布局，`cpu_attention_with_kv_cache` 在同一张块表上做 decode。
#
# 下表是两个 decode 批（本课的批和一个 head_dim 64 的批，块同样打散）上 vLLM 的 CPU 算子、minivllm 的 torch 参考与你的 kernel 两两的最大差。`make vllm` 之后，vLLM 的源码在 `.venv-vllm` 的 site-packages/vllm 下。

# %%
L06.vllm_side_by_side(paged_decode_kernel);

# %% [markdown]
# ### 参考资料
#
# - [vLLM Triton attention backend](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/attention/backends/triton_attn.py)
# - [vLLM `kernel_paged_attention_2d`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/attention/ops/chunked_prefill_paged_decode.py)
# - [vLLM unified attention kernel](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/attention/ops/triton_unified_attention.py)
# - [PagedAttention（Kwon et al., SOSP 2023）](https://arxiv.org/abs/2309.06180)
# - [Online normalizer calculation for softmax（Milakov & Gimelshein, 2018）](https://arxiv.org/abs/1805.02867)
# - 图 6-3 的 H100 SXM5 规格（BF16 矩阵 989.4 TFLOP/s、HBM3 3.35 TB/s，均为理论峰值）：[Glenn Lockwood 的 H100 笔记](https://glennklockwood.com/garden/processors/h100)。本课还没有 GPU 上的带宽实测；本机的数字只有 Triton 解释器的计数（CPU）。
#
# 这些 kernel 以前在 `vllm/attention/ops/`，参数名随版本变化；current docs、支持矩阵和默认参数也会变，部署前按目标版本重新核对。
#
# ### 与 vLLM 0.27.1 的差异
#
# 本课评分的块循环与 `kernel_paged_attention_2d` 一一对应。其余差别：
#
# - **调用的 kernel**：V1 的 Triton 后端在 `TritonAttentionImpl.forward` 里对整批 decode 行与 prefill 行调用一次 `unified_attention`，编码器注意力另走 `context_attention_fwd`；minivllm 的 Triton 后端先 decode、后 prefill，调用两个 kernel。
# - **写 cache**：vLLM 由 `TritonAttentionImpl.do_kv_cache_update` 在计算之前单独写新 token 的 K/V；minivllm 的 `forward` 先写后算，两步在同一个方法里。
# - **cache 布局**：vLLM Triton 后端的逻辑形状是 `(num_blocks, num_kv_heads, block_size, 2*head_size)`，默认 NHD 布局下按 token 排，K 与 V 打包在最后一维；minivllm 用 `[2, num_blocks, block_size, num_kv_heads, head_size]`。
# - **`kernel_paged_attention_2d`**：由 ROCm 后端 `rocm_attn.py` 调用，用按头排的旧 cache 布局。
# - **按 token 查块**：它的循环单位是 Triton 的块，不一定等于 cache 的块（`PHYSICAL_BLOCK_SIZE`），所以为每个 token 查一次物理块号；minivllm 的循环单位就是 cache 块，每块查一次。
# - **$-\infty$ 保护**：vLLM 把补齐的 query 头的注意力分数置为 $-\infty$，整行都是 $-\infty$ 时 `exp(-inf - (-inf))` 是 NaN，所以它把这时的 `alpha` 和 `p` 置 0。minivllm 补齐的行 query 为 0、分数为 0，第一个块总有有效 token，不会出现整行 $-\infty$。
# - **分段**：`unified_attention` 在批次全是 decode、且序列数不超过 `seq_threshold_3D` 时，把一条序列切成多段（3D 路径），再由 `reduce_segments` 合并；minivllm 不分段。
# - **`triton_decode_attention.py`**：服务 MLA 后端（`triton_mla.py`）。分组时 grid 第二维是 `cdiv(head_num, min(BLOCK_H, kv_group_num))`，一个 program 至多 16 个头；MLA 只有一个 KV 头，每个 rank 超过 16 个头时，同一份 K/V 被几个 program 各读一遍。
# - **块大小**：vLLM 的 Triton 后端要求块大小是 16 的倍数；minivllm 要求 2 的幂，在 CUDA 上至少 16。
# - **后端优先级**：NVIDIA GPU 上默认 FlashAttention；只有计算能力 10.x（如 B200）的因果注意力先选 FlashInfer，12.x 仍先选 FlashAttention；Triton 后端选中时对整批只调用一次 `unified_attention`。
# - **不分组的代价**：每个 query 头一个 program 时，同一份 K/V 被请求 `QUERIES_PER_KV` 次，L2 缓存能挡住多少没有保证。
# - **块大小的取舍**：块越大，块表读取和循环越少；块越小，最后一块浪费的槽位越少，前缀缓存的粒度越细。
#
# ← 上一课：第 5 课：GPUModelRunner：持久批与 varlen 输入准备　｜　下一课 →：第 7 课：采样器：temperature、top-k/top-p、种子与 logprobs
