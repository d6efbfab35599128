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
# 本课产出：亲手写出分页 KV cache 上 decode attention 的核心循环——按块表把逻辑块翻译成物理块、构造带掩码的 K/V 指针、用 online softmax（running max、分母、累加器重缩放）一次扫过整段上下文——并把它接进 minivllm 的 Triton 后端，让真实引擎用你的 kernel 生成文本；能说清 decode 为什么受带宽限制、kernel 要把什么降到最少。
#
# 通过要求：唯一代码填空题通过全部断言；Q1～Q3 都能沿源码对象给出因果链；能指出一个正确性不变量（例如：最后一个块里 seq_len 之后的槽位必须被掩掉）、一个性能边界（例如：每步必须把整段 K/V 从显存读一遍，带宽封顶）和一个需要 benchmark 才能确认的结论（例如：小 batch 长上下文时本 kernel 能达到多少拷贝带宽）；总分至少 8/10。
#
# | 部分 | 分值 | 评分方式 |
# |---|---|---|
# | 代码·主路径（对照 torch 参考实现 1 分 + 接入真实引擎 1 分） | 2 | 自动 |
# | 代码·边界条件（空行、整块、跨块、未写槽位为 NaN、超大打分、GQA 比例 3） | 1 | 自动 |
# | 代码·能映射回源码对象（`SOURCE_MAP`） | 1 | 自动 |
# | Q1～Q3 | 各 2 | 人工，按评分规则 |
#
# 本课在 CPU 上用 Triton 解释器（`TRITON_INTERPRET=1`，在导入 triton 之前由准备单元格设置）运行 kernel，形状很小；在有 GPU 的 Colab 上同一个 kernel 不加修改地编译运行，并多出一张实测带宽图。没有 nbgrader 时（例如 Colab），运行本课最后的“自检”单元格，或在终端执行 `python -m autograder check lesson06`（在本笔记本所在的文件夹或仓库根目录都可以）。

# %% [markdown]
# ## 源码版本与阅读方法
#
# 本课程使用固定 commit 的永久链接保证行号可复现，同时链接 current docs 供核对最新变化。读 kernel 时先画“一个 program 负责什么”（grid 的每一维是谁），再看循环里每次读了哪些字节，最后才看数值细节；不要从 launcher 的参数列表开始逐行读。
#
# | 顺序 | vLLM 文件与入口（8e958902eee5） | minivllm 对应文件 | 带着什么问题读 |
# |---|---|---|---|
# | 1 | [`vllm/v1/attention/backends/triton_attn.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/attention/backends/triton_attn.py)：`TritonAttentionImpl.do_kv_cache_update`、`TritonAttentionImpl.forward`、`TritonAttentionBackend.get_kv_cache_shape` | `minivllm/attention/backends/triton_attn.py`：`TritonAttentionImpl.forward` | 新 token 的 K/V 何时、由谁写进分页 cache？decode 行和 prefill 行交给哪个 kernel？ |
# | 2 | [`vllm/v1/attention/ops/chunked_prefill_paged_decode.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/attention/ops/chunked_prefill_paged_decode.py)：`kernel_paged_attention_2d`（ROCm 后端 `rocm_attn.py` 的回退路径，见下方说明） | `minivllm/attention/ops/triton_decode_attention.py`：`_paged_decode_attention_kernel` | grid 为什么是 (序列, kv 头)？块表怎样把逻辑块变成物理地址？未写入的槽位怎样被挡在外面？ |
# | 3 | [`vllm/v1/attention/ops/triton_unified_attention.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/attention/ops/triton_unified_attention.py)：`kernel_unified_attention`（`IS_3D` 分段）、`reduce_segments`、`unified_attention` | `minivllm/attention/ops/triton_prefill_attention.py`（chunked prefill）；我们的 decode kernel 不分段 | 一个 kernel 怎样同时服务 prefill 与 decode？小 batch 长上下文时为什么把一条序列切成多段、最后再合并 softmax？ |
# | 4 | [`vllm/v1/attention/ops/triton_decode_attention.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/attention/ops/triton_decode_attention.py)：`_fwd_kernel_stage1` 与 `_fwd_grouped_kernel_stage1`、`_fwd_kernel_stage2`、`decode_attention_fwd` | 同上（我们的 kernel 相当于“分组、不分段”的那一种） | 每个 query 头一个 program 与一组 query 头一个 program，各从显存读了多少 K/V？ |
# | 5 | —（正确性的标尺） | `minivllm/attention/backends/torch_attn.py`：`paged_attention_ref` | 参考实现先把块 gather 成连续张量再做 softmax：它简单在哪里、慢在哪里？ |
#
# 源码快照：vLLM 8e958902eee5（本课逐条对照了前一天构建的 vLLM 0.27.1 发布包）。这些 Triton kernel 早期位于 `vllm/attention/ops/`，后来移到 `vllm/v1/attention/ops/`；变量名与参数随版本变化（例如固定 commit 的 `kernel_paged_attention_2d` 已有 `PHYSICAL_BLOCK_SIZE`、FP8 与 sink 参数）。面试回答应先声明所读版本；链接打不开时，在该 commit 中按 kernel 名搜索。
#
# > **勘误（对照 vLLM 0.27.1）：这几个文件在固定 commit 里各由谁调用。**
# >
# > - **V1 的 Triton 后端只调用一次 `unified_attention`**：`TritonAttentionImpl.forward` 对整批（decode 行与 prefill 行一起）调用 `triton_unified_attention.py` 的 `unified_attention`（编码器注意力另走 `context_attention_fwd`），不再先 decode 后 prefill 地分两个 kernel。它的 KV cache 与 minivllm 一样是按 token 排的布局：`get_kv_cache_shape` 给出逻辑形状 `(num_blocks, num_kv_heads, block_size, 2*head_size)`，默认的 NHD 布局在内存里就是 `[num_blocks, block_size, num_kv_heads, ...]`，K 与 V 打包在最后一维、再 `split` 成两个视图（minivllm 用 `[2, num_blocks, block_size, num_kv_heads, head_size]`）。
# > - **新 token 的 K/V 不在 `forward` 里写**：写 cache 的是 `TritonAttentionImpl.do_kv_cache_update`（调用 `triton_reshape_and_cache_flash`），它在 attention 计算之前单独被调用；`forward` 只读 cache。minivllm 的 `TritonAttentionImpl.forward` 先写后算，两步在同一个方法里。
# > - **`kernel_paged_attention_2d` 是 ROCm 的回退路径**：`chunked_prefill_paged_decode` 由 `rocm_attn.py` 调用，它的 cache 是按头排的旧布局（key `[num_blks, num_kv_heads, head_size // x, blk_size, x]`、value `[num_blks, num_kv_heads, head_size, blk_size]`）。本课仍拿它对照练习，因为它的块循环与我们的 kernel 一一对应（`SOURCE_MAP` 也指向它），但 NVIDIA GPU 上的 V1 Triton 后端跑的是 `kernel_unified_attention`。
# > - **`triton_decode_attention.py` 在 V1 里服务 MLA**：`decode_attention_fwd` 的调用者是 `backends/mla/triton_mla.py`（以及 TurboQuant 的 decode），不是普通注意力的 Triton 后端。它在 `kv_group_num == 1`（MHA）时才走每个 query 头一个 program 的 `_fwd_kernel_stage1`；有 GQA 分组时走 `_fwd_grouped_kernel_stage1`，一个 program 处理 `min(BLOCK_H=16, kv_group_num)` 个 query 头。

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
# Decode 阶段每个请求每步只有 1 个新 query token，但它要和这条序列此前的全部 token 做注意力：$o = \mathrm{softmax}(q K^\top / \sqrt{d})\,V$。这些 K/V 不在一块连续显存里——vLLM 的 KVCacheManager 以固定大小的**块**（block，默认 16 个 token）分配 KV cache，每个请求持有一张**块表**（block table）：第 $j$ 个逻辑块存放在第 `block_table[seq, j]` 个物理块里。分页消除了按最大长度预留造成的碎片，让同样的显存装下更多并发请求（图 1-1 的对策之一）。代价是：attention kernel 不能再假设 K/V 连续，必须边读块表边取数。
#
# PagedAttention kernel 解决的就是这件事：**在分散的物理块上，一次扫描算完 softmax 注意力，不把 K/V 拷成连续张量，也不把整行打分写回显存。** 参考实现 `paged_attention_ref` 走的正是被省掉的那条路：先 gather 出连续的 K/V（一次完整的读+写），再算 softmax。
#
# ### 2. 它如何工作
#
# minivllm 的 decode kernel（对应 vLLM 的 `kernel_paged_attention_2d`，也对应 `kernel_unified_attention` 的 2D 路径）：
#
# - **grid = (序列数, kv 头数)**：一个 program 负责一条序列的一个 kv 头，以及共享这个 kv 头的全部 `QUERIES_PER_KV` 个 query 头（GQA 分组）。这组 query 头被补到 2 的幂、至少 16 行（`GROUP_PAD`），和 vLLM 的 `num_queries_per_kv_padded = max(next_power_of_2(num_queries_per_kv), 16)` 一样。这是选择，不是 `tl.dot` 的硬性要求：固定 commit 所用的 Triton（torch 2.13 配套的 3.8）在 NVIDIA 后端只要求 M、N ≥ 1，K ≥ 16（16 位输入）或 ≥ 8（fp32 输入）；补到 16 行让 16 位输入的 `tl.dot` 能按 tensor core 的 MMA 形状排布，多出的行只是空算。
# - **沿逻辑块循环**：第 `logical_block` 次迭代 ① 从块表读物理块号；② 构造这个块 `BLOCK_SIZE` 个槽位、当前 kv 头的 K/V 指针，`seq_len` 之后的槽位被掩掉；③ 一次 `tl.dot` 算出组内每个 query 头对这 16 个 token 的打分；④ online softmax：抬高 running max，用 `exp(旧max - 新max)` 缩放此前累加的分母和输出累加器，再加上本块的贡献。
# - 循环结束后输出 `acc / running_sum`，只写一次。
#
# 下面的图都来自真实引擎：用 Triton 后端在默认模型（4 层、8 个 query 头、2 个 kv 头、head_dim 32）上贪心生成，记录 decode kernel 每次被调用时拿到的块表与长度。

# %%
ref_run = L06.reference_run()   # minivllm 自己的 decode kernel；记录每次调用的块表、长度（最后一次还有输入张量）
L06.print_engine_run(ref_run)
L06.plot_block_tables(ref_run);

# %% [markdown]
# 图 6-1：真实引擎每个 decode 步交给 kernel 的块表（每步取第 0 层那次调用）。每格是一个逻辑块，格内是它所在的物理块号；绿色是写满的块，黄色是最后一个未满的块，斜线部分是 `seq_len` 之后尚未写入的槽位——kernel 读这个块时必须把它们掩掉。r0 的 prompt 有 14 个 token：第 2 步 seq_len=16 恰好写满第一个块，第 3 步起跨进第二个块。注意物理块号与逻辑块号无关：r0 的逻辑块 0 不在物理块 0（物理块 0 是引擎保留的空块）。

# %%
fig, head, rows = L06.plot_online_softmax(ref_run.calls[-1], seq=0)
for r in rows:
    print({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()})

# %% [markdown]
# 图 6-2：把引擎最后一次 decode 调用（r0，seq_len 19，第 3 层）按 kernel 的块循环在 torch 里重放，挑一个第二个块抬高了 max 的 query 头（标题里的 head；若没有这样的头则取头 0）。每个点是一个 token 的打分，黑线是处理完该块后的 running max。第一个块时旧 max 是 $-\infty$，`rescale = exp(-inf) = 0`；第二个块出现更大的打分时，max 被抬高，此前的分母与累加器都乘上 `rescale < 1` 补偿——标题里的误差说明分块的 online softmax 与整行 softmax 相同（到 fp32 舍入）。
#
# 一个块的 online softmax 更新（$m$ 为 running max，$\ell$ 为分母，$a$ 为输出累加器，$s$ 为本块打分）：
#
# $$m' = \max(m, \max_j s_j),\quad r = e^{m - m'},\quad p_j = e^{s_j - m'},\quad \ell' = \ell\,r + \sum_j p_j,\quad a' = a\,r + \sum_j p_j v_j$$
#
# ### 3. 正确性条件与常见误区
#
# - **物理块，不是逻辑块**：地址由 `block_table[seq, logical_block]` 给出。用逻辑块号当物理块号，在“请求恰好按顺序拿到块”的测试里会碰巧通过，在真实引擎里就读错了块。具体读到什么由块表决定，本节末尾的单元格用图 6-1 的最后一次调用算出来：这次演示里 r0 的逻辑块 0 会去读物理块 0——引擎保留的 null block（全零，从未写入），逻辑块 1 读到物理块 1，也就是 r0 **自己的**第一个块（位置 0～15 的 K/V 被当成 16～18）；r1 的逻辑块 0 同样读 null block。两条请求都没有读到别人的 K/V，但打分全错（零向量的 K 给出 0 分、把注意力摊薄）；在更满的 cache 里，逻辑块号撞上别的请求的物理块时，读到的就是别人的 K/V。
# - **最后一个块必须掩码**：`seq_len` 往往不是 `BLOCK_SIZE` 的倍数。未写入的槽位里可能是上一个请求留下的旧值，甚至 NaN；掩码要同时作用于 K/V 的加载（`0 * NaN` 仍是 NaN）和打分（被掩的打分置为 $-\infty$，`exp` 后为 0）。
# - **先减 max 再 exp**：数学上 softmax 对平移不变，但 fp32 的 `exp` 在输入超过约 88.7 时溢出为 inf，inf/inf 得 NaN。打分上百在长上下文、未归一化的 logits 或注意力“汇点”上并不罕见。
# - **分母和累加器都要重缩放**：只缩放其中一个，在 max 只出现在第一个块时结果碰巧正确，一旦后面的块抬高了 max 就错。
# - **GQA 映射**：query 头 `h` 使用 kv 头 `h // QUERIES_PER_KV`；一个 program 的组内 query 头是 `kv_head * QUERIES_PER_KV + r`。错配不会报错，只会让注意力读错头。
# - **空行与越界**：`seq_len = 0` 的填充行（例如 CUDA Graph 补齐的 batch）不进循环，分母为 0 时给定代码输出 0；块号乘步长要转成 int64，大 cache 的偏移会超过 $2^{31}$。写指针时只要有一项步长错，在 GPU 上是非法访存，在解释器里是读到任意内存——本课的启动器在解释器下对每次加载做越界检查，把它变成一条清楚的失败信息。

# %%
# 把逻辑块号当物理块号会读哪些块？用图 6-1 最后一次调用的块表算出来（块 0 是 null block）。
last = ref_run.calls[-1]
for seq, (table, n) in enumerate(zip(last.block_table, last.seq_lens)):
    used = -(-n // last.k_cache.shape[1])
    print(f"r{seq}（seq_len={n}）：应读物理块 {list(table[:used])}，把逻辑块号当物理块号会读 {list(range(used))}")

# %% [markdown]
# ### 4. 性能与工程取舍
#
# - **Decode attention 受带宽限制**：对每个（query 头, token）做约 $4d$ 次浮点运算（$q\cdot k$ 与 $p\,v$），而每个（kv 头, token）要读 $2d$ 个元素。算术强度为 $4d\cdot G/(2d\cdot \text{elt}) = 2G/\text{elt}$ FLOP/B（$G$ = `QUERIES_PER_KV`，elt 为每元素字节数），bf16 下就是 $G$：GQA 4 时约 4 FLOP/B，比 H100 SXM 的拐点（约 295，图 1-1；PCIe 版约 378）低两个数量级（图 6-3）。所以 kernel 的速度几乎只由“读了多少字节、读得多连续”决定：每一步必须把每条序列的整段 K/V 读一遍，目标是**每个字节只读一次**，且不读 `seq_len` 之后的槽位、不写中间结果。
# - **GQA 分组在一个 program 里**：组内 `QUERIES_PER_KV` 个 query 头共用一次 K/V 加载；若每个 query 头一个 program，同一份 K/V 会被读 `QUERIES_PER_KV` 次（虽然可能命中 L2，但不能保证）——下面的演示就把 K/V 按 query 头展开来数这种“不分组”的读法。vLLM 里每个 query 头一个 program 的 `_fwd_kernel_stage1` 只在 `kv_group_num == 1`（MHA，本来就没有共享）时被选中，GQA 走分组的 `_fwd_grouped_kernel_stage1`，所以 vLLM 并没有这种重复读。
# - **并行度**：本 kernel 只有 `batch × num_kv_heads` 个 program。小 batch、长上下文时 program 数远少于 SM 数，带宽吃不满；vLLM 的对策是把一条序列切成多段并行（`triton_unified_attention.py` 的 3D 路径 + `reduce_segments`，`triton_decode_attention.py` 的 `NUM_KV_SPLITS` + stage2），代价是多一次合并（`unified_attention` 只在批次全是 decode、且序列数不超过 `seq_threshold_3D` 时才走 3D 分段）。本 kernel 不分段，这是取舍而不是遗漏。
# - **块大小**：块越大，块表读取和循环次数越少、每次加载越连续；块越小，最后一块浪费的槽位和前缀缓存的粒度越细。vLLM 的 Triton 后端要求块大小是 16 的倍数。

# %%
L06.plot_roofline();

# %% [markdown]
# 图 6-3：图 1-1 的 roofline（H100 SXM：BF16 稠密约 989 TFLOP/s、HBM3 约 3.35 TB/s，拐点约 295 FLOP/B；H100 PCIe 约 756 TFLOP/s、2.0 TB/s）上，decode attention（bf16）的算术强度只有 1～8 FLOP/B，落在带宽斜线上：它能达到的上限是“带宽 × 算术强度”，与峰值算力无关。CPU 上只能画出理论位置；实测点需要 GPU（见实践任务之后的 profiler 输出）。

# %% [markdown]
# ## 具体演示：一次 decode 调用读了什么
#
# 上面的图 6-1、6-2 已经是真实引擎的数据。再看 kernel 的 launch 本身：对同一批序列，用 Triton 解释器数一数 minivllm 的 decode kernel 读了多少字节、调用了多少次 `tl.dot` 与 `exp`；再把 K/V 按 query 头展开、让每个 query 头一个 program 重跑一遍，得到“不分组”的 kernel 会读多少。GPU 上没有解释器，这个单元格改为用 `do_bench` 实测我们 kernel 的带宽。

# %%
from minivllm.attention.ops.triton_decode_attention import _paged_decode_attention_kernel  # noqa: E402

if L06.interpreting():
    demo_case, grouped, per_head, minimum = L06.interpreter_profile(_paged_decode_attention_kernel)
    print(demo_case.describe())
    print(L06.op_count_table(grouped, per_head, minimum))
else:
    L06.print_bandwidth(L06.measure_bandwidth(_paged_decode_attention_kernel))

# %% [markdown]
# 读表：分组 kernel 读的 K/V 字节恰好等于“每个字节一次”（`1.00x`）：`seq_len` 之后的槽位没有被读；不分组时是 `QUERIES_PER_KV` 倍（这里 4 倍），而 query、输出和块表的读写量小到可以忽略。`exp` 的次数包含了被补齐到 16 行的空 query 头——这是补齐（为 `tl.dot` 的 tensor core 形状所做的选择）付出的计算浪费，但在受带宽限制的 kernel 里几乎不花时间。

# %% [markdown]
# ## 实践任务：唯一代码填空题
#
# 下面是 minivllm `_paged_decode_attention_kernel` 的副本，块循环里的 8 处被挖成了 `______`：① 从块表读物理块号；② 本块的 token 掩码与 K/V 指针偏移；④ online softmax 的更新（新 max、重缩放因子、本块概率、分母、累加器）。其余代码（program 分工、query 加载、打分与掩码、写回）都已给出，写回始终带掩码。
#
# 只能修改 TODO/______ 位置，不得删除断言或放宽通过条件。CPU 上它在 Triton 解释器里运行；在 GPU 上不加修改地编译运行。
#
# 注意 CPU 与 GPU 的一处差别：Triton 解释器忽略 `tl.dot` 的 `input_precision`，并且不管操作数是什么 dtype 都按 fp32 计算。所以少写 `input_precision=DOT_PRECISION`（GPU 上 fp32 输入默认走 tf32，误差超出容差），或忘了把概率转成 `COMPUTE_DTYPE`（GPU 上 bf16 cache 时 fp32 的概率乘 bf16 的 V，编译不过），在 CPU 上照样能算对。评分时启动器会先静态检查你内核里的每个 `tl.dot`：必须带 `input_precision=DOT_PRECISION`，两个操作数都要是（或来自）`.to(COMPUTE_DTYPE)`——否则三项代码检查都判失败，并指出是哪一个 `tl.dot`。

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
# 第一项检查：在一批块被打散的序列上对照 torch 参考实现 `paged_attention_ref`。长度 5、16、17、40 分别是不足一块、恰好一块、刚跨过块边界、跨过两条边界；8 个 query 头共享 2 个 kv 头（GQA 4）。`L06.run_decode` 是与 minivllm `paged_decode_attention` 相同的启动器（同样的 grid 与参数），输出先填 NaN，没写到的位置会暴露出来。

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
# 第二项检查：把你的 kernel 接进真实引擎。`L06.check_real_engine` 在一个上下文管理器里把 Triton 后端查找的 `paged_decode_attention`（`minivllm/attention/backends/triton_attn.py` 模块里的名字）换成“用同样参数启动你的 kernel”的函数，退出时恢复；在其中新建一个 `LLM(attention_backend="triton")`，对两个 prompt 贪心生成 6 个 token。检查三件事：每一次 decode 调用的输出都与 torch 参考实现一致；生成的 token 与用 minivllm 自己的 kernel 生成的完全相同；解释器计数显示一次 launch 恰好把每个 K/V 字节读一次（profiler 输出；只在 Triton 解释器下、也就是 CPU 上检查，GPU 上没有解释器的计数，这一项跳过）。

# %% nbgrader={"grade": true, "grade_id": "l06_real_engine", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
student_run = L06.check_real_engine(paged_decode_kernel)
L06.print_engine_run(student_run, L06.reference_run())
print("真实引擎检查通过：每次 decode 调用与 torch 参考一致，贪心 token 与参考 kernel 相同，K/V 每字节只读一次。")

# %% [markdown]
# ### 你的 kernel 的 profiler 输出
#
# GPU 上：用 `triton.testing.do_bench` 测你的 kernel 在 32 个 query 头 / 8 个 kv 头、head_dim 128、bf16（sm_80 之前的 GPU 如 T4 用 fp16）、上下文 4096 时不同 batch 的耗时，换算成有效带宽与 TFLOP/s，和同一块 GPU 上实测的拷贝带宽、矩阵乘峰值一起画到图 1-1 的 roofline 上。CPU 上：解释器给不出时间，只能给出计数（图 6-4）；带宽图需要 GPU。

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
# 图 6-4（CPU）/ 图 6-3 实测版（GPU）。GPU 上读图：batch 越大，program 越多，实测点越接近带宽斜线；batch=1 时只有 8 个 program（batch × kv 头），远少于 SM 数，这正是 split-KV 要解决的情形。“能达到多少拷贝带宽”是需要 benchmark 才能确认的结论：它取决于 GPU、块大小、head_dim 与 Triton 版本（`benchmarks/paged_attention.py` 给出完整的表）。

# %% [markdown]
# ## 检查方法
#
# 运行断言；再把 query 放大 200 倍，让打分到几百，看看“不减 max 直接 exp”会发生什么，并解释为什么你的 kernel 不受影响。然后把 `q_scale` 改回 1 重跑，解释为什么那时两种写法的结果一样（因此普通的随机测试抓不到这个错误）。

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
# 评分规则中的“能映射回源码对象”（1 分）在这里自动评分：打开 vLLM 8e958902eee5 的 `vllm/v1/attention/ops/chunked_prefill_paged_decode.py`，找到 `kernel_paged_attention_2d`（ROCm 后端的回退 kernel，块循环与本课的 kernel 一一对应）的块循环，写出每个空在那里对应的变量名，以及本课 kernel 的参数 `stride_block_table_seq`（块表一行的步长）在那里的参数名（字符串；大小写不限；若它与 `triton_unified_attention.py` 的 `kernel_unified_attention` 用了不同的名字，两者都接受）。累加器 `acc` 在两边同名，不再单独问。

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
# **评分要点**：2 分 = 说清动机（整行打分要等读完所有块才有 max 和分母；两遍扫描要么读两遍 K/V、要么把打分写回显存，都增加带宽；online softmax 一遍扫描、状态只有每个头的 $m,\ell$ 和累加器）并给出两个错误各自的触发条件与后果（不减 max：数学上等价，普通打分下测试照样通过，打分超过 ~88 时 `exp` 溢出为 inf，inf/inf → NaN；不重缩放累加器：max 只在第一个块时碰巧正确，后续块抬高 max 后旧累加器相对分母放大了 $e^{m'-m}$ 倍，输出偏向前面的块）；1 分 = 只说动机或只说一种错误；0 分 = 认为 online softmax 改变了结果（它与整行 softmax 数学等价），或把数值稳定性与性能混为一谈（一票否决：混淆算法正确性与性能）。
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
# 本课的 kernel 让一个 program 处理共享同一 kv 头的整组 query 头（GQA 分组）。这省下了什么？代价和边界是什么？对照 vLLM `triton_decode_attention.py` 中 `_fwd_kernel_stage1` 与 `_fwd_grouped_kernel_stage1` 说明。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 指出省下的是 K/V 的重复读取（每个 kv 头的 K/V 每步只从显存读一次，而不是每个 query 头读一次，省 QUERIES_PER_KV 倍流量，图 6-4 实测 4x→1x）以及块表读取与循环开销，并把组内 query 头做成 `tl.dot` 的行，让打分与 $p\,v$ 走矩阵乘；同时说出代价/边界（组被补到 16 行——这是为 tensor core 形状做的选择，不是 `tl.dot` 的硬性下限——QUERIES_PER_KV 小时浪费计算但在带宽受限下几乎免费；program 数从 B×H 降到 B×Hkv，小 batch 时并行度更低，需要 split-KV；正确性要求组内第 r 行对应 query 头 `kv_head*QUERIES_PER_KV + r`）；对应到 vLLM：`_fwd_kernel_stage1` 每个 query 头一个 program（`cur_kv_head = cur_head // kv_group_num`），但 `decode_attention_fwd` 只在 `kv_group_num == 1` 时用它，GQA 时用 `_fwd_grouped_kernel_stage1`，一个 program 处理 `min(16, kv_group_num)` 个头（说“vLLM 的 GQA decode 每个 query 头读一遍 K/V”的不得 2 分）；1 分 = 只说“省带宽”没有说省的是哪份读取、或没有代价；0 分 = 认为分组减少的是 FLOP 或显存占用（KV cache 大小由 kv 头数决定，与 kernel 是否分组无关），或把“GQA 模型省 KV cache”与“kernel 分组省读取”混为一谈而说不清后者。
#
# **参考答案**
#
# 1. 省下了什么：GQA 模型里 QUERIES_PER_KV 个 query 头共享一个 kv 头的 K/V。若 kernel 每个 query 头一个 program，同一段 K/V 会被 kv_group_num 个 program 各读一遍——能否命中 L2 取决于调度与上下文长度，不能保证；decode 受带宽限制（Q1），这几乎就是 kv_group_num 倍的时间。vLLM `triton_decode_attention.py`（在 V1 里服务 MLA 后端）的 `decode_attention_fwd` 正是按这一点选 kernel：`kv_group_num == 1`（MHA，没有可共享的 K/V）时用每个 query 头一个 program 的 `_fwd_kernel_stage1`（grid 为 (batch, head_num, NUM_KV_SPLITS)，`cur_kv_head = cur_head // kv_group_num`）；有分组时用 `_fwd_grouped_kernel_stage1`，grid 第二维是 `cdiv(head_num, min(BLOCK_H, kv_group_num))`，一个 program 处理 `min(16, kv_group_num)` 个共享 K/V 的头。分组后（本课 kernel；`kernel_paged_attention_2d` 与 `kernel_unified_attention` 的 grid 第二维也是 kv 头），每个 kv 头的 K/V 每步只读一次：图 6-4 中解释器数出的 K/V 字节从 4x（把 K/V 按 query 头展开、模拟不分组的读法）降到 1.00x。块表读取、循环与地址计算也只做一次。
# 2. 顺带的好处：组内 query 头成为矩阵的行，打分 `q @ k^T` 和 `p @ v` 变成真正的 `tl.dot`，可以上 tensor core，而不是逐头的向量点积。
# 3. 代价与边界：
#    - 组被补到 16 行（`GROUP_PAD`，vLLM 的 `num_queries_per_kv_padded` 同样至少 16）：这是选择而不是 `tl.dot` 的硬性下限（固定 commit 所用的 Triton 3.8 在 NVIDIA 上只要求 M、N ≥ 1，K ≥ 16（16 位）或 ≥ 8（fp32）），为的是让 16 位输入按 tensor core 的 MMA 形状排布；QUERIES_PER_KV=4 时 3/4 的行是空的，exp 与 dot 的计算有浪费，但 kernel 受带宽限制，这部分几乎不花时间；
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
# 总分 10 分，至少 8 分通过。参考答案与参考代码只在教师分支（solutions/）中：先独立完成；核对后请更换一个 batch、cache 或硬件条件重新推演，不能只复制。
#
# ### 自检
#
# 下面的单元格用与 nbgrader 相同的检查函数给代码部分打分（Q1～Q3 显示为待人工评分）。

# %%
self_check("lesson06", globals());

# %% [markdown]
# ## 参考资料
#
# - [vLLM Triton attention backend](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/attention/backends/triton_attn.py)
# - [vLLM `kernel_paged_attention_2d`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/attention/ops/chunked_prefill_paged_decode.py)
# - [vLLM unified attention kernel](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/attention/ops/triton_unified_attention.py)
# - [vLLM split-KV decode attention](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/attention/ops/triton_decode_attention.py)
# - [Efficient Memory Management for Large Language Model Serving with PagedAttention (Kwon et al., SOSP 2023)](https://arxiv.org/abs/2309.06180)
# - [Online normalizer calculation for softmax (Milakov & Gimelshein, 2018)](https://arxiv.org/abs/1805.02867)
# - [Triton 解释器模式（TRITON_INTERPRET）](https://triton-lang.org/main/programming-guide/chapter-3/debugging.html)
# - [vLLM attention backends (current docs)](https://docs.vllm.ai/en/latest/design/attention_backends/)
#
# 源码链接固定到本课审阅 commit；current docs、支持矩阵和默认参数会变化，面试或部署前必须按目标版本重新核对。
#
# ← 上一课：第 5 课：GPUModelRunner：持久批与 varlen 输入准备　｜　下一课 →：第 7 课：采样器：temperature、top-k/top-p、种子与 logprobs
