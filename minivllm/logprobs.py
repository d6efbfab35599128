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


def decoded_tokens(tokenizer, token_ids: list[int], context: list[int]) -> list[str]:
    """The texts of one position's logprob entries (alternatives at the same position), each decoded on its own;
    one that ends in U+FFFD (a byte of a character split across tokens) is redone from the tokens sampled before
    it, `context` (oldest first, the last 4 used), as vLLM's LogprobsProcessor._verify_tokens does: '' while the
    character is still incomplete, else the text this token completes."""
    texts = [tokenizer.decode([t]) for t in token_ids]
    return [_correct_decoded_token(tokenizer, t, context) if s.endswith("\ufffd") else s
            for t, s in zip(token_ids, texts, strict=True)]


def _correct_decoded_token(tokenizer, token_id: int, context: list[int]) -> str:
    """vLLM's _correct_decoded_token (v1/engine/logprobs.py): the shortest tail of the context with which the
    token decodes to a whole character; the text past the context's clean prefix (its tokens before the run of
    byte tokens that themselves decoded to U+FFFD)."""
    for num_ctx in range(1, min(len(context), 4) + 1):
        ctx = context[-num_ctx:]
        full = tokenizer.decode(ctx + [token_id])
        if full.endswith("\ufffd"):
            continue
        clean_end = len(ctx)
        for j in range(len(ctx) - 1, -1, -1):
            if not tokenizer.decode([ctx[j]]).endswith("\ufffd"):
                break
            clean_end = j
        clean_prefix = tokenizer.decode(ctx[:clean_end]) if clean_end > 0 else ""
        if full.startswith(clean_prefix):
            return full[len(clean_prefix):]
        common = 0  # tokenizer normalisation may change the prefix: cut at the longest common one
        for a, b in zip(clean_prefix, full, strict=False):
            if a != b:
                break
            common += 1
        return full[common:]
    return ""


def context_ids(entries: list[dict | None], max_context: int = 4) -> list[int]:
    """The tokens of the last max_context positions (each entry's first key: the sampled or prompt token)."""
    return [next(iter(e)) for e in entries[-max_context:] if e is not None]
