"""Lesson 9 — 投机解码：n-gram 提议与拒绝采样: the checks behind the grade cells and the engine plug.

The student writes `rejection_sample(draft_token_ids, target_probs, draft_probs, bonus_token_ids, is_greedy,
uniform_probs, generator=None) -> (output_token_ids, num_accepted)`: the per-request loop of vLLM's
rejection_greedy_sample_kernel / rejection_random_sample_kernel, with recovery from the normalised (p - q)+.

Grade cells and `python -m autograder check lesson09 ...` call the same functions here:
    check_main_path(fn)    crafted batches (exact tokens and counts) and a chi-square test of the emitted
                           tokens against the target distribution, with and without draft probabilities
    check_real_engine(fn)  fn as the runner's rejection sampler: greedy outputs with n-gram speculation equal
                           the non-speculative run, and the SpecDecodingStats equal the engine's own sampler's
    check_boundary(fn)     requests without drafts, every draft accepted (bonus), p/q > 1, q(x) = 0 tokens;
                           then fn against the pinned vLLM's own rejection_sample on the same batches (recorded
                           in data/vllm_views/lesson09.json.xz, so grading never needs vLLM)
    check_source_map(SOURCE_MAP)

The engine plug (`plugged(fn)`) replaces the name RejectionSampler in minivllm.worker.gpu_model_runner for its
duration, so an LLM built inside it verifies drafts with the student's function: the wrapper computes what
vLLM's RejectionSampler.forward computes before its kernels (target probs after temperature/top-k/top-p, the
bonus tokens, one uniform per draft) and hands the engine each request's first num_accepted + 1 tokens, so the
student's count drives the scheduler's rollback of rejected drafts, exactly as len(generated) - 1 does.

Input space (each dimension -> the part that covers it):
    drafts per request   0, 1, 2, 3, unequal in one batch; many tokens emitted in one step  main, boundary, engine
    row kind             greedy and random rows in one batch                              main, boundary
    draft_probs          given (q) and None (n-gram: q one-hot on the draft)              main, boundary
    acceptance           p/q < 1, = 1, > 1 (any u), u exactly equal to p/q (vLLM accepts:
                         target_prob / draft_prob >= uniform_prob), each request its own uniforms  main, boundary
    greedy ties          the target's argmax takes the first maximal index (vLLM's argmax)   boundary
    greedy row with q    a draft model's q beside greedy rows: q unused (accept at q(x) = 0, recover argmax p)  boundary
    outcomes             first draft rejected, a rejection after accepted drafts, all accepted (bonus)   boundary
    recovery             from the normalised (p - q)+, seeded generator                    main, boundary
    engine               n-gram speculation (3 drafts a step), greedy output and SpecDecodingStats   real engine
"""
from __future__ import annotations

import contextlib
import functools
import itertools
from dataclasses import dataclass, field
from unittest import mock

import numpy as np
import torch

from autograder.common import (
    CHI_P_MIN,
    BlankNotFilled,
    CheckFailed,
    Lesson,
    SourceMap,
    chi_square_p_value,
    expect,
    graded,
    make_llm,
    shutdown,
)
from autograder.pin import VLLM_VERSION

P = -1                                   # PLACEHOLDER_TOKEN_ID
SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
# Prompts on which the tiny model falls into loops (stage directions, a repeated line): n-grams repeat.
ENGINE_PROMPTS = ["OTHELLO:", "PORTIA:\nThe quality of mercy", "HAMLET:"]
ENGINE_MAX_TOKENS = 40


# ---------------------------------------------------------------------------- calling the student's function
def call(fn, drafts, target_probs, draft_probs, bonus, is_greedy, uniform, generator=None):
    """fn on one batch, its result checked for shape: ([batch, max_k + 1] long tensor, list of counts)."""
    try:
        res = fn([list(d) for d in drafts], target_probs, draft_probs, bonus, list(is_greedy), uniform,
                 generator=generator)
    except (BlankNotFilled, CheckFailed):
        raise
    except Exception as e:
        if "______" in str(e) or "_Blank" in repr(e):
            raise BlankNotFilled("还有空 ______ 没有填写：把它换成正确的表达式后再运行。") from None
        raise
    expect(isinstance(res, tuple) and len(res) == 2,
           f"rejection_sample 应返回 (output_token_ids, num_accepted)，实际 {type(res).__name__}。")
    out, num_accepted = res
    max_k = max((len(d) for d in drafts), default=0)
    expect(isinstance(out, torch.Tensor) and tuple(out.shape) == (len(drafts), max_k + 1),
           f"output_token_ids 应是形状 {(len(drafts), max_k + 1)} 的张量，实际 "
           f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}。")
    num_accepted = [int(n) for n in num_accepted]
    expect(len(num_accepted) == len(drafts), f"num_accepted 应有 {len(drafts)} 项，实际 {len(num_accepted)}。")
    return out.long(), num_accepted


def one_hot_rows(tokens: list[list[int]], vocab: int, bonus: list[int] | None = None) -> torch.Tensor:
    """target_probs whose argmax at row j of request i is tokens[i][j] (k_i draft rows + the bonus row)."""
    rows = []
    for i, t in enumerate(tokens):
        for tok in list(t) + [bonus[i] if bonus else 0]:
            r = torch.full((vocab,), 0.02)
            r[tok] = 1.0
            rows.append(r / r.sum())
    return torch.stack(rows)


def emitted(out: torch.Tensor) -> list[list[int]]:
    return [[t for t in row if t != P] for row in out.tolist()]


def _expect_case(fn, name, drafts, target, draft_probs, bonus, greedy, uniform, want_out, want_n, gen=None):
    out, n = call(fn, drafts, target, draft_probs, torch.tensor(bonus), greedy, torch.tensor(uniform,
                  dtype=torch.float64), gen)
    expect(out.tolist() == want_out and n == want_n,
           f"{name}：drafts={drafts}，应输出 {want_out}、num_accepted={want_n}；实际 {out.tolist()}、{n}。")


# ---------------------------------------------------------------------------- crafted cases
def greedy_case():
    """Greedy rows in one batch, k = 3, 0, 2, 1 drafts: rejected at the third, no draft, all accepted, first rejected."""
    drafts = [[1, 2, 3], [], [4, 5], [6]]
    targets = [[1, 2, 7], [], [4, 5], [9]]                    # argmax per draft row
    bonus = [11, 12, 13, 14]
    return drafts, one_hot_rows(targets, 16, bonus), bonus, [[1, 2, 7, P], [12, P, P, P], [4, 5, 13, P],
                                                              [9, P, P, P]], [2, 0, 2, 0]


def random_case():
    """Random rows with draft probabilities, chosen so every outcome is forced by the uniforms:
    p/q per draft and a residual (p - q)+ with a single non-zero entry."""
    vocab = 4
    p = torch.tensor([[0.6, 0.4, 0.0, 0.0],      # r0 pos0: draft 0, p/q = 0.6/0.9 = 0.667, u=0.5 -> accept
                      [0.1, 0.1, 0.8, 0.0],      # r0 pos1: draft 3, p=0 -> reject; (p - q)+ = only token 2
                      [0.25, 0.25, 0.25, 0.25],  # r0 bonus row
                      [0.5, 0.5, 0.0, 0.0],      # r1 pos0: draft 1, p/q = 0.5/0.4 > 1 -> accept for any u
                      [0.0, 0.0, 1.0, 0.0],      # r1 pos1: draft 2, p/q = 1/0.5, u = 0.999 -> accept
                      [0.25, 0.25, 0.25, 0.25]]).double()  # r1 bonus row
    q = torch.tensor([[0.9, 0.1, 0.0, 0.0],
                      [0.1, 0.1, 0.3, 0.5],
                      [0.6, 0.4, 0.0, 0.0],
                      [0.0, 0.2, 0.5, 0.3]]).double()
    return [[0, 3], [1, 2]], p, q, [0, 3], [0.5, 0.3, 0.99, 0.999], [[0, 2, P], [1, 2, 3]], [1, 2], vocab


def rejected_by_uniform_case():
    """p(x)/q(x) = 0.5 with u = 0.7: rejected; (p - q)+ leaves token 1 only (recovering from p could give 0)."""
    p = torch.tensor([[0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]]).double()
    q = torch.tensor([[1.0, 0.0, 0.0]]).double()
    return [[0]], p, q


def check_crafted(fn) -> None:
    """Covers greedy batches with unequal draft counts, random rows with q, and each request's own uniforms."""
    drafts, target, bonus, want, n = greedy_case()
    _expect_case(fn, "贪心批（k = 3, 0, 2, 1）", drafts, target, None, bonus, [True] * 4, [0.5] * 6, want, n)
    drafts, p, q, bonus, u, want, n, _ = random_case()
    _expect_case(fn, "随机批（有草稿分布 q）", drafts, p, q, bonus, [False, False], u, want, n)
    drafts, p, q = rejected_by_uniform_case()
    for seed in range(8):
        _expect_case(fn, f"p/q = 0.5、u = 0.7 被拒（种子 {seed}）", drafts, p, q, [2], [False], [0.7], [[1, P]], [0],
                     torch.Generator().manual_seed(seed))
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]] * 2).double()
    q = torch.tensor([[1.0, 0.0, 0.0]] * 2).double()
    _expect_case(fn, "每个请求用自己那一段 uniform（第 0 个 u = 0.9 被拒，第 1 个 u = 0.1 接受）", [[0], [0]], p, q,
                 [2, 2], [False, False], [0.9, 0.1], [[1, P], [0, 2]], [0, 1], torch.Generator().manual_seed(0))


# ---------------------------------------------------------------------------- the distribution test
TARGET = [0.30, 0.25, 0.20, 0.15, 0.07, 0.03]
DRAFT_Q = [0.05, 0.10, 0.40, 0.05, 0.30, 0.10]


@dataclass
class DistributionRun:
    counts: dict = field(default_factory=dict)     # label -> token counts at each emitted position checked
    p_values: dict = field(default_factory=dict)
    acceptance: dict = field(default_factory=dict)


def distribution_run(fn, n: int = 1500, seed: int = 0) -> DistributionRun:
    """n requests with k = 2 drafts drawn from q (with draft_probs) and n with n-gram-like drafts (None: q is
    one-hot on the draft). The first emitted token must follow p; so must the second, given the first draft
    was accepted (a fresh target row)."""
    g = torch.Generator().manual_seed(seed)
    p = torch.tensor(TARGET, dtype=torch.float64)
    q = torch.tensor(DRAFT_Q, dtype=torch.float64)
    run = DistributionRun()
    for label, dp in (("draft_probs=q", q), ("draft_probs=None", None)):
        drafts = torch.multinomial(q, 2 * n, replacement=True, generator=g).view(n, 2).tolist()
        target = p.repeat(3 * n, 1)
        bonus = torch.multinomial(p, n, replacement=True, generator=g)
        uniform = torch.rand(2 * n, dtype=torch.float64, generator=g)
        draft_probs = None if dp is None else dp.repeat(2 * n, 1)
        out, num_acc = call(fn, drafts, target, draft_probs, bonus, [False] * n, uniform, g)
        first = out[:, 0].numpy()
        second = out[np.array(num_acc) >= 1, 1].numpy()
        expect(((first >= 0) & (first < len(TARGET))).all(), f"{label}：第一个输出 token 越界或是占位符。")
        for pos, toks in (("pos0", first), ("pos1|pos0 accepted", second)):
            counts = np.bincount(toks[toks >= 0], minlength=len(TARGET))
            run.counts[(label, pos)] = counts
            run.p_values[(label, pos)] = chi_square_p_value(counts, p.numpy())
        run.acceptance[label] = float(np.mean(num_acc)) / 2
    return run


def check_distribution(fn) -> None:
    run = distribution_run(fn)
    bad = {k: v for k, v in run.p_values.items() if not v > CHI_P_MIN}
    expect(not bad, "输出 token 的分布与目标分布 p 不一致（卡方检验，固定种子）："
           + "；".join(f"{a} {b}: p = {v:.2g}，计数 {run.counts[(a, b)].tolist()}" for (a, b), v in bad.items())
           + f"；目标 p = {TARGET}。")


@graded
def check_main_path(fn) -> None:
    check_crafted(fn)
    check_distribution(fn)


# ---------------------------------------------------------------------------- boundary
@graded
def check_boundary(fn) -> None:
    """Covers no drafts, all accepted, first rejected, p/q > 1, u exactly p/q, argmax ties in greedy rows."""
    # Ties at the top of a greedy row: vLLM's argmax is the first maximal index, so draft 2 is rejected.
    _expect_case(fn, "贪心行目标分布最大值并列（argmax 取第一个下标 0，草稿 2 被拒）", [[2], [0]],
                 torch.tensor([[0.4, 0.1, 0.4, 0.1], [0.1] * 4, [0.4, 0.1, 0.4, 0.1], [0.1, 0.7, 0.1, 0.1]]),
                 None, [3, 1], [True, True], [0.5, 0.5], [[0, P], [0, 1]], [0, 1])
    # u exactly p/q: vLLM accepts (target_prob / draft_prob >= uniform_prob), with and without draft probs.
    p = torch.tensor([[0.5, 0.25, 0.25], [0.0, 1.0, 0.0], [0.25, 0.5, 0.25], [0.0, 0.0, 1.0]], dtype=torch.float64)
    _expect_case(fn, "u 恰好等于 p/q（n-gram 草稿：p(x) = u = 0.5）时接受", [[0], [1]], p, None, [1, 2], [False, False],
                 [0.5, 0.5], [[0, 1], [1, 2]], [1, 1])
    _expect_case(fn, "u 恰好等于 p/q（0.25 / 0.5 = 0.5 = u）时接受", [[2], [1]], p, torch.tensor(
        [[0.25, 0.25, 0.5], [0.5, 0.5, 0.0]], dtype=torch.float64), [1, 2], [False, False], [0.5, 1.0],
        [[2, 1], [1, 2]], [1, 1])
    # A batch of requests without drafts: only the bonus token, nothing accepted.
    bonus = [3, 1]
    _expect_case(fn, "没有草稿的请求", [[], []], one_hot_rows([[], []], 5, bonus), None, bonus, [True, False],
                 [], [[3], [1]], [0, 0])
    # Every draft accepted (greedy and random in one batch): the bonus goes right after the last draft.
    drafts = [[2, 2, 2], [1]]
    target = one_hot_rows([[2, 2, 2], [1]], 5, [4, 0])
    target[4:6] = torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0], [0.2] * 5], dtype=target.dtype)
    _expect_case(fn, "草稿全部被接受", drafts, target, None, [4, 3], [True, False], [0.1, 0.2, 0.3, 0.999],
                 [[2, 2, 2, 4], [1, 3, P, P]], [3, 1])
    # First draft rejected by a greedy row: stop there, nothing after the recovered token.
    drafts = [[5, 1, 2]]
    _expect_case(fn, "第一个草稿就被拒", drafts, one_hot_rows([[4, 1, 2]], 6, [0]), None, [0], [True], [0.5] * 3,
                 [[4, P, P, P]], [0])
    # p/q above 1 is accepted whatever u is; a rejection after an accepted run recovers from (p - q)+.
    p = torch.tensor([[0.0, 0.9, 0.1], [0.0, 0.0, 1.0], [0.2, 0.3, 0.5], [0.6, 0.4, 0.0], [1.0, 0.0, 0.0],
                      [0.5, 0.5, 0.0]], dtype=torch.float64)
    q = torch.tensor([[0.0, 0.3, 0.7], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [0.6, 0.4, 0.0]], dtype=torch.float64)
    # r0: draft 1 (p/q = 3, u ~ 1) accepted; draft 2 (p/q = 1) accepted; draft 1 (p = 0.3) rejected at u = 0.5
    #     -> (p - q)+ = [0.2, 0, 0.5]: token 0 or 2, never 1. r1: draft 0 (p/q=1) accepted, then bonus.
    for seed in range(6):
        gen = torch.Generator().manual_seed(seed)
        out, n = call(fn, [[1, 2, 1], [0]], p[[0, 1, 2, 2, 3, 5]], q,
                      torch.tensor([0, 1]), [False, False], torch.tensor([0.9999, 0.9999, 0.5, 0.9999],
                                                                         dtype=torch.float64), gen)
        row = out[0].tolist()
        expect(row[:2] == [1, 2] and row[2] in (0, 2) and row[3] == P and n[0] == 2,
               f"p/q > 1 的草稿必须接受、拒绝后从 (p - q)+ 恢复（只可能是 0 或 2）：实际第 0 行 {row}、num_accepted {n[0]}。")
        expect(out[1].tolist() == [0, 1, P, P] and n[1] == 1, f"第 1 行应为 [0, 1, -1, -1]、接受 1 个，实际 {out[1].tolist()}。")
    check_against_vllm(fn)


# ---------------------------------------------------------------------------- against the pinned vLLM itself
def vllm_case_inputs(payload: dict) -> tuple:
    """A recorded case (autograder/lesson09/vllm_view.py) in the exercise's argument order, as tensors."""
    dp = payload["draft_probs"]
    return (payload["drafts"], torch.tensor(payload["target_probs"], dtype=torch.float64),
            None if dp is None else torch.tensor(dp, dtype=torch.float64), torch.tensor(payload["bonus"]),
            payload["is_greedy"], torch.tensor(payload["uniform"], dtype=torch.float64))


def check_against_vllm(fn) -> None:
    """fn and the pinned vLLM's own rejection_sample (its Triton kernels, recorded) on the same batches: every case
    of the input-space table whose answer is forced, including a greedy row next to a draft model's q."""
    from autograder.lesson09.vllm_view import GRADED
    from autograder.vllm_oracle import recorded

    for name, payload in GRADED.items():
        want = recorded("lesson09", name)
        out, n = call(fn, *vllm_case_inputs(payload), generator=torch.Generator().manual_seed(0))
        expect(out.tolist() == want["output_token_ids"] and n == want["num_accepted"],
               f"与 vLLM {VLLM_VERSION} 的 rejection_sample 在同一批上结果不同（用例 {name}，drafts={payload['drafts']}，"
               f"is_greedy={payload['is_greedy']}）：vLLM 输出 {want['output_token_ids']}、num_accepted="
               f"{want['num_accepted']}；你的 {out.tolist()}、{n}。")


# ---------------------------------------------------------------------------- the real engine
@dataclass
class EngineRun:
    tokens: list                      # per prompt: the generated token ids
    stats: object                     # SpecDecodingStats or None
    calls: list = field(default_factory=list)   # per verification step: (num_draft_tokens, num_accepted) lists
    steps: int = 0                    # engine steps to finish
    trace: list = field(default_factory=list)   # engine's own sampler: per step, (drafts, emitted) per request


def drafts_of(md) -> list[list[int]]:
    """Each request's draft tokens, from the flat draft_token_ids and num_draft_tokens of SpecDecodeMetadata."""
    flat, ends = md.draft_token_ids.tolist(), list(itertools.accumulate(md.num_draft_tokens))
    return [flat[end - k:end] for k, end in zip(md.num_draft_tokens, ends, strict=True)]


class StudentRejectionSampler:
    """Stands where minivllm's RejectionSampler stands in the runner, and verifies with the student's fn."""

    def __init__(self, fn, log: list) -> None:
        self.fn, self.log = fn, log

    def __call__(self, md, draft_probs, logits, sampling_metadata):
        from minivllm.sample.rejection_sampler import (
            RejectionSampler,
            apply_sampling_constraints,
            generate_uniform_probs,
        )

        batch = len(md.num_draft_tokens)
        device = logits.device
        logits = logits.float()
        rows = torch.repeat_interleave(torch.arange(batch, device=device),
                                       torch.tensor([k + 1 for k in md.num_draft_tokens], device=device))
        target_probs = apply_sampling_constraints(logits, sampling_metadata, rows).softmax(dim=-1)
        bonus_logits = apply_sampling_constraints(logits[md.bonus_logits_indices], sampling_metadata,
                                                  torch.arange(batch, device=device))
        bonus = RejectionSampler._sample(bonus_logits, sampling_metadata, logits[md.bonus_logits_indices])
        uniform = generate_uniform_probs(md.num_draft_tokens, sampling_metadata.generators, device)
        greedy = ([True] * batch if sampling_metadata.all_greedy
                  else (sampling_metadata.temperature < 1e-5).tolist())
        out, num_accepted = call(self.fn, drafts_of(md), target_probs.cpu(), draft_probs, bonus.cpu(), greedy,
                                 uniform.cpu())
        self.log.append((list(md.num_draft_tokens), list(num_accepted)))
        result = torch.full((batch, md.max_spec_len + 1), P, dtype=torch.int64)
        for i, n in enumerate(num_accepted):
            expect(0 <= n <= md.num_draft_tokens[i],
                   f"num_accepted[{i}] = {n}，应在 0..{md.num_draft_tokens[i]} 之间（草稿数 {md.num_draft_tokens[i]}）。")
            expect(bool((out[i, :n + 1] >= 0).all()),
                   f"num_accepted[{i}] = {n}，但输出第 {i} 行的前 {n + 1} 个位置里有占位符：{out[i].tolist()}。")
            result[i, :n + 1] = out[i, :n + 1]
        return result.to(device)


@contextlib.contextmanager
def recording(log: list):
    """minivllm's own RejectionSampler, each call's drafts and emitted tokens appended to `log`."""
    import minivllm.worker.gpu_model_runner as runner
    from minivllm.sample.rejection_sampler import RejectionSampler

    class Recording(RejectionSampler):
        def __call__(self, md, draft_probs, logits, sampling_metadata):
            out = super().__call__(md, draft_probs, logits, sampling_metadata)
            log.append(list(zip(drafts_of(md), emitted(out), strict=True)))
            return out

    with mock.patch.object(runner, "RejectionSampler", Recording):
        yield


@contextlib.contextmanager
def plugged(fn, log: list):
    """Within: every LLM built verifies drafts with fn (the runner looks the name up at construction)."""
    import minivllm.worker.gpu_model_runner as runner

    with mock.patch.object(runner, "RejectionSampler", lambda: StudentRejectionSampler(fn, log)):
        yield


def run_engine(fn=None, spec: dict | None = SPEC, max_tokens: int = ENGINE_MAX_TOKENS, prompts=None,
               **kw) -> EngineRun:
    """Greedy generation of the engine prompts (each alone after the others: batch of 3); fn plugged if given."""
    from minivllm.sampling_params import SamplingParams

    log: list = []
    with plugged(fn, log) if fn is not None else recording(log) if spec else contextlib.nullcontext():
        llm = make_llm(speculative_config=spec, **kw)
    try:
        prompts = prompts if prompts is not None else [llm.get_tokenizer().encode(t) for t in ENGINE_PROMPTS]
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        engine = llm.llm_engine
        for i, p in enumerate(prompts):
            engine.add_request(str(i), p, params)
        steps, done = 0, {}
        while engine.has_unfinished_requests():
            for o in engine.step():
                if o.finished:
                    done[o.request_id] = o.outputs[0].token_ids
            steps += 1
        stats = engine.engine_core.get_stats().spec_decoding_stats
    finally:
        shutdown(llm)
    tokens = [list(done[str(i)]) for i in range(len(prompts))]
    if fn is None:
        return EngineRun(tokens, stats, [([len(d) for d, _ in st], [len(o) - 1 for _, o in st]) for st in log], steps,
                         log)
    return EngineRun(tokens, stats, log, steps)


@functools.cache
def reference_runs() -> dict:
    """The non-speculative run and the engine's own speculative run (cached: they do not depend on the student)."""
    return {"plain": run_engine(spec=None), "spec": run_engine()}


STATS_FIELDS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos",
                "num_draft_tokens_per_pos")


@graded
def check_real_engine(fn) -> None:
    greedy_case_drafts, target, bonus, _, _ = greedy_case()
    call(fn, greedy_case_drafts, target, None, torch.tensor(bonus), [True] * 4, torch.full((6,), 0.5))  # blanks first
    ref = reference_runs()
    try:
        got = run_engine(fn)
    except (CheckFailed, BlankNotFilled):
        raise
    except Exception as e:
        raise CheckFailed(f"接入引擎后生成出错：{type(e).__name__}: {e}") from None
    expect(any(sum(n) for _, n in got.calls), "引擎里没有任何草稿被接受：你的函数是否被调用了？")
    for i, (a, b) in enumerate(zip(got.tokens, ref["plain"].tokens, strict=True)):
        if a != b:
            j = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            raise CheckFailed(f"贪心 + 投机解码的输出应与不投机时逐 token 相同：prompt {i} 在第 {j} 个输出 token 处不同"
                              f"（投机 {a[j:j + 4]}，不投机 {b[j:j + 4]}；长度 {len(a)} vs {len(b)}）。")
    diff = [f"{n}: {a} vs {b}" for n in STATS_FIELDS
            if (a := getattr(got.stats, n)) != (b := getattr(ref["spec"].stats, n))]
    expect(not diff, "接受统计（SpecDecodingStats）应与引擎自带 RejectionSampler 的相同：" + "；".join(diff) + "。")


# ---------------------------------------------------------------------------- source map
# Names the lesson's own text does not print, checked against the pinned vLLM (vllm/v1/sample/rejection_sampler.py,
# v1/spec_decode/*.py); the first two are in the vLLM excerpts its show_vllm cell prints from the fetched source.
# SourceMap says how they are stored.
SOURCE = SourceMap(["cumulative_drafts", "no_q_flag", "per_request_to_per_token", "parse", "parallel_ngram"], {
    "cumulative_drafts": {"01c06631cf4b54db"},
    "no_q_flag": {"1632b9584efd92cc"},
    "per_request_to_per_token": {"07296112d2e0b478", "8eeea6e3d31f2b14"},  # the function or its kernel
    "parse": {"25fb5315d3fcb0a5"},
    "parallel_ngram": {"f2a6a34b3a69eb1e"},
})


LESSON = Lesson(
    lesson_id="lesson09",
    title="投机解码：n-gram 提议与拒绝采样",
    answer=("rejection_sample",),
    code={
        "main_path": ("主路径·构造用例与分布", check_main_path),
        "real_engine": ("主路径·真实引擎", check_real_engine),
        "boundary": ("边界条件", check_boundary),
    },
    source_map=SOURCE,
    questions=("为何分布不变", "何时投机反而变慢", "接受率与 k 的取舍"),
)
check_source_map = SOURCE.check
