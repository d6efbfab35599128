"""Lesson 8's demos: a mixed batch on the real engine, its trace (grammar under the forward), one bitmask row.

Never called by a check; the notebook shows these.
"""
from __future__ import annotations

import torch

from autograder.figures import trace_gantt, vllm_answers
from autograder.lesson08.checks import default_vocab, run_engine, unpack, xgrammar_choice_bitmask


def _choice_row(generated: str, choices: list[str]):
    """xgrammar's bitmask for one choice request after `generated`: (vocab, packed [1, words], unpacked row)."""
    vocab = default_vocab()
    bitmask = xgrammar_choice_bitmask(["r"], {"r": generated.encode()}, {"r": [c.encode() for c in choices]}, vocab)
    return vocab, bitmask, unpack(bitmask, vocab.vocab_size)[0]


def allowed_next(generated: str, choices: list[str]) -> list[str]:
    """The tokens xgrammar allows after `generated` for a choice constraint, as text (EOS as <eos>)."""
    vocab, _, row = _choice_row(generated, choices)
    return ["<eos>" if t == vocab.eos_token_id else vocab.token_bytes[t].decode("utf-8", "replace")
            for t in row.nonzero().flatten().tolist()]


def show_words(generated: str, choices: list[str], words: int = 4) -> None:
    """Print the first int32 words of one bitmask row in binary (bit 0 on the right), with their tokens."""
    vocab, bitmask, row = _choice_row(generated, choices)
    nonzero = [w for w in range(bitmask.shape[1]) if row[32 * w:32 * w + 32].any()][:words]
    for w in nonzero:
        value = int(bitmask[0, w])
        toks = [vocab.token_bytes[t].decode("utf-8", "replace") or "<eos>" for t in range(32 * w, 32 * w + 32)
                if t < vocab.vocab_size and row[t]]
        print(f"word {w:3d} = {value:>12d} = {value & 0xFFFFFFFF:032b}  -> tokens {toks}")


def run_demo():
    """The real engine, its own xgrammar bitmask: choice requests among free ones."""
    return run_engine()


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
    fig, ax = plt.subplots(figsize=(11, 2.6), layout="tight")
    trace_gantt(ax, [e for e in events if e.step in steps], min_ms=0.05, top=2.3)
    ax.set_title(f"minivllm trace, steps {steps[0]}-{steps[-1]}: the grammar bitmask (red) runs while the "
                 "worker's forward (orange) does; sample waits for both", fontsize=9, loc="left")
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
def _token(vocab, t: int) -> str:
    return "EOS" if t == vocab.eos_token_id else repr(vocab.token_bytes[t].decode("utf-8", "replace"))


def _tokens(vocab, allowed_row, top: int = 4) -> str:
    ids = allowed_row.nonzero().flatten().tolist()
    return f"{len(ids):>3} " + " ".join(_token(vocab, t) for t in ids[:top]) + (" …" if len(ids) > top else "")


def vllm_side_by_side(choice_bitmask, batch: str = "batch_batch_order", walk: str = "walk_perchance") -> None:
    """The pinned vLLM's StructuredOutputManager.grammar_bitmask rows (scheduler order) beside yours (batch order)
    for one of the lesson's batches, then one request walked token by token: allowed tokens per step."""
    from autograder import vllm_oracle
    from autograder.lesson08.checks import Scenario, vllm_rows_in_batch_order, vllm_walk_steps

    vocab = default_vocab()
    answers = vllm_answers("lesson08", [batch, walk])
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
        m = unpack(choice_bitmask(["r"], {"r": done}, {"r": list(choices)}, vocab.trie, vocab.eos_token_id,
                                  vocab.vocab_size), vocab.vocab_size)[0]
        w = unpack(row, vocab.vocab_size)[0]
        pick = _token(vocab, answers[walk]["steps"][k]["token"])
        print(f"{k:>4}  {done.decode('utf-8', 'replace')!r:<14}{_tokens(vocab, w, 3):<30}{_tokens(vocab, m, 3):<30}"
              f"{pick:<5}{'✓' if torch.equal(w, m) else '✗'}")
    last = answers[walk]["steps"][-1]
    print(f"最后一步取到 EOS（accept_tokens 接受：{last['accepted']}），请求结束。")
