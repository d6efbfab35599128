"""Lesson 9's grader beyond tests/test_mutants.py (which grades the solution 4/4 and every mutant in
autograder/lesson09/mutants.py below it, failing its `fails` parts) and tests/test_autograder.py (the unfilled
release scores 0): mutants edit only blank lines; the engine plug restores the runner and drives the rollback
with the student's count; the distribution test can fail; nbgrader agrees end to end."""
import json

import numpy as np
import pytest

from autograder.common import REPO, CheckFailed
from autograder.lesson09 import (
    check_against_vllm,
    check_source_map,
    chi_square_p_value,
    distribution_run,
    greedy_case,
    plugged,
    run_engine,
)
from autograder.mutation import mutant_namespace, mutants


def mutant(name):
    return mutant_namespace("lesson09", name)["rejection_sample"]


def test_mutants_change_only_blank_lines():
    sol = json.loads((REPO / "solutions/lesson09/lesson09.ipynb").read_text(encoding="utf-8"))
    cell = next("".join(c["source"]) for c in sol["cells"] if c["id"] == "l09_rejection_sample")
    blank_lines = {line.split("  ### BLANK")[0] for line in cell.splitlines() if "### BLANK" in line}
    for name, m in mutants("lesson09").items():
        for old, _new in m.edits:
            lines = {line for line in blank_lines if old in line}
            assert len(lines) == 1, (name, old)


def test_distribution_test_can_fail(solution_ns):
    """The chi-square rejects recovering from p (and the p-value helper is the chi2 survival function)."""
    assert chi_square_p_value(np.array([60, 40, 100]), np.array([0.25, 0.25, 0.5])) == pytest.approx(np.exp(-2))
    good = distribution_run(solution_ns["rejection_sample"])
    assert min(good.p_values.values()) > 1e-3
    bad = distribution_run(mutant("recover_from_p"))
    assert min(bad.p_values.values()) < 1e-6


def test_vllm_recording_confirms_the_hand_cases_and_catches_a_greedy_row_reading_q(solution_ns):
    """The pinned vLLM's recorded rejection_sample agrees with the hand-written greedy batch, the solution matches
    vLLM on every recorded batch, and a greedy row that needs q(x) > 0 is caught there."""
    from autograder.vllm_oracle import recorded

    *_, want_out, want_n = greedy_case()
    assert recorded("lesson09", "greedy_batch") == {"output_token_ids": want_out, "num_accepted": want_n}
    check_against_vllm(solution_ns["rejection_sample"])
    with pytest.raises(CheckFailed, match="greedy_with_q"):
        check_against_vllm(mutant("greedy_needs_q_positive"))


@pytest.mark.slow
def test_engine_plug_restores_the_runner_and_drives_the_rollback(solution_ns):
    import minivllm.worker.gpu_model_runner as runner

    original = runner.RejectionSampler
    with pytest.raises(CheckFailed), plugged(mutant("no_bonus_token"), []):
        assert runner.RejectionSampler is not original
        raise CheckFailed("inside")
    assert runner.RejectionSampler is original
    # The student's count decides what the engine keeps: one short keeps every output right but slower.
    short = run_engine(mutant("accepted_count_off_by_one"), max_tokens=24, prompts=[[1, 2, 3, 1, 2, 3, 1, 2]])
    ref = run_engine(solution_ns["rejection_sample"], max_tokens=24, prompts=[[1, 2, 3, 1, 2, 3, 1, 2]])
    assert short.tokens == ref.tokens and short.steps > ref.steps
    assert short.stats.mean_acceptance_length < ref.stats.mean_acceptance_length
    assert runner.RejectionSampler is original


def test_source_map_accepts_spellings_and_rejects_swaps(solution_ns):
    good = solution_ns["SOURCE_MAP"]
    check_source_map({k: f"`{v}`" for k, v in good.items()})
    check_source_map(dict(good, per_request_to_per_token="expand_kernel", no_q_flag="no_draft_probs",
                          cumulative_drafts="metadata.cu_num_draft_tokens"))
    for bad in (dict(good, parse=good["parallel_ngram"], parallel_ngram=good["parse"]),
                dict(good, no_q_flag="SYNTHETIC_MODE"), {k: v for k, v in good.items() if k != "parse"},
                dict(good, no_q_flag=None)):
        with pytest.raises(AssertionError):
            check_source_map(bad)


def test_student_copy_shows_the_blanks():
    cells = {c["id"]: "".join(c["source"])
             for c in json.loads((REPO / "notebooks/lesson09/lesson09.ipynb").read_text(encoding="utf-8"))["cells"]}
    code = cells["l09_rejection_sample"]
    assert code.count("______") == 6 and "### BLANK" not in code
    for line in ("accept = ______", "n = ______", "residual = ______", "out[i, k] = ______"):
        assert line in code, line
    assert "residual / residual.sum()" in code and "clamp" not in code and "break" not in code
    assert "assert n == [2, 0, 2, 0]" in cells["l09_main_path"]


