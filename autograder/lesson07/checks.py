"""Lesson 7 — 采样器：temperature、top-k/top-p、种子与 logprobs: the checks behind the grade cells and the engine plug.

The student writes four functions in one cell, in the order of vLLM's Sampler (v1/sample/sampler.py) and
ops/topk_topp_sampler.py:
    apply_min_p(logits, min_p)            tokens below min_p * (top token's probability) -> -inf
    apply_top_k_top_p(logits, k, p)       batched top-k (0 = off) and top-p (1 = off); no sort without top-p
    random_sample(probs, generators)      the exponential race argmax(probs / q), seeded rows on their own generator
    sample(logits, md)                    raw logprobs, temperature, min-p, top-k/top-p, softmax, race, greedy rows

Grade cells and `python -m autograder check lesson07 ...` call the same check_* functions here (each docstring
says what it covers); check_source_map grades the names the lesson does not print (the pinned vLLM's sampler).

Input space (each dimension -> the part that covers it):
    temperature          0 (greedy), below SAMPLING_EPS but non-zero (1e-6: greedy), 1e-4 (random, = greedy),
                         ordinary, all in one batch                                  main, real engine
    top_k                off (0 and = vocab), 1, on a tie at the k-th value, mixed per row; every row off
                         with no top-p (the top-k-only path must still return the logits)       main, boundary
    top_p                off (1), tiny, exactly on a cumulative threshold with ties (vLLM's `<=`), after
                         top-k renormalised                                                     main, boundary
    min_p                off (0), 1 (only the top, ties at the top all stay), ordinary          main, boundary
    ties                 greedy rows take the first maximal index (torch/vLLM argmax); tied survivors of
                         a mask are compared as values (vLLM's unstable sort picks which tied index)  main
    seeds                seeded rows alone, shared seeds, mixed with unseeded, chunked prefill  main, real engine
                         seed 0 (a seed, not "no seed": vLLM tests `seed is not None`), alone and in a batch
                                                                                                main, real engine
                         their distribution: every row seeded (3000 seeds), one generator over 500 steps   main
    logprobs             raw (before temperature), HF's log_softmax; logprobs=0 (the sampled token's
                         logprob, not None)                                                    main, real engine
                         max_num_logprobs None (no request wants any: raw_logprobs None; the plug gathers
                         exactly when Sampler.forward would)                                   main, real engine
    logit range          gaps over 100 nats (past ~104, float32 probabilities underflow to 0), logits near 120
                         (exp overflows): finite raw logprobs, masks in logit space, no NaN draw  main, boundary
    batch shape          1 row, 4 to 8 mixed rows, 3000 rows (distribution), vocab 4 to 512    main, boundary
    pinned vLLM          its Sampler's masks, seeded tokens and raw logprobs on six recorded batches covering the
                         rows above (data/vllm_views/lesson07.json.xz)                          main
    engine               top-k-only steps never sort, top-p steps do (profiler)                 real engine
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
from unittest import mock

import numpy as np
import torch

from autograder.common import (
    CHI_P_MIN,
    DEFAULT_MODEL,
    BlankNotFilled,
    CheckFailed,
    Lesson,
    SourceMap,
    chi_square_p_value,
    expect,
    make_llm,
    quiet_stderr_fd,
    shutdown,
)
from autograder.pin import VLLM_VERSION

ENGINE_PROMPTS = ["ROMEO:", "JULIET:\nO Romeo", "KING LEAR:\nBlow, winds", "HAMLET:"]
NEG = float("-inf")


# ---------------------------------------------------------------------------- the reference (per row, float64)
def ref_row(x: torch.Tensor, k: int = 0, p: float = 1.0, min_p: float = 0.0) -> torch.Tensor:
    """One row after min-p, top-k and top-p, by the definitions (vLLM's order): -inf where masked."""
    x = x.double().clone()
    if min_p > 0:
        probs = x.softmax(-1)
        x[probs < min_p * probs.max()] = NEG
    if 0 < k < x.numel():
        kth = x.sort(descending=True).values[k - 1]
        x[x < kth] = NEG                                   # ties with the k-th value stay
    if p < 1:
        probs = x.softmax(-1)                              # renormalised over the top-k survivors
        order = probs.argsort(descending=True, stable=True)
        before = torch.cumsum(probs[order], 0) - probs[order]
        drop = order[before >= p]                          # keep until the token that crosses p (inclusive)
        x[drop] = NEG
    return x


def call(fn, *args, name: str):
    try:
        return fn(*args)
    except (BlankNotFilled, CheckFailed):
        raise
    except Exception as e:
        if "______" in str(e) or "_Blank" in repr(e):
            raise BlankNotFilled("还有空 ______ 没有填写：把它换成正确的表达式后再运行。") from None
        raise CheckFailed(f"{name} 出错：{type(e).__name__}: {e}") from None


def masked(fn_top, fn_min, logits, k, p, min_p) -> torch.Tensor:
    """The student's masking in the Sampler's order (min-p, then top-k/top-p) on a copy of the logits."""
    x = logits.clone()
    if min_p is not None:
        x = call(fn_min, x, min_p, name="apply_min_p")
    out = call(fn_top, x, k, p, name="apply_top_k_top_p")
    expect(isinstance(out, torch.Tensor) and out.shape == logits.shape,
           f"apply_top_k_top_p 应返回形状 {tuple(logits.shape)} 的张量。")
    return out


def expect_masks(fn_top, fn_min, name, logits, k=None, p=None, min_p=None) -> None:
    got = masked(fn_top, fn_min, logits, k, p, min_p)
    n = logits.shape[0]
    for i in range(n):
        want = ref_row(logits[i], int(k[i]) if k is not None else 0, float(p[i]) if p is not None else 1.0,
                       float(min_p[i]) if min_p is not None else 0.0)
        keep_w, keep_g = torch.isfinite(want), torch.isfinite(got[i])
        same_values = torch.equal(logits[i][keep_w].sort().values, logits[i][keep_g].sort().values)
        if not torch.equal(keep_w, keep_g) and not same_values:
            raise CheckFailed(f"{name}：第 {i} 行（top_k={None if k is None else int(k[i])}，top_p="
                              f"{None if p is None else round(float(p[i]), 3)}，min_p="
                              f"{None if min_p is None else float(min_p[i])}）应保留 token "
                              f"{keep_w.nonzero().flatten().tolist()}，实际保留 {keep_g.nonzero().flatten().tolist()}。")
        expect(torch.allclose(got[i][keep_g].double(), logits[i][keep_g].double()),
               f"{name}：第 {i} 行保留下来的 logits 被改动了（掩码只应把其余位置设为 -inf）。")


# ---------------------------------------------------------------------------- crafted logits
def crafted_logits() -> torch.Tensor:
    """8 rows over a vocabulary of 10, with a tie at 2.0 in rows 1 and 5 (the 2nd/3rd largest)."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(8, 10, generator=g) * 1.5
    x[1, [3, 6]] = 2.0
    x[1] = torch.where(x[1] > 2.0, x[1] - 3.0, x[1])
    x[1, 0] = 3.0
    x[5] = x[1].flip(0)
    return x


def check_masks(fn_top, fn_min) -> None:
    x = crafted_logits()
    # every row its own mix: k off/on, p off/on, min_p off/on, in one batch
    k = torch.tensor([0, 2, 5, 10, 3, 1, 0, 7])
    p = torch.tensor([0.5, 1.0, 0.8, 0.35, 1.0, 0.9, 0.95, 0.6])
    mp = torch.tensor([0.0, 0.0, 0.1, 0.0, 0.3, 0.0, 0.05, 0.2])
    masks = functools.partial(expect_masks, fn_top, fn_min)
    masks("只有 top-k", x, k=k)
    masks("只有 top-p", x, p=p)
    masks("top-k 与 top-p", x, k=k, p=p)
    masks("min-p、top-k 与 top-p", x, k=k, p=p, min_p=mp)
    # top-p must be taken over the top-k survivors, renormalised: here the two orders disagree
    y = torch.tensor([[2.0, 1.9, 1.8, 0.0, -0.1, -0.2, -0.3, -0.4]])
    masks("先 top-k 再在剩下的 token 上重新归一化做 top-p", y, k=torch.tensor([3]), p=torch.tensor([0.6]))


# ---------------------------------------------------------------------------- sampling metadata
def make_md(temperature, top_k=None, top_p=None, min_p=None, generators=None, logprobs=None):
    from minivllm.sample.metadata import SamplingMetadata

    t = torch.tensor(temperature, dtype=torch.float32)
    greedy = t < 1e-5
    return SamplingMetadata(
        temperature=None if bool(greedy.all()) else t, all_greedy=bool(greedy.all()),
        all_random=not bool(greedy.any()),
        top_p=None if top_p is None else torch.tensor(top_p, dtype=torch.float32),
        top_k=None if top_k is None else torch.tensor(top_k, dtype=torch.int64),
        min_p=None if min_p is None else torch.tensor(min_p, dtype=torch.float32),
        generators=generators or {}, max_num_logprobs=logprobs,
        num_logprobs=None if logprobs is None else [logprobs] * len(temperature))


def call_sample(fn, logits, md):
    res = call(fn, logits, md, name="sample")
    expect(isinstance(res, tuple) and len(res) == 2, "sample 应返回 (sampled, raw_logprobs)。")
    sampled, lp = res
    expect(isinstance(sampled, torch.Tensor) and tuple(sampled.shape) == (logits.shape[0],),
           f"sampled 应是形状 ({logits.shape[0]},) 的张量。")
    return sampled.long(), lp


# ---------------------------------------------------------------------------- the distribution test


DIST_LOGITS = torch.tensor([2.2, 1.9, 1.5, 1.4, 0.9, 0.3, -0.2, -1.0, -2.0, -3.0])
DIST_CASES = (  # (temperature, top_k, top_p, min_p)
    (0.7, 0, 1.0, 0.0),
    (1.3, 6, 0.9, 0.0),
    (1.0, 0, 0.75, 0.0),
    (0.9, 5, 1.0, 0.12),
)


def exact_probs(temp, k, p, min_p) -> np.ndarray:
    return ref_row(DIST_LOGITS / temp, k, p, min_p).softmax(-1).numpy()


def draw_counts(sample_fn, case, n: int = 3000, seed: int = 0) -> np.ndarray:
    """n rows of the same logits in one batch; every third row seeded (its own generator), the rest from a
    forked global RNG seeded here: deterministic, and the global RNG outside is left as it was."""
    temp, k, p, min_p = case
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        gens = {i: torch.Generator().manual_seed(seed * 100003 + i) for i in range(0, n, 3)}
        md = make_md([temp] * n, [k] * n if k else None, [p] * n if p < 1 else None,
                     [min_p] * n if min_p else None, gens)
        sampled, _ = call_sample(sample_fn, DIST_LOGITS.repeat(n, 1), md)
    return np.bincount(sampled.numpy(), minlength=DIST_LOGITS.numel())


def distribution_p_values(sample_fn) -> list[tuple[tuple, float, np.ndarray, np.ndarray]]:
    out = []
    for case in DIST_CASES:
        counts, probs = draw_counts(sample_fn, case), exact_probs(*case)
        out.append((case, chi_square_p_value(counts, probs), counts, probs))
    return out


def check_distribution(sample_fn) -> None:
    for case, pv, counts, probs in distribution_p_values(sample_fn):
        expect(pv > CHI_P_MIN, f"(temperature, top_k, top_p, min_p) = {case}：3000 次抽样的频数 {counts.tolist()} 与"
               f"精确的截断分布 {np.round(probs * 3000).astype(int).tolist()} 不一致（卡方 p = {pv:.2g}，固定种子）。")


def seeded_draws(sample_fn, logits, seeds, steps: int = 12) -> list[list[int]]:
    """`steps` draws at temperature 1 of the first len(seeds) rows of logits; row i on its own generator seeded
    seeds[i] (None: unseeded, the global RNG)."""
    gens = {i: torch.Generator().manual_seed(s) for i, s in enumerate(seeds) if s is not None}
    md = make_md([1.0] * len(seeds), generators=gens)
    return [call_sample(sample_fn, logits[:len(seeds)], md)[0].tolist() for _ in range(steps)]


def check_seeded_rows(sample_fn) -> None:
    """A seeded row draws the same whatever else is in the batch, and two rows with equal seeds agree."""
    logits = DIST_LOGITS.repeat(4, 1)
    alone = [d[0] for d in seeded_draws(sample_fn, logits, [5])]
    both = seeded_draws(sample_fn, logits, [5, 5])
    mixed = seeded_draws(sample_fn, logits, [None, 9, 5])
    expect([d[0] for d in both] == alone and [d[1] for d in both] == alone,
           f"两个种子相同的请求在同一批里应抽出同样的序列 {alone}，实际 {[d[0] for d in both]} 与 {[d[1] for d in both]}"
           "（每个带种子的请求要用自己的 generator）。")
    expect([d[2] for d in mixed] == alone,
           f"带种子的请求换了批内位置、旁边多了别的请求后应抽出同样的序列 {alone}，实际 {[d[2] for d in mixed]}。")


def check_sample_order(sample_fn) -> None:
    """Raw logprobs (before temperature), greedy rows take the argmax, random rows follow the race."""
    x = crafted_logits()[:4]
    md = make_md([0.0, 0.5, 2.0, 0.0], logprobs=2)
    sampled, lp = call_sample(sample_fn, x.clone(), md)
    expect(lp is not None and torch.allclose(lp.float(), x.log_softmax(-1), atol=1e-5),
           "raw_logprobs 应是原始 logits 的 log_softmax（在 temperature 之前；vLLM 默认 logprobs_mode = raw_logprobs）。")
    argmax = x.argmax(-1)
    expect(sampled[0] == argmax[0] and sampled[3] == argmax[3],
           f"temperature = 0 的行应取 argmax {argmax[[0, 3]].tolist()}，实际 {sampled[[0, 3]].tolist()}。")
    tie = torch.tensor([[0.5, 3.0, 1.0, 3.0, 3.0, -1.0]] * 2)
    sampled, _ = call_sample(sample_fn, tie, make_md([0.0, 1e-6]))
    expect(sampled.tolist() == [1, 1], f"贪心行的最大值并列时应取第一个最大值的下标 1（torch/vLLM 的 argmax），实际 "
           f"{sampled.tolist()}。")
    flat = torch.zeros(64, 10)
    flat[:, 3] = 0.1                                      # the argmax, barely: a random row rarely draws it
    temps = [1e-6 if i % 2 else 1.0 for i in range(64)]
    with torch.random.fork_rng():
        torch.manual_seed(0)
        sampled, _ = call_sample(sample_fn, flat, make_md(temps))
    tiny = sampled[1::2]
    expect(bool((tiny == 3).all()), "temperature = 1e-6（非零但低于 SAMPLING_EPS）与普通 temperature 同批时应按贪心取 "
           f"argmax 3，实际 {tiny.tolist()[:8]}…（贪心行是 temperature < SAMPLING_EPS 的行，不只是 0）。")
    md = make_md([1e-4, 1e-4, 1e-4, 1e-4])
    with torch.random.fork_rng():  # a wrong answer's draw (and so its verdict) must not depend on what ran before
        torch.manual_seed(1)
        sampled, _ = call_sample(sample_fn, x.clone(), md)
    expect(torch.equal(sampled, argmax), f"temperature → 0（1e-4）时随机采样应等于贪心 {argmax.tolist()}，"
           f"实际 {sampled.tolist()}（temperature 要在 softmax 之前除到 logits 上）。")


def check_logprobs_zero(sample_fn) -> None:
    """logprobs=0 asks for the sampled token's logprob only (vLLM returns it, not None): max_num_logprobs is 0."""
    x = crafted_logits()[:2]
    _, lp = call_sample(sample_fn, x.clone(), make_md([0.0, 0.8], logprobs=0))
    expect(lp is not None and torch.allclose(lp.float(), x.log_softmax(-1), atol=1e-5),
           "logprobs=0（max_num_logprobs = 0）时也应返回原始 logits 的 log_softmax：vLLM 仍报告被采 token 的 logprob"
           "（判断要用 `is not None`，0 不是“没有请求 logprobs”）。")


def check_no_logprobs(sample_fn) -> None:
    """No request wants logprobs (max_num_logprobs is None): raw_logprobs is None, as vLLM's Sampler.forward
    computes and gathers none (a greedy batch and a random one)."""
    x = crafted_logits()[:2]
    for temps in ([0.0, 0.0], [0.0, 0.8]):
        _, lp = call_sample(sample_fn, x.clone(), make_md(temps))
        expect(lp is None, f"没有请求要 logprobs（max_num_logprobs 是 None，temperature {temps}）时 sample 应返回 "
                           f"raw_logprobs = None，实际返回了 {type(lp).__name__}（vLLM 的 Sampler.forward 这时不算 logprobs）。")


def check_seed_zero(sample_fn) -> None:
    """seed=0 is a seed (vLLM tests `seed is not None`): the row of a request seeded 0 draws the same alone and
    beside an unseeded and another seeded row, whatever the global RNG holds."""
    logits = DIST_LOGITS.repeat(3, 1)
    torch.manual_seed(1)
    alone = [d[0] for d in seeded_draws(sample_fn, logits, [0])]
    torch.manual_seed(2)
    mixed = [d[2] for d in seeded_draws(sample_fn, logits, [None, 3, 0])]
    expect(alone == mixed, f"seed=0 的请求（它的 generator 以 0 为种子）单独运行抽出 {alone}，与无种子、另一种子的请求同批时"
                           f"抽出 {mixed}：应相同（0 也是种子，不是“没有种子”）。")


GAP_LOGITS = torch.tensor([[120.0, 5.0, 119.0, -10.0, 118.5, -60.0],    # gaps of 110 to 180 nats below the top
                           [0.0, -150.0, -0.7, -300.0, -1.2, -101.0]])


def check_large_gap(sample_fn) -> None:
    """Logits far apart (> 100 nats; past ~104 float32 probabilities underflow to 0) and large (exp overflows): the raw
    logprobs stay finite, and sampling never returns NaN's argmax or a token of probability 0."""
    x = GAP_LOGITS
    _, lp = call_sample(sample_fn, x.clone(), make_md([0.0, 0.0], logprobs=2))
    want = x.double().log_softmax(-1)
    expect(lp is not None and bool(torch.isfinite(lp).all()) and torch.allclose(lp.double(), want, atol=1e-3),
           f"相差 100 nats 以上的 logits：raw_logprobs 应是有限的 log_softmax {want[1].tolist()[:4]}…，实际 "
           f"{None if lp is None else lp[1].tolist()[:4]}…（先 softmax 再 log 会下溢成 -inf）。")
    n = 400
    with torch.random.fork_rng():
        torch.manual_seed(2)
        sampled, _ = call_sample(sample_fn, x.repeat(n // 2, 1), make_md([1.0, 0.9] * (n // 2)))
    top = torch.tensor([[0, 2, 4], [0, 2, 4]]).repeat(n // 2, 1)
    ok = (sampled.unsqueeze(1) == top).any(1)
    bad = sampled[~ok].tolist()
    expect(not bad, f"logits 为 120、119、118.5 与更小值（相差 100 nats 以上）的行，随机采样只能抽到 token 0、2、4，实际抽到 "
           f"{bad[:5]}（softmax 要减去最大值：直接 exp(120) 在 float32 里溢出成 inf）。")
    counts = np.bincount(sampled[0::2].numpy(), minlength=6)
    expect(counts[[0, 2, 4]].min() > 0, f"第 0 行三个相近的大 logit（120、119、118.5）都应被抽到过，频数 {counts.tolist()}。")


def check_seeded_distribution(sample_fn) -> None:
    """Seeded rows are reproducible AND distributed as p: every row seeded (distinct seeds, the path without the
    batch-wide draw), and one generator per request over many steps (its draws must not repeat step after step)."""
    temp, k, p, _ = case = (1.0, 6, 0.9, 0.0)
    probs = exact_probs(*case)

    def counts_and_p(rows: int, steps: int, first_seed: int):
        gens = {i: torch.Generator().manual_seed(first_seed + i) for i in range(rows)}
        md = make_md([temp] * rows, [k] * rows, [p] * rows, None, gens)
        seq = [call_sample(sample_fn, DIST_LOGITS.repeat(rows, 1), md)[0] for _ in range(steps)]
        counts = np.bincount(torch.stack(seq).flatten().numpy(), minlength=DIST_LOGITS.numel())
        return counts, chi_square_p_value(counts, probs)
    n = 2400
    counts, pv = counts_and_p(n, 1, 1000)
    expect(pv > CHI_P_MIN, f"每一行都带种子（{n} 个不同的 seed）时，频数 {counts.tolist()} 应服从截断分布 "
           f"{np.round(probs * n).astype(int).tolist()}（卡方 p = {pv:.2g}）：带种子的行也要按 probs 抽样。")
    rows, steps = 4, 500
    counts, pv = counts_and_p(rows, steps, 77)
    expect(pv > CHI_P_MIN, f"同一批 {rows} 个带种子的请求连续 {steps} 步，抽到的 token 频数 {counts.tolist()} 应服从截断分布 "
           f"{np.round(probs * rows * steps).astype(int).tolist()}（卡方 p = {pv:.2g}）：每步应从请求自己的 generator "
           "继续取新的噪声，而不是每步重新从 seed 开始。")


# ---------------------------------------------------------------------------- against the pinned vLLM's own Sampler
def vllm_batch(case: dict):
    """A recorded grading batch as the student's inputs: its logits, SamplingMetadata and per-row masking args."""
    from autograder.lesson07.vllm_view import case_logits

    rows, vocab = case["rows"], case["vocab"]
    logits = case_logits(case)
    greedy = [r["temperature"] < 1e-5 for r in rows]
    on = [r["top_k"] if 0 < r["top_k"] < vocab else 0 for r in rows]    # 0 = off, as minivllm stores it
    k = None if not any(on) else on
    p = None if all(r["top_p"] >= 1 for r in rows) else [r["top_p"] for r in rows]
    min_p = None if all(r["min_p"] == 0 for r in rows) else [r["min_p"] for r in rows]
    nl = [r["logprobs"] for r in rows]
    md = make_md([r["temperature"] for r in rows], k, p, min_p,
                 {i: torch.Generator().manual_seed(r["seed"]) for i, r in enumerate(rows) if r["seed"] is not None},
                 max((x for x in nl if x is not None), default=None))
    temp = torch.tensor([1.0 if g else r["temperature"] for g, r in zip(greedy, rows, strict=True)])
    return logits, md, temp


def check_vllm(apply_min_p, apply_top_k_top_p, sample) -> None:
    """The student's masks, seeded tokens and raw logprobs equal the pinned vLLM's Sampler on the recorded batches
    (autograder/lesson07/vllm_view.py): same logits, same seeds, same torch.Generator streams."""
    from autograder.lesson07.vllm_view import GRADING
    from autograder.vllm_oracle import recorded

    for name, case in GRADING.items():
        want = recorded("lesson07", f"grade_{name}")
        logits, md, temp = vllm_batch(case)
        if want["kept"] is not None:
            got = masked(apply_top_k_top_p, apply_min_p, logits / temp.unsqueeze(1), md.top_k, md.top_p, md.min_p)
            for i, keep in enumerate(want["kept"]):
                mine = torch.isfinite(got[i]).nonzero().view(-1).tolist()
                expect(mine == keep, f"批 {name} 第 {i} 行（{case['rows'][i]}）：vLLM {VLLM_VERSION} 的 Sampler 保留 token "
                       f"{keep}，你的掩码保留 {mine}。")
        sampled, raw = call_sample(sample, logits.clone(), md)
        expect(sampled.tolist() == want["sampled"],
               f"批 {name}：同样的 logits 与种子，vLLM {VLLM_VERSION} 的 Sampler 采到 {want['sampled']}，你的 sample 采到 "
               f"{sampled.tolist()}（带种子的行应从自己的 generator 用 exponential_ 取噪声）。")
        for i, row in enumerate(want["logprobs"] or []):
            if row is None:
                continue
            expect(raw is not None, f"批 {name}：请求了 logprobs，sample 却返回 None。")
            for token, lp, _rank in row:
                expect(abs(float(raw[i, token]) - lp) < 1e-4,
                       f"批 {name} 第 {i} 行 token {token}：vLLM 报告的 logprob 是 {lp:.5f}，你的是 {float(raw[i, token]):.5f}。")


def check_main_path(apply_min_p, apply_top_k_top_p, random_sample, sample) -> None:
    """Covers: mixed top-k/top-p/min-p rows, top-p after top-k, temperature 0 / 1e-6 / 1e-4 / ordinary in one
    batch, argmax ties, raw logprobs (also logprobs=0), logit gaps over 100 nats, seeds (reproducible and
    distributed as p), the distribution (3000 rows)."""
    check_masks(apply_top_k_top_p, apply_min_p)
    check_sample_order(sample)
    check_logprobs_zero(sample)
    check_no_logprobs(sample)
    check_large_gap(sample)
    check_seeded_rows(sample)
    check_seed_zero(sample)
    check_distribution(sample)
    check_seeded_distribution(sample)
    check_vllm(apply_min_p, apply_top_k_top_p, sample)


# ---------------------------------------------------------------------------- boundary
def profiled_ops(fn) -> tuple[object, list[str]]:
    """fn's result and the names of the aten ops it ran, in order (torch.profiler on CPU)."""
    from torch.profiler import ProfilerActivity, profile

    with quiet_stderr_fd(), profile(activities=[ProfilerActivity.CPU]) as prof:
        out = fn()
    return out, [e.name for e in prof.events() if e.name.startswith("aten::")]


def sorts(fn) -> bool:
    """Whether running fn calls aten::sort."""
    return "aten::sort" in profiled_ops(fn)[1]


def check_boundary(apply_min_p, apply_top_k_top_p) -> None:
    """Covers: every off value (k = 0 / vocab, p = 1, min_p = 0, None), k on a tie, top-p exactly on a
    cumulative threshold with ties, min_p = 1 with tied maxima, every row k = 0, logits over 100 nats apart
    (the k-th value's probability underflows), the no-sort top-k path."""
    x = crafted_logits()
    n, vocab = x.shape
    t = torch.tensor
    masks = functools.partial(expect_masks, apply_top_k_top_p, apply_min_p)
    masks("top_p = 1（全部保留）", x, p=torch.ones(n))
    masks("top_k = vocab（全部保留）", x, k=torch.full((n,), vocab))
    masks("top_k = 0（关闭）与 top_k = 1 混在一批", x, k=t([0, 1] * (n // 2)))
    masks("min_p = 0（关闭）与 min_p = 1（只留最大）混在一批", x, min_p=t([0.0, 1.0] * (n // 2)))
    masks("很小的 top_p：只留概率最大的 token", x, p=torch.full((n,), 1e-4))
    masks("k 恰好落在并列值上（并列的都保留）", x, k=t([1, 2, 3, 2, 2, 2, 3, 9]), p=t([1.0, 1, 1, 1, 0.99, 1, 1, 1]))
    flat = torch.zeros(4, 8)                              # 8 tied tokens: probabilities 1/8, cumsums exact
    masks("top_p 恰好等于累积概率（并列值；vLLM 用 cumsum <= 1 - p 丢弃）", flat, k=t([0, 4, 0, 8]),
          p=t([0.5, 0.5, 0.25, 0.75]))
    masks("最大值并列时 min_p = 1（并列的最大值都保留）", x[[1, 5]], min_p=t([1.0, 1.0]), k=t([0, 0]), p=t([1.0, 1.0]))
    masks("每一行都是 top_k = 0（关闭）且没有 top-p", x, k=torch.zeros(n, dtype=torch.int64))
    g = GAP_LOGITS                                        # > 100 nats apart (past ~104, float32 underflows to 0)
    masks("相差 100 nats 以上的 logits，只有 top-k（第 k 大的值概率下溢为 0）", g, k=t([4, 5]))
    masks("相差 100 nats 以上的 logits，top-k 与 top-p", g, k=t([5, 4]), p=t([0.9, 0.99]))
    masks("相差 100 nats 以上的 logits，min-p", g, min_p=t([0.2, 0.3]))
    none = call(apply_top_k_top_p, x.clone(), None, None, name="apply_top_k_top_p")
    expect(torch.equal(none, x), "k 和 p 都是 None 时 logits 应原样返回。")
    big = torch.randn(8, 512, generator=torch.Generator().manual_seed(11))
    k = torch.tensor([5, 0, 20, 1, 3, 0, 8, 2])
    expect(not sorts(lambda: apply_top_k_top_p(big.clone(), k, None)),
           "没有任何一行用 top-p 时不应排序整个词表（profiler 里出现了 aten::sort）：只有 top-k 时用 topk 取第 k 大的值。")
    masks("只有 top-k 的快速路径", big, k=k)


# ---------------------------------------------------------------------------- the real engine
class StudentSampler:
    """Stands where minivllm's Sampler stands in the runner: the student's `sample`, then the engine's gather."""

    def __init__(self, fn, log: list | None) -> None:
        self.fn, self.log = fn, log

    def __call__(self, logits, md):
        from minivllm.sample.sampler import SamplerOutput, gather_logprobs, sampled_token_ranks

        expect(not md.min_tokens, "本课的接入只覆盖没有 min_tokens 的请求。")
        if self.log is None:
            sampled, raw = call_sample(self.fn, logits, md)
        else:  # the profiler runs in the engine's thread, around this step's sampling only
            (sampled, raw), ops = profiled_ops(lambda: call_sample(self.fn, logits, md))
            self.log.append((md.top_k is not None, md.top_p is not None, ops.count("aten::sort"),
                             ops.count("aten::topk")))
        lps = ranks = None  # as Sampler.forward: logprobs exactly when some row asked (max_num_logprobs not None)
        if md.max_num_logprobs is not None:
            expect(raw is not None, "请求了 logprobs，但 sample 返回的 raw_logprobs 是 None。")
        else:
            expect(raw is None, "这一步没有请求要 logprobs（max_num_logprobs 是 None），sample 却返回了 raw_logprobs："
                                "引擎的 Sampler.forward 这时不算也不收集 logprobs。")
        if raw is not None:
            lps = gather_logprobs(raw.float(), sampled, md.num_logprobs)
            ranks = sampled_token_ranks(raw.float(), sampled)
        return SamplerOutput(sampled, lps, ranks)


@contextlib.contextmanager
def plugged(fn, log: list | None = None):
    """Within: every LLM built samples with fn (the runner looks the name Sampler up at construction); with
    `log`, each step appends (uses top-k, uses top-p, aten::sort calls, aten::topk calls) from the profiler."""
    import minivllm.worker.gpu_model_runner as runner

    with mock.patch.object(runner, "Sampler", lambda: StudentSampler(fn, log)):
        yield


def tokens_of(outputs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


def params(**kw):
    """SamplingParams that run to max_tokens (ignore_eos), as every request of these checks does."""
    from minivllm.sampling_params import SamplingParams
    return SamplingParams(ignore_eos=True, **kw)


def generate(llm, prompts, sp) -> list[list[int]]:
    return tokens_of(llm.generate(prompts, sp, use_tqdm=False))


def engine_prompts(llm) -> list[list[int]]:
    tok = llm.get_tokenizer()
    return [tok.encode(t) for t in ENGINE_PROMPTS]


def seeded_runs(llm, small, max_tokens: int = 12) -> dict:
    """A seeded request alone, in a batch of mixed requests (greedy, unseeded, another seed), under chunked
    prefill (`small`: a 4-token budget), and the same request twice without a seed."""
    sp = functools.partial(params, max_tokens=max_tokens)
    seeded = sp(temperature=1.0, top_k=20, top_p=0.9, seed=1234)
    zero = sp(temperature=1.0, seed=0)  # seed 0 is a seed, not "no seed"
    others = [sp(temperature=0.0), sp(temperature=0.8), sp(temperature=1.2, min_p=0.05, seed=7)]
    prompts = engine_prompts(llm)
    return {
        "alone": generate(llm, [prompts[0]], seeded)[0],
        "batch": generate(llm, prompts[1:] + [prompts[0]], others + [seeded])[-1],
        "chunked": generate(small, [prompts[2], prompts[0]], [others[1], seeded])[-1],
        "unseeded": [generate(llm, [prompts[0]], sp(temperature=1.0, top_k=20, top_p=0.9))[0] for _ in range(2)],
        "zero_alone": generate(llm, [prompts[1]], zero)[0],
        "zero_batch": generate(llm, [prompts[0], prompts[1]], [others[1], zero])[-1],
    }


@functools.cache
def hf_model():
    """The HF model, loaded once per process (it does not depend on the answer)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL, dtype=torch.float32)


def hf_raw_logprobs(prompt: list[int], generated: list[int]) -> torch.Tensor:
    """HF transformers' log_softmax of the raw logits at each generated position: [len(generated), V]."""
    with torch.no_grad():
        logits = hf_model()(torch.tensor([prompt + generated])).logits[0].float()
    return logits[len(prompt) - 1:-1].log_softmax(-1)


_PASSED: set = set()                     # answers (by code) that passed the engine check in this process


def answer_key(sample) -> str:
    """The code of `sample` and of the answer functions and constants it reads from its module: the report
    cell, the grade cell and the self-check of one notebook run the engine once for the same answer."""
    g = getattr(sample, "__globals__", {})
    parts = []
    for f in (sample, *(g.get(n) for n in ("apply_min_p", "apply_top_k_top_p", "random_sample"))):
        code = getattr(f, "__code__", None)
        parts.append(None if code is None else (code.co_code, code.co_consts, code.co_names))
    parts.append(repr(g.get("SAMPLING_EPS")))
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def check_real_engine(sample) -> None:
    """Covers the engine dimensions: seeds across batch compositions and chunked prefill, T -> 0, sort only
    with top-p, raw logprobs against HF. Stages in the order that fails a wrong answer soonest: seeds, temperature -> 0, the profiler, logprobs."""
    check_sample_order(sample)                          # blanks and plain errors first, outside the engine
    key = answer_key(sample)
    if key not in _PASSED:
        run_real_engine(sample)
        _PASSED.add(key)


def run_real_engine(sample) -> None:
    log: list = []
    with plugged(sample, log):
        llm = make_llm()
        small = make_llm(max_num_batched_tokens=4, max_num_seqs=4)
    try:
        runs = seeded_runs(llm, small)
        expect(runs["alone"] == runs["batch"], "同一个带种子的请求，单独运行与和其他请求（贪心、无种子、另一种子）同批时"
               f"应生成相同的 token：单独 {runs['alone']}，同批 {runs['batch']}。")
        expect(runs["alone"] == runs["chunked"], "带种子的请求在 chunked prefill（每步 4 个 token）下应生成相同的 token："
               f"{runs['alone']} vs {runs['chunked']}。")
        expect(runs["zero_alone"] == runs["zero_batch"], "seed=0 的请求单独运行与和一个无种子的请求同批时应生成相同的 token"
               f"（0 也是种子）：单独 {runs['zero_alone']}，同批 {runs['zero_batch']}。")
        prompts = engine_prompts(llm)
        greedy, cold = (generate(llm, prompts, params(max_tokens=10, temperature=t)) for t in (0.0, 1e-4))
        expect(cold == greedy, f"temperature → 0（1e-4）应与贪心相同：{cold[0]} vs {greedy[0]}。")
        plain = params(max_tokens=3, temperature=0.8)
        for sp in (params(max_tokens=3, temperature=1.0, top_k=5), params(max_tokens=3, temperature=1.0, top_p=0.9)):
            llm.generate(prompts[:2], [sp, plain], use_tqdm=False)
        steps = log[-6:]                                # 3 steps with top-k only, then 3 with top-p
        expect(all(s[0] and not s[1] and s[2] == 0 for s in steps[:3]),
               "没有请求用 top-p 时不应排序词表：profiler 记录的 (top_k, top_p, aten::sort 次数, aten::topk 次数) = "
               f"{steps[:3]}。")
        expect(all(s[1] and s[2] > 0 for s in steps[3:]),
               f"有请求用 top-p 时应排序（累积概率需要排好序的概率）：profiler 记录 {steps[3:]}。")
        lp_out, lp0_out = (llm.generate([prompts[i]], sp, use_tqdm=False)[0].outputs[0] for i, sp in (
            (1, params(max_tokens=6, temperature=0.7, top_k=10, logprobs=3, seed=3)),
            (2, params(max_tokens=3, temperature=0.7, logprobs=0, seed=5))))
    finally:
        shutdown(llm)
        shutdown(small)
    ref = hf_raw_logprobs(prompts[1], list(lp_out.token_ids))
    for j, (tok, d) in enumerate(zip(lp_out.token_ids, lp_out.logprobs, strict=True)):
        want = {t: float(ref[j, t]) for t in list(ref[j].topk(3).indices.tolist()) + [tok]}
        bad = {t: (round(d.get(t, float("nan")), 4), round(v, 4)) for t, v in want.items()
               if not abs(d.get(t, float("nan")) - v) < 2e-3}
        expect(not bad, f"第 {j} 个 token 的 logprobs 应等于 HF 原始 logits 的 log_softmax（temperature = 0.7 不影响它）："
               f"token: (引擎, HF) = {bad}。")
    ref0 = hf_raw_logprobs(prompts[2], list(lp0_out.token_ids))
    for j, (tok, d) in enumerate(zip(lp0_out.token_ids, lp0_out.logprobs, strict=True)):
        expect(d is not None and set(d) == {tok} and abs(d[tok] - float(ref0[j, tok])) < 2e-3,
               f"logprobs=0 的请求第 {j} 个位置应只报告被采 token {tok} 的 logprob {float(ref0[j, tok]):.4f}，实际 {d}。")


# ---------------------------------------------------------------------------- source map
# Names the lesson does not print, checked against the pinned vLLM (vllm/v1/sample/sampler.py,
# ops/topk_topp_sampler.py, ops/logprobs.py, logits_processor/interface.py); SourceMap says how they are stored.
SOURCE = SourceMap(["greedy_pick", "no_seed_fast_path", "argmax_safe", "processed_mode", "sampled_rank", "fp64_noise"], {
    "greedy_pick": {"ca3f81a61a8c102e"},
    "no_seed_fast_path": {"be32b68aa4c3178a"},
    "argmax_safe": {"6a8b1441cc704b37"},
    "processed_mode": {"414087856afbd252"},
    "sampled_rank": {"345bc991bd1ba902"},
    "fp64_noise": {"71f468910b954ffb"},
})


LESSON = Lesson(
    lesson_id="lesson07",
    title="采样器：temperature、top-k/top-p、种子与 logprobs",
    answer=("apply_min_p", "apply_top_k_top_p", "random_sample", "sample"),
    code={
        "main_path": ("主路径·掩码与分布", check_main_path),
        "real_engine": ("主路径·真实引擎", check_real_engine, ("sample",)),
        "boundary": ("边界条件", check_boundary, ("apply_min_p", "apply_top_k_top_p")),
    },
    source_map=SOURCE,
    questions=("为何每个请求一个 generator", "指数竞赛为何精确按 p 抽样", "top-p 的代价与跳过"),
)
check_source_map = SOURCE.check
