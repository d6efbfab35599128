"""Logits from hidden states (vLLM: model_executor/layers/logits_processor.py)."""
from __future__ import annotations

import torch
from torch import nn

from minivllm.distributed import tensor_model_parallel_all_gather
from minivllm.model_executor.layers.utils import unquantized_gemm
from minivllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead


class LogitsProcessor(nn.Module):
    """This rank's vocab range of logits, gathered from all ranks (every rank samples the same token,
    as in vLLM, so each keeps its own copy of the batch in step), padding dropped, as float32."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size

    def forward(self, lm_head: ParallelLMHead, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = tensor_model_parallel_all_gather(unquantized_gemm(lm_head)(hidden_states, lm_head.weight, None))
        return logits[..., :self.vocab_size].float().contiguous()
