"""SamplingParams: how one request is decoded (vLLM: vllm/sampling_params.py).

A msgspec Struct so it crosses the frontend -> EngineCore boundary as-is; __post_init__ validates
every field, so a bad value fails where the user wrote it, with a message that starts with the field's
name (the server turns it into a 400 whose `param` is that name). Ranges are vLLM's; an integer the
engine's int64 tensors cannot hold is rejected here, and top_k beyond the vocabulary is switched off by
the InputProcessor (which knows the vocabulary), as vLLM's InputBatch does.
"""
from __future__ import annotations

import math

import msgspec

from minivllm.exceptions import VLLMValidationError

_GREEDY_EPS = 1e-5
MAX_N_SEQUENCES = 16384  # vLLM's VLLM_MAX_N_SEQUENCES default
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class StructuredOutputsParams(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    """Exactly one constraint for constrained decoding (vLLM's StructuredOutputsParams, same fields).

    Checked here for shape only; whether a schema, regex or grammar compiles is checked by the
    frontend (InputProcessor -> validate_structured_output), so a bad one is a 400 before the engine.
    """

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None

    def __post_init__(self) -> None:
        count = sum(getattr(self, name) is not None for name in _CONSTRAINTS)
        if count != 1:
            given = [name for name in _CONSTRAINTS if getattr(self, name) is not None]
            raise ValueError("structured_outputs needs exactly one kind of constraint (one of "
                             f"{', '.join(_CONSTRAINTS)}), got {given or 'none'}")

    def all_constraints_none(self) -> bool:
        return all(getattr(self, name) is None for name in _CONSTRAINTS)


_CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


class RepetitionDetectionParams(msgspec.Struct, forbid_unknown_fields=True):
    """Ends a request whose output's tail repeats an N-gram min_count times (vLLM's RepetitionDetectionParams,
    vllm/sampling_params.py:146-179; core/sched/utils.py check_stop checks it). max_pattern_size 0 switches it off."""

    max_pattern_size: int = 0
    min_pattern_size: int = 0
    min_count: int = 0

    def __post_init__(self) -> None:
        if self.max_pattern_size < 0 or self.min_pattern_size < 0 or self.min_pattern_size > self.max_pattern_size:
            raise VLLMValidationError("max_pattern_size, min_pattern_size must be >=0, with min_pattern_size <= "
                                      "max_pattern_size. Set both to 0 to disable repetitive pattern detection.")
        if self.max_pattern_size > 0 and self.min_count < 2:
            raise VLLMValidationError("min_count must be >= 2 to detect repetitive patterns in engine output. If you "
                                      "do not wish to detect repetitive patterns, set max_pattern_size to 0.")

    def repeats(self, token_ids: list[int]) -> bool:
        """vLLM's check_sequence_repetition (v1/core/sched/utils.py:28-60): for each pattern length from the
        smallest, do the last min_count blocks of that length all equal the last one?"""
        lo = max(self.min_pattern_size, 1)
        if self.max_pattern_size <= 0 or self.min_count < 2 or lo > self.max_pattern_size:
            return False
        for size in range(lo, self.max_pattern_size + 1):
            if size * self.min_count > len(token_ids):
                return False
            tail = token_ids[-size:]
            if all(token_ids[-size * (m + 1):len(token_ids) - size * m] == tail for m in range(1, self.min_count)):
                return True
        return False


def _is_int_key(key) -> bool:
    try:
        int(key)
    except (TypeError, ValueError):
        return False
    return not isinstance(key, bool)


class SamplingParams(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    """Decoding parameters; temperature 0 means greedy."""

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] | None = None     # token id -> added to its logit (from_optional clamps to ±100)
    allowed_token_ids: list[int] | None = None     # only these tokens may be sampled
    structured_outputs: StructuredOutputsParams | None = None
    bad_words: list[str] | None = None             # words never to complete (each with and without a leading space)
    # Set by the InputProcessor from the tokenizer (update_from_tokenizer); vLLM keeps it in _bad_words_token_ids
    # behind this property name. A field here, so it crosses to the EngineCore with the rest.
    bad_words_token_ids: list[list[int]] | None = None
    repetition_detection: RepetitionDetectionParams | None = None
    stream_interval: int | None = None  # a stream's tokens per chunk (vLLM's; first and last chunks go at once)

    @staticmethod
    def from_optional(**kwargs) -> SamplingParams:
        """vLLM's SamplingParams.from_optional (the OpenAI server's path): a None n, penalty, temperature or
        top_p means its default, and logit_bias keys become ints with each bias clamped to [-100, 100]. A
        SamplingParams built directly (LLM.generate) keeps its biases as given, as in vLLM."""
        defaults = {"n": 1, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
                    "temperature": 1.0, "top_p": 1.0}
        kw = {k: (defaults[k] if v is None and k in defaults else v) for k, v in kwargs.items()}
        if kw.get("logit_bias"):
            bad = [k for k in kw["logit_bias"] if not _is_int_key(k)]
            if bad:
                raise VLLMValidationError(f"logit_bias contains key(s) that cannot be converted to integer token "
                                          f"IDs: {bad!r}", "logit_bias")
            kw["logit_bias"] = {int(k): min(100.0, max(-100.0, v)) for k, v in kw["logit_bias"].items()}
        return SamplingParams(**kw)

    def update_from_tokenizer(self, tokenizer) -> None:
        """vLLM's update_from_tokenizer: each bad word's token ids as written (leading spaces stripped), and with
        one leading space when that gives a different first token and as many tokens (the word inside a text)."""
        if not self.bad_words:
            return
        ids: list[list[int]] = []
        for word in self.bad_words:
            plain = tokenizer.encode(word.lstrip(), add_special_tokens=False)
            ids.append(plain)
            spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
            if spaced[0] != plain[0] and len(spaced) == len(plain):
                ids.append(spaced)
        max_token_id = max(tokenizer.get_vocab().values())
        invalid = [t for word_ids in ids for t in word_ids if t < 0 or t > max_token_id]
        if invalid:
            raise VLLMValidationError(f"The model vocabulary size is {max_token_id + 1}, but the following tokens "
                                      f"were specified as bad: {invalid}. All token id values should be integers "
                                      f"satisfying: 0 <= token_id <= {max_token_id}.", "bad_words")
        self.bad_words_token_ids = ids

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.logit_bias:  # OpenAI sends the token ids as JSON object keys (strings)
            bad = [k for k in self.logit_bias if not _is_int_key(k)]
            if bad:
                raise VLLMValidationError(f"logit_bias contains key(s) that cannot be converted to integer token "
                                          f"IDs: {bad!r}", "logit_bias")
            self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
        if self.allowed_token_ids is not None and len(self.allowed_token_ids) == 0:
            raise VLLMValidationError("allowed_token_ids is not None and empty!", "allowed_token_ids")
        for name in ("n", "max_tokens", "top_k", "seed", "min_tokens", "logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise VLLMValidationError(f"{name} must be an integer, got {value!r}", name)
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise VLLMValidationError(f"{name} must be a finite number, got {value!r}", name)
        # vLLM's _verify_args names no parameter for n, the penalties, top_k, min_p and min_tokens.
        if self.n < 1:
            raise VLLMValidationError(f"n must be at least 1, got {self.n}.")
        if self.n > MAX_N_SEQUENCES:
            raise VLLMValidationError(f"n must be at most {MAX_N_SEQUENCES}, got {self.n}.")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise VLLMValidationError(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}.")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise VLLMValidationError(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}.")
        if self.repetition_penalty <= 0.0:
            raise VLLMValidationError(f"repetition_penalty must be greater than zero, got {self.repetition_penalty}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise VLLMValidationError(f"max_tokens must be at least 1, got {self.max_tokens}", "max_tokens")
        if self.temperature < 0.0:
            raise VLLMValidationError(f"temperature must be non-negative, got {self.temperature}", "temperature")
        if self.temperature > 2.0:
            raise VLLMValidationError(f"temperature must be in [0, 2], got {self.temperature}", "temperature")
        if not 0.0 < self.top_p <= 1.0:
            raise VLLMValidationError(f"top_p must be in (0, 1], got {self.top_p}", "top_p")
        if self.top_k < -1:
            raise VLLMValidationError(f"top_k must be 0 (disable), or at least 1, got {self.top_k}.")
        if self.top_k == -1:
            self.top_k = 0
        if not 0.0 <= self.min_p <= 1.0:
            raise VLLMValidationError(f"min_p must be in [0, 1], got {self.min_p}.")
        if self.seed == -1:
            self.seed = None
        if self.seed is not None and not _INT64_MIN <= self.seed <= _INT64_MAX:
            raise VLLMValidationError(f"seed must be a 64-bit signed integer, got {self.seed}", "seed")
        if self.min_tokens < 0:
            raise VLLMValidationError(f"min_tokens must be greater than or equal to 0, got {self.min_tokens}.")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise VLLMValidationError(f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, "
                                      f"got {self.min_tokens}.")
        if self.logprobs is not None and self.logprobs < 0:
            raise VLLMValidationError(f"logprobs must be non-negative, got {self.logprobs}", "logprobs")
        if self.prompt_logprobs is not None and self.prompt_logprobs < 0:
            raise VLLMValidationError(f"prompt_logprobs must be non-negative, got {self.prompt_logprobs}",
                                      "prompt_logprobs")
        if self.greedy:  # vLLM: greedy ignores top-p/top-k/min-p, so they are reset (and checks see them off)
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
        if self.n > 1 and self.greedy:
            raise VLLMValidationError(f"n must be 1 when using greedy sampling, got {self.n}.")
        if self.stop is not None and any((not isinstance(s, str)) or s == "" for s in self.stop):
            raise VLLMValidationError("stop must be a list of non-empty strings", "stop")
        if self.bad_words is not None and any(not isinstance(w, str) or not w for w in self.bad_words):
            raise VLLMValidationError(f"bad_words cannot contain an empty string. Got bad_words={self.bad_words}")
        if self.stream_interval is not None and self.stream_interval < 1:
            raise VLLMValidationError(f"stream_interval must be at least 1, got {self.stream_interval}.",
                                      "stream_interval")
        if self.stop_token_ids is not None and any(isinstance(t, bool) or not isinstance(t, int)
                                                   or not 0 <= t <= _INT64_MAX for t in self.stop_token_ids):
            raise VLLMValidationError("stop_token_ids must be a list of non-negative integers", "stop_token_ids")

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    @property
    def all_stop_token_ids(self) -> frozenset[int]:
        return frozenset(self.stop_token_ids or ())
