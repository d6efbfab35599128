"""N-gram proposer (vLLM: v1/spec_decode/ngram_proposer.py): prompt lookup, no draft model.

The last n tokens of a request are searched for earlier in its own tokens (prompt and output); the k
tokens that followed the match become the draft. vLLM's rule: the longest n in [min_n, max_n] wins, and
among matches of that length the earliest one. vLLM runs a KMP scan under numba; here each n is one
vectorised numpy comparison over all windows, which is the same rule without a compiler.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def find_ngram_draft(tokens: np.ndarray, min_n: int, max_n: int, k: int, max_model_len: int) -> np.ndarray:
    """The draft for one request: up to k tokens after the longest, earliest earlier n-gram match."""
    total = tokens.shape[0]
    k = min(k, max_model_len - total)
    if total < min_n or k <= 0:
        return tokens[:0]
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        # Windows that end before the last token: a match must be followed by at least one token.
        windows = sliding_window_view(tokens[:-1], n)
        hits = np.flatnonzero((windows == tokens[total - n:]).all(axis=1))
        if hits.size:
            start = int(hits[0]) + n
            return tokens[start:start + k]
    return tokens[:0]


class NgramProposer:
    """Drafts for a batch of requests from their own token history."""

    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int,
                 max_model_len: int) -> None:
        self.k = num_speculative_tokens
        self.min_n = prompt_lookup_min
        self.max_n = prompt_lookup_max
        self.max_model_len = max_model_len

    def propose(self, token_ids: list[np.ndarray]) -> list[list[int]]:
        """token_ids[i]: request i's tokens so far (no draft tokens); returns its draft (maybe empty)."""
        return [find_ngram_draft(t, self.min_n, self.max_n, self.k, self.max_model_len).tolist()
                for t in token_ids]
