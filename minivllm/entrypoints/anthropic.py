"""Anthropic's Messages API over the chat path (vLLM: entrypoints/anthropic/).

POST /v1/messages and /v1/messages/count_tokens, as vLLM's AnthropicServingMessages does them: the request is
turned into a ChatCompletionRequest (system text first, text blocks, tool_use / tool_result blocks, tools and
tool_choice, output_config's JSON schema as a json_schema response_format), run by the chat handler, and the answer turned back (finish reasons as Anthropic stop reasons;
a stream as message_start / content_block_* / message_delta / message_stop events). Errors are Anthropic's shape,
{"type": "error", "error": {"type", "message"}}, with the chat handler's status and type.
"""
from __future__ import annotations

import json
import logging
from typing import Any, Literal

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from minivllm.engine.exceptions import EngineDeadError
from minivllm.entrypoints.openai.protocol import ChatCompletionRequest

logger = logging.getLogger("minivllm.api_server")

BILLING_HEADER = "x-anthropic-billing-header"  # Claude Code's per-request line: dropped, as vLLM does (prefix cache)
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class AnthropicContentBlock(_Model):
    type: Literal["text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking", "tool_reference"]
    text: str | None = None
    source: dict[str, Any] | None = None
    id: str | None = None
    tool_use_id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = None
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None


class AnthropicMessage(_Model):
    role: Literal["user", "assistant", "system"]
    content: str | list[AnthropicContentBlock]


class AnthropicTool(_Model):
    name: str
    description: str | None = None
    input_schema: dict[str, Any]


class AnthropicToolChoice(_Model):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None

    @model_validator(mode="after")
    def _name_for_tool(self):  # vLLM's validate_name_required_for_tool
        if self.type == "tool" and not self.name:
            raise ValueError("tool_choice.name is required when type is 'tool'")
        return self


class AnthropicJsonOutputFormat(_Model):
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    type: Literal["json_schema"] = "json_schema"


class AnthropicOutputConfig(_Model):
    """vLLM's AnthropicOutputConfig (anthropic/protocol.py:104-115): a JSON schema the reply must match, and a
    reasoning effort (nothing to reason with here: accepted and unused, as vLLM's chat path does)."""

    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: AnthropicJsonOutputFormat | None = None


class AnthropicCountTokensRequest(_Model):
    model: str
    messages: list[AnthropicMessage]
    system: str | list[AnthropicContentBlock] | None = None
    tool_choice: AnthropicToolChoice | None = None
    tools: list[AnthropicTool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("model")
    @classmethod
    def _model_required(cls, v):  # vLLM's validate_model (anthropic/protocol.py)
        if not v:
            raise ValueError("Model is required")
        return v


class AnthropicMessagesRequest(AnthropicCountTokensRequest):
    max_tokens: int
    metadata: dict[str, Any] | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    cache_salt: str | None = Field(default=None, min_length=1)
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    output_config: AnthropicOutputConfig | None = None

    @field_validator("max_tokens")
    @classmethod
    def _max_tokens_positive(cls, v):  # vLLM's validate_max_tokens
        if v <= 0:
            raise ValueError("max_tokens must be positive")
        return v


def _system_text(content: str | list[AnthropicContentBlock] | None) -> str | None:
    """System text (the top-level `system` or a system message), billing header lines dropped (vLLM's
    _extract_system_text)."""
    blocks = [content] if isinstance(content, str) else [b.text for b in content or [] if b.type == "text" and b.text]
    return "".join(t for t in blocks if not t.startswith(BILLING_HEADER)) or None


def _tool_result_text(block: AnthropicContentBlock) -> str:
    if isinstance(block.content, list):
        return "\n".join(str(p.get("text", "")) for p in block.content if p.get("type") == "text")
    return block.content or ""


def to_chat_messages(req: AnthropicCountTokensRequest) -> list[dict]:
    """vLLM's _convert_system_message + _convert_messages: the system text first, then each message."""
    out: list[dict] = []
    if (system := _system_text(req.system)) is not None:
        out.append({"role": "system", "content": system})
    for msg in req.messages:
        if msg.role == "system":
            if (text := _system_text(msg.content)) is not None:
                out.append({"role": "system", "content": text})
            continue
        if isinstance(msg.content, str):
            out.append({"role": msg.role, "content": msg.content})
            continue
        parts, calls = [], []
        for b in msg.content:
            if b.type == "text" and b.text:
                parts.append({"type": "text", "text": b.text})
            elif b.type == "image":
                raise ValueError("image content blocks are not supported by minivllm (text-only models)")
            elif b.type == "tool_use":
                calls.append({"id": b.id, "type": "function",
                              "function": {"name": b.name, "arguments": json.dumps(b.input or {})}})
            elif b.type == "tool_result":
                out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": _tool_result_text(b)})
        m: dict = {"role": msg.role}
        if calls:
            m["tool_calls"] = calls
        if parts:
            m["content"] = parts[0]["text"] if len(parts) == 1 else parts
        if "content" in m or calls or msg.role != "user":
            out.append(m)
    return out


def to_chat_request(req: AnthropicCountTokensRequest) -> ChatCompletionRequest:
    """vLLM's _convert_anthropic_to_openai_request."""
    body: dict[str, Any] = {"model": req.model, "messages": to_chat_messages(req),
                            "chat_template_kwargs": req.chat_template_kwargs}
    if isinstance(req, AnthropicMessagesRequest):
        body |= {"max_tokens": req.max_tokens, "max_completion_tokens": req.max_tokens, "stop": req.stop_sequences,
                 "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k, "cache_salt": req.cache_salt}
        if req.stream:
            body |= {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        body |= {"kv_transfer_params": req.kv_transfer_params, "ec_transfer_params": req.ec_transfer_params}
        config = req.output_config
        if config is not None and config.format is not None and config.format.json_schema:  # _handle_output_config
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": config.format.type, "schema": config.format.json_schema}}
        if config is not None and config.effort is not None:
            body["reasoning_effort"] = config.effort
    choice = req.tool_choice
    if choice is not None:
        body["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(choice.type) or \
            {"type": "function", "function": {"name": choice.name}}
    if req.tools is not None:
        body["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                           "parameters": t.input_schema}} for t in req.tools]
        body.setdefault("tool_choice", "auto")
    return ChatCompletionRequest.model_validate(body)


def error(status: int, err_type: str, message: str) -> JSONResponse:
    return JSONResponse({"type": "error", "error": {"type": err_type, "message": message}}, status)


def _usage(usage: dict | None) -> dict:
    if not usage:
        return {"input_tokens": 0, "output_tokens": 0}
    return {"input_tokens": max(0, usage["prompt_tokens"]), "output_tokens": usage.get("completion_tokens") or 0}


def _event(obj: dict) -> str:
    return f"event: {obj['type']}\ndata: {json.dumps(obj, separators=(',', ':'), ensure_ascii=False)}\n\n"


async def _translate(chat_call) -> JSONResponse | StreamingResponse:
    """Run the chat handler; its errors (raised or answered) come back in Anthropic's shape."""
    from minivllm.entrypoints.openai.api_server import ModelNotFound

    try:
        response = await chat_call
    except ModelNotFound as e:  # the server's own handlers would answer these in OpenAI's shape
        return error(404, "NotFoundError", str(e))
    except EngineDeadError:
        raise
    except ValueError as e:
        return error(400, "BadRequestError", str(e))
    except Exception as e:  # noqa: BLE001  (vLLM's router: any other failure is a 500 "internal_error")
        logger.error("/v1/messages failed", exc_info=e)
        return error(500, "internal_error", f"{type(e).__name__}: {e}")
    if response.status_code != 200:
        body = json.loads(response.body)["error"]
        return error(response.status_code, body["type"], body["message"])
    return response


def messages_full(body: dict) -> dict:
    """vLLM's messages_full_converter (serialized without nulls)."""
    choice = body["choices"][0]
    msg = choice["message"]
    content = [{"type": "text", "text": msg["content"]}] if msg.get("content") else []
    for call in msg.get("tool_calls") or []:
        content.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                        "input": json.loads(call["function"]["arguments"])})
    out = {"id": body["id"], "type": "message", "role": "assistant",
           "content": content or [{"type": "text", "text": ""}], "model": body["model"]}
    if (reason := STOP_REASONS.get(choice["finish_reason"])) is not None:
        out["stop_reason"] = reason
    return out | {"usage": _usage(body["usage"])}


async def messages_stream(chunks):
    """vLLM's message_stream_converter: the chat stream's chunks as Anthropic events."""
    first, finish, index, block = True, None, -1, None
    try:
        async for item in chunks:
            data = item[len("data: "):].strip()
            if data == "[DONE]":
                if block is not None:
                    yield _event({"type": "content_block_stop", "index": index})
                yield _event({"type": "message_stop"})
                continue
            chunk = json.loads(data)
            if "error" in chunk:
                yield _event({"type": "error", "error": {"type": "internal_error",
                                                         "message": chunk["error"]["message"]}})
                continue
            if first:
                first = False
                yield _event({"type": "message_start", "message": {
                    "id": chunk["id"], "type": "message", "role": "assistant", "content": [], "model": chunk["model"],
                    "stop_reason": None, "stop_sequence": None, "usage": _usage(chunk.get("usage"))}})
                continue
            if not chunk["choices"]:  # the usage chunk: the message ends
                if block is not None:
                    yield _event({"type": "content_block_stop", "index": index})
                    block = None
                yield _event({"type": "message_delta", "delta": {"stop_reason": STOP_REASONS.get(finish or "stop")},
                              "usage": _usage(chunk.get("usage"))})
                continue
            choice = chunk["choices"][0]
            finish = choice.get("finish_reason") or finish
            delta = choice.get("delta") or {}
            if delta.get("content"):
                if block != "text":
                    if block is not None:
                        yield _event({"type": "content_block_stop", "index": index})
                    index, block = index + 1, "text"
                    yield _event({"type": "content_block_start", "content_block": {"type": "text", "text": ""},
                                  "index": index})
                yield _event({"type": "content_block_delta", "delta": {"type": "text_delta",
                                                                       "text": delta["content"]}, "index": index})
            for call in delta.get("tool_calls") or []:
                fn = call.get("function") or {}
                if call.get("id") is not None and fn.get("name") is not None:
                    if block is not None:
                        yield _event({"type": "content_block_stop", "index": index})
                    index, block = index + 1, "tool_use"
                    yield _event({"type": "content_block_start", "content_block": {
                        "type": "tool_use", "id": call["id"], "name": fn["name"], "input": {}}, "index": index})
                if fn.get("arguments"):
                    yield _event({"type": "content_block_delta", "delta": {
                        "type": "input_json_delta", "partial_json": fn["arguments"]}, "index": index})
    except Exception as e:  # noqa: BLE001
        yield _event({"type": "error", "error": {"type": "internal_error", "message": str(e)}})


async def create_messages(serving, req: AnthropicMessagesRequest, raw: Request):
    from minivllm.entrypoints.openai.api_server import create_chat_completion

    try:
        chat = to_chat_request(req)
    except ValueError as e:
        return error(400, "BadRequestError", str(e))
    response = await _translate(create_chat_completion(serving, chat, raw))
    if response.status_code != 200:
        return response
    if isinstance(response, StreamingResponse):
        return type(response)(messages_stream(response.body_iterator), media_type="text/event-stream")
    return JSONResponse(messages_full(json.loads(response.body)))


async def count_tokens(serving, req: AnthropicCountTokensRequest):
    """The prompt's token count, rendered as /v1/messages would render it (vLLM: render_chat_request)."""
    from minivllm.entrypoints.openai.api_server import chat_inputs

    async def count():
        _, prompt, _, _ = await chat_inputs(serving, to_chat_request(req))
        n = len(prompt["prompt_token_ids"])
        return JSONResponse({"input_tokens": n, "context_management": {"original_input_tokens": n}})
    return await _translate(count())
