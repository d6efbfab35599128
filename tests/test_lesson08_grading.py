"""Lesson 8's grader beyond tests/test_mutants.py (which grades the solution 4/4 and every mutant in
autograder/lesson08/mutants.py below it) and tests/test_autograder.py (the unfilled release scores 0): the
source map's accepted spellings, and nbgrader agreeing with the self-check end to end."""
import pytest

from autograder.common import REPO, grade_namespace, student_namespace
from autograder.lesson08 import LESSON, check_source_map
from autograder.mutation import mutant_source

CODE_PARTS = ("l08_main_path", "l08_real_engine", "l08_boundary", "l08_source_map")


def code_scores(namespace):
    return {r.part.grade_id: r.score for r in grade_namespace(LESSON, namespace) if not r.part.manual}


@pytest.fixture(scope="module")
def solution_ns():
    ns, errors = student_namespace(REPO / "solutions/lesson08/lesson08.ipynb")
    assert not errors
    return ns


def test_source_map_accepts_spellings_and_rejects_swaps(solution_ns):
    good = solution_ns["SOURCE_MAP"]
    check_source_map({k: f"self.{v}()" for k, v in good.items()})
    check_source_map(dict(good, ready="self.structured_output_request.is_grammar_ready()"))
    for bad in (dict(good, escape=good["ready"], ready=good["escape"]), dict(good, terminated="accept_tokens"),
                dict(good, parallel_fill="grammar_bitmask"), {k: v for k, v in good.items() if k != "escape"}):
        with pytest.raises(AssertionError):
            check_source_map(bad)


@pytest.mark.slow
def test_nbgrader_end_to_end(tmp_path):
    """generate_assignment -> submissions (solution, blank, mutant) -> autograde -> export."""
    from grading_flow import grade_three_students
    subs, results, csv_path = grade_three_students(
        tmp_path, "lesson08", ("l08_choice_bitmask", "l08_source_map_answer"), "l08_choice_bitmask",
        mutant_source("lesson08", "rows_in_scheduler_order"))
    code = {s: sum(v or 0 for k, v in got.items() if k in CODE_PARTS) for s, got in results.items()}
    assert code == {"solution_student": 4, "blank_student": 0, "mutant_student": 1}
    assert {s: got["l08_q1"] for s, got in results.items()} == {  # written: pending; untouched: 0
        "solution_student": None, "mutant_student": None, "blank_student": 0}
    for student, got in results.items():  # the Colab self-check gives the same points per part
        ns, _ = student_namespace(subs / student / "lesson08" / "lesson08.ipynb")
        assert code_scores(ns) == {k: v for k, v in got.items() if k in CODE_PARTS}, student
