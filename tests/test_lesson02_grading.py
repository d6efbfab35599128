"""Lesson 2's grader: the solution earns 4/4 code points, the unfilled release 0, every mutant loses points;
the plug builds the same SchedulerOutputs as minivllm's own Scheduler; the real engine shows the damage each
wrong policy does; nbgrader agrees end to end."""

import pytest

from autograder import lesson02 as L02
from autograder.common import CheckFailed
from autograder.lesson02 import check_source_map
from autograder.mutation import mutant_namespace
from autograder.pin import VLLM_VERSION


def mutant(name):
    return mutant_namespace("lesson02", name)["schedule_step"]


def test_source_map_accepts_spellings_and_rejects_swaps(solution_ns):
    good = solution_ns["SOURCE_MAP"]
    check_source_map(dict(good, peek="request_queue.peek_request()", hit_tokens="num_new_local_computed_tokens",
                          queue_factory="vllm.v1.core.sched.request_queue.create_request_queue",
                          preempted_list="preempted_reqs[:]"))
    for bad in (dict(good, peek=good["pick_queue"], pick_queue=good["peek"]), dict(good, peek="pop_request"),
                dict(good, hit_tokens="num_computed_tokens"), dict(good, preempted_list="preempted_req"),
                {k: v for k, v in good.items() if k != "peek"}, dict(good, pick_queue=None)):
        with pytest.raises(AssertionError):
            check_source_map(bad)


# ---------------------------------------------------------------------------- the plug itself
def _summary(out):
    c = out.scheduled_cached_reqs
    return dict(new=[(r.req_id, r.prompt_token_ids, r.block_ids, r.num_computed_tokens) for r in out.scheduled_new_reqs],
                cached=(c.req_ids, c.resumed_from_preemption, c.new_block_ids, c.num_computed_tokens),
                tokens=list(out.num_scheduled_tokens.items()), total=out.total_num_scheduled_tokens,
                finished=sorted(out.finished_req_ids), preempted=sorted(out.preempted_req_ids), step=out.step)


@pytest.mark.parametrize("scenario", L02.MAIN_SCENARIOS + L02.BOUNDARY_SCENARIOS, ids=lambda s: s[0][:24])
def test_plugged_solution_builds_the_reference_scheduler_output(scenario, solution_ns):
    """Field by field (new requests, cached deltas with block ids, order, finished, preempted), step by step."""
    from minivllm.worker.outputs import ModelRunnerOutput

    _, kw = scenario
    kw = dict(kw)
    arrivals, prompts, max_tokens = kw.pop("arrivals", {}), kw.pop("prompts", None), kw.pop("max_tokens", None)
    lens, num_steps = kw.pop("prompt_lens"), kw.pop("num_steps")
    ref, got = L02.make_scheduler(**kw), L02.make_scheduler(**kw)
    L02.plug(got, solution_ns["schedule_step"])
    names = iter(range(100))

    def add(lengths):
        for n in lengths:
            rid = str(next(names))
            prompt = prompts[int(rid)] if prompts else [int(rid) + 10] * n
            for s in (ref, got):
                s.add_request(L02.checks._request(rid, prompt, max_tokens))

    add(lens)
    for k in range(num_steps):
        add(arrivals.get(k, ()))
        outs = [s.schedule() for s in (ref, got)]
        assert _summary(outs[1]) == _summary(outs[0]), k
        for s, out in zip((ref, got), outs, strict=True):
            ids = list(out.num_scheduled_tokens)
            done = [s.requests[r].num_computed_tokens >= s.requests[r].num_tokens for r in ids]
            s.update_from_output(out, ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)},
                                                        [[7] if d else [] for d in done]))
        assert [r.request_id for r in got.running] == [r.request_id for r in ref.running]
        assert [r.request_id for r in got.waiting] == [r.request_id for r in ref.waiting]
        assert (got.kv_cache_manager.block_pool.get_num_free_blocks()
                == ref.kv_cache_manager.block_pool.get_num_free_blocks())


# ---------------------------------------------------------------------------- the real engine's evidence
def test_real_engine_shows_what_each_wrong_policy_does():
    """Independent of the equal-to-reference rule: the engine's own per-step plans show the damage."""
    (w1_args, w2_args) = (a for _, a in L02.CHECK_WORKLOADS)
    w1, w2 = L02.reference_runs()
    for run, args in ((w1, w1_args), (w2, w2_args)):
        L02.judge_steps(run.steps, args)  # the reference keeps every invariant
        assert run.num_preemptions > 0 and any(r.admitted for r in run.steps)
    assert any(0 < n < 48 for r in w1.steps for rid, n in r.scheduled.items() if rid == "b1" and r.admitted)

    log: list = []
    with pytest.raises(CheckFailed):
        L02.run_engine(mutant("waiting_before_running"), workload=L02.CHECK_WORKLOADS[1][0], log=log, **w2_args)
    starved = [r for r in log if [d for d in r.decoding if d not in r.scheduled]]
    assert starved and starved[0].scheduled == {"L0": 48}  # the long prompt took the whole budget

    with pytest.raises(CheckFailed, match="又在同一步把它接纳回来"):
        L02.run_engine(mutant("admission_after_preemption"), workload=L02.CHECK_WORKLOADS[1][0], **w2_args)
    with pytest.raises(CheckFailed, match="超过 token budget"):
        L02.run_engine(mutant("budget_not_decremented"), workload=L02.CHECK_WORKLOADS[0][0], **w1_args)
    loose = L02.run_engine(mutant("threshold_ignored"), workload=L02.CHECK_WORKLOADS[0][0], **w1_args)
    assert max(n for r in loose.steps for n in r.scheduled.values()) > w1_args["long_prefill_token_threshold"]


def test_demo_latencies_come_from_the_engine_steps():
    """The demo's deterministic part: how many steps each long prompt's prefill takes per threshold."""
    runs = L02.run_demo(("off", "64"), repeats=1)
    rows = {r["threshold"]: r for r in L02.latency_table(runs)}
    assert rows["off"]["prefill_steps"] == 1 and rows["64"]["prefill_steps"] == 8
    assert rows["off"]["max_step_tokens"] == 484 and rows["64"]["max_step_tokens"] == 69  # the text quotes these
    off = runs["off"].steps
    assert max(r.prefill_tokens for r in off) == 480 and all(r.decode_tokens >= 4 for r in off[1:28])
    assert all(r.seconds > 0 for r in off)


# ---------------------------------------------------------------------------- nbgrader


# ---------------------------------------------------------------------------- against the pinned vLLM (recorded)
def test_minivllms_scheduler_plans_every_recorded_workload_as_vllm_does():
    """Not only the plans: block ids, computed tokens, free blocks and outputs, event by event."""
    from autograder import vllm_oracle
    from autograder.vllm_oracle.scheduler_harness import first_divergence

    for name in vllm_oracle.scenarios("lesson02"):
        assert first_divergence(vllm_oracle.recorded("lesson02", name), L02.run_vllm_view(name)) is None, name


def test_vllm_comparison_passes_the_solution_and_catches_wrong_loops(solution_ns):
    for prefix in ("main_", "boundary_"):
        L02.compare_with_vllm(solution_ns["schedule_step"], prefix)
    for name, prefix in (("no_retry_after_preempt", "boundary_"), ("threshold_ignored", "main_"),
                         ("waiting_skips_head", "main_"), ("victim_is_current", "boundary_")):
        with pytest.raises(CheckFailed, match=f"vLLM {VLLM_VERSION}"):
            L02.compare_with_vllm(mutant(name), prefix)


def test_vllm_side_by_side_from_the_recording(monkeypatch, capsys):
    from autograder import vllm_oracle

    monkeypatch.setattr(vllm_oracle, "vllm_python", lambda: None)
    L02.vllm_side_by_side()
    out = capsys.readouterr().out
    assert "读取录制结果" in out and "!2 !3" in out and "✗" not in out
