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
# # 第 10 课：分布式执行：张量并行、Executor 与 all-reduce
#
# ## 本课目标与通过标准
#
# 本课产出：能说清一个模型在 2 个 rank 上怎样切开——每个 rank 持有哪些权重（哪一维、从 checkpoint 的哪一段读来）、一步前向里在哪里通信、通信几次；能沿 `MultiprocExecutor` 说清一次 `execute_model` 怎样广播到每个 worker、为什么所有 rank 必须同步走完同样的集合通信；亲手写出 MLP 里的列并行层（`gate_up_proj`）和行并行层（`down_proj`），并把它们接进真实引擎，让 minivllm 在 TP=2 下用你的层生成与 TP=1 逐 token 相同的结果。
#
# 通过要求：唯一代码填空题通过全部断言；Q1～Q3 都能沿源码对象给出因果链；能指出一个正确性不变量（TP=2 的贪心输出与 TP=1 逐 token 相同；每个 rank 在同一步里调用同样次数的 all-reduce）、一个性能边界（每层两次 all-reduce，通信量与 batch 的 token 数 × hidden 成正比，与切分数无关）和一个需要 benchmark 才能确认的结论（在什么硬件与 batch 上 TP 真的更快）；总分至少 8/10。
#
# | 部分 | 分值 | 评分方式 |
# |---|---|---|
# | 代码·主路径（两个 gloo rank 上的 MLP 1 分 + 接入真实引擎 TP=2 1 分） | 2 | 自动 |
# | 代码·边界条件（TP=1、带 bias、大小不等的融合投影、单个 token） | 1 | 自动 |
# | 代码·能映射回源码对象（`SOURCE_MAP`） | 1 | 自动 |
# | Q1～Q3 | 各 2 | 人工，按评分规则 |
#
# 没有 nbgrader 时（例如 Colab），运行本课最后的“自检”单元格，或在终端执行 `python -m autograder check lesson10`（在本笔记本所在的文件夹或仓库根目录都可以），得分与教师用 nbgrader 评出的自动部分一致。

# %% [markdown]
# ## 源码版本与阅读方法
#
# 本课程使用固定 commit 的永久链接保证行号可复现，同时链接 current docs 供核对最新变化。读张量并行时沿着“一个权重矩阵的一生”读：checkpoint 里的完整张量 → 每个 rank 的 `weight_loader` 取哪一段 → 前向时每个 rank 算出什么（一段输出，还是一个部分和）→ 在哪里 all-reduce；不要从 NCCL 或自定义 all-reduce kernel 开始读。
#
# | 顺序 | vLLM 文件与入口（8e958902eee5） | minivllm 对应文件 | 带着什么问题读 |
# |---|---|---|---|
# | 1 | [`vllm/model_executor/layers/linear.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/model_executor/layers/linear.py)：`ColumnParallelLinear.weight_loader`、`MergedColumnParallelLinear.weight_loader`、`QKVParallelLinear`（`num_kv_head_replicas`）、`RowParallelLinear.forward` | `minivllm/model_executor/layers/linear.py`：`ColumnParallelLinear`、`MergedColumnParallelLinear`、`QKVParallelLinear`、`RowParallelLinear`、`weight_loader` | 列并行切哪一维、行并行切哪一维？融合的 gate_up 为什么要“每段各切”？行并行的 bias 为什么只在 rank 0 加？ |
# | 2 | [`vllm/model_executor/layers/vocab_parallel_embedding.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/model_executor/layers/vocab_parallel_embedding.py)：`VocabParallelEmbedding.forward`、`get_masked_input_and_mask`、`ParallelLMHead` | `minivllm/model_executor/layers/vocab_parallel_embedding.py`：`VocabParallelEmbedding`、`ParallelLMHead` | 词表切开后，不在本 rank 词表段里的 token 查到什么？为什么 embedding 之后也要一次 all-reduce、而 lm_head 之后是 all-gather？ |
# | 3 | [`vllm/distributed/parallel_state.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/distributed/parallel_state.py)：`GroupCoordinator.all_reduce`、`init_distributed_environment`、`initialize_model_parallel`；[`vllm/distributed/communication_op.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/distributed/communication_op.py)：`tensor_model_parallel_all_reduce` | `minivllm/distributed/parallel_state.py`：`GroupCoordinator`、`init_distributed_environment`、`initialize_model_parallel`、`get_tp_group`；`minivllm/distributed/communication_op.py`：`tensor_model_parallel_all_reduce` | 一个进程怎样知道自己是第几个 rank？没有加入任何 group 时（TP=1）all-reduce 做什么？ |
# | 4 | [`vllm/v1/executor/multiproc_executor.py`](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/executor/multiproc_executor.py)：`MultiprocExecutor.collective_rpc`（`rpc_broadcast_mq`）、`WorkerProc.make_worker_process`、`WorkerProc.worker_busy_loop` | `minivllm/executor/multiproc_executor.py`：`MultiprocExecutor`、`collective_rpc`、`WorkerProc`、`worker_busy_loop` | 一次 `execute_model` 怎样送到每个 rank？为什么只有 rank 0 回答？一个 worker 出错时其他 rank 会怎样？ |
#
# 源码快照：vLLM 8e958902eee5。与 vLLM 的差异：vLLM 的 executor 用共享内存 `MessageQueue`（`rpc_broadcast_mq`）把调用广播给 worker，minivllm 把同一份 pickle 写进每个 worker 一根管道；vLLM 的 all-reduce 在 GPU 上走 NCCL 或自定义 all-reduce kernel，minivllm 在 CPU 上走 gloo（本课全部在 CPU 上跑，两个 rank 是两个进程，共享这台机器的 2 个核）；vLLM 的线性层把计算交给 `quant_method`（`UnquantizedLinearMethod.apply`），minivllm 直接 `F.linear`；vLLM 的 `RowParallelLinear` 还有 `input_is_parallel`、`skip_bias_add` 等开关，minivllm 只保留 `reduce_results`。minivllm 只有张量并行，没有流水线并行和数据并行。
#
# > **vLLM 0.27.1 用哪个 runner？** TP 不影响选择：`VllmConfig.use_v2_model_runner`（`config/vllm.py`）对 dense 的 generate 模型（本课程加载的每个模型）在装有 Triton、且没有打开 V2 尚不支持的特性（`_get_v2_model_runner_unsupported_features`：n-gram 投机、TP > 1 时的序列并行等）时选 Model Runner V2（`v1/worker/gpu/model_runner.py`），每个 worker 里跑的是它；本课讲的线性层、all-reduce 与 executor 两个 runner 共用。
# >
# > **minivllm ≠ vLLM（本课涉及的差异）**
# > - 各 rank 采样出相同的 token，不只靠相同的 logits：`lm_head` 之后的 all-gather 让每个 rank 拿到相同的 logits（`LogitsProcessor._gather_logits`，平台默认 `use_all_gather`），随机采样还要求每个 rank 的随机数相同——vLLM 用全局种子保证这一点（`ModelConfig.seed`，默认 0，它的说明写着：不设全局种子，不同的张量并行 worker 会采出不同的 token）。minivllm 同样在每个 worker 里设同一个种子。
# > - profiler 里看到的名字：本课在 CPU 上数的是 gloo 的 `c10d::allreduce_`。vLLM 在 GPU 上走 NCCL 或自定义 all-reduce kernel；在默认的 `-O2` 下，TP > 1、Hopper / Blackwell 且装有 FlashInfer 时（`enable_allreduce_rms_fusion`），编译 pass 把 all-reduce 与其后的 RMSNorm 融合成一个 `flashinfer_trtllm_fused_allreduce_norm` 调用（`compilation/passes/fusion/allreduce_rms_fusion.py`），所以 profiler 里既看不到单独的 all-reduce，也数不出“每层两次”——通信次数不变，只是换了名字、和归一化合在一起。

# %% nbgrader={"grade": false, "grade_id": "l10_setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
# 准备（锁定）：静音无害的警告（评分单元格不能写 stderr）。
import logging
import os
import warnings

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

import torch  # noqa: E402

from autograder import lesson10 as L10  # noqa: E402
from autograder.common import ______, report, self_check, short_errors  # noqa: E402,F401

short_errors("lesson10")  # 评分单元格失败时只显示三行：哪一部分、错在哪、第一处不符（完整 traceback：%tb）

# %% [markdown]
# ## 核心心智模型
#
# ### 1. 它是什么，解决什么问题
#
# 模型放不进一张卡，或者一张卡算一步太慢时，张量并行（tensor parallelism，TP）把**每一层的权重矩阵**切成 tp 份，每个 rank（一个进程、一张卡）只存、只算自己那一份；rank 之间用集合通信（all-reduce）把部分结果合起来。TP=2 时每个 rank 只存约一半的权重和一半的 KV cache（每个 rank 只存自己那几个注意力头的 KV），每步的矩阵乘法也各算一半——代价是每层要通信。
#
# ### 2. 它如何工作
#
# 线性层 $y = xW^\top$，$W$ 的形状是 `[output_size, input_size]`。有两种切法（Megatron-LM 的做法，vLLM 沿用）：
#
# 1. **列并行**（`ColumnParallelLinear`）：按**输出维**切，rank r 持有 $W$ 的第 r 段**行**（`[output_size / tp, input_size]`）。每个 rank 用完整的 x 算出 y 的第 r 段，不需要通信。`gate_up_proj` 是把 gate 和 up 两个投影融合成一个矩阵的 `MergedColumnParallelLinear`：rank r 持有 `[gate 的第 r 段; up 的第 r 段]`——每段投影**各自**切，这样 `SiluAndMul` 在本 rank 里就能把对应的 gate 行和 up 行配对。
# 2. **行并行**（`RowParallelLinear`）：按**输入维**切，rank r 持有 $W$ 的第 r 段**列**（`[output_size, input_size / tp]`）。它的输入正好是前一个列并行层在本 rank 的那一段输出，于是每个 rank 算出的是 $y$ 的一个**部分和**，一次 all-reduce 把 tp 个部分和加起来，每个 rank 都得到完整的 y。bias 只能加一次：只在 rank 0 加（all-reduce 会把每个 rank 加的都加起来）。
#
# 先列后行：MLP 是 `gate_up_proj`（列）→ `SiluAndMul`（逐元素，本 rank 内完成）→ `down_proj`（行）→ all-reduce；注意力是 `qkv_proj`（列，按头切）→ 每个 rank 只算自己的头（KV cache 也只存这些头）→ `o_proj`（行）→ all-reduce。所以**每个 Transformer 层两次 all-reduce**，再加上词表并行的 embedding 一次（每个 rank 只存词表的一段，不在本段的 token 查出 0，all-reduce 后每个 token 恰好有一个 rank 给出它的向量）；`lm_head` 之后是 all-gather（把各段词表的 logits 拼起来）。
#
# 每个参数带一个 `weight_loader(param, 完整的 checkpoint 张量[, shard_id])`：所有 rank 读同一份 safetensors 文件，各自只拷贝自己那一段。
#
# 进程怎样组织：`MultiprocExecutor` 为每个 rank 起一个 worker 进程（`WorkerProc`），每个 worker 加入同一个进程组（`init_distributed_environment` + `initialize_model_parallel`，CPU 上用 gloo），建自己那一份模型和 KV cache。EngineCore 每步调用 `execute_model` 时，executor 把同一个调用广播给所有 worker（`collective_rpc`），所有 rank 同步前向、在同样的位置 all-reduce；只有 rank 0 把结果交回。调度器、KV 块表只有一份，在 EngineCore 里——worker 只负责算。
#
# ### 3. 正确性条件与常见误区
#
# - **每个 rank 必须调用同样次数、同样形状的集合通信**：all-reduce 是一个“所有人到齐才结束”的操作。某个 rank 多调一次或少调一次，另一个 rank 会永远等下去（本课的检查有超时，会告诉你是哪个 rank 没有返回）。
# - **列并行层之后不要 all-reduce**：各 rank 的输出是 y 的不同段，不是部分和；加起来就把不同的中间神经元混在了一起。
# - **行并行层之后必须 all-reduce**：否则每个 rank 只有一个部分和，后面的残差、归一化全错，而且各 rank 的隐藏状态从此不一致。
# - **融合投影各段分别切**：把 `[gate; up]` 当作一整块切，rank 0 会拿到全部 gate、rank 1 拿到全部 up，`SiluAndMul` 配对全错。
# - **bias 只加一次**：行并行层的 bias 在每个 rank 都加，all-reduce 之后就变成了 tp 倍。
# - **TP=2 的贪心输出应与 TP=1 相同**：切分只改变求和的顺序（只有浮点舍入的差别），贪心的 argmax 在这个模型上不受影响。这是张量并行最强的回归测试。
#
# ### 4. 性能与工程取舍
#
# - 每层两次 all-reduce，每次通信 `num_tokens × hidden_size` 个数，**与 tp 无关**；而每个 rank 的计算量按 1/tp 减少。所以 tp 越大、batch 越小、层越窄，通信占比越高。
# - 在 GPU 上 all-reduce 走 NVLink（几百 GB/s）时，TP 能把一个大模型的单步延迟接近按 1/tp 缩短；跨 PCIe 或跨机时通信很快成为瓶颈——vLLM 建议 TP 限制在一台机器内、跨机用流水线并行。
# - 在这台 2 核 CPU 上，两个 rank 分掉同两个核，gloo 的 all-reduce 走本机 TCP，TP=2 不可能更快；下面的演示如实测出这一点（Q3）。

# %%
shards = L10.rank_shards()
L10.print_rank_shards(shards)

# %% [markdown]
# 表 10-1：本课默认模型（4 层，hidden 256，intermediate 704，8 个 q 头、2 个 kv 头，head_dim 32）第 0 层与 embedding 的参数形状：左边 TP=1，右边是 TP=2 时两个 rank 各自（由引擎自己的层与 `weight_loader` 从同一份 checkpoint 读出）。读表：
#
# - `qkv_proj.weight`：TP=1 是 `[8×32 + 2×32 + 2×32, 256] = [384, 256]`；TP=2 每个 rank 4 个 q 头、1 个 kv 头：`[128 + 32 + 32, 256] = [192, 256]`——按**头**切输出维（Q2）。
# - `o_proj.weight` 与 `down_proj.weight`：输出维不变（256），输入维减半——行并行。
# - `gate_up_proj.weight`：`[2×704, 256]` → `[2×352, 256]`：gate 的一半和 up 的一半。
# - `embed_tokens.weight`：词表切成两段，每个 rank 一段（词表先补齐到可整除的大小）；`lm_head` 与它共享权重（tie_word_embeddings）。
# - 最后一行：每个 rank 的参数总数约是 TP=1 的一半（归一化层的小向量每个 rank 都存一份完整的）。

# %%
cmp = L10.tp_comparison()
L10.print_tp_comparison(cmp)
L10.plot_tp_comparison(cmp);

# %% [markdown]
# 图 10-1：同一批 3 个 prompt、每个 16 个 token，贪心。左：TP=1 与 TP=2 交替运行（A B A B，各 3 次，先各预热一次）的墙钟时间；右：对 TP=2 再跑一次并用 `torch.profiler` 记录 rank 0，`execute_model` 的总时间里 `c10d::allreduce_`（gloo 的 all-reduce）占多少。每步 all-reduce 次数 = 4 层 × 2 + 1（embedding）= 9。
#
# 读图：在这台 2 核 CPU 上 TP=2 比 TP=1 **慢**。原因有三：两个 rank 是两个进程，分掉的是同两个 CPU 核，计算并没有“多出一份硬件”；这个模型很小（每层的矩阵乘法只有几十微秒），每步的时间主要是 Python 与调度开销，切分省下的计算微不足道；每步 9 次 gloo all-reduce 走本机 TCP，每次都要两个进程会合——右图的占比就是这部分代价（具体数字每次运行不同，以你的输出为准）。这不是张量并行的结论，而是“计算太小、通信相对太贵”时的结论（Q3）：在有 NVLink 的多卡机器上、模型大到一张卡放不下或单步计算很重时，TP 才划算。墙钟比较只在这台机器、这个负载上成立。

# %% [markdown]
# ## 具体演示：一步前向里的 all-reduce
#
# 上面的 profiler 已经数出每步 9 次 all-reduce。它们在哪里？按一个 token 走一遍 TP=2 的第 0 层（括号里是每个 rank 上张量的形状，T 是本步的 token 数）：
#
# 1. `embed_tokens`（词表并行）：每个 rank 查自己那段词表，不在段内的 token 得 0 → **all-reduce #1** → `[T, 256]`，每个 rank 相同。
# 2. `qkv_proj`（列并行）：`[T, 256]` → `[T, 192]`（本 rank 的 4 个 q 头、1 个 kv 头），不通信；注意力只在这 4 个头上算，KV cache 也只存本 rank 的 1 个 kv 头。
# 3. `o_proj`（行并行）：`[T, 128]` → `[T, 256]` 的部分和 → **all-reduce #2**。
# 4. `gate_up_proj`（列并行）：`[T, 256]` → `[T, 704]`（gate 352 + up 352），不通信；`SiluAndMul` → `[T, 352]`。
# 5. `down_proj`（行并行）：`[T, 352]` → `[T, 256]` 的部分和 → **all-reduce #3**。
#
# 以后每层两次，4 层共 1 + 8 = 9 次。`lm_head` 每个 rank 算自己那段词表的 logits，all-gather 拼成完整词表；每个 rank 用相同的 logits、相同的随机数（全局种子，见上方差异列表）采样出相同的 token——所以各 rank 的批状态始终一致，只有 rank 0 把结果交回 EngineCore（vLLM：`MultiprocExecutor` 只取 `output_rank` 那个 worker 的输出）。

# %% [markdown]
# ## 实践任务：唯一代码填空题
#
# 下面是 minivllm（与 vLLM）MLP 里的两个并行线性层，去掉了 vLLM 的量化方法、`skip_bias_add` 等开关。父类 `LinearBase(input_size_per_partition, output_size_per_partition, bias)` 建好本 rank 的 `weight`（`[输出, 输入]`）与 `bias`，并给每个参数挂上 `self.weight_loader`；`self.tp_rank`、`self.tp_size` 是本 rank 的编号和 rank 数（没有进程组时是 0 和 1）。10 处 `______` 是决策点：每个 rank 持有哪一维、从 checkpoint 的哪一段读、放到融合参数的哪里、前向之后通信还是不通信、bias 在哪个 rank 加。
#
# 检查会把你的两个类交给两个 gloo rank（新进程：从 multiprocessing 的 forkserver——一个只预先导入了 torch 的单线程干净解释器——fork 出来，不是从笔记本的内核 fork；笔记本里定义的类由 cloudpickle 按值发过去），再在一个同样这样起的辅助进程里把它们换进 minivllm 的 Llama（`minivllm.model_executor.models.llama` 模块里的 `MergedColumnParallelLinear` 与 `RowParallelLinear` 这两个名字，`o_proj` 也用你的行并行层）以 TP=2 运行真实引擎（引擎的两个 worker 从这个只做这件事的辅助进程 fork 出来，所以看得见换进去的类）。
#
# 为什么不直接从 Jupyter 内核 fork：`fork` 只复制调用它的那个线程，内核里 ZMQ、历史记录等线程当时持有的锁被原样复制进子进程，却再也没有线程去释放；子进程一旦需要其中一把锁就永远等下去（本课早先的版本就在 CI 里这样挂住过）。vLLM 的 [`docs/design/multiprocessing.md`](https://github.com/vllm-project/vllm/blob/8e958902eee5/docs/design/multiprocessing.md) 说的是同一件事：`fork` 最快，但与使用线程的依赖不兼容；`VLLM_WORKER_MULTIPROC_METHOD` 选择 worker 的启动方式。
#
# 只能修改 TODO/______ 位置，不得删除断言或放宽通过条件。

# %% nbgrader={"grade": false, "grade_id": "l10_parallel_linear", "locked": false, "schema_version": 3, "solution": true, "task": false}
import torch.nn.functional as F

from minivllm.distributed import get_tensor_model_parallel_world_size, tensor_model_parallel_all_reduce
from minivllm.model_executor.layers.linear import LinearBase, default_weight_loader, divide


class MergedColumnParallelLinear(LinearBase):
    """gate_up_proj: gate and up fused along the output dim; W is [sum(output_sizes), input_size] in the checkpoint."""

    def __init__(self, input_size, output_sizes, bias=False):
        self.output_sizes = list(output_sizes)
        tp = get_tensor_model_parallel_world_size()
        # TODO 1. How much of each dimension does one rank hold? (divide(n, tp) raises if n is not divisible)
        in_per_rank = input_size  ### BLANK
        out_per_rank = sum(divide(size, tp) for size in self.output_sizes)  ### BLANK
        LinearBase.__init__(self, in_per_rank, out_per_rank, bias)  # super() is not allowed in graded answers

    def weight_loader(self, param, loaded_weight, shard_id):
        """Copy this rank's part of projection `shard_id` (0 = gate, 1 = up) from its full checkpoint tensor."""
        size = self.output_sizes[shard_id] // self.tp_size       # rows of this projection on each rank
        # TODO 2. Where do they go in this rank's fused parameter, and which rows of the checkpoint are they?
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size  ### BLANK
        start = self.tp_rank * size  ### BLANK
        default_weight_loader(param.data.narrow(0, offset, size), loaded_weight.narrow(0, start, size))

    def forward(self, x):
        y_rank = F.linear(x, self.weight, self.bias)
        # TODO 3. y_rank is this rank's slice of [gate; up]. Communicate, or not?
        return y_rank  ### BLANK


class RowParallelLinear(LinearBase):
    """down_proj / o_proj: W is [output_size, input_size] in the checkpoint; the input arrives already split."""

    def __init__(self, input_size, output_size, bias=False):
        tp = get_tensor_model_parallel_world_size()
        # TODO 4. How much of each dimension does one rank hold?
        in_per_rank = divide(input_size, tp)  ### BLANK
        out_per_rank = output_size  ### BLANK
        LinearBase.__init__(self, in_per_rank, out_per_rank, bias)  # super() is not allowed in graded answers

    def weight_loader(self, param, loaded_weight):
        if param.dim() == 2:  # the weight; the bias [output_size] is loaded whole
            # TODO 5. Which part of the checkpoint's weight belongs to this rank?
            loaded_weight = loaded_weight.narrow(1, self.tp_rank * param.shape[1], param.shape[1])  ### BLANK
        default_weight_loader(param, loaded_weight)

    def forward(self, x):
        # TODO 6. Which rank adds the bias?
        bias = self.bias if self.tp_rank == 0 else None  ### BLANK
        partial = F.linear(x, self.weight, bias)
        # TODO 7. partial is one rank's share of the sum. What turns it into the layer's output on every rank?
        return tensor_model_parallel_all_reduce(partial)  ### BLANK


# %%
report("lesson10", globals())

# %% [markdown]
# 第一项检查：两个 gloo rank（`torch.distributed` 的 CPU 后端，两个从 forkserver 起的新进程）各自建一个 `gate_up_proj`（hidden 48 → gate 40 + up 40）和一个 `down_proj`，用 `weight_loader` 从同一份完整权重加载，跑同一个输入。检查每个 rank 持有的分片（形状与内容）、列并行层的输出只是本 rank 那一段，以及两个 rank 的 MLP 输出都等于不切分的 MLP。

# %% nbgrader={"grade": true, "grade_id": "l10_main_path", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
gate_up = MergedColumnParallelLinear(8, [6, 6])    # TP=1 here (no process group): each rank would hold it all
assert tuple(gate_up.weight.shape) == (12, 8)
down = RowParallelLinear(6, 8, bias=True)
assert tuple(down.weight.shape) == (8, 6) and tuple(down.bias.shape) == (8,)
### BEGIN HIDDEN TESTS
L10.check_mlp(MergedColumnParallelLinear, RowParallelLinear)
### END HIDDEN TESTS

# %% [markdown]
# 第二项检查：把你的两个类换进 minivllm 的 Llama，以 `tensor_parallel_size=2` 起真实引擎（在从 forkserver 起的辅助进程里；`MultiprocExecutor` 的两个 worker 由它 fork 出），对 3 个 prompt 贪心生成 8 个 token：输出必须与 TP=1 逐 token 相同；并用 `torch.profiler` 记录 rank 0，数出每步的 all-reduce 次数必须恰好是 4 层 × 2 + 1 = 9。退出时恢复原来的类。

# %% nbgrader={"grade": true, "grade_id": "l10_real_engine", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
L10.check_real_engine(MergedColumnParallelLinear, RowParallelLinear)
print("真实引擎检查通过：TP=2 的贪心输出与 TP=1 相同，每步 9 次 all-reduce。")

# %% [markdown]
# ## 检查方法
#
# 运行断言；再把“all-reduce 放在列并行层之后”和“不做 all-reduce”各想一遍：两个 rank 的输出分别会是什么？用下面的单元格在两个 rank 上实际算一次你的 MLP 与这两种错法（`L10.misplaced_all_reduce` 用你的类，只改 forward 里通信的位置），对照不切分的 MLP 的误差，并解释为什么只有“列之后不通信、行之后 all-reduce”是对的。

# %%
for name, err in L10.misplaced_all_reduce(MergedColumnParallelLinear, RowParallelLinear).items():
    print(f"{name:<34} 与不切分的 MLP 的最大误差 {err:.2e}")

# %% [markdown]
# 你的解释：

# %% nbgrader={"grade": true, "grade_id": "l10_boundary", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
x = torch.randn(1, 6)
w = torch.randn(8, 6)
row = RowParallelLinear(6, 8, bias=True)
row.weight.weight_loader(row.weight, w)
row.bias.weight_loader(row.bias, torch.ones(8))
assert torch.allclose(row(x), x @ w.T + 1, atol=1e-5)     # TP=1：bias 加一次，all-reduce 是恒等
### BEGIN HIDDEN TESTS
L10.check_boundary(MergedColumnParallelLinear, RowParallelLinear)
### END HIDDEN TESTS

# %% [markdown]
# ## 映射回源码对象
#
# 评分规则中的“能映射回源码对象”（1 分）在这里自动评分：在 vLLM 8e958902eee5 中找到实现每个概念的名字（类名、函数名或属性名，字符串；大小写不限）。
#
# - `no_split`：每个 rank 都持有完整权重、不做任何切分的线性层类（`vllm/model_executor/layers/linear.py`）；
# - `shard_widths`：线性层里记录各个（融合的）投影在本 rank 上输出宽度的列表属性，`create_weights` 按它分配权重；
# - `divisible`：`divide` 相除之前调用的、断言能整除的函数（`vllm/distributed/utils.py`）；
# - `split_input`：行并行层收到的输入还没切分时（构造参数要求输入已切分的那一项为 False），把输入沿最后一维切成 tp 份的函数；
# - `gather_outputs`：列并行层被要求输出完整结果时，收集各 rank 输出段的通信函数（`vllm/distributed/communication_op.py`）；
# - `output_rank`：`MultiprocExecutor` 里决定从哪个 worker 读回模型输出的方法。

# %% nbgrader={"grade": false, "grade_id": "l10_source_map_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
SOURCE_MAP = {
    "no_split": "ReplicatedLinear",  ### BLANK
    "shard_widths": "output_partition_sizes",  ### BLANK
    "divisible": "ensure_divisibility",  ### BLANK
    "split_input": "split_tensor_along_last_dim",  ### BLANK
    "gather_outputs": "tensor_model_parallel_all_gather",  ### BLANK
    "output_rank": "MultiprocExecutor._get_output_rank",  ### BLANK
}

# %% nbgrader={"grade": true, "grade_id": "l10_source_map", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
L10.check_source_map(SOURCE_MAP)

# %% [markdown] nbgrader={"grade": false, "grade_id": "l10_q1", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q1（2 分）
#
# 为什么 MLP 要“先列并行、后行并行”（`gate_up_proj` 按输出维切、`down_proj` 按输入维切），而不是两层都按输出维切、或者先行后列？请从每个 rank 持有的张量、`SiluAndMul` 能否在本 rank 内完成、以及每个 MLP 块需要几次通信说明；并说出把 all-reduce 放在列并行层之后会错成什么样。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 说清三件事：(1) 列并行后 rank r 持有中间激活的第 r 段（gate 与 up 各自的第 r 段，所以逐元素的 `SiluAndMul` 在本 rank 内完成，不需要完整的中间激活）；(2) 行并行层的输入正好就是这一段，rank r 用 `down` 的第 r 段列算出部分和 $\sum_{j \in r} W_{:,j} h_j$，一次 all-reduce 得到完整输出——整个 MLP 块只通信一次（注意力同理：qkv 列、o_proj 行，每层共两次）；(3) 其他排法要多通信：两层都按输出维切，第二层需要完整的中间激活，必须先 all-gather 再在最后再 all-gather，先行后列则第一层就要 all-reduce、第二层之后还要 all-gather；并说出列之后 all-reduce 的后果（各 rank 的输出是不同的中间神经元，相加把不同神经元混在一起，结果错误而不只是慢；本课 `misplaced_all_reduce` 的误差是 1e2～1e3 量级而不是舍入误差）；1 分 = 只说“减少通信”而没有说清每个 rank 持有什么、或没有说出 SiluAndMul 为什么能本地完成、或说不出列之后 all-reduce 错在哪；0 分 = 认为两种切法只是性能差别、或认为列并行层之后也需要 all-reduce（一票否决：混淆算法正确性与性能）。
#
# **参考答案**
#
# 1. `gate_up_proj` 是列并行：rank r 持有 `[gate 的第 r 段行; up 的第 r 段行]`，用完整的 x（每个 rank 都有）算出 `[gate_r(x); up_r(x)]`，形状 `[T, 2·I/tp]`。`SiluAndMul` 是逐元素的 $\mathrm{silu}(g_j)\cdot u_j$，只需同一个下标 j 的 gate 与 up——它们在同一个 rank 上（所以融合投影必须每段各自切），于是得到中间激活的第 r 段 $h_r$，`[T, I/tp]`，不需要通信。
# 2. `down_proj` 是行并行：$y = W_{down} h = \sum_r W_{down}[:, r] h_r$。rank r 持有 $W_{down}$ 的第 r 段列，正好能用本地的 $h_r$ 算出第 r 个部分和；一次 all-reduce 把 tp 个部分和加起来，每个 rank 得到完整的 y（`[T, hidden]`），残差和下一层的 RMSNorm 需要的正是完整的 y。bias 只在 rank 0 加一次。整个 MLP 块：一次 all-reduce。注意力同理（`qkv_proj` 按头列切，每个 rank 只算自己的头，`o_proj` 行切），所以每层两次，本课 profiler 数出 4 × 2 + 1 = 9 次/步。
# 3. 别的排法：两层都按输出维切，第二层每个输出都需要完整的中间激活，必须在中间 all-gather（`[T, I]`，比 hidden 大），最后还要再 all-gather 输出；先行后列则第一层输出是部分和、必须先 all-reduce，第二层的输出是分段的、还要 all-gather——都是每块两次通信。
# 4. 列之后 all-reduce：各 rank 的 y 是不同的中间神经元，不是同一量的部分和，相加把神经元 j 和 j + I/tp 混在一起；结果是错的（本课 `misplaced_all_reduce` 实测误差约 1e3，而正确答案约 1e-4，只是舍入），不是“多通信一次而已”。不做 all-reduce 则每个 rank 只有部分和，后续层全错，而且各 rank 的隐藏状态从此不一致。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l10_q2", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q2（2 分）
#
# 本课的模型有 8 个 q 头、2 个 kv 头（GQA）。TP = 2、4、8 时，每个 rank 持有几个 q 头、几个 kv 头，`qkv_proj.weight` 和 KV cache 在每个 rank 上是什么形状（每个 token、每层）？kv 头少于 rank 数时怎么办，代价是什么？哪些 tp 根本不能用？
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 按头切（不是按行随意切：一个头的 head_dim 行必须在同一 rank，注意力在头内计算）；给出表：TP=2：4 q + 1 kv，`qkv_proj.weight` `[(4+1+1)·32, 256] = [192, 256]`，KV cache 每 token 每层 K、V 各 1×32；TP=4：2 q + 1 kv（kv 头被复制：`num_kv_head_replicas = 2`），`[128, 256]`；TP=8：1 q + 1 kv（复制 4 份），`[96, 256]`；说明 q 头到 kv 头的分组在切分后仍对应（rank r 的 q 头共享的正是它持有的那个 kv 头，`shard_rank = tp_rank // num_kv_head_replicas`）；代价：复制的 kv 头的权重与 KV cache 在多个 rank 上重复存储，KV cache 每个 rank 的占用不再按 1/tp 下降；q 头数不能被 tp 整除（这里 tp = 3、5、6、7）或 tp 既不整除 kv 头数也不是其倍数时不能用（`divide` 报错）；1 分 = 数对但没有说明复制与代价，或没有说出不能用的 tp；0 分 = 认为 kv 头可以切成半个头（注意力在头内计算，头不能拆），或认为 KV cache 总是按 1/tp 缩小（忽略了 kv 头复制）；认为任何 tp 都能用于任何模型，不看头数能否整除（一票否决：把源码支持写成所有模型/硬件可用）。
#
# **参考答案**
#
# 1. `QKVParallelLinear` 按**头**切输出维：每个 rank 持有 `num_heads / tp` 个 q 头，以及它们所属的 kv 头。一个头的 head_dim 行必须在同一个 rank（注意力的点积在头内做），所以切分粒度是头，不是行。
# 2. 表（head_dim = 32，hidden = 256；KV cache 每个 token、每层每个 rank 存 K 和 V 各 `num_kv_heads_per_rank × 32` 个数）：
#    - TP=1：8 q + 2 kv，`qkv_proj.weight` `[384, 256]`，K/V 各 2×32；
#    - TP=2：4 q + 1 kv，`[192, 256]`，K/V 各 1×32（表 10-1 实测）；
#    - TP=4：2 q + 1 kv，`[128, 256]`，K/V 各 1×32——2 个 kv 头分给 4 个 rank，每个 kv 头复制到 2 个 rank（`num_kv_head_replicas = 2`）；
#    - TP=8：1 q + 1 kv，`[96, 256]`，每个 kv 头复制到 4 个 rank。
# 3. 分组仍然正确：GQA 中 q 头 0–3 共享 kv 头 0、4–7 共享 kv 头 1。TP=4 时 rank 0、1 的 q 头（0–1、2–3）都属于 kv 头 0，所以它们加载 kv 头 0（minivllm 的 `shard_rank`：`tp_rank // num_kv_head_replicas`）。
# 4. 代价：复制的 kv 头的权重和 KV cache 在多个 rank 上重复存；tp 超过 kv 头数之后，每个 rank 的 KV cache 不再随 tp 减小（总 KV 显存随 tp 增长），能容纳的并发 token 数不再按 tp 线性增长。
# 5. 不能用的 tp：q 头数 8 必须能被 tp 整除（tp = 3、5、6、7 不行）；kv 头数要么能被 tp 整除、要么能整除 tp（`divide` 报错）。vocab、intermediate_size 也要能切（vocab 会被补齐）。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l10_q3", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q3（2 分）
#
# 张量并行什么时候不再划算？用图 10-1 的实测数字（TP=2 与 TP=1 的墙钟比、all-reduce 占一步的比例、每步 all-reduce 次数）说明这台 2 核 CPU 上发生了什么；再从通信量与计算量随 tp、batch 的 token 数、hidden 的变化，说明在 GPU 上什么情况下 TP 开始得不偿失。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 引用自己运行的实测数字（本机一次运行：TP=2 比 TP=1 慢约 2.6 倍，中位数 0.38 s 对 0.15 s；all-reduce 约占 rank 0 `execute_model` 时间的 34%；每步 9 次；以学生自己的输出为准）并给出因果：两个 rank 共享同两个核，切分没有带来新的算力；小模型每步计算极少，固定开销（Python、调度、进程间广播）与每次 all-reduce 的会合延迟占主导；再给出一般规律：每层两次 all-reduce，每次 `T × hidden` 个数（与 tp 无关，ring all-reduce 每个 rank 发送约 $2(tp-1)/tp$ 倍），而每个 rank 的计算 ∝ `T × hidden × I / tp`；tp 增大、T 小（decode、小 batch）、hidden 小、互连慢（PCIe、跨机）时通信占比上升，延迟受 all-reduce 的固定延迟限制；TP 划算的条件是模型放不下一张卡、或单步计算大到通信可被摊薄、且有 NVLink 级互连；并说明结论要在目标硬件上 benchmark；1 分 = 趋势对但没有实测数字，或只说“通信开销大”而没有说明与 tp、T、hidden 的关系；0 分 = 把本机 CPU 的结果说成“TP 没用”，或认为 TP 一定按 tp 倍加速（一票否决：把单一负载的实测写成普遍结论）。
#
# **参考答案**
#
# 1. 本机实测（图 10-1，3 个 prompt × 16 token，贪心，A B A B 三对的中位数）：TP=2 比 TP=1 慢（本机一次运行：中位数 0.38 s 对 0.15 s，约 2.6 倍）；rank 0 的 profiler 显示每步 9 次 `c10d::allreduce_`，占 `execute_model` 时间的 34%（16 步、144 次 all-reduce、140 ms / 414 ms）。原因：(a) 两个 rank 是两个进程，抢同两个 CPU 核，计算没有变多；(b) 模型很小（hidden 256），每层矩阵乘法只有几十微秒，省下一半计算几乎没有收益；(c) 每次 gloo all-reduce 都要两个进程经本机 TCP 会合，9 次/步的固定延迟直接加到每一步上；(d) 每步还多了一次把 `execute_model` 广播给两个 worker 的开销。
# 2. 一般规律：每层两次 all-reduce，每次的数据量是 `T × hidden`（T 是本步 token 数），**与 tp 无关**；ring all-reduce 每个 rank 收发约 $2(tp-1)/tp \cdot T \cdot hidden$ 个数，还有与数据量无关的启动/会合延迟。每个 rank 的计算约 $\propto T \cdot hidden \cdot (hidden + I) / tp$。所以通信/计算之比 ∝ tp / (hidden + I)，且在 T 小时被固定延迟主导。
# 3. 不划算的情形：tp 增大（计算按 1/tp 降而通信不降）；decode 与小 batch（T 小，all-reduce 的固定延迟占主导）；小模型或窄层（hidden 小）；互连慢（PCIe 没有 NVLink、跨机）——这就是 vLLM 建议 TP 不跨机、跨机用流水线并行的原因；此外 kv 头复制（Q2）让 KV cache 收益在 tp 超过 kv 头数后停止增长。
# 4. 划算的情形：模型一张卡放不下（TP 是让它跑起来的手段）；大模型的 prefill 或大 batch，计算足够大能摊薄通信；有 NVLink / NVSwitch 的单机多卡，必要时用自定义 all-reduce 降低小消息延迟。
# 5. 本机结论只对这台 2 核 CPU、这个小模型和这批 prompt 成立；是否用 TP、用多大，必须在目标硬件和负载上按 A B A B 交替测吞吐与延迟后决定。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown]
# ## 评分规则
#
# - 代码 4 分：主路径 2 分（两个 rank 上的 MLP 1 分、接入真实引擎 TP=2 1 分）、边界条件 1 分、能映射回源码对象 1 分；
# - Q1～Q3 各 2 分：必须包含对象、状态变化、正确性或成本链；
# - 一票否决：把论文峰值写成普遍生产结论；把源码支持写成所有模型/硬件可用；混淆算法正确性与性能；只背类名而说不清状态所有权。
#
# 总分 10 分，至少 8 分通过。参考答案与参考代码只在教师分支（solutions/）中：先独立完成；核对后请换一个 tp、模型形状或 batch 重新推演，不能只复制。
#
# ### 自检
#
# 下面的单元格用与 nbgrader 相同的检查函数给代码部分打分（Q1～Q3 显示为待人工评分）。

# %%
self_check("lesson10", globals());

# %% [markdown]
# ## 参考资料
#
# - [vLLM parallel linear layers](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/model_executor/layers/linear.py)
# - [vLLM vocab-parallel embedding](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/model_executor/layers/vocab_parallel_embedding.py)
# - [vLLM parallel state](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/distributed/parallel_state.py)
# - [vLLM MultiprocExecutor](https://github.com/vllm-project/vllm/blob/8e958902eee5/vllm/v1/executor/multiproc_executor.py)
# - [Megatron-LM: Training Multi-Billion Parameter Language Models Using Model Parallelism (Shoeybi et al., 2019)](https://arxiv.org/abs/1909.08053)
# - [vLLM distributed inference and serving (current docs)](https://docs.vllm.ai/en/latest/serving/parallelism_scaling.html)
#
# 源码链接固定到本课审阅 commit；current docs、并行方式与默认参数会变化，面试或部署前必须按目标版本重新核对。
#
# ← 上一课：第 9 课：投机解码：n-gram 提议与拒绝采样　｜　下一课 →：第 11 课：CUDA Graph 与动态形状
