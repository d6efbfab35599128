"""Lesson 12's grader: the solution earns 4/4 code points and the unfilled release 0 without crashing (one
shared real server for the module); the plug restores the frontend; a wrong abort path is caught from the
EngineCore's own record, with the same verdicts when the engine is slowed down or the request finishes at once;
the unit-level mutants lose the output-processor part. tests/test_mutants.py grades every mutant end to end."""
import asyncio
import contextlib
import json
import threading

import pytest

from autograder.common import REPO, run_part
from autograder.lesson12 import LESSON, check_source_map, checks, close_server, plugged
from autograder.mutation import mutant_source, mutants

NAMES = ("StreamingDetokenizer", "abort_stream")


def mutant_ns(name, solution_ns):
    """The mutant's cell run after the solution's setup (it needs the setup cell's DecodeStream)."""
    ns = dict(solution_ns)
    exec(mutant_source("lesson12", name), ns)
    return ns


@pytest.fixture(scope="module")
def solution_ns(solution_ns):
    """conftest's, and the lesson's shared server closed after the module."""
    yield solution_ns
    close_server()


@pytest.mark.parametrize("name", ["decode_each_token_alone", "text_after_stop_kept", "no_hold_back",
                                  "stream_not_primed", "hold_back_lexicographic_max", "include_stop_ignored",
                                  "stream_primed_with_last_token", "stream_primed_with_last_two_tokens",
                                  "stream_primed_without_first_token"])
def test_mutant_loses_the_output_processor_part(name, solution_ns):
    result = run_part(LESSON.part("l12_main_path"), mutant_ns(name, solution_ns))
    assert result.score == 0 and "NameError" not in result.message, result.message


def test_prompt_ending_inside_a_character(solution_ns):
    """vLLM's primed stream repeats the prompt's text before the completed character; a stream that stepped through
    the prompt gives the character alone: both pass. A stream primed with the last prompt token shows U+FFFD."""
    cls, abort = (solution_ns[n] for n in NAMES)

    class SteppedThroughPrompt(cls):
        def __init__(self, tokenizer, params, prompt_token_ids):
            super().__init__(tokenizer, params, [])
            for t in prompt_token_ids:
                self.stream.step(self.rust_tokenizer, t)

    for cut in (5, 21):
        checks.expect_split_prompt(cls, abort, cut, "vLLM")
        checks.expect_split_prompt(SteppedThroughPrompt, abort, cut, "stepped")
    ns = mutant_ns("stream_primed_with_last_token", solution_ns)
    with pytest.raises(AssertionError, match="U\\+FFFD"):
        checks.expect_split_prompt(ns["StreamingDetokenizer"], abort, 21, "last token")


@pytest.mark.slow
def test_plug_restores_and_a_leak_is_caught(solution_ns):
    import minivllm.engine.output_processor as op
    from minivllm.engine.async_llm import AsyncLLM
    before = (op.IncrementalDetokenizer, AsyncLLM._abort)
    with pytest.raises(RuntimeError), plugged(*(solution_ns[n] for n in NAMES)):
        assert op.IncrementalDetokenizer is solution_ns["StreamingDetokenizer"]
        raise RuntimeError("inside")
    assert (op.IncrementalDetokenizer, AsyncLLM._abort) == before
    result = run_part(LESSON.part("l12_boundary"), mutant_ns("disconnect_not_sent_to_core", solution_ns))
    assert result.score == 0 and "EngineCore" in result.message and "length" in result.message, result.message


@contextlib.contextmanager
def slowed_core(seconds_per_step: float):
    """The EngineCore sleeps between steps: a utility call (sleep_for_test) is kept queued on its input socket."""
    srv, stop = checks.server(), threading.Event()

    def pump() -> None:
        while not stop.is_set():
            call = srv.engine.engine_core.call_utility_async("sleep_for_test", seconds_per_step)
            asyncio.run_coroutine_threadsafe(call, srv.loop).result(60)
    t = threading.Thread(target=pump, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(60)


@pytest.mark.slow
@pytest.mark.parametrize("speed", ["slowed", "sped_up"])
def test_disconnect_verdict_does_not_depend_on_engine_speed(speed, solution_ns, monkeypatch):
    """The old check waited 3 s: a request that finished inside the window let an abort that never reached the core
    pass, and a slow machine failed a right one. Now the core's own record decides: slowed (the core sleeps 5 ms
    between steps) or sped up (the request is so short that it is done almost at once), the scores are the same."""
    if speed == "sped_up":
        monkeypatch.setattr(checks, "DISCONNECT_MAX_TOKENS", 128)
    part = LESSON.part("l12_boundary")
    answers = {"solution": solution_ns, "mutant": mutant_ns("disconnect_not_sent_to_core", solution_ns)}
    with slowed_core(0.005) if speed == "slowed" else contextlib.nullcontext():
        scores = {name: run_part(part, ns) for name, ns in answers.items()}
    assert {k: r.score for k, r in scores.items()} == {"solution": 1, "mutant": 0}, {k: r.message for k, r in scores.items()}


def test_vllm_comparison_accepts_both_primings_and_catches_a_boundary_mistake(solution_ns):
    """check_against_vllm (the pinned vLLM's recorded IncrementalDetokenizer, 18 streams) passes the solution and a
    stream that stepped through the prompt, and catches a stop search that skips a character; the recorded
    split-prompt stream shows vLLM repeating the prompt's text."""
    from autograder.vllm_oracle import recorded

    cls = solution_ns["StreamingDetokenizer"]

    class SteppedThroughPrompt(cls):
        def __init__(self, tokenizer, params, prompt_token_ids):
            super().__init__(tokenizer, params, [])
            for t in prompt_token_ids:
                self.stream.step(self.rust_tokenizer, t)

    checks.check_against_vllm(cls)
    checks.check_against_vllm(SteppedThroughPrompt)
    with pytest.raises(AssertionError, match="IncrementalDetokenizer"):
        checks.check_against_vllm(mutant_ns("search_skips_one_char", solution_ns)["StreamingDetokenizer"])
    assert recorded("lesson12", "prompt_ends_inside_a_character")["events"][0] == [None, "你好"]


def test_source_map_rejects_swaps(solution_ns):
    good = solution_ns["SOURCE_MAP"]
    check_source_map({k: f"`{v}`" for k, v in good.items()})
    with pytest.raises(AssertionError):
        check_source_map(dict(good, prefix_reset=good["fast_switch"], fast_switch=good["prefix_reset"]))


def test_student_copy_shows_the_blanks():
    cells = {c["id"]: "".join(c["source"])
             for c in json.loads((REPO / "notebooks/lesson12/lesson12.ipynb").read_text(encoding="utf-8"))["cells"]}
    code = cells["l12_streaming_detokenizer"]
    assert code.count("______") == 6 and "### BLANK" not in code
    assert set(mutants("lesson12")) >= {"no_hold_back", "decode_each_token_alone", "disconnect_not_sent_to_core",
                                         "final_delta_twice", "text_after_stop_kept", "stream_not_primed"}


