"""Rotary position embeddings (vLLM: model_executor/layers/rotary_embedding.py).

Neox style (HF's rotate_half): the head is split into two halves rather than interleaved pairs. The
inverse frequencies follow transformers' modeling_rope_utils exactly, so logits match HF bit for bit.
"""
from __future__ import annotations

import math

import torch
from torch import nn


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryEmbedding(nn.Module):
    """Applies RoPE to flat q/k [T, heads*head_size] at the given positions, from a cos/sin cache."""

    def __init__(self, head_size: int, max_position: int, base: float) -> None:
        super().__init__()
        self.head_size = head_size
        self.max_position = max_position
        self.base = base
        freqs = torch.arange(max_position, dtype=torch.float32)[:, None] * self._compute_inv_freq()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_cache", emb.cos(), persistent=False)  # float32 [max_position, head_size]
        self.register_buffer("sin_cache", emb.sin(), persistent=False)

    def _compute_inv_freq(self) -> torch.Tensor:
        dim = self.head_size
        return 1.0 / (self.base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))

    def forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        cos = self.cos_cache[positions].to(query.dtype)[:, None, :]  # [T, 1, D], cast like HF
        sin = self.sin_cache[positions].to(query.dtype)[:, None, :]
        q = query.view(query.shape[0], -1, self.head_size)
        k = key.view(key.shape[0], -1, self.head_size)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        return q.reshape(query.shape), k.reshape(key.shape)


class LinearScalingRotaryEmbedding(RotaryEmbedding):
    """Position interpolation: every frequency divided by `factor`."""

    def __init__(self, head_size: int, max_position: int, base: float, factor: float) -> None:
        self.factor = factor
        super().__init__(head_size, max_position, base)

    def _compute_inv_freq(self) -> torch.Tensor:
        return super()._compute_inv_freq() / self.factor


class Llama3RotaryEmbedding(RotaryEmbedding):
    """Llama 3.1 scaling: long wavelengths divided by `factor`, short kept, the band between smoothed."""

    def __init__(self, head_size: int, max_position: int, base: float, factor: float, low_freq_factor: float,
                 high_freq_factor: float, original_max_position: int) -> None:
        self.factor, self.low_freq_factor, self.high_freq_factor = factor, low_freq_factor, high_freq_factor
        self.original_max_position = original_max_position
        super().__init__(head_size, max_position, base)

    def _compute_inv_freq(self) -> torch.Tensor:
        inv_freq = super()._compute_inv_freq()
        low_freq_wavelen = self.original_max_position / self.low_freq_factor
        high_freq_wavelen = self.original_max_position / self.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / self.factor, inv_freq)
        smooth = ((self.original_max_position / wavelen - self.low_freq_factor)
                  / (self.high_freq_factor - self.low_freq_factor))
        smoothed = (1 - smooth) * inv_freq_llama / self.factor + smooth * inv_freq_llama
        is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(is_medium, smoothed, inv_freq_llama)


def get_rope(head_size: int, max_position: int, base: float, rope_scaling: dict | None = None) -> RotaryEmbedding:
    """The rotary embedding for an HF rope config: rope_scaling None/"default", "linear" or "llama3"."""
    rope_type = (rope_scaling or {}).get("rope_type", (rope_scaling or {}).get("type", "default"))
    if rope_type == "default":
        return RotaryEmbedding(head_size, max_position, base)
    if rope_type == "linear":
        return LinearScalingRotaryEmbedding(head_size, max_position, base, rope_scaling["factor"])
    if rope_type == "llama3":
        return Llama3RotaryEmbedding(
            head_size, max_position, base, rope_scaling["factor"], rope_scaling["low_freq_factor"],
            rope_scaling["high_freq_factor"],
            rope_scaling.get("original_max_position_embeddings", max_position))
    raise ValueError(f"unsupported rope_type {rope_type!r}; minivllm supports default, linear and llama3")
