"""Lesson 1 — vLLM V1 源码地图: the checks behind the grade cells, the live demo and the figures.

Grade cells and `python -m autograder check lesson01 ...` call the same functions here:
    check_main_path(engine_core_step)   seed assertions + call-order contract with instrumented callables
    check_real_engine(engine_core_step) the student's step inside minivllm's EngineCore, judged by its trace
    check_boundary(engine_core_step)    has_requests=False and scheduled_tokens=0/1
    check_source_map(SOURCE_MAP)        one name past each blank in vLLM (not printed by the lesson)

Input space (each dimension, and the graded part that covers it):
    has_requests          True: main_path, boundary, real_engine; False (nothing called, ({}, False, [])): boundary
    scheduled_tokens      4 (main_path), 0 and 1 (boundary: ran is `> 0`), the real engine's steps (real_engine)
    call order and data   each callable called once, in vLLM's order, with the plan / model_output it must pass
                          on (identity-checked; the future handed on in their place is rejected): main_path,
                          boundary (Probe), real_engine (the engine's callables)
    aborts                one queued while the step's forward is in flight (after execute, before wait), and
                          the steps after it: real_engine (verdict from outputs and call order, never a clock)
    engine settings       the synchronous EngineCore.step, replaced on one EngineCore by the student's step over
                          the core's own phases (plugged_step); no grammar requests (the grammar phase still
                          runs); default model, CPU
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

from autograder.common import Lesson, SourceMap, expect, graded

TRACE = ["schedule", "execute", "grammar", "wait", "aborts", "update"]


# ---------------------------------------------------------------------------- instrumented callables
@dataclass
class Probe:
    """The seed's six callables, logging every call and returning objects whose identity we can check."""

    scheduled_tokens: int = 4
    log: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.plan = {"scheduled_tokens": self.scheduled_tokens}
        self.model_output = {"tokens": [7]}
        self.outputs = {"r0": [7]}

    def schedule(self):
        self.log.append(("schedule",))
        return self.plan

    def execute_async(self, plan):
        self.log.append(("execute", plan is self.plan))

        def future():
            self.log.append(("wait",))
            return self.model_output
        return future

    def get_grammar(self, plan):
        self.log.append(("grammar", plan is self.plan))
        return {"mask": None}

    def process_aborts(self):
        self.log.append(("aborts",))

    def update(self, plan, model_output):
        self.log.append(("update", plan is self.plan, model_output is self.model_output))
        return self.outputs

    def run(self, fn, has_requests=True):
        return fn(has_requests, self.schedule, self.execute_async, self.get_grammar, self.process_aborts,
                  self.update)

    @property
    def calls(self) -> list[str]:
        return [c[0] for c in self.log]


def _order_msg(got: list[str], where: str) -> str:
    i = next((k for k, (a, b) in enumerate(zip(TRACE, got, strict=False)) if a != b), min(len(got), len(TRACE)))
    detail = (f"第 {i + 1} 个应是 {TRACE[i]!r}，实际是 {got[i]!r}" if i < len(got) and i < len(TRACE)
              else f"共 {len(got)} 次，应为 {len(TRACE)} 次")
    return f"{where}的顺序应为 {TRACE}，实际为 {got}：{detail}。"


def _check_contract(fn, scheduled_tokens: int) -> tuple:
    __tracebackhide__ = True
    p = Probe(scheduled_tokens)
    out, ran, trace = p.run(fn)
    expect(p.calls == TRACE, _order_msg(p.calls, "对六个阶段函数的实际调用"))
    expect(p.log[1][1], "execute_async 必须收到 schedule() 返回的那个 plan。")
    expect(p.log[2][1], "get_grammar 必须收到 schedule() 返回的那个 plan。")
    expect(p.log[5][1] and p.log[5][2], "update 必须收到同一个 plan 和 future() 返回的 model_output。")
    expect(out is p.outputs, "返回的 outputs 必须就是 update(plan, model_output) 的返回值，不能自己拼。")
    expect(trace == TRACE, _order_msg(trace, "返回的 trace "))
    return out, ran, trace


# ---------------------------------------------------------------------------- part checks
@graded
def check_main_path(engine_core_step) -> None:
    """Main path: the seed's assertions, verbatim, then the call order the trace list only claims. Covers:
    has_requests=True, scheduled_tokens=4, call order and the identity of plan / model_output / outputs."""
    __tracebackhide__ = True
    events = []
    schedule = lambda: {"scheduled_tokens": 4}  # noqa: E731
    execute = lambda plan: (lambda: {"tokens": [7]})  # noqa: E731
    grammar = lambda plan: {"mask": None}  # noqa: E731
    aborts = lambda: events.append("abort-queue-drained")  # noqa: E731
    update = lambda plan, output: {"r0": output["tokens"]}  # noqa: E731

    out, ran, trace = engine_core_step(True, schedule, execute, grammar, aborts, update)
    expect(out == {"r0": [7]} and ran, f"种子断言：应得到 out == {{'r0': [7]}} 且 ran 为真，实际 out={out!r}, ran={ran!r}。")
    expect(trace == TRACE, _order_msg(trace, "种子断言：trace "))
    expect(events == ["abort-queue-drained"], f"种子断言：abort 队列应被清空恰好一次，events={events!r}。")
    _, ran, _ = _check_contract(engine_core_step, 4)
    expect(ran is True, f"scheduled_tokens=4 时 ran 应为 True，实际 {ran!r}。")


@graded
def check_boundary(engine_core_step) -> None:
    """Boundary: no requests -> nothing runs; scheduled_tokens=0 -> full control path but ran=False; 1 -> True.
    Covers: has_requests=False, scheduled_tokens on both sides of the `> 0` boundary."""
    __tracebackhide__ = True
    p = Probe()
    got = p.run(engine_core_step, has_requests=False)
    expect(got == ({}, False, []), f"has_requests=False 时应返回 ({{}}, False, [])，实际 {got!r}。")
    expect(p.calls == [], f"has_requests=False 时不应调用任何阶段函数，实际调用了 {p.calls}。")
    _, ran, _ = _check_contract(engine_core_step, 0)
    expect(ran is False, f"scheduled_tokens=0 时仍走完控制路径，但 ran 应为 False，实际 {ran!r}。")
    _, ran, _ = _check_contract(engine_core_step, 1)
    expect(ran is True, f"scheduled_tokens=1 时 ran 应为 True，实际 {ran!r}（注意边界是 > 0）。")


# The accepted names, as sha256 prefixes of the lower-cased last dotted name (common.last_name_hash): never the
# names themselves, since this file ships to students. Each is one step past a blank of EngineCore.step in
# the pinned vLLM (v1/core/sched/output.py, v1/executor/multiproc_executor.py, v1/outputs.py, v1/engine/__init__.py,
# v1/request.py), and the lesson does not print it.
SOURCE = SourceMap(["plan", "future", "grammar", "model_output", "aborts", "outputs"], {
    "plan": {"ec18205fc7eb15d3"},
    "future": {"f0d1e3803bcc7eec"},
    "grammar": {"a98c7d0ca6f69b1e"},
    "model_output": {"ae493c7adce2eff0"},
    "aborts": {"a2fc9250c0d3af89"},
    "outputs": {"285a0c06cf83da7b"},
}, unmapped="这些项没有对应到 vLLM 源码中的名字")


# ---------------------------------------------------------------------------- the real engine
@dataclass
class EngineRun:
    """One run of minivllm's EngineCore with a step function; r0 is aborted while a forward is in flight."""

    events: list
    outputs: dict  # step -> list[EngineCoreOutput]
    abort_step: int | None
    abort_time: float | None
    victim: str = "r0"
    free_blocks: tuple[int, int] = (0, 0)  # (free at the end, usable blocks): equal when every block came back once
    calls: list = field(default_factory=list)  # (step, phase): the engine callables in the order they were called


class Plan(dict):
    """The plan the exercise's step sees: {"scheduled_tokens": n}, carrying the real SchedulerOutput."""

    def __init__(self, scheduler_output) -> None:
        super().__init__(scheduled_tokens=scheduler_output.total_num_scheduled_tokens)
        self.scheduler_output = scheduler_output


def plugged_step(core, engine_core_step, calls: list):
    """EngineCore.step with the exercise's control flow: each callable it is handed is one phase of the core's own
    step (EngineCore._schedule ... _update, traced as EngineCore.step traces them); `calls` gets (step, phase) in
    the order the student's step called them. Patched onto one EngineCore by run_engine, never built into it."""
    from minivllm.engine import EngineCoreOutputs

    def step():
        has_requests = core.scheduler.has_requests()
        n = core._next_step() if has_requests else core.step_counter

        def logged(phase, fn):
            def call(*args):
                calls.append((n, phase))
                return fn(*args)
            return call

        def execute_async(plan):
            future = core._execute(n, plan.scheduler_output)
            return logged("wait", lambda: core._wait(n, future, plan.get("grammar_output")))

        def get_grammar(plan):
            plan["grammar_output"] = core._get_grammar_bitmask(n, plan.scheduler_output)
            return plan["grammar_output"]

        outputs, ran, _ = engine_core_step(
            has_requests, logged("schedule", lambda: Plan(core._schedule(n))), logged("execute", execute_async),
            logged("grammar", get_grammar), logged("aborts", lambda: core._process_aborts(n)),
            logged("update", lambda plan, out: core._update(n, plan.scheduler_output, out)))
        return (outputs if isinstance(outputs, EngineCoreOutputs) else EngineCoreOutputs()), bool(ran)
    return step


def run_engine(step_fn=None, abort_at_step: int = 3, max_tokens: int = 6, max_steps: int = 24) -> EngineRun:
    """Run two greedy requests through EngineCore.step (or `step_fn`, the exercise's step, plugged in its place);
    right after execute_model returns in step `abort_at_step`, abort r0 (as EngineCoreProc's input IO thread
    would), so the abort lands while the forward is in flight on the worker."""
    import logging
    import os
    from unittest import mock

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    from minivllm.config import EngineArgs
    from minivllm.engine import EngineCoreRequest
    from minivllm.engine.core import EngineCore
    from minivllm.sampling_params import SamplingParams

    state = {"abort_step": None, "abort_time": None}
    calls: list = []  # (step, phase) in the order the step function called the engine's callables
    core = EngineCore.from_engine_args(EngineArgs(trace=True, max_num_seqs=4))
    execute_model = core.model_executor.execute_model

    def execute_then_abort(scheduler_output, non_block=False):
        future = execute_model(scheduler_output, non_block=non_block)
        if core.step_counter == abort_at_step and state["abort_step"] is None:
            core.abort_requests(["r0"])  # thread-safe: only queued; drained in the aborts phase
            state["abort_step"], state["abort_time"] = core.step_counter, time.perf_counter()
        return future

    outputs = {}
    with contextlib.ExitStack() as plugs:
        plugs.enter_context(mock.patch.object(core.model_executor, "execute_model", execute_then_abort))
        if step_fn is not None:
            plugs.enter_context(mock.patch.object(core, "step", plugged_step(core, step_fn, calls)))
        try:
            for rid, prompt in (("r0", list(range(5, 37))), ("r1", list(range(40, 56)))):
                core.add_request(EngineCoreRequest(request_id=rid, prompt_token_ids=prompt, sampling_params=
                                                   SamplingParams(max_tokens=max_tokens, temperature=0.0)))
            while core.scheduler.has_requests() and core.step_counter < max_steps:
                out, _ = core.step()
                outputs[core.step_counter] = list(out.outputs)
            pool = core.scheduler.kv_cache_manager.block_pool
            free = (pool.get_num_free_blocks(), pool.num_gpu_blocks - 1)  # block 0 is the null block
        finally:
            core.shutdown()
    return EngineRun(list(core.tracer.events), outputs, state["abort_step"], state["abort_time"], free_blocks=free,
                     calls=calls)


def engine_phases(run: EngineRun, step: int) -> list[str]:
    evs = sorted((e for e in run.events if e.step == step and e.phase in TRACE), key=lambda e: e.start)
    return [e.phase for e in evs]


def _span(run: EngineRun, step: int, phase: str):
    return next((e for e in run.events if e.step == step and e.phase == phase), None)


def engine_calls(run: EngineRun, step: int) -> list[str]:
    return [phase for s, phase in run.calls if s == step]


def judge_engine_run(run: EngineRun, max_tokens: int = 6) -> None:
    """Verdicts from what happened, never from a clock: the order in which the step called the engine's own
    callables (execute returns before the forward ends, so grammar between execute and wait is the overlap),
    and the outputs: r0's abort is queued right after execute_async returns, before that step's wait."""
    __tracebackhide__ = True
    steps = sorted({s for s, _ in run.calls})
    expect(steps, "真实引擎一步也没有运行：engine_core_step 没有调用任何阶段函数。")
    expect(run.abort_step is not None, "r0 的取消没有发出：你的 engine_core_step 没有调用 execute_async。")
    for s in steps:
        got = engine_calls(run, s)
        expect(got == TRACE, _order_msg(got, f"真实引擎第 {s} 步对引擎阶段函数的调用"))
    leaked = [(s, o.new_token_ids) for s, outs in run.outputs.items() if s >= run.abort_step
              for o in outs if o.request_id == run.victim and o.new_token_ids]
    expect(not leaked, f"r0 在第 {run.abort_step} 步 forward 期间被取消，之后却仍输出了 token：{leaked}"
                       "（先 update 后 aborts 会把已取消请求的 token 推给前端）。")
    r1 = [t for outs in run.outputs.values() for o in outs if o.request_id == "r1" for t in o.new_token_ids]
    done = [o for outs in run.outputs.values() for o in outs if o.request_id == "r1" and o.finished]
    expect(len(r1) == max_tokens and done, f"未被取消的 r1 应正常生成 {max_tokens} 个 token 并结束，实际 {len(r1)} 个。")


@graded
def check_real_engine(engine_core_step) -> EngineRun:
    """Plug the student's step into EngineCore; judge the order of its calls and the outputs (deterministic:
    no timing). Covers: a real forward in flight, an abort queued mid-step, the step after it, r1 finishing."""
    __tracebackhide__ = True
    run = run_engine(engine_core_step)
    judge_engine_run(run)
    return run


LESSON = Lesson(
    lesson_id="lesson01",
    title="vLLM V1 源码地图：AsyncLLM、EngineCore 与 Worker",
    answer=("engine_core_step",),
    code={
        "main_path": ("主路径·种子断言", check_main_path),
        "real_engine": ("主路径·真实引擎", check_real_engine),
        "boundary": ("边界条件", check_boundary),
    },
    source_map=SOURCE,
    questions=("状态所有权", "grammar 重叠", "abort 时序"),
)
check_source_map = SOURCE.check
