"""Linear layers with vLLM's names and weight loaders (vLLM: model_executor/layers/linear.py).

Tensor-parallel size is 1 here, so each layer is a plain nn.Linear. The names are vLLM's so lesson code
lines up, and the merged layers keep vLLM's shard loading: HF checkpoints store q/k/v and gate/up as
separate tensors, which load_weights copies into row ranges of one fused weight.
"""
from __future__ import annotations

import torch
from torch import nn


def default_weight_loader(param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
    """Copy a checkpoint tensor into a parameter of the same shape (casting to the model dtype)."""
    if param.shape != loaded_weight.shape:
        raise ValueError(f"shape mismatch: parameter {tuple(param.shape)}, checkpoint {tuple(loaded_weight.shape)}")
    param.data.copy_(loaded_weight)


class MergedColumnParallelLinear(nn.Linear):
    """Several projections of the same input fused along the output dim (gate_up_proj = [gate; up])."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False) -> None:
        super().__init__(input_size, sum(output_sizes), bias=bias)
        self.output_sizes = list(output_sizes)
        for p in self.parameters():
            p.weight_loader = self.weight_loader

    def shard_range(self, shard_id: int | str) -> tuple[int, int]:
        return sum(self.output_sizes[:shard_id]), self.output_sizes[shard_id]

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: int | str) -> None:
        offset, size = self.shard_range(shard_id)
        default_weight_loader(param.data.narrow(0, offset, size), loaded_weight)


class QKVParallelLinear(MergedColumnParallelLinear):
    """q, k and v projections fused into one matmul; GQA makes k and v narrower than q."""

    def __init__(self, hidden_size: int, head_size: int, num_heads: int, num_kv_heads: int,
                 bias: bool = False) -> None:
        self.q_size, self.kv_size = num_heads * head_size, num_kv_heads * head_size
        super().__init__(hidden_size, [self.q_size, self.kv_size, self.kv_size], bias=bias)

    def shard_range(self, shard_id: int | str) -> tuple[int, int]:
        return super().shard_range({"q": 0, "k": 1, "v": 2}[shard_id])


class RowParallelLinear(nn.Linear):
    """The projection back to the hidden size (o_proj, down_proj); a plain nn.Linear at TP size 1."""
