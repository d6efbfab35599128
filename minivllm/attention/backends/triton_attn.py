"""Triton paged-attention backend (vLLM: v1/attention/backends/triton_attn.py).

forward() runs three kernels: triton_reshape_and_cache_flash writes the step's new K/V into the paged cache, the
decode kernel serves rows [0, num_decodes) (one query token each), and the chunked-prefill kernel serves
the prefill chunks after them, attending to their cached context plus themselves. On CPU the kernels
run under TRITON_INTERPRET=1 (slow; for tests and lessons).
"""
from __future__ import annotations

import torch

from minivllm.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionMetadata,
)
from minivllm.attention.ops.triton_decode_attention import paged_decode_attention
from minivllm.attention.ops.triton_prefill_attention import chunked_prefill_paged_attention
from minivllm.attention.ops.triton_reshape_and_cache_flash import triton_reshape_and_cache_flash


class TritonAttentionImpl(AttentionImpl):
    """One layer's attention through the Triton kernels; same contract as TorchAttentionImpl."""

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: AttentionMetadata) -> torch.Tensor:
        md = attn_metadata
        n = md.num_actual_tokens
        k_cache, v_cache = kv_cache[0], kv_cache[1]
        triton_reshape_and_cache_flash(key[:n], value[:n], k_cache, v_cache, md.slot_mapping[:n])

        query = query[:n]
        out = torch.empty_like(query)
        nd = md.num_decodes
        if nd:
            paged_decode_attention(out[:nd], query[:nd], k_cache, v_cache, md.block_table[:nd],
                                   md.seq_lens[:nd], self.scale)
        if md.num_reqs > nd:
            chunked_prefill_paged_attention(out, query, k_cache, v_cache, md.block_table, md.seq_lens,
                                            md.query_start_loc, md.max_query_len, self.scale,
                                            first_req=nd, num_reqs=md.num_reqs - nd)
        return out


class TritonAttentionBackend(AttentionBackend):
    """Paged attention in Triton: Triton on CUDA by default, the interpreter on CPU when asked."""

    name = "TRITON"
    cudagraph_support = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE  # the decode kernel reads lengths on device

    @staticmethod
    def get_impl_cls() -> type[AttentionImpl]:
        return TritonAttentionImpl
