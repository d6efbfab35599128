"""The attention layer a model calls (vLLM: vllm/attention/layer.py).

Models see flat [T, heads * head_size] projections; the backend's AttentionImpl sees [T, heads,
head_size] plus this layer's slice of the paged KV cache. This module is the seam between the two.
"""
from __future__ import annotations

import torch
from torch import nn

from minivllm.attention.backend import AttentionBackend, AttentionMetadata


class Attention(nn.Module):
    """One layer's attention: reshape q/k/v to heads, write K/V into the cache, attend through the impl."""

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 attn_backend: type[AttentionBackend]) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_size = head_size
        self.num_kv_heads = num_kv_heads
        self.attn_backend = attn_backend
        self.impl = attn_backend.get_impl_cls()(num_heads, head_size, scale, num_kv_heads)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: AttentionMetadata | None) -> torch.Tensor:
        """query [T, H*D], key/value [T, Hkv*D] -> [T, H*D]; rows past num_actual_tokens come back zero."""
        num_tokens = query.shape[0]
        if attn_metadata is None:  # a dummy/profiling run without a KV cache, as in vLLM
            return torch.zeros_like(query)
        out = self.impl.forward(query.view(num_tokens, self.num_heads, self.head_size),
                                key.view(num_tokens, self.num_kv_heads, self.head_size),
                                value.view(num_tokens, self.num_kv_heads, self.head_size),
                                kv_cache, attn_metadata)
        out = out.reshape(out.shape[0], self.num_heads * self.head_size)
        if out.shape[0] < num_tokens:  # padded batch (CUDA graphs): the impl computed real tokens only
            out = torch.cat([out, out.new_zeros(num_tokens - out.shape[0], out.shape[1])])
        return out
