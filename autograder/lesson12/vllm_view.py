"""Lesson 12's vLLM side: the pinned vLLM's IncrementalDetokenizer (vllm/v1/engine/detokenizer.py; the
FastIncrementalDetokenizer over tokenizers' DecodeStream) on the lesson's stop-string streams. Runs under .venv-vllm
only; built by IncrementalDetokenizer.from_new_request and driven as the OutputProcessor drives it (as
autograder/vllm_oracle/workloads.detokenize does; imported from nowhere there: the student release ships neither):
per step update(new_token_ids, stop_terminated) then get_next_output_text(finished, delta=True); the whole text at
the end.

Each case: the lesson's TEXT or MULTIBYTE after the prompt [BOS] (or a prompt ending inside a character), token ids
of the course model's byte-level BPE tokenizer, cut into the steps the lesson's checks use.
"""
from __future__ import annotations

import functools
from pathlib import Path

MODEL = Path(__file__).resolve().parents[2] / "data" / "models" / "shakespeare-llama"
TEXT = ("ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n"
        "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?")
MULTIBYTE = "你好，世界！😀 café — naïve 日本語"
BOS, EOS = 1, 2
UNEVEN = [1, 2, 1, 3, 5, 1, 1, 2]   # 1-5 tokens a step, as speculative decoding delivers them


@functools.cache
def _tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(MODEL / "tokenizer.json"))


def _encode(text: str) -> list[int]:
    return _tokenizer().encode(text, add_special_tokens=False).ids


def _steps(ids: list[int], sizes: list[int]) -> list[list[int]]:
    out, i, k = [], 0, 0
    while i < len(ids):
        n = sizes[k % len(sizes)]
        out.append(ids[i:i + n])
        i, k = i + n, k + 1
    return out


def _case(name, text, stop, sizes, include=False, skip=True, eos=False, prompt=(BOS,)):
    """`text` as the course model's token ids (or the ids themselves), cut into steps of `sizes` after `prompt`."""
    ids = (_encode(text) if isinstance(text, str) else list(text)) + ([EOS] if eos else [])
    return {"seed": name, "tokenizer": "shipped", "prompt": list(prompt), "steps": _steps(ids, sizes),
            "stop_terminated": eos, "params": {"stop": stop, "include_stop_str_in_output": include,
                                               "skip_special_tokens": skip, "min_tokens": 0}}


def _scenarios() -> dict:
    whole = [10_000]
    cases = [
        _case("no_stop", TEXT, None, UNEVEN),
        _case("stop_across_steps", TEXT, ["Juliet is"], UNEVEN),
        _case("two_stops", TEXT, ["wherefore", "yonder win"], [1]),
        _case("three_stops_longest_in_middle", TEXT, ["zebra", "Juliet is the sun", "qq"], [1]),
        _case("include_stop", TEXT, ["Juliet is"], UNEVEN, include=True),
        _case("stop_in_first_token", TEXT, ["ROMEO"], [3, 1, 1]),
        _case("stop_prefix_at_end", TEXT, ["Romeo?!"], UNEVEN),
        _case("long_stop_at_start", TEXT, ["ROMEO:\nBut soft"], [1]),
        _case("shorter_than_hold_back", TEXT[:9], ["ROMEO:\nBut soft, what"], [1]),
        _case("stop_last_char_alone", TEXT, ["window breaks?"], [1]),
        _case("whole_output_one_step", TEXT, ["Juliet is"], whole),
        _case("repeated_stop_one_step", TEXT, ["Romeo"], whole),
        _case("two_stops_one_step_include", TEXT, ["the sun", "the east"], whole, include=True),
        _case("text_after_stop_include", TEXT, ["Juliet is"], [7, 30, 40], include=True),
        _case("multibyte", MULTIBYTE, None, [1]),
        _case("multibyte_stop", MULTIBYTE + "。停下", ["停下"], UNEVEN),
        _case("eos_include_keep_special", TEXT, None, [1], include=True, skip=False, eos=True),
        _case("eos_skip_special", TEXT, None, [1], eos=True),
    ]
    ids = _encode(MULTIBYTE)
    # Not graded: the prompt ends inside "好" (2 of its 3 bytes); vLLM's primed stream repeats the prompt's text.
    split = _case("prompt_ends_inside_a_character", ids[5:], None, [1], prompt=ids[:5])
    return {c["seed"]: c for c in cases + [split]}


SCENARIOS = _scenarios()
GRADED = [name for name in SCENARIOS if name != "prompt_ends_inside_a_character"]


def vllm_answer(name: str, payload: dict) -> dict:
    """IncrementalDetokenizer.from_new_request (as autograder/vllm_oracle/vllm_side.py builds it), driven per step
    as the OutputProcessor drives it."""
    from vllm.sampling_params import SamplingParams
    from vllm.tokenizers import get_tokenizer
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.engine.detokenizer import IncrementalDetokenizer

    params = SamplingParams(max_tokens=64, **payload["params"])
    request = EngineCoreRequest(request_id="r", prompt_token_ids=list(payload["prompt"]), mm_features=None,
                                sampling_params=params, pooling_params=None, arrival_time=0.0, lora_request=None,
                                cache_salt=None, data_parallel_rank=None)
    detok = IncrementalDetokenizer.from_new_request(get_tokenizer(str(MODEL)), request)
    assert type(detok).__name__ == "FastIncrementalDetokenizer", type(detok).__name__
    events = []
    for k, ids in enumerate(payload["steps"]):
        last = k == len(payload["steps"]) - 1
        stop = detok.update(list(ids), payload["stop_terminated"] and last)
        events.append([stop, detok.get_next_output_text(last or stop is not None, True)])
        if stop is not None:
            break
    return {"seed": payload["seed"], "events": events, "text": detok.get_next_output_text(True, False)}
