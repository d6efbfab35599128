"""Lesson 7's grader: the solution earns 4/4 code points, the unfilled release 0 without crashing, every mutant
loses the parts its table names; the references can fail (chi-square, exact masks, the profiler); the engine plug
restores the runner; nbgrader agrees end to end."""
import json

import numpy as np
import pytest
import torch
from grading_flow import namespace_scores

from autograder.common import REPO, CheckFailed
from autograder.lesson07 import (
    check_source_map,
    chi_square_p_value,
    distribution_p_values,
    exact_probs,
    plugged,
    ref_row,
    sorts,
)
from autograder.mutation import mutant_namespace, mutants

UNIT_PARTS = ("l07_main_path", "l07_boundary", "l07_source_map")
REQUIRED = {"temperature_after_softmax", "top_p_drops_crossing_token", "top_p_before_top_k_renormalisation",
            "min_p_against_sum", "one_generator_for_the_batch", "logprobs_after_temperature"}


def test_the_issue_mutants_are_there():
    assert REQUIRED <= set(mutants("lesson07"))


@pytest.mark.parametrize("name", sorted(mutants("lesson07")))
def test_mutant_loses_unit_points(name, solution_ns):
    """Fast: the parts that need no engine (tests/test_mutants.py grades every part)."""
    ns = mutant_namespace("lesson07", name)
    answers = {k: ns[k] for k in ("apply_min_p", "apply_top_k_top_p", "random_sample", "sample")}
    scores = namespace_scores("lesson07", dict(solution_ns, **answers), UNIT_PARTS)
    failed = {k for k, v in scores.items() if v == 0}
    assert set(mutants("lesson07")[name].fails) & set(UNIT_PARTS) <= failed, scores


def test_reference_row_is_vllms_definition():
    x = torch.tensor([0.0, 4.0, 1.0, 1.0, -1.0])
    assert torch.isfinite(ref_row(x, p=0.95)).tolist() == [False, True, True, True, False]  # the crossing token stays
    assert torch.isfinite(ref_row(x, p=0.9)).sum() == 2      # 0.889 < 0.9: the next token crosses p and stays
    assert torch.isfinite(ref_row(x, k=2)).tolist() == [False, True, True, True, False]     # a tie at the k-th value
    assert torch.isfinite(ref_row(x, min_p=0.04)).tolist() == [False, True, True, True, False]
    assert torch.isfinite(ref_row(x, min_p=0.05)).sum() == 1   # 0.05 * 0.889 is just above the tied 0.0443
    probs = exact_probs(1.0, 3, 0.5, 0.0)
    assert probs.sum() == pytest.approx(1) and (probs > 0).sum() == 2   # top-3 renormalised: 0.44 < 0.5, next crosses


def test_distribution_test_can_fail(solution_ns):
    assert chi_square_p_value(np.array([60, 40, 100]), np.array([0.25, 0.25, 0.5])) == pytest.approx(np.exp(-2))
    assert min(pv for _, pv, _, _ in distribution_p_values(solution_ns["sample"])) > 1e-3
    bad = mutant_namespace("lesson07", "multiply_by_noise")
    assert min(pv for _, pv, _, _ in distribution_p_values(bad["sample"])) < 1e-6


def test_profiler_sees_the_sort_only_with_top_p(solution_ns):
    f = solution_ns["apply_top_k_top_p"]
    x, k = torch.randn(4, 100), torch.tensor([3, 0, 7, 1])
    assert not sorts(lambda: f(x.clone(), k, None))
    assert sorts(lambda: f(x.clone(), k, torch.full((4,), 0.9)))


@pytest.mark.slow
def test_real_engine_solution_and_plug_restores_the_runner(solution_ns):
    import minivllm.worker.gpu_model_runner as runner

    original = runner.Sampler
    with pytest.raises(CheckFailed), plugged(solution_ns["sample"]):
        assert runner.Sampler is not original
        raise CheckFailed("inside")
    assert runner.Sampler is original
    assert namespace_scores("lesson07", solution_ns, ("l07_real_engine",)) == {"l07_real_engine": 1}
    assert runner.Sampler is original


def test_source_map_accepts_spellings_and_rejects_swaps(solution_ns):
    good = solution_ns["SOURCE_MAP"]
    check_source_map({k: f"`{v}`" for k, v in good.items()})
    check_source_map(dict(good, greedy_pick="vllm.v1.sample.sampler.Sampler.greedy_sample",
                          argmax_safe="MinPLogitsProcessor.is_argmax_invariant()", processed_mode='"processed_logprobs"'))
    for bad in (dict(good, greedy_pick="flashinfer_sample", no_seed_fast_path="greedy_sample"),
                dict(good, processed_mode="raw_logprobs"), dict(good, sampled_rank="gather_logprobs"),
                {k: v for k, v in good.items() if k != "greedy_pick"}):
        with pytest.raises(AssertionError):
            check_source_map(bad)


def test_student_copy_shows_the_blanks():
    cells = {c["id"]: "".join(c["source"])
             for c in json.loads((REPO / "notebooks/lesson07/lesson07.ipynb").read_text(encoding="utf-8"))["cells"]}
    code = cells["l07_sampler"]
    assert code.count("______") == 9 and "### BLANK" not in code
    for line in ("threshold = ______", "kth = ______", "probs_sort = ______", "drop = ______", "raw_logprobs = ______",
                 "x = ______"):
        assert line in code, line
    assert "exponential_(generator" not in code and "argmax(dim=-1)" in code and "amax" not in code


