"""Lesson 2 — 统一调度器与 KVCacheManager: what the notebook shows (live demos, tables, figures); no check calls these."""
from __future__ import annotations

from autograder.figures import vllm_answers
from autograder.lesson02.checks import EngineRun, _prompt, make_core, run_engine, run_scenario


def print_steps(run: EngineRun, first: int = 1, last: int | None = None) -> None:
    """Per step: tokens per request (d = decode, p = prefill chunk), preemptions and admissions."""
    for r in run.steps[first - 1:last]:
        cells = " ".join(f"{rid}:{n}{'d' if rid in r.decoding else 'p'}" for rid, n in r.scheduled.items())
        extra = (f"  抢占 {sorted(r.preempted)}" if r.preempted else "") + (f"  接纳 {r.admitted}" if r.admitted else "")
        print(f"step {r.step:>3}  {sum(r.scheduled.values()):>3}/{r.budget}  {cells}{extra}")


# ---------------------------------------------------------------------------- the chunked-prefill demo
# Four short requests are decoding when a 480-token prompt arrives (step 4), and another at step 14.
DEMO_WORKLOAD = ([(0, f"d{i}", _prompt(10 + i, 16), 32) for i in range(4)]
                 + [(4, "long0", _prompt(20, 480), 4), (14, "long1", _prompt(21, 480), 4)])
DEMO_CONFIGS = {  # label -> engine args; 'off' = chunked prefill disabled (the budget must cover max_model_len)
    "off": dict(enable_chunked_prefill=False, max_num_batched_tokens=512),
    "256": dict(max_num_batched_tokens=512, long_prefill_token_threshold=256),
    "128": dict(max_num_batched_tokens=512, long_prefill_token_threshold=128),
    "64": dict(max_num_batched_tokens=512, long_prefill_token_threshold=64),
}


def run_demo(labels=tuple(DEMO_CONFIGS), repeats: int = 2) -> dict[str, EngineRun]:
    """The demo workload under each configuration (reference Scheduler, default model, CPU), on one engine.
    The schedule is deterministic, so the runs of one configuration differ only in timing: each step keeps
    the fastest of `repeats` runs (the first also warms up the kernels for these shapes; a shared machine's
    noise only ever adds time)."""
    core = make_core(max_model_len=512, max_num_batched_tokens=512)
    runs: dict[str, EngineRun] = {}
    try:
        for i in range(repeats):
            print(f"第 {i + 1}/{repeats} 遍：{', '.join(labels)} 各跑一次……", flush=True)
            for k in labels:
                run = run_engine(None, workload=DEMO_WORKLOAD, core=core, **DEMO_CONFIGS[k])
                if k not in runs:
                    runs[k] = run
                    continue
                for kept, new in zip(runs[k].steps, run.steps, strict=True):
                    assert kept.scheduled == new.scheduled
                    kept.seconds = min(kept.seconds, new.seconds)
        return runs
    finally:
        core.shutdown()


def step_latencies(run: EngineRun, workload=DEMO_WORKLOAD) -> tuple[dict, list]:
    """From the per-step wall times: TTFT of every request that arrives after step 0 (the steps from its
    arrival through the one that samples its first token) and the decoding requests' inter-token latencies
    (each decode step delivers one token to each of them)."""
    arrive = {rid: a for a, rid, _, _ in workload}
    ttft = {}
    for rid, a in arrive.items():
        if a == 0:
            continue
        first_decode = next(k for k, r in enumerate(run.steps) if rid in r.decoding)
        ttft[rid] = sum(r.seconds for r in run.steps[a:first_decode])
    itl = [r.seconds for r in run.steps for rid in r.decoding if arrive[rid] == 0 and rid in r.scheduled]
    return ttft, itl


def itl_during_prefill(run: EngineRun) -> list[float]:
    """The decodes' inter-token latency in the steps that also carry a long prompt's prefill (or a chunk)."""
    return [r.seconds for r in run.steps if r.prefill_tokens and r.decode_tokens]


def latency_table(runs: dict[str, EngineRun]) -> list[dict]:
    """Per configuration: prefill steps and TTFT of the long prompts, the decodes' inter-token latency (ms)."""
    import statistics

    rows = []
    for label, run in runs.items():
        ttft, itl = step_latencies(run)
        first = {rid: next(k for k, r in enumerate(run.steps) if rid in r.scheduled) for rid in ttft}
        done = {rid: next(k for k, r in enumerate(run.steps) if rid in r.decoding) for rid in ttft}
        rows.append(dict(threshold=label, steps=len(run.steps),
                         prefill_steps=max(done[r] - first[r] for r in ttft),
                         max_step_tokens=max(sum(r.scheduled.values()) for r in run.steps if r.decode_tokens),
                         ttft_ms=statistics.mean(ttft.values()) * 1e3,
                         itl_p50_ms=statistics.median(itl) * 1e3, itl_max_ms=max(itl) * 1e3,
                         itl_prefill_ms=statistics.mean(itl_during_prefill(run)) * 1e3))
    return rows


def print_latency_table(rows: list[dict]) -> None:
    """The deterministic columns first (the schedule: the same on every run), then this machine's milliseconds."""
    print("          -- every run (the schedule) --   ---- this machine's ms (they move with its load) ----")
    print(f"{'threshold':>9} {'prefill steps':>14} {'max tokens':>11}   {'long TTFT':>10} {'ITL p50':>8} "
          f"{'ITL in prefill':>15} {'ITL max':>8}")
    for r in rows:
        print(f"{r['threshold']:>9} {r['prefill_steps']:>14} {r['max_step_tokens']:>11}   {r['ttft_ms']:>10.1f} "
              f"{r['itl_p50_ms']:>8.1f} {r['itl_prefill_ms']:>15.1f} {r['itl_max_ms']:>8.1f}")
    print("max tokens: the largest step a decoding request waits for (it bounds the decode's ITL)")


# ---------------------------------------------------------------------------- figures
def fig_concurrent_partial(schedule_step=None):
    """Figure 2-1: the 3 x 800 scenario on minivllm's Scheduler, tokens per request per step."""
    import matplotlib.pyplot as plt

    steps = run_scenario(schedule_step, prompt_lens=(800, 800, 800), num_steps=4, max_num_batched_tokens=1024,
                         long_prefill_token_threshold=400)
    fig, ax = plt.subplots(figsize=(7, 3.4))
    colors = ["#4C72B0", "#DD8452", "#55A868"]
    for k, s in enumerate(steps):
        bottom = 0
        for j, rid in enumerate(("0", "1", "2")):
            n = s.get(rid, 0)
            ax.bar(k + 1, n, bottom=bottom, color=colors[j], edgecolor="black", linewidth=0.4,
                   label=f"request {rid}" if k == 0 else None)
            if n >= 100:
                ax.text(k + 1, bottom + n / 2, str(n), ha="center", va="center", fontsize=8)
            bottom += n
        small = [f"r{rid}: {n}" for rid, n in s.items() if n < 100]
        if small:
            ax.text(k + 1, bottom + 15, "\n".join(small) + "\n(decode)", ha="center", va="bottom", fontsize=8)
    ax.axhline(1024, color="red", linestyle="--", linewidth=1, label="token budget 1024")
    ax.set_xticks(range(1, len(steps) + 1))
    ax.set(xlabel="engine step", ylabel="tokens scheduled", ylim=(0, 1250))
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title("Figure 2-1  3 x 800-token prompts, budget 1024, long_prefill_token_threshold 400", fontsize=9,
                 loc="left")
    return fig


def fig_prefill_decode(runs: dict[str, EngineRun], labels=("off", "128")):
    """Figure 2-2: per-step prefill vs decode tokens (stacked) and the step's wall time, per configuration."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(labels), 1, figsize=(10, 2.6 * len(labels)), sharex=True, layout="tight")
    top = max(r.seconds for label in labels for r in runs[label].steps) * 1e3 * 1.1
    for ax, label in zip(axes, labels, strict=True):
        run = runs[label]
        x = [r.step for r in run.steps]
        dec = [r.decode_tokens for r in run.steps]
        pre = [r.prefill_tokens for r in run.steps]
        ax.bar(x, dec, color="#4C72B0", label="decode tokens")
        ax.bar(x, pre, bottom=dec, color="#DD8452", label="prefill tokens")
        ax.axhline(run.steps[0].budget, color="red", linestyle="--", linewidth=0.8, label="token budget")
        ax.set_ylabel("tokens")
        ax2 = ax.twinx()
        ax2.plot(x, [r.seconds * 1e3 for r in run.steps], color="black", marker=".", linewidth=0.8,
                 label="step wall time")
        ax2.set(ylabel="ms / step", ylim=(0, top))
        name = "chunked prefill off" if label == "off" else f"chunked prefill, long_prefill_token_threshold={label}"
        ax.set_title(f"{name} (budget {run.steps[0].budget})", fontsize=9, loc="left")
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper right")
    axes[-1].set_xlabel("engine step")
    fig.suptitle("Figure 2-2  Prefill vs decode tokens per step (minivllm, default model, CPU)", fontsize=9, x=0.01,
                 ha="left")
    return fig


def fig_tradeoff(rows: list[dict]):
    """Figure 2-3: what the threshold does to the decodes' ITL and to the long prompts' TTFT."""
    import matplotlib.pyplot as plt

    labels = [r["threshold"] for r in rows]
    x = range(len(rows))
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4.0), layout="tight")
    a.bar(x, [r["ttft_ms"] for r in rows], color="#DD8452")
    for i, r in enumerate(rows):  # the deterministic part of the cost: the steps a long prompt takes
        a.text(i, 0, f"{r['prefill_steps']} steps", ha="center", va="bottom", fontsize=8)
    a.set_title("TTFT of the long prompts (mean, ms; this machine)", fontsize=9, loc="left")
    b.plot(x, [r["itl_max_ms"] for r in rows], marker="o", color="#C44E52", label="max")
    b.plot(x, [r["itl_prefill_ms"] for r in rows], marker="o", color="#DD8452",
           label="mean over steps that carry a prefill")
    b.plot(x, [r["itl_p50_ms"] for r in rows], marker="o", color="#4C72B0", label="p50 (all steps)")
    b.set_title("inter-token latency of the decoding requests (ms)", fontsize=9, loc="left")
    b.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=3, frameon=False)  # under the axes
    for ax in (a, b):
        ax.set(xticks=list(x), xticklabels=labels, xlabel="long_prefill_token_threshold ('off' = no chunked prefill)")
    fig.suptitle("Figure 2-3  What the threshold changes: long-prompt TTFT and decode ITL (measured, CPU)", fontsize=9,
                 x=0.01, ha="left")
    return fig


# ---------------------------------------------------------------------------- the same scenarios on the pinned vLLM
def vllm_side_by_side(names=("demo_3x800", "demo_preemption")) -> None:
    """The pinned vLLM's own Scheduler and minivllm's on the same workloads, step by step: tokens per request,
    preemptions (!) and free KV blocks after schedule(); the last column says whether the plans are equal."""
    from autograder import vllm_oracle
    from autograder.lesson02.checks import plan, run_vllm_view

    answers = vllm_answers("lesson02", names)
    for name in names:
        v, m = answers[name], run_vllm_view(name)
        free_v = [e["free_blocks"] for e in v["events"] if e["k"] == "s"]
        free_m = [e["free_blocks"] for e in m["events"] if e["k"] == "s"]
        print(f"\n{name}（{vllm_oracle.scenarios('lesson02')[name]['config']['num_blocks']} 个 KV 块）")
        print(f"{'step':>4}  {'vLLM Scheduler':<34}{'minivllm Scheduler':<34}free v/m  同")
        for k, ((vs, vp), (ms, mp)) in enumerate(zip(plan(v), plan(m), strict=True)):
            cell = [" ".join(f"{r}:{n}" for r, n in s.items()) + "".join(f" !{r}" for r in p)
                    for s, p in ((vs, vp), (ms, mp))]
            same = "✓" if (vs, vp) == (ms, mp) else "✗"
            print(f"{k + 1:>4}  {cell[0]:<34}{cell[1]:<34}{free_v[k]:>4}/{free_m[k]:<4} {same}")
