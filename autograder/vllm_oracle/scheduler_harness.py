"""Drive a Scheduler through one workload the way EngineCore does, and record every decision as JSON.

The same code drives the pinned vLLM's Scheduler/AsyncScheduler and minivllm's; only a small Backend adapter differs
(how to build the objects, and how to read their fields). The loop mirrors vLLM's EngineCore: requests arrive and
aborts land before a step (the input queue), then `step` (schedule, execute, update) or, with async scheduling,
`step_with_batch_queue` with two batches in flight. The "model" answers a scheduled request with the workload's
token for the position it samples (its num_computed_tokens after schedule()), and nothing for a prefill chunk.
Pure Python: runs under either venv.
"""
from __future__ import annotations

from collections import deque


class Canon:
    """Block hashes differ between engines (hash function, seed); their equalities must not. Each distinct hash
    becomes the number of its first appearance."""

    def __init__(self) -> None:
        self.ids: dict = {}

    def __call__(self, h) -> int | None:
        if h is None:
            return None
        return self.ids.setdefault(h, len(self.ids))


def _blocks(block_ids) -> list[int] | None:
    """vLLM's block ids are per KV-cache group (a tuple of lists); minivllm's a list. One group here."""
    if block_ids is None:
        return None
    if isinstance(block_ids, tuple):
        assert len(block_ids) == 1
        block_ids = block_ids[0]
    return list(block_ids)


def workload(requests: list[dict], max_steps: int, *, block_size: int, num_blocks: int, max_num_batched_tokens: int,
             max_num_seqs: int, max_model_len: int, long_prefill_token_threshold: int = 0,
             enable_chunked_prefill: bool = True, enable_prefix_caching: bool = True, async_scheduling: bool = False,
             scheduler_reserve_full_isl: bool | None = None, seed: int = 0) -> dict:
    """A workload, the one JSON shape both engines run: the limits, the requests (request()), the steps at most.
    scheduler_reserve_full_isl None leaves each engine's default (the key is absent)."""
    config = {"block_size": block_size, "max_model_len": max_model_len, "max_num_batched_tokens": max_num_batched_tokens,
              "max_num_seqs": max_num_seqs, "long_prefill_token_threshold": long_prefill_token_threshold,
              "enable_chunked_prefill": enable_chunked_prefill, "enable_prefix_caching": enable_prefix_caching,
              "async_scheduling": async_scheduling, "num_blocks": num_blocks}
    if scheduler_reserve_full_isl is not None:
        config["scheduler_reserve_full_isl"] = scheduler_reserve_full_isl
    return {"seed": seed, "config": config, "requests": requests, "max_steps": max_steps}


def request(rid: str, prompt: list[int], max_tokens: int, model: list[int], *, min_tokens: int = 0,
            ignore_eos: bool = False, stop_token_ids=(), arrival_step: int = 0, abort_step: int | None = None) -> dict:
    """One request of a workload; model[k] is the token it samples at output position k (EOS is token 1)."""
    return {"id": rid, "prompt": list(prompt), "max_tokens": max_tokens, "min_tokens": min_tokens,
            "ignore_eos": ignore_eos, "stop_token_ids": list(stop_token_ids), "arrival_step": arrival_step,
            "abort_step": abort_step, "model": list(model)}


def run(backend, workload: dict) -> dict:
    """The workload's record, or {"seed", "error": the exception's type} where the engine refused or crashed."""
    try:
        return _run(backend, workload)
    except Exception as e:  # noqa: BLE001 - an engine's failure is an answer to compare, not a harness error
        return {"seed": workload["seed"], "error": type(e).__name__, "message": str(e)[:500]}


def _run(backend, workload: dict) -> dict:
    cfg = workload["config"]
    specs = workload["requests"]
    sched = backend.make_scheduler(cfg)
    canon = Canon()
    events: list = []
    batch_queue: deque = deque()
    batch_queue_size = 2 if cfg["async_scheduling"] else 1
    last_arrival = max(s["arrival_step"] for s in specs)
    step = 0

    def model(so) -> tuple[list[str], list[list[int]]]:
        req_ids = list(so.num_scheduled_tokens)
        sampled = []
        for req_id in req_ids:
            req = sched.requests[req_id]
            spec = by_id[req_id]
            if req.num_computed_tokens >= base[req_id]:
                sampled.append([spec["model"][req.num_computed_tokens - len(spec["prompt"])]])
            else:
                sampled.append([])
        return req_ids, sampled

    def schedule():
        base.clear()
        base.update({i: r.num_tokens + getattr(r, "num_output_placeholders", 0) for i, r in sched.requests.items()})
        so = sched.schedule()
        cached = so.scheduled_cached_reqs
        resumed = backend.resumed_ids(cached)
        events.append({
            "k": "s", "step": step,
            "sched": [[i, n] for i, n in so.num_scheduled_tokens.items()],
            # A new request's num_computed_tokens is its prefix-cache hit (full blocks found by hash).
            "new": [[d.req_id, _blocks(d.block_ids), d.num_computed_tokens] for d in so.scheduled_new_reqs],
            "cached": [[i, i in resumed, _blocks(b), c]
                       for i, b, c in zip(cached.req_ids, cached.new_block_ids, cached.num_computed_tokens,
                                              strict=True)],
            "preempted": sorted(so.preempted_req_ids or ()),
            "finished": sorted(so.finished_req_ids),
            "computed": {i: sched.requests[i].num_computed_tokens for i in so.num_scheduled_tokens},
            "free_blocks": sched.kv_cache_manager.block_pool.get_num_free_blocks(),
        })
        return so, model(so)

    def update(so, out) -> None:
        req_ids, sampled = out
        outputs = backend.update(sched, so, req_ids, sampled)
        events.append({"k": "u", "step": step, "out": [
            [o.request_id, list(o.new_token_ids), None if o.finish_reason is None else str(o.finish_reason),
             o.stop_reason] for o in outputs]})

    by_id = {s["id"]: s for s in specs}
    base: dict[str, int] = {}
    while step < workload["max_steps"]:
        for s in specs:
            if s["arrival_step"] == step:
                sched.add_request(backend.make_request(s, cfg))
        aborts = [s["id"] for s in specs if s["abort_step"] == step and s["id"] in sched.requests]
        if aborts:
            # One call each, as separate client disconnects arrive: both engines free a batch of ids in set
            # order, which depends on PYTHONHASHSEED.
            for req_id in aborts:
                backend.abort(sched, [req_id])
            events.append({"k": "a", "step": step, "ids": aborts})
        if not sched.has_requests() and not batch_queue:
            if step >= last_arrival:
                break
        elif batch_queue_size == 1:
            so, out = schedule()
            update(so, out)
        else:
            if sched.has_requests():
                batch_queue.appendleft(schedule())
                if len(batch_queue) < batch_queue_size and sched.has_requests():
                    step += 1
                    continue
            so, out = batch_queue.pop()
            update(so, out)
        step += 1
    pool = sched.kv_cache_manager.block_pool
    return {
        "seed": workload["seed"],
        "steps": step,
        "events": events,
        "unfinished": sorted(sched.requests),
        # What the pool holds at the end: its free queue in eviction order, with each block's (canonical) hash.
        "free_queue": [[b.block_id, canon(b.block_hash)] for b in pool.free_block_queue.get_all_free_blocks()],
    }


def first_divergence(a: dict, b: dict) -> str | None:
    """Where two runs of one workload first differ: the event (step, kind), the request and the field.
    (workloads is imported here: the student release ships this file, not workloads.py.)"""
    from autograder.vllm_oracle.workloads import error_divergence

    failed, diff = error_divergence(f"seed {a['seed']}", a, b)
    if failed:
        return diff and f"{diff} ({a.get('message', '')} | {b.get('message', '')})"
    for ea, eb in zip(a["events"], b["events"], strict=False):  # lengths compared after
        if ea == eb:
            continue
        where = f"step {ea.get('step')} ({ {'s': 'schedule', 'u': 'update_from_output', 'a': 'abort'}[ea['k']]})"
        for key in sorted(set(ea) | set(eb)):
            if ea.get(key) != eb.get(key):
                return f"seed {a['seed']}, {where}, field {key!r}: vLLM {ea.get(key)!r} != minivllm {eb.get(key)!r}"
    if len(a["events"]) != len(b["events"]):
        n = min(len(a["events"]), len(b["events"]))
        extra = (a["events"] if len(a["events"]) > n else b["events"])[n]
        return (f"seed {a['seed']}: vLLM has {len(a['events'])} events, minivllm {len(b['events'])}; "
                f"the first unmatched: {extra}")
    for key in ("steps", "unfinished", "free_queue"):
        if a[key] != b[key]:
            return f"seed {a['seed']}, at the end, {key!r}: vLLM {a[key]!r} != minivllm {b[key]!r}"
    return None
