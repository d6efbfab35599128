"""Lesson 5 — GPUModelRunner：持久批与 varlen 输入准备: what the notebook shows (live runs, tables, figures);
no check calls these."""
from __future__ import annotations

import numpy as np

from autograder.lesson05.checks import (
    BLOCK_SIZE,
    NAMES,
    big_batch,
    count_lines,
    engine_inputs,
    run_engine,
    share_of_step,
    timing_ratio,
)


def engine_run():
    """The engine's own run of the lesson's workload, every step's inputs recorded."""
    return run_engine(record=True)


def pick_mixed_step(run):
    """The recorded step with the most kinds of rows (prefill after a prefix hit, chunks, decodes)."""
    return max(run.steps, key=lambda s: (len(s.features & {"prefix_hit", "partial_chunk", "final_chunk",
                                                            "decode", "new_prefill"}), s.so.total_num_scheduled_tokens))


def print_steps(run) -> None:
    print(f"{'step':>4}  {'rows (req: scheduled tokens @ computed)':<46} features")
    for k, st in enumerate(run.steps):
        b = st.batch
        rows = " ".join(f"{r}:{st.so.num_scheduled_tokens[r]}@{int(b.num_computed_tokens_cpu[i])}"
                        for i, r in enumerate(b.req_ids[:b.num_reqs]))
        sched = list(st.so.num_scheduled_tokens)
        print(f"{k + 1:>4}  {rows:<46} {', '.join(sorted(st.features))}   scheduler order {sched}")


def print_flat(step) -> None:
    b = step.batch
    print("rows of the persistent batch (InputBatch order):")
    for i, r in enumerate(b.req_ids[:b.num_reqs]):
        nb = int(b.num_blocks[i])
        print(f"  row {i}: req {r}  num_computed={int(b.num_computed_tokens_cpu[i]):>3}  "
              f"scheduled={step.so.num_scheduled_tokens[r]:>2}  num_tokens={int(b.num_tokens[i]):>3}  "
              f"block_table={b.block_table[i, :nb].tolist()}")
    for name in NAMES:
        print(f"  {name:<16}{step.want[name].tolist()}")


def plot_mixed_batch(step):
    """Figure 5-1: the ragged rows of one step (cached context grey, this step's tokens coloured) and the flat
    tensors beneath, each token's slot drawn into the physical block it lands in."""
    import matplotlib.pyplot as plt

    b, want = step.batch, step.want
    n = b.num_reqs
    qsl = want["query_start_loc"]
    colors = plt.cm.tab10(np.arange(n) % 10)
    seq_max = int(want["seq_lens"].max())
    fig, axes = plt.subplots(3, 1, figsize=(12, 2.2 + 0.5 * n + 3.2),
                             gridspec_kw={"height_ratios": [0.6 * n + 0.4, 1.2, 1.6]})
    ax = axes[0]
    for i in range(n):
        c = int(b.num_computed_tokens_cpu[i])
        s = int(qsl[i + 1] - qsl[i])
        ax.barh(i, c, color="0.85", edgecolor="0.6")
        ax.barh(i, s, left=c, color=colors[i], edgecolor="k")
        ax.barh(i, int(b.num_tokens[i]) - c - s, left=c + s, color="white", edgecolor="0.7", hatch="//")
        tag = "sampled" if (qsl[i + 1] - 1) in want["logits_indices"] else "no logits (chunk ends mid-prompt)"
        ax.text(int(b.num_tokens[i]) + 0.5, i, f"req {b.req_ids[i]}: {s} new @ pos {c}; {tag}", va="center",
                fontsize=8)
        for blk in range(0, seq_max + BLOCK_SIZE, BLOCK_SIZE):
            ax.axvline(blk, color="0.9", lw=0.5, zorder=0)
    ax.set_yticks(range(n), [f"row {i}" for i in range(n)])
    ax.invert_yaxis()
    ax.set_xlim(0, max(int(b.num_tokens[:n].max()), seq_max) * 1.45)
    ax.set_xlabel("token position in the request (grey: KV already cached; colour: scheduled now; hatched: "
                  "prompt left for later steps); grid = blocks")
    ax.set_title("Persistent batch rows (ragged)")
    ax = axes[1]
    total = int(qsl[-1])
    owner = np.repeat(np.arange(n), np.diff(qsl))
    ax.bar(np.arange(total), 1, color=colors[owner], edgecolor="k", width=1.0)
    for t in range(total):
        ax.text(t, 0.5, f"{want['positions'][t]}", ha="center", va="center", fontsize=6, rotation=90)
    for li in want["logits_indices"]:
        ax.annotate("logits", (li, 1.0), (li, 1.5), ha="center", fontsize=7, arrowprops=dict(arrowstyle="->"))
    ax.set_xticks(qsl, [f"qsl={q}" for q in qsl], fontsize=7)
    ax.set_yticks([])
    ax.set_ylim(0, 1.9)
    ax.set_xlim(-0.5, total - 0.5)
    ax.set_title("Flat varlen batch: one column per token (number = position); query_start_loc marks rows")
    ax = axes[2]
    slots = want["slot_mapping"]
    blocks = sorted(set((slots // BLOCK_SIZE).tolist()))
    for j, blk in enumerate(blocks):
        ax.add_patch(plt.Rectangle((j * (BLOCK_SIZE + 1), 0), BLOCK_SIZE, 1, fill=False, ec="0.4"))
        ax.text(j * (BLOCK_SIZE + 1) + BLOCK_SIZE / 2, -0.35, f"block {blk}", ha="center", fontsize=7)
    for t, sl in enumerate(slots):
        j = blocks.index(int(sl) // BLOCK_SIZE)
        x = j * (BLOCK_SIZE + 1) + int(sl) % BLOCK_SIZE
        ax.add_patch(plt.Rectangle((x, 0), 1, 1, color=colors[owner[t]]))
    ax.set_xlim(-1, len(blocks) * (BLOCK_SIZE + 1))
    ax.set_ylim(-0.7, 1.3)
    ax.axis("off")
    ax.set_title("slot_mapping = block_table[row, pos // block_size] * block_size + pos % block_size: "
                 "where each token's K/V is written (physical blocks, scattered)")
    fig.tight_layout()
    return fig


def plot_step_breakdown(run):
    """Figure 5-2: per-step time of prepare_inputs / forward / sample from the engine's step trace."""
    import matplotlib.pyplot as plt

    phases = ("prepare_inputs", "forward", "sample")
    per: dict = {}
    for ev in run.trace:
        if ev.phase in phases:
            per.setdefault(ev.step, dict.fromkeys(phases, 0.0))[ev.phase] += (ev.end - ev.start) * 1e3
    steps = sorted(per)
    fig, ax = plt.subplots(figsize=(10, 3.2))
    bottom = np.zeros(len(steps))
    for ph, col in zip(phases, ("tab:orange", "tab:blue", "tab:green"), strict=True):
        vals = np.array([per[s][ph] for s in steps])
        ax.bar(range(len(steps)), vals, bottom=bottom, color=col, label=ph)
        bottom += vals
    ax.set_xticks(range(len(steps)), [str(i + 1) for i in range(len(steps))])
    ax.set_xlabel("engine step")
    ax.set_ylabel("ms")
    share = share_of_step(run.trace)
    ax.set_title(f"Step time by phase (trace): prepare_inputs = {share['share']:.1%} of prepare+forward+sample")
    ax.legend()
    fig.tight_layout()
    return fig


def per_token_loop(so, batch, block_size):
    """The same six arrays with one Python iteration per token (what the exercise must not do)."""
    req_ids = batch.req_ids[:batch.num_reqs]
    ids, pos, slots, qsl, seq_lens, logits = [], [], [], [0], [], []
    for i, r in enumerate(req_ids):
        c = int(batch.num_computed_tokens_cpu[i])
        for p in range(c, c + so.num_scheduled_tokens[r]):
            ids.append(int(batch.token_ids_cpu[i, p]))
            pos.append(p)
            slots.append(int(batch.block_table[i, p // block_size]) * block_size + p % block_size)
        qsl.append(len(ids))
        seq_lens.append(c + so.num_scheduled_tokens[r])
        if seq_lens[-1] >= batch.num_tokens[i]:
            logits.append(len(ids) - 1)
    return tuple(np.array(a, dtype=np.int64) for a in (ids, pos, qsl, seq_lens, slots, logits))


def vectorised_vs_loop(fn) -> None:
    """Lines of Python run and median time on a 16k-token batch: your function, the engine, a per-token loop."""
    so, batch = big_batch()
    print(f"batch: {batch.num_reqs} requests, {so.total_num_scheduled_tokens} tokens, block_size 16")
    print(f"{'':<22}{'Python lines':>14}{'median ms':>12}{'/ engine':>10}")
    for name, f in (("your prepare_inputs", fn), ("per-token loop", per_token_loop)):
        lines = count_lines(f, so, batch, 16)
        mine, eng, ratio = timing_ratio(f, so, batch, repeats=3)
        print(f"{name:<22}{lines:>14}{mine * 1e3:>12.2f}{ratio:>10.1f}")
    print(f"{'engine _prepare_inputs':<22}{'':>14}{eng * 1e3:>12.2f}{1.0:>10.1f}")
    assert all((engine_inputs(so, batch, 16)[k] == v).all()
               for k, v in zip(NAMES, per_token_loop(so, batch, 16), strict=True))
