"""Async scheduling (vLLM's async_scheduling): step N+1 is planned while step N executes.

The oracle is minivllm's synchronous engine on the same requests: greedy outputs must be equal token for
token with chunked prefill, prefix caching, preemption, aborts, EOS / max_tokens and stop strings. The
AsyncScheduler's placeholder bookkeeping is checked on its own first, without a model.
"""
from __future__ import annotations

import random

from minivllm.config import CacheConfig, EngineArgs, SchedulerConfig
from minivllm.core.sched.async_scheduler import AsyncScheduler
from minivllm.engine import EngineCoreRequest, FinishReason
from minivllm.engine.core import EngineCore
from minivllm.request import Request, RequestStatus
from minivllm.sampling_params import SamplingParams
from minivllm.worker.outputs import ModelRunnerOutput

ENGINE = dict(device="cpu", attention_backend="torch", block_size=16, max_model_len=512)


def _output(so, token: int = 7) -> ModelRunnerOutput:
    """One sampled token for each request that reached the end of its tokens (and placeholders)."""
    req_ids = list(so.num_scheduled_tokens)
    return ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)}, [[token] for _ in req_ids])


# ---------------------------------------------------------------- the scheduler alone
def _async_scheduler(num_blocks: int = 1000, budget: int = 256) -> AsyncScheduler:
    return AsyncScheduler(SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=8, max_model_len=256),
                          CacheConfig(block_size=4, enable_prefix_caching=True), num_gpu_blocks=num_blocks)


def test_placeholder_lets_the_next_step_decode_before_the_output_arrives():
    s = _async_scheduler()
    s.add_request(Request("a", list(range(10, 20)), SamplingParams(max_tokens=5), eos_token_id=2))
    so1 = s.schedule()
    r = s.requests["a"]
    assert so1.num_scheduled_tokens == {"a": 10} and r.num_output_placeholders == 1
    so2 = s.schedule()  # step 1's token is unknown yet: step 2 computes it at position 10
    assert so2.num_scheduled_tokens == {"a": 1} and r.num_computed_tokens == 11 and r.num_output_placeholders == 2
    s.update_from_output(so1, _output(so1))
    assert r.num_tokens == 11 and r.num_output_placeholders == 1
    s.update_from_output(so2, _output(so2))
    assert r.num_tokens == 12 and r.num_output_placeholders == 0


def test_prefill_chunk_gets_no_placeholder():
    s = _async_scheduler(budget=6)
    s.add_request(Request("a", list(range(10, 20)), SamplingParams(max_tokens=5), eos_token_id=2))
    so1 = s.schedule()
    assert so1.num_scheduled_tokens == {"a": 6} and s.requests["a"].num_output_placeholders == 0
    so2 = s.schedule()
    assert so2.num_scheduled_tokens == {"a": 4} and s.requests["a"].num_output_placeholders == 1


def test_no_step_is_scheduled_past_max_tokens():
    s = _async_scheduler()
    s.add_request(Request("a", list(range(10, 20)), SamplingParams(max_tokens=2), eos_token_id=2))
    so1 = s.schedule()
    so2 = s.schedule()  # computes output token 1 (sampling token 2, the last)
    assert so2.num_scheduled_tokens == {"a": 1}
    s.update_from_output(so1, _output(so1))  # the engine's order: step 1's output before step 3's plan
    assert s.schedule().num_scheduled_tokens == {}  # token 2 is in flight: nothing more to compute
    out = s.update_from_output(so2, _output(so2))
    assert out.outputs[0].finish_reason == FinishReason.LENGTH and "a" not in s.requests


def test_preemption_zeroes_placeholders_and_the_late_token_still_lands():
    s = _async_scheduler(num_blocks=1 + 6)  # 6 usable blocks of 4 tokens
    s.add_request(Request("a", list(range(10, 22)), SamplingParams(max_tokens=20, ignore_eos=True)))
    s.add_request(Request("b", list(range(30, 41)), SamplingParams(max_tokens=20, ignore_eos=True)))
    so1 = s.schedule()  # a: 3 blocks, b: 3 blocks; both will sample
    assert so1.num_scheduled_tokens == {"a": 12, "b": 11}
    so2 = s.schedule()  # a needs a 4th block for position 12: b (last admitted) is preempted
    b = s.requests["b"]
    assert so2.preempted_req_ids == {"b"} and b.status == RequestStatus.PREEMPTED
    assert b.num_output_placeholders == 0 and b.num_computed_tokens == 0
    s.update_from_output(so1, _output(so1, token=9))
    assert b.output_token_ids == [9] and b.num_output_placeholders == 0  # step 1's token is real
    s.update_from_output(so2, _output(so2))
    assert s.requests["a"].num_output_placeholders == 0


# ---------------------------------------------------------------- the engine: async == sync
def _prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(4, 4000) for _ in range(n)]


def run_engine(async_scheduling: bool, requests, abort_after: dict | None = None, **engine_args):
    """Step an in-process EngineCore until idle; requests = [(id, prompt, SamplingParams)].
    abort_after {id: k}: abort the request once k of its tokens have come out (as a frontend would)."""
    core = EngineCore.from_engine_args(EngineArgs(**{**ENGINE, **engine_args}, async_scheduling=async_scheduling))
    tokens = {rid: [] for rid, _, _ in requests}
    finish = {}
    # How many tokens were planned on top of a placeholder (the previous token still being sampled).
    planned_ahead = [0]
    schedule = core.scheduler.schedule

    def counting_schedule():
        pending = {r.request_id for r in core.scheduler.running if r.num_output_placeholders}
        so = schedule()
        planned_ahead[0] += len(pending & set(so.num_scheduled_tokens))
        return so
    core.scheduler.schedule = counting_schedule
    try:
        for rid, prompt, params in requests:
            core.add_request(EngineCoreRequest(rid, prompt, params))
        for _ in range(2000):
            if not core.scheduler.has_requests() and not core.batch_queue:
                break
            out, _ = core.step_fn()  # step_with_batch_queue when async scheduling is on (vLLM: same)
            for o in out.outputs:
                tokens[o.request_id].extend(o.new_token_ids)
                if o.finished:
                    finish[o.request_id] = o.finish_reason
                if abort_after and len(tokens[o.request_id]) >= abort_after.get(o.request_id, 1 << 30):
                    core.abort_requests([o.request_id])
        assert not core.scheduler.has_requests() and not core.batch_queue, "the engine did not drain"
        pool = core.scheduler.kv_cache_manager.block_pool
        assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1, "blocks leaked"
        stats = core.scheduler.num_preemptions
    finally:
        core.shutdown()
    return tokens, finish, stats, planned_ahead[0]


def _greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw)


def _assert_equal(requests, **kw):
    sync = run_engine(False, requests, **kw)
    async_ = run_engine(True, requests, **kw)
    assert async_[0] == sync[0]
    assert async_[1] == sync[1]
    assert sync[3] == 0 and async_[3] > 0, "async scheduling never planned a step ahead"
    return sync, async_


def test_greedy_outputs_equal_with_eos_and_max_tokens():
    requests = [(f"r{i}", _prompt(i, 5 + 7 * i), _greedy(4 + 5 * i)) for i in range(5)]
    requests.append(("eos", _prompt(9, 12), _greedy(200)))  # runs until the model says EOS (or the cap)
    _assert_equal(requests)


def test_chunked_prefill_mixed_with_decodes():
    requests = [(f"r{i}", _prompt(10 + i, 30 + 40 * i), _greedy(12)) for i in range(4)]
    _assert_equal(requests, max_num_batched_tokens=48, long_prefill_token_threshold=32)


def test_prefix_caching_hits_are_the_same():
    shared = _prompt(20, 48)
    requests = [(f"r{i}", shared + _prompt(21 + i, 5 + i), _greedy(10)) for i in range(4)]
    _assert_equal(requests, max_num_batched_tokens=64)


def test_preemption_by_recompute():
    requests = [(f"r{i}", _prompt(30 + i, 30), _greedy(40, ignore_eos=True)) for i in range(4)]
    sync, async_ = _assert_equal(requests, num_gpu_blocks=14, max_num_batched_tokens=64)
    assert sync[2] > 0 and async_[2] > 0, "the workload must preempt in both modes"


def test_aborts():
    requests = [(f"r{i}", _prompt(40 + i, 20), _greedy(20, ignore_eos=True)) for i in range(3)]
    sync, async_ = _assert_equal(requests, abort_after={"r1": 5})
    assert len(sync[0]["r1"]) == 5 and "r1" not in sync[1]  # aborted: no more tokens, no finish from the core
    assert len(sync[0]["r0"]) == 20 == len(sync[0]["r2"])


def test_stop_strings_through_llm():
    from minivllm import LLM
    prompts = ["ROMEO:", "JULIET: O", "KING:"]
    ref = LLM(multiprocess=False, **ENGINE)
    plain = [o.outputs[0].text for o in ref.generate(prompts, _greedy(40), use_tqdm=False)]
    stops = [t[len(t) // 2:len(t) // 2 + 3] for t in plain]
    assert all(len(s) == 3 for s in stops)
    params = [_greedy(40, stop=[s]) for s in stops]
    want = [(o.outputs[0].text, o.outputs[0].finish_reason) for o in ref.generate(prompts, params, use_tqdm=False)]
    llm = LLM(multiprocess=False, async_scheduling=True, **ENGINE)
    got = [(o.outputs[0].text, o.outputs[0].finish_reason) for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == want
    assert all(reason == "stop" for _, reason in got)


def test_trace_shows_the_next_schedule_during_the_forward():
    core = EngineCore.from_engine_args(EngineArgs(**ENGINE, async_scheduling=True, trace=True))
    try:
        for i in range(4):
            core.add_request(EngineCoreRequest(f"r{i}", _prompt(50 + i, 40), _greedy(12, ignore_eos=True)))
        while core.scheduler.has_requests() or core.batch_queue:
            core.step_fn()
        events = core.tracer.events
    finally:
        core.shutdown()
    span = {(e.step, e.phase): e for e in events}
    steps = sorted({e.step for e in events if e.phase == "forward"})
    overlapped = [s for s in steps if (s + 1, "schedule") in span
                  and span[(s + 1, "schedule")].start < span[(s, "forward")].end]
    assert len(overlapped) >= len(steps) // 2, (len(overlapped), len(steps))
    for s in steps:  # each plan's own phases keep lesson 1's order
        order = sorted((e for e in events if e.step == s and e.thread == events[0].thread),
                       key=lambda e: e.start)
        assert [e.phase for e in order] == ["schedule", "execute", "grammar", "wait", "aborts", "update"]

