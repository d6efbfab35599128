"""End to end: the Triton backend (CPU interpreter here, CUDA where present) generates the same greedy
tokens as the torch reference backend, through chunked prefill, decode and prefix-cache hits."""
from __future__ import annotations

import os

import pytest
from tiny_models import make_tiny_model

from minivllm.entrypoints.llm import LLM
from minivllm.sampling_params import SamplingParams


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not __import__("torch").cuda.is_available(),
                    reason="Triton needs CUDA or TRITON_INTERPRET=1")
def test_triton_backend_equals_torch_backend(tmp_path):
    path = make_tiny_model("llama", tmp_path / "m", num_hidden_layers=1)
    prefix = list(range(11, 27))
    prompts = [prefix + [27, 28, 29], [31, 32, 33]]
    second = [prefix + [40, 41]]  # a later request: hits the first prompt's cached block
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    common = dict(multiprocess=False, max_num_batched_tokens=16, long_prefill_token_threshold=12,
                  max_model_len=64, max_num_seqs=4)
    torch_llm = LLM(path, attention_backend="torch", **common)
    ref = [torch_llm.generate(p, params, use_tqdm=False) for p in (prompts, second)]
    llm = LLM(path, attention_backend="triton", **common)
    assert llm.llm_engine.engine_core.model_executor.driver_worker.model_runner.attn_backend.name == "TRITON"
    out = [llm.generate(p, params, use_tqdm=False) for p in (prompts, second)]
    tokens = [[o.outputs[0].token_ids for o in batch] for batch in out]
    assert tokens == [[o.outputs[0].token_ids for o in batch] for batch in ref]
    assert llm.llm_engine.get_stats().prefix_cache_hits >= 16
