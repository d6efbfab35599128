"""Lesson 1 — vLLM V1 源码地图: the checks behind the grade cells, the live demo and the figures.

Grade cells and `python -m autograder check lesson01 ...` call the same functions here:
    check_main_path(engine_core_step)   seed assertions + call-order contract with instrumented callables
    check_real_engine(engine_core_step) the student's step inside minivllm's EngineCore, judged by its trace
    check_boundary(engine_core_step)    has_requests=False and scheduled_tokens=0/1
    check_source_map(SOURCE_MAP)        each blank named by its vLLM object or method
"""
from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass, field

from autograder.common import Lesson, Part, check_name_map, expect

TRACE = ["schedule", "execute", "grammar", "wait", "aborts", "update"]
BLANKS = ["plan", "future", "grammar", "model_output", "aborts", "outputs"]


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
def check_main_path(engine_core_step) -> None:
    """Main path: the seed's assertions, verbatim, then the call order the trace list only claims."""
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


def check_boundary(engine_core_step) -> None:
    """Boundary: no requests -> nothing runs; scheduled_tokens=0 -> full control path but ran=False."""
    __tracebackhide__ = True
    p = Probe()
    got = p.run(engine_core_step, has_requests=False)
    expect(got == ({}, False, []), f"has_requests=False 时应返回 ({{}}, False, [])，实际 {got!r}。")
    expect(p.calls == [], f"has_requests=False 时不应调用任何阶段函数，实际调用了 {p.calls}。")
    _, ran, _ = _check_contract(engine_core_step, 0)
    expect(ran is False, f"scheduled_tokens=0 时仍走完控制路径，但 ran 应为 False，实际 {ran!r}。")
    _, ran, _ = _check_contract(engine_core_step, 1)
    expect(ran is True, f"scheduled_tokens=1 时 ran 应为 True，实际 {ran!r}（注意边界是 > 0）。")


# The accepted names, as sha256 prefixes of the normalized, lower-cased name, so that the answer is not one
# `import` away. They are the objects and methods of EngineCore.step in vLLM 8e958902eee5
# (vllm/v1/engine/core.py); the grammar blank also accepts the StructuredOutputManager method behind it.
SOURCE_HASHES = {
    "plan": {"1da9c79e0ea39c1c"},
    "future": {"eb1ddb37561d2ff9"},
    "grammar": {"feed7070481e6e3a", "2be68e3426d48efc"},
    "model_output": {"f443b367ba8c0836"},
    "aborts": {"7443dbf8da06c8a0"},
    "outputs": {"68eacd54e18007b9"},
}


def name_hash(name: str) -> str:
    return hashlib.sha256(normalize_name(name).lower().encode()).hexdigest()[:16]


def normalize_name(name: str) -> str:
    """'self.scheduler.schedule()' / 'EngineCore._process_aborts_queue' -> 'scheduler.schedule' / ..."""
    s = re.sub(r"\(.*\)", "", str(name)).strip().strip("`").replace(" ", "")
    s = re.sub(r"^(self\.|enginecore\.|engine_core\.)", "", s, flags=re.I)
    return s


def check_source_map(source_map) -> None:
    """Source mapping: each blank -> the vLLM object or method it stands for in EngineCore.step."""
    __tracebackhide__ = True
    check_name_map(source_map, BLANKS, SOURCE_HASHES, name_hash, "这些空没有映射到 vLLM EngineCore.step 中对应的对象或方法")


# ---------------------------------------------------------------------------- the real engine
@dataclass
class EngineRun:
    """One run of minivllm's EngineCore with a step function; r0 is aborted while a forward is in flight."""

    events: list
    outputs: dict  # step -> list[EngineCoreOutput]
    abort_step: int | None
    abort_time: float | None
    victim: str = "r0"


def run_engine(step_fn=None, abort_at_step: int = 3, max_tokens: int = 6, max_steps: int = 24) -> EngineRun:
    """Run two greedy requests; right after execute_async returns in step `abort_at_step`, abort r0 (as
    AsyncLLM's input thread would), so the abort lands while execute_model is in flight on the worker."""
    import logging
    import os

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    from minivllm.config import EngineArgs
    from minivllm.engine import EngineCoreRequest
    from minivllm.engine.core import EngineCore, engine_core_step
    from minivllm.sampling_params import SamplingParams

    inner = step_fn or engine_core_step
    state = {"core": None, "abort_step": None, "abort_time": None}

    def wrapped(has_requests, schedule, execute_async, get_grammar, process_aborts, update):
        core = state["core"]

        def execute_then_abort(plan):
            future = execute_async(plan)
            if core.step_counter == abort_at_step and state["abort_step"] is None:
                core.abort_requests(["r0"])  # thread-safe: only queued; drained in the aborts phase
                state["abort_step"], state["abort_time"] = core.step_counter, time.perf_counter()
            return future
        return inner(has_requests, schedule, execute_then_abort, get_grammar, process_aborts, update)

    core = EngineCore.from_engine_args(EngineArgs(trace=True, max_num_seqs=4), step_fn=wrapped)
    state["core"] = core
    outputs = {}
    try:
        for rid, prompt in (("r0", list(range(5, 37))), ("r1", list(range(40, 56)))):
            core.add_request(EngineCoreRequest(request_id=rid, prompt_token_ids=prompt,
                                               sampling_params=SamplingParams(max_tokens=max_tokens, temperature=0.0)))
        while core.scheduler.has_requests() and core.step_counter < max_steps:
            out, _ = core.step()
            outputs[core.step_counter] = list(out.outputs)
    finally:
        core.shutdown()
    return EngineRun(list(core.tracer.events), outputs, state["abort_step"], state["abort_time"])


def engine_phases(run: EngineRun, step: int) -> list[str]:
    evs = sorted((e for e in run.events if e.step == step and e.phase in TRACE), key=lambda e: e.start)
    return [e.phase for e in evs]


def _span(run: EngineRun, step: int, phase: str):
    return next((e for e in run.events if e.step == step and e.phase == phase), None)


def judge_engine_run(run: EngineRun, max_tokens: int = 6) -> None:
    __tracebackhide__ = True
    steps = sorted({e.step for e in run.events if e.phase in TRACE})
    expect(steps, "真实引擎一步也没有运行：engine_core_step 没有调用任何阶段函数。")
    expect(run.abort_step is not None, "r0 的取消没有发出：你的 engine_core_step 没有调用 execute_async。")
    for s in steps:
        expect(engine_phases(run, s) == TRACE, _order_msg(engine_phases(run, s), f"真实引擎第 {s} 步 trace 中阶段"))
        aborts, update = _span(run, s, "aborts"), _span(run, s, "update")
        expect(aborts.start < update.start, f"第 {s} 步：aborts 必须在 update 之前开始。")
        fwd, grammar = _span(run, s, "forward"), _span(run, s, "grammar")
        if fwd is not None:
            expect(grammar.start < fwd.end,
                   f"第 {s} 步：grammar 在 worker 的 forward 结束之后（{(grammar.start - fwd.end) * 1e3:.2f} ms）才开始，"
                   "没有和 GPU 计算重叠。")
    fwd = _span(run, run.abort_step, "forward")
    expect(fwd is None or run.abort_time < fwd.end, "取消到达时 forward 已经结束（计时问题，不是你的错），重跑一次。")
    leaked = [(s, o.new_token_ids) for s, outs in run.outputs.items() if s >= run.abort_step
              for o in outs if o.request_id == run.victim and o.new_token_ids]
    expect(not leaked, f"r0 在第 {run.abort_step} 步 forward 期间被取消，之后却仍输出了 token：{leaked}"
                       "（先 update 后 aborts 会把已取消请求的 token 推给前端）。")
    r1 = [t for outs in run.outputs.values() for o in outs if o.request_id == "r1" for t in o.new_token_ids]
    done = [o for outs in run.outputs.values() for o in outs if o.request_id == "r1" and o.finished]
    expect(len(r1) == max_tokens and done, f"未被取消的 r1 应正常生成 {max_tokens} 个 token 并结束，实际 {len(r1)} 个。")


def check_real_engine(engine_core_step) -> EngineRun:
    """Plug the student's step into EngineCore; judge its trace. A timing-only miss is retried once."""
    __tracebackhide__ = True
    run = run_engine(engine_core_step)
    try:
        judge_engine_run(run)
    except AssertionError as e:
        if "没有和 GPU 计算重叠" not in str(e) and "计时问题" not in str(e):
            raise
        run = run_engine(engine_core_step)
        judge_engine_run(run)
    return run


def print_outputs(run: EngineRun) -> None:
    """Per step: the new tokens each request got (and its finish reason), as EngineCoreOutputs carried them."""
    print(f"{'step':>4}  {'r0':<22}{'r1':<22}")
    for s, outs in run.outputs.items():
        row = {o.request_id: f"{o.new_token_ids}" + (f" {o.finish_reason}" if o.finished else "") for o in outs}
        mark = "  <- abort(r0) during this step's forward" if s == run.abort_step else ""
        print(f"{s:>4}  {row.get('r0', '-'):<22}{row.get('r1', '-'):<22}{mark}")


# ---------------------------------------------------------------------------- figures
PHASE_COLORS = {"schedule": "#4C72B0", "execute": "#55A868", "grammar": "#C44E52", "wait": "#8172B2",
                "aborts": "#CCB974", "update": "#64B5CD", "forward": "#DD8452"}


def plot_timeline(run: EngineRun, steps: list[int] | None = None):
    """Gantt chart of the trace: the EngineCore thread's phases above the worker's forward passes, and below
    it the abort step's engine-thread phases in order, with when the abort arrived."""
    import matplotlib.pyplot as plt

    steps = steps or [s for s in (run.abort_step - 1, run.abort_step, run.abort_step + 1) if s in run.outputs]
    evs = [e for e in run.events if e.step in steps]
    t0 = min(e.start for e in evs)
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(11, 4.4), gridspec_kw={"height_ratios": [3, 1.3]})
    engine_thread = next(e.thread for e in evs if e.phase == "schedule")
    extra = iter(["#937860", "#DA8BC3", "#8C8C8C", "#17BECF", "#BCBD22"])
    colors = dict(PHASE_COLORS)
    for e in evs:
        if e.phase not in colors:  # worker phases the engine may add (input preparation, sampling, ...)
            colors[e.phase] = next(extra, "#BBBBBB")
        y = 1 if e.thread == engine_thread else 0
        width = max((e.end - e.start) * 1e3, 0.08)  # sub-0.1 ms phases stay visible
        ax.barh(y, width, left=(e.start - t0) * 1e3, color=colors[e.phase], height=0.6,
                edgecolor="black", linewidth=0.3)
    x = (run.abort_time - t0) * 1e3
    ax.axvline(x, color="red", linestyle="--")
    ax.text(x, 1.45, f" abort(r0) arrives (step {run.abort_step})", color="red", fontsize=8)
    ax.set_yticks([0, 1], ["worker thread", "EngineCore thread"])
    ax.set_ylim(-0.6, 2.4)
    ax.set_xlabel("time (ms)")
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()],
              labels=list(colors), ncol=5, fontsize=7, loc="upper right")
    ax.set_title(f"minivllm trace, steps {steps[0]}-{steps[-1]}", fontsize=9, loc="left")
    phases = sorted((e for e in run.events if e.step == run.abort_step and e.phase in TRACE), key=lambda e: e.start)
    for i, e in enumerate(phases):
        ax2.barh(0, 0.9, left=i, color=PHASE_COLORS[e.phase], edgecolor="black", linewidth=0.3)
        ax2.text(i + 0.45, 0, f"{e.phase}\n{(e.end - e.start) * 1e3:.2f} ms", ha="center", va="center", fontsize=8)
    k = sum(e.start < run.abort_time for e in phases)
    ax2.axvline(k - 0.05, color="red", linestyle="--")
    ax2.set_xlim(-0.1, len(phases))
    ax2.axis("off")
    ax2.set_title(f"step {run.abort_step} on the EngineCore thread, in order (red: abort arrives)", fontsize=8,
                  loc="left")
    fig.tight_layout()
    return fig


def fig_arithmetic_intensity(d_model: int = 4096, ridge: float = 295.0):
    """Figure 1-1: arithmetic intensity of a d x d FP16 linear layer vs tokens per step."""
    import matplotlib.pyplot as plt
    import numpy as np

    n = np.logspace(0, 4.5, 200)
    ai = 2 * n * d_model**2 / (2 * d_model**2 + 4 * n * d_model)  # FLOPs / bytes (weights + in/out activations)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.loglog(n, ai, color="black", label=f"linear layer, d={d_model}, FP16")
    ax.axhline(ridge, color="gray", linestyle="--", label=f"H100 SXM ridge ~{ridge:.0f} FLOP/B (989 TFLOPS / 3.35 TB/s)")
    ax.axvspan(1, 256, color="#8172B2", alpha=0.15, label="decode: tokens = B (memory-bound)")
    ax.axvspan(512, n[-1], color="#DD8452", alpha=0.15, label="prefill: tokens = B*S (compute-bound)")
    ax.set_xlabel("tokens per forward (decode: B; prefill: B*S)")
    ax.set_ylabel("FLOP / byte")
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title("Figure 1-1  Prefill vs decode arithmetic intensity", fontsize=9, loc="left")
    return fig


def _boxes(ax, boxes, arrows):
    for text, (x, y, w, h), color in boxes:
        ax.add_patch(__import__("matplotlib.patches", fromlist=["x"]).FancyBboxPatch(
            (x, y), w, h, boxstyle="round,pad=0.02", facecolor=color, edgecolor="black", linewidth=0.8))
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=8)
    for (x0, y0), (x1, y1), label in arrows:
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0), arrowprops=dict(arrowstyle="->", lw=1.2))
        if label:
            ax.text(max(x0, x1) + 0.01, (y0 + y1) / 2, label, fontsize=7, color="dimgray", va="center")
    ax.set_xlim(-0.01, 1.01)
    ax.set_ylim(0, 1)
    ax.axis("off")


def fig_architecture():
    """Figure 1-2: Frontend -> EngineCore -> Workers, and who owns which state."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.6))
    boxes = [
        ("API server / AsyncLLM\nowns: client streams, tokenizer, cancellation", (0.2, 0.84, 0.6, 0.12), "#DCE6F2"),
        ("", (0.1, 0.4, 0.8, 0.33), "#F2E6DC"),
        ("Scheduler\nrequest states, token budget", (0.14, 0.43, 0.34, 0.13), "#FFFFFF"),
        ("KVCacheManager\nlogical blocks, prefix hashes", (0.52, 0.43, 0.34, 0.13), "#FFFFFF"),
        ("Worker / GPUModelRunner (TP rank 0)\nKV tensors, CUDA graphs", (0.02, 0.05, 0.45, 0.15), "#E2F0D9"),
        ("Worker / GPUModelRunner (TP rank 1)\nKV tensors, CUDA graphs", (0.53, 0.05, 0.45, 0.15), "#E2F0D9"),
    ]
    arrows = [((0.5, 0.84), (0.5, 0.73), " EngineCoreRequest over ZMQ + msgspec"),
              ((0.4, 0.4), (0.3, 0.2), "execute_model(SchedulerOutput)"),
              ((0.6, 0.4), (0.72, 0.2), ""),
              ((0.12, 0.2), (0.12, 0.4), "ModelRunnerOutput")]
    _boxes(ax, boxes, arrows)
    ax.text(0.5, 0.65, "EngineCore (one busy loop, one thread)\nowns: step(), aborts_queue, IPC", ha="center",
            va="center", fontsize=8)
    ax.set_title("Figure 1-2  vLLM V1: frontend -> EngineCore -> workers (one writer per state)", fontsize=9,
                 loc="left")
    return fig


def fig_request_flow():
    """Figure 1-3: one request from HTTP to streamed tokens."""
    import matplotlib.pyplot as plt

    stages = ["HTTP request\narrives", "AsyncLLM\ntokenizes", "EngineCoreRequest\ninto input queue",
              "EngineCore.step()\nschedule", "ModelRunner forward\n(TP all-reduce)", "sample, detokenize,\nstream SSE"]
    fig, ax = plt.subplots(figsize=(11, 1.9))
    w, gap = 0.14, (0.98 - 6 * 0.14) / 5
    boxes = [(s, (0.01 + i * (w + gap), 0.25, w, 0.5), "#DCE6F2" if i < 3 else "#F2E6DC" if i == 3 else "#E2F0D9")
             for i, s in enumerate(stages)]
    arrows = [((0.01 + i * (w + gap) + w, 0.5), (0.01 + (i + 1) * (w + gap), 0.5), "") for i in range(5)]
    _boxes(ax, boxes, arrows)
    ax.set_title("Figure 1-3  Request flow (frontend process | EngineCore process | workers)", fontsize=9, loc="left")
    return fig


LESSON = Lesson(
    lesson_id="lesson01",
    title="vLLM V1 源码地图：AsyncLLM、EngineCore 与 Worker",
    parts=[
        Part("l01_main_path", "主路径·种子断言", 1, check_main_path, ("engine_core_step",)),
        Part("l01_real_engine", "主路径·真实引擎", 1, check_real_engine, ("engine_core_step",)),
        Part("l01_boundary", "边界条件", 1, check_boundary, ("engine_core_step",)),
        Part("l01_source_map", "映射回源码对象", 1, check_source_map, ("SOURCE_MAP",)),
        Part("l01_q1", "Q1 状态所有权", 2, group="manual"),
        Part("l01_q2", "Q2 grammar 重叠", 2, group="manual"),
        Part("l01_q3", "Q3 abort 时序", 2, group="manual"),
    ],
)
