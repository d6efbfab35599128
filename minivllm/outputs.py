"""What the user gets back (vLLM: vllm/outputs.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

from minivllm.logprobs import Logprob


@dataclass
class CompletionOutput:
    """One generated sequence: text, token ids, finish reason and (optional) logprobs."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, Logprob]] | None = None  # per position: sampled token first, then the top-n
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """A request's prompt and its completion so far (final when finished is True)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    metrics: dict = field(default_factory=dict)
    # vLLM's prompt_logprobs: None for the first position, then {token: Logprob} (the prompt token first)
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
