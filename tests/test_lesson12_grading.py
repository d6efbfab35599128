"""Lesson 12's grader: the solution earns 4/4 code points and the unfilled release 0 without crashing (one
shared real server for the module); the plug restores the frontend; a wrong abort path is caught as a KV leak
read from /metrics; the unit-level mutants lose the output-processor part. tests/test_mutants.py grades every
mutant end to end."""
import json

import pytest
from grading_flow import grade_three_students

from autograder.common import REPO, run_part, student_namespace
from autograder.lesson12 import LESSON, check_source_map, close_server, plugged
from autograder.mutation import mutant_source, mutants

CODE_PARTS = ("l12_main_path", "l12_real_server", "l12_boundary", "l12_source_map")
NAMES = ("StreamingDetokenizer", "abort_stream")


def mutant_ns(name, solution_ns):
    """The mutant's cell run after the solution's setup (it needs the setup cell's DecodeStream)."""
    ns = dict(solution_ns)
    exec(mutant_source("lesson12", name), ns)
    return ns


def code_scores(namespace, parts=CODE_PARTS):
    return {p.grade_id: run_part(p, namespace).score for p in LESSON.parts if p.grade_id in parts}


@pytest.fixture(scope="module")
def solution_ns():
    ns, errors = student_namespace(REPO / "solutions/lesson12/lesson12.ipynb")
    assert not errors
    yield ns
    close_server()


def test_unfilled_release_scores_zero_without_crashing():
    ns, _ = student_namespace(REPO / "notebooks/lesson12/lesson12.ipynb")
    assert code_scores(ns) == dict.fromkeys(CODE_PARTS, 0)


@pytest.mark.parametrize("name", ["decode_each_token_alone", "text_after_stop_kept", "no_hold_back"])
def test_mutant_loses_the_output_processor_part(name, solution_ns):
    result = run_part(LESSON.part("l12_main_path"), mutant_ns(name, solution_ns))
    assert result.score == 0 and "NameError" not in result.message, result.message


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
    assert result.score == 0 and "KV" in result.message


def test_source_map_rejects_swaps(solution_ns):
    good = solution_ns["SOURCE_MAP"]
    check_source_map({k: f"`{v}`" for k, v in good.items()})
    with pytest.raises(AssertionError):
        check_source_map(dict(good, mailbox=good["output_loop"], output_loop=good["mailbox"]))


def test_student_copy_shows_the_blanks():
    cells = {c["id"]: "".join(c["source"])
             for c in json.loads((REPO / "notebooks/lesson12/lesson12.ipynb").read_text(encoding="utf-8"))["cells"]}
    code = cells["l12_streaming_detokenizer"]
    assert code.count("______") == 7 and "### BLANK" not in code
    assert set(mutants("lesson12")) >= {"no_hold_back", "decode_each_token_alone", "disconnect_not_sent_to_core",
                                         "final_delta_twice", "text_after_stop_kept"}


@pytest.mark.slow
def test_nbgrader_end_to_end(tmp_path):
    """generate_assignment -> submissions (solution, blank, mutant) -> autograde -> export."""
    _, results, _ = grade_three_students(
        tmp_path, "lesson12", ("l12_streaming_detokenizer", "l12_source_map_answer"), "l12_streaming_detokenizer",
        mutant_source("lesson12", "text_after_stop_kept"))
    code = {s: sum(v or 0 for k, v in got.items() if k in CODE_PARTS) for s, got in results.items()}
    assert code == {"solution_student": 4, "blank_student": 0, "mutant_student": 2}
    assert all(got["l12_q1"] is None for got in results.values())  # manual: pending
