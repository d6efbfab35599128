"""Request fields minivllm took over from the pinned vLLM for the field cases of the server corpus (field_cases):
repetition detection (vllm/v1/core/sched/utils.py check_sequence_repetition), the render route's token offsets
(vllm/renderers/base.py _tokenize_prompt) and the OpenAI models' typing of the fields vLLM types."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from minivllm.entrypoints.openai.protocol import (
    BatchChatCompletionRequest,
    ChatCompletionRequest,
    CompletionRequest,
)
from minivllm.entrypoints.scale_out import token_offsets
from minivllm.exceptions import VLLMValidationError
from minivllm.sampling_params import RepetitionDetectionParams, SamplingParams
from minivllm.tokenizer import get_tokenizer

MODEL = "data/models/shakespeare-llama"


def repeats_by_index(token_ids, max_size, min_size, min_count) -> bool:
    """The rule written position by position (token -n against the same offset m patterns back, the positions
    vLLM's _has_repeating_pattern compares), against minivllm's slice-by-slice RepetitionDetectionParams.repeats."""
    min_size = max(min_size, 1)
    if max_size <= 0 or min_count < 2 or min_size > max_size:
        return False
    for size in range(min_size, max_size + 1):
        if size * min_count > len(token_ids):
            return False
        if all(token_ids[-(size * m + n)] == token_ids[-n] for n in range(1, size + 1) for m in range(1, min_count)):
            return True
    return False


@pytest.mark.parametrize("tokens", [[1, 2, 1, 2], [5, 5], [1, 2, 3, 1, 2, 3, 1, 2, 3], [1, 2, 3, 4], [7],
                                    [9, 1, 2, 1, 2, 1], [4, 4, 4, 4, 4, 4], [1, 2, 3, 2, 3, 2, 3]])
@pytest.mark.parametrize("params", [(2, 0, 2), (3, 2, 3), (1, 1, 2), (4, 0, 2), (0, 0, 0), (6, 2, 2)])
def test_repetition_detection_matches_vllm(tokens, params):
    max_size, min_size, min_count = params
    p = RepetitionDetectionParams(max_pattern_size=max_size, min_pattern_size=min_size, min_count=min_count)
    assert p.repeats(tokens) == repeats_by_index(tokens, max_size, min_size, min_count)


@pytest.mark.parametrize("kw", [{"max_pattern_size": 2, "min_count": 1}, {"min_pattern_size": 3, "max_pattern_size": 2},
                                {"max_pattern_size": -1}])
def test_repetition_detection_refuses_what_vllm_refuses(kw):
    with pytest.raises(VLLMValidationError):
        RepetitionDetectionParams(**kw)
    with pytest.raises(ValidationError):  # at parse time, as vLLM's dataclass field does
        CompletionRequest.model_validate({"prompt": "x", "repetition_detection": kw})


def test_request_fields_reach_sampling_params():
    req = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}], "stream_interval": 3,
                                                "repetition_detection": {"max_pattern_size": 2, "min_count": 2}})
    sp = req.to_sampling_params(8, None)
    assert sp.stream_interval == 3 and sp.repetition_detection == RepetitionDetectionParams(2, 0, 2)
    with pytest.raises(VLLMValidationError):
        SamplingParams(stream_interval=0)


@pytest.mark.parametrize("body", [{"use_beam_search": "maybe"}, {"vllm_xargs": {"a": {"b": 1}}}, {"request_id": 5},
                                  {"documents": [{"title": 5}]}, {"spaces_between_special_tokens": 3},
                                  {"top_logprobs": -2, "logprobs": True}])
def test_vllm_typed_fields_are_checked(body):
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}]} | body)


def test_batch_request_types_vllm_batch_fields():
    conv = [[{"role": "user", "content": "x"}]]
    with pytest.raises(ValidationError):
        BatchChatCompletionRequest.model_validate({"messages": conv, "tool_choice": "auto"})
    with pytest.raises(ValidationError):
        BatchChatCompletionRequest.model_validate({"messages": conv, "best_of": "x"})
    req = BatchChatCompletionRequest.model_validate({"messages": conv, "length_penalty": None})
    assert req.conversations()[0].length_penalty == 1.0  # None is left out, as vLLM's exclude_none dump does


def test_token_offsets_are_the_fast_tokenizers():
    tok = get_tokenizer(MODEL)
    ids = tok.encode("ROMEO:")
    assert token_offsets(tok, "ROMEO:", ids, True) == [[0, 0], [0, 5], [5, 6]]  # vLLM's render answer
    assert token_offsets(tok, ids, ids, True) is None  # a prompt of token ids has no text
    cut = [ids[0], ids[-1]]  # truncated to 2: the BOS and the last token
    assert token_offsets(tok, "ROMEO:", cut, True) == [[0, 0], [5, 6]]
