"""Request and response shapes of the OpenAI API subset we serve (vLLM: entrypoints/openai/protocol.py).

Requests are pydantic models, so FastAPI rejects wrong types before any handler runs; the handler then
turns them into SamplingParams, whose own checks give the value errors. Extras beyond OpenAI (top_k,
min_p, ignore_eos, ...) are plain fields, as in vLLM; the openai client sends them via extra_body.
"""
from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

import msgspec
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from minivllm.exceptions import VLLMValidationError
from minivllm.sampling_params import SamplingParams, StructuredOutputsParams


def _check_unicode(value) -> None:
    if isinstance(value, str):
        value.encode("utf-8")  # UnicodeEncodeError on a lone surrogate such as "\ud800"
    elif isinstance(value, (list, tuple)):
        for v in value:
            _check_unicode(v)
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_unicode(k)
            _check_unicode(v)


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="ignore")  # unknown fields are ignored, as vLLM does

    @field_validator("*")
    @classmethod
    def _valid_unicode(cls, value):
        """JSON may escape a lone surrogate ("\\ud800"), which no tokenizer or UTF-8 response can carry: a 400."""
        try:
            _check_unicode(value)
        except UnicodeEncodeError:
            raise ValueError("text is not valid Unicode (it contains a lone surrogate)") from None
        return value


class ErrorInfo(OpenAIBaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(OpenAIBaseModel):
    error: ErrorInfo


class StreamOptions(OpenAIBaseModel):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False  # usage on every chunk (vLLM's extension)


class JsonSchemaResponseFormat(OpenAIBaseModel):
    name: str
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")  # `schema` clashes with pydantic
    strict: bool | None = None


class ResponseFormat(OpenAIBaseModel):
    """OpenAI's response_format; json_object / json_schema become structured_outputs (as in vLLM)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaResponseFormat | None = None


class SamplingRequest(OpenAIBaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    user: str | None = None
    # extras (vLLM's sampling params)
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    prompt_logprobs: int | None = None
    logit_bias: dict[str, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    return_token_ids: bool | None = None
    stream_interval: Annotated[int, Field(ge=1)] | None = None
    truncate_prompt_tokens: Annotated[int, Field(ge=-1)] | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: dict[str, Any] | None = None  # vLLM's StructuredOutputsParams fields

    def check_stream_options(self) -> None:
        """vLLM's 400 for stream_options on a request that does not stream."""
        if self.stream_options is not None and not self.stream:
            raise VLLMValidationError("Stream options can only be defined when `stream=True`.", "stream_options")

    def structured_outputs_params(self) -> StructuredOutputsParams | None:
        """structured_outputs, with response_format's constraint put over it (vLLM's precedence)."""
        so = dict(self.structured_outputs or {})
        rf = self.response_format
        if rf is not None and rf.type == "json_object":
            so["json_object"] = True
        elif rf is not None and rf.type == "json_schema":
            if rf.json_schema is None or rf.json_schema.json_schema is None:
                raise VLLMValidationError("response_format: type json_schema needs json_schema.schema",
                                          "response_format")
            so["json"] = rf.json_schema.json_schema
        if self.structured_outputs is not None and not so:
            raise ValueError("structured_outputs needs exactly one kind of constraint, got none")
        if not so:
            return None
        try:
            return msgspec.convert(so, StructuredOutputsParams)
        except msgspec.ValidationError as e:
            message = str(e)
            raise ValueError(message if message.startswith("structured_outputs") else
                             f"structured_outputs: {message}") from None

    def to_sampling_params(self, max_tokens: int | None, logprobs: int | None,
                           prompt_logprobs: int | None = None) -> SamplingParams:
        kw = dict(n=self.n, max_tokens=max_tokens, seed=self.seed, stop=self.stop, ignore_eos=self.ignore_eos,
                  min_tokens=self.min_tokens, stop_token_ids=self.stop_token_ids, logprobs=logprobs,
                  include_stop_str_in_output=self.include_stop_str_in_output,
                  skip_special_tokens=self.skip_special_tokens, prompt_logprobs=prompt_logprobs,
                  logit_bias=self.logit_bias, allowed_token_ids=self.allowed_token_ids, bad_words=self.bad_words,
                  structured_outputs=self.structured_outputs_params())
        for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty"):
            if getattr(self, name) is not None:
                kw[name] = getattr(self, name)
        return SamplingParams.from_optional(**kw)  # vLLM's OpenAI path: logit_bias clamped to [-100, 100]


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]] | None = None
    prompt_embeds: Any = None  # refused: minivllm has no --enable-prompt-embeds
    add_special_tokens: bool = True
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool | None = False
    suffix: str | None = None

    @model_validator(mode="before")
    @classmethod
    def normalize_null_max_tokens(cls, data):
        """`"max_tokens": null` is the default (16), as in vLLM's CompletionRequest."""
        if isinstance(data, dict) and data.get("max_tokens") is None:
            data = {**data, "max_tokens": cls.model_fields["max_tokens"].default}
        return data


class ChatMessage(OpenAIBaseModel):
    role: str  # any role the chat template knows (vLLM passes custom roles through)
    content: str | list[dict] | None = None


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    echo: bool = False
    add_special_tokens: bool = False
    return_prompt_text: bool | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = "none"


class TokenizeRequest(OpenAIBaseModel):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool | None = False


class DetokenizeRequest(OpenAIBaseModel):
    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0)]]


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())
