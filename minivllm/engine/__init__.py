"""Messages between the frontend (AsyncLLM / LLM) and EngineCore: msgspec Structs, as in vLLM's v1/engine.

array_like + omit_defaults keep the msgpack encoding small; they cross a process boundary over ZMQ.
"""
from __future__ import annotations

import enum
import time

import msgspec

from minivllm.metrics.stats import SchedulerStats
from minivllm.sampling_params import SamplingParams


class FinishReason(enum.IntEnum):
    """Why a request ended, as the OpenAI API reports it; ERROR (an internal failure) becomes a 500."""

    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3
    REPETITION = 4  # vLLM's: repetition_detection ended it (stop_reason "repetition_detected")

    def __str__(self) -> str:
        return self.name.lower()


class EngineCoreRequestType(enum.Enum):
    """First frame of every frontend -> core message."""

    ADD = b"\x00"
    ABORT = b"\x01"
    UTILITY = b"\x03"


class EngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """A tokenized request as the core receives it."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None = None
    arrival_time: float = 0.0


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """New tokens for one request from one step."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[dict[int, float]] | None = None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    queue_time: float | None = None  # on a request's first output: arrival -> first scheduled, in seconds
    # The sampled token's rank at each new position (vLLM: LogprobsLists.sampled_token_ranks); with new_logprobs.
    new_logprob_ranks: list[int] | None = None
    # With the first token of a request that asked for prompt logprobs: per prompt position 1.., {token: logprob}
    # (the prompt token first, then the top prompt_logprobs) and the prompt token's rank.
    new_prompt_logprobs: list[dict[int, float]] | None = None
    new_prompt_logprob_ranks: list[int] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class UtilityOutput(msgspec.Struct, array_like=True, gc=False):
    """The answer to a UTILITY call (a method run on the core by name)."""

    call_id: int
    failure_message: str | None = None
    result: object = None


class EngineCoreOutputs(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """Everything one step produced, plus stats and utility answers."""

    outputs: list[EngineCoreOutput] = []
    scheduler_stats: SchedulerStats | None = None
    timestamp: float = 0.0
    utility_output: UtilityOutput | None = None
    finished_requests: set[str] | None = None

    def __post_init__(self) -> None:
        if self.timestamp == 0.0:
            self.timestamp = time.monotonic()
