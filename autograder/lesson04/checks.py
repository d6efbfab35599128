"""Lesson 4 — 抢占、取消与请求生命周期: the checks behind the grade cells and the plug into the engine.

The student writes the scheduler's side of a request's life, three functions with minivllm's signatures:
    preempt(sched, request)                          Scheduler._preempt_request: recompute preemption of a victim
    finish_requests(sched, request_ids, status)      Scheduler.finish_requests: aborts in every state
    check_stop(request, max_model_len) -> bool       core/sched/utils.check_stop (vLLM: v1/core/sched/utils.check_stop)
`plug` installs them on a real minivllm Scheduler instance; schedule() and update_from_output() stay the
engine's own, so the answers run exactly where minivllm's own methods run.

Input space (each dimension, and the graded part that covers it):
    prefix caching        off: every part; on (victim admitted with a 32-token hit): check_preempt
    chunked prefill       a 40-token budget / long_prefill_token_threshold=16 split prompts: check_abort, check_real_engine
    async scheduling      off everywhere: the answers' only async field (num_output_placeholders) is given, not a blank
    KV pool               6-9 usable blocks of 16 (preemption, repeated), 63 (none): check_preempt, check_real_engine
    preempt victim        FCFS: the last of running, back at the head of waiting, resumed before a later arrival
    finish_requests       status ABORTED and ERROR (the argument, not a constant); the request WAITING (head and
                          middle of the queue), RUNNING mid-prefill and decoding, PREEMPTED; unknown ids; several
                          ids in one call; a step in flight when the abort lands: check_abort, check_real_engine
    check_stop            min_tokens 0 / on its boundary; EOS, ignore_eos, EOS that is also a stop id; stop ids;
                          max_tokens None / 1 / on its boundary / passed by several tokens of one step (spec
                          decode); max_model_len on its boundary; an EOS or stop id sampled before min_tokens,
                          then generation going on, called token by token (to a later EOS, or to max_tokens);
                          an EOS inside the prompt (a multi-turn chat):
                          check_stop_rules

Grade cells and `python -m autograder check lesson04 ...` call the check_* functions here (each docstring says
what it covers).
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from unittest import mock

from autograder.common import CheckFailed, Lesson, expect, graded
from autograder.pin import VLLM_VERSION

ENGINE_DEFAULTS = dict(device="cpu", attention_backend="torch", block_size=16)
BLOCK = 16


# ---------------------------------------------------------------------------- the plug
def plug(sched, preempt=None, finish_requests=None, check_stop=None) -> None:
    """Install the student's functions as this Scheduler instance's _preempt_request / finish_requests, and
    check_stop as the scheduler module's check_stop while this instance's update_from_output runs (the free
    function it calls, as vLLM's does; swapped only then, so other schedulers keep the engine's own)."""
    if preempt is not None:
        sched._preempt_request = lambda request: preempt(sched, request)
    if finish_requests is not None:
        def _finish(request_ids, finished_status):
            ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
            finish_requests(sched, ids, finished_status)
        sched.finish_requests = _finish
    if check_stop is not None:
        import minivllm.core.sched.scheduler as scheduler_module
        update_from_output = sched.update_from_output

        def _update(*args, **kwargs):
            with mock.patch.object(scheduler_module, "check_stop",
                                   lambda request, max_model_len: bool(check_stop(request, max_model_len))):
                return update_from_output(*args, **kwargs)
        sched.update_from_output = _update


LEGAL = {
    ("NEW", "WAITING"), ("WAITING", "RUNNING"), ("RUNNING", "PREEMPTED"), ("PREEMPTED", "RUNNING"),
    ("WAITING", "FINISHED_ABORTED"), ("RUNNING", "FINISHED_ABORTED"), ("PREEMPTED", "FINISHED_ABORTED"),
    ("RUNNING", "FINISHED_STOPPED"), ("RUNNING", "FINISHED_LENGTH_CAPPED"),
}


class Lifecycle:
    """Records every request's status transition into a minivllm Tracer (lesson 1's), one event per change:
    phase "WAITING->RUNNING", req_ids [request_id], step = the engine step and where = the phase after which
    it was seen (schedule / aborts / update). Also keeps what the checks need per step."""

    def __init__(self, sched, tracer) -> None:
        self.sched = sched
        self.tracer = tracer
        self.reqs: dict = {}  # every request ever added (finished ones leave sched.requests)
        self.status: dict[str, str] = {}
        self.steps: list[dict] = []  # per step: status of every known request after the update
        self.scheduled: list[dict] = []  # per step: num_scheduled_tokens
        self.preempted: list[list[str]] = []  # per step: preempted_req_ids
        self.aborted_in: dict[str, tuple[int, str]] = {}  # rid -> (step, its status when the abort reached it)
        self.blocks: list[dict] = []  # per step: used / free / total after the update
        self.transitions: list[tuple[int, str, str, str, str]] = []  # (step, where, rid, old, new)
        add, schedule, update = sched.add_request, sched.schedule, sched.update_from_output
        finish = sched.finish_requests

        def add_request(request):
            add(request)
            self.reqs[request.request_id] = request
            self.status[request.request_id] = "NEW"
            self.seen("add")

        def traced_schedule():
            out = schedule()
            self.seen("schedule", out.step)
            self.scheduled.append(dict(out.num_scheduled_tokens))
            self.preempted.append(sorted(out.preempted_req_ids))
            return out

        def traced_finish(request_ids, finished_status):
            for rid in [request_ids] if isinstance(request_ids, str) else request_ids:
                if rid in self.reqs and rid not in self.aborted_in:
                    self.aborted_in[rid] = (self.sched.step_id, self.reqs[rid].status.name)
            finish(request_ids, finished_status)
            self.seen("aborts")

        def traced_update(scheduler_output, model_runner_output):
            outs = update(scheduler_output, model_runner_output)
            self.seen("update", scheduler_output.step)
            self.steps.append(dict(self.status))
            self.blocks.append(self.block_count())
            return outs

        sched.add_request, sched.schedule = add_request, traced_schedule
        sched.finish_requests, sched.update_from_output = traced_finish, traced_update

    def seen(self, where: str, step: int | None = None) -> None:
        step = self.sched.step_id if step is None else step
        now = time.perf_counter()
        for rid, req in self.reqs.items():
            new = req.status.name
            old = self.status[rid]
            if new != old:
                self.tracer.record(f"{old}->{new}", step, now, now, [rid])
                self.transitions.append((step, where, rid, old, new))
                self.status[rid] = new

    def block_count(self) -> dict:
        kv = self.sched.kv_cache_manager
        held = {b.block_id for blocks in kv.req_to_blocks.values() for b in blocks}
        return dict(free=kv.block_pool.get_num_free_blocks(), used=len(held),
                    total=kv.block_pool.num_gpu_blocks - 1, holders=sorted(kv.req_to_blocks))


# ---------------------------------------------------------------------------- scheduler scenarios (no model)
def make_scheduler(num_gpu_blocks=9, max_num_batched_tokens=64, max_model_len=256, max_num_seqs=8,
                   enable_prefix_caching=False):
    """A real minivllm Scheduler, as vLLM's scheduler unit tests build one: no model, outputs are made up."""
    from minivllm.config import CacheConfig, SchedulerConfig
    from minivllm.core.sched.scheduler import Scheduler

    sc = SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                         max_model_len=max_model_len, long_prefill_token_threshold=0)
    cc = CacheConfig(block_size=BLOCK, enable_prefix_caching=enable_prefix_caching, num_gpu_blocks=num_gpu_blocks)
    return Scheduler(sc, cc, num_gpu_blocks, log_stats=False)


def make_request(rid: str, prompt_len: int, max_tokens: int | None = 32, eos: int | None = None, **params):
    from minivllm.request import Request
    from minivllm.sampling_params import SamplingParams

    prompt = [(7 * i + len(rid)) % 50 + 10 for i in range(prompt_len)]
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, **params), eos_token_id=eos)


def fake_token(request) -> int:
    """A deterministic 'model': the next token is a function of the sequence so far (like greedy decoding)."""
    return (sum(request.all_token_ids[-3:]) * 31 + len(request.all_token_ids)) % 50 + 60


def fake_step(sched, out=None):
    """One step with made-up sampled tokens: every scheduled request that finishes its prompt samples one."""
    from minivllm.worker.outputs import ModelRunnerOutput

    out = sched.schedule() if out is None else out
    ids, toks = [], []
    for rid in out.num_scheduled_tokens:
        req = sched.requests.get(rid)
        ids.append(rid)
        toks.append([fake_token(req)] if req is not None and req.num_computed_tokens >= req.num_tokens else [])
    eco = sched.update_from_output(out, ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, toks))
    return out, {o.request_id: list(o.new_token_ids) for o in eco.outputs}


def _drive(sched, max_steps=200, on_step=None):
    tokens: dict[str, list[int]] = {}
    for step in range(max_steps):
        if not sched.has_requests():
            return tokens
        out, new = fake_step(sched)
        for rid, t in new.items():
            tokens.setdefault(rid, []).extend(t)
        if on_step is not None:
            on_step(step, out)
    raise CheckFailed(f"调度器运行了 {max_steps} 步仍有请求没有完成（有请求一直拿不到 token？）。")


def preemption_scenario(preempt=None, finish_requests=None, check_stop=None, num_gpu_blocks=8):
    """Three requests of 40 prompt tokens + 24 outputs (4 blocks each) on 7 usable blocks: decodes run the pool
    dry and the newest running request is preempted by recompute. Returns (scheduler, lifecycle, tokens, log)."""
    from minivllm.tracing import Tracer

    sched = make_scheduler(num_gpu_blocks=num_gpu_blocks)
    plug(sched, preempt, finish_requests, check_stop)
    life = Lifecycle(sched, Tracer(enabled=True))
    for i in range(3):
        sched.add_request(make_request(f"r{i}", 40, max_tokens=24))
    log = []

    def on_step(step, out):
        log.append(dict(step=out.step, preempted=sorted(out.preempted_req_ids),
                        resumed=[r for r, f in zip(out.scheduled_cached_reqs.req_ids,
                                                   out.scheduled_cached_reqs.resumed_from_preemption, strict=True)
                                 if f],
                        waiting=[r.request_id for r in sched.waiting], blocks=life.blocks[-1] if life.blocks else None))
    tokens = _drive(sched, on_step=on_step)
    return sched, life, tokens, log


# ---------------------------------------------------------------------------- against the pinned vLLM
def run_vllm_view(name: str, preempt=None, finish_requests=None, check_stop=None):
    """autograder/lesson04/vllm_view.py's scenario `name` on minivllm's Scheduler with the student's functions
    plugged (None: minivllm's own), by the same driver vLLM's answer was recorded with."""
    from autograder import vllm_oracle
    from autograder.lesson04.vllm_view import stop_trace
    from autograder.vllm_oracle import scheduler_harness
    from autograder.vllm_oracle.minivllm_side import MinivllmSchedulerBackend
    from minivllm.request import Request, RequestStatus
    from minivllm.sampling_params import SamplingParams

    payload = vllm_oracle.scenarios("lesson04")[name]
    if name == "stop_rules":
        def make_request(prompt, fields):
            req = Request("r", list(prompt), SamplingParams(**fields), eos_token_id=payload["eos"])
            req.status = RequestStatus.RUNNING
            return req

        from minivllm.core.sched.utils import check_stop as own_check_stop
        return stop_trace(make_request, check_stop or own_check_stop, payload)

    class Backend(MinivllmSchedulerBackend):
        @staticmethod
        def make_scheduler(cfg):
            sched = MinivllmSchedulerBackend.make_scheduler(cfg)
            plug(sched, preempt, finish_requests, check_stop)
            return sched

    return scheduler_harness.run(Backend(), payload)


EVENT_ZH = {"s": "schedule()", "u": "update_from_output()", "a": "abort"}


def vllm_difference(name: str, got, want) -> str | None:
    """Where a run first differs from vLLM's recorded one, in words; None if it does not."""
    from autograder import vllm_oracle

    if name == "stop_rules":
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            if g != w:
                prompt, fields, outputs, mml = vllm_oracle.scenarios("lesson04")["stop_rules"]["cases"][i]
                return (f"check_stop 逐 token 调用（prompt 长 {len(prompt)}，{fields}，max_model_len={mml}，依次追加 "
                        f"{outputs}）：vLLM 每次返回 [是否停止, status, stop_reason] = {w}，你的 {g}。")
        return None
    if "error" in got:
        return f"运行出错（{got['error']}: {got['message']}）"
    for g, w in zip(got["events"], want["events"], strict=False):
        if g != w:
            key = next(k for k in sorted(set(g) | set(w)) if g.get(k) != w.get(k))
            return (f"第 {w['step']} 步的 {EVENT_ZH[w['k']]}，字段 {key}：vLLM {w.get(key)!r}，你的实现 {g.get(key)!r}"
                    "（sched：本步调度的 token；out：[请求, 新 token, 结束原因, stop_reason]；free_blocks：空闲块数）")
    if len(got["events"]) != len(want["events"]):
        return f"vLLM 记录了 {len(want['events'])} 个事件，你的实现 {len(got['events'])} 个。"
    for key in ("steps", "unfinished", "free_queue"):
        if got[key] != want[key]:
            return f"结束时 {key}：vLLM {want[key]!r}，你的实现 {got[key]!r}。"
    return None


def compare_with_vllm(prefixes: tuple, preempt, finish_requests, check_stop) -> None:
    """Every recorded scenario named prefixes*: the student's functions inside minivllm's Scheduler give what
    the pinned vLLM's own Scheduler and check_stop gave on the same inputs, event by event."""
    from autograder import vllm_oracle

    for name in vllm_oracle.scenarios("lesson04"):
        if name.startswith(prefixes):
            diff = vllm_difference(name, run_vllm_view(name, preempt, finish_requests, check_stop),
                                   vllm_oracle.recorded("lesson04", name))
            expect(diff is None, f"与 vLLM {VLLM_VERSION} 对照（场景 {name}）：{diff}")


def _call(fn, *args):
    try:
        return fn(*args)
    except CheckFailed:
        raise
    except Exception as e:  # the student's exception, in one line
        raise CheckFailed(f"{type(e).__name__}: {e}") from None


def _check_transitions(life, where: str) -> None:
    """Every status change the Lifecycle recorded is an edge of the state machine (LEGAL)."""
    for step, phase, rid, old, new in life.transitions:
        expect((old, new) in LEGAL, f"{where}第 {step} 步（{phase} 之后）：{rid} 的状态转移 {old} -> {new} 不合法。")


@graded
def check_preempt(preempt, finish_requests, check_stop) -> None:
    """A victim's blocks go back to the pool at once, it waits at the head of the queue with nothing computed,
    resumes before anyone else, and its tokens equal a run without preemption. Covers: FCFS victim order,
    6-7 usable blocks, prefix caching off and on (a victim admitted with a prefix hit)."""
    from minivllm.request import RequestStatus

    _, _, want, _ = preemption_scenario(None, None, check_stop, num_gpu_blocks=64)  # room for all: no preemption
    sched = make_scheduler(num_gpu_blocks=8)
    plug(sched, preempt, finish_requests, check_stop)
    reqs = [make_request(f"r{i}", 40, max_tokens=24) for i in range(3)]
    for r in reqs:
        sched.add_request(r)
    late = make_request("late", 20, max_tokens=4)
    tokens: dict[str, list[int]] = {}
    kv = sched.kv_cache_manager
    first_victim = None
    for step in range(200):
        if not sched.has_requests():
            break
        if step == 2:
            sched.add_request(late)  # arrives before the first preemption: the victim must still go first
        out = _call(sched.schedule)
        for rid in sorted(out.preempted_req_ids):
            victim = next(r for r in reqs if r.request_id == rid)
            expect(rid not in kv.req_to_blocks,
                   f"第 {out.step} 步：被抢占的 {rid} 仍持有 {len(kv.req_to_blocks.get(rid, ()))} 个 KV 块（抢占要把它的块全部还给 BlockPool）。")
            expect(victim.status == RequestStatus.PREEMPTED, f"第 {out.step} 步：被抢占的 {rid} 状态是 {victim.status.name}，应为 PREEMPTED。")
            expect(victim.num_computed_tokens == 0,
                   f"第 {out.step} 步：被抢占的 {rid} 的 num_computed_tokens = {victim.num_computed_tokens}，按重算抢占应归零（它的 KV 已经丢了）。")
            expect(sched.waiting and sched.waiting[0] is victim,
                   f"第 {out.step} 步：被抢占的 {rid} 应排在 waiting 队首，实际 waiting = {[r.request_id for r in sched.waiting]}。")
            expect(victim not in sched.running, f"第 {out.step} 步：被抢占的 {rid} 还在 running 里。")
            if first_victim is None:
                first_victim = victim
        if first_victim is not None and any(r.req_id == "late" for r in out.scheduled_new_reqs):
            expect(first_victim.status == RequestStatus.RUNNING or first_victim.is_finished(),
                   f"第 {out.step} 步：后到的 late 先于被抢占的 {first_victim.request_id} 被接纳（被抢占的请求应最先恢复）。")
        _, new = fake_step(sched, out)
        for rid, t in new.items():
            tokens.setdefault(rid, []).extend(t)
    else:
        raise CheckFailed("调度器运行了 200 步仍有请求没有完成（被抢占的请求一直没有恢复？）。")
    expect(first_victim is not None, "KV 池只够两个请求，却没有发生抢占（preempt 没有被调用？）。")
    expect(sum(r.num_preemptions for r in reqs) > 0, "请求的 num_preemptions 没有增加。")
    expect(kv.block_pool.get_num_free_blocks() == 7,
           f"所有请求结束后空闲块应为 7，实际 {kv.block_pool.get_num_free_blocks()}（有块没有归还）。")
    for rid in want:
        expect(tokens.get(rid) == want[rid],
               f"被抢占后恢复的 {rid} 输出与不抢占的运行不同：应为 {want[rid]}，实际 {tokens.get(rid)}。")
    _check_preempt_with_prefix_cache(preempt, finish_requests, check_stop)
    compare_with_vllm(("demo_to_the_end", "preempt_"), preempt, finish_requests, check_stop)


def shared_prefix_requests():
    """r0, then r1 and r2 one step later, all opening with the same 32 tokens (two full blocks): with prefix
    caching on, r1 and r2 are admitted with num_cached_tokens = 32."""
    from minivllm.request import Request
    from minivllm.sampling_params import SamplingParams

    base = [(7 * i + 3) % 50 + 10 for i in range(32)]
    return [Request(rid, base + [11 + i] * 8, SamplingParams(max_tokens=24, temperature=0.0))
            for i, rid in enumerate(("r0", "r1", "r2"))]


def _run_shared_prefix(preempt, finish_requests, check_stop, num_gpu_blocks, on_preempt=None):
    sched = make_scheduler(num_gpu_blocks=num_gpu_blocks, enable_prefix_caching=True)
    plug(sched, preempt, finish_requests, check_stop)
    reqs = shared_prefix_requests()
    sched.add_request(reqs[0])
    tokens: dict[str, list[int]] = {}
    for step in range(200):
        if step == 1:
            sched.add_request(reqs[1])
            sched.add_request(reqs[2])
        if not sched.has_requests():
            return sched, reqs, tokens
        out = _call(sched.schedule)
        if on_preempt is not None:
            for rid in sorted(out.preempted_req_ids):
                on_preempt(out, sched, next(r for r in reqs if r.request_id == rid))
        _, new = fake_step(sched, out)
        for rid, t in new.items():
            tokens.setdefault(rid, []).extend(t)
    raise CheckFailed("开启 prefix caching 的抢占场景运行了 200 步仍有请求没有完成。")


def _check_preempt_with_prefix_cache(preempt, finish_requests, check_stop) -> None:
    """Prefix caching on: the victim was admitted with a 32-token prefix hit, yet its progress still goes to 0
    (free() dropped its hold on those blocks too; on resumption get_computed_blocks finds what is still cached)."""
    from minivllm.request import RequestStatus

    _, _, want = _run_shared_prefix(None, None, check_stop, 64)
    seen = []

    def on_preempt(out, sched, victim):
        where = f"开启 prefix caching（{victim.request_id} 接纳时命中 {victim.num_cached_tokens} 个 token）第 {out.step} 步："
        expect(victim.status == RequestStatus.PREEMPTED, f"{where}被抢占的请求状态是 {victim.status.name}，应为 PREEMPTED。")
        expect(victim.num_computed_tokens == 0,
               f"{where}被抢占的 {victim.request_id} 的 num_computed_tokens = {victim.num_computed_tokens}，应归零"
               f"（它持有的块连同命中的前缀块都已释放，恢复时由 prefix cache 重新查找）。")
        expect(victim.request_id not in sched.kv_cache_manager.req_to_blocks, f"{where}被抢占的请求仍持有 KV 块。")
        expect(sched.waiting and sched.waiting[0] is victim, f"{where}被抢占的请求应排在 waiting 队首。")
        seen.append(victim.request_id)

    sched, _, tokens = _run_shared_prefix(preempt, finish_requests, check_stop, 7, on_preempt)
    expect(seen, "开启 prefix caching、6 个可用块：应发生抢占，却没有。")
    expect(sched.kv_cache_manager.block_pool.get_num_free_blocks() == 6,
           f"开启 prefix caching：全部结束后空闲块应为 6，实际 {sched.kv_cache_manager.block_pool.get_num_free_blocks()}。")
    for rid in want:
        expect(tokens.get(rid) == want[rid], f"开启 prefix caching：被抢占后恢复的 {rid} 输出与不抢占的运行不同："
                                             f"应为 {want[rid]}，实际 {tokens.get(rid)}。")


def abort_setup(preempt, finish_requests, check_stop):
    """Four requests, each caught in one state: 'dec' decoding, 'pre' mid-prefill, 'vic' preempted, 'wait' waiting."""
    from minivllm.tracing import Tracer

    sched = make_scheduler(num_gpu_blocks=9, max_num_batched_tokens=40)
    plug(sched, preempt, finish_requests, check_stop)
    life = Lifecycle(sched, Tracer(enabled=True))
    return sched, life


@graded
def check_abort(preempt, finish_requests, check_stop) -> None:
    """An abort in each state leaves no trace: out of running and waiting, FINISHED_ABORTED, blocks freed,
    reported in finished_req_ids, and no output for it from a step that was already in flight. Covers: every
    request state, unknown ids, the status argument (ERROR too), a request in the middle of waiting."""
    from minivllm.request import RequestStatus
    from minivllm.worker.outputs import ModelRunnerOutput

    for state in ("WAITING", "PREFILL", "DECODING", "PREEMPTED"):
        sched, life = abort_setup(preempt, finish_requests, check_stop)
        a = make_request("a", 40, max_tokens=40)
        b = make_request("b", 60, max_tokens=40)
        sched.add_request(a)
        sched.add_request(b)
        target = {"WAITING": b, "PREFILL": b, "DECODING": a, "PREEMPTED": b}[state]
        kv = sched.kv_cache_manager
        steps = 0
        in_flight = None
        while steps < 120:
            if state == "WAITING":
                break  # b is waiting before the first step
            if state == "PREFILL" and b.status == RequestStatus.RUNNING and 0 < b.num_computed_tokens < b.num_prompt_tokens:
                break
            if state == "DECODING" and a.status == RequestStatus.RUNNING and a.num_output_tokens >= 2:
                in_flight = sched.schedule()  # the abort races with this step: it was scheduled, its output comes late
                break
            if state == "PREEMPTED" and b.status == RequestStatus.PREEMPTED:
                break
            fake_step(sched)
            steps += 1
        else:
            raise CheckFailed(f"场景“{state}”没有到达预期状态（120 步内）。")
        rid = target.request_id
        before = (target.status.name, [r.request_id for r in sched.running], [r.request_id for r in sched.waiting])
        _call(sched.finish_requests, [rid, "no-such-id"], RequestStatus.FINISHED_ABORTED)
        where = f"在 {before[0]} 状态下取消 {rid}（取消前 running={before[1]}, waiting={before[2]}）："
        expect(target.status == RequestStatus.FINISHED_ABORTED, f"{where}状态应为 FINISHED_ABORTED，实际 {target.status.name}。")
        expect(target not in sched.running, f"{where}它还留在 running 里。")
        expect(target not in sched.waiting, f"{where}它还留在 waiting 里。")
        expect(rid not in kv.req_to_blocks, f"{where}它的 KV 块没有归还。")
        expect(rid not in sched.requests, f"{where}它还在 sched.requests 里（已结束的请求要从中删除）。")
        expect(rid in sched.finished_req_ids, f"{where}它不在 finished_req_ids 里（worker 要据此丢掉它的缓存状态）。")
        others = [r.request_id for r in (a, b) if r is not target]
        expect(all(sched.requests.get(o) is not None for o in others), f"{where}别的请求 {others} 也被结束了。")
        if in_flight is not None:  # the step scheduled before the abort returns its token now
            ids = list(in_flight.num_scheduled_tokens)
            eco = sched.update_from_output(in_flight, ModelRunnerOutput(
                ids, {r: i for i, r in enumerate(ids)},
                [[fake_token(sched.requests[r] if r in sched.requests else target)] for r in ids]))
            late = [o.request_id for o in eco.outputs if o.request_id == rid]
            expect(not late, f"{where}取消之后，本来在路上的那一步仍为它输出了 token。")
        tokens = _drive(sched)  # every output from here on comes after the abort
        expect(rid not in tokens, f"{where}取消后它仍有输出：{tokens.get(rid)}。")
        expect(kv.block_pool.get_num_free_blocks() == 8,
               f"{where}全部结束后空闲块应为 8，实际 {kv.block_pool.get_num_free_blocks()}。")
        expect(not sched.running and not sched.waiting, f"{where}全部结束后 running/waiting 不空。")
        _check_transitions(life, f"场景“{state}”")
    _check_finish_with_status(preempt, finish_requests, check_stop)
    compare_with_vllm(("demo_lifecycle", "abort_"), preempt, finish_requests, check_stop)


def _check_finish_with_status(preempt, finish_requests, check_stop) -> None:
    """finish_requests writes the status it is given (vLLM's scheduler also finishes with FINISHED_ERROR: a
    grammar that failed to compile, a failed step) and removes exactly the requests named, wherever they stand
    in waiting (not only its head)."""
    from minivllm.request import RequestStatus

    sched, _ = abort_setup(preempt, finish_requests, check_stop)
    reqs = [make_request(rid, 30, max_tokens=8) for rid in ("run", "w1", "w2", "w3", "w4")]
    for r in reqs:
        sched.add_request(r)
    fake_step(sched)  # 40 tokens of budget: 'run' prefills whole, 'w1' starts, 'w2', 'w3', 'w4' wait
    run, w1, w2, w3, w4 = reqs
    expect(run.status == RequestStatus.RUNNING and w2.status == w3.status == w4.status == RequestStatus.WAITING,
           "场景“按给定状态结束”没有到达预期状态。")
    _call(sched.finish_requests, ["w3", "run"], RequestStatus.FINISHED_ERROR)
    where = "以 FINISHED_ERROR 结束 waiting 里排在中间的 w3 与 running 的 run（vLLM：grammar 编译失败、一步失败）："
    for r in (run, w3):
        expect(r.status == RequestStatus.FINISHED_ERROR,
               f"{where}{r.request_id} 的状态应为传入的 FINISHED_ERROR，实际 {r.status.name}（状态要用参数 finished_status）。")
        expect(r.request_id not in sched.requests and r.request_id in sched.finished_req_ids,
               f"{where}{r.request_id} 应离开 sched.requests 并记进 finished_req_ids。")
    expect([r.request_id for r in sched.waiting] == ["w2", "w4"] and [r.request_id for r in sched.running] == ["w1"],
           f"{where}之后应 running=['w1']、waiting=['w2', 'w4']，实际 running={[r.request_id for r in sched.running]}、"
           f"waiting={[r.request_id for r in sched.waiting]}。")
    tokens = _drive(sched)
    expect(set(tokens) == {"w1", "w2", "w4"} and all(len(t) == 8 for t in tokens.values()),
           f"{where}剩下的 w1、w2、w4 应各输出 8 个 token，实际 {tokens}。")
    expect(sched.kv_cache_manager.block_pool.get_num_free_blocks() == 8, f"{where}全部结束后有块没有归还。")


@graded
def check_stop_rules(check_stop) -> None:
    """vLLM's order (v1/core/sched/utils.py check_stop): nothing before min_tokens; EOS unless ignore_eos;
    stop_token_ids (stop_reason); then max_model_len and max_tokens (finished 'length'). Covers every
    check_stop boundary of the input space."""
    from minivllm.request import RequestStatus

    S, L = RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED
    EOS = 2
    cases = [  # (name, prompt_len, params, outputs, max_model_len, expect_stop, status, stop_reason)
        ("max_tokens=3 的第 2 个 token", 5, dict(max_tokens=3), [70, 71], 256, False, None, None),
        ("max_tokens=3 的第 3 个 token", 5, dict(max_tokens=3), [70, 71, 72], 256, True, L, None),
        ("max_tokens=None、未到上限", 5, dict(max_tokens=None), [70] * 10, 256, False, None, None),
        ("达到 max_model_len", 10, dict(max_tokens=100), [70, 71], 12, True, L, None),
        ("离 max_model_len 还差 1", 10, dict(max_tokens=100), [70], 12, False, None, None),
        ("EOS", 5, dict(max_tokens=10), [70, EOS], 256, True, S, None),
        ("ignore_eos 时的 EOS", 5, dict(max_tokens=10, ignore_eos=True), [70, EOS], 256, False, None, None),
        ("EOS 恰是第 max_tokens 个 token", 5, dict(max_tokens=2), [70, EOS], 256, True, S, None),
        ("stop_token_ids", 5, dict(max_tokens=10, stop_token_ids=[71]), [70, 71], 256, True, S, 71),
        ("min_tokens=3 之前的 EOS", 5, dict(max_tokens=10, min_tokens=3), [70, EOS], 256, False, None, None),
        ("min_tokens=3 之前的 stop token", 5, dict(max_tokens=10, min_tokens=3, stop_token_ids=[71]), [71, 71],
         256, False, None, None),
        ("min_tokens=3 时第 3 个 token 是 EOS", 5, dict(max_tokens=10, min_tokens=3), [70, 71, EOS], 256, True, S, None),
        ("普通 token", 5, dict(max_tokens=10, stop_token_ids=[99]), [70, 71], 256, False, None, None),
        ("min_tokens=2 时第 2 个 token 到达 max_model_len", 10, dict(max_tokens=100, min_tokens=2), [70, 71], 12, True,
         L, None),
        ("ignore_eos 时 EOS 也是 stop token", 5, dict(max_tokens=10, ignore_eos=True, stop_token_ids=[EOS]), [70, EOS],
         256, True, S, EOS),
        ("max_tokens=1 的第 1 个 token", 30, dict(max_tokens=1), [70], 256, True, L, None),
        ("一步到了多个 token（投机解码）、已超过 max_tokens=2", 5, dict(max_tokens=2), [70, 71, 72], 256, True, L, None),
    ]
    for name, plen, params, outs, mml, want, status, reason in cases:
        req = make_request("s", plen, eos=EOS, **params)
        req.status = RequestStatus.RUNNING
        for t in outs:
            req.append_output_token_ids(t)
        got = _call(check_stop, req, mml)
        expect(bool(got) == want, f"{name}：check_stop 应返回 {want}，实际 {got}（输出 {outs}，{params}，"
                                  f"max_model_len={mml}）。")
        if want:
            expect(req.status == status, f"{name}：状态应为 {status.name}，实际 {req.status.name}。")
            expect(req.stop_reason == reason, f"{name}：stop_reason 应为 {reason}，实际 {req.stop_reason}。")
        else:
            expect(req.status == RequestStatus.RUNNING, f"{name}：没有停止，状态却改成了 {req.status.name}。")
    _check_stop_sequences(check_stop, EOS)
    compare_with_vllm(("stop_",), None, None, check_stop)


def _check_stop_sequences(check_stop, EOS) -> None:
    """Token by token, as update_from_output calls it: an EOS (or stop id) sampled before min_tokens does not
    stop the request and does not count later; only the last token is judged (vLLM's check_stop reads
    request.output_token_ids[-1] after the min_tokens test)."""
    from minivllm.request import Request, RequestStatus
    from minivllm.sampling_params import SamplingParams

    S, L = RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED
    cases = [  # (name, params, outputs; check_stop is called after each one, stops only at the last)
        ("prompt 里含 EOS（多轮对话的上一轮以 EOS 结束），第 3 个输出 token 才是 EOS", dict(max_tokens=10),
         [70, 71, EOS], S, None),
        ("min_tokens=3：第 1 个 token 是 EOS，之后继续生成，第 5 个 token 又是 EOS", dict(max_tokens=10, min_tokens=3),
         [EOS, 70, 71, 72, EOS], S, None),
        ("min_tokens=4：第 2 个 token 是 EOS，之后继续生成到 max_tokens=6", dict(max_tokens=6, min_tokens=4),
         [70, EOS, 71, 72, 73, 74], L, None),
        ("min_tokens=3 且 max_tokens=3：第 1 个 token 是 EOS，第 3 个 token 到达 max_tokens",
         dict(max_tokens=3, min_tokens=3), [EOS, 70, 71], L, None),
        ("min_tokens=2：第 1 个 token 是 stop token，之后继续生成，第 4 个 token 又是它",
         dict(max_tokens=10, min_tokens=2, stop_token_ids=[71]), [71, 70, 72, 71], S, 71),
    ]
    for name, params, outs, status, reason in cases:
        req = make_request("q", 5, eos=EOS, **params)
        if "prompt" in name:
            req = Request("q", [11, 12, EOS, 13, 14], SamplingParams(temperature=0.0, **params), eos_token_id=EOS)
        req.status = RequestStatus.RUNNING
        for i, t in enumerate(outs, 1):
            req.append_output_token_ids(t)
            got = _call(check_stop, req, 256)
            last = i == len(outs)
            expect(bool(got) == last, f"{name}：追加第 {i} 个 token（{t}）后 check_stop 应返回 {last}，实际 {got}"
                                      f"（只看最后一个 token；min_tokens 之前的 EOS/stop token 不停、之后也不再算数）。")
            if not last:
                expect(req.status == RequestStatus.RUNNING,
                       f"{name}：第 {i} 个 token 之后没有停止，状态却改成了 {req.status.name}。")
        expect(req.status == status, f"{name}：状态应为 {status.name}，实际 {req.status.name}。")
        expect(req.stop_reason == reason, f"{name}：stop_reason 应为 {reason}，实际 {req.stop_reason}。")


# ---------------------------------------------------------------------------- the real engine
# The graded workload, its engine limits and aborts: the same objects lesson 4's vLLM view runs on vLLM's Scheduler.
from autograder.lesson04.vllm_view import ABORTS, ENGINE_ARGS, WORKLOAD  # noqa: E402

ABORT_STATES = {"d": "RUNNING", "p": "RUNNING", "z": "WAITING", "w": "PREEMPTED"}


@functools.lru_cache(maxsize=1)
def shared_core():
    """One in-process EngineCore on the default model (CPU), reused with a fresh Scheduler per run."""
    import logging
    import os

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    from minivllm.config import EngineArgs
    from minivllm.engine.core import EngineCore

    return EngineCore.from_engine_args(EngineArgs(**{**ENGINE_DEFAULTS, **ENGINE_ARGS, "trace": True}))


def fresh_scheduler(core, **scheduler_args):
    """A new, empty Scheduler on the shared engine (the worker and its KV tensors stay), with some fields changed."""
    import dataclasses

    from minivllm.core.sched.scheduler import Scheduler

    vc = core.vllm_config
    cache = {k: scheduler_args.pop(k) for k in ("num_gpu_blocks", "enable_prefix_caching") if k in scheduler_args}
    base = {k: ENGINE_ARGS[k] for k in ("max_num_batched_tokens", "long_prefill_token_threshold", "max_num_seqs",
                                        "max_model_len", "scheduler_reserve_full_isl")}
    vc.scheduler_config = dataclasses.replace(vc.scheduler_config, **{**base, **scheduler_args})
    cc = dataclasses.replace(vc.cache_config, enable_prefix_caching=cache.get("enable_prefix_caching", False))
    core.scheduler = Scheduler(vc.scheduler_config, cc, cache.get("num_gpu_blocks", ENGINE_ARGS["num_gpu_blocks"]))
    core.tracer.clear()
    # A run a wrong answer broke can leave requests in the worker's persistent batch: drop them, as the
    # finished_req_ids of a SchedulerOutput would.
    runner = core.model_executor.driver_worker.model_runner
    for rid in set(runner.requests) | set(runner.input_batch.req_id_to_index):
        runner.requests.pop(rid, None)
        runner.input_batch.remove_request(rid)
    return core.scheduler


@dataclass
class EngineRun:
    tokens: dict
    life: Lifecycle
    aborted: dict = field(default_factory=dict)  # rid -> (step of the abort, its status then)
    after_abort: dict = field(default_factory=dict)  # rid -> tokens emitted after its abort
    seconds: list = field(default_factory=list)  # per step wall time
    num_preemptions: int = 0
    num_steps: int = 0


def run_engine(preempt=None, finish_requests=None, check_stop=None, workload=WORKLOAD, aborts=(),
               max_steps=150, **scheduler_args) -> EngineRun:
    """Run a workload on the shared EngineCore; aborts [(step, rid)] go through EngineCore.abort_requests (the
    input queue a client disconnect feeds) before that step, so _process_aborts drains them mid-step."""
    from minivllm.engine import EngineCoreRequest
    from minivllm.sampling_params import SamplingParams

    core = shared_core()
    sched = fresh_scheduler(core, **scheduler_args)
    plug(sched, preempt, finish_requests, check_stop)
    life = Lifecycle(sched, core.tracer)
    pending = sorted(workload, key=lambda w: w[0])
    todo = sorted(aborts)
    run = EngineRun({}, life)
    step = 0
    while pending or todo or sched.has_requests():
        expect(step < max_steps, f"真实引擎运行了 {max_steps} 步仍有请求没有完成（有请求一直拿不到 token？）。")
        while pending and pending[0][0] <= step:
            _, rid, prompt, max_tokens = pending.pop(0)
            core.add_request(EngineCoreRequest(request_id=rid, prompt_token_ids=list(prompt),
                                               sampling_params=SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                                              ignore_eos=True)))
            run.tokens[rid] = []
        while todo and todo[0][0] <= step:
            _, rid = todo.pop(0)
            if rid in sched.requests:
                run.aborted[rid] = (step, sched.requests[rid].status.name)
                run.after_abort[rid] = []
            core.abort_requests(rid)
        t0 = time.perf_counter()
        try:
            out, _ = core.step()
        except CheckFailed:
            raise
        except Exception as e:  # the engine tripped over a state the answers left behind
            raise CheckFailed(f"真实引擎第 {step + 1} 步出错：{type(e).__name__}: {e}（某个已结束的请求还留在队列里？）") from None
        run.seconds.append(time.perf_counter() - t0)
        for o in out.outputs:
            run.tokens[o.request_id].extend(o.new_token_ids)
            if o.request_id in run.after_abort and o.new_token_ids:
                run.after_abort[o.request_id].extend(o.new_token_ids)
        step += 1
    run.num_preemptions = sched.num_preemptions
    run.num_steps = step
    return run


@functools.lru_cache(maxsize=1)
def hf_model():
    """HF transformers' implementation of the default model (float32, CPU): the oracle."""
    import torch
    import transformers

    from minivllm.config import default_model

    return transformers.AutoModelForCausalLM.from_pretrained(default_model(), dtype=torch.float32).eval()


def hf_greedy_mismatch(prompt: list[int], tokens: list[int]) -> int | None:
    """Teacher-forced greedy check: one HF forward over prompt + tokens; the index of the first token that is
    not HF's argmax given everything before it, or None. (A greedy sequence is exactly the one where every
    token is that argmax, so this equals comparing with HF's generate, at one forward per request.)"""
    import torch

    if not tokens:
        return None
    with torch.no_grad():
        logits = hf_model()(torch.tensor([prompt + tokens[:-1]])).logits[0, len(prompt) - 1:]
    top = logits.argmax(-1).tolist()
    return next((i for i, (t, h) in enumerate(zip(tokens, top, strict=True)) if t != h), None)


def judge_engine_run(run: EngineRun, where="真实引擎") -> None:
    """Every transition legal, blocks conserved after every step, nothing after an abort, greedy equals HF."""
    life = run.life
    _check_transitions(life, where)
    for i, b in enumerate(life.blocks):
        expect(b["free"] + b["used"] == b["total"],
               f"{where}第 {i + 1} 步：空闲块 {b['free']} + 在用块 {b['used']} ≠ 总块数 {b['total']}（块丢了或被重复计数）。")
        held_by_idle = [r for r in b["holders"] if life.steps[i].get(r) != "RUNNING"]
        expect(not held_by_idle, f"{where}第 {i + 1} 步：不在 RUNNING 的请求 {held_by_idle} 仍持有 KV 块。")
    for rid, (step, state) in run.aborted.items():
        state = life.aborted_in.get(rid, (step, state))[1]
        expect(life.status[rid] == "FINISHED_ABORTED",
               f"{where}：在第 {step} 步（{state}）取消的 {rid} 最终状态是 {life.status[rid]}，应为 FINISHED_ABORTED。")
        expect(not run.after_abort[rid], f"{where}：{rid} 在第 {step} 步被取消（当时 {state}）后仍输出了 "
                                         f"{run.after_abort[rid]}。")
    work = {rid: (prompt, max_tokens) for _, rid, prompt, max_tokens in WORKLOAD}
    for rid, toks in run.tokens.items():
        prompt, max_tokens = work[rid]
        if rid not in run.aborted:
            expect(len(toks) == max_tokens, f"{where}：{rid} 应输出 max_tokens={max_tokens} 个 token，实际 {len(toks)}。")
        bad = hf_greedy_mismatch(prompt, toks)
        expect(bad is None, f"{where}：{rid} 的第 {bad} 个输出 token 不是 HF transformers 的贪心选择"
                            f"（输出 {toks}）。")


@graded
def check_real_engine(preempt, finish_requests, check_stop) -> list[EngineRun]:
    """The three functions inside EngineCore on the default model under KV pressure: once to the end (victims
    resume and finish), once with aborts arriving while a request is waiting, mid-prefill, decoding and
    preempted. Every transition legal, blocks conserved, nothing after an abort, greedy equal to HF."""
    runs = []
    for name, aborts in (("（无取消）", ()), ("（带取消）", ABORTS)):
        run = run_engine(preempt, finish_requests, check_stop, aborts=aborts)
        expect(run.num_preemptions > 0, f"真实引擎{name}：KV 池很小，却一次抢占都没有发生。")
        if aborts:
            states = {rid: state for rid, (_, state) in run.life.aborted_in.items()}
            expect(states == ABORT_STATES, f"真实引擎{name}：取消到达调度器时各请求的状态应为 {ABORT_STATES}，"
                                           f"实际 {states}（之前的调度与参考不同）。")
        judge_engine_run(run, f"真实引擎{name}")
        runs.append(run)
    return runs


LESSON = Lesson(
    lesson_id="lesson04",
    title="抢占、取消与请求生命周期",
    answer=("preempt", "finish_requests", "check_stop"),
    code={
        "preempt": ("主路径·按重算抢占", check_preempt),
        "real_engine": ("主路径·真实引擎（KV 压力 + 取消）", check_real_engine),
        "abort": ("边界·各状态下的取消", check_abort),
        "stop": ("边界·停止条件", check_stop_rules, ("check_stop",)),
    },
    questions=("为什么重算而不是换出", "先 update 后 aborts 会怎样", "与一步赛跑的取消"),
)
