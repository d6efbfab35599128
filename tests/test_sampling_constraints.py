"""bad_words, the logit_bias clamp and the speculation refusals as the pinned vLLM has them (issue #54); the end-to-end
comparison with vLLM itself is the generate comparison (test_vllm_oracle.py)."""
from __future__ import annotations

import pytest
import torch

from minivllm.exceptions import VLLMValidationError
from minivllm.sample.metadata import SamplingMetadata
from minivllm.sample.sampler import Sampler
from minivllm.sampling_params import SamplingParams

SHIPPED = "data/models/shakespeare-llama"


def greedy_metadata(n: int, **kw) -> SamplingMetadata:
    return SamplingMetadata(temperature=None, all_greedy=True, all_random=False, top_p=None, top_k=None, min_p=None,
                            generators={}, max_num_logprobs=None, **kw)


def reference_bad_words(logits: torch.Tensor, words: list[list[int]], past: list[int]) -> torch.Tensor:
    """The rule spelled out: ban a word's last token where the output so far ends with the rest of the word."""
    out = logits.clone()
    for w in words:
        if len(past) >= len(w) - 1 and past[len(past) - (len(w) - 1):] == w[:-1]:
            out[w[-1]] = float("-inf")
    return out


def test_bad_words_mask_the_last_token_of_a_word_whose_prefix_was_generated():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 50, generator=g)
    words = [[7], [3, 9], [4, 5, 6], [1, 2, 3, 4, 5, 6, 7, 8]]
    pasts = [[1, 2], [8, 3], [0, 4, 5]]
    md = greedy_metadata(3, bad_words={i: (words, p) for i, p in enumerate(pasts)})
    from minivllm.sample.sampler import apply_logits_processors
    got = apply_logits_processors(logits, md)
    for i, past in enumerate(pasts):
        assert torch.equal(got[i], reference_bad_words(logits[i], words, past))
    assert got[0, 7] == got[1, 9] == got[2, 6] == float("-inf") and got[0, 9] == logits[0, 9]
    # The Sampler picks the best token the words leave.
    logits[:, 7] = 50.0
    assert Sampler()(logits, md).sampled_token_ids.tolist() == got.masked_fill(
        torch.arange(50) == 7, float("-inf")).argmax(-1).tolist()


def test_bad_words_tokenized_as_vllm_does():
    """vLLM's update_from_tokenizer: the word as written, and with a leading space when that is another token
    sequence of the same length (" Romeo" is one token, "Romeo" three: only the three)."""
    from minivllm.tokenizer import get_tokenizer

    sp = SamplingParams(bad_words=["the", "Romeo", " thou"])
    sp.update_from_tokenizer(get_tokenizer(SHIPPED))
    assert sp.bad_words_token_ids == [[678], [271], [53, 364, 82], [3463], [356]]
    with pytest.raises(VLLMValidationError, match="bad_words cannot contain an empty string"):
        SamplingParams(bad_words=["ok", ""])


def test_logit_bias_is_clamped_on_the_openai_path_only():
    from minivllm.entrypoints.openai.protocol import CompletionRequest

    assert SamplingParams(logit_bias={5: 150.0, 6: -250}).logit_bias == {5: 150.0, 6: -250.0}
    assert SamplingParams.from_optional(logit_bias={"5": 150.0, "6": -250}, temperature=None).logit_bias == \
        {5: 100.0, 6: -100.0}
    req = CompletionRequest(prompt="x", logit_bias={"5": 150.0}, bad_words=["the"])
    sp = req.to_sampling_params(16, None)
    assert sp.logit_bias == {5: 100.0} and sp.bad_words == ["the"] and sp.temperature == 1.0
    with pytest.raises(VLLMValidationError, match="cannot be converted to integer"):
        SamplingParams.from_optional(logit_bias={"x": 1.0})


def test_speculation_refuses_min_p_and_logit_bias_with_vllms_400():
    """vLLM's _validate_spec_decode, offline (VLLMValidationError) and on the server (400 BadRequestError, no
    param); bad_words and the penalties run."""
    from fastapi.testclient import TestClient

    from minivllm.config import EngineArgs
    from minivllm.entrypoints.openai.api_server import build_app

    spec = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    app = build_app(EngineArgs(model=SHIPPED, device="cpu", attention_backend="torch", max_model_len=256,
                               speculative_config=spec), "m")
    message = "The min_p and logit_bias sampling parameters are not yet supported with speculative decoding."
    with TestClient(app) as client:
        for extra in ({"min_p": 0.1}, {"logit_bias": {"5": 1.0}}):
            r = client.post("/v1/completions", json={"prompt": "ROMEO:", "max_tokens": 4, **extra})
            assert r.status_code == 400
            assert r.json()["error"] == {"message": message, "type": "BadRequestError", "param": None, "code": 400}
        r = client.post("/v1/completions", json={"prompt": "ROMEO:", "max_tokens": 4, "temperature": 0,
                                                 "bad_words": ["the"], "repetition_penalty": 1.2})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        # greedy: min_p is reset before the check, as in vLLM's SamplingParams.__post_init__
        r = client.post("/v1/completions", json={"prompt": "ROMEO:", "max_tokens": 4, "temperature": 0,
                                                 "min_p": 0.1})
        assert r.status_code == 200, r.json()


def test_greedy_params_reset_top_p_top_k_min_p_as_vllm():
    """vLLM's SamplingParams.__post_init__: a zero temperature means greedy, whose filters are switched off."""
    from minivllm.sampling_params import SamplingParams

    p = SamplingParams(temperature=0.0, top_p=0.5, top_k=5, min_p=0.2)
    assert (p.top_p, p.top_k, p.min_p) == (1.0, 0, 0.0)
    q = SamplingParams(temperature=0.7, top_p=0.5, top_k=5, min_p=0.2)
    assert (q.top_p, q.top_k, q.min_p) == (0.5, 5, 0.2)
