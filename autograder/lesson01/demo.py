"""Lesson 1 — vLLM V1 源码地图: what the notebook shows (live demos, tables, figures); no check calls these."""
from __future__ import annotations

from autograder.figures import PHASE_COLORS, trace_gantt, vllm_answers
from autograder.lesson01.checks import TRACE, EngineRun, engine_phases, run_engine
from autograder.pin import VLLM_VERSION


def print_outputs(run: EngineRun) -> None:
    """Per step: the new tokens each request got (and its finish reason), as EngineCoreOutputs carried them."""
    print(f"{'step':>4}  {'r0':<22}{'r1':<22}")
    for s, outs in run.outputs.items():
        row = {o.request_id: f"{o.new_token_ids}" + (f" {o.finish_reason}" if o.finished else "") for o in outs}
        mark = "  <- abort(r0) during this step's forward" if s == run.abort_step else ""
        print(f"{s:>4}  {row.get('r0', '-'):<22}{row.get('r1', '-'):<22}{mark}")


# ---------------------------------------------------------------------------- errata, shown live
def late_abort_run() -> EngineRun:
    """minivllm's own EngineCore.step with one change: the abort queue is drained after update_from_output (the
    aborts phase does nothing; the update phase drains the queue once it has updated)."""
    from unittest import mock

    from minivllm.engine.core import EngineCore

    process_aborts, update = EngineCore._process_aborts, EngineCore._update

    def update_then_aborts(self, n, scheduler_output, model_output):
        outputs = update(self, n, scheduler_output, model_output)
        process_aborts(self, n)
        return outputs
    with mock.patch.object(EngineCore, "_process_aborts", lambda self, n: None), \
            mock.patch.object(EngineCore, "_update", update_then_aborts):
        return run_engine()


def print_late_abort(run: EngineRun) -> None:
    leaked = [o.new_token_ids for o in run.outputs.get(run.abort_step, []) if o.request_id == run.victim]
    free, total = run.free_blocks
    print(f"第 {run.abort_step} 步 r0 被取消后，EngineCore 仍为它输出了 token：{leaked}")
    print(f"结束时空闲块 {free} / 可用块 {total}：每个块都恰好释放一次，没有 use-after-free")


def engine_core_threads() -> list[str]:
    """The threads an EngineCoreProc starts besides the one that runs its busy loop (built here, then shut down)."""
    import tempfile
    import threading

    from minivllm.config import EngineArgs
    from minivllm.engine.core import EngineCoreProc, make_vllm_config

    before = set(threading.enumerate())
    with tempfile.TemporaryDirectory(prefix="minivllm-ipc-") as d:
        core = EngineCoreProc(make_vllm_config(EngineArgs(max_num_seqs=4)), f"ipc://{d}/in", f"ipc://{d}/out")
        try:
            return sorted(t.name for t in set(threading.enumerate()) - before)
        finally:
            core.shutdown()


# ---------------------------------------------------------------------------- figures
def plot_timeline(run: EngineRun, steps: list[int] | None = None):
    """Gantt chart of the trace: the EngineCore thread's phases above the worker's forward passes, and below
    it the abort step's engine-thread phases in order, with when the abort arrived."""
    import matplotlib.pyplot as plt

    steps = steps or [s for s in (run.abort_step - 1, run.abort_step, run.abort_step + 1) if s in run.outputs]
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(11, 4.4), gridspec_kw={"height_ratios": [3, 1.3]}, layout="tight")
    t0 = trace_gantt(ax, [e for e in run.events if e.step in steps], min_ms=0.08, top=2.4)
    x = (run.abort_time - t0) * 1e3
    ax.axvline(x, color="red", linestyle="--")
    ax.text(x, 1.45, f" abort(r0) arrives (step {run.abort_step})", color="red", fontsize=8)
    ax.set_title(f"minivllm trace, steps {steps[0]}-{steps[-1]}", fontsize=9, loc="left")
    phases = sorted((e for e in run.events if e.step == run.abort_step and e.phase in TRACE), key=lambda e: e.start)
    for i, e in enumerate(phases):
        ax2.barh(0, 0.9, left=i, color=PHASE_COLORS[e.phase], edgecolor="black", linewidth=0.3)
        ms = (e.end - e.start) * 1e3
        label = f"{e.phase}\n{ms:.2f} ms" + ("\n(no grammar in this run)" if e.phase == "grammar" else "")
        ax2.text(i + 0.45, 0, label, ha="center", va="center", fontsize=8)
    k = sum(e.start < run.abort_time for e in phases)
    ax2.axvline(k - 0.05, color="red", linestyle="--")
    ax2.set_xlim(-0.1, len(phases))
    ax2.axis("off")
    ax2.set_title(f"step {run.abort_step} on the EngineCore thread, in order (red: abort arrives)", fontsize=8,
                  loc="left")
    return fig


def fig_arithmetic_intensity(d_model: int = 4096, ridge: float = 295.0):
    """Figure 1-1: arithmetic intensity of a d x d FP16 linear layer vs tokens per step."""
    import matplotlib.pyplot as plt
    import numpy as np

    n = np.logspace(0, 4.5, 200)
    ai = 2 * n * d_model**2 / (2 * d_model**2 + 4 * n * d_model)  # FLOPs / bytes (weights + in/out activations)
    fig, ax = plt.subplots(figsize=(7, 3.6), layout="tight")
    ax.loglog(n, ai, color="black", label=f"linear layer, d={d_model}, FP16")
    ax.axhline(ridge, color="gray", linestyle="--", label=f"H100 SXM ridge ~{ridge:.0f} FLOP/B (989 TFLOPS / 3.35 TB/s)")
    knee = float(np.interp(ridge, ai, n))  # where the curve crosses the ridge: the two regimes meet there
    ax.axvspan(1, knee, color="#8172B2", alpha=0.15, label=f"memory-bound (< {knee:.0f} tokens): decode, tokens = B")
    ax.axvspan(knee, n[-1], color="#DD8452", alpha=0.15, label="compute-bound: prefill, tokens = B*S")
    ax.set(xlabel="tokens per forward (decode: B; prefill: B*S)", ylabel="FLOP / byte")
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title("Figure 1-1  Prefill vs decode arithmetic intensity", fontsize=9, loc="left")
    return fig


def _boxes(ax, boxes, arrows):
    from matplotlib.patches import FancyBboxPatch

    for text, (x, y, w, h), color in boxes:
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", facecolor=color, edgecolor="black",
                                    linewidth=0.8))
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=8)
    for (x0, y0), (x1, y1), label in arrows:
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0), arrowprops=dict(arrowstyle="->", lw=1.2))
        if label:
            ax.text(max(x0, x1) + 0.01, (y0 + y1) / 2, label, fontsize=8, color="dimgray", va="center")
    ax.set(xlim=(-0.01, 1.01), ylim=(0, 1))
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
              ((0.33, 0.4), (0.23, 0.2), ""),
              ((0.67, 0.4), (0.77, 0.2), ""),
              ((0.07, 0.2), (0.07, 0.4), "ModelRunnerOutput")]
    _boxes(ax, boxes, arrows)
    ax.text(0.5, 0.3, "execute_model(SchedulerOutput)\nto every rank", ha="center", va="center", fontsize=8,
            color="dimgray")
    ax.text(0.5, 0.65, "EngineCore: one busy loop runs step(); input/output IO threads (ZMQ, (de)serialize)\nowns: step(), "
            "aborts_queue, IPC", ha="center", va="center", fontsize=8)
    ax.set_title("Figure 1-2  vLLM V1: frontend -> EngineCore -> workers (one writer per state)", fontsize=9,
                 loc="left")
    return fig


def fig_request_flow():
    """Figure 1-3: one request from HTTP to streamed tokens, boxed by the process each stage runs in."""
    import itertools

    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch, Rectangle

    stages = [("HTTP request\narrives", 0), ("serving layer:\ntemplate, tokenize;\nAsyncLLM builds\nEngineCoreRequest", 0), ("EngineCoreRequest\nZMQ -> input\nIO thread", 1),
              ("EngineCore.step()\nschedule", 1), ("ModelRunner forward\n(TP all-reduce),\nsample (1 GPU: in\nEngineCore process)", 2),
              ("EngineCoreOutputs\nZMQ -> AsyncLLM", 1), ("detokenize,\nstream SSE", 0)]
    procs = [("frontend process", "#DCE6F2"), ("EngineCore process", "#F2E6DC"), ("worker process(es)", "#E2F0D9")]
    fig, ax = plt.subplots(figsize=(12, 2.3))
    w, gap, x0 = 0.118, 0.022, 0.01
    xs = [x0 + i * (w + gap) for i in range(len(stages))]
    i = 0
    for proc, run in itertools.groupby(p for _, p in stages):  # one dashed band per run of stages in one process
        j = i + len(list(run)) - 1
        name, color = procs[proc]
        ax.add_patch(Rectangle((xs[i] - gap / 2.5, 0.08), xs[j] + w - xs[i] + 2 * gap / 2.5, 0.8, facecolor=color,
                               edgecolor="gray", linestyle="--", linewidth=0.8))
        ax.text((xs[i] + xs[j] + w) / 2, 0.81, name, ha="center", va="center", fontsize=8, color="dimgray")
        i = j + 1
    for (text, _), x in zip(stages, xs, strict=True):
        ax.add_patch(FancyBboxPatch((x, 0.2), w, 0.48, boxstyle="round,pad=0.005", facecolor="white",
                                    edgecolor="black", linewidth=0.8))
        ax.text(x + w / 2, 0.44, text, ha="center", va="center", fontsize=8)
    for x in xs[:-1]:
        ax.annotate("", xy=(x + w + gap, 0.44), xytext=(x + w, 0.44), arrowprops=dict(arrowstyle="->", lw=1.0))
    ax.set(xlim=(0, 1), ylim=(0, 1))
    ax.axis("off")
    ax.set_title("Figure 1-3  Request flow, stage by stage, in the process each runs in", fontsize=9, loc="left")
    return fig


# ---------------------------------------------------------------------------- the same run on the pinned vLLM
def _event_order(record: dict) -> str:
    """scheduler_harness events as a line: S3 = schedule() of step 3, U3 = update_from_output() of the batch
    scheduled at step 3 (its outputs arrive with the step that collects it)."""
    marks, scheduled = [], []
    for e in record["events"]:
        if e["k"] == "s":
            scheduled.append(e["step"])
            marks.append(f"S{e['step']}")
        elif e["k"] == "u":
            marks.append(f"U{scheduled.pop(0)}")
    return " ".join(marks)


def vllm_side_by_side(run: EngineRun) -> None:
    """The pinned vLLM's EngineCore on the lesson's run (two greedy requests, r0 aborted during step 3's forward):
    per step the order in which its step called the scheduler and executor, and the tokens each request got,
    beside minivllm's `run`; then the batch-queue order of async scheduling, vLLM's AsyncScheduler beside
    minivllm's, driven the same way."""
    import itertools

    from autograder import vllm_oracle
    from autograder.vllm_oracle import scheduler_harness
    from autograder.vllm_oracle.minivllm_side import MinivllmSchedulerBackend

    answers = vllm_answers("lesson01")
    site = vllm_oracle.vllm_site_packages()
    print(f"vLLM {VLLM_VERSION} 的源码：", f"{site}/vllm/" if site else "本机未安装（`make vllm` 之后在 .venv-vllm 的 site-packages/vllm/）")
    v = answers["demo_step_phases"]
    print(f"vLLM 的 EngineCore 用 {v['step_fn']}（async_scheduling={v['async_scheduling']}）；sample = "
          "execute_model 返回 None 时 step 另调的 sample_tokens（minivllm 没有这一段，不计入 ✓）")
    phases = {k: [c[1] for c in g] for k, g in itertools.groupby(v["calls"], key=lambda c: c[0])}
    steps = sorted(set(phases) | {e.step for e in run.events if e.phase in TRACE})
    for s in steps:
        mine = engine_phases(run, s)  # the phases EngineCore.step traced, in order
        toks_v = {r: t for r, t, _ in v["outputs"].get(str(s), [])}
        toks_m = {o.request_id: list(o.new_token_ids) for o in run.outputs.get(s, [])}
        same = "✓" if [p for p in phases.get(s, []) if p != "sample"] == mine and toks_v == toks_m else "✗"
        print(f"step {s}  vLLM     {' → '.join(phases.get(s, []))}   {toks_v}")
        print(f"        minivllm {' → '.join(mine)}   {toks_m}  {same}")

    mine = scheduler_harness.run(MinivllmSchedulerBackend(), vllm_oracle.scenarios("lesson01")["demo_async_batch_queue"])
    print("\nasync scheduling（两批在途，step_with_batch_queue 的顺序）：")
    print("  vLLM AsyncScheduler    ", _event_order(answers["demo_async_batch_queue"]))
    print("  minivllm AsyncScheduler", _event_order(mine))
