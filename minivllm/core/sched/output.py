"""SchedulerOutput: the plan of one step, the only message from Scheduler to the worker (vLLM: v1/core/sched/output.py).

New requests travel in full once; afterwards only deltas (new block ids, computed-token counts) do, and
the worker keeps its own copy of each request's state.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from minivllm.request import Request
from minivllm.sampling_params import SamplingParams


@dataclass
class NewRequestData:
    """A request the worker has not seen before (or must rebuild after preemption)."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    eos_token_id: int | None = None  # min_tokens masks it (vLLM folds it into all_stop_token_ids)

    @classmethod
    def from_request(cls, request: Request, block_ids: list[int]) -> NewRequestData:
        return cls(request.request_id, request.prompt_token_ids, request.sampling_params, block_ids,
                   request.num_computed_tokens, request.eos_token_id)


@dataclass
class CachedRequestData:
    """Deltas for requests the worker already holds, as parallel lists (one row per request)."""

    req_ids: list[str] = field(default_factory=list)
    resumed_from_preemption: list[bool] = field(default_factory=list)
    new_token_ids: list[list[int]] = field(default_factory=list)  # vLLM fills it only under pipeline parallelism
    new_block_ids: list[list[int] | None] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)


@dataclass
class SchedulerOutput:
    """What to compute this step: how many tokens per request, and where their KV goes."""

    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    num_common_prefix_blocks: int = 0
    finished_req_ids: set[str] = field(default_factory=set)
    preempted_req_ids: set[str] = field(default_factory=set)
    # Whether a grammar-constrained request samples this step: then the runner waits for the bitmask
    # (sample_tokens) instead of sampling right after the forward pass.
    has_structured_output_requests: bool = False
    step: int = 0

    @classmethod
    def make_empty(cls) -> SchedulerOutput:
        return cls([], CachedRequestData(), {}, 0)


@dataclass
class GrammarOutput:
    """The step's grammar bitmask, computed while the forward pass runs (EngineCore -> sample_tokens)."""

    structured_output_request_ids: list[str]  # one per bitmask row, in the scheduler's order
    grammar_bitmask: np.ndarray  # int32 [len(ids), ceil(vocab / 32)]
