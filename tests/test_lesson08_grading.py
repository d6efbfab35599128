"""Lesson 8's grader: the solution earns 4/4 code points, the unfilled release 0, every mutant loses points.

The mutants are data (the shape of autograder/mutation.py's Mutant in the new lesson layout: the exercise
cell, edits (solution text -> wrong text), the misconception); with that pipeline merged they move to
autograder/lesson08/mutants.py. Each edit must match the solution cell exactly once.
"""
import json

import pytest

from autograder.common import REPO, grade_namespace, student_namespace
from autograder.lesson08 import LESSON

CELL = "l08_choice_bitmask"
MUTANTS = {
    "bits_reversed": (CELL, (("token // 32, token % 32", "token // 32, 31 - token % 32"),),
                      "Packs token 32w+j into bit 31-j: the bit order within a word reversed."),
    "rows_in_scheduler_order": (CELL, (("rows = batch_req_ids", "rows = list(generated)"),),
                                "Rows follow the scheduler's dict order instead of the runner's batch order."),
    "mask_after_sampling": (CELL, (('    masked = logits.masked_fill(~allowed, float("-inf"))\n'
                                    '    return sample(masked)',
                                    '    tokens = sample(logits)\n'
                                    '    logits.masked_fill_(~allowed, float("-inf"))\n'
                                    '    return tokens'),),
                            "Samples first and masks afterwards: the sampler saw every token."),
    "no_eos_when_complete": (CELL, (("eos_allowed = done in choices[req_id]", "eos_allowed = False"),),
                             "Never allows EOS, even once the bytes equal a choice."),
    "first_character_fits": (CELL, (("allowed.update(trie.prefixes_of(rest))",
                                     "allowed.update(t for t, p in enumerate(trie.token_bytes) if p and rest and "
                                     "p[:1] == rest[:1])"),),
                             "Allows a token because its first byte fits, not all of its bytes."),
}
MUST_FAIL = {"bits_reversed": {"l08_main_path", "l08_real_engine"},
             "rows_in_scheduler_order": {"l08_main_path", "l08_real_engine"},
             "mask_after_sampling": {"l08_boundary"},
             "no_eos_when_complete": {"l08_main_path", "l08_boundary"},
             "first_character_fits": {"l08_main_path", "l08_real_engine"}}


def solution_cell(grade_id: str) -> str:
    nb = json.loads((REPO / "solutions/lesson08/lesson08.ipynb").read_text(encoding="utf-8"))
    cell = next(c for c in nb["cells"] if c["id"] == grade_id)
    return "".join(cell["source"]).replace("  ### BLANK", "")


def mutant_namespace(name: str, base: dict) -> dict:
    cell, edits, _ = MUTANTS[name]
    source = solution_cell(cell)
    for old, new in edits:
        assert source.count(old) == 1, (name, old)
        source = source.replace(old, new)
    ns = dict(base)
    exec(compile(source, f"<mutant {name}>", "exec"), ns)
    return ns


def code_scores(namespace):
    return {r.part.grade_id: r.score for r in grade_namespace(LESSON, namespace) if not r.part.manual}


@pytest.fixture(scope="module")
def solution_ns():
    ns, errors = student_namespace(REPO / "solutions/lesson08/lesson08.ipynb")
    assert not errors
    return ns


def test_solution_gets_all_code_points(solution_ns):
    assert code_scores(solution_ns) == {"l08_main_path": 1, "l08_real_engine": 1, "l08_boundary": 1,
                                        "l08_source_map": 1}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_mutant_loses_code_points(mutant, solution_ns):
    scores = code_scores(mutant_namespace(mutant, solution_ns))
    failed = {k for k, v in scores.items() if v == 0}
    assert MUST_FAIL[mutant] <= failed, scores
    assert sum(scores.values()) < 4


def test_source_map_accepts_spellings_and_rejects_swaps(solution_ns):
    from autograder.lesson08 import check_source_map
    good = solution_ns["SOURCE_MAP"]
    check_source_map({k: f"self.{v}()" for k, v in good.items()})
    check_source_map(dict(good, fill="self.scheduler.get_grammar_bitmask(scheduler_output)"))
    for bad in (dict(good, fill=good["apply"], apply=good["fill"]), dict(good, waiting="WAITING"),
                dict(good, advance="validate_tokens"), {k: v for k, v in good.items() if k != "apply"}):
        with pytest.raises(AssertionError):
            check_source_map(bad)


@pytest.mark.slow
def test_nbgrader_end_to_end(tmp_path):
    """generate_assignment -> submissions (solution, blank, mutant) -> autograde -> export."""
    from grading_flow import grade_three_students
    subs, results, csv_path = grade_three_students(
        tmp_path, "lesson08", ("l08_choice_bitmask", "l08_source_map_answer"), CELL,
        solution_cell(CELL).replace("rows = batch_req_ids", "rows = list(generated)"))
    parts = ("l08_main_path", "l08_real_engine", "l08_boundary", "l08_source_map")
    code = {s: sum(v or 0 for k, v in got.items() if k in parts) for s, got in results.items()}
    assert code == {"solution_student": 4, "blank_student": 0, "mutant_student": 1}
    assert all(got["l08_q1"] is None for got in results.values())  # manual: pending
    for student, got in results.items():  # the Colab self-check gives the same points per part
        ns, _ = student_namespace(subs / student / "lesson08" / "lesson08.ipynb")
        assert code_scores(ns) == {k: v for k, v in got.items() if k in parts}, student
