"""Lesson 9 — 投机解码: what the notebook shows (live runs, tables, figures); no check calls these."""
from __future__ import annotations

import time

import numpy as np

from autograder.figures import vllm_answers
from autograder.lesson09.checks import (
    DRAFT_Q,
    SPEC,
    TARGET,
    distribution_run,
    reference_runs,
    run_engine,
)

SWEEP_KS = (1, 2, 3, 5)


# ---------------------------------------------------------------------------- one run, step by step
def verification_trace():
    """The engine's own k = 3 run of the engine prompts: per verification step, (drafts, emitted) per request."""
    return reference_runs()["spec"].trace


def print_trace(trace, steps=None) -> None:
    """One line per request per verification step: drafts, how many were accepted, the tokens the step emitted.
    `steps`: which steps (default: the first 3, then the first 3 with a fully accepted draft)."""
    if steps is None:
        bonus = [s for s, step in enumerate(trace) if any(d and len(o) == len(d) + 1 for d, o in step)]
        steps = sorted(set(range(min(3, len(trace)))) | set(bonus[:3]))
    print(f"{'step':>4} {'req':>3}  {'drafts':<20}{'accepted':>9}  emitted")
    last = -1
    for s in steps:
        if s > last + 1:
            print(f"{'...':>4}")
        last = s
        for r, (drafts, out) in enumerate(trace[s]):
            acc = len(out) - 1
            mark = "bonus" if drafts and acc == len(drafts) else ("recovered" if drafts else "no draft")
            print(f"{s:>4} {'r' + str(r):>3}  {str(drafts):<20}{acc:>5}/{len(drafts):<3}  {out}  ({mark})")


# ---------------------------------------------------------------------------- k sweep
def k_sweep(ks=SWEEP_KS) -> dict:
    """The same greedy batch (3 prompts, 40 tokens) without speculation and with k = ks drafts (lookup 1..3):
    engine steps, tokens per step, acceptance rate, mean accepted length, per-position acceptance, wall time."""
    ref = reference_runs()
    rows = []
    plain = ref["plain"]
    total = sum(len(t) for t in plain.tokens)
    for k in ks:
        t0 = time.perf_counter()
        run = ref["spec"] if k == SPEC["num_speculative_tokens"] else run_engine(spec=dict(SPEC, num_speculative_tokens=k))
        wall = time.perf_counter() - t0
        s = run.stats
        # vLLM's SpecDecodingLogging divides by num_drafts; the other ratio divides by the drafts that had a
        # position j at all (an n-gram draft may be shorter than k).
        per_pos = [a / s.num_drafts if s.num_drafts else float("nan") for a in s.num_accepted_tokens_per_pos]
        per_pos_drafted = [a / d if d else float("nan") for a, d in zip(s.num_accepted_tokens_per_pos,
                                                                        s.num_draft_tokens_per_pos, strict=True)]
        rows.append(dict(k=k, steps=run.steps, tokens_per_step=total / run.steps, acceptance=s.acceptance_rate,
                         mean_len=s.mean_acceptance_length, per_pos=per_pos, per_pos_drafted=per_pos_drafted,
                         drafts=s.num_drafts,
                         draft_tokens=s.num_draft_tokens, accepted=s.num_accepted_tokens, wall=wall,
                         same=run.tokens == plain.tokens))
    return dict(plain_steps=plain.steps, total=total, rows=rows)


def print_sweep(sweep: dict) -> None:
    print(f"plain: {sweep['plain_steps']} engine steps for {sweep['total']} tokens "
          f"({sweep['total'] / sweep['plain_steps']:.2f} tokens/step)")
    print(f"{'k':>2} {'steps':>6} {'tok/step':>9} {'drafts':>7} {'draft tok':>10} {'accepted':>9} {'accept':>7} "
          f"{'mean len':>9} {'== plain':>9}")
    for r in sweep["rows"]:
        print(f"{r['k']:>2} {r['steps']:>6} {r['tokens_per_step']:>9.2f} {r['drafts']:>7} {r['draft_tokens']:>10} "
              f"{r['accepted']:>9} {r['acceptance']:>7.2f} {r['mean_len']:>9.2f} {str(r['same']):>9}")


def plot_sweep(sweep: dict):
    """Figure 9-1: acceptance rate, mean accepted length and tokens per step against k (real engine runs)."""
    import matplotlib.pyplot as plt

    ks = [r["k"] for r in sweep["rows"]]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2), layout="tight")
    axes[0].plot(ks, [r["acceptance"] for r in sweep["rows"]], "o-", color="#4C72B0")
    axes[0].set(ylabel="acceptance rate (accepted / drafted)", ylim=(0, 1))
    axes[1].plot(ks, [r["mean_len"] for r in sweep["rows"]], "o-", color="#DD8452", label="measured")
    axes[1].plot(ks, [k + 1 for k in ks], ":", color="gray", label="upper bound k + 1")
    axes[1].set_ylabel("mean tokens per verified draft")
    axes[1].legend(fontsize=8)
    axes[2].plot(ks, [r["tokens_per_step"] for r in sweep["rows"]], "o-", color="#55A868", label="speculative")
    axes[2].axhline(sweep["total"] / sweep["plain_steps"], color="black", linestyle="--", label="no speculation")
    axes[2].set_ylabel("output tokens per engine step (batch 3)")
    axes[2].legend(fontsize=8)
    for ax in axes:
        ax.set(xlabel="k = num_speculative_tokens", xticks=ks)
    fig.suptitle("Figure 9-1  n-gram speculation on the default model, greedy, 3 prompts x 40 tokens",
                 fontsize=9, x=0.01, ha="left")
    return fig


def plot_per_position(sweep: dict):
    """Figure 9-2: acceptance per draft position. Left: vLLM's rate (accepted at j / num_drafts, as
    SpecDecodingLogging and the Grafana panel compute it); right: accepted at j / drafts that had a position j."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3), sharey=True, layout="tight")
    for key, ax, title in (("per_pos", axes[0], "vLLM: num_accepted_tokens_per_pos[j] / num_drafts"),
                           ("per_pos_drafted", axes[1], "num_accepted_tokens_per_pos[j] / num_draft_tokens_per_pos[j]")):
        for r in sweep["rows"]:
            ax.plot(range(1, r["k"] + 1), r[key], "o-", label=f"k={r['k']}")
        ax.set_xticks(range(1, max(r["k"] for r in sweep["rows"]) + 1))
        ax.set(xlabel="draft position j", ylim=(0, 1))
        ax.set_title(title, fontsize=8, loc="left")
    axes[0].set_ylabel("acceptance at position j")
    axes[0].legend(fontsize=8)
    fig.suptitle("Figure 9-2  Per-position acceptance, two denominators (real engine runs)", fontsize=9, x=0.01,
                 ha="left")
    return fig


def plot_distribution(fn, n: int = 1500):
    """Figure 9-3: first emitted token of n single-request batches (k = 2, drafts drawn from q) vs p and q."""
    import matplotlib.pyplot as plt

    run = distribution_run(fn, n)
    fig, ax = plt.subplots(figsize=(7, 3), layout="tight")
    x = np.arange(len(TARGET))
    for off, (label, key) in zip((-0.3, -0.1), (("emitted, draft_probs=q", "draft_probs=q"),
                                               ("emitted, n-gram (q one-hot)", "draft_probs=None")), strict=True):
        c = run.counts[(key, "pos0")]
        ax.bar(x + off, c / c.sum(), 0.2, label=f"{label}: chi-square p = {run.p_values[(key, 'pos0')]:.2f}")
    ax.bar(x + 0.1, TARGET, 0.2, color="black", label="target p")
    ax.bar(x + 0.3, DRAFT_Q, 0.2, color="#CCCCCC", label="draft q")
    ax.set(xlabel="token id", ylabel="frequency / probability")
    ax.legend(fontsize=8)
    ax.set_title(f"Figure 9-3  Rejection sampling keeps the target distribution ({n} requests each)", fontsize=9,
                 loc="left")
    return fig, run


def acceptance_vs_overlap(fn, n: int = 2000, seed: int = 1) -> list:
    """First-draft acceptance of fn for drafts drawn from several q, next to the theory sum_x min(p(x), q(x))."""
    import torch

    from autograder.lesson09.checks import call

    p = torch.tensor(TARGET, dtype=torch.float64)
    qs = {"q = p": p.clone(), "q (Figure 9-3)": torch.tensor(DRAFT_Q, dtype=torch.float64),
          "q disjoint from p's top": torch.tensor([0.0, 0.0, 0.0, 0.0, 0.5, 0.5], dtype=torch.float64)}
    g = torch.Generator().manual_seed(seed)
    rows = []
    for name, q in qs.items():
        drafts = torch.multinomial(q, n, replacement=True, generator=g).view(n, 1).tolist()
        _, acc = call(fn, drafts, p.repeat(2 * n, 1), q.repeat(n, 1), torch.zeros(n, dtype=torch.long),
                      [False] * n, torch.rand(n, dtype=torch.float64, generator=g), g)
        rows.append((name, float(np.mean(acc)), float(torch.minimum(p, q).sum())))
    return rows


# ---------------------------------------------------------------------------- the same thing in the pinned vLLM
def vllm_side_by_side(fn) -> dict:
    """The lesson's batches through the pinned vLLM's own rejection_sample (the C++ kernels its CPU runner installs)
    next to fn; then vLLM's and fn's first emitted token over the distribution batch, against n * p."""
    import torch

    from autograder.lesson09.checks import P, call, vllm_case_inputs
    from autograder.lesson09.vllm_view import SCENARIOS

    got = vllm_answers("lesson09")
    print(f"{'batch':<22}{'drafts':<28}{'vLLM rejection_sample':<38}{'your rejection_sample':<38}same")
    for name, payload in SCENARIOS.items():
        if name == "distribution":
            continue
        out, n = call(fn, *vllm_case_inputs(payload), generator=torch.Generator().manual_seed(0))
        want = got[name]
        mine, theirs = [[t for t in r if t != P] for r in out.tolist()], \
            [[t for t in r if t != P] for r in want["output_token_ids"]]
        print(f"{name:<22}{str(payload['drafts']):<28}{str(theirs):<38}{str(mine):<38}"
              f"{'=' if mine == theirs and n == want['num_accepted'] else 'DIFFERENT'}")
    d = SCENARIOS["distribution"]
    n, k = d["n"], d["k"]
    g = torch.Generator().manual_seed(d["seed"])
    p, q = torch.tensor(d["target"], dtype=torch.float64), torch.tensor(d["draft_q"], dtype=torch.float64)
    drafts = torch.multinomial(q.float(), k * n, replacement=True, generator=g).view(n, k).tolist()
    bonus = torch.multinomial(p.float(), n, replacement=True, generator=g)
    g2 = torch.Generator().manual_seed(d["seed"] + 1)        # the uniforms vLLM drew (torch.manual_seed(seed + 1))
    out, acc = call(fn, drafts, p.repeat((k + 1) * n, 1), q.repeat(k * n, 1), bonus, [False] * n,
                    torch.rand(k * n, dtype=torch.float64, generator=g2), g2)
    mine = np.bincount(out[:, 0].numpy(), minlength=len(p)).tolist()
    theirs = got["distribution"]["first_token_counts"]
    print(f"\nfirst emitted token of {n} requests (k = {k}, drafts from q), counts:")
    print(f"{'token':<8}{'n * p':>8}{'n * q':>8}{'vLLM':>8}{'yours':>8}")
    for t in range(len(p)):
        print(f"{t:<8}{n * float(p[t]):>8.0f}{n * float(q[t]):>8.0f}{theirs[t]:>8}{mine[t]:>8}")
    print(f"accepted drafts per request 0/1/2: vLLM {got['distribution']['accepted_hist']}, "
          f"yours {np.bincount(acc, minlength=k + 1).tolist()}")
    return {"vllm": got, "yours": mine}
