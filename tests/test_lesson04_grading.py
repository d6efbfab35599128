"""Lesson 4's grader: the solution earns 4/4 code points, the unfilled release 0, the plug runs the answers
where minivllm's own methods run (the reference Scheduler passes every check too), the abort plan lands in the
four states it names, the lifecycle trace and the HF oracle catch what they claim to, nbgrader agrees."""

import pytest
from grading_flow import grade_three_students, notebook_part_scores

from autograder import lesson04 as L04
from autograder.common import REPO, CheckFailed, student_namespace
from autograder.mutation import mutant_namespace, mutant_source

CODE_PARTS = ("l04_preempt", "l04_real_engine", "l04_abort", "l04_stop")


@pytest.fixture(scope="module")
def solution_ns():
    ns, errors = student_namespace(REPO / "solutions/lesson04/lesson04.ipynb")
    assert not errors
    return ns


@pytest.mark.slow
def test_solution_gets_all_code_points(executed_solution):
    """Per part, from the solution notebook's own run (nbclient, once per test run: tests/conftest.py), each grade
    cell scored as nbgrader scores it; test_autograder checks that run whole, test_mutants the sandbox's grading."""
    assert notebook_part_scores("lesson04", executed_solution("lesson04")) == dict.fromkeys(CODE_PARTS, 1)


def test_minivllms_own_scheduler_passes_the_same_checks():
    """With nothing plugged in the engine's own _preempt_request / finish_requests / check_stop run: the checks judge
    behaviour, not the answer's text."""
    from minivllm.core.sched.scheduler import Scheduler
    from minivllm.core.sched.utils import check_stop

    def own(name):
        return lambda sched, *args: getattr(Scheduler, name)(sched, *args)

    L04.check_preempt(own("_preempt_request"), own("finish_requests"), check_stop)
    L04.check_abort(own("_preempt_request"), own("finish_requests"), check_stop)
    L04.check_stop_rules(check_stop)
    run = L04.run_engine(None, aborts=L04.ABORTS)
    assert {r: s for r, (_, s) in run.life.aborted_in.items()} == L04.ABORT_STATES
    L04.judge_engine_run(run)


def test_abort_plan_hits_prefill_and_decode():
    """'p' is aborted with part of its prompt computed and no output; 'd' after it produced tokens; every
    transition of the run is in the trace the Tracer exported."""
    run = L04.run_engine(None, aborts=L04.ABORTS)
    p = run.life.reqs["p"]
    assert 0 < p.num_computed_tokens < p.num_prompt_tokens and not run.tokens["p"]
    assert run.tokens["d"] and run.after_abort["d"] == []
    names = {e["name"] for e in run.life.tracer.to_chrome_trace()["traceEvents"]}
    assert {"schedule", "aborts", "update", "RUNNING->PREEMPTED", "PREEMPTED->RUNNING",
            "WAITING->FINISHED_ABORTED", "PREEMPTED->FINISHED_ABORTED"} <= names


def test_judge_catches_broken_conservation_and_late_output():
    run = L04.run_engine(None, aborts=L04.ABORTS)
    run.life.blocks[3] = dict(run.life.blocks[3], free=run.life.blocks[3]["free"] - 1)
    with pytest.raises(CheckFailed, match="总块数"):
        L04.judge_engine_run(run)
    run = L04.run_engine(None, aborts=L04.ABORTS)
    run.after_abort["d"] = [1]
    with pytest.raises(CheckFailed, match="仍输出了"):
        L04.judge_engine_run(run)
    run = L04.run_engine(None, aborts=L04.ABORTS)
    run.life.transitions.append((9, "update", "z", "FINISHED_ABORTED", "RUNNING"))
    with pytest.raises(CheckFailed, match="不合法"):
        L04.judge_engine_run(run)


def test_hf_oracle_rejects_a_wrong_token():
    run = L04.run_engine(None)
    run.tokens["a"][5] += 1
    with pytest.raises(CheckFailed, match="HF transformers"):
        L04.judge_engine_run(run)


def test_victim_at_back_is_overtaken():
    ns = mutant_namespace("lesson04", "victim_at_back")
    with pytest.raises(CheckFailed, match="队首"):
        L04.check_preempt(ns["preempt"], ns["finish_requests"], ns["check_stop"])


@pytest.mark.slow
def test_nbgrader_end_to_end(tmp_path):
    """generate_assignment -> submissions (solution, blank, mutant) -> autograde -> export."""
    subs, results, csv_path = grade_three_students(
        tmp_path, "lesson04", ("l04_lifecycle",), "l04_lifecycle", mutant_source("lesson04", "min_tokens_ignored"))
    code = {s: sum(v or 0 for k, v in got.items() if k in CODE_PARTS) for s, got in results.items()}
    assert code == {"solution_student": 4, "blank_student": 0, "mutant_student": 3}


# ---------------------------------------------------------------------------- against vLLM 0.27.1 (recorded)
def test_minivllms_scheduler_and_check_stop_answer_every_recorded_scenario_as_vllm_does():
    from autograder import vllm_views

    for name in vllm_views.scenarios("lesson04"):
        assert L04.vllm_difference(name, L04.run_vllm_view(name), vllm_views.recorded("lesson04", name)) is None, name


def test_vllm_comparison_passes_the_solution_and_catches_wrong_lifecycles(solution_ns):
    funcs = ("preempt", "finish_requests", "check_stop")
    groups = {"preempt": ("demo_to_the_end", "preempt_"), "abort": ("demo_lifecycle", "abort_"), "stop": ("stop_",)}
    for prefixes in groups.values():
        L04.compare_with_vllm(prefixes, *(solution_ns[k] for k in funcs))
    for name, group in (("stop_reason_not_set", "stop"), ("min_tokens_off_by_one", "stop"),
                        ("abort_pops_waiting_head", "abort"), ("victim_at_back", "preempt"),
                        ("computed_not_reset", "preempt")):
        ns = mutant_namespace("lesson04", name)
        with pytest.raises(CheckFailed, match="vLLM 0.27.1"):
            L04.compare_with_vllm(groups[group], *(ns[k] for k in funcs))


def test_vllm_side_by_side_from_the_recording(monkeypatch, capsys):
    from autograder import vllm_views

    monkeypatch.setattr(vllm_views, "vllm_python", lambda: None)
    L04.vllm_side_by_side()
    out = capsys.readouterr().out
    assert "读取录制结果" in out and "RPRRRPA" in out and "✗" not in out and "都与 vLLM 相同" in out
