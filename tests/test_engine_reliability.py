"""Engine reliability: no input, and no fault inside one request's step, stops the engine serving others.

The tiny model here has a 1000-row embedding under the default 4096-id tokenizer, so an id in between is
valid for the tokenizer but would fail inside a step: the InputProcessor must reject it, and a request
that slips past it (sent to the core directly) must end alone with an error while the engine carries on.
Oracles: HF transformers (min_tokens) and the engine's own answer for the same request run alone.
"""
from __future__ import annotations

import time

import pytest
import torch
import transformers

from minivllm.engine import EngineCoreRequest
from minivllm.entrypoints.llm import LLM
from minivllm.sampling_params import SamplingParams

MAX_LEN = 32
VOCAB = 1000
ARGS = dict(device="cpu", attention_backend="torch", max_model_len=MAX_LEN)


@pytest.fixture(scope="module")
def model(tiny_model):
    return tiny_model("llama", vocab_size=VOCAB, max_position_embeddings=MAX_LEN)


@pytest.fixture(scope="module")
def llm(model):
    return LLM(model, multiprocess=False, **ARGS)


def greedy(n: int | None = 6, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)


def tokens(llm, prompts, params) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def all_blocks_free(engine) -> bool:
    stats = engine.engine_core.get_stats()
    return stats.num_free_blocks == stats.num_total_blocks and stats.num_running_reqs == 0


# ---------------------------------------------------------------- prompt length vs max_model_len
@pytest.mark.parametrize("length", [MAX_LEN, MAX_LEN + 1])
def test_prompt_without_room_for_one_token_is_rejected(llm, length):
    """vLLM's rule: a prompt of max_model_len tokens (or more) is a 400, never a request that hangs."""
    with pytest.raises(ValueError, match="maximum model length of 32"):
        llm.generate([[5] * length], greedy(), use_tqdm=False)
    core = llm.llm_engine.engine_core.engine_core  # the core enforces the same rule on its own
    with pytest.raises(ValueError, match="no room"):
        core.add_request(EngineCoreRequest("direct", [5] * length, greedy(), 2))
    assert not core.scheduler.has_requests()


@pytest.mark.parametrize("max_tokens", [1, 5, None, 2**64])
def test_prompt_of_max_model_len_minus_one_finishes(llm, max_tokens):
    [out] = llm.generate([[7] * (MAX_LEN - 1)], greedy(max_tokens), use_tqdm=False)
    assert len(out.outputs[0].token_ids) == 1 and out.outputs[0].finish_reason == "length"
    assert all_blocks_free(llm.llm_engine)


@pytest.mark.parametrize("engine_args", [
    dict(max_num_batched_tokens=8, block_size=4),
    dict(max_num_batched_tokens=31, block_size=16, long_prefill_token_threshold=5),
    dict(max_num_batched_tokens=32, enable_chunked_prefill=False, block_size=2),
    dict(max_num_batched_tokens=3, block_size=1, enable_prefix_caching=False),
])
def test_long_prompts_finish_under_every_chunking(model, engine_args):
    """The engine-level half of the termination proof (the scheduler half runs every setting in
    test_scheduler_properties.py): prompts up to max_model_len - 1 all finish, next to short ones."""
    llm = LLM(model, multiprocess=False, **ARGS, **engine_args)
    prompts = [[9] * (MAX_LEN - 1), [8] * (MAX_LEN - 2), [3, 4, 5], [6] * 20]
    outs = llm.generate(prompts, greedy(None), use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [MAX_LEN - len(p) for p in prompts]
    assert all_blocks_free(llm.llm_engine)


# ---------------------------------------------------------------- numeric fields at the edge
def test_out_of_range_numbers_are_rejected_or_neutral(llm):
    ref = tokens(llm, [[11, 12, 13]], SamplingParams(max_tokens=6, temperature=1.0, seed=3, ignore_eos=True))
    # top_k at or beyond the vocabulary means "off" (vLLM's InputBatch): no int64 overflow in the batch.
    for top_k in (VOCAB, 2**63, 2**70):
        assert tokens(llm, [[11, 12, 13]], SamplingParams(max_tokens=6, temperature=1.0, seed=3, top_k=top_k,
                                                          ignore_eos=True)) == ref
    for kwargs, field in [({"seed": 2**64}, "seed"), ({"seed": -(2**63) - 1}, "seed"), ({"top_k": True}, "top_k"),
                          ({"temperature": 2.5}, "temperature"), ({"temperature": float("inf")}, "temperature"),
                          ({"max_tokens": 1.5}, "max_tokens")]:
        with pytest.raises(ValueError, match=field) as e:
            SamplingParams(**kwargs)
        assert e.value.parameter == field
    # the token-id check uses the model's embedding size, not the (larger) tokenizer's vocabulary
    with pytest.raises(ValueError, match="out of vocabulary") as e:
        llm.generate([[5, VOCAB]], greedy(), use_tqdm=False)
    assert e.value.parameter is None  # as the pinned vLLM's InputProcessor raises it (the server's 400 has param null)
    with pytest.raises(ValueError, match="stop_token_ids"):
        llm.generate([[5]], greedy(stop_token_ids=[VOCAB + 5]), use_tqdm=False)
    assert all_blocks_free(llm.llm_engine)


def test_queue_time_rides_on_the_first_output(llm):
    """EngineCore reports arrival -> first scheduled once per request, on its first output (for the metric)."""
    engine = llm.llm_engine
    core = engine.engine_core.engine_core
    for i, n in enumerate((MAX_LEN - 2, 3)):
        core.add_request(EngineCoreRequest(f"q{i}", [5] * n, greedy(3), 2, arrival_time=time.time() - 10))
    seen: dict[str, list] = {}
    while core.scheduler.has_requests():
        for out in core.step()[0].outputs:
            seen.setdefault(out.request_id, []).append(out.queue_time)
    for times in seen.values():
        assert times[0] is not None and 10 <= times[0] < 60 and all(t is None for t in times[1:]), times
    assert not core._queue_times


def test_huge_text_is_rejected_before_tokenizing(llm, monkeypatch):
    engine = llm.llm_engine
    calls = []
    monkeypatch.setattr(engine.tokenizer, "encode", lambda *a, **k: calls.append(1) or [])
    with pytest.raises(ValueError, match="maximum context length is 32 tokens") as e:
        llm.generate(["x" * (MAX_LEN * engine.input_processor.max_chars_per_token + 1)], greedy(), use_tqdm=False)
    assert e.value.parameter == "prompt" and not calls


# ---------------------------------------------------------------- a fault inside a step
def _run_with_poison(engine, good_prompts):
    """Send a request with an id past the embedding straight to the core (bypassing the InputProcessor),
    then, in later steps, good ones; returns {request_id: final RequestOutput}."""
    poison = EngineCoreRequest("poison", [5, 6, VOCAB + 10**6], greedy(), 2)  # past the padded embedding too
    engine.output_processor.add_request(poison, None)
    engine.engine_core.add_request(poison)
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            finals[out.request_id] = out
    for i, p in enumerate(good_prompts):
        engine.add_request(f"good{i}", p, greedy())
    while engine.has_unfinished_requests():
        for out in engine.step():
            finals[out.request_id] = out
    return finals


@pytest.mark.parametrize("multiprocess", [False, True])
def test_step_exception_fails_only_that_request(model, llm, multiprocess):
    prompts = [[20, 21, 22], [30] * 9]
    ref = tokens(llm, prompts, greedy())
    target = llm if not multiprocess else LLM(model, multiprocess=True, **ARGS)
    try:
        finals = _run_with_poison(target.llm_engine, prompts)
        bad = finals["poison"].outputs[0]
        assert bad.finish_reason == "error" and "IndexError" in bad.stop_reason, bad
        assert [finals[f"good{i}"].outputs[0].token_ids for i in range(2)] == ref
        assert all_blocks_free(target.llm_engine)
        # the poisoned step wrote no KV, so its blocks must not serve as a prefix-cache hit later
        assert tokens(target, [[5, 6, 7, 8]], greedy()) == tokens(llm, [[5, 6, 7, 8]], greedy())
    finally:
        if multiprocess:
            target.llm_engine.shutdown()


# ---------------------------------------------------------------- min_tokens (vLLM's MinTokensLogitsProcessor)
def test_min_tokens_masks_stop_ids_and_eos_like_hf(model, llm):
    prompt = [40, 41, 42, 43]
    free = tokens(llm, [prompt], greedy(8))[0]
    stop_ids = sorted({free[0], free[2]})
    hf = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    for min_tokens in (0, 3, 5):
        params = SamplingParams(max_tokens=8, temperature=0.0, min_tokens=min_tokens, stop_token_ids=stop_ids)
        [ours] = tokens(llm, [prompt], params)
        with torch.inference_mode():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, min_new_tokens=min_tokens,
                              eos_token_id=stop_ids + [2], pad_token_id=0)[0, len(prompt):].tolist()
        assert ours == ref, (min_tokens, ours, ref)
        assert not set(ours[:min_tokens]) & set(stop_ids + [2])
    assert tokens(llm, [prompt], SamplingParams(max_tokens=8, temperature=0.0, stop_token_ids=stop_ids))[0] == \
        free[:1], "without min_tokens the first (stop) token ends it"
