"""SamplingMetadata: the batch's sampling parameters as tensors, built by the runner each step."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Penalties:
    """The rows' presence/frequency/repetition penalties and their prompt and output token ids, padded
    with -1 (vLLM pads with vocab_size; the Sampler maps -1 there)."""

    presence: torch.Tensor       # [n] float32
    frequency: torch.Tensor      # [n] float32
    repetition: torch.Tensor     # [n] float32
    prompt_token_ids: torch.Tensor  # [n, max prompt len] int64
    output_token_ids: torch.Tensor  # [n, max output len] int64


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
    penalties: Penalties | None = None
    logit_bias: dict[int, dict[int, float]] | None = None  # row -> token id -> bias added to its logit
    allowed_token_ids: dict[int, list[int]] | None = None  # row -> the only ids it may sample
    # row -> (its bad words' token ids, its output tokens so far): refreshed every step, as min_tokens and penalties
    bad_words: dict[int, tuple[list[list[int]], list[int]]] | None = None
