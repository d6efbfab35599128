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
# 本课产出：
#
# - 说清 TP=2 时每个 rank 持有哪些权重、从 checkpoint 的哪一段读来，一步前向在哪里通信、通信几次，`MultiprocExecutor` 怎样把 `execute_model` 广播给每个 worker；
# - 写出 MLP 的列并行层 `gate_up_proj` 与行并行层 `down_proj`，接进真实引擎。
#
# 通过要求：代码断言全部通过；Q1～Q3 沿源码对象给出因果链；能指出下面三条；总分至少 8/10。
#
# - 正确性不变量：每个 rank 在同一步调用同样次数、同样形状的 all-reduce；TP=2 与 TP=1 在数学上相等。本课在 CPU float32 上检查贪心输出逐 token 相同；GPU 上分片改变求和顺序，vLLM 不保证逐 token 相同。
# - 性能边界：每层两次 all-reduce，每次的张量大小是 token 数 × hidden，与 tp 无关。
# - 要靠 benchmark 的结论：在什么硬件与 batch 上 TP 真的更快。
#
# | 部分 | 分值 | 评分方式 |
# |---|---|---|
# | 代码·主路径（两个 gloo rank 上的 MLP 1 分 + 接入真实引擎 TP=2 1 分） | 2 | 自动 |
# | 代码·边界条件（TP=1、带 bias、大小不等（含三段）或不能整除的融合投影、单 token） | 1 | 自动 |
# | 代码·能映射回源码对象（`SOURCE_MAP`） | 1 | 自动 |
# | Q1～Q3 | 各 2 | 人工，按评分规则 |
#
# 没有 nbgrader 时（例如 Colab），运行最后的“自检”单元格（或 `python -m autograder check lesson10`）。

# %% [markdown]
# ## 源码版本与阅读方法
#
# 源码固定在 vLLM {{VLLM_VERSION}}（commit {{VLLM_COMMIT}}）。沿着一个权重矩阵的一生读：完整张量 → 每个 rank 取哪一段 → 算出一段输出还是部分和 → 在哪里 all-reduce。
#
# | 顺序 | vLLM 文件与入口 | minivllm 对应 | 带着什么问题读 |
# |---|---|---|---|
# | 1 | `vllm/model_executor/layers/linear.py`：`MergedColumnParallelLinear.weight_loader_v2`（L978–994），切片在 `parameter.py` L169–176 | `minivllm/model_executor/layers/linear.py` | rank 取哪两段、放在哪？ |
# | 2 | `vllm/model_executor/layers/linear.py`：`QKVParallelLinear.__init__`（L1073–1081） | 同上 | 每个 rank 几个 q 头、几个 kv 头？kv 头少于 tp 时怎么办？ |
# | 3 | `vllm/model_executor/layers/linear.py`：`RowParallelLinear.forward`（L1761–1769） | 同上 | bias 为什么只在 rank 0 加？何时 all-reduce？ |
# | 4 | `vllm/v1/executor/multiproc_executor.py`：`MultiprocExecutor.collective_rpc`（L384–392） | `minivllm/executor/multiproc_executor.py` | 一次 `execute_model` 怎样送到每个 rank？ |
#
# **runner**：课程的 dense 模型在 {{VLLM_VERSION}} 默认由 Model Runner V2 运行；minivllm 的 worker 对应 V1 的 `gpu_model_runner.py`，本课的层两者共用。

# %%
# 上表各行在 vLLM {{VLLM_VERSION}} 源码里的样子：文件路径、行号与逐行原文（行号与上表一致；源码由第一个单元格获取并校验）。
from autograder.vllm_source import show_vllm

show_vllm("vllm/model_executor/layers/linear.py", "MergedColumnParallelLinear.weight_loader_v2", lines=(978, 994))
show_vllm("vllm/model_executor/parameter.py", "_ColumnvLLMParameter.load_merged_column_weight", lines=(169, 176))
show_vllm("vllm/model_executor/layers/linear.py", "QKVParallelLinear.__init__", lines=(1073, 1081))
show_vllm("vllm/model_executor/layers/linear.py", "RowParallelLinear.forward", lines=(1761, 1769))
show_vllm("vllm/v1/executor/multiproc_executor.py", "MultiprocExecutor.collective_rpc", lines=(384, 392))

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
# 模型放不进一张卡、或一张卡算一步太慢时，张量并行（TP）把每层的权重切成 tp 份：每个 rank（一个进程、一张卡）只存、只算自己那份，再用 all-reduce 合起来。
#
# TP=2 时每个 rank 约存一半权重；kv 头数不少于 tp 时，KV cache 也约减半，因为每个 rank 只存自己那些头的 KV（Q2）。
#
# ### 2. 它如何工作
#
# 线性层 $y = xW^\top$，$W$ 的形状是 `[output_size, input_size]`。两种切法来自 Megatron-LM：
#
# 1. **列并行**（`ColumnParallelLinear`）：按输出维切，rank r 持有 $W$ 的第 r 段行，用完整的 x 算出 y 的第 r 段，不通信。
# 2. **行并行**（`RowParallelLinear`）：按输入维切，rank r 持有 $W$ 的第 r 段列，输入正是前一个列并行层在本 rank 的输出；算出 y 的部分和，一次 all-reduce 把它们加起来。
#
# `gate_up_proj` 是融合 gate 与 up 的 `MergedColumnParallelLinear`。rank r 持有 `[gate 的第 r 段; up 的第 r 段]`：每段各自切，`SiluAndMul` 才能在本 rank 内配对。
#
# MLP 与注意力都是先列后行（`gate_up_proj` → `down_proj`，`qkv_proj` → `o_proj`），所以每层两次 all-reduce。
#
# `MultiprocExecutor` 为每个 rank 起一个 `WorkerProc`（CPU 上用 gloo 组成进程组），`collective_rpc` 把 `execute_model` 广播给它们。调度器只有一份，在 EngineCore 里。
#
# ### 3. 正确性条件与常见误区
#
# - **每个 rank 调用同样次数、同样形状的集合通信**：all-reduce 要所有 rank 到齐；一个 rank 少调一次，另一个就永远等下去。
# - **列并行层之后不 all-reduce**：各 rank 的输出是 y 的不同段，不是部分和。
# - **行并行层之后必须 all-reduce**：否则每个 rank 只有部分和，隐藏状态从此不一致。
# - **行并行的 bias 只加一次**：每个 rank 都加，all-reduce 之后就是 tp 倍。
#
# ### 4. 性能与工程取舍
#
# - 每次 all-reduce 的张量是 `num_tokens × hidden_size`（ring 算法里每个 rank 收发约 2(tp−1)/tp 倍），每个 rank 的计算却按 1/tp 减少：tp 越大、batch 越小、层越窄，通信占比越高。
# - 有 NVLink 时大 batch 常能摊薄通信，小 batch 的 decode 仍可能被 all-reduce 延迟主导；vLLM 文档建议 TP 不跨机。

# %%
shards = L10.rank_shards()
L10.print_rank_shards(shards)

# %% [markdown]
# 表 10-1：默认模型（4 层，hidden 256，intermediate 704，8 个 q 头、2 个 kv 头，head_dim 32）第 0 层与 embedding 的参数形状，左 TP=1，右 TP=2 每个 rank。
#
# - `qkv_proj.weight`：TP=1 是 `[(8 + 2 + 2)×32, 256] = [384, 256]`；TP=2 每个 rank 4 个 q 头、1 个 kv 头，`[192, 256]`。按头切（Q2）。
# - `o_proj.weight`、`down_proj.weight`：输出维不变，输入维减半，这是行并行。
# - `gate_up_proj.weight`：`[2×704, 256]` → `[2×352, 256]`，gate 的一半和 up 的一半。
# - `embed_tokens.weight`：词表（需要时补齐）切成两段；`lm_head` 与它共享权重。

# %%
cmp = L10.tp_comparison()
L10.print_tp_comparison(cmp)
L10.plot_tp_comparison(cmp);

# %% [markdown]
# 图 10-1：3 个 prompt、每个 16 个 token，贪心。左：TP=1 与 TP=2 交替各跑 3 次的墙钟时间。右：rank 0 的 profiler 数到的步数与 gloo all-reduce（`c10d::allreduce_`）次数，每次运行都相同。
#
# 两个 rank 共用同两个核，左图的比值跟着负载走（负载下见过 0.5× 到 12×），本课不从它下结论。确定的是右图：每步 9 次 all-reduce，每次 T × 256 个 float32，与 tp 无关（Q3）。还没有 GPU 录制。

# %% [markdown]
# ## 具体演示：一步前向里的 all-reduce
#
# TP=2 的第 0 层，形状是每个 rank 上的，T 是本步的 token 数：
#
# 1. `embed_tokens`（词表并行）：每个 rank 查自己那段词表，段外的 token 得 0 → **all-reduce #1** → `[T, 256]`。
# 2. `qkv_proj`（列并行）：`[T, 256]` → `[T, 192]`，本 rank 的 4 个 q 头和 1 个 kv 头，不通信。
# 3. `o_proj`（行并行）：`[T, 128]` → `[T, 256]` 的部分和 → **all-reduce #2**。
# 4. `gate_up_proj`（列并行）：`[T, 256]` → `[T, 704]`（gate 352 + up 352），不通信；`SiluAndMul` → `[T, 352]`。
# 5. `down_proj`（行并行）：`[T, 352]` → `[T, 256]` 的部分和 → **all-reduce #3**。
#
# 以后每层两次，4 层共 1 + 8 = 9 次。`lm_head` 之后 all-gather 出完整的 logits，各 rank 用相同的 logits 和种子采出相同的 token，批状态始终一致；只有一个 worker 把结果交回 EngineCore。

# %% [markdown]
# ## 实践任务：唯一代码填空题
#
# 下面是 MLP 里的两个并行线性层（去掉了量化与 `skip_bias_add` 等开关）。
#
# - 父类 `LinearBase(input_size_per_partition, output_size_per_partition, bias)` 建好本 rank 的 `weight`（`[输出, 输入]`）与 `bias`，并给每个参数挂上 `self.weight_loader`（各 rank 读同一份 checkpoint，只拷贝本 rank 那段）。
# - `self.tp_rank`、`self.tp_size`：本 rank 的编号和 rank 数，没有进程组时是 0 和 1。
# - 10 处 `______` 是决策点：持有哪一维、读哪一段、放到融合参数哪里、通不通信、bias 在哪个 rank 加。
# - 融合的各段大小可以不同（检查会用）；每段和行并行层的输入都要能被 tp 整除，否则构造层就应报错。
#
# > 与 vLLM 的差异（评分涉及）：练习的层只返回 output，切法写在层的 `weight_loader` 里（vLLM 的做法见附录）。
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
# 第一项检查：两个 gloo rank 各建 `gate_up_proj` 和 `down_proj`，从同一份完整权重加载、跑同一输入：每个 rank 的分片、列并行层输出段和 MLP 输出都要对。

# %% nbgrader={"grade": true, "grade_id": "l10_main_path", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
gate_up = MergedColumnParallelLinear(8, [6, 6])    # TP=1 here (no process group): each rank would hold it all
assert tuple(gate_up.weight.shape) == (12, 8)
down = RowParallelLinear(6, 8, bias=True)
assert tuple(down.weight.shape) == (8, 6) and tuple(down.bias.shape) == (8,)
### BEGIN HIDDEN TESTS
L10.check_mlp(MergedColumnParallelLinear, RowParallelLinear)
### END HIDDEN TESTS

# %% [markdown]
# 第二项检查：你的两个类换进 minivllm 的 Llama（`o_proj` 也用行并行层），以 `tensor_parallel_size=2` 贪心生成，输出须与 TP=1 逐 token 相同，rank 0 上每步恰好 9 次 all-reduce。

# %% nbgrader={"grade": true, "grade_id": "l10_real_engine", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
L10.check_real_engine(MergedColumnParallelLinear, RowParallelLinear)
print("真实引擎检查通过：TP=2 的贪心输出与 TP=1 相同，每步 9 次 all-reduce。")

# %% [markdown]
# ## 检查方法
#
# 运行断言；下面的单元格用你的类在两个 rank 上算两种错法，只改通信的位置：all-reduce 放在列并行层之后、完全不做 all-reduce。Q1 问其中的原因。

# %%
for name, err in L10.misplaced_all_reduce(MergedColumnParallelLinear, RowParallelLinear).items():
    print(f"{name:<34} 与不切分的 MLP 的最大误差 {err:.2e}")

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
# “能映射回源码对象”（1 分）在这里自动评分：写出 vLLM {{VLLM_VERSION}} 里每个概念的名字（字符串，大小写不限）。括号里是位置，可在新单元格里用 `show_vllm(文件, 名字, lines=(a, b))` 打印那几行。
#
# - `no_split`：每个 rank 都持有完整权重、不切分的线性层类（`LinearBase` 之后的第一个类，[linear.py L314](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/model_executor/layers/linear.py#L314)）；
# - `shard_widths`：各融合投影在本 rank 上输出宽度的列表属性（`ColumnParallelLinear.__init__` 的 L483–L485）；
# - `divisible`：断言能整除的函数（`vllm/distributed/utils.py` 里 `divide` 的 L63）；
# - `split_input`：行并行层把未切分的输入沿最后一维切成 tp 份的函数（`RowParallelLinear.forward` 的 L1755）；
# - `gather_outputs`：列并行层收集各 rank 输出段的通信函数（`ColumnParallelLinear.forward` 的 L602）；
# - `output_rank`：决定从哪个 worker 读回模型输出的方法（`MultiprocExecutor._init_executor` 的最后一行，L247）。

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
# 检查方法里，all-reduce 放在列并行层之后，误差远大于舍入。为什么它放在行并行层之后对、放在列并行层之后错？用每个 rank 在这两处持有的张量说明。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 两处都说清：(1) 行并行层之后，每个 rank 持有的是同一个完整输出 y 的部分和（rank r 用 `down_proj` 的第 r 段列乘本 rank 的那段中间激活），all-reduce 把部分和加起来，正好是 y；(2) 列并行层之后，rank r 持有的是中间激活的第 r 段（不同的中间神经元，gate 与 up 各自的第 r 段），它们不是同一个量的几份，all-reduce 把不同神经元逐元素相加、混在一起，后面的结果全错。1 分 = 只说清其中一处（例如只说行并行输出是部分和、要相加，没说列之后相加为什么错；或反之）；0 分 = 认为列并行层之后 all-reduce 只是多一次通信、慢但不错（一票否决：混淆算法正确性与性能）。
#
# **参考答案**
#
# `down_proj` 是行并行：$y = \sum_r W_{down}[:, r]\, h_r$，rank r 持有 $W_{down}$ 的第 r 段列和中间激活的第 r 段 $h_r$，算出的是同一个 y（`[T, hidden]`）的第 r 个部分和；all-reduce 把 tp 个部分和相加，每个 rank 得到完整的 y。`gate_up_proj` 是列并行：rank r 的输出是 `[gate 的第 r 段; up 的第 r 段]`，各 rank 的输出是不同的中间神经元，不是同一个量的几份。在这里 all-reduce 会把 rank 0 的神经元 j 与 rank 1 的神经元 j + I/tp 加在一起，`SiluAndMul` 与 `down_proj` 都在错的激活上算，所以误差是 1e3 量级；正确的位置误差约 1e-4，只是舍入。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l10_q2", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q2（2 分）
#
# 本课模型（8 个 q 头、2 个 kv 头）用 TP=4 时，按上面 `QKVParallelLinear.__init__` 的摘录，每个 rank 持有几个 q 头、几个 kv 头？与 TP=2 相比，每个 token 在每个 rank 上的 KV cache 还会减半吗，为什么？
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 头数对（每个 rank 2 个 q 头、1 个 kv 头），并说清 KV cache 不再减半：tp_size 4 ≥ kv 头数 2，走 `num_kv_heads = 1`、`num_kv_head_replicas = 4 / 2 = 2` 的分支，每个 kv 头复制到 2 个 rank；每个 rank 仍存 1 个 kv 头的 K/V（每个 token、每层 K、V 各 32 个数），与 TP=2 相同，多出的是重复存储。说“每个 rank 仍 1 个 kv 头、头不能拆，所以不再减半”而没提复制的，同样 2 分。1 分 = 头数对，但认为 KV cache 继续减半，或没有说出为什么不再减半；0 分 = 头数错，或认为一个 kv 头可以拆成半个分给两个 rank（注意力在头内计算，头不能拆）。说出 rank r 加载第 r // 2 个 kv 头、它的 q 头正好共享这个 kv 头是好的补充，不要求。
#
# **参考答案**
#
# `num_heads = divide(8, 4) = 2`，每个 rank 2 个 q 头。kv 头只有 2 个、少于 tp = 4，走 `tp_size >= total_num_kv_heads` 的分支：`num_kv_heads = 1`，`num_kv_head_replicas = divide(4, 2) = 2`，即每个 kv 头被复制到 2 个 rank（rank 0、1 持有 kv 头 0，rank 2、3 持有 kv 头 1，正好是各自 q 头所属的组）。所以每个 rank 的 KV cache 仍是 1 个 kv 头：每个 token、每层 K、V 各 1 × 32，与 TP=2 一样，不再减半；所有 rank 合起来，KV cache 反而存了两份。`qkv_proj.weight` 每个 rank 是 `[(2 + 1 + 1) × 32, 256] = [128, 256]`。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l10_q3", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q3（2 分）
#
# 本课模型从 TP=2 换成 TP=4，每步 all-reduce 的次数、每次的张量大小、每个 rank 的矩阵乘法计算量各怎样变？据此说明 tp 越大，通信在一步里的占比为什么越高。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 三个量都对并给出结论：次数不变（embedding 1 次 + 每层 2 次，4 层共 9 次/步）；每次的张量仍是 `T × hidden`（T × 256 个数），与 tp 无关（说 ring 下每个 rank 收发约 2(tp−1)/tp 倍、从 1 倍略增到 1.5 倍也对）；每个 rank 的计算量约减半（∝ 1/tp；被复制的 kv 投影不减，不必提）；所以通信不降、计算减少，通信占比随 tp 上升（T 小、hidden 小时更明显，提到即可，不要求）。1 分 = 三个量都对，但没有据此说出通信占比为什么上升；或结论对，但三个量里有一个说错或没说（例如没说每次的张量大小与 tp 无关）；0 分 = 认为每次 all-reduce 的张量也按 1/tp 缩小，或认为 TP=4 一定比 TP=2 快一倍。
#
# **参考答案**
#
# 次数不变：embedding 之后 1 次，每层 `o_proj`、`down_proj` 之后各 1 次，4 层共 9 次/步，与 tp 无关。每次 all-reduce 的张量仍是 `[T, 256]`：行并行层的部分和总是完整的 `[T, hidden]`，tp 只改变有几份要加；按 ring 算，每个 rank 收发约 $2(tp-1)/tp$ 倍，从 TP=2 的 1 倍变成 1.5 倍。每个 rank 的矩阵乘法只算约 1/tp 的权重，计算量从约 1/2 降到约 1/4（复制的 kv 头那部分除外，Q2）。通信不降、计算约减半，所以 tp 越大，all-reduce 在一步里的占比越高；T 小（decode、小 batch）时还受每次 all-reduce 的固定延迟限制，更明显。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown]
# ## 评分规则
#
# - 代码 4 分：主路径 2 分（两个 rank 上的 MLP 1 分、接入真实引擎 TP=2 1 分）、边界条件 1 分、能映射回源码对象 1 分；
# - Q1～Q3 各 2 分：必须包含对象、状态变化、正确性或成本链；
#
# 总分 10 分，至少 8 分通过。
#
# ### 自检
#
# 下面的单元格用与 nbgrader 相同的检查函数给代码部分打分，Q1～Q3 显示为待人工评分。

# %%
self_check("lesson10", globals());

# %% [markdown]
# ## 附录（选读）
#
# 选读：在真实 vLLM 上加载同一层、与 vLLM {{VLLM_VERSION}} 的全部差异和参考资料，不计入核心路径。
#
# **GPU 上的已发表数字（非本课实测）**：8×H100 SXM5 上 NCCL all-reduce 大消息的 busbw 约 460–480 GB/s，无 NVSwitch 的 8×H100 PCIe 约 35–45 GB/s（[nccl-tests](https://docs.alayanew.com/en/docs/tech-blog/2026-05-06-nccl-tests)）。
#
# 互连带宽差一个数量级，大消息（prefill、大 batch）的 all-reduce 代价也差约一个数量级；decode 每次只有 T × hidden 个数，主要受延迟限制，差距要在目标硬件上测。

# %% [markdown]
# ### 在真实 vLLM {{VLLM_VERSION}} 上看同一件事
#
# 同一份 checkpoint 的第 0 层与 embedding，由 vLLM 的四种并行层每个 rank 建一次、用参数的 `weight_loader` 加载。
#
# 这里不建进程组，只把 vLLM 读 rank 与 world size 的函数换成要建的 rank：加载只切片、不通信。表中按数值找出每个分片取自 checkpoint 的哪些行或列，并与 minivllm 对照。

# %%
L10.vllm_side_by_side(shards);

# %% [markdown]
# ### 与 vLLM {{VLLM_VERSION}} 的差异
#
# - **权重加载**：vLLM 的未量化层用 `weight_loader_v2`，由参数对象的 `load_merged_column_weight`、`load_qkv_weight`、`load_row_parallel_weight` 切片；minivllm 与练习写在层的 `weight_loader` 里，切法相同。
# - **forward 的返回值**：vLLM 的线性层默认返回 `(output, output_bias)`，模型里写 `x, _ = self.down_proj(x)`；`return_bias=False` 时才只返回 output。练习与 minivllm 只返回 output。
# - **开关**：vLLM 的行并行层还有 `input_is_parallel`、`skip_bias_add`，计算交给 `quant_method`；minivllm 只保留 `reduce_results`。
# - **矩阵乘法**：minivllm 的层走 `unquantized_gemm`，CPU 上加载后是 oneDNN 预打包的 matmul（对应 vLLM 的 `dispatch_cpu_unquantized_gemm`）；练习里的层为简单起见直接用 `F.linear`。
# - **不能整除时**：vLLM 的 `MergedColumnParallelLinear` 构造时断言每段 `output_size % tp_size == 0`，行并行层用 `divide` 切输入维；minivllm 的 `divide` 抛 `ValueError`。练习接受任何异常。
# - **广播调用**：vLLM 的 executor 用共享内存 `MessageQueue`（`rpc_broadcast_mq`）广播；minivllm 把同一份 pickle 写进每个 worker 的管道。
# - **通信后端**：vLLM 在 GPU 上走 NCCL 或自定义 all-reduce kernel；本课在 CPU 上走 gloo。minivllm 只有张量并行，没有流水线并行和数据并行。
# - **profiler 里的名字**：默认 `-O2` 下，CUDA 计算能力 9.0 或 10.x（SM100 系列）且装有 FlashInfer 时，`enable_allreduce_rms_fusion` 把 all-reduce 与其后的 RMSNorm 融合成 `flashinfer_trtllm_fused_allreduce_norm`。
# - 这个融合只在 FlashInfer 支持的 tp 下、token 数不超过 `max_token_num` 的小 batch 启用；通信次数不变，只是换了名字。
# - **各 rank 采出相同的 token**：all-gather 让每个 rank 拿到相同的 logits（`LogitsProcessor._gather_logits`）；随机采样靠全局种子 `ModelConfig.seed`（默认 0）。minivllm 同样在每个 worker 里设同一个种子。

# %% [markdown]
# ### 参考资料
#
# - [vLLM parallel linear layers](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/model_executor/layers/linear.py)
# - [vLLM vocab-parallel embedding](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/model_executor/layers/vocab_parallel_embedding.py)
# - [vLLM parallel state](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/distributed/parallel_state.py)
# - [vLLM MultiprocExecutor](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/executor/multiproc_executor.py)
# - [Megatron-LM (Shoeybi et al., 2019)](https://arxiv.org/abs/1909.08053)
# - [vLLM distributed inference and serving (current docs)](https://docs.vllm.ai/en/latest/serving/parallelism_scaling.html)
#
# current docs 与默认参数会变化，部署前要按目标版本重新核对。
#
# ← 上一课：第 9 课：投机解码：n-gram 提议与拒绝采样　｜　下一课 →：第 11 课：CUDA Graph 与动态形状
