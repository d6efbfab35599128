"""Vocabulary-parallel embedding and LM head (vLLM: model_executor/layers/vocab_parallel_embedding.py).

The vocabulary is padded to a multiple of 64 (vLLM's DEFAULT_VOCAB_PADDING_SIZE) and split into equal
contiguous ranges, one per rank. The embedding looks up the ids in its range, zeroes the rest and
all-reduces: every id is found on exactly one rank, so the sum is the full lookup. The LM head computes
the logits of its range; LogitsProcessor gathers them and drops the padding.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.distributed import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce,
)
from minivllm.model_executor.layers.linear import divide
from minivllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

DEFAULT_VOCAB_PADDING_SIZE = 64


def pad_vocab_size(vocab_size: int, pad_to: int = DEFAULT_VOCAB_PADDING_SIZE) -> int:
    return -(-vocab_size // pad_to) * pad_to


class VocabParallelEmbedding(nn.Module):
    """Embedding rows [vocab_start_index, vocab_end_index) of the padded vocabulary on this rank."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.org_vocab_size = num_embeddings
        self.num_embeddings_padded = pad_vocab_size(num_embeddings, DEFAULT_VOCAB_PADDING_SIZE * self.tp_size)
        self.num_embeddings_per_partition = divide(self.num_embeddings_padded, self.tp_size)
        self.vocab_start_index = self.tp_rank * self.num_embeddings_per_partition
        self.vocab_end_index = self.vocab_start_index + self.num_embeddings_per_partition
        self.weight = nn.Parameter(torch.zeros(self.num_embeddings_per_partition, embedding_dim),
                                   requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        """Copy this rank's rows of the [vocab, dim] checkpoint tensor; padding rows stay zero."""
        if loaded_weight.shape[0] != self.org_vocab_size or loaded_weight.shape[1:] != param.shape[1:]:
            raise ValueError(f"shape mismatch: checkpoint {tuple(loaded_weight.shape)}, expected "
                             f"({self.org_vocab_size}, {param.shape[1]})")
        n = max(0, min(self.vocab_end_index, self.org_vocab_size) - self.vocab_start_index)
        param.data[:n].copy_(loaded_weight.narrow(0, self.vocab_start_index, n))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        in_range = (input_ids >= self.vocab_start_index) & (input_ids < self.vocab_end_index)
        local_ids = (input_ids - self.vocab_start_index) * in_range
        out = F.embedding(local_ids, self.weight).masked_fill_(~in_range.unsqueeze(-1), 0)
        return tensor_model_parallel_all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection, vocab-parallel like the embedding (and tied to it when the model ties them)."""

    def tie_weights(self, embed_tokens: VocabParallelEmbedding) -> ParallelLMHead:
        self.weight = embed_tokens.weight
        return self

    def process_weights_after_loading(self) -> None:
        """On CPU the logits GEMM runs on a oneDNN-prepacked copy (vLLM keeps the weight: tied embeddings)."""
        if self.weight.device.type == "cpu":
            dispatch_cpu_unquantized_gemm(self)

    def forward(self, input_):
        raise RuntimeError("ParallelLMHead has no forward; LogitsProcessor computes the logits")
