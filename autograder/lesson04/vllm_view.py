"""Lesson 4 on the pinned vLLM: a request's life (admission, preemption by recompute, resumption, aborts in every
state, the stop rules) through vLLM's own Scheduler (v1/core/sched/scheduler.py: _preempt_request,
finish_requests, update_from_output) and its check_stop (v1/core/sched/utils.py).

"demo_lifecycle", "preempt_*", "abort_*" and "stop_flow" are scheduler_harness workloads (the EngineCore loop:
aborts land before a step, then schedule and update_from_output) on a bare Scheduler, as lesson 2's; "stop_rules"
calls check_stop directly, token by token, on hand-made requests. "demo_*" are the notebook's; the rest grade the
student's preempt / finish_requests / check_stop plugged into minivllm's Scheduler (autograder/lesson04/checks.py).
Runs under .venv-vllm only (imports vllm, never minivllm).
"""
from __future__ import annotations

import random

from autograder.vllm_oracle.scheduler_harness import request, workload
from autograder.vllm_oracle.vllm_side import scheduler_answer as _scheduler_answer

EOS, STOP = 1, 2


def _model(seed: int, n: int, specials=()) -> list[int]:
    """The tokens a request samples, position by position (never EOS or a stop id unless placed by specials)."""
    r = random.Random(seed)
    tokens = [r.randrange(10, 200) for _ in range(n)]
    for pos, token in specials:
        tokens[pos] = token
    return tokens


def _prompt(seed: int, n: int) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(4, 4000) for _ in range(n)]


# The lesson's workload, one object: graded on minivllm's real engine (checks.py imports these three) and run
# here on vLLM's Scheduler. 9 usable blocks of 16 for prompts of 20-60 tokens: decodes run the pool dry and
# preempt by recompute again and again (the admission gate off, as in lesson 2's W2). Aborts (step, id) as the
# engine run queues them: EngineCore drains them after that step's schedule(), when 'd' is decoding, 'p'
# mid-prefill, 'z' waiting and 'w' preempted; the harness lands an abort before a step's schedule(), so a step later.
WORKLOAD = [(0, "a", _prompt(0, 40), 24), (0, "v", _prompt(1, 40), 24), (1, "d", _prompt(2, 30), 30),
            (2, "w", _prompt(3, 50), 8), (4, "p", _prompt(4, 60), 8), (6, "z", _prompt(5, 20), 12)]
ENGINE_ARGS = dict(max_num_batched_tokens=48, long_prefill_token_threshold=16, num_gpu_blocks=10, max_num_seqs=4,
                   max_model_len=256, enable_prefix_caching=False, scheduler_reserve_full_isl=False)
ABORTS = ((4, "d"), (5, "p"), (6, "z"), (7, "w"))


def _workload(requests, steps, **limits) -> dict:
    """requests: (arrival step, id, prompt, max_tokens, abort step or None, sampling fields, specials); the
    limits are the lesson's ENGINE_ARGS but those given."""
    args = {**ENGINE_ARGS, **limits}
    reqs = [request(rid, prompt, max_tokens, _model(100 + i, max_tokens + args["max_model_len"], specials),
                    min_tokens=fields.get("min_tokens", 0), ignore_eos=fields.get("ignore_eos", False),
                    stop_token_ids=fields.get("stop", []), arrival_step=arrival, abort_step=abort)
            for i, (arrival, rid, prompt, max_tokens, abort, fields, specials) in enumerate(requests)]
    return workload(reqs, steps, block_size=16, num_blocks=args.pop("num_gpu_blocks"), **args)


SCENARIOS = {
    "demo_lifecycle": _workload([(a, r, p, m, {rid: k + 1 for k, rid in ABORTS}.get(r), {}, ())
                                 for a, r, p, m in WORKLOAD], 150),
    "demo_to_the_end": _workload([(a, r, p, m, None, {}, ()) for a, r, p, m in WORKLOAD], 150),
    # Preemption: three 40-token prompts decoding 24 tokens on 7 usable blocks; the same with prefix caching
    # (the victim resumes with a hit) and a later arrival (the victim resumes first, at the head of waiting).
    "preempt_pool": _workload([(0, f"r{i}", _prompt(10 + i, 40), 24, None, {}, ()) for i in range(3)], 200,
                              num_gpu_blocks=8, max_num_batched_tokens=64, max_num_seqs=8,
                              long_prefill_token_threshold=0, scheduler_reserve_full_isl=True),
    "preempt_prefix_cache": _workload(
        [(0, f"s{i}", _prompt(20, 32) + _prompt(21 + i, 8), 24, None, {}, ()) for i in range(3)]
        + [(3, "late", _prompt(30, 20), 6, None, {}, ())], 200, num_gpu_blocks=8, max_num_batched_tokens=64,
        max_num_seqs=8, long_prefill_token_threshold=0, enable_prefix_caching=True,
        scheduler_reserve_full_isl=True),
    # Aborts: waiting (head and middle of the queue), mid-prefill, decoding, preempted, two in one step.
    "abort_states": _workload(
        [(0, "long", _prompt(40, 90), 10, 2, {}, ()), (0, "dec", _prompt(41, 20), 30, 6, {}, ()),
         (0, "q1", _prompt(42, 30), 8, 1, {}, ()), (0, "q2", _prompt(43, 30), 8, None, {}, ()),
         (0, "q3", _prompt(44, 30), 8, 1, {}, ()), (1, "x", _prompt(45, 40), 40, 9, {}, ()),
         (1, "y", _prompt(46, 40), 40, 9, {}, ())], 200, num_gpu_blocks=9, max_num_batched_tokens=40),
    # Stop rules inside the engine loop: EOS, EOS before min_tokens, ignore_eos, a stop id, max_model_len.
    "stop_flow": _workload(
        [(0, "eos", _prompt(50, 10), 20, None, {}, ((4, EOS),)),
         (0, "early_eos", _prompt(51, 10), 20, None, {"min_tokens": 6}, ((2, EOS), (8, EOS))),
         (0, "ignore", _prompt(52, 10), 6, None, {"ignore_eos": True}, ((1, EOS),)),
         (0, "stop_id", _prompt(53, 10), 20, None, {"stop": [STOP]}, ((3, STOP),)),
         (0, "ctx", _prompt(54, 60), 40, None, {}, ())], 100, num_gpu_blocks=40, max_model_len=64,
        max_num_batched_tokens=128, long_prefill_token_threshold=0, max_num_seqs=8),
}

# check_stop on its own, token by token: (prompt, sampling fields, outputs, max_model_len).
STOP_CASES = [
    ([5] * 8, {"max_tokens": 4}, [20, 21, 22, 23, 24], 64),
    ([5] * 8, {"max_tokens": 1}, [20], 64),
    ([5] * 8, {"max_tokens": 16}, [20, 21, 22], 11),
    ([5] * 8, {"max_tokens": 16}, [20, 21, EOS], 64),
    ([5] * 8, {"max_tokens": 3}, [20, 21, EOS], 64),
    ([5] * 8, {"max_tokens": 16, "ignore_eos": True}, [20, EOS, 21, 22], 64),
    ([5] * 8, {"max_tokens": 16, "min_tokens": 3}, [EOS, 20, EOS], 64),
    ([5] * 8, {"max_tokens": 16, "min_tokens": 2, "stop_token_ids": [STOP, 7]}, [7, 20, 7], 64),
    ([5] * 8, {"max_tokens": 16, "stop_token_ids": [EOS]}, [20, EOS], 64),
    ([5, EOS, 5], {"max_tokens": 16}, [20, 21], 64),
    ([5] * 8, {"max_tokens": 16, "min_tokens": 4}, [EOS, EOS, EOS, 20, EOS], 64),
    ([5] * 8, {"max_tokens": 2, "min_tokens": 2}, [EOS, 20], 64),
]
SCENARIOS["stop_rules"] = {"eos": EOS, "cases": [list(c) for c in STOP_CASES]}


def stop_trace(make_request, check_stop, payload: dict) -> list:
    """Per case, per appended output token until it stops: [stopped, status name, stop_reason]. Pure Python."""
    out = []
    for prompt, fields, outputs, max_model_len in payload["cases"]:
        req = make_request(prompt, fields)
        rows = []
        for token in outputs:
            req.append_output_token_ids(token)
            stopped = bool(check_stop(req, max_model_len))
            rows.append([stopped, req.status.name, req.stop_reason])
            if stopped:
                break
        out.append(rows)
    return out


def vllm_answer(name: str, payload: dict):
    if name != "stop_rules":
        return _scheduler_answer(name, payload)
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.utils import check_stop
    from vllm.v1.request import Request, RequestStatus

    def make_request(prompt, fields):
        params = SamplingParams(**fields)
        params.update_from_generation_config({}, eos_token_id=payload["eos"])  # what the InputProcessor does
        req = Request(request_id="r", prompt_token_ids=list(prompt), sampling_params=params, pooling_params=None)
        req.status = RequestStatus.RUNNING
        return req

    return stop_trace(make_request, check_stop, payload)
