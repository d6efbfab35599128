"""ModelRunnerOutput: the only message from the worker back to the scheduler (vLLM: v1/outputs.py).

Here, not at minivllm/outputs.py, because with v1/ dropped that path is vllm/outputs.py's (RequestOutput)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ModelRunnerOutput:
    """Sampled tokens per request of one step; a partial prefill gets an empty list."""

    req_ids: list[str]
    req_id_to_index: dict[str, int]
    sampled_token_ids: list[list[int]]
    logprobs: list[list[dict[int, float]] | None] | None = None  # per request, one dict per token
    logprob_ranks: list[list[int] | None] | None = None  # per request, the sampled token's rank per token
    num_nans_in_logits: dict[str, int] = field(default_factory=dict)
    # req_id -> (per prompt position 1.., {token: logprob} with the prompt token first; the prompt token's rank),
    # sent once, with the request's first sampled token
    prompt_logprobs: dict[str, tuple[list[dict[int, float]], list[int]]] = field(default_factory=dict)


EMPTY_MODEL_RUNNER_OUTPUT = ModelRunnerOutput([], {}, [])
