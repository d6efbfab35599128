"""Lesson 8's demos: a mixed batch on the real engine, its trace (grammar under the forward), one bitmask row.

Never called by a check; the notebook shows these.
"""
from __future__ import annotations

import torch

from autograder.lesson08.checks import default_vocab, run_engine, unpack, xgrammar_choice_bitmask

COLORS = {"schedule": "#4C72B0", "execute": "#55A868", "grammar": "#C44E52", "wait": "#8172B2", "aborts": "#CCB974",
          "update": "#64B5CD", "forward": "#DD8452", "prepare_inputs": "#937860", "sample": "#DA8BC3"}


def allowed_next(generated: str, choices: list[str]) -> list[str]:
    """The tokens xgrammar allows after `generated` for a choice constraint, as text (EOS as <eos>)."""
    vocab = default_vocab()
    bitmask = xgrammar_choice_bitmask(["r"], {"r": generated.encode()}, {"r": [c.encode() for c in choices]}, vocab)
    ids = unpack(bitmask, vocab.vocab_size)[0].nonzero().flatten().tolist()
    return ["<eos>" if t == vocab.eos_token_id else vocab.token_bytes[t].decode("utf-8", "replace") for t in ids]


def show_words(generated: str, choices: list[str], words: int = 4) -> None:
    """Print the first int32 words of one bitmask row in binary (bit 0 on the right), with their tokens."""
    vocab = default_vocab()
    bitmask = xgrammar_choice_bitmask(["r"], {"r": generated.encode()}, {"r": [c.encode() for c in choices]}, vocab)
    row = unpack(bitmask, vocab.vocab_size)[0]
    nonzero = [w for w in range(bitmask.shape[1]) if row[32 * w:32 * w + 32].any()][:words]
    for w in nonzero:
        value = int(bitmask[0, w])
        toks = [vocab.token_bytes[t].decode("utf-8", "replace") or "<eos>" for t in range(32 * w, 32 * w + 32)
                if t < vocab.vocab_size and row[t]]
        print(f"word {w:3d} = {value:>12d} = {value & 0xFFFFFFFF:032b}  -> tokens {toks}")


def run_demo():
    """The real engine, its own xgrammar bitmask: choice requests among free ones."""
    return run_engine()


def overlap_share(events) -> tuple[float, float, int]:
    """Over steps whose sampling waited for a bitmask: the share of grammar time spent before the step's forward
    ended (it delayed nothing), and the stricter share inside the forward span itself."""
    span = {(e.step, e.phase): e for e in events}
    total = hidden = inside = 0.0
    steps = 0
    for (s, p), g in span.items():
        f = span.get((s, "forward"))
        if p != "grammar" or f is None or (s, "sample") not in span:
            continue
        steps += 1
        total += g.end - g.start
        hidden += (g.end - g.start) - max(0.0, g.end - max(g.start, f.end))
        inside += max(0.0, min(g.end, f.end) - max(g.start, f.start))
    return (hidden / total if total else 0.0), (inside / total if total else 0.0), steps


def grammar_steps(events) -> dict:
    """Over steps whose sampling waited for a bitmask: how many there were, in how many the grammar phase ended
    before the step's forward ended (it delayed nothing), and the grammar phase's median and largest duration
    (this run's wall clock). The step count is deterministic; on a loaded 2-core machine, 6 runs gave 12/12 steps
    finished before the forward every time, a median of 28-73 us and a largest step of 0.16-5.3 ms."""
    import statistics
    span = {(e.step, e.phase): e for e in events}
    done = [(g.end <= span[(s, "forward")].end, 1e6 * (g.end - g.start)) for (s, p), g in span.items()
            if p == "grammar" and (s, "forward") in span and (s, "sample") in span]
    us = [d for _, d in done]
    return dict(steps=len(done), before_forward_end=sum(ok for ok, _ in done),
                median_us=statistics.median(us) if us else 0.0, max_us=max(us, default=0.0))


def plot_overlap(events, num_steps: int = 4):
    """Gantt chart of a few steps: EngineCore thread (schedule, execute, grammar, wait, ...) over the worker's."""
    import matplotlib.pyplot as plt
    span = {(e.step, e.phase): e for e in events}
    steps = sorted(s for (s, p) in span if p == "grammar" and (s, "sample") in span)[:num_steps]
    evs = [e for e in events if e.step in steps]
    t0 = min(e.start for e in evs)
    engine_thread = next(e.thread for e in evs if e.phase == "schedule")
    fig, ax = plt.subplots(figsize=(11, 2.6))
    for e in evs:
        y = 1 if e.thread == engine_thread else 0
        ax.barh(y, max((e.end - e.start) * 1e3, 0.05), left=(e.start - t0) * 1e3, height=0.6,
                color=COLORS.get(e.phase, "#BBBBBB"), edgecolor="black", linewidth=0.3)
    ax.set_yticks([0, 1], ["worker thread", "EngineCore thread"])
    ax.set_xlabel("time (ms)")
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()], labels=list(COLORS),
              ncol=5, fontsize=8, loc="upper right")
    ax.set_ylim(-0.6, 2.3)
    ax.set_title(f"minivllm trace, steps {steps[0]}-{steps[-1]}: the grammar bitmask (red) runs while the "
                 "worker's forward (orange) does; sample waits for both", fontsize=9, loc="left")
    fig.tight_layout()
    return fig


def print_outputs(run) -> None:
    for req_id, text in run.outputs.items():
        print(f"{req_id}: {text!r:24} finish={run.finish[req_id]:5} choices={run.choices[req_id]}")
    same = all(run.free_mixed[r] == t for r, t in run.free_alone.items())
    print(f"free requests equal to their run without constrained neighbours: {same}")


def masked_logits_example():
    """A 2x70 logits batch and a bitmask, for trying apply_bitmask_and_sample by hand."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 70, generator=gen)
    bitmask = torch.tensor([[1 << 5 | 1 << 9, 0, 0], [-1, -1, -1]], dtype=torch.int32)
    return logits, bitmask


# ---------------------------------------------------------------------------- the same rows on the pinned vLLM
def _tokens(vocab, allowed_row, top: int = 4) -> str:
    ids = allowed_row.nonzero().flatten().tolist()
    shown = ["EOS" if t == vocab.eos_token_id else repr(vocab.token_bytes[t].decode("utf-8", "replace"))
             for t in ids[:top]]
    return f"{len(ids):>3} " + " ".join(shown) + (" …" if len(ids) > top else "")


def vllm_side_by_side(choice_bitmask, batch: str = "batch_batch_order", walk: str = "walk_perchance") -> None:
    """The pinned vLLM's StructuredOutputManager.grammar_bitmask rows (scheduler order) beside yours (batch order)
    for one of the lesson's batches, then one request walked token by token: allowed tokens per step."""
    from autograder import vllm_oracle
    from autograder.lesson08.checks import Scenario, vllm_rows_in_batch_order, vllm_walk_steps

    vocab = default_vocab()
    answers, line = vllm_oracle.answers("lesson08", [batch, walk])
    print(line)
    case, want = vllm_oracle.scenarios("lesson08")[batch], answers[batch]
    sc = Scenario(batch, list(case["batch"]), {r: bytes(case["generated"][r]) for r in case["scheduled"]},
                  {r: [c.encode() for c in case["choices"][r]] for r in case["scheduled"]})
    mine = choice_bitmask(sc.batch_req_ids, dict(sc.generated), dict(sc.choices), vocab.trie, vocab.eos_token_id,
                          vocab.vocab_size)
    v_rows = unpack(torch.tensor(want["rows"], dtype=torch.int32), vocab.vocab_size)
    m_rows = unpack(mine, vocab.vocab_size)
    print(f"\n{'row':>3}  {'vLLM grammar_bitmask（调度顺序）':<44}{'你的 choice_bitmask（批内顺序）':<40}")
    for i in range(len(sc.batch_req_ids)):
        print(f"{i:>3}  {want['order'][i]:<7}{_tokens(vocab, v_rows[i]):<38}"
              f"{sc.batch_req_ids[i]:<7}{_tokens(vocab, m_rows[i])}")
    same = torch.equal(mine, vllm_rows_in_batch_order(want, sc.batch_req_ids))
    print(f"按请求 id 把 vLLM 的行重排成批内顺序（runner 的 apply_grammar_bitmask 做的事）后逐字相同：{'✓' if same else '✗'}")
    choices = [c.encode() for c in vllm_oracle.scenarios("lesson08")[walk]["choices"]]
    print(f"\n选项 {[c.decode() for c in choices]}，vLLM 一步步从允许集合里随机取一个 token 并 accept_tokens：")
    print(f"{'step':>4}  {'已生成':<14}{'vLLM 允许':<30}{'你的允许':<30}取   同")
    for k, done, row in vllm_walk_steps(answers[walk], choices, vocab):
        sc = Scenario(walk, ["r"], {"r": done}, {"r": list(choices)})
        m = unpack(choice_bitmask(["r"], {"r": done}, {"r": list(choices)}, vocab.trie, vocab.eos_token_id,
                                  vocab.vocab_size), vocab.vocab_size)[0]
        w = unpack(row, vocab.vocab_size)[0]
        token = answers[walk]["steps"][k]["token"]
        pick = "EOS" if token == vocab.eos_token_id else repr(vocab.token_bytes[token].decode("utf-8", "replace"))
        print(f"{k:>4}  {done.decode('utf-8', 'replace')!r:<14}{_tokens(vocab, w, 3):<30}{_tokens(vocab, m, 3):<30}"
              f"{pick:<5}{'✓' if torch.equal(w, m) else '✗'}")
    last = answers[walk]["steps"][-1]
    print(f"最后一步取到 EOS（accept_tokens 接受：{last['accepted']}），请求结束。")
