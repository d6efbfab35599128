"""Lesson 4's demo: the figures and tables the notebook shows, all from real EngineCore runs (never graded)."""
from __future__ import annotations

from autograder.figures import vllm_answers
from autograder.lesson04.checks import ABORTS, WORKLOAD, run_engine

STATES = ["WAITING", "RUNNING", "PREEMPTED", "FINISHED_LENGTH_CAPPED", "FINISHED_ABORTED"]
COLORS = {"WAITING": "#bbbbbb", "RUNNING": "#2a9d8f", "PREEMPTED": "#e76f51",
          "FINISHED_LENGTH_CAPPED": "#264653", "FINISHED_STOPPED": "#264653", "FINISHED_ABORTED": "#9b5de5"}


def demo_runs(**scheduler_args):
    """The graded workload on minivllm's own Scheduler: to the end, and with the four aborts."""
    return run_engine(None, **scheduler_args), run_engine(None, aborts=ABORTS, **scheduler_args)


def print_transitions(run, last: int | None = None) -> None:
    """The lifecycle trace: one line per transition (step, the phase after which it was seen, request)."""
    rows = run.life.transitions if last is None else run.life.transitions[:last]
    for step, where, rid, old, new in rows:
        print(f"step {step:3d}  after {where:8s}  {rid}: {old} -> {new}")


def fig_swimlane(runs, titles=("to the end", "with aborts")):
    """Request state after each step's update, one lane per request (aborts marked with x)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(1, len(runs), figsize=(6.5 * len(runs), 3.2), squeeze=False, layout="tight")
    rids = [w[1] for w in WORKLOAD]
    for ax, run, title in zip(axes[0], runs, titles, strict=True):
        for lane, rid in enumerate(rids):
            for i, statuses in enumerate(run.life.steps):
                st = statuses.get(rid)
                if st is None or st == "NEW" or (st.startswith("FINISHED") and i > 0
                                                 and run.life.steps[i - 1].get(rid, "").startswith("FINISHED")):
                    continue
                ax.barh(lane, 1, left=i, color=COLORS.get(st, "white"), edgecolor="none")
            if rid in run.life.aborted_in:
                ax.plot(run.life.aborted_in[rid][0] - 0.5, lane, "kx", ms=8)
        ax.set_yticks(range(len(rids)), rids)
        ax.invert_yaxis()
        ax.set(xlabel="engine step", title=f"request states ({title}, {run.num_preemptions} preemptions)")
    handles = [Patch(color=COLORS[s], label=s) for s in STATES]
    axes[0][-1].legend(handles=handles, fontsize=8, loc="lower right")
    return fig


def preemption_summary(run) -> dict:
    """What a run's preemptions were: per request how often, at which steps, and relative to its aborts."""
    per: dict = {}
    steps = []
    for i, ids in enumerate(run.life.preempted):
        for rid in ids:
            per.setdefault(rid, []).append(i + 1)
            steps.append(i + 1)
    last_abort = max((s for s, _ in run.life.aborted_in.values()), default=None)
    return dict(total=run.num_preemptions, per_request=per, steps=steps, last_abort=last_abort,
                after_last_abort=[s for s in steps if last_abort is not None and s > last_abort])


def caption_swimlane(runs) -> str:
    """Figure 4-1's caption, written from the two runs the student sees (not from a run someone else had)."""
    lines = []
    for name, run in zip(("左图（跑到结束）", "右图（带取消）"), runs, strict=True):
        s = preemption_summary(run)
        if not s["total"]:
            lines.append(f"{name}：{run.num_steps} 步，没有抢占。")
            continue
        who = "，".join(f"{rid} {len(at)} 次（第 {'、'.join(map(str, at))} 步）"
                       for rid, at in sorted(s["per_request"].items(), key=lambda kv: -len(kv[1])))
        line = f"{name}：{run.num_steps} 步，共 {s['total']} 次抢占——{who}。"
        if s["last_abort"] is not None:
            aborts = "，".join(f"{rid} 在第 {st} 步（当时 {state}）"
                               for rid, (st, state) in sorted(run.life.aborted_in.items(), key=lambda kv: kv[1][0]))
            line += f"取消生效：{aborts}。"
            line += (f"最后一次取消（第 {s['last_abort']} 步）之后还有 {len(s['after_last_abort'])} 次抢占。"
                     if s["after_last_abort"] else f"最后一次取消（第 {s['last_abort']} 步）之后没有再发生抢占。")
        lines.append(line)
    return "\n".join(lines)


def fig_blocks(run):
    """KV blocks in use after each step, preemptions marked; free + used is the pool size every step."""
    import matplotlib.pyplot as plt

    used = [b["used"] for b in run.life.blocks]
    total = run.life.blocks[0]["total"]
    fig, ax = plt.subplots(figsize=(8, 3), layout="tight")
    ax.step(range(1, len(used) + 1), used, where="mid", label="blocks in use")
    ax.axhline(total, color="gray", ls="--", lw=1, label=f"pool ({total} usable blocks)")
    pre = [(i + 1, used[i]) for i, p in enumerate(run.life.preempted) if p]
    if pre:
        ax.plot(*zip(*pre, strict=True), "rv", label="preemption (blocks freed)")
    ax.set(xlabel="engine step", ylabel="KV blocks")
    ax.legend(fontsize=8)
    ax.set_title("KV blocks in use per step")
    return fig


def recompute_cost(repeats: int = 2) -> list[dict]:
    """The workload to the end, prefix caching off and on (A B A B; call it after demo_runs, which warms the
    engine up): tokens computed beyond the minimum (every prompt and output token once), steps, wall time
    (median). The token counts are deterministic; the seconds are not."""
    import statistics

    minimum = sum(len(p) + m - 1 for _, _, p, m in WORKLOAD)
    rows = {False: [], True: []}
    for _ in range(repeats):
        for pc in (False, True):
            rows[pc].append(run_engine(None, enable_prefix_caching=pc))
    out = []
    for pc, runs in rows.items():
        r = runs[0]
        computed = sum(sum(s.values()) for s in r.life.scheduled)
        out.append(dict(prefix_caching=pc, preemptions=r.num_preemptions, steps=r.num_steps,
                        computed_tokens=computed, recomputed_tokens=computed - minimum,
                        seconds=statistics.median(sum(x.seconds) for x in runs)))
    return out


def print_recompute_cost(rows) -> None:
    print(f"{'prefix caching':>14} {'preemptions':>11} {'steps':>6} {'computed':>9} {'recomputed':>10} {'seconds':>8}")
    for r in rows:
        print(f"{'on' if r['prefix_caching'] else 'off':>14} {r['preemptions']:>11} {r['steps']:>6} "
              f"{r['computed_tokens']:>9} {r['recomputed_tokens']:>10} {r['seconds']:>8.2f}")


# ---------------------------------------------------------------------------- the same workload on the pinned vLLM
LANE = {"WAITING": "·", "RUNNING": "R", "RUNNING-IDLE": "r", "PREEMPTED": "P", "ABORTED": "A", "length": "L",
        "stop": "S"}


def lanes(record: dict, payload: dict) -> dict[str, str]:
    """Per request, one character per step: its state after the step (· waiting, R scheduled, r running but
    not scheduled, P preempted, A aborted, L/S finished by length/stop), blank before it arrives and after."""
    state: dict[str, str] = {}
    rows: dict[str, list[str]] = {r["id"]: [] for r in payload["requests"]}
    arrival = {r["id"]: r["arrival_step"] for r in payload["requests"]}
    by_step: dict[int, list] = {}
    for e in record["events"]:
        by_step.setdefault(e["step"], []).append(e)
    for step in range(record["steps"]):
        mark = {}
        for rid, at in arrival.items():
            if at == step:
                state[rid] = "WAITING"
        for e in by_step.get(step, []):
            if e["k"] == "a":
                mark.update(dict.fromkeys(e["ids"], "ABORTED"))
            elif e["k"] == "s":
                mark.update({rid: "RUNNING" for rid, _ in e["sched"]})
                mark.update(dict.fromkeys(e["preempted"], "PREEMPTED"))
                state.update(dict.fromkeys(e["preempted"], "PREEMPTED"))
            else:
                mark.update({o[0]: o[2] for o in e["out"] if o[2]})
        for rid in rows:
            now = mark.get(rid) or state.get(rid)
            rows[rid].append(" " if now is None or now == "DONE" else LANE[now])
            if mark.get(rid) in ("ABORTED", "length", "stop"):
                state[rid] = "DONE"
            elif mark.get(rid) == "RUNNING":
                state[rid] = "RUNNING-IDLE"
    return {rid: "".join(cells).rstrip() for rid, cells in rows.items()}


def vllm_side_by_side(name: str = "demo_lifecycle") -> None:
    """The lesson's workload with its four aborts through the pinned vLLM's own Scheduler and minivllm's, as lanes
    (r: running but not scheduled this step), one line each; the last column says whether they are equal."""
    from autograder import vllm_oracle
    from autograder.lesson04.checks import run_vllm_view, vllm_difference

    answers = vllm_answers("lesson04", [name])
    payload = vllm_oracle.scenarios("lesson04")[name]
    v, m = answers[name], run_vllm_view(name)
    lv, lm = lanes(v, payload), lanes(m, payload)
    print("· waiting  R scheduled  r running, not scheduled  P preempted  A aborted  L/S finished (length/stop)")
    print(f"{'':10}{''.join(str(k // 10) if k % 10 == 0 else ' ' for k in range(v['steps']))}")
    for rid in lv:
        print(f"{rid:<3}vLLM   {lv[rid]}")
        print(f"{'':<3}mini   {lm[rid]}  {'✓' if lv[rid] == lm[rid] else '✗'}")
    diff = vllm_difference(name, m, v)
    print("每一步的调度、抢占、输出与空闲块数都与 vLLM 相同。" if diff is None else f"不同：{diff}")
