"""Lesson 8's grader beyond tests/test_mutants.py (which grades the solution 4/4 and every mutant in
autograder/lesson08/mutants.py below it) and tests/test_autograder.py (the unfilled release scores 0): the
source map's accepted spellings, and nbgrader agreeing with the self-check end to end."""
import pytest

from autograder.lesson08 import check_source_map


def test_source_map_accepts_spellings_and_rejects_swaps(solution_ns):
    good = solution_ns["SOURCE_MAP"]
    check_source_map({k: f"self.{v}()" for k, v in good.items()})
    check_source_map(dict(good, ready="self.structured_output_request.is_grammar_ready()"))
    for bad in (dict(good, escape=good["ready"], ready=good["escape"]), dict(good, terminated="accept_tokens"),
                dict(good, parallel_fill="grammar_bitmask"), {k: v for k, v in good.items() if k != "escape"}):
        with pytest.raises(AssertionError):
            check_source_map(bad)


