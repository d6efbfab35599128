"""The contract between GPUModelRunner and an attention kernel (vLLM: v1/attention/backend.py).

The runner lays the batch out as one flat varlen sequence of tokens, decodes first then prefills
(vLLM's reorder_batch), and describes it with an AttentionMetadata. A backend writes the new K/V into
the paged cache by slot_mapping, then attends each query token to its request's context through the
block table.
"""
from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch


@dataclass
class AttentionMetadata:
    """Per-step description of the flat batch, shared by every layer of one forward pass.

    Requests are ordered decodes first: rows [0, num_decodes) have one query token each, rows
    [num_decodes, num_reqs) are prefill chunks that may attend to cached context in paged blocks.
    """

    num_actual_tokens: int        # tokens in this step (the flat batch length)
    max_query_len: int            # longest query (1 when the step is all decodes)
    query_start_loc: torch.Tensor  # int32 [num_reqs + 1], prefix sums of query lengths
    max_seq_len: int              # longest context (cached + new)
    seq_lens: torch.Tensor        # int32 [num_reqs], context length after this step
    block_table: torch.Tensor     # int32 [num_reqs, max_blocks_per_req], physical block ids
    slot_mapping: torch.Tensor    # int64 [num_actual_tokens], block_id * block_size + offset; -1 = skip
    num_decodes: int = 0          # requests with exactly one query token, first in the batch
    num_decode_tokens: int = 0    # == num_decodes (no spec decode in the decode kernel)
    num_prefills: int = 0         # the rest
    query_start_loc_cpu: torch.Tensor | None = None  # host copies so kernels' launch math needs no sync
    seq_lens_cpu: torch.Tensor | None = None
    # What a backend derives from the above once per step and every layer reuses (vLLM: its per-backend
    # metadata builder). Whoever refills a persistent metadata in place (the CUDA-graph buffers) clears it.
    backend_cache: dict = field(default_factory=dict)

    @property
    def num_reqs(self) -> int:
        return self.seq_lens.shape[0]


class AttentionImpl(ABC):
    """One layer's attention computation over the paged KV cache."""

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int) -> None:
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        self.num_queries_per_kv = num_heads // num_kv_heads

    @abstractmethod
    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: AttentionMetadata) -> torch.Tensor:
        """query [T, H, D], key/value [T, Hkv, D], kv_cache [2, num_blocks, block_size, Hkv, D].

        Writes key/value into kv_cache at slot_mapping, then returns the attention output [T, H, D].
        """


class AttentionCGSupport(enum.Enum):
    """Which batches a backend can run inside a CUDA graph (vLLM: v1/attention/backend.py)."""

    NEVER = 0                        # reads host-side metadata (lengths as Python ints): eager only
    UNIFORM_SINGLE_TOKEN_DECODE = 1  # decode-only batches whose metadata lives in device tensors


class AttentionBackend(ABC):
    """A named factory for an AttentionImpl plus the KV cache layout it expects."""

    name: str = "abstract"
    cudagraph_support: AttentionCGSupport = AttentionCGSupport.NEVER

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int,
                           head_size: int) -> tuple[int, ...]:
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    @staticmethod
    @abstractmethod
    def get_impl_cls() -> type[AttentionImpl]:
        ...
