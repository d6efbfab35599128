"""Speculative decoding building blocks: the n-gram proposer and the rejection sampler.

The rejection-sampler cases re-express vLLM's tests/v1/sample/test_rejection_sampler.py (perfect match,
early and multiple mismatches, empty drafts, mixed batches) against our API, and its statistical check
that the emitted tokens follow the target distribution, here as a chi-square test with a fixed seed.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm.sample.metadata import SamplingMetadata
from minivllm.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID, RejectionSampler, SpecDecodeMetadata
from minivllm.spec_decode.ngram_proposer import NgramProposer, find_ngram_draft

P = PLACEHOLDER_TOKEN_ID


# ------------------------------------------------------------------ n-gram proposer
def ngram_oracle(tokens: list[int], min_n: int, max_n: int, k: int, max_model_len: int) -> list[int]:
    """The rule by definition: longest n in [min_n, max_n], then the earliest earlier occurrence."""
    total = len(tokens)
    k = min(k, max_model_len - total)
    if k <= 0:
        return []
    for n in range(max_n, min_n - 1, -1):
        if n > total - 1:
            continue
        suffix = tokens[total - n:]
        for j in range(0, total - n):
            if tokens[j:j + n] == suffix:
                return tokens[j + n:j + n + k]
    return []


@pytest.mark.parametrize("tokens,min_n,max_n,k,expected", [
    ([1, 2, 3, 4, 1, 2, 3], 2, 3, 2, [4, 1]),        # the 3-gram [1,2,3] matched, then 4, 1
    ([1, 2, 3, 4, 1, 2, 3], 2, 3, 5, [4, 1, 2, 3]),  # capped by the tokens after the match
    ([1, 2, 3, 4, 5], 1, 3, 2, []),                  # no earlier occurrence
    ([5, 9, 1, 5, 9, 2, 5, 9], 2, 2, 1, [1]),        # two matches of 2: the earliest wins
    ([7, 7, 7, 7], 1, 2, 3, [7, 7]),                 # overlapping matches are allowed
    ([1, 2], 3, 4, 2, []),                           # fewer tokens than min_n
    ([1, 2, 1, 2, 1], 1, 2, 4, [2, 1]),
])
def test_ngram_cases(tokens, min_n, max_n, k, expected):
    got = find_ngram_draft(np.array(tokens), min_n, max_n, k, max_model_len=64).tolist()
    assert got == expected == ngram_oracle(tokens, min_n, max_n, k, 64)


def test_ngram_respects_max_model_len():
    tokens = [1, 2, 3, 1, 2]
    assert find_ngram_draft(np.array(tokens), 1, 2, 3, max_model_len=6).tolist() == [3]
    assert find_ngram_draft(np.array(tokens), 1, 2, 3, max_model_len=5).tolist() == []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=40), st.integers(1, 4), st.integers(0, 3),
       st.integers(1, 5))
def test_ngram_matches_definition(tokens, min_n, extra, k):
    max_n = min_n + extra
    got = find_ngram_draft(np.array(tokens), min_n, max_n, k, max_model_len=48).tolist()
    assert got == ngram_oracle(tokens, min_n, max_n, k, 48)


def test_ngram_proposer_batch():
    prop = NgramProposer(num_speculative_tokens=2, prompt_lookup_min=1, prompt_lookup_max=3, max_model_len=32)
    assert prop.propose([np.array([1, 2, 3, 1, 2]), np.array([4, 5])]) == [[3, 1], []]


# ------------------------------------------------------------------ rejection sampler
def greedy_md(n: int) -> SamplingMetadata:
    return SamplingMetadata(None, True, False, None, None, None, {}, None)


def random_md(temps: list[float], generators=None) -> SamplingMetadata:
    t = torch.tensor(temps, dtype=torch.float32)
    greedy = t < 1e-5
    return SamplingMetadata(t, bool(greedy.all()), not bool(greedy.any()), None, None, None,
                            generators or {}, None)


def logits_for(target_tokens: list[list[int]], vocab: int = 10) -> torch.Tensor:
    """One row per target token, peaked there (each request: k draft rows + its bonus row)."""
    rows = [t for req in target_tokens for t in req]
    logits = torch.full((len(rows), vocab), -100.0)
    logits[torch.arange(len(rows)), torch.tensor(rows)] = 100.0
    return logits


@pytest.mark.parametrize("drafts,targets,expected", [
    ([[1, 2, 3]], [[1, 2, 3, 4]], [[1, 2, 3, 4]]),                 # perfect match: bonus appended
    ([[1, 2, 3]], [[1, 5, 3, 4]], [[1, 5, P, P]]),                 # early mismatch: recovered, stop
    ([[1, 2], [3]], [[1, 2, 5], [3, 4]], [[1, 2, 5], [3, 4, P]]),  # two requests, both all accepted
    ([[1]], [[2, 3]], [[2, P]]),                                    # single draft rejected
    ([[]], [[5]], [[5]]),                                           # no draft: only the bonus
    ([[1, 2, 3], [4, 5, 6]], [[1, 2, 7, 8], [4, 8, 6, 9]], [[1, 2, 7, P], [4, 8, P, P]]),
    ([[], [1, 2]], [[3], [9, 2, 4]], [[3, P, P], [9, P, P]]),      # empty draft beside a rejected one
])
def test_greedy_rejection(drafts, targets, expected):
    md = SpecDecodeMetadata.make(drafts)
    out = RejectionSampler()(md, None, logits_for(targets), greedy_md(len(drafts)))
    assert out.tolist() == expected


def test_greedy_rows_in_a_mixed_batch_are_exact():
    drafts, targets = [[1, 2], [3, 4]], [[1, 6, 7], [3, 4, 5]]
    md = SpecDecodeMetadata.make(drafts)
    out = RejectionSampler()(md, None, logits_for(targets), random_md([0.0, 1.0]))
    assert out[0].tolist() == [1, 6, P]
    # Peaked logits leave the random row no choice either: both drafts accepted, then the bonus.
    assert out[1].tolist() == [3, 4, 5]


def emitted_first_tokens(target_probs: torch.Tensor, draft_probs: torch.Tensor | None, draft: torch.Tensor,
                         n: int) -> torch.Tensor:
    """n independent single-draft requests verified at once; returns each request's first token."""
    md = SpecDecodeMetadata.make([[int(d)] for d in draft])
    vocab = target_probs.shape[0]
    logits = target_probs.log().repeat(2 * n, 1)  # each request: its draft row and its bonus row
    dp = None if draft_probs is None else draft_probs.unsqueeze(0).repeat(n, 1)
    out = RejectionSampler()(md, dp, logits, random_md([1.0] * n))
    assert out.shape == (n, 2) and (out[:, 0] >= 0).all() and (out[:, 0] < vocab).all()
    return out[:, 0]


def chi_square_p_value(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson's chi-square test; the p-value is the chi2(df) survival function Q(df/2, x/2)."""
    expected = probs * counts.sum()
    stat = float(((counts - expected) ** 2 / expected).sum())
    df = len(counts) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


@pytest.mark.parametrize("with_draft_probs", [True, False])
def test_rejection_sampling_preserves_target_distribution(with_draft_probs):
    torch.manual_seed(0)
    vocab, n = 6, 20000
    target = torch.tensor([0.30, 0.25, 0.20, 0.15, 0.07, 0.03])
    q = torch.tensor([0.05, 0.10, 0.40, 0.05, 0.30, 0.10])
    draft = torch.multinomial(q, n, replacement=True)  # drafts drawn from q, as a draft model would
    first = emitted_first_tokens(target, q if with_draft_probs else None, draft, n)
    counts = np.bincount(first.numpy(), minlength=vocab)
    assert chi_square_p_value(counts, target.numpy()) > 1e-3
    # The test can fail: the draft distribution itself is rejected by the same statistic.
    assert chi_square_p_value(np.bincount(draft.numpy(), minlength=vocab), target.numpy()) < 1e-6


def test_chi_square_p_value():
    # chi2 with 2 degrees of freedom has survival exp(-x/2); these counts give x = 2 + 2 + 0 = 4.
    assert chi_square_p_value(np.array([60, 40, 100]), np.array([0.25, 0.25, 0.5])) == pytest.approx(np.exp(-2))


def test_acceptance_rate_is_the_overlap():
    """P(accept) = sum_x min(p(x), q(x)) for a draft model; p(draft) on average for n-gram drafts."""
    torch.manual_seed(1)
    n = 20000
    target = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.2, 0.6])
    draft = torch.multinomial(q, n, replacement=True)
    md = SpecDecodeMetadata.make([[int(d)] for d in draft])
    out = RejectionSampler()(md, q.repeat(n, 1), target.log().repeat(2 * n, 1), random_md([1.0] * n))
    accepted = (out[:, 1] != P).float().mean().item()  # a bonus token means the draft was accepted
    assert abs(accepted - torch.minimum(target, q).sum().item()) < 0.02


def test_seeded_requests_do_not_depend_on_the_batch():
    target = torch.tensor([0.4, 0.3, 0.2, 0.1]).log()

    def run(batch_drafts, seeded_row):
        md = SpecDecodeMetadata.make(batch_drafts)
        rows = sum(len(d) + 1 for d in batch_drafts)
        gen = torch.Generator().manual_seed(1234)
        return RejectionSampler()(md, None, target.repeat(rows, 1),
                                  random_md([1.0] * len(batch_drafts), {seeded_row: gen}))[seeded_row]

    alone = run([[1, 2, 0]], 0)
    torch.manual_seed(99)
    mixed = run([[3], [1, 2, 0], [2, 2]], 1)
    assert alone.tolist() == mixed[:4].tolist()


@pytest.mark.parametrize("with_draft_probs", [False, True])
@pytest.mark.parametrize("temps", [[1.0, 1.0], [0.0, 1.0]])
def test_placeholder_draft_is_rejected_and_recovered(with_draft_probs, temps):
    """vLLM's kernels reject a padded draft id -1 and emit the recovered (or greedy) token there."""
    drafts, targets = [[-1, 2], [1, -1]], [[4, 2, 3], [1, 5, 6]]
    md = SpecDecodeMetadata.make(drafts)
    dp = torch.full((4, 10), 0.1) if with_draft_probs else None
    out = RejectionSampler()(md, dp, logits_for(targets), random_md(temps))
    assert out.tolist() == [[4, P, P], [1, 5, P]]


def test_recovered_token_of_a_placeholder_follows_the_target():
    torch.manual_seed(2)
    target = torch.tensor([0.4, 0.3, 0.2, 0.1])
    first = emitted_first_tokens(target, None, torch.full((20000,), -1), 20000)
    assert chi_square_p_value(np.bincount(first.numpy(), minlength=4), target.numpy()) > 1e-3


def test_metadata_layout():
    md = SpecDecodeMetadata.make([[5, 6], [], [7]])
    assert md.num_draft_tokens == [2, 0, 1]
    assert md.cu_num_draft_tokens.tolist() == [2, 2, 3]
    assert md.target_logits_indices.tolist() == [0, 1, 4]
    assert md.bonus_logits_indices.tolist() == [2, 3, 5]
    assert md.max_spec_len == 2


# ------------------------------------------------------------------ the engine with n-gram speculation
# The default model (a tiny Shakespeare Llama) falls into loops under greedy decoding: n-grams repeat,
# so drafts are often accepted, and also often rejected, which is what these tests need.
ROMEO = "ROMEO:\nWhat light through yonder window breaks?\nROMEO:\nWhat light"
SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


def spec_llm(**kw):
    from minivllm.entrypoints.llm import LLM
    return LLM(multiprocess=False, **kw)


@pytest.fixture(scope="module")
def plain_and_spec():
    plain = spec_llm()
    spec = spec_llm(speculative_config=SPEC)
    yield plain, spec
    plain.llm_engine.engine_core.shutdown()
    spec.llm_engine.engine_core.shutdown()


def prompts_from(llm, n: int = 6) -> list[list[int]]:
    tok = llm.get_tokenizer()
    texts = [ROMEO, "JULIET:\nO Romeo, Romeo", "KING HENRY:\nOnce more unto the breach",
             "HAMLET:\nTo be, or not to be", "First Citizen:\nBefore we proceed", "MACBETH:\nIs this a dagger"]
    return [tok.encode(t) for t in texts[:n]]


def greedy_tokens(llm, prompts, max_tokens=40, **kw):
    from minivllm.sampling_params import SamplingParams
    outs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kw),
                        use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def test_speculative_greedy_equals_plain_greedy(plain_and_spec):
    plain, spec = plain_and_spec
    prompts = prompts_from(plain)
    assert greedy_tokens(spec, prompts) == greedy_tokens(plain, prompts)
    stats = spec.llm_engine.engine_core.get_stats().spec_decoding_stats
    assert stats.num_drafts > 0 and 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    assert stats.num_accepted_tokens_per_pos[0] >= stats.num_accepted_tokens_per_pos[-1]


def test_speculation_under_chunking_prefix_caching_and_preemption(plain_and_spec):
    plain, _ = plain_and_spec
    prompts = prompts_from(plain)
    shared = prompts[0] * 3
    prompts = [shared + p for p in prompts]  # a shared prefix: prefix-cache hits
    expected = greedy_tokens(plain, prompts, max_tokens=24)
    tight = spec_llm(speculative_config=SPEC, max_num_batched_tokens=32, num_gpu_blocks=12, block_size=16)
    try:
        assert greedy_tokens(tight, prompts, max_tokens=24) == expected
        core = tight.llm_engine.engine_core
        stats = core.get_stats()
        assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
        assert stats.spec_decoding_stats.num_drafts > 0
        sched = core.scheduler
        assert not sched.requests and sched.kv_cache_manager.block_pool.get_num_free_blocks() == stats.num_total_blocks
    finally:
        tight.llm_engine.engine_core.shutdown()


def test_stop_inside_an_accepted_run(plain_and_spec):
    plain, spec = plain_and_spec
    prompts = prompts_from(plain, 3)
    for max_tokens in (1, 2, 5, 7):
        assert greedy_tokens(spec, prompts, max_tokens) == greedy_tokens(plain, prompts, max_tokens)
    # A stop token id that occurs inside the loop: output ends right there, as without speculation.
    loop = greedy_tokens(plain, prompts[:1], 30)[0]
    stop_id = loop[10]
    assert (greedy_tokens(spec, prompts[:1], 30, stop_token_ids=[stop_id])
            == greedy_tokens(plain, prompts[:1], 30, stop_token_ids=[stop_id]))
    assert (greedy_tokens(spec, prompts[:1], 30, stop=["\n"]) == greedy_tokens(plain, prompts[:1], 30, stop=["\n"]))


def test_speculative_logprobs_equal_plain(plain_and_spec):
    from minivllm.sampling_params import SamplingParams
    plain, spec = plain_and_spec
    prompts = prompts_from(plain, 2)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, logprobs=2)
    a = plain.generate(prompts, params, use_tqdm=False)
    b = spec.generate(prompts, params, use_tqdm=False)
    for x, y in zip(a, b, strict=True):
        assert x.outputs[0].token_ids == y.outputs[0].token_ids
        for lx, ly in zip(x.outputs[0].logprobs, y.outputs[0].logprobs, strict=True):
            assert lx.keys() == ly.keys()
            assert all(abs(lx[t] - ly[t]) < 1e-4 for t in lx)


def test_seeded_sampling_with_speculation_is_reproducible(plain_and_spec):
    from minivllm.sampling_params import SamplingParams
    _, spec = plain_and_spec
    prompts = prompts_from(spec, 3)
    params = SamplingParams(max_tokens=20, temperature=0.8, seed=7, ignore_eos=True)
    first = [o.outputs[0].token_ids for o in spec.generate(prompts, params, use_tqdm=False)]
    alone = [o.outputs[0].token_ids for o in spec.generate(prompts[1:2], params, use_tqdm=False)]
    assert first[1] == alone[0]


def test_bad_speculative_config():
    from minivllm.config import SpeculativeConfig
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpeculativeConfig.from_arg({"method": "ngram"})
    with pytest.raises(ValueError, match="not supported"):
        SpeculativeConfig.from_arg({"method": "eagle", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="unknown speculative_config"):
        SpeculativeConfig.from_arg({"method": "ngram", "num_speculative_tokens": 2, "lookup": 3})
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        SpeculativeConfig.from_arg({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4,
                                    "prompt_lookup_max": 2})
    cfg = SpeculativeConfig.from_arg({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4})
    assert (cfg.prompt_lookup_min, cfg.prompt_lookup_max) == (4, 4)


def test_structured_outputs_run_with_speculation(plain_and_spec):
    """Accepted now, as in vLLM (tests/test_structured_output.py checks validity and equality in depth)."""
    from minivllm.sampling_params import SamplingParams, StructuredOutputsParams
    _, spec = plain_and_spec
    out = spec.generate(["ROMEO:"], SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(
        choice=["yes", "no"])), use_tqdm=False)[0].outputs[0]
    assert out.text in ("yes", "no") and out.finish_reason == "stop"


def test_spec_decoding_stats_reach_the_prometheus_metrics(plain_and_spec):
    """/metrics renders what PrometheusStatLogger holds: vLLM's spec_decode_* counters plus the derived rates."""
    from minivllm.entrypoints.openai.metrics import PrometheusStatLogger, parse_prometheus
    _, spec = plain_and_spec
    greedy_tokens(spec, prompts_from(spec, 2), max_tokens=24)
    stats = spec.llm_engine.engine_core.get_stats()
    sd = stats.spec_decoding_stats
    logger = PrometheusStatLogger("m")
    logger.record(stats, None)
    logger.record(stats, None)  # the same cumulative totals again: counters must not double
    got = parse_prometheus(logger.render())
    assert got['minivllm:spec_decode_num_drafts_total{model_name="m"}'] == sd.num_drafts > 0
    assert got['minivllm:spec_decode_num_draft_tokens_total{model_name="m"}'] == sd.num_draft_tokens
    assert got['minivllm:spec_decode_num_accepted_tokens_total{model_name="m"}'] == sd.num_accepted_tokens
    assert got['minivllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="0"}'] == \
        sd.num_accepted_tokens_per_pos[0]
    assert got['minivllm:spec_decode_acceptance_rate{model_name="m"}'] == pytest.approx(sd.acceptance_rate)
    assert got['minivllm:spec_decode_mean_acceptance_length{model_name="m"}'] == \
        pytest.approx(1 + sd.num_accepted_tokens / sd.num_drafts)


def test_min_tokens_holds_inside_verified_drafts(plain_and_spec):
    """A stop token the drafts propose before min_tokens is masked on its verification row, as the Sampler
    masks it without speculation: the outputs are equal."""
    from minivllm.sampling_params import SamplingParams
    plain, spec = plain_and_spec
    prompts = prompts_from(plain, 3)
    loops = greedy_tokens(plain, prompts, 30)
    stop_ids = sorted({loops[0][3], loops[1][3]})
    for min_tokens in (0, 6, 12):
        params = SamplingParams(max_tokens=30, temperature=0.0, min_tokens=min_tokens, stop_token_ids=stop_ids)
        a = [o.outputs[0].token_ids for o in plain.generate(prompts, params, use_tqdm=False)]
        b = [o.outputs[0].token_ids for o in spec.generate(prompts, params, use_tqdm=False)]
        assert a == b, min_tokens
        assert all(not set(t[:min_tokens]) & set(stop_ids) for t in b)
