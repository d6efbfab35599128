"""Lesson 4's grader: the solution earns 4/4 code points, the unfilled release 0, the plug runs the answers
where minivllm's own methods run (the reference Scheduler passes every check too), the abort plan lands in the
four states it names, the lifecycle trace and the HF oracle catch what they claim to, nbgrader agrees."""

import pytest

from autograder import lesson04 as L04
from autograder.common import CheckFailed
from autograder.mutation import mutant_namespace
from autograder.pin import VLLM_VERSION


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


# ---------------------------------------------------------------------------- against the pinned vLLM (recorded)
def test_minivllms_scheduler_and_check_stop_answer_every_recorded_scenario_as_vllm_does():
    from autograder import vllm_oracle

    for name in vllm_oracle.scenarios("lesson04"):
        assert L04.vllm_difference(name, L04.run_vllm_view(name), vllm_oracle.recorded("lesson04", name)) is None, name


def test_vllm_comparison_passes_the_solution_and_catches_wrong_lifecycles(solution_ns):
    funcs = ("preempt", "finish_requests", "check_stop")
    groups = {"preempt": ("demo_to_the_end", "preempt_"), "abort": ("demo_lifecycle", "abort_"), "stop": ("stop_",)}
    for prefixes in groups.values():
        L04.compare_with_vllm(prefixes, *(solution_ns[k] for k in funcs))
    for name, group in (("stop_reason_not_set", "stop"), ("min_tokens_off_by_one", "stop"),
                        ("abort_pops_waiting_head", "abort"), ("victim_at_back", "preempt"),
                        ("computed_not_reset", "preempt")):
        ns = mutant_namespace("lesson04", name)
        with pytest.raises(CheckFailed, match=f"vLLM {VLLM_VERSION}"):
            L04.compare_with_vllm(groups[group], *(ns[k] for k in funcs))


def test_vllm_side_by_side_from_the_recording(monkeypatch, capsys):
    from autograder import vllm_oracle

    monkeypatch.setattr(vllm_oracle, "vllm_python", lambda: None)
    L04.vllm_side_by_side()
    out = capsys.readouterr().out
    assert "读取录制结果" in out and "RPRRRPA" in out and "✗" not in out and "都与 vLLM 相同" in out
