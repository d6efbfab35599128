"""What the lessons' demos (autograder/lessonNN/demo.py) share: the engine-trace Gantt chart, the header of every
"side by side with the pinned vLLM" section, and interleaved timing. Never called by a check."""
from __future__ import annotations

# One colour per EngineCore.step / worker phase in every trace figure (lessons 1 and 8).
PHASE_COLORS = {"schedule": "#4C72B0", "execute": "#55A868", "grammar": "#C44E52", "wait": "#8172B2",
                "aborts": "#CCB974", "update": "#64B5CD", "forward": "#DD8452", "prepare_inputs": "#937860",
                "sample": "#DA8BC3"}
SPARE_COLORS = ("#8C8C8C", "#17BECF", "#BCBD22")


def trace_gantt(ax, events, min_ms: float, top: float) -> float:
    """The trace's phases as bars, ms from the first event: the EngineCore thread (the one that schedules) above
    the worker's; sub-`min_ms` phases stay visible. A phase without a colour gets a spare one. Returns the start."""
    import matplotlib.pyplot as plt

    t0 = min(e.start for e in events)
    engine_thread = next(e.thread for e in events if e.phase == "schedule")
    colors, spare = {}, iter(SPARE_COLORS)
    for e in events:
        colors.setdefault(e.phase, PHASE_COLORS.get(e.phase) or next(spare, "#BBBBBB"))
        ax.barh(1 if e.thread == engine_thread else 0, max((e.end - e.start) * 1e3, min_ms),
                left=(e.start - t0) * 1e3, color=colors[e.phase], height=0.6, edgecolor="black", linewidth=0.3)
    ax.set(yticks=[0, 1], yticklabels=["worker thread", "EngineCore thread"], ylim=(-0.6, top), xlabel="time (ms)")
    legend = PHASE_COLORS | colors
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in legend.values()], labels=list(legend), ncol=5,
              fontsize=8, loc="upper right")
    return t0


def vllm_answers(lesson: str, names=None) -> dict:
    """The pinned vLLM's answers for the lesson's scenarios `names` (default: all), live or recorded, after
    printing which of the two they are."""
    from autograder import vllm_oracle

    answers, line = vllm_oracle.answers(lesson, list(names) if names else None)
    print(line)
    return answers


def interleaved(sides: dict, rounds: int, warmup: int = 1) -> dict:
    """Wall seconds of each side's call per round, the sides called in turn (A B A B ...) so that a busy machine
    slows them alike; the first `warmup` rounds are run and left out."""
    import time

    seconds: dict = {name: [] for name in sides}
    for r in range(warmup + rounds):
        for name, fn in sides.items():
            t = time.perf_counter()
            fn()
            if r >= warmup:
                seconds[name].append(time.perf_counter() - t)
    return seconds
