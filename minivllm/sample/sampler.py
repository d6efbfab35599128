"""Sampler (vLLM: v1/sample/sampler.py): logprobs from raw logits, then greedy or random per row.

Random rows use the exponential-race trick (argmax p/q with q ~ Exp(1) is a draw from p), so a seeded
request draws from its own generator exactly once per token, whatever batch it shares.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from minivllm.sample.metadata import Penalties, SamplingMetadata


@dataclass
class SamplerOutput:
    """sampled_token_ids [n]; logprobs per row (top-k plus the sampled token) or None, and the sampled token's
    rank in each row (vLLM: LogprobsTensors.selected_token_ranks)."""

    sampled_token_ids: torch.Tensor
    logprobs: list[dict[int, float] | None] | None
    sampled_ranks: list[int] | None = None


def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    """Mask logits outside each row's top-k and nucleus top-p (k = 0 or p = 1 turns a filter off).

    Only top-p needs the sorted vocabulary; top-k alone takes the fast path without a sort."""
    if p is None:
        return logits if k is None else apply_top_k_only(logits, k)
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    vocab = logits.shape[-1]
    if k is not None:
        k_eff = torch.where(k > 0, k, torch.full_like(k, vocab)).clamp(max=vocab)
        kth = logits_sort.gather(1, (vocab - k_eff).unsqueeze(1).long())
        logits_sort.masked_fill_(logits_sort < kth, float("-inf"))
    if p is not None:
        probs_sort = logits_sort.softmax(dim=-1)
        cum = probs_sort.cumsum(dim=-1)
        mask = cum <= (1 - p.unsqueeze(1))
        mask[:, -1] = False  # always keep the most likely token
        logits_sort.masked_fill_(mask, float("-inf"))
    return logits.scatter(1, logits_idx, logits_sort)


def apply_top_k_only(logits: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Top-k by the k-th largest value from topk(max k), no full sort (vLLM: apply_top_k_only).

    Reads max(k) on the host: vLLM takes this path only where that sync is allowed (CPU without Triton) and
    sorts on CUDA; minivllm takes it everywhere (one sync per step with top-k). Rows with k off mask nothing."""
    vocab = logits.shape[-1]
    off = (k <= 0) | (k >= vocab)
    k_idx = torch.where(off, torch.ones_like(k), k).long() - 1
    kth = logits.topk(int(k_idx.max()) + 1, dim=-1).values.gather(1, k_idx.unsqueeze(1))
    kth.masked_fill_(off.unsqueeze(1), float("-inf"))
    return logits.masked_fill(logits < kth, float("-inf"))


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below min_p times the top token's."""
    probs = logits.softmax(dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    return logits.masked_fill(probs < threshold, float("-inf"))


def token_bin_counts_and_mask(tokens: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, how often each vocabulary id occurs in `tokens` (padding -1 counted in an extra bin, dropped)."""
    tokens = tokens.masked_fill(tokens < 0, vocab_size)
    counts = torch.zeros((tokens.shape[0], vocab_size + 1), dtype=torch.long, device=tokens.device)
    counts.scatter_add_(1, tokens, torch.ones_like(tokens))
    counts = counts[:, :vocab_size]
    return counts, counts > 0


def apply_penalties(logits: torch.Tensor, p: Penalties) -> torch.Tensor:
    """vLLM's apply_penalties (model_executor/layers/utils.py): the repetition penalty divides positive and
    multiplies negative logits of every token seen in the prompt or the output; then frequency (times the
    output count) and presence (once if in the output) are subtracted, as OpenAI defines them."""
    vocab = logits.shape[-1]
    _, prompt_mask = token_bin_counts_and_mask(p.prompt_token_ids, vocab)
    output_counts, output_mask = token_bin_counts_and_mask(p.output_token_ids, vocab)
    rep = torch.where(prompt_mask | output_mask, p.repetition.unsqueeze(1), 1.0)
    logits = torch.where(logits > 0, logits / rep, logits * rep)
    logits -= p.frequency.unsqueeze(1) * output_counts
    logits -= p.presence.unsqueeze(1) * output_mask
    return logits


def random_sample(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """One token per row from probs by vLLM's exponential race argmax(probs / q), q ~ Exp(1); a seeded row
    draws its q from its own generator.

    Unseeded rows on CPU take one uniform per row through the row's cumulative distribution instead, an exact
    sample too: torch's CPU exponential_ costs ~19 ns per element, a third of a shipped-model decode step at 96
    rows (vLLM torch.compiles its CPU race, compiled_random_sample, for the same reason). u is in (0, 1], so a
    zero-probability token is never picked.
    """
    num_rows = probs.shape[0]
    if len(generators) == num_rows:
        sampled = torch.empty(num_rows, dtype=torch.long, device=probs.device)
    elif probs.device.type == "cpu":
        cdf = probs.cumsum(dim=-1)
        u = 1.0 - torch.rand(num_rows, 1, dtype=cdf.dtype)
        sampled = torch.searchsorted(cdf, u * cdf[:, -1:]).squeeze(1).clamp_(max=probs.shape[1] - 1)
    else:
        sampled = probs.div(torch.empty_like(probs).exponential_()).argmax(dim=-1)
    for i, gen in generators.items():
        sampled[i] = probs[i].div(torch.empty_like(probs[i]).exponential_(generator=gen)).argmax()
    return sampled


def gather_logprobs(logprobs: torch.Tensor, sampled: torch.Tensor,
                    num_logprobs: list[int | None]) -> list[dict[int, float] | None]:
    """Per row: the top-n tokens' logprobs plus the sampled token's (dict in rank order)."""
    max_n = max(n for n in num_logprobs if n is not None)
    top_vals, top_ids = logprobs.topk(max_n, dim=-1) if max_n > 0 else (None, None)
    sampled_lp = logprobs.gather(1, sampled.unsqueeze(1)).squeeze(1).tolist()
    sampled_ids = sampled.tolist()
    out: list[dict[int, float] | None] = []
    for i, n in enumerate(num_logprobs):
        if n is None:
            out.append(None)
            continue
        d = {sampled_ids[i]: sampled_lp[i]}
        if n > 0:
            for tok, lp in zip(top_ids[i, :n].tolist(), top_vals[i, :n].tolist(), strict=True):
                d.setdefault(tok, lp)
        out.append(d)
    return out


def sampled_token_ranks(logprobs: torch.Tensor, sampled: torch.Tensor) -> list[int]:
    """Each sampled token's rank in its row: how many tokens are at least as likely (a >= count, as vLLM's
    Sampler counts it), so rank 1 is the most likely token."""
    return (logprobs >= logprobs.gather(1, sampled.unsqueeze(1))).sum(dim=-1).tolist()


def apply_bad_words(logits: torch.Tensor, bad_words: dict[int, tuple[list[list[int]], list[int]]]) -> None:
    """vLLM's apply_bad_words (v1/sample/ops/bad_words.py), in place: a row may not sample the last token of a
    bad word whose other tokens are the last tokens it generated (a one-token word is never sampled)."""
    for row, (words, past) in bad_words.items():
        for ids in words:
            prefix = ids[:-1]
            if len(prefix) <= len(past) and (not prefix or past[len(past) - len(prefix):] == prefix):
                logits[row, ids[-1]] = float("-inf")


def apply_logits_processors(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """What may change a greedy choice, in vLLM's Sampler order (apply_logits_processors): the allowed_token_ids
    mask, bad words, min_tokens and logit_bias, then the penalties. A new tensor when anything applies; the
    rejection sampler's draft and bonus rows go through it too, each with its own output history."""
    if md.allowed_token_ids or md.bad_words or md.min_tokens or md.logit_bias:
        logits = logits.clone()
    for row, ids in (md.allowed_token_ids or {}).items():
        allowed = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
        allowed[ids] = True
        logits[row].masked_fill_(~allowed, float("-inf"))
    if md.bad_words:
        apply_bad_words(logits, md.bad_words)
    for row, ids in (md.min_tokens or {}).items():  # vLLM's MinTokensLogitsProcessor: no stop/EOS before min_tokens
        logits[row, ids] = float("-inf")
    for row, bias in (md.logit_bias or {}).items():  # vLLM's LogitBiasLogitsProcessor
        logits[row, list(bias)] += torch.tensor(list(bias.values()), dtype=logits.dtype, device=logits.device)
    if md.penalties is not None:
        logits = apply_penalties(logits, md.penalties)
    return logits


class Sampler(nn.Module):
    """Greedy and random requests in one batch; optional logprobs of the raw distribution."""

    def forward(self, logits: torch.Tensor, md: SamplingMetadata) -> SamplerOutput:
        logits = logits.float()
        raw_logprobs = logits.log_softmax(dim=-1) if md.max_num_logprobs is not None else None
        logits = apply_logits_processors(logits, md)
        greedy = logits.argmax(dim=-1) if not md.all_random else None
        if md.all_greedy:
            sampled = greedy
        else:
            temp = md.temperature.clamp(min=1e-5).unsqueeze(1)
            x = logits / temp
            if md.min_p is not None:
                x = apply_min_p(x, md.min_p)
            x = apply_top_k_top_p(x, md.top_k, md.top_p)
            sampled = random_sample(x.softmax(dim=-1), md.generators)
            if greedy is not None:
                sampled = torch.where(md.temperature < 1e-5, greedy, sampled)
        logprobs = ranks = None
        if raw_logprobs is not None:
            logprobs = gather_logprobs(raw_logprobs, sampled, md.num_logprobs)
            ranks = sampled_token_ranks(raw_logprobs, sampled)
        return SamplerOutput(sampled, logprobs, ranks)
