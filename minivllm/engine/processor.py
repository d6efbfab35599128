"""InputProcessor (vLLM: v1/engine/processor.py, later input_processor.py): prompt + params -> a validated
EngineCoreRequest.

Runs in the frontend, so a bad request fails there with a ValueError and never reaches the core.
"""
from __future__ import annotations

import time

import msgspec

from minivllm.config import VllmConfig
from minivllm.engine import EngineCoreRequest
from minivllm.sampling_params import SamplingParams
from minivllm.structured_output.backend_xgrammar import validate_xgrammar_grammar

PromptType = str | list[int] | dict


class InputProcessor:
    """Tokenizes and validates requests against the model (vocab, max_model_len)."""

    def __init__(self, vllm_config: VllmConfig, tokenizer) -> None:
        self.max_model_len = vllm_config.scheduler_config.max_model_len
        self.speculative = vllm_config.speculative_config is not None
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)

    def tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            if "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            return None, list(prompt)
        raise ValueError(f"a prompt must be a string, a list of token ids or a dict, got {type(prompt).__name__}")

    def process_inputs(self, request_id: str, prompt: PromptType, params: SamplingParams,
                       arrival_time: float | None = None) -> tuple[str | None, EngineCoreRequest]:
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling params must be SamplingParams, got {type(params).__name__}")
        text, token_ids = self.tokenize(prompt)
        if not token_ids:
            raise ValueError("the prompt is empty (0 tokens)")
        if len(token_ids) > self.max_model_len:
            raise ValueError(f"the prompt is {len(token_ids)} tokens long, longer than max_model_len "
                             f"({self.max_model_len})")
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is out of vocabulary (size {self.vocab_size})")
        bad = [t for t in params.stop_token_ids or () if t >= self.vocab_size]
        if bad:
            raise ValueError(f"stop_token_ids: token id {bad[0]} is out of vocabulary (size {self.vocab_size})")
        if params.logprobs is not None and params.logprobs > min(20, self.vocab_size):
            raise ValueError(f"logprobs must be at most {min(20, self.vocab_size)}, got {params.logprobs}")
        if params.structured_outputs is not None:
            if self.speculative:
                raise ValueError("structured_outputs: not supported together with speculative_config in "
                                 "minivllm yet (drafts are not checked against the grammar)")
            validate_xgrammar_grammar(params)  # a schema / regex / grammar that cannot build fails here
        if params.max_tokens is None:
            # Unbounded: up to the context limit (at least one token; a full-length prompt stops at once).
            params = msgspec.structs.replace(params, max_tokens=max(1, self.max_model_len - len(token_ids)))
        return text, EngineCoreRequest(request_id, token_ids, params, self.tokenizer.eos_token_id,
                                       arrival_time or time.time())


Processor = InputProcessor  # the older vLLM name
