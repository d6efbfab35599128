"""The collectives the parallel layers call (vLLM: distributed/communication_op.py)."""
from __future__ import annotations

import torch

from minivllm.distributed.parallel_state import get_tp_group


def tensor_model_parallel_all_reduce(input_: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over the tensor-parallel ranks (RowParallelLinear, VocabParallelEmbedding)."""
    return get_tp_group().all_reduce(input_)


def tensor_model_parallel_all_gather(input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's tensor along dim, in rank order (ParallelLMHead's logits)."""
    return get_tp_group().all_gather(input_, dim)
