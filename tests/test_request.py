"""Request, RequestStatus and SamplingParams (vLLM: v1/request.py, sampling_params.py)."""
from __future__ import annotations

import math
import time

import msgspec
import pytest

from minivllm.core.kv_cache_utils import NONE_HASH, get_request_block_hasher, hash_block_tokens
from minivllm.engine import EngineCoreRequest, FinishReason
from minivllm.request import Request, RequestStatus
from minivllm.sampling_params import SamplingParams


def make_request(prompt: list[int], block_size: int | None = None, **params) -> Request:
    hasher = get_request_block_hasher(block_size) if block_size else None
    return Request("r", prompt, SamplingParams(**params), eos_token_id=2, block_hasher=hasher)


# ---------------------------------------------------------------- RequestStatus
FINISHED = [RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED,
            RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_IGNORED,
            RequestStatus.FINISHED_ERROR, RequestStatus.FINISHED_REPETITION]


@pytest.mark.parametrize("status", list(RequestStatus))
def test_is_finished_exactly_for_finished_statuses(status):
    assert RequestStatus.is_finished(status) == (status in FINISHED)


@pytest.mark.parametrize("status, reason", [
    (RequestStatus.WAITING, None), (RequestStatus.RUNNING, None), (RequestStatus.PREEMPTED, None),
    (RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR, None),
    (RequestStatus.FINISHED_STOPPED, FinishReason.STOP),
    (RequestStatus.FINISHED_LENGTH_CAPPED, FinishReason.LENGTH),
    (RequestStatus.FINISHED_ABORTED, FinishReason.ABORT),
    (RequestStatus.FINISHED_IGNORED, FinishReason.LENGTH),
    (RequestStatus.FINISHED_ERROR, FinishReason.ERROR),
    (RequestStatus.FINISHED_REPETITION, FinishReason.REPETITION),
])
def test_finished_reason(status, reason):
    assert RequestStatus.get_finished_reason(status) == reason
    request = make_request([1, 2, 3])
    request.status = status
    assert request.get_finished_reason() == reason
    assert request.is_finished() == (reason is not None)


# ---------------------------------------------------------------- Request
def test_new_request_state():
    prompt = [5, 6, 7]
    request = make_request(prompt, max_tokens=4)
    prompt.append(8)  # the request keeps its own copy
    assert request.prompt_token_ids == [5, 6, 7]
    assert request.status == RequestStatus.WAITING
    assert request.num_prompt_tokens == request.num_tokens == 3
    assert request.num_computed_tokens == 0
    assert request.num_output_tokens == 0 and request.output_token_ids == []
    assert request.max_tokens == 4
    assert request.num_cached_tokens == -1
    assert not request.is_finished()


def test_append_output_tokens_int_and_list():
    request = make_request([1, 2, 3])
    request.append_output_token_ids(10)
    request.append_output_token_ids([11, 12])
    assert request.output_token_ids == [10, 11, 12]
    assert request.all_token_ids == [1, 2, 3, 10, 11, 12]
    assert request.num_tokens == 6 and request.num_output_tokens == 3
    assert request.prompt_token_ids == [1, 2, 3]
    request.spec_token_ids = [20, 21]
    assert request.num_tokens_with_spec == 8


def _chain(tokens: list[int], block_size: int) -> list:
    hashes, parent = [], None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash_block_tokens(hash, parent, tokens[start:start + block_size])
        hashes.append(parent)
    return hashes


def test_block_hashes_follow_new_tokens():
    request = make_request(list(range(10)), block_size=4)
    assert request.block_hashes == _chain(list(range(10)), 4)
    assert len(request.block_hashes) == 2
    request.append_output_token_ids(100)           # 11 tokens: still 2 full blocks
    assert len(request.block_hashes) == 2
    request.append_output_token_ids([101, 102])    # 13 tokens: 3 full blocks
    assert request.block_hashes == _chain(request.all_token_ids, 4)
    assert len(request.block_hashes) == 3


def test_block_hash_is_chained_to_the_prefix():
    """The same block of tokens after different prefixes hashes differently (kv_cache_utils docstring)."""
    a = make_request([1, 1, 1, 1, 9, 9, 9, 9], block_size=4)
    b = make_request([2, 2, 2, 2, 9, 9, 9, 9], block_size=4)
    assert a.block_hashes[1] != b.block_hashes[1]
    assert a.block_hashes[0] == hash_block_tokens(hash, None, [1, 1, 1, 1])
    assert hash_block_tokens(hash, None, [1, 1, 1, 1]) == hash_block_tokens(hash, NONE_HASH, [1, 1, 1, 1])


def test_from_engine_core_request():
    params = SamplingParams(max_tokens=3)
    before = time.time()
    request = Request.from_engine_core_request(EngineCoreRequest("x", [4, 5], params, eos_token_id=9))
    assert (request.request_id, request.prompt_token_ids, request.eos_token_id) == ("x", [4, 5], 9)
    assert request.sampling_params is params and request.max_tokens == 3
    assert request.arrival_time >= before  # 0.0 on the wire means "now"
    stamped = Request.from_engine_core_request(EngineCoreRequest("y", [4], params, arrival_time=12.5))
    assert stamped.arrival_time == 12.5


# ---------------------------------------------------------------- SamplingParams
@pytest.mark.parametrize("kwargs, field", [
    ({"n": 0}, "n"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": math.nan}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"min_p": 1.5}, "min_p"),
    ({"min_p": -0.1}, "min_p"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
    ({"logprobs": -1}, "logprobs"),
    ({"stop": [""]}, "stop"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"seed": "x"}, "seed"),
    ({"seed": 2**64}, "seed"),
    ({"temperature": 2.01}, "temperature"),
    ({"top_k": 1.5}, "top_k"),
    ({"max_tokens": True}, "max_tokens"),
    ({"stop_token_ids": [2**64]}, "stop_token_ids"),
])
def test_sampling_params_rejects_bad_values(kwargs, field):
    with pytest.raises(ValueError, match=field) as e:
        SamplingParams(**kwargs)
    # the server's 400 names it in `param`, except where vLLM's _verify_args names no parameter
    unnamed = kwargs in ({"n": 0}, {"top_k": -2}, {"min_p": 1.5}, {"min_p": -0.1}, {"min_tokens": -1},
                         {"min_tokens": 5, "max_tokens": 4})
    assert e.value.parameter == (None if unnamed else field)


def test_sampling_params_normalises():
    params = SamplingParams(stop="###", top_k=-1, temperature=0.0, stop_token_ids=[3, 4])
    assert params.stop == ["###"]
    assert params.top_k == 0
    assert params.greedy and not SamplingParams(temperature=0.7).greedy
    assert params.all_stop_token_ids == frozenset({3, 4})
    assert SamplingParams().all_stop_token_ids == frozenset()
    SamplingParams(max_tokens=None, min_tokens=100)  # no cap: any min_tokens is fine


def test_sampling_params_msgpack_round_trip_validates():
    params = SamplingParams(temperature=0.0, max_tokens=5, stop_token_ids=[7])
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(params), type=SamplingParams) == params
    with pytest.raises(msgspec.ValidationError, match="max_tokens"):
        msgspec.msgpack.decode(msgspec.msgpack.encode({"max_tokens": 0}), type=SamplingParams)
    with pytest.raises(msgspec.ValidationError, match="unknown field"):
        msgspec.msgpack.decode(msgspec.msgpack.encode({"max_token": 5}), type=SamplingParams)


def test_block_hasher_is_asked_on_every_append():
    """As vLLM's Request.append_output_token_ids: every append asks the hasher, which hashes only the blocks
    that filled (a student's hasher wrapped in functools.partial works the same)."""
    inner = get_request_block_hasher(4)
    calls: list[int] = []

    def counting(request):
        calls.append(request.num_tokens)
        return inner(request)

    request = Request("r", [1, 2, 3, 4, 5], SamplingParams(), block_hasher=counting)
    for token in range(6, 14):
        request.append_output_token_ids(token)
    assert calls == list(range(5, 14))  # at creation, then once per append
    assert request.block_hashes == _chain(list(range(1, 14)), 4)
