"""End to end: LLM.generate under greedy decoding equals HF transformers token for token.

The oracle is transformers' own generate() on the same checkpoint files. Scenarios stress the engine's
moving parts: mixed-length batches, chunked prefill under a tiny token budget, prefix caching with
shared prefixes, and a KV cache so small that requests get preempted and recomputed.
"""
from __future__ import annotations

import random

import pytest
import torch
import transformers
from tiny_models import DEFAULT_MODEL

from minivllm.entrypoints.llm import LLM
from minivllm.sampling_params import SamplingParams

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def tiny_models(tiny_model):
    return {name: tiny_model(name) for name in
            ("llama", "llama3-rope", "llama-tied", "llama-sharded", "qwen2", "qwen3")}


def make_prompts(n: int, vocab: int, seed: int = 0, lo: int = 3, hi: int = 70) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(4, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


_HF_CACHE: dict[str, transformers.PreTrainedModel] = {}


def hf_greedy(path: str, prompts: list[list[int]], max_tokens: int = MAX_TOKENS) -> list[list[int]]:
    if path not in _HF_CACHE:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
        _HF_CACHE[path] = model
    model = _HF_CACHE[path]
    outs = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p])
            gen = model.generate(ids, max_new_tokens=max_tokens, do_sample=False, attention_mask=torch.ones_like(ids))
            outs.append(gen[0, len(p):].tolist())
    return outs


def greedy(max_tokens: int = MAX_TOKENS, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kw)


def engine_tokens(llm: LLM, prompts, params=None) -> list[list[int]]:
    outs = llm.generate(prompts, params or greedy(), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def vocab_of(path: str) -> int:
    return transformers.AutoConfig.from_pretrained(path).vocab_size


@pytest.mark.parametrize("name", ["llama", "llama3-rope", "llama-tied", "llama-sharded", "qwen2", "qwen3"])
def test_greedy_batch_equals_hf(tiny_models, name):
    path = tiny_models[name]
    prompts = make_prompts(16, vocab_of(path), seed=hash(name) % 1000)
    llm = LLM(path, device="cpu", attention_backend="torch", max_num_seqs=16)
    assert engine_tokens(llm, prompts) == hf_greedy(path, prompts)


def test_chunked_prefill_small_budget(tiny_models):
    path = tiny_models["llama"]
    prompts = make_prompts(8, vocab_of(path), seed=1, lo=20, hi=90)
    llm = LLM(path, device="cpu", attention_backend="torch", max_num_batched_tokens=24, multiprocess=False,
              long_prefill_token_threshold=10)
    sched = llm.llm_engine.engine_core.scheduler
    seen_partial = []
    orig = sched.schedule

    def spy():
        so = orig()
        seen_partial.append(any(n > 1 for n in so.num_scheduled_tokens.values()) and
                            so.total_num_scheduled_tokens <= 24)
        assert so.total_num_scheduled_tokens <= 24
        return so
    sched.schedule = spy
    assert engine_tokens(llm, prompts) == hf_greedy(path, prompts)
    assert any(seen_partial)


def test_prefix_caching_shared_prefixes(tiny_models):
    path = tiny_models["qwen3"]
    vocab = vocab_of(path)
    rng = random.Random(7)
    system = [rng.randrange(4, vocab) for _ in range(40)]
    prompts = [system + [rng.randrange(4, vocab) for _ in range(rng.randint(1, 20))] for _ in range(12)]
    llm = LLM(path, device="cpu", attention_backend="torch", enable_prefix_caching=True, max_num_seqs=4)
    assert engine_tokens(llm, prompts) == hf_greedy(path, prompts)
    stats = llm.llm_engine.get_stats()
    assert stats.prefix_cache_hits >= 32 * 8, stats  # later requests hit at least two 16-token blocks


def test_preemption_small_kv_cache(tiny_models):
    path = tiny_models["llama-tied"]
    prompts = make_prompts(10, vocab_of(path), seed=3, lo=20, hi=40)
    llm = LLM(path, device="cpu", attention_backend="torch", num_gpu_blocks=12, max_num_seqs=8,
              enable_prefix_caching=False)
    assert engine_tokens(llm, prompts, greedy(20)) == hf_greedy(path, prompts, 20)
    assert llm.llm_engine.get_stats().num_preemptions > 0


def test_default_model_equals_hf():
    path = str(DEFAULT_MODEL)
    prompts = make_prompts(16, vocab_of(path), seed=5, lo=2, hi=50)
    llm = LLM(device="cpu", attention_backend="torch")
    assert engine_tokens(llm, prompts) == hf_greedy(path, prompts)


def test_logprobs_match_hf(tiny_models):
    path = tiny_models["qwen2"]
    prompts = make_prompts(4, vocab_of(path), seed=11)
    llm = LLM(path, device="cpu", attention_backend="torch")
    outs = llm.generate(prompts, greedy(6, logprobs=3), use_tqdm=False)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for p, o in zip(prompts, outs, strict=True):
        comp = o.outputs[0]
        ids = torch.tensor([p + comp.token_ids])
        with torch.inference_mode():
            ref = model(ids).logits[0].log_softmax(-1)
        for step, (tok, lp) in enumerate(zip(comp.token_ids, comp.logprobs, strict=True)):
            row = ref[len(p) - 1 + step]
            assert abs(lp[tok] - row[tok].item()) < 1e-4
            top = row.topk(3)
            for t, v in zip(top.indices.tolist(), top.values.tolist(), strict=True):
                assert abs(lp[t] - v) < 1e-4
        assert abs(comp.cumulative_logprob - sum(lp[t] for t, lp in zip(comp.token_ids, comp.logprobs, strict=True))) < 1e-6


def test_seeded_sampling_reproducible_across_batches(tiny_models):
    path = tiny_models["llama"]
    prompts = make_prompts(6, vocab_of(path), seed=2)
    llm = LLM(path, device="cpu", attention_backend="torch")
    sp = SamplingParams(max_tokens=10, temperature=1.0, top_k=50, top_p=0.9, seed=1234, ignore_eos=True)
    alone = engine_tokens(llm, [prompts[0]], sp)[0]
    again = engine_tokens(llm, [prompts[0]], sp)[0]
    mixed = engine_tokens(llm, prompts, [sp] + [SamplingParams(max_tokens=7, temperature=0.8, ignore_eos=True)] * 5)
    assert alone == again == mixed[0]
    other_seed = engine_tokens(llm, [prompts[0]], SamplingParams(max_tokens=10, temperature=1.0, top_k=50,
                                                                 top_p=0.9, seed=99, ignore_eos=True))[0]
    assert other_seed != alone


def test_bad_input_raises_and_engine_keeps_serving(tiny_models):
    path = tiny_models["llama"]
    llm = LLM(path, device="cpu", attention_backend="torch", max_model_len=64)
    good = make_prompts(2, vocab_of(path), seed=4, lo=5, hi=10)
    with pytest.raises(ValueError, match="empty"):
        llm.generate([[]], greedy(), use_tqdm=False)
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate([[5] * 65], greedy(), use_tqdm=False)
    with pytest.raises(ValueError, match="top_p"):
        llm.generate(good, SamplingParams(top_p=1.5), use_tqdm=False)
    with pytest.raises(ValueError, match="out of vocabulary"):
        llm.generate([[10**9]], greedy(), use_tqdm=False)
    assert engine_tokens(llm, good) == hf_greedy(path, good)
    assert not llm.llm_engine.has_unfinished_requests()
