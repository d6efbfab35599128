"""Lesson 5 — GPUModelRunner：持久批与 varlen 输入准备: what the notebook shows (live runs, tables, figures);
no check calls these."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

from autograder.common import width as display_width
from autograder.figures import interleaved, vllm_answers
from autograder.lesson05.checks import (
    BLOCK_SIZE,
    NAMES,
    big_batch,
    count_lines,
    engine_inputs,
    run_engine,
)


@dataclass
class BatchStep:
    """What _update_states did to minivllm's persistent batch in one engine step."""

    so: object
    before: list = field(default_factory=list)        # rows (None = hole) after removes/adds, before condense
    condensed: list = field(default_factory=list)     # (from_row, to_row): condense moved a tail row into a hole
    swapped: list = field(default_factory=list)       # (row, row): _may_reorder_batch's swap_states (decodes first)
    rows: list = field(default_factory=list)          # the rows _prepare_inputs read


@contextlib.contextmanager
def batch_log(log: list):
    """Within: every _update_states of minivllm's runner appends a BatchStep (the class methods are wrapped
    and restored on exit; the engine's behaviour is unchanged)."""
    from unittest import mock

    from minivllm.worker.gpu_input_batch import InputBatch
    from minivllm.worker.gpu_model_runner import GPUModelRunner

    update, swap = GPUModelRunner._update_states, InputBatch.swap_states
    phase: list = [None]

    def _update_states(self, so):
        log.append(BatchStep(so))
        update(self, so)
        log[-1].rows = list(self.input_batch.req_ids[:self.input_batch.num_reqs])

    def in_phase(name, method):  # the swaps `method` makes are condense's or the reorder's
        def wrapped(self, *args):
            if log and name == "condense":
                log[-1].before = list(self.req_ids)
            phase[0] = name
            try:
                return method(self, *args)
            finally:
                phase[0] = None
        return wrapped

    def swap_states(self, i, j):
        if log and phase[0] == "condense":
            log[-1].condensed.append((j, i))        # condense swaps (hole, last): the last row moves up
        elif log and phase[0] == "swap":
            log[-1].swapped.append((i, j))
        return swap(self, i, j)

    with mock.patch.multiple(GPUModelRunner, _update_states=_update_states,
                             _may_reorder_batch=in_phase("swap", GPUModelRunner._may_reorder_batch)), \
            mock.patch.multiple(InputBatch, condense=in_phase("condense", InputBatch.condense), swap_states=swap_states):
        yield


def engine_run():
    """The engine's own run of the lesson's workload, every step's inputs recorded, and what each step's
    _update_states did to the persistent batch (run.batch_log: one BatchStep per step with tokens)."""
    log: list = []
    with batch_log(log):
        run = run_engine(record=True)
    run.batch_log = [b for b in log if b.so.total_num_scheduled_tokens > 0]
    run.v2 = v2_tables(log, max_num_reqs=4)
    assert len(run.batch_log) == len(run.steps) == len(run.v2)
    return run


def v2_tables(log: list, max_num_reqs: int, decode_query_len: int = 1) -> list:
    """Model Runner V2's bookkeeping for the same scheduler outputs (vllm/v1/worker/gpu/states.py
    RequestState; model_runner.py finish_requests / add_requests / prepare_inputs / sort_batch_req_ids): a
    request keeps the slot free_indices.pop() gave it until it finishes or is preempted; each step builds a
    fresh batch whose order is decodes first, then by token count, and idx_mapping[batch row] = slot.
    Returns one (slot -> req_id, batch req_ids, idx_mapping) per step with tokens."""
    free = list(range(max_num_reqs))
    slot: dict = {}
    out = []
    for b in log:
        so = b.so
        for r in set(so.finished_req_ids) | set(so.preempted_req_ids):
            if r in slot:
                free.append(slot.pop(r))
        for new in so.scheduled_new_reqs:
            slot[new.req_id] = free.pop()
        cached = so.scheduled_cached_reqs
        for r, resumed in zip(cached.req_ids, cached.resumed_from_preemption, strict=False):
            if resumed and r not in slot:
                slot[r] = free.pop()
        if so.total_num_scheduled_tokens == 0:
            continue
        n = so.num_scheduled_tokens
        order = sorted(n, key=lambda r: (n[r] != decode_query_len, n[r]))
        out.append(({s: r for r, s in slot.items()}, order, [slot[r] for r in order]))
    return out


def _pad(text: str, cols: int) -> str:
    """Left-justify to a display width (common.pad leaves at least one space; the table puts two between
    columns itself)."""
    return text + " " * max(0, cols - display_width(text))


def print_v1_v2(run) -> None:
    """Per step: V1's rows and what moved them; V2's slot table and idx_mapping for the same step."""
    head = ["step", "V1 rows after _update_states", "moves (condense / swap)", "V2 slots 0..3",
            "idx_mapping (batch order)"]
    body = []
    for k, (b, (table, order, idx)) in enumerate(zip(run.batch_log, run.v2, strict=True)):
        moves = [f"C{f}->{t}" for f, t in b.condensed] + [f"S{i}<->{j}" for i, j in b.swapped]
        body.append([str(k + 1), str(b.rows), " ".join(moves) or "-", " ".join(table.get(s, "·") for s in range(4)),
                     f"{idx}  ({' '.join(order)})"])
    width = [max(display_width(r[c]) for r in [head, *body]) for c in range(len(head))]
    for r in [head, *body]:  # two spaces between columns; the step number right-aligned
        print(" " * (width[0] - display_width(r[0])) + r[0] + "  "
              + "  ".join(_pad(x, w) for x, w in zip(r[1:-1], width[1:-1], strict=True)) + "  " + r[-1])
    print("V1 row moves in this run (V2: none, each request stays in its slot):")
    for k, b in enumerate(run.batch_log):
        for f, t in b.condensed:
            print(f"  step {k + 1}: condense moved req {b.before[f]} from row {f} into the hole at row {t}")
        for i, j in b.swapped:
            print(f"  step {k + 1}: swap_states exchanged rows {i} and {j} (decode first: req {b.rows[i]} "
                  f"now row {i}, req {b.rows[j]} row {j})")


def moved_rows(run) -> dict:
    """How often minivllm's persistent batch moved a row (each move copies the row's token ids, block table
    and sampling state) against V2 (no row ever moves: a slot is written once, on admission)."""
    return {"steps": len(run.batch_log), "condense_moves": sum(len(b.condensed) for b in run.batch_log),
            "reorder_swaps": sum(len(b.swapped) for b in run.batch_log), "v2_moves": 0}


def plot_v1_vs_v2(run):
    """Figure 5-3: the same recorded steps as V1's persistent batch (rows move: condense, swap) and as V2's
    request-state table (a request stays in its slot) with that step's idx_mapping beneath."""
    import matplotlib.pyplot as plt

    reqs = sorted({r for b in run.batch_log for r in b.rows})
    color = {r: plt.cm.tab10(i % 10) for i, r in enumerate(reqs)}
    steps = len(run.batch_log)
    rows = 4
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(max(10, 0.75 * steps + 2), 7.2),
                                 gridspec_kw={"height_ratios": [rows, rows + 1.6]}, layout="tight")
    for k, b in enumerate(run.batch_log):
        for i, r in enumerate(b.rows):
            a1.add_patch(plt.Rectangle((k, i), 0.92, 0.92, color=color[r]))
            a1.text(k + 0.46, i + 0.46, f"req {r}", ha="center", va="center", fontsize=8)
        for f, t in b.condensed:
            a1.annotate("", (k + 0.2, t + 0.5), (k + 0.2, f + 0.5),
                        arrowprops=dict(arrowstyle="->", color="k", lw=1.4))
            a1.text(k + 0.05, t + 0.15, "condense", fontsize=8)
        for i, j in b.swapped:
            a1.annotate("", (k + 0.8, i + 0.5), (k + 0.8, j + 0.5),
                        arrowprops=dict(arrowstyle="<->", color="crimson", lw=1.4))
            a1.text(k + 0.5, i + 0.85, "swap", fontsize=8, color="crimson")
    m = moved_rows(run)
    a1.set_title(f"V1 persistent batch (minivllm InputBatch, vLLM gpu_input_batch.py): rows moved "
                 f"{m['condense_moves']}x by condense, {m['reorder_swaps']}x by swap_states in {steps} steps")
    table_rows = rows + 1.6
    for k, (table, _order, idx) in enumerate(run.v2):
        for s, r in table.items():
            a2.add_patch(plt.Rectangle((k, s), 0.92, 0.92, color=color.get(r, "0.8")))
            a2.text(k + 0.46, s + 0.46, f"req {r}", ha="center", va="center", fontsize=8)
        a2.text(k + 0.46, rows + 0.7, "\n".join(map(str, idx)), ha="center", va="top", fontsize=8,
                family="monospace")
    a2.axhline(rows + 0.1, color="0.5", lw=0.8)
    a2.set_title("V2 request-state table (vllm/v1/worker/gpu/states.py RequestState: a request keeps its slot) "
                 "and idx_mapping[batch row] = slot (below, decodes first)")
    for ax, h, labels in ((a1, rows, [f"row {i}" for i in range(rows)]),
                          (a2, table_rows, [f"slot {i}" for i in range(rows)])):
        ax.set(xlim=(-0.1, steps), ylim=(h, -0.1), yticks=[i + 0.46 for i in range(rows)], yticklabels=labels,
               xticks=[k + 0.46 for k in range(steps)], xticklabels=[str(k + 1) for k in range(steps)],
               xlabel="engine step")
    a2.text(-0.05, rows + 0.7, "idx_mapping", ha="right", va="top", fontsize=8)
    return fig


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
                             gridspec_kw={"height_ratios": [0.6 * n + 0.4, 1.2, 1.6]}, layout="tight")
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
        ax.text(t, 0.5, f"{want['positions'][t]}", ha="center", va="center", fontsize=8)
    for li in want["logits_indices"]:
        ax.annotate("logits", (li, 1.0), (li, 1.5), ha="center", fontsize=8, arrowprops=dict(arrowstyle="->"))
    ax.set_xticks(qsl, [f"qsl={q}" for q in qsl], fontsize=8)
    ax.set_yticks([])
    ax.set(ylim=(0, 1.9), xlim=(-0.5, total - 0.5))
    ax.set_title("Flat varlen batch: one column per token (number = position); query_start_loc marks rows")
    ax = axes[2]
    slots = want["slot_mapping"]
    blocks = sorted(set((slots // BLOCK_SIZE).tolist()))
    for j, blk in enumerate(blocks):
        ax.add_patch(plt.Rectangle((j * (BLOCK_SIZE + 1), 0), BLOCK_SIZE, 1, fill=False, ec="0.4"))
        ax.text(j * (BLOCK_SIZE + 1) + BLOCK_SIZE / 2, -0.35, f"block {blk}", ha="center", fontsize=8)
    for t, sl in enumerate(slots):
        j = blocks.index(int(sl) // BLOCK_SIZE)
        x = j * (BLOCK_SIZE + 1) + int(sl) % BLOCK_SIZE
        ax.add_patch(plt.Rectangle((x, 0), 1, 1, color=colors[owner[t]]))
    ax.set(xlim=(-1, len(blocks) * (BLOCK_SIZE + 1)), ylim=(-0.7, 1.3))
    ax.axis("off")
    ax.set_title("slot_mapping = block_table[row, pos // block_size] * block_size + pos % block_size: "
                 "where each token's K/V is written (physical blocks, scattered)")
    return fig


def plot_step_breakdown(run):
    """Figure 5-2: per-step time of prepare_inputs / forward / sample from the engine's step trace."""
    import matplotlib.pyplot as plt

    phases = ("prepare_inputs", "forward", "sample")
    per = step_phases(run)
    steps = sorted(per)
    fig, ax = plt.subplots(figsize=(10, 3.2), layout="tight")
    bottom = np.zeros(len(steps))
    for ph, col in zip(phases, ("tab:orange", "tab:blue", "tab:green"), strict=True):
        vals = np.array([per[s][ph] for s in steps])
        ax.bar(range(len(steps)), vals, bottom=bottom, color=col, label=ph)
        bottom += vals
    ax.set_xticks(range(len(steps)), [str(i + 1) for i in range(len(steps))])
    ax.set(xlabel="engine step", ylabel="ms")
    share = median_share(run)
    ax.set_title(f"Step time by phase (trace). prepare_inputs: median {share:.1%} of a step's prepare+forward+sample "
                 "(step 1 warms up: left out)", fontsize=9)
    ax.legend(fontsize=8)
    return fig


def step_phases(run) -> dict:
    """step -> ms per traced phase (prepare_inputs / forward / sample)."""
    phases = ("prepare_inputs", "forward", "sample")
    per: dict = {}
    for ev in run.trace:
        if ev.phase in phases:
            per.setdefault(ev.step, dict.fromkeys(phases, 0.0))[ev.phase] += (ev.end - ev.start) * 1e3
    return per


def median_share(run) -> float:
    """prepare_inputs' share of prepare+forward+sample, per step, median over the steps after the first (the first
    step pays the warm-up: allocations and the first call of every kernel): a figure one slow step cannot move."""
    import statistics

    per = step_phases(run)
    shares = [v["prepare_inputs"] / (sum(v.values()) or 1.0) for s, v in sorted(per.items())[1:]]
    return statistics.median(shares) if shares else 0.0


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


def vectorised_vs_loop(fn, rounds: int = 9) -> dict:
    """Lines of Python run (deterministic) and time on a 16k-token batch: your function, the engine's and a per-token
    loop, one round of the three interleaved per repetition after a warm-up round; every ratio is to the engine's
    median of the same rounds, so the table's "/ engine" column is its own milliseconds divided."""
    import statistics

    so, batch = big_batch()
    sides = {"your prepare_inputs": lambda: fn(so, batch, 16), "engine _prepare_inputs": lambda: engine_inputs(so, batch, 16),
             "per-token loop": lambda: per_token_loop(so, batch, 16)}
    med = {k: statistics.median(v) * 1e3 for k, v in interleaved(sides, rounds).items()}
    lines = {"your prepare_inputs": count_lines(fn, so, batch, 16), "engine _prepare_inputs": None,
             "per-token loop": count_lines(per_token_loop, so, batch, 16)}
    print(f"batch: {batch.num_reqs} requests, {so.total_num_scheduled_tokens} tokens, block_size 16; time: median of "
          f"{rounds} interleaved rounds after a warm-up")
    print(f"{'':<24}{'Python lines':>14}{'median ms':>12}{'/ engine':>10}")
    for name in sides:
        n = "" if lines[name] is None else lines[name]
        print(f"{name:<24}{n!s:>14}{med[name]:>12.2f}{med[name] / med['engine _prepare_inputs']:>10.1f}")
    assert all((engine_inputs(so, batch, 16)[k] == v).all()
               for k, v in zip(NAMES, per_token_loop(so, batch, 16), strict=True))
    return {"lines": lines, "ms": med}


def minivllm_steps(case: dict) -> list:
    """minivllm's engine on the vLLM view's workload (its block size): every step's rows and six arrays."""
    from autograder.lesson05.checks import make_llm, recording
    from minivllm.sampling_params import SamplingParams

    llm = make_llm(**case["engine"])
    try:
        tok = llm.get_tokenizer()
        ids = [tok.encode(t) for t in case["prompts"]]
        engine, steps, step = llm.llm_engine, [], 0
        with recording(steps):
            while step < 500 and (step <= max(case["arrivals"]) or engine.has_unfinished_requests()):
                for i, at in enumerate(case["arrivals"]):
                    if at == step:
                        engine.add_request(str(i), ids[i], SamplingParams(max_tokens=case["max_tokens"][i],
                                                                          temperature=0.0, ignore_eos=True))
                engine.step()
                step += 1
    finally:
        llm.llm_engine.engine_core.shutdown()
    return [{"rows": list(s.batch.req_ids[:s.batch.num_reqs]), "scheduled": dict(s.so.num_scheduled_tokens),
             **{n: s.want[n].tolist() for n in NAMES}} for s in steps]


def per_request(step: dict) -> dict:
    """One step's arrays by request: (input_ids, positions, slot_mapping, seq_len, takes logits)."""
    qsl, out = step["query_start_loc"], {}
    for i, r in enumerate(step["rows"]):
        lo, hi = qsl[i], qsl[i + 1]
        out[r] = (step["input_ids"][lo:hi], step["positions"][lo:hi], step["slot_mapping"][lo:hi],
                  step["seq_lens"][i], hi - 1 in step["logits_indices"])
    return out


def vllm_side_by_side() -> list:
    """The pinned vLLM's CPUModelRunner and minivllm's runner on the same workload, step by step: each persistent
    batch's rows (req:scheduled), whether every request's tokens, positions, seq_len and slots are equal, and
    which requests' last token goes to the LM head (logits_indices)."""
    from autograder import vllm_oracle

    answers = vllm_answers("lesson05", ["lesson"])
    v = answers["lesson"]
    case = vllm_oracle.scenarios("lesson05")["lesson"]
    m = minivllm_steps(case)
    print(f"vLLM 的 runner：{v['runner']}（父类 {v['bases'][0]}）；block_size {case['engine']['block_size']}")
    print(f"\n{'step':>4}  {'vLLM rows':<20}{'minivllm rows':<20}{'ids·pos·len':>11}{'slot':>6}   logits: vLLM / minivllm")
    out = []
    for k, (a, b) in enumerate(zip(v["steps"], m, strict=True)):
        pa, pb = per_request(a), per_request(b)
        same = all(pa[r][:2] + pa[r][3:4] == pb[r][:2] + pb[r][3:4] for r in pa) and pa.keys() == pb.keys()
        slots = all(pa[r][2] == pb[r][2] for r in pa)
        la, lb = ([r for r, x in p.items() if x[4]] for p in (pa, pb))
        out.append((same, slots, la, lb))
        cell = [" ".join(f"{r}:{s['scheduled'][r]}" for r in s["rows"]) for s in (a, b)]
        print(f"{k + 1:>4}  {cell[0]:<20}{cell[1]:<20}{'=' if same else '≠':>11}{'=' if slots else '≠':>6}   "
              f"{','.join(la) or '-'} / {','.join(lb) or '-'}")
    return out
