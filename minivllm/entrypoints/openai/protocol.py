"""Request and response shapes of the OpenAI API subset we serve (vLLM: entrypoints/openai/protocol.py).

Requests are pydantic models, so FastAPI rejects wrong types before any handler runs; the handler then
turns them into SamplingParams, whose own checks give the value errors. Extras beyond OpenAI (top_k,
min_p, ignore_eos, ...) are plain fields, as in vLLM; the openai client sends them via extra_body.
"""
from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, ClassVar, Literal

import msgspec
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails

from minivllm.exceptions import VLLMValidationError
from minivllm.sampling_params import RepetitionDetectionParams, SamplingParams, StructuredOutputsParams


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


class RepetitionDetection(BaseModel):
    """vLLM's RepetitionDetectionParams as a request field (a dataclass there; its __post_init__ checks are
    SamplingRequest.check_logprob_fields', a 400 without a param as in vLLM)."""

    max_pattern_size: int = 0
    min_pattern_size: int = 0
    min_count: int = 0


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
    truncation_side: Literal["left", "right"] | None = None  # "right" keeps the first tokens
    logprob_token_ids: list[int] | None = None
    return_tokens_as_token_ids: bool | None = None  # logprob tokens as "token_id:N"
    priority: int = Field(0, ge=-(2**63), le=2**63 - 1)
    cache_salt: str | None = None  # checked in check_logprob_fields; the engine's prefix cache is not salted
    logprobs_is_flag: ClassVar[bool] = False  # chat: logprobs is a bool (top_logprobs the count)
    # vLLM fields with nothing behind them in minivllm (no KV/EC connector, no reasoning; thinking_token_budget
    # is refused as vLLM refuses it without a reasoning config): typed as vLLM types them, so a wrong type is
    # the same 400
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    repetition_detection: RepetitionDetection | None = None
    # vLLM fields typed as vLLM types them; beam search (off unless use_beam_search) and vllm_xargs (for
    # custom logits processors, which minivllm has none of) change nothing in minivllm's answer, nor in vLLM's
    use_beam_search: bool = False
    length_penalty: float = 1.0
    spaces_between_special_tokens: bool = True  # a fast tokenizer's decode has no spaces to add
    request_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    vllm_xargs: dict[str, str | int | float | list[str | int | float]] | None = None
    thinking_token_budget: int | None = None
    return_token_offsets: bool | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: dict[str, Any] | None = None  # vLLM's StructuredOutputsParams fields

    @model_validator(mode="before")
    @classmethod
    def check_logprob_fields(cls, data):
        """vLLM's check_logprobs and check_cache_salt_support (before validation): the logprob counts are numbers,
        prompt logprobs cannot stream, and logprob_token_ids needs logprobs (chat: logprobs true; completions:
        logprobs set, and not echo with max_tokens 0); a cache_salt is a non-empty string."""
        if not isinstance(data, dict):
            return data
        for name in ("prompt_logprobs", "top_logprobs" if cls.logprobs_is_flag else "logprobs"):
            if data.get(name) is not None and not isinstance(data[name], (int, float)):
                raise VLLMValidationError(f"`{name}` must be an integer.", name, data[name])
        top = data.get("top_logprobs")
        if cls.logprobs_is_flag and isinstance(top, (int, float)) and top < 0 and top != -1:
            raise VLLMValidationError("`top_logprobs` must be a positive value or -1.", "top_logprobs", top)
        so = data.get("structured_outputs")
        if isinstance(so, dict) and sum(so.get(k) is not None for k in ("json", "regex", "choice")) > 1:
            # vLLM's check_structured_outputs_count names the field for completions, not for chat
            raise VLLMValidationError("You can only use one kind of constraints for structured outputs ('json', "
                                      "'regex' or 'choice').", None if cls.logprobs_is_flag else "structured_outputs")
        budget = data.get("thinking_token_budget")
        if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < -1):
            raise VLLMValidationError("`thinking_token_budget` must be a non-negative integer or -1 for unlimited.",
                                      "thinking_token_budget", budget)
        salt = data.get("cache_salt")
        if salt is not None and (not isinstance(salt, str) or not salt):
            raise VLLMValidationError("Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt")
        rd = data.get("repetition_detection")
        if isinstance(rd, dict) and all(isinstance(v, int) for v in rd.values()) and \
                set(rd) <= set(RepetitionDetection.model_fields):
            RepetitionDetectionParams(**rd)  # vLLM's __post_init__ checks (raised as they are, param-less)
        pl = data.get("prompt_logprobs")
        if isinstance(pl, (int, float)) and not isinstance(pl, bool) and data.get("stream") and (pl > 0 or pl == -1):
            raise VLLMValidationError("`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs")
        if data.get("logprob_token_ids"):
            chat = cls.logprobs_is_flag
            if not chat and data.get("echo") and data.get("max_tokens") == 0:
                raise VLLMValidationError("`logprob_token_ids` is not supported when `echo=True` and `max_tokens=0` "
                                          "because no output tokens are generated.", "logprob_token_ids")
            if (not data.get("logprobs")) if chat else data.get("logprobs") is None:
                raise VLLMValidationError(f"when using `logprob_token_ids`, `logprobs` must be set"
                                          f"{' to true' if chat else ''}.", "logprob_token_ids")
        return data

    def check_stream_options(self) -> None:
        """vLLM's 400 for stream_options on a request that does not stream."""
        if self.stream_options is not None and not self.stream:
            raise VLLMValidationError("Stream options can only be defined when `stream=True`.", "stream_options")

    def structured_outputs_params(self, defaults: dict | None = None) -> StructuredOutputsParams | None:
        """structured_outputs, with response_format's constraint put over it (vLLM's precedence); `defaults`:
        the server's --structured-outputs-config options (disable_any_whitespace) under the request's."""
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
        so = (defaults or {}) | so
        try:
            return msgspec.convert(so, StructuredOutputsParams)
        except msgspec.ValidationError as e:
            message = str(e)
            raise ValueError(message if message.startswith("structured_outputs") else
                             f"structured_outputs: {message}") from None

    def to_sampling_params(self, max_tokens: int | None, logprobs: int | None,
                           prompt_logprobs: int | None = None, so_defaults: dict | None = None) -> SamplingParams:
        kw = dict(n=self.n, max_tokens=max_tokens, seed=self.seed, stop=self.stop, ignore_eos=self.ignore_eos,
                  min_tokens=self.min_tokens, stop_token_ids=self.stop_token_ids, logprobs=logprobs,
                  include_stop_str_in_output=self.include_stop_str_in_output,
                  skip_special_tokens=self.skip_special_tokens, prompt_logprobs=prompt_logprobs,
                  logit_bias=self.logit_bias, allowed_token_ids=self.allowed_token_ids, bad_words=self.bad_words,
                  structured_outputs=self.structured_outputs_params(so_defaults),
                  stream_interval=self.stream_interval,
                  repetition_detection=None if self.repetition_detection is None else
                  RepetitionDetectionParams(**self.repetition_detection.model_dump()))
        for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty"):
            if getattr(self, name) is not None:
                kw[name] = getattr(self, name)
        return SamplingParams.from_optional(**kw)  # vLLM's OpenAI path: logit_bias clamped to [-100, 100]


class CompletionRequest(SamplingRequest):
    # vLLM's order and bounds, so a bad prompt's param names the same element (body.prompt.1)
    prompt: (list[Annotated[int, Field(ge=0)]] | list[list[Annotated[int, Field(ge=0)]]] | str | list[str]
             | None) = None
    prompt_embeds: bytes | list[bytes] | None = None  # refused: minivllm has no --enable-prompt-embeds
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
    # vLLM's parts are an Iterable validated only when the template renders them (a 400 with param null)
    content: str | list | dict | None = None


class FunctionDefinition(OpenAIBaseModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatCompletionToolsParam(OpenAIBaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(OpenAIBaseModel):
    name: str


class ChatCompletionNamedToolChoiceParam(OpenAIBaseModel):
    function: NamedFunction
    type: Literal["function"] = "function"


_TOOL_CHOICE_USAGE = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'


def check_tool_usage(data):
    """vLLM's ChatCompletionRequest.check_tool_usage (before validation, so its params name the field): tools
    without tool_choice mean "auto"; a tool_choice needs tools, and a named one a tool of that name."""
    if not isinstance(data, dict):
        return data
    so = data.get("structured_outputs")
    if isinstance(so, dict) and any(so.get(k) is not None for k in ("json", "regex", "choice")) and \
            data.get("tool_choice", "none") not in ("none", "auto", "required"):
        raise VLLMValidationError("You can only either use constraints for structured outputs or tools, not both.")
    if data.get("tools") == []:
        raise VLLMValidationError("`tools` must not be an empty array. Either provide at least one tool or omit "
                                  "the field entirely.", "tools")
    if "tool_choice" not in data and data.get("tools"):
        data = {**data, "tool_choice": "auto"}
    choice = data.get("tool_choice")
    if choice is None or choice == "none":
        return data
    if data.get("tools") is None:
        raise VLLMValidationError("When using `tool_choice`, `tools` must be set.", "tool_choice")
    if choice not in ("auto", "required") and not isinstance(choice, dict):
        raise VLLMValidationError(f"Invalid value for `tool_choice`: {choice}! Only named tools, \"none\", "
                                  f"\"auto\" or \"required\" are supported.", "tool_choice")
    if isinstance(choice, dict):
        function = choice.get("function")
        if not isinstance(function, dict):
            raise VLLMValidationError(f"Invalid value for `function`: `{function}` in `tool_choice`! "
                                      f"{_TOOL_CHOICE_USAGE}", "tool_choice.function")
        if "name" not in function:
            raise VLLMValidationError(f"Expected field `name` in `function` in `tool_choice`! {_TOOL_CHOICE_USAGE}",
                                      "tool_choice.function.name")
        name = function["name"]
        if not isinstance(name, str) or not name:
            raise VLLMValidationError(f"Invalid `name` in `function`: `{name}` in `tool_choice`! "
                                      f"{_TOOL_CHOICE_USAGE}", "tool_choice.function.name")
        tools = data["tools"] if isinstance(data["tools"], list) else []
        if not any(isinstance(t, dict) and isinstance(t.get("function"), dict) and t["function"].get("name") == name
                   for t in tools):
            raise VLLMValidationError("The tool specified in `tool_choice` does not match any of the specified "
                                      "`tools`", "tool_choice")
    return data


def tool_json_schema(tool_choice, tools: list[ChatCompletionToolsParam]) -> dict | None:
    """The JSON schema a forced tool call must match (vLLM's tool_parsers.utils.get_json_schema_from_tools): a
    named tool's parameters, or for "required" a non-empty array of {name, parameters} over all tools."""
    if isinstance(tool_choice, ChatCompletionNamedToolChoiceParam):
        tool = next(t for t in tools if t.function.name == tool_choice.function.name)
        return tool.function.parameters
    if tool_choice != "required":
        return None
    defs: dict = {}
    branches = []
    for t in tools:
        params = dict(t.function.parameters) if t.function.parameters else {"type": "object", "properties": {}}
        for name, schema in params.pop("$defs", {}).items():
            if defs.setdefault(name, schema) != schema:
                raise ValueError(f"Tool definition '{name}' has multiple schemas, which is not supported.")
        branches.append({"properties": {"name": {"type": "string", "enum": [t.function.name]}, "parameters": params},
                         "required": ["name", "parameters"]})
    schema = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": branches}}
    return schema | {"$defs": defs} if defs else schema


class ChatCompletionRequest(SamplingRequest):
    logprobs_is_flag: ClassVar[bool] = True
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    echo: bool = False
    add_special_tokens: bool = False
    return_prompt_text: bool | None = None
    include_reasoning: bool = True  # no reasoning parser: nothing to include or leave out
    documents: list[dict[str, str]] | None = None  # passed to the chat template, as vLLM does
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    media_io_kwargs: dict[str, dict[str, Any]] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    return_assistant_tokens_mask: bool | None = False
    tools: list[ChatCompletionToolsParam] | None = None
    tool_choice: Literal["none", "auto", "required"] | ChatCompletionNamedToolChoiceParam | None = "none"
    parallel_tool_calls: bool | None = True

    _check_tool_usage = model_validator(mode="before")(classmethod(lambda cls, data: check_tool_usage(data)))

    @property
    def forced_tool(self) -> bool:
        """A named tool_choice or "required": the reply is a tool call, its JSON constrained by the schema."""
        return self.tool_choice == "required" or isinstance(self.tool_choice, ChatCompletionNamedToolChoiceParam)


class BatchChatCompletionRequest(ChatCompletionRequest):
    """vLLM's /v1/chat/completions/batch: `messages` is a list of conversations, answered one choice each;
    no streaming, tools, beam search or n > 1 (vLLM's BatchChatCompletionRequest)."""

    messages: list[Annotated[list[ChatMessage], Field(min_length=1)]] = Field(..., min_length=1)
    tool_choice: Literal["none"] | None = "none"  # vLLM's batch model: no tools, so no other choice
    # vLLM's batch model types these loosely or has them only there; each conversation's ChatCompletionRequest
    # validates what it takes (a bad response_format is that request's 400, without a param)
    response_format: Any | None = None
    length_penalty: float | None = 1.0
    best_of: int | None = None
    early_stopping: bool = False
    guided_decoding_backend: str | None = None
    _check_tool_usage = model_validator(mode="before")(classmethod(lambda cls, data: data))  # nor tool checks

    @model_validator(mode="before")
    @classmethod
    def check_batch_mode(cls, data):
        if isinstance(data, dict):
            if data.get("use_beam_search"):
                raise VLLMValidationError("Beam search is not supported for batch chat completions.",
                                          "use_beam_search")
            if data.get("n", 1) not in (1, None):
                raise VLLMValidationError("n must be 1 for batch chat completions.", "n", data.get("n"))
            # vLLM's batch model has no stream fields: they stay as extras, and each conversation's
            # ChatCompletionRequest validates them (to_chat_completion_request), a 400 without a param
            try:
                TypeAdapter(bool | None).validate_python(data.get("stream"))
            except ValidationError as e:
                raise VLLMValidationError(str(e)) from None
            data = {k: v for k, v in data.items() if k not in ("stream", "stream_options", "tools")}
        return data

    def conversations(self) -> list[ChatCompletionRequest]:
        """One chat request per conversation, every other field shared."""
        fields = self.model_dump(exclude={"messages"}, exclude_unset=True, exclude_none=True, by_alias=True)
        return [ChatCompletionRequest.model_validate(fields | {"messages": [m.model_dump() for m in conv]})
                for conv in self.messages]


class TokenizeRequest(OpenAIBaseModel):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None  # vLLM's defaults: True for a prompt, False for messages
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool | None = False
    # vLLM's TokenizeChatRequest fields with nothing behind them here (a request template is refused; no
    # multimodal inputs; the shipped template renders no tools), typed as vLLM types them
    chat_template: str | None = None
    media_io_kwargs: dict[str, dict[str, Any]] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    tools: list[ChatCompletionToolsParam] | None = None

    @model_validator(mode="wrap")
    @classmethod
    def _as_vllm_union(cls, data, handler):
        """vLLM's body is TokenizeCompletionRequest | TokenizeChatRequest: a chat request that fails validation
        reports the first branch's first error, its missing prompt (param body.prompt)."""
        try:
            return handler(data)
        except ValidationError:
            if isinstance(data, dict) and "prompt" not in data:
                raise ValidationError.from_exception_data(cls.__name__, [InitErrorDetails(
                    type="missing", loc=("prompt",), input=data)]) from None
            raise


class DetokenizeRequest(OpenAIBaseModel):
    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0, le=2**63 - 1)]]


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())
