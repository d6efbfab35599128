"""OpenAI's Responses API, POST /v1/responses, as vLLM serves it for a model without harmony
(vllm/entrypoints/openai/responses/: protocol.py ResponsesRequest and ResponsesResponse, serving.py
OpenAIServingResponses with a SimpleContext, streaming_events.py SimpleStreamingEventProcessor, utils.py).

The input items become chat messages (construct_input_messages), rendered by the chat template with the special
tokens added; `text.format` and `structured_outputs` constrain the output through structured outputs; function
tools go through tool_calls.py exactly as in a chat completion, but only with --enable-auto-tool-choice and a
--tool-call-parser (vLLM builds its response parser only then: without one, tools and tool_choice are echoed and
change nothing). A stream is vLLM's typed SSE events (`event: <type>` + `data: {...}`, numbered by
sequence_number, no `[DONE]`), ending with the full response in response.completed. Nothing is stored (vLLM's
store is off unless VLLM_ENABLE_RESPONSES_API_STORE=1), so background mode and previous_response_id fail.
"""
from __future__ import annotations

import json
import uuid
from types import SimpleNamespace
from typing import Any, Literal

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import ConfigDict, Field, field_validator, model_validator

from minivllm.entrypoints.openai import tool_calls
from minivllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    OpenAIBaseModel,
    SamplingRequest,
    now,
    tool_json_schema,
)
from minivllm.exceptions import VLLMValidationError
from minivllm.sampling_params import SamplingParams

LOGPROBS_INCLUDE = "message.output_text.logprobs"
_ROLES = ("user", "assistant", "system", "developer")
_TEXT_PARTS = ("input_text", "output_text", "refusal")
_MEDIA_PARTS = ("input_image", "input_file", "input_audio")


def _hex_id(prefix: str = "") -> str:
    """vLLM's random_uuid() is 16 hex digits."""
    return prefix + uuid.uuid4().hex[:16]


# ---------------------------------------------------------------------------- the request
class _Model(OpenAIBaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class ResponseFormatText(_Model):
    type: Literal["text"]


class ResponseFormatTextJSONSchemaConfig(_Model):
    name: str
    schema_: dict[str, Any] = Field(alias="schema")
    type: Literal["json_schema"]
    description: str | None = None
    strict: bool | None = None


class ResponseFormatJSONObject(_Model):
    type: Literal["json_object"]


class ResponseTextConfig(_Model):
    """openai's ResponseTextConfig; the union members keep their names, so an error's param names the member
    (body.text.format.ResponseFormatText.type), as vLLM's."""

    format: ResponseFormatText | ResponseFormatTextJSONSchemaConfig | ResponseFormatJSONObject | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class FunctionTool(_Model):
    name: str
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    type: Literal["function"]
    allowed_callers: list[Literal["direct", "programmatic"]] | None = None
    async_: bool | None = Field(default=None, alias="async")
    defer_loading: bool | None = None
    description: str | None = None
    output_schema: dict[str, Any] | None = None


class BuiltinTool(_Model):
    """A hosted tool (web search, code interpreter, MCP, ...): typed, so a bad tool's error names FunctionTool
    first as vLLM's does; refused by the handler (minivllm has no tool server)."""

    model_config = ConfigDict(extra="allow")
    type: Literal["file_search", "web_search", "web_search_2025_08_26", "web_search_preview",
                  "web_search_preview_2025_03_11", "computer_use_preview", "computer", "mcp", "code_interpreter",
                  "image_generation", "local_shell", "shell", "custom", "namespace", "tool_search", "apply_patch"]


class ToolChoiceFunction(_Model):
    name: str
    type: Literal["function"]


class Reasoning(_Model):
    context: Literal["auto", "current_turn", "all_turns"] | None = None
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None
    mode: str | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


def _check_item(item) -> None:
    """The input item kinds vLLM turns into chat messages (ResponseInputItemParam's messages, function calls and
    their outputs); anything else is a 400 naming body.input, as pydantic's union gives in vLLM."""
    if not isinstance(item, dict):
        raise ValueError("an input item must be an object")
    kind = item.get("type", "message")
    if kind == "message":
        content = item.get("content")
        if item.get("role") not in _ROLES:
            raise ValueError(f"a message's role must be one of {', '.join(_ROLES)}")
        if not isinstance(content, str) and not (isinstance(content, list) and all(
                isinstance(p, dict) and p.get("type") in _TEXT_PARTS + _MEDIA_PARTS for p in content)):
            raise ValueError("a message's content must be text or a list of input_text / output_text parts")
    elif kind == "function_call":
        if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
            raise ValueError("a function_call item needs call_id, name and arguments")
    elif kind == "function_call_output":
        if not isinstance(item.get("call_id"), str) or "output" not in item:
            raise ValueError("a function_call_output item needs call_id and output")
    else:
        raise ValueError(f"input items of type {kind!r} are not supported by minivllm (messages, function_call and "
                         f"function_call_output are)")


class ResponsesRequest(OpenAIBaseModel):
    """vLLM's ResponsesRequest (vllm/entrypoints/openai/responses/protocol.py:136-312), its checks
    (validate_background, validate_prompt, check_cache_salt_support, check_tool_usage: 458-637) and
    to_sampling_params (366-446). media_io_kwargs, mm_processor_kwargs (no multimodal model), vllm_xargs
    (no custom logits processors), prompt_cache_key (ignored by vLLM too) and previous_input_messages (harmony
    only in vLLM) are accepted and have no effect, as in vLLM for this model."""

    background: bool | None = False
    include: list[Literal["code_interpreter_call.outputs", "computer_call_output.output.image_url",
                          "file_search_call.results", "message.input_image.image_url", LOGPROBS_INCLUDE,
                          "reasoning.encrypted_content"]] | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    metadata: dict[str, str] | None = None
    model: str | None = None
    logit_bias: dict[str, float] | None = None
    parallel_tool_calls: bool | None = True
    previous_response_id: str | None = None
    prompt: dict[str, Any] | None = None
    reasoning: Reasoning | None = None
    include_reasoning: bool = True
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] = "auto"
    store: bool | None = True
    stream: bool | None = False
    temperature: float | None = None
    text: ResponseTextConfig | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceFunction = "auto"
    tools: list[FunctionTool | BuiltinTool] = Field(default_factory=list)
    top_logprobs: int | None = 0
    top_p: float | None = None
    top_k: int | None = None
    truncation: Literal["auto", "disabled"] | None = "disabled"
    user: str | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    prompt_cache_key: str | None = None
    request_id: str = Field(default_factory=lambda: _hex_id("resp_"))
    media_io_kwargs: dict[str, dict[str, Any]] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    priority: int = Field(0, ge=-(2**63), le=2**63 - 1)
    cache_salt: str | None = None
    enable_response_messages: bool = False
    previous_input_messages: list[dict[str, Any]] | None = None
    structured_outputs: dict[str, Any] | None = None
    repetition_penalty: float | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    stop: str | list[str] | None = []
    ignore_eos: bool = False
    vllm_xargs: dict[str, str | int | float | list[str | int | float]] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("input")
    @classmethod
    def _check_items(cls, value):
        for item in value if isinstance(value, list) else []:
            _check_item(item)
        return value

    @model_validator(mode="before")
    @classmethod
    def _checks(cls, data):
        """vLLM's before-validators, in its order: background needs store, no prompt templates, a non-empty
        cache_salt, and check_tool_usage (without tools, "auto" reads "none"; "required" or a named tool is a 400)."""
        if not isinstance(data, dict):
            return data
        if data.get("background") and not data.get("store", True):
            raise VLLMValidationError("background can only be used when `store` is true", "background")
        if data.get("prompt") is not None:
            raise VLLMValidationError("prompt template is not supported", "prompt")
        salt = data.get("cache_salt")
        if salt is not None and (not isinstance(salt, str) or not salt):
            raise VLLMValidationError("Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt")
        tools, choice = data.get("tools"), data.get("tool_choice", "auto")
        named = isinstance(choice, dict) and choice.get("type") == "function"
        if not tools:
            if choice in ("auto", "none"):
                data = {**data, "tool_choice": "none"}
            elif choice == "required":
                raise VLLMValidationError("Tool choice 'required' must be specified with 'tools' parameter.",
                                          "tool_choice")
            elif named:
                raise VLLMValidationError("Tool choice 'function' not found in 'tools' parameter.", "tool_choice")
        elif named and isinstance(tools, list):
            names = {t.get("name") for t in tools if isinstance(t, dict)}
            if not choice.get("name") or choice.get("name") not in names:
                raise VLLMValidationError("Tool choice 'function' not found in 'tools' parameter.", "tool_choice")
        return data

    @property
    def output_logprobs(self) -> bool:
        return bool(self.include) and LOGPROBS_INCLUDE in self.include

    def chat_view(self) -> ChatCompletionRequest:
        """The function tools and tool_choice as a chat request, for tool_calls.py (calls are read and streamed as
        in a chat completion; vLLM's Responses path does not apply parallel_tool_calls)."""
        choice = self.tool_choice
        if isinstance(choice, ToolChoiceFunction):
            choice = {"type": "function", "function": {"name": choice.name}}
        tools = [{"type": "function", "function": t.model_dump(include={"name", "description", "parameters",
                                                                         "strict"})} for t in self.tools]
        return ChatCompletionRequest.model_validate({"messages": [], "tools": tools or None, "tool_choice": choice})

    def structured_outputs_params(self, defaults: dict):
        """vLLM's extract_structured_outputs: text.format (json_object / json_schema) or structured_outputs, not
        both; the server's --structured-outputs-config options under them."""
        so = self.structured_outputs
        fmt = self.text.format if self.text is not None else None
        if fmt is not None:
            if so is not None:
                raise VLLMValidationError("Cannot specify both structured_outputs and text.format",
                                          "structured_outputs")
            so = {"json_object": True} if fmt.type == "json_object" else \
                {"json": fmt.schema_} if fmt.type == "json_schema" else None
        return SamplingRequest.structured_outputs_params(
            SimpleNamespace(structured_outputs=so, response_format=None), defaults)

    def to_sampling_params(self, max_tokens: int | None, so_defaults: dict) -> SamplingParams:
        """vLLM's ResponsesRequest.to_sampling_params: unset temperature / top_p read 1.0, top_k none; logprobs
        only when the output text's logprobs are included."""
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return SamplingParams.from_optional(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p, top_k=0 if self.top_k is None else self.top_k,
            max_tokens=max_tokens, stop=stop, seed=self.seed, ignore_eos=self.ignore_eos,
            logprobs=self.top_logprobs if self.output_logprobs else None,
            frequency_penalty=self.frequency_penalty or 0.0, presence_penalty=self.presence_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            logit_bias=self.logit_bias, skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            structured_outputs=self.structured_outputs_params(so_defaults))


# ---------------------------------------------------------------------------- input items -> chat messages
def chat_messages(req: ResponsesRequest, model_name: str) -> list[ChatMessage]:
    """vLLM's construct_input_messages and _construct_message_from_response_item (responses/utils.py:161-318):
    the instructions as a system message, a string as one user message; an assistant message keeps its first
    part's text; function calls join the assistant message before them (or start one, without content); a
    function_call_output is a tool message."""
    msgs = [ChatMessage(role="system", content=req.instructions)] if req.instructions else []
    if isinstance(req.input, str):
        return msgs + [ChatMessage(role="user", content=req.input)]
    for item in req.input:
        kind, content = item.get("type", "message"), item.get("content")
        prev = msgs[-1] if msgs and msgs[-1].role == "assistant" else None
        if kind == "function_call":
            if prev is None:
                msgs.append(ChatMessage(role="assistant", content=None))
        elif kind == "function_call_output":
            msgs.append(ChatMessage(role="tool", content=item["output"]))
        elif item["role"] == "assistant":
            text = content if isinstance(content, str) else content[0].get("text") if content else None
            if prev is not None and prev.content is None:
                prev.content = text
            elif text is not None:
                msgs.append(ChatMessage(role="assistant", content=text))
        else:
            if isinstance(content, list):
                if any(p["type"] in _MEDIA_PARTS for p in content):
                    raise ValueError(f"{model_name} is not a multimodal model")
                content = [{"type": "text", "text": p.get("text", "")} for p in content]
            msgs.append(ChatMessage(role=item["role"], content=content))
    if not msgs:
        raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
    return msgs


def continue_final(req: ResponsesRequest) -> bool:
    """vLLM's should_continue_final_message: the last item is a message (or reasoning) still in progress."""
    last = req.input[-1] if isinstance(req.input, list) and req.input else {}
    return last.get("type", "message") in ("message", "reasoning") and last.get("status") in ("in_progress",
                                                                                             "incomplete")


# ---------------------------------------------------------------------------- output items
def _logprobs(serving, token_ids, logprobs, top: int, stream: bool) -> list[dict]:
    """vLLM's _create_response_logprobs (serving.py:966-1049): each token with its top `top`; the streamed
    deltas carry no bytes."""
    out = []
    for tok, lps in zip(token_ids, logprobs or [], strict=False):
        entries = []
        for t, lp in [(tok, lps.get(tok)), *list(lps.items())[:top]]:
            name = serving.logprob_token(t, lp)
            entries.append({"token": name, "logprob": max(float(lp), -9999.0)}
                           | ({} if stream else {"bytes": list(name.encode("utf-8", "replace"))}))
        out.append(entries[0] | {"top_logprobs": entries[1:]})
    return out


def _text_part(text: str, logprobs) -> dict:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


def _message(text: str, logprobs, item_id: str | None = None, status: str = "completed") -> dict:
    return {"id": item_id or _hex_id("msg_"), "content": [_text_part(text, logprobs)] if text else [],
            "role": "assistant", "status": status, "type": "message", "phase": None}


def _function_call(name: str, arguments: str, call_id: str, item_id: str, status: str = "completed") -> dict:
    return {"arguments": arguments, "call_id": call_id, "name": name, "type": "function_call", "id": item_id,
            "async": None, "caller": None, "namespace": None, "status": status}


def output_items(serving, req: ResponsesRequest, chat, out) -> list[dict]:
    """vLLM's _make_response_output_items: one message; with a response parser (auto tool choice on), the text
    read as tool calls and content (build_response_output_items), logprobs dropped when include_reasoning is
    false."""
    c = out.outputs[0]
    logprobs = _logprobs(serving, c.token_ids, c.logprobs, req.top_logprobs or 0, False) \
        if req.output_logprobs and c.logprobs else None
    if chat is None:
        return [_message(c.text, logprobs)]
    calls, content = tool_calls.extract(chat, c.text, serving.auto_tool_parser)
    items = [_message(content, logprobs if req.include_reasoning else None)] if content else []
    return items + [_function_call(t["function"]["name"], t["function"]["arguments"], t["id"], _hex_id("fc_"))
                    for t in calls or []]


def response_body(serving, req: ResponsesRequest, params: SamplingParams, created: int, output: list,
                  status: str, out=None, text: str = "", token_ids=()) -> dict:
    """ResponsesResponse.from_request (responses/protocol.py:727-779) and its usage: the sampling values used."""
    usage = messages_in = messages_out = None
    if out is not None:
        n_prompt, n_out = len(out.prompt_token_ids), len(token_ids)
        usage = {"input_tokens": n_prompt,
                 "input_tokens_details": {"cached_tokens": max(out.num_cached_tokens, 0),
                                          "input_tokens_per_turn": [], "cached_tokens_per_turn": []},
                 "output_tokens": n_out,
                 "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0,
                                           "output_tokens_per_turn": [], "tool_output_tokens_per_turn": []},
                 "total_tokens": n_prompt + n_out}
        if req.enable_response_messages:  # SimpleContext's input_messages / output_messages
            messages_in = [{"message": out.prompt or "", "tokens": list(out.prompt_token_ids),
                            "type": "raw_message_tokens"}]
            messages_out = [{"message": text, "tokens": list(token_ids), "type": "raw_message_tokens"}] \
                if text or token_ids else []
    return {"id": req.request_id, "created_at": created,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": req.instructions, "metadata": req.metadata, "model": serving.model_name,
            "object": "response", "output": output, "parallel_tool_calls": req.parallel_tool_calls is not False,
            "temperature": params.temperature, "tool_choice": _dump(req.tool_choice),
            "tools": [_dump(t) for t in req.tools], "top_p": params.top_p, "background": bool(req.background),
            "max_output_tokens": params.max_tokens, "max_tool_calls": req.max_tool_calls,
            "previous_response_id": req.previous_response_id, "prompt": None, "reasoning": _dump(req.reasoning),
            "service_tier": req.service_tier, "status": status, "text": _dump(req.text),
            "top_logprobs": params.logprobs, "truncation": req.truncation, "usage": usage, "user": req.user,
            "presence_penalty": params.presence_penalty, "frequency_penalty": params.frequency_penalty,
            "kv_transfer_params": None, "ec_transfer_params": None, "input_messages": messages_in,
            "output_messages": messages_out}


def _dump(value):
    return value.model_dump(mode="json", by_alias=True) if hasattr(value, "model_dump") else value


# ---------------------------------------------------------------------------- streaming
class EventStream:
    """vLLM's SimpleStreamingEventProcessor (streaming_events.py:808-1283): each delta opens an output item when
    its kind (text or a tool call of a new index) differs from the open one, which is closed first; events are
    numbered by sequence_number."""

    def __init__(self) -> None:
        self.seq, self.index, self.kind = 0, 0, None  # kind: None, "text" or the open call's index
        self.item_id = self.call_id = self.name = ""
        self.text, self.delta_sent = "", False

    def event(self, type_: str, **fields) -> str:
        obj = fields | {"sequence_number": self.seq, "type": type_}
        self.seq += 1
        return f"event: {type_}\ndata: {json.dumps(obj, separators=(',', ':'), ensure_ascii=False)}\n\n"

    def _where(self) -> dict:
        return {"item_id": self.item_id, "output_index": self.index}

    def close(self) -> list[str]:
        out = []
        if self.kind == "text":
            part = _text_part(self.text, None)
            out = [self.event("response.output_text.done", content_index=0, logprobs=[], text=self.text,
                              **self._where()),
                   self.event("response.content_part.done", content_index=0, part=part, **self._where()),
                   self.event("response.output_item.done", output_index=self.index,
                              item=_message(self.text, None, self.item_id) | {"summary": []})]
        elif self.kind is not None:
            if self.delta_sent:
                out.append(self.event("response.function_call_arguments.done", arguments=self.text,
                                      name=self.name, **self._where()))
            out.append(self.event("response.output_item.done", output_index=self.index,
                                  item=_function_call(self.name, self.text, self.call_id, self.item_id)))
        if self.kind is not None:
            self.index, self.kind = self.index + 1, None
        return out

    def content(self, text: str, logprobs: list) -> list[str]:
        out = []
        if self.kind != "text":
            out = self.close()
            self.kind, self.item_id, self.text = "text", _hex_id(), ""
            out += [self.event("response.output_item.added", output_index=self.index,
                               item=_message("", None, self.item_id, "in_progress")),
                    self.event("response.content_part.added", content_index=0, part=_text_part("", []),
                               **self._where())]
        self.text += text
        return out + [self.event("response.output_text.delta", content_index=0, delta=text, logprobs=logprobs,
                                 **self._where())]

    def tool_call(self, calls: list[dict]) -> list[str]:
        out = []
        index = calls[0].get("index")
        if self.kind in (None, "text") or (index is not None and self.kind is not None and index != self.kind):
            out = self.close()
            self.kind, self.item_id, self.call_id = index, _hex_id(), _hex_id("call_")
            self.name, self.text, self.delta_sent = calls[0]["function"].get("name") or "", "", False
            out.append(self.event("response.output_item.added", output_index=self.index,
                                  item=_function_call(self.name, "", self.call_id, self.item_id, "in_progress")))
        args = "".join(c["function"].get("arguments") or "" for c in calls)
        if args:
            self.text, self.delta_sent = self.text + args, True
            out.append(self.event("response.function_call_arguments.delta", delta=args, **self._where()))
        return out

    def delta(self, delta: dict | None, logprobs) -> list[str]:
        """One parsed delta (tool_calls.StreamState's chat delta), split as vLLM's split_delta does."""
        out = []
        if not delta:
            return out
        if delta.get("content"):
            out += self.content(delta["content"], logprobs())
        groups: dict = {}
        for call in delta.get("tool_calls") or []:
            if call.get("function") is not None:
                groups.setdefault(call.get("index"), []).append(call)
        for calls in groups.values():
            out += self.tool_call(calls)
        return out


async def _stream(serving, req, params, chat, gens, created):
    from minivllm.entrypoints.openai.api_server import stream_error

    events = EventStream()
    initial = response_body(serving, req, params, created, [], "in_progress")
    yield events.event("response.created", response=initial)
    yield events.event("response.in_progress", response=initial)
    state = tool_calls.StreamState(chat, serving.auto_tool_parser) if chat is not None else None
    text, token_ids, logprobs, last = "", [], [], None
    try:
        async for out in gens[0].iterate():
            c, last = out.outputs[0], out
            text, token_ids = text + c.text, token_ids + list(c.token_ids)
            logprobs += list(c.logprobs or [])
            delta = state.delta(c.text, c.finish_reason is not None) if state is not None else {"content": c.text}

            def step_logprobs(c=c):
                if not req.output_logprobs or (state is not None and not req.include_reasoning):
                    return []
                return _logprobs(serving, c.token_ids, c.logprobs, req.top_logprobs or 0, True)
            for e in events.delta(delta, step_logprobs):
                yield e
    except Exception as e:  # noqa: BLE001  (after the 200: an error event ends the stream)
        error = json.loads(stream_error(e)[len("data: "):])["error"]
        yield events.event("error", code=str(error["code"]), message=error["message"], param=None)
        return
    for e in events.close():
        yield e
    full = SimpleNamespace(prompt=last.prompt, prompt_token_ids=last.prompt_token_ids,
                           num_cached_tokens=last.num_cached_tokens,
                           outputs=[SimpleNamespace(text=text, token_ids=token_ids, logprobs=logprobs or None)])
    status = "incomplete" if last.outputs[0].finish_reason == "length" else "completed"
    yield events.event("response.completed", response=response_body(
        serving, req, params, created, output_items(serving, req, chat, full), status, full, text, token_ids))


async def _stream_body(events, gens):
    """The stream's body; its engine request closed (aborted if unfinished, also when the client leaves)."""
    try:
        async for event in events:
            yield event
    finally:
        for g in gens:
            await g.aclose()


# ---------------------------------------------------------------------------- the handler
async def create_responses(serving, req: ResponsesRequest, raw: Request):
    """vLLM's OpenAIServingResponses.create_responses without harmony (serving.py:341-606, responses_full_generator
    785-953, responses_stream_generator 1480-1561)."""
    from minivllm.entrypoints.openai.api_server import (
        CancellableStreamingResponse,
        error_response,
        finals_of,
        start_children,
        with_cancellation,
    )

    serving.check_model(req.model)
    if req.store and req.background:
        return error_response(400, "This vLLM engine does not support `store=True` and therefore does not support the "
                                   "background mode. To enable these features, set the environment variable "
                                   "`VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server.",
                              "invalid_request_error", "background")
    if req.previous_input_messages and req.previous_response_id:
        return error_response(400, "Only one of `previous_input_messages` and `previous_response_id` can be set.",
                              "invalid_request_error", "previous_response_id")
    if req.previous_response_id is not None:  # nothing is stored, so no earlier response is found
        return error_response(404, f"Response with id '{req.previous_response_id}' not found.",
                              "invalid_request_error", "response_id")
    if any(isinstance(t, BuiltinTool) for t in req.tools):
        raise VLLMValidationError("minivllm has no built-in tools (no tool server): only function tools are "
                                  "supported", "tools")
    chat = req.chat_view() if req.tools and serving.auto_tool_parser else None
    if chat is not None and chat.forced_tool:  # vLLM's ToolParser.adjust_request: the call's schema as text.format
        req.text = ResponseTextConfig(format=ResponseFormatTextJSONSchemaConfig(
            type="json_schema", name="tool_calling_response", schema=tool_json_schema(chat.tool_choice, chat.tools),
            strict=True))
    cont = continue_final(req)
    kwargs = dict(req.chat_template_kwargs or {})
    if req.reasoning is not None and req.reasoning.effort is not None:
        kwargs.setdefault("reasoning_effort", req.reasoning.effort)
        kwargs.setdefault("enable_thinking", req.reasoning.effort != "none")
    prompt = await serving.in_pool(serving.chat_prompt, chat_messages(req, serving.model_name), not cont, cont,
                                   kwargs, True)
    # vLLM's renderer checks the prompt against the context (truncation "auto": cut to fit, the BOS kept, by the
    # tokenizer), then get_max_tokens: what the context leaves beside the prompt, capped by max_output_tokens
    n_prompt = len(prompt["prompt_token_ids"])
    if req.truncation == "auto":
        n_prompt = min(n_prompt, serving.max_model_len - (req.max_output_tokens or 0))
        prompt = prompt["prompt"]
    else:
        serving.check_context(n_prompt, req.max_output_tokens or 0, "max_output_tokens")
    if n_prompt >= serving.max_model_len:
        return error_response(400, f"The engine prompt length {n_prompt} exceeds the max_model_len "
                                   f"{serving.max_model_len}. Please reduce prompt.", "invalid_request_error", "input")
    max_tokens = serving.max_model_len - n_prompt
    if req.max_output_tokens is not None:
        max_tokens = min(req.max_output_tokens, max_tokens) if 0 < req.max_output_tokens <= serving.max_model_len \
            else req.max_output_tokens
    params = req.to_sampling_params(max_tokens, serving.structured_outputs_config)
    created = now()
    gens = await start_children(serving, req.request_id, [prompt], params, bool(req.stream), req.max_output_tokens,
                                "max_output_tokens", truncate=-1 if req.truncation == "auto" else None)
    if req.stream:
        return CancellableStreamingResponse(_stream_body(_stream(serving, req, params, chat, gens, created), gens),
                                            media_type="text/event-stream")

    async def run():
        (out,) = await finals_of(gens)
        c = out.outputs[0]
        status = "incomplete" if c.finish_reason == "length" else "completed"
        return JSONResponse(response_body(serving, req, params, created, output_items(serving, req, chat, out),
                                          status, out, c.text, c.token_ids))
    return await with_cancellation(raw, run())
