"""Tensor-parallel linear layers with vLLM's names and weight loaders (vLLM: model_executor/layers/linear.py).

Megatron's split, as vLLM does it: a ColumnParallelLinear holds a slice of the *output* rows of W, so each
rank computes its own slice of y with no communication; the RowParallelLinear after it holds the matching
slice of the *input* columns, so each rank computes a partial sum of y, and one all-reduce adds them up.
Column then row costs one all-reduce per block (attention: qkv -> o_proj; MLP: gate_up -> down_proj).

Every parameter carries a weight_loader(param, full_checkpoint_tensor[, shard_id]) that copies just this
rank's slice, so all ranks read the same safetensors files. At tp=1 the slices are the whole tensors and
forward is F.linear, the same arithmetic as nn.Linear; on CPU, after loading, it is oneDNN's matmul on a
prepacked copy of the weight, as in vLLM (layers/utils.py).
"""
from __future__ import annotations

import torch
from torch import nn

from minivllm.distributed import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from minivllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm, unquantized_gemm


def divide(numerator: int, denominator: int) -> int:
    if numerator % denominator:
        raise ValueError(f"{numerator} is not divisible by tensor_parallel_size {denominator}")
    return numerator // denominator


def default_weight_loader(param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
    """Copy a checkpoint tensor into a parameter of the same shape (casting to the model dtype)."""
    if param.shape != loaded_weight.shape:
        raise ValueError(f"shape mismatch: parameter {tuple(param.shape)}, checkpoint {tuple(loaded_weight.shape)}")
    param.data.copy_(loaded_weight)


class LinearBase(nn.Module):
    """y = x W^T + b with W [output_size_per_partition, input_size_per_partition] on this rank."""

    def __init__(self, input_size_per_partition: int, output_size_per_partition: int, bias: bool) -> None:
        super().__init__()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.weight = nn.Parameter(torch.empty(output_size_per_partition, input_size_per_partition),
                                   requires_grad=False)
        self.bias = nn.Parameter(torch.empty(output_size_per_partition), requires_grad=False) if bias else None
        for p in self.parameters():
            p.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        default_weight_loader(param, loaded_weight)

    def process_weights_after_loading(self) -> None:
        """vLLM's UnquantizedLinearMethod hook: on CPU, prepack the loaded weight for oneDNN."""
        if self.weight.device.type == "cpu":
            dispatch_cpu_unquantized_gemm(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return unquantized_gemm(self)(x, self.weight, self.bias)


class ColumnParallelLinear(LinearBase):
    """Output dim split across ranks: rank r holds rows [r*n, (r+1)*n) of W; gather_output concatenates."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, gather_output: bool = False) -> None:
        tp = get_tensor_model_parallel_world_size()
        self.input_size, self.output_size, self.gather_output = input_size, output_size, gather_output
        self.output_size_per_partition = divide(output_size, tp)
        super().__init__(input_size, self.output_size_per_partition, bias)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        n = param.shape[0]
        default_weight_loader(param, loaded_weight.narrow(0, self.tp_rank * n, n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = unquantized_gemm(self)(x, self.weight, self.bias)
        return tensor_model_parallel_all_gather(y) if self.gather_output else y


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several projections of one input fused along the output dim (gate_up_proj = [gate; up]).

    Each projection is split on its own, so rank r holds [gate_r; up_r], not a slice of [gate; up]:
    SiluAndMul then pairs gate and up rows of the same rank.
    """

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False) -> None:
        self.output_sizes = list(output_sizes)
        tp = get_tensor_model_parallel_world_size()
        for size in self.output_sizes:
            divide(size, tp)
        super().__init__(input_size, sum(output_sizes), bias)

    def shard_range(self, shard_id: int | str) -> tuple[int, int]:
        """(offset, size) of a projection inside this rank's fused parameter."""
        return sum(self.output_sizes[:shard_id]) // self.tp_size, self.output_sizes[shard_id] // self.tp_size

    def shard_rank(self, shard_id: int | str) -> int:
        """Which slice of the checkpoint tensor this rank loads for a projection."""
        return self.tp_rank

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: int | str) -> None:
        offset, size = self.shard_range(shard_id)
        shard = loaded_weight.narrow(0, self.shard_rank(shard_id) * size, size)
        default_weight_loader(param.data.narrow(0, offset, size), shard)


class QKVParallelLinear(MergedColumnParallelLinear):
    """q, k and v fused into one matmul, split by heads: each rank holds num_heads/tp q heads and its kv heads.

    With fewer kv heads than ranks (tp > num_kv_heads) each kv head is replicated on tp/num_kv_heads ranks,
    so every rank still holds one kv head for its q heads (as vLLM's num_kv_head_replicas).
    """

    def __init__(self, hidden_size: int, head_size: int, total_num_heads: int, total_num_kv_heads: int,
                 bias: bool = False) -> None:
        tp = get_tensor_model_parallel_world_size()
        self.head_size, self.total_num_heads, self.total_num_kv_heads = head_size, total_num_heads, total_num_kv_heads
        self.num_heads = divide(total_num_heads, tp)
        if tp >= total_num_kv_heads:
            self.num_kv_heads, self.num_kv_head_replicas = 1, divide(tp, total_num_kv_heads)
        else:
            self.num_kv_heads, self.num_kv_head_replicas = divide(total_num_kv_heads, tp), 1
        self.q_size, self.kv_size = self.num_heads * head_size, self.num_kv_heads * head_size
        # output_sizes are the per-rank sizes times tp, so shard_range's // tp gives them back
        super().__init__(hidden_size, [self.q_size * tp, self.kv_size * tp, self.kv_size * tp], bias)

    def shard_range(self, shard_id: int | str) -> tuple[int, int]:
        return super().shard_range({"q": 0, "k": 1, "v": 2}[shard_id])

    def shard_rank(self, shard_id: int | str) -> int:
        return self.tp_rank if shard_id == "q" else self.tp_rank // self.num_kv_head_replicas


class RowParallelLinear(LinearBase):
    """Input dim split across ranks (o_proj, down_proj): partial sums, then one all-reduce.

    The bias is added on rank 0 only, before the all-reduce, so the sum holds it once.
    """

    def __init__(self, input_size: int, output_size: int, bias: bool = False, reduce_results: bool = True) -> None:
        tp = get_tensor_model_parallel_world_size()
        self.input_size, self.output_size, self.reduce_results = input_size, output_size, reduce_results
        self.input_size_per_partition = divide(input_size, tp)
        super().__init__(self.input_size_per_partition, output_size, bias)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        if param.dim() == 2:
            n = param.shape[1]
            loaded_weight = loaded_weight.narrow(1, self.tp_rank * n, n)
        default_weight_loader(param, loaded_weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = unquantized_gemm(self)(x, self.weight, self.bias if self.tp_rank == 0 else None)
        return tensor_model_parallel_all_reduce(y) if self.reduce_results and self.tp_size > 1 else y
