"""SpecDecodingStats: draft verification counts (vLLM: v1/spec_decode/metrics.py)."""
from __future__ import annotations

import msgspec


class SpecDecodingStats(msgspec.Struct, omit_defaults=True):
    """Draft verification counts since start (vLLM: v1/spec_decode/metrics.py, cumulative here)."""

    num_spec_tokens: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = []
    num_draft_tokens_per_pos: list[int] = []

    @classmethod
    def new(cls, num_spec_tokens: int) -> SpecDecodingStats:
        return cls(num_spec_tokens, num_accepted_tokens_per_pos=[0] * num_spec_tokens,
                   num_draft_tokens_per_pos=[0] * num_spec_tokens)

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        for i in range(num_accepted_tokens):
            self.num_accepted_tokens_per_pos[i] += 1
        for i in range(num_draft_tokens):
            self.num_draft_tokens_per_pos[i] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per verified draft: the accepted ones plus the bonus or recovered one."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0
