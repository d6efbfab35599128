"""Logprob: one token's log-probability, its rank in the vocabulary and its text (vLLM: vllm/logprobs.py).

vLLM's Logprob is a dataclass of these three fields. minivllm's is a float with the same three attributes, so
code that reads a logprob as the number (sums, comparisons) keeps working, and `lp.logprob`, `lp.rank`,
`lp.decoded_token` read as in vLLM.
"""
from __future__ import annotations


class Logprob(float):
    """A token's logprob (the float itself, and `.logprob`), its `.rank` (1 = the most likely token) and its
    `.decoded_token` (the token's text on its own)."""

    def __new__(cls, logprob: float, rank: int | None = None, decoded_token: str | None = None) -> Logprob:
        obj = super().__new__(cls, logprob)
        obj.rank = rank
        obj.decoded_token = decoded_token
        return obj

    @property
    def logprob(self) -> float:
        return float(self)

    def __repr__(self) -> str:
        return f"Logprob(logprob={float(self)!r}, rank={self.rank!r}, decoded_token={self.decoded_token!r})"

    def __eq__(self, other) -> bool:
        if isinstance(other, Logprob):
            return (float(self), self.rank, self.decoded_token) == (float(other), other.rank, other.decoded_token)
        return float(self) == other

    __hash__ = float.__hash__

    def __reduce__(self):
        return (Logprob, (float(self), self.rank, self.decoded_token))


def entry_ranks(num_logprobs: int, num_entries: int, sampled_rank: int) -> list[int]:
    """The ranks of one position's logprob entries, in their order: the sampled token first, then the top-n
    (n = num_logprobs) in rank order. A sampled token among the top-n appears once, in front, and the top-n go
    on without it (n entries, not n + 1): vLLM's OutputProcessor builds the same dict from sampled + top-n."""
    top = list(range(1, num_logprobs + 1))
    if num_entries == num_logprobs + 1:
        return [sampled_rank] + top
    return ([sampled_rank] + [k for k in top if k != sampled_rank])[:num_entries]
