"""Lesson 10's checks accept minivllm's own parallel layers and reject each misconception the issue names.

The wrong answers are small subclasses of the engine's layers, one misconception each (the lesson's
mutants.py will carry the same ones as edits of its solution cell once the notebook exists).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from autograder.common import CheckFailed
from autograder.lesson10 import check_mlp, check_real_engine
from minivllm.distributed import tensor_model_parallel_all_reduce
from minivllm.model_executor.layers.linear import (
    LinearBase,
    MergedColumnParallelLinear,
    RowParallelLinear,
    default_weight_loader,
)


class WrongDimColumn(MergedColumnParallelLinear):
    """Shards gate/up along the input dim (columns of W) instead of the output dim."""

    def __init__(self, input_size, output_sizes, bias=False):
        self.output_sizes = list(output_sizes)
        LinearBase.__init__(self, input_size // self_tp(), sum(output_sizes), bias)

    def weight_loader(self, param, loaded_weight, shard_id):
        n = param.shape[1]
        offset, size = sum(self.output_sizes[:shard_id]), self.output_sizes[shard_id]
        default_weight_loader(param.data.narrow(0, offset, size), loaded_weight.narrow(1, self.tp_rank * n, n))


def self_tp() -> int:
    from minivllm.distributed import get_tensor_model_parallel_world_size
    return get_tensor_model_parallel_world_size()


class AllReduceAfterColumn(MergedColumnParallelLinear):
    """Sums the column-parallel outputs across ranks (they are different slices, not partial sums)."""

    def forward(self, x):
        return tensor_model_parallel_all_reduce(super().forward(x))


class NoAllReduceRow(RowParallelLinear):
    """Forgets the all-reduce: each rank keeps its partial sum."""

    def forward(self, x):
        return F.linear(x, self.weight, self.bias if self.tp_rank == 0 else None)


class BiasEveryRankRow(RowParallelLinear):
    """Adds the bias on every rank before the all-reduce, so the sum holds it tp times."""

    def forward(self, x):
        return tensor_model_parallel_all_reduce(F.linear(x, self.weight, self.bias))


class ReduceTwiceRow(RowParallelLinear):
    """All-reduces again "to keep the ranks in sync" (halved first: the same numbers, one more collective)."""

    def forward(self, x):
        return tensor_model_parallel_all_reduce(super().forward(x) / self.tp_size)


class OneBlockGateUp(MergedColumnParallelLinear):
    """Shards [gate; up] as one block: rank 0 gets all of gate, rank 1 all of up."""

    def weight_loader(self, param, loaded_weight, shard_id):
        full = sum(self.output_sizes)
        lo, n = self.tp_rank * (full // self.tp_size), full // self.tp_size
        start = sum(self.output_sizes[:shard_id])
        a, b = max(lo, start), min(lo + n, start + self.output_sizes[shard_id])
        if a < b:
            default_weight_loader(param.data[a - lo:b - lo], loaded_weight[a - start:b - start])


MLP_MUTANTS = [(WrongDimColumn, RowParallelLinear), (AllReduceAfterColumn, RowParallelLinear),
               (MergedColumnParallelLinear, NoAllReduceRow), (MergedColumnParallelLinear, BiasEveryRankRow),
               (OneBlockGateUp, RowParallelLinear)]


def test_check_mlp_accepts_the_engine_layers():
    check_mlp(MergedColumnParallelLinear, RowParallelLinear)


@pytest.mark.parametrize("column_cls, row_cls", MLP_MUTANTS, ids=lambda c: c.__name__)
def test_check_mlp_rejects(column_cls, row_cls):
    with pytest.raises(CheckFailed):
        check_mlp(column_cls, row_cls)


@pytest.mark.slow
def test_check_real_engine_accepts_the_engine_layers_and_rejects_wrong_all_reduces():
    check_real_engine(MergedColumnParallelLinear, RowParallelLinear)
    with pytest.raises(CheckFailed, match="TP=2|all-reduce"):
        check_real_engine(MergedColumnParallelLinear, NoAllReduceRow)
    with pytest.raises(CheckFailed, match="TP=2"):
        check_real_engine(AllReduceAfterColumn, RowParallelLinear)
    with pytest.raises(CheckFailed, match="all-reduce，应是 9"):  # same tokens, one collective too many per layer
        check_real_engine(MergedColumnParallelLinear, ReduceTwiceRow)


def test_reference_mlp_is_the_llama_mlp():
    from autograder.lesson10.checks import _weights, reference_mlp
    from minivllm.model_executor.models.llama import LlamaMLP
    w = _weights()
    mlp = LlamaMLP(48, 40)
    mlp.gate_up_proj.weight.data.copy_(torch.cat([w["gate"], w["up"]]))
    mlp.down_proj.weight.data.copy_(w["down"])
    with torch.inference_mode():
        torch.testing.assert_close(mlp(w["x"]) + w["down_bias"], reference_mlp(w))
