"""RejectionSampler (vLLM: v1/sample/rejection_sampler.py): verify draft tokens in one forward pass.

A request with k draft tokens gets k + 1 logits rows from the target model: one per draft position plus
the bonus position. Greedy rows accept drafts while they equal the target's argmax. Random rows accept
draft x with probability min(1, p(x) / q(x)) and, at the first rejection, draw from the normalised
max(p - q, 0) instead, so every emitted token is distributed exactly as the target would sample it. If
every draft is accepted the bonus token, sampled from the last row, comes free. The n-gram proposer has
no draft distribution: q is one-hot on the draft, so acceptance is p(x) and recovery is p without x.

vLLM runs these loops as Triton kernels; here they are batched torch ops, so the same code serves CPU
and GPU. The output layout is vLLM's: [batch, max_spec_len + 1], PLACEHOLDER_TOKEN_ID (-1) after each
request's last emitted token.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from minivllm.sample.metadata import SamplingMetadata
from minivllm.sample.sampler import apply_min_p, apply_top_k_top_p, random_sample

PLACEHOLDER_TOKEN_ID = -1


@dataclass
class SpecDecodeMetadata:
    """Where each request's draft and bonus rows sit in the verified logits (vLLM's names)."""

    draft_token_ids: torch.Tensor        # [num_draft_tokens] flat, request by request
    num_draft_tokens: list[int]          # per request (0 for requests without a draft)
    cu_num_draft_tokens: torch.Tensor    # [batch] inclusive cumulative sum
    target_logits_indices: torch.Tensor  # [num_draft_tokens] rows of the logits verifying each draft
    bonus_logits_indices: torch.Tensor   # [batch] the row after each request's last draft
    max_spec_len: int

    @classmethod
    def make(cls, draft_token_ids: list[list[int]], device: torch.device | str = "cpu") -> SpecDecodeMetadata:
        """Logits laid out as each request's k drafts' rows then its bonus row, request after request."""
        num_draft = [len(d) for d in draft_token_ids]
        n = np.asarray(num_draft, dtype=np.int64)
        cu_rows = np.cumsum(n + 1)
        bonus = cu_rows - 1
        target = np.concatenate([np.arange(b - k, b) for b, k in zip(bonus, n, strict=True)]) if n.sum() \
            else np.zeros(0, dtype=np.int64)
        flat = [t for d in draft_token_ids for t in d]
        return cls(torch.tensor(flat, dtype=torch.int64, device=device), num_draft,
                   torch.from_numpy(np.cumsum(n)).to(device), torch.from_numpy(target).to(device),
                   torch.from_numpy(bonus).to(device), int(n.max()) if len(n) else 0)


def apply_sampling_constraints(logits: torch.Tensor, md: SamplingMetadata, rows: torch.Tensor) -> torch.Tensor:
    """Temperature, min-p, top-k, top-p of each row's request (rows[i] = the request of logits row i)."""
    if md.all_greedy:
        return logits
    temp = md.temperature[rows].clamp(min=1e-5).unsqueeze(1)
    x = logits / temp
    if md.min_p is not None:
        x = apply_min_p(x, md.min_p[rows])
    return apply_top_k_top_p(x, None if md.top_k is None else md.top_k[rows],
                             None if md.top_p is None else md.top_p[rows])


def generate_uniform_probs(num_draft_tokens: list[int], generators: dict[int, torch.Generator],
                           device: torch.device) -> torch.Tensor:
    """One uniform per draft token; a seeded request draws its own from its generator (float64: no 0.0)."""
    u = torch.rand(sum(num_draft_tokens), dtype=torch.float64, device=device)
    start = 0
    for i, n in enumerate(num_draft_tokens):
        if n and i in generators:
            u[start:start + n].uniform_(generator=generators[i])
        start += n
    return u


class RejectionSampler:
    """Draft verification for a batch where each request has its own number of drafts."""

    def __call__(self, md: SpecDecodeMetadata, draft_probs: torch.Tensor | None, logits: torch.Tensor,
                 sampling_metadata: SamplingMetadata) -> torch.Tensor:
        """logits: [sum(k_i + 1), V] target rows; draft_probs: [sum(k_i), V] or None (n-gram)."""
        batch = len(md.num_draft_tokens)
        device = logits.device
        logits = logits.float()
        num_draft = torch.tensor(md.num_draft_tokens, device=device)
        req_of_draft = torch.repeat_interleave(torch.arange(batch, device=device), num_draft)
        start = md.cu_num_draft_tokens - num_draft
        pos = torch.arange(len(req_of_draft), device=device) - start[req_of_draft]

        # The bonus token: the ordinary sampler's choice at each request's last row.
        bonus_logits = apply_sampling_constraints(logits[md.bonus_logits_indices], sampling_metadata,
                                                  torch.arange(batch, device=device))
        bonus = self._sample(bonus_logits, sampling_metadata, logits[md.bonus_logits_indices])

        target_logits = logits[md.target_logits_indices]
        draft = md.draft_token_ids
        accepted = torch.zeros(len(draft), dtype=torch.bool, device=device)
        recovered = draft.clone()
        if not sampling_metadata.all_random:
            accepted = target_logits.argmax(dim=-1) == draft
        if not sampling_metadata.all_greedy and len(draft):
            probs = apply_sampling_constraints(target_logits, sampling_metadata, req_of_draft).softmax(dim=-1)
            # A placeholder draft (-1, a padded slot) is always rejected; its recovered token is drawn
            # from p itself (n-gram) or max(p - q, 0), as vLLM's rejection_random_sample_kernel does.
            valid = draft >= 0
            idx = draft.clamp(min=0).unsqueeze(1)
            p_draft = probs.gather(1, idx).squeeze(1)
            if draft_probs is None:
                residual = probs.clone()
                residual[valid] = residual[valid].scatter(1, idx[valid], 0.0)
                q_draft = torch.ones_like(p_draft)
            else:
                q_draft = draft_probs.gather(1, idx).squeeze(1)
                residual = (probs - draft_probs).clamp(min=0.0)
            u = generate_uniform_probs(md.num_draft_tokens, sampling_metadata.generators, device)
            random_accept = valid & (q_draft > 0) & (p_draft.double() / q_draft.double() >= u)
            recovered = self._recover(residual, req_of_draft, md.num_draft_tokens, sampling_metadata, device)
            is_greedy = (sampling_metadata.temperature < 1e-5)[req_of_draft]
            accepted = torch.where(is_greedy, accepted, random_accept)
            recovered = torch.where(is_greedy, target_logits.argmax(dim=-1), recovered)
        elif len(draft):
            recovered = target_logits.argmax(dim=-1)

        # Emit drafts up to the first rejection, then the recovered token; the bonus if none was rejected.
        out = torch.full((batch, md.max_spec_len + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int64, device=device)
        num_accepted = torch.zeros(batch, dtype=torch.int64, device=device)
        if len(draft):
            live = self._rejections_before((~accepted).long(), start, req_of_draft) == 0
            tokens = torch.where(accepted, draft, recovered)
            out[req_of_draft[live], pos[live]] = tokens[live]
            num_accepted.index_add_(0, req_of_draft, (accepted & live).long())
        all_accepted = num_accepted == num_draft
        rows = torch.nonzero(all_accepted).squeeze(1)
        out[rows, num_draft[rows]] = bonus[rows]
        return out

    @staticmethod
    def _rejections_before(rej: torch.Tensor, start: torch.Tensor, req_of_draft: torch.Tensor) -> torch.Tensor:
        """For each draft, how many drafts of the same request before it were rejected."""
        cum = torch.cumsum(rej, 0) - rej
        return cum - cum[start[req_of_draft]]

    @staticmethod
    def _sample(logits: torch.Tensor, md: SamplingMetadata, raw: torch.Tensor) -> torch.Tensor:
        greedy = raw.argmax(dim=-1)
        if md.all_greedy:
            return greedy
        sampled = random_sample(logits.softmax(dim=-1), md.generators)
        return torch.where(md.temperature < 1e-5, greedy, sampled)

    @staticmethod
    def _recover(residual: torch.Tensor, req_of_draft: torch.Tensor, num_draft: list[int],
                 md: SamplingMetadata, device: torch.device) -> torch.Tensor:
        """A draw from each row's normalised residual by the exponential race (one noise row per request)."""
        q = torch.empty((len(num_draft), residual.shape[1]), device=device)
        q.exponential_()
        for i, gen in md.generators.items():
            if num_draft[i]:
                q[i].exponential_(generator=gen)
        return (residual / q[req_of_draft]).argmax(dim=-1)
