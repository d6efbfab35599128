"""SamplingMetadata: the batch's sampling parameters as tensors, built by the runner each step."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SamplingMetadata:
    """Row i describes request i of the logits passed to the Sampler."""

    temperature: torch.Tensor | None   # [n] float32; None when all greedy
    all_greedy: bool
    all_random: bool
    top_p: torch.Tensor | None         # [n] or None when no request uses it
    top_k: torch.Tensor | None         # [n] int64 (0 = off) or None
    min_p: torch.Tensor | None         # [n] or None
    generators: dict[int, torch.Generator]  # row -> per-request seeded generator
    max_num_logprobs: int | None       # largest logprobs asked for in the batch, None if none
    num_logprobs: list[int | None] | None = None
    min_tokens: dict[int, list[int]] | None = None  # row -> stop/EOS ids masked (still below min_tokens)
