"""Request: one request's token state inside EngineCore (vLLM: v1/request.py).

The Scheduler is the only writer of status and num_computed_tokens; output tokens are appended only by
Scheduler.update_from_output. Block hashes of full blocks are kept current as tokens arrive, so prefix
caching never rehashes a prompt.
"""
from __future__ import annotations

import enum
import time
from collections.abc import Callable

from minivllm.engine import EngineCoreRequest, FinishReason
from minivllm.sampling_params import SamplingParams
from minivllm.structured_output.request import StructuredOutputRequest


class RequestStatus(enum.IntEnum):
    """Lifecycle of a request; every status after PREEMPTED is finished."""

    WAITING = enum.auto()
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = enum.auto()  # its grammar is still compiling
    WAITING_FOR_FSM = WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR  # the name in older vLLM
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()  # e.g. its grammar failed to compile
    FINISHED_REPETITION = enum.auto()  # its output repeats an N-gram (sampling_params.repetition_detection)

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED

    @staticmethod
    def get_finished_reason(status: RequestStatus) -> FinishReason | None:
        return _FINISHED_REASON_MAP.get(status)


_FINISHED_REASON_MAP = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH_CAPPED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_IGNORED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
    RequestStatus.FINISHED_REPETITION: FinishReason.REPETITION,
}


class Request:
    """Per-request token state: prompt, outputs, how much has KV computed, and full-block hashes."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], sampling_params: SamplingParams,
                 eos_token_id: int | None = None, arrival_time: float | None = None,
                 block_hasher: Callable[[Request], list] | None = None) -> None:
        self.request_id = request_id
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.arrival_time = arrival_time if arrival_time is not None else time.time()
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        self.max_tokens = sampling_params.max_tokens
        self.structured_output_request = StructuredOutputRequest.from_sampling_params(sampling_params)
        if self.structured_output_request is not None:
            self.status = RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
        self.prompt_token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        # Plain lists, not properties: they are read per request per step on the scheduler's hot path.
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(self.prompt_token_ids)
        self.num_computed_tokens = 0
        # Async scheduling: tokens scheduled to be sampled by steps still in flight (their ids unknown yet).
        self.num_output_placeholders = 0
        self.num_cached_tokens = -1
        self.num_preemptions = 0
        self.spec_token_ids: list[int] = []
        self.block_hashes: list = []
        self.set_block_hasher(block_hasher)

    @classmethod
    def from_engine_core_request(cls, request: EngineCoreRequest,
                                 block_hasher: Callable[[Request], list] | None = None) -> Request:
        return cls(request.request_id, request.prompt_token_ids, request.sampling_params,
                   request.eos_token_id, request.arrival_time or None, block_hasher)

    def set_block_hasher(self, block_hasher: Callable[[Request], list] | None) -> None:
        """Install the function that keeps block_hashes current, and hash the blocks already full."""
        self._block_hasher = block_hasher
        self.block_hashes = []  # the hasher continues from block_hashes: start from nothing
        if block_hasher is not None:
            self.block_hashes = block_hasher(self)

    def append_output_token_ids(self, token_ids: int | list[int]) -> None:
        if isinstance(token_ids, int):
            self.output_token_ids.append(token_ids)
            self.all_token_ids.append(token_ids)
        else:
            self.output_token_ids.extend(token_ids)
            self.all_token_ids.extend(token_ids)
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))

    @property
    def use_structured_output(self) -> bool:
        return self.structured_output_request is not None

    @property
    def skip_reading_prefix_cache(self) -> bool:
        """vLLM skips prefix-cache hits for a request that wants prompt logprobs: every prompt position's
        logits must be computed."""
        return self.sampling_params.prompt_logprobs is not None

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self.all_token_ids) + len(self.spec_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def get_finished_reason(self) -> FinishReason | None:
        return RequestStatus.get_finished_reason(self.status)

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.status.name}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens})")
