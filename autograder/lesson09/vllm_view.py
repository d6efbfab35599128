"""Lesson 9's vLLM side: the pinned vLLM's own `rejection_sample` (vllm/v1/sample/rejection_sampler.py) on the lesson's
batches. Runs under .venv-vllm only.

On CPU vLLM usually has no Triton (vllm/triton_utils/importing.py sets HAS_TRITON False without a driver), and the
V1 CPUModelRunner, when built, swaps the Triton kernels of rejection_sampler.py for C++ ones (`CPUModelRunner._postprocess_triton`:
`rejection_greedy_sample_kernel`, `rejection_random_sample_kernel`, `expand_kernel`,
`sample_recovered_tokens_kernel` <- vllm/utils/cpu_triton_utils.py -> torch.ops._C). `_rejection_sampler()` runs
that same method, then calls vLLM's `rejection_sample` as `RejectionSampler.forward` does.

Layout: the exercise's target_probs has each request's k draft rows then its bonus row; vLLM's `rejection_sample`
takes only the draft rows (as logits: log p, softmaxed in float32 inside) and the bonus tokens separately.
The graded cases fix the uniforms (vLLM's `generate_uniform_probs` returns the case's draws) and make every
recovered token forced ((p - q)+ with one non-zero entry), so vLLM's answer is exact; "distribution" lets vLLM
draw its own uniforms and recovered tokens (seeded) and counts the first emitted token.
"""
from __future__ import annotations

P = -1


def _rows(tokens, vocab, bonus):
    """Target rows whose argmax is each draft row's token (0.02 elsewhere, normalised), bonus rows after."""
    rows = []
    for i, t in enumerate(tokens):
        for tok in list(t) + [bonus[i]]:
            r = [0.02] * vocab
            r[tok] = 1.0
            s = sum(r)
            rows.append([x / s for x in r])
    return rows


def _case(drafts, target, draft_probs, bonus, greedy, uniform):
    return {"drafts": drafts, "target_probs": target, "draft_probs": draft_probs, "bonus": bonus,
            "is_greedy": greedy, "uniform": uniform}


Q4 = [0.25, 0.25, 0.25, 0.25]
Q3 = [1 / 3, 1 / 3, 1 / 3]
# The graded cases: every row of the exercise's input-space table (autograder/lesson09/checks.py) that is
# deterministic in vLLM, each recovered token forced.
GRADED = {
    # vLLM's test_rejection_sampler greedy cases in one batch: k = 3, 0, 2, 1.
    "greedy_batch": _case([[1, 2, 3], [], [4, 5], [6]], _rows([[1, 2, 7], [], [4, 5], [9]], 16, [11, 12, 13, 14]),
                          None, [11, 12, 13, 14], [True] * 4, [0.5] * 6),
    # Random rows with q: accept at p/q = 0.667 > u, reject p = 0 (residual only token 2), p/q > 1, p/q = 2.
    "random_batch": _case([[0, 3], [1, 2]], [[0.6, 0.4, 0.0, 0.0], [0.1, 0.1, 0.8, 0.0], Q4, [0.5, 0.5, 0.0, 0.0],
                                             [0.0, 0.0, 1.0, 0.0], Q4],
                          [[0.9, 0.1, 0.0, 0.0], [0.1, 0.1, 0.3, 0.5], [0.6, 0.4, 0.0, 0.0], [0.0, 0.2, 0.5, 0.3]],
                          [0, 3], [False, False], [0.5, 0.3, 0.99, 0.999]),
    # p/q = 0.5 < u = 0.7 rejected in the first request; u = 0.1 accepted in the second: each its own uniform.
    "own_uniforms": _case([[0], [0]], [[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]] * 2, [[1.0, 0.0, 0.0]] * 2, [2, 2],
                          [False, False], [0.9, 0.1]),
    # Greedy ties: vLLM's argmax takes the first maximal index.
    "greedy_tie": _case([[2], [0]], [[0.4, 0.1, 0.4, 0.1], [0.1] * 4, [0.4, 0.1, 0.4, 0.1], [0.1, 0.7, 0.1, 0.1]],
                        None, [3, 1], [True, True], [0.5, 0.5]),
    # u exactly p/q, n-gram drafts (q one-hot: p(x) = u) and with q (0.25 / 0.5 = 0.5 = u).
    "u_equals_ratio_ngram": _case([[0], [1]], [[0.5, 0.25, 0.25], [0.0, 1.0, 0.0], [0.25, 0.5, 0.25],
                                               [0.0, 0.0, 1.0]], None, [1, 2], [False, False], [0.5, 0.5]),
    "u_equals_ratio_q": _case([[2], [1]], [[0.5, 0.25, 0.25], [0.0, 1.0, 0.0], [0.25, 0.5, 0.25], [0.0, 0.0, 1.0]],
                              [[0.25, 0.25, 0.5], [0.5, 0.5, 0.0]], [1, 2], [False, False], [0.5, 1.0]),
    "no_drafts": _case([[], []], _rows([[], []], 5, [3, 1]), None, [3, 1], [True, False], []),
    # Every draft accepted, greedy and random rows in one batch: the bonus right after the last draft.
    "all_accepted": _case([[2, 2, 2], [1]], _rows([[2, 2, 2]], 5, [4])
                          + [[0.0, 1.0, 0.0, 0.0, 0.0], [0.2] * 5], None, [4, 3], [True, False],
                          [0.1, 0.2, 0.3, 0.999]),
    "first_rejected": _case([[5, 1, 2]], _rows([[4, 1, 2]], 6, [0]), None, [0], [True], [0.5] * 3),
    # p/q = 3 and 1 accepted at u ~ 1, then p/q = 0.3 < 0.5 rejected: (p - q)+ leaves token 2 only.
    "ratio_above_one": _case([[1, 2, 1], [0]], [[0.0, 0.9, 0.1], [0.0, 0.0, 1.0], [0.0, 0.3, 0.7], [0.2, 0.3, 0.5],
                                                [0.6, 0.4, 0.0], [0.5, 0.5, 0.0]],
                             [[0.0, 0.3, 0.7], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [0.6, 0.4, 0.0]], [0, 1],
                             [False, False], [0.9999, 0.9999, 0.5, 0.9999]),
    # An n-gram draft (q one-hot) rejected in a random row: recovery from p with the draft removed -> token 1.
    "ngram_rejected": _case([[0]], [[0.3, 0.7, 0.0], Q3], None, [2], [False], [0.5]),
    # Greedy and random rows with a draft model's q in one batch: greedy rows ignore q (vLLM's greedy kernel never
    # reads it): r0 recovers argmax p though (p - q)+ peaks elsewhere, r1 accepts its argmax drafts even where
    # q(x) = 0 (the guard draft_prob > 0 is the random kernel's); the random row r2 recovers from (p - q)+.
    "greedy_with_q": _case([[1], [0, 2], [1]],
                           [[0.5, 0.1, 0.4], [0.2, 0.3, 0.5], [0.6, 0.3, 0.1], [0.1, 0.2, 0.7], Q3, [0.5, 0.1, 0.4],
                            Q3],
                           [[0.45, 0.5, 0.05], [0.0, 0.5, 0.5], [0.3, 0.3, 0.4], [0.5, 0.5, 0.0]], [2, 1, 0],
                           [True, True, False], [0.9, 0.5, 0.5, 0.9]),
}
TARGET = [0.30, 0.25, 0.20, 0.15, 0.07, 0.03]
DRAFT_Q = [0.05, 0.10, 0.40, 0.05, 0.30, 0.10]
SCENARIOS = {**GRADED, "distribution": {"n": 400, "k": 2, "seed": 0, "target": TARGET, "draft_q": DRAFT_Q}}


def _rejection_sampler():
    """vllm.v1.sample.rejection_sampler with the kernels the CPU model runner installs (its own method, unbound:
    it reads nothing from the runner)."""
    import vllm.v1.sample.rejection_sampler as rs
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    CPUModelRunner._postprocess_triton(None)
    assert rs.rejection_random_sample_kernel.__class__.__name__ == "_FuncWrapper", "C++ kernels not installed"
    return rs


def _metadata(is_greedy, generators=None):
    import torch
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    return SamplingMetadata(
        temperature=torch.tensor([0.0 if g else 1.0 for g in is_greedy]), all_greedy=all(is_greedy),
        all_random=not any(is_greedy), top_p=None, top_k=None, generators=generators or {}, max_num_logprobs=None,
        no_penalties=True, prompt_token_ids=None, frequency_penalties=torch.tensor([]),
        presence_penalties=torch.tensor([]), repetition_penalties=torch.tensor([]), output_token_ids=[],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())


def _run(rs, drafts, target_probs, draft_probs, bonus, is_greedy, uniform=None):
    """vLLM's rejection_sample on the exercise's layout; uniform=None lets vLLM draw its own."""
    import numpy as np
    import torch

    counts = [len(d) for d in drafts]
    cumulative = torch.from_numpy(np.cumsum(counts, dtype=np.int32))
    draft_ids = torch.tensor(sum(drafts, []), dtype=torch.int32)
    starts = np.cumsum([0] + [k + 1 for k in counts])[:-1]
    draft_rows = [int(s) + j for s, k in zip(starts, counts, strict=True) for j in range(k)]
    logits = torch.as_tensor(target_probs, dtype=torch.float32)[draft_rows].log().contiguous()
    q = None if draft_probs is None else torch.as_tensor(draft_probs, dtype=torch.float32).contiguous()
    original = rs.generate_uniform_probs
    if uniform is not None:
        rs.generate_uniform_probs = lambda *a, **k: torch.tensor(uniform, dtype=torch.float64)
    try:
        out = rs.rejection_sample(draft_ids, counts, max(counts, default=0), cumulative, q, logits,
                                  torch.as_tensor(bonus, dtype=torch.int64).view(-1, 1).contiguous(),
                                  _metadata(is_greedy))
    finally:
        rs.generate_uniform_probs = original
    return out


def vllm_answer(name: str, payload: dict) -> dict:
    import torch

    rs = _rejection_sampler()
    torch.manual_seed(0)
    if name in GRADED:
        out = _run(rs, payload["drafts"], payload["target_probs"], payload["draft_probs"], payload["bonus"],
                   payload["is_greedy"], payload["uniform"])
        rows = out.tolist()
        return {"output_token_ids": rows, "num_accepted": [sum(t != P for t in r) - 1 for r in rows]}
    g = torch.Generator().manual_seed(payload["seed"])
    n, k = payload["n"], payload["k"]
    p, q = torch.tensor(payload["target"]), torch.tensor(payload["draft_q"])
    drafts = torch.multinomial(q, k * n, replacement=True, generator=g).view(n, k).tolist()
    bonus = torch.multinomial(p, n, replacement=True, generator=g).tolist()
    torch.manual_seed(payload["seed"] + 1)      # vLLM's own draws: not the stream the drafts came from
    out = _run(rs, drafts, p.repeat((k + 1) * n, 1), q.repeat(k * n, 1), bonus, [False] * n)
    first = out[:, 0]
    accepted = (out != P).sum(dim=1) - 1
    return {"first_token_counts": torch.bincount(first, minlength=len(payload["target"])).tolist(),
            "accepted_hist": torch.bincount(accepted, minlength=k + 1).tolist(),
            "first_draft_accept_rate": float((out[:, 0] == torch.tensor([d[0] for d in drafts])).float().mean())}
