"""Lesson 7 — 采样器: what the notebook shows (live runs, tables, figures); no check calls these."""
from __future__ import annotations

import numpy as np
import torch

from autograder.figures import interleaved, vllm_answers
from autograder.lesson07.checks import engine_prompts, make_llm, plugged, profiled_ops, seeded_runs, shutdown


def engine_logits(sample, prompt_index: int = 1, position: int = 5) -> torch.Tensor:
    """The real engine's logits row for the `position`-th generated token of one engine prompt (greedy),
    captured at the sampler."""
    from minivllm.sampling_params import SamplingParams

    rows: list = []

    def capture(logits, md):
        rows.append(logits[0].float().clone())
        return sample(logits, md)

    with plugged(capture):
        llm = make_llm()
    try:
        llm.generate([engine_prompts(llm)[prompt_index]], SamplingParams(max_tokens=position + 1, temperature=0.0),
                     use_tqdm=False)
    finally:
        shutdown(llm)
    return rows[position]


def transform_stages(logits, apply_min_p, apply_top_k_top_p) -> dict[str, torch.Tensor]:
    """The distribution after each step of the Sampler's order (your functions), as probabilities."""
    x = logits.unsqueeze(0)
    out = {"raw": x.softmax(-1)[0]}
    x = x / 0.8
    out["temperature 0.8"] = x.softmax(-1)[0]
    x = apply_min_p(x, torch.tensor([0.1]))
    out["min_p 0.1"] = x.softmax(-1)[0]
    x = apply_top_k_top_p(x, torch.tensor([12]), None)
    out["top_k 12"] = x.softmax(-1)[0]
    x = apply_top_k_top_p(x, None, torch.tensor([0.6]))
    out["top_p 0.6"] = x.softmax(-1)[0]
    return out


def print_stages(stages, tokenizer=None, top: int = 6) -> None:
    order = stages["raw"].argsort(descending=True)[:top].tolist()
    head = "".join(f"{(repr(tokenizer.decode([t])) if tokenizer else t)!s:>10}" for t in order)
    print(f"{'stage':<17}{'kept':>6}{head}")
    for name, p in stages.items():
        print(f"{name:<17}{int((p > 0).sum()):>6}" + "".join(f"{float(p[t]):>10.3f}" for t in order))


def plot_stages(stages, top: int = 30):
    import matplotlib.pyplot as plt

    order = stages["raw"].argsort(descending=True)[:top]
    fig, axes = plt.subplots(1, len(stages), figsize=(3.2 * len(stages), 2.8), sharey=True, layout="tight")
    for ax, (name, p) in zip(axes, stages.items(), strict=True):
        ax.bar(range(top), p[order].numpy(), color="tab:blue" if name == "raw" else "tab:orange")
        ax.set_title(f"{name}\n{int((p > 0).sum())} tokens kept", fontsize=9)
        ax.set_xlabel("token rank (raw)")
    axes[0].set_ylabel("probability")
    return fig


def seed_demo(sample) -> dict:
    """The seeded request alone / in a mixed batch / under chunked prefill, and twice without a seed."""
    with plugged(sample):
        llm = make_llm()
        small = make_llm(max_num_batched_tokens=4, max_num_seqs=4)
    try:
        runs = seeded_runs(llm, small)
        runs["tokenizer"] = llm.get_tokenizer()
    finally:
        shutdown(llm)
        shutdown(small)
    return runs


def print_seed_demo(runs) -> None:
    tok = runs["tokenizer"]
    rows = [("seed=1234, alone", runs["alone"]), ("seed=1234, batch of 4", runs["batch"]),
            ("seed=1234, chunked", runs["chunked"]), ("no seed, run 1", runs["unseeded"][0]),
            ("no seed, run 2", runs["unseeded"][1])]
    for name, t in rows:
        print(f"{name:<24}{repr(tok.decode(t))[:60]:<62}{t[:6]}")


def plot_seed_demo(runs):
    import matplotlib.pyplot as plt

    rows = [runs["alone"], runs["batch"], runs["chunked"], runs["unseeded"][0], runs["unseeded"][1]]
    labels = ["seed, alone", "seed, batch", "seed, chunked", "no seed #1", "no seed #2"]
    same = np.array([[a == b for a, b in zip(r, rows[0], strict=False)] for r in rows], dtype=float)
    fig, ax = plt.subplots(figsize=(7, 2.4), layout="tight")
    ax.imshow(same, cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")
    ax.set(yticks=range(len(rows)), yticklabels=labels, xlabel="output position (green: same token as 'seed, alone')")
    return fig


def sort_cost(apply_top_k_top_p, batch: int = 8, vocab: int = 32000, k: int = 50, pairs: int = 25) -> dict:
    """Top-k only vs top-p on [batch, vocab] logits: what the profiler saw (deterministic: each aten op and how many
    times), the elements each side sorts (deterministic), and the time, `pairs` interleaved pairs (A B A B) after a
    warm-up pair, as the median and the spread of the per-pair ratio (a loaded machine moves the ms, not the ops)."""
    x = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(0))
    kk, p = torch.full((batch,), k), torch.full((batch,), 0.9)
    sides = {"top_k only": lambda: apply_top_k_top_p(x.clone(), kk, None),
             "top_p": lambda: apply_top_k_top_p(x.clone(), None, p)}
    ops = {}
    for name, fn in sides.items():
        seen = profiled_ops(fn)[1]
        ops[name] = {o: seen.count(o) for o in sorted(set(seen))}
    times = interleaved(sides, pairs)
    ratios = sorted(a / b for a, b in zip(times["top_p"], times["top_k only"], strict=True))
    return {"ops": ops, "batch": batch, "vocab": vocab, "k": k, "pairs": pairs,
            "ms": {name: float(np.median(ts)) * 1e3 for name, ts in times.items()},
            "ratio": float(np.median(ratios)), "ratio_p10_p90": (float(np.quantile(ratios, 0.1)),
                                                                 float(np.quantile(ratios, 0.9)))}


def print_sort_cost(cost) -> None:
    """The profiler's ops per side (what the claim rests on), then the timing with its spread."""
    b, v = cost["batch"], cost["vocab"]
    print(f"[{b}, {v}] logits, k = {cost['k']}, p = 0.9.  profiler (aten op x calls), same on every run:")
    key = ("aten::sort", "aten::topk", "aten::softmax", "aten::cumsum", "aten::scatter", "aten::gather")
    for name, ops in cost["ops"].items():
        print(f"  {name:<11} sort: {'aten::sort' in ops!s:<5}  {sum(ops.values()):>3} ops, of them "
              + ", ".join(f"{o[6:]} x{ops[o]}" for o in key if o in ops))
    print(f"  sorted elements: top_p {b * v:,} (a full sort of each row, O(V log V)); top_k only 0 "
          f"(topk keeps {cost['k']} per row)")
    lo, hi = cost["ratio_p10_p90"]
    print(f"time, median of {cost['pairs']} interleaved pairs after a warm-up: top_k only {cost['ms']['top_k only']:.2f} ms, "
          f"top_p {cost['ms']['top_p']:.2f} ms")
    print(f"top_p / top_k only per pair: median {cost['ratio']:.1f}x (10-90%: {lo:.1f}x-{hi:.1f}x; the ms move with "
          f"the machine's load, the ops do not)")


# ---------------------------------------------------------------------------- the same row on the pinned vLLM
def vllm_side_by_side(row, apply_min_p, apply_top_k_top_p, sample) -> dict:
    """The pinned vLLM's Sampler pieces and your functions on the lesson's row (kept tokens and probabilities of the
    raw top tokens after each step), then one recorded grading batch: vLLM's tokens and yours, row by row."""
    from autograder import vllm_oracle
    from autograder.lesson07.checks import masked, vllm_batch

    answers = vllm_answers("lesson07", ["lesson", "grade_mixed"])
    v = answers["lesson"]
    top = v["top_ids"]
    same_row = row.argsort(descending=True)[: len(top)].tolist() == top
    lp = row.log_softmax(-1)
    print(f"同一行 logits 的前 {len(top)} 个 token：vLLM 一侧（HF transformers）{top}，minivllm {'相同' if same_row else '不同'}；"
          f"原始 logprobs 最大差 {max(abs(float(lp[t]) - x) for t, x in zip(top, v['raw_logprobs'], strict=True)):.1e}")
    mine = transform_stages(row, apply_min_p, apply_top_k_top_p)
    print(f"\n{'stage':<17}{'kept vLLM':>10}{'minivllm':>10}   {'vLLM p(top 5)':<40}max|Δp|  同")
    out = {}
    for name, m in mine.items():
        vs = v["stages"][name]
        dp = max(abs(float(m[t]) - x) for t, x in zip(top, vs["probs"], strict=True))
        kept = int((m > 0).sum())
        out[name] = (vs["kept"], kept, dp)
        probs = " ".join(f"{x:.3f}" for x in vs["probs"][:5])
        print(f"{name:<17}{vs['kept']:>10}{kept:>10}   {probs:<40}{dp:7.1e}  {'✓' if kept == vs['kept'] and dp < 1e-4 else '✗'}")
    case = vllm_oracle.scenarios("lesson07")["grade_mixed"]
    w = answers["grade_mixed"]
    logits, md, temp = vllm_batch(case)
    got = masked(apply_top_k_top_p, apply_min_p, logits / temp.unsqueeze(1), md.top_k, md.top_p, md.min_p)
    sampled = sample(logits.clone(), md)[0].tolist()
    print(f"\n评分批 grade_mixed（词表 {case['vocab']}，vLLM 走 {w['path']}）：每行保留的 token 数与采到的 token")
    print(f"{'row':>3}  {'T':>4} {'top_k':>5} {'top_p':>5} {'min_p':>5} {'seed':>5}   kept v/m   token v/m  同")
    for i, r in enumerate(case["rows"]):
        kv, km = len(w["kept"][i]), int(torch.isfinite(got[i]).sum())
        ok = w["kept"][i] == torch.isfinite(got[i]).nonzero().view(-1).tolist() and w["sampled"][i] == sampled[i]
        print(f"{i:>3}  {r['temperature']:>4} {r['top_k']:>5} {r['top_p']:>5} {r['min_p']:>5} {r['seed']!s:>5}"
              f"   {kv:>3}/{km:<3}    {w['sampled'][i]:>3}/{sampled[i]:<3}   {'✓' if ok else '✗'}")
    return out
