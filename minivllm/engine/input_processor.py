"""InputProcessor (vLLM: v1/engine/input_processor.py): prompt + params -> a validated
EngineCoreRequest.

Runs in the frontend, so a bad request fails there with a VLLMValidationError (a ValueError) and never
reaches the core. The rules are vLLM's: a prompt must leave room for one output token (length at most
max_model_len - 1), and a text longer than max_model_len * (longest token in characters) is rejected
before it is tokenized, so a huge prompt costs no tokenizer time. Token ids are checked against the
model's embedding size (vLLM accepts ids up to max(tokenizer, model) vocab; an id past the embedding
would fail inside a step, so we reject it here).
"""
from __future__ import annotations

import time

import msgspec

from minivllm.config import VllmConfig
from minivllm.engine import EngineCoreRequest
from minivllm.exceptions import VLLMValidationError
from minivllm.sampling_params import SamplingParams
from minivllm.structured_output.backend_xgrammar import validate_xgrammar_grammar

PromptType = str | list[int] | dict


def _model_vocab_size(vllm_config: VllmConfig) -> int | None:
    try:
        from minivllm.model_executor.model_loader import load_hf_config, resolve_model_path
        return getattr(load_hf_config(resolve_model_path(vllm_config.model_config.model)), "vocab_size", None)
    except Exception:  # an unreadable config fails later, at model load, with a clearer message
        return None


class InputProcessor:
    """Tokenizes and validates requests against the model (vocab, max_model_len)."""

    def __init__(self, vllm_config: VllmConfig, tokenizer) -> None:
        self.max_model_len = vllm_config.scheduler_config.max_model_len
        self.structured_outputs_config = vllm_config.structured_outputs_config
        self.speculative_config = vllm_config.speculative_config
        self.tokenizer = tokenizer
        self.vocab_size = _model_vocab_size(vllm_config) or len(tokenizer)
        self.max_chars_per_token = max((len(t) for t in tokenizer.get_vocab()), default=1)

    def check_text_len(self, text: str, max_input_tokens: int | None = None) -> None:
        """vLLM's character pre-check: a text this long cannot fit in max_input_tokens, whatever its tokens."""
        max_input_tokens = self.max_model_len - 1 if max_input_tokens is None else max_input_tokens
        max_chars = max_input_tokens * self.max_chars_per_token
        if len(text) > max_chars:
            raise VLLMValidationError(
                f"This model's maximum context length is {self.max_model_len} tokens. Your prompt contains "
                f"{len(text)} characters (more than {max_chars} characters, which is the upper bound for "
                f"{max_input_tokens} input tokens). Please reduce the length of the input prompt.",
                "prompt", len(text))

    def tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            if "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise VLLMValidationError("a prompt dict needs 'prompt' or 'prompt_token_ids'", "prompt")
        if isinstance(prompt, str):
            self.check_text_len(prompt)
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return None, list(prompt)
        raise VLLMValidationError(f"a prompt must be a string, a list of token ids or a dict, got "
                                  f"{type(prompt).__name__}", "prompt")

    def check_prompt_len(self, num_tokens: int) -> None:
        """vLLM's _validate_prompt_len: not empty, and room for at least one output token."""
        if num_tokens == 0:
            raise VLLMValidationError("The decoder prompt cannot be empty", "prompt")
        if num_tokens > self.max_model_len:
            raise VLLMValidationError(f"The decoder prompt (length {num_tokens}) is longer than the maximum model "
                                      f"length of {self.max_model_len}. Make sure that `max_model_len` is no smaller "
                                      f"than the number of text tokens.", "prompt", num_tokens)
        if num_tokens == self.max_model_len:
            raise VLLMValidationError(f"The decoder prompt (length {num_tokens}) plus the number of requested "
                                      f"output tokens (at least 1) is longer than the maximum model length of "
                                      f"{self.max_model_len}. Make sure that `max_model_len` is no smaller than the number of "
                                      f"text tokens (prompt + requested output tokens).", "prompt", num_tokens)

    def process_inputs(self, request_id: str, prompt: PromptType, params: SamplingParams,
                       arrival_time: float | None = None) -> tuple[str | None, EngineCoreRequest]:
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling params must be SamplingParams, got {type(params).__name__}")
        if params.n > 1:
            raise VLLMValidationError(f"n={params.n}: one engine request samples once; fan it out into n requests "
                                      f"with ParentRequest (LLM.generate and the OpenAI server do)", "n")
        text, token_ids = self.tokenize(prompt)
        self.check_prompt_len(len(token_ids))
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise VLLMValidationError(f"Token id {bad[0]} is out of vocabulary (size {self.vocab_size})")
        bad = [t for t in params.stop_token_ids or () if t >= self.vocab_size]
        if bad:
            raise VLLMValidationError(f"stop_token_ids: token id {bad[0]} is out of vocabulary (size "
                                      f"{self.vocab_size})", "stop_token_ids")
        bad = [t for t in params.logit_bias or () if not 0 <= t < self.vocab_size]
        if bad:
            raise VLLMValidationError(f"token_id(s) {bad} in logit_bias contain out-of-vocab token ids. Vocabulary "
                                      f"size: {self.vocab_size}", "logit_bias")
        if any(not 0 <= t < len(self.tokenizer) for t in params.allowed_token_ids or ()):
            raise VLLMValidationError("allowed_token_ids contains out-of-vocab token id!", "allowed_token_ids")
        if params.logprobs is not None and params.logprobs > min(20, self.vocab_size):
            raise VLLMValidationError(f"logprobs must be at most {min(20, self.vocab_size)}, got {params.logprobs}",
                                      "logprobs")
        if self.speculative_config is not None and (params.min_p > 1e-5 or params.logit_bias):
            # vLLM's _validate_spec_decode: its rejection sampler applies neither to the draft positions
            raise VLLMValidationError("The min_p and logit_bias sampling parameters are not yet supported with "
                                      "speculative decoding.")
        if params.structured_outputs is not None:
            # a schema / regex / grammar that cannot build, or past the configured size / depth, fails here
            validate_xgrammar_grammar(params, self.structured_outputs_config)
        # Output never passes max_model_len (check_stop ends it there), so a bigger max_tokens is capped to
        # the room left: the same result, and no integer too big for the core's int64 fields.
        room = self.max_model_len - len(token_ids)
        changes = {}
        if params.max_tokens is None or params.max_tokens > room:
            changes["max_tokens"] = room
        if params.min_tokens > room:
            changes["min_tokens"] = room
        if params.top_k >= self.vocab_size:  # vLLM's InputBatch: top_k >= vocab means no top-k
            changes["top_k"] = 0
        if changes or params.bad_words:
            params = msgspec.structs.replace(params, **changes)  # a copy: the caller's params stay as given
            params.update_from_tokenizer(self.tokenizer)
        return text, EngineCoreRequest(request_id, token_ids, params, self.tokenizer.eos_token_id,
                                       arrival_time or time.time())

