"""Tokens in, tokens out (vLLM: entrypoints/scale_out/{render,token_in_token_out}/).

/v1/completions/render and /v1/chat/completions/render run a request's front half only (template, tokenize,
validate, SamplingParams) and answer the GenerateRequest the engine would get; /inference/v1/generate takes such
a request back and runs it, answering token ids. Together they split a server into a CPU "render" tier and a
GPU tier, as vLLM's disaggregated deployments do; in the course they show the exact boundary between the
frontend and EngineCore. Errors and 400s come from the same checks as the completion routes.
"""
from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

import msgspec
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, field_validator, model_validator

from minivllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    OpenAIBaseModel,
    StreamOptions,
)
from minivllm.exceptions import VLLMValidationError
from minivllm.sampling_params import SamplingParams

# vLLM's RequestOutputKind values, as its render output carries them (the engine's output mode for the request)
CUMULATIVE, DELTA, FINAL_ONLY = 0, 1, 2
# vLLM SamplingParams fields that change nothing a token-out answer shows: accepted and dropped
_NO_EFFECT = {"output_kind", "skip_clone", "detokenize", "spaces_between_special_tokens", "flat_logprobs",
              "output_text_buffer_length", "skip_reading_prefix_cache", "extra_args",
              "routed_experts_prompt_start"}
# vLLM SamplingParams fields minivllm cannot honour: a 400 rather than an answer that ignores them
_UNSUPPORTED = {"logprob_token_ids", "thinking_token_budget"}


class PlaceholderRangeInfo(BaseModel):
    offset: int
    length: int


class MultiModalFeatures(BaseModel):
    """vLLM's render output for a multimodal prompt (token_in_token_out/protocol.py:47-67): typed as vLLM types
    it; a text-only model never has any."""

    mm_hashes: dict[str, list[str]]
    mm_placeholders: dict[str, list[PlaceholderRangeInfo]]
    kwargs_data: dict[str, list[str | None]] | None = None


class GenerateRequest(OpenAIBaseModel):
    """vLLM's GenerateRequest (token_in_token_out/protocol.py): token ids and SamplingParams as JSON."""

    request_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:16])
    token_ids: Annotated[list[int], Field(min_length=1)]
    # what render says about the prompt: carried, unused by generation (vLLM's serve_tokens reads neither)
    assistant_tokens_mask: list[int] | None = None
    token_offsets: list[tuple[int, int]] | None = None
    features: MultiModalFeatures | None = None
    sampling_params: dict[str, Any]
    model: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    cache_salt: str | None = None
    priority: int = Field(0, ge=-(2**63), le=2**63 - 1)
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None

    @field_validator("token_ids")
    @classmethod
    def validate_token_ids(cls, v: list[int]) -> list[int]:
        if any(t < 0 for t in v):
            raise ValueError("token_ids must not contain negative values")
        return v

    def params(self) -> tuple[SamplingParams, bool]:
        """minivllm's SamplingParams from the JSON (its own checks give the 400s), and whether max_tokens was given
        (if not, the request may run to the end of the context, as vLLM's serve_tokens does)."""
        sp = {k: v for k, v in self.sampling_params.items() if k not in _NO_EFFECT}
        for name in _UNSUPPORTED & set(sp):
            if sp[name] is not None:
                raise VLLMValidationError(f"sampling_params.{name} is not supported by minivllm", name)
        sp = {k: v for k, v in sp.items() if k in SamplingParams.__struct_fields__
              and k != "bad_words_token_ids"}  # others ignored, as vLLM; bad_words_token_ids is derived
        try:
            params = msgspec.convert(sp, SamplingParams)
        except msgspec.ValidationError as e:
            if isinstance(e.__cause__, VLLMValidationError):  # a value __post_init__ refused, with its field
                raise e.__cause__ from None
            # a wrong type: vLLM's body validation fails there (a 400 "Bad Request", param body.sampling_params)
            raise RequestValidationError([{"type": "value_error", "loc": ("body", "sampling_params"),
                                           "msg": f"sampling_params: {e}", "input": self.sampling_params}]) from None
        return params, "max_tokens" in sp


_STRUCTURED_DEFAULTS = {"json": None, "regex": None, "choice": None, "grammar": None, "json_object": None,
                        "disable_any_whitespace": False, "disable_additional_properties": False,
                        "whitespace_pattern": None, "structural_tag": None, "_backend": None,
                        "_backend_was_auto": False}


def render_params(params: SamplingParams, stream: bool) -> dict:
    """SamplingParams as vLLM's render answer writes them (msgspec, defaults omitted; stop lists as [])."""
    out = {k: v for k, v in msgspec.to_builtins(params).items() if k != "bad_words_token_ids"}
    if out.get("structured_outputs"):  # vLLM's is a dataclass: every field written, its private two too
        out["structured_outputs"] = _STRUCTURED_DEFAULTS | out["structured_outputs"]
    for name in ("stop", "stop_token_ids", "bad_words"):
        out[name] = out.get(name) or []
    # vLLM skips reading the prefix cache for a request that wants prompt logprobs (their positions must be computed)
    return out | {"output_kind": DELTA if stream else FINAL_ONLY, "skip_clone": True,
                  "skip_reading_prefix_cache": params.prompt_logprobs is not None}


def _extra_args(req) -> dict | None:
    """vLLM's to_sampling_params' extra_args: vllm_xargs, with the KV / EC transfer parameters added (for a
    connector or custom logits processor; minivllm has neither, so only render shows them)."""
    extra = dict(getattr(req, "vllm_xargs", None) or {})
    for name in ("kv_transfer_params", "ec_transfer_params"):
        if getattr(req, name, None):
            extra[name] = getattr(req, name)
    return extra or None


def token_offsets(tokenizer, text, token_ids: list[int], add_special_tokens: bool) -> list[list[int]] | None:
    """vLLM's prompt_token_offsets for return_token_offsets (renderers/base.py:439-487): each token's (start, end)
    characters in the prompt text, from the fast tokenizer's offset mapping; none for a prompt of token ids. A
    truncated prompt keeps its leading special tokens' offsets and its last tokens' (encode_truncated's cut)."""
    if not isinstance(text, str):
        return None
    enc = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    offsets = [list(o) for o in enc["offset_mapping"]]
    if len(offsets) != len(token_ids):
        specials = set(tokenizer.all_special_ids)
        head = next((i for i, t in enumerate(enc["input_ids"]) if t not in specials), len(offsets))
        head = min(head, len(token_ids))
        offsets = offsets[:head] + (offsets[-(len(token_ids) - head):] if len(token_ids) > head else [])
    return offsets


def _generate_request(rid: str, token_ids: list[int], params: SamplingParams, req, tokenizer=None,
                      text=None) -> dict:
    sampling = render_params(params, bool(req.stream))
    if (extra := _extra_args(req)) is not None:
        sampling["extra_args"] = extra
    # request fields vLLM's SamplingParams carries and minivllm's does not (nothing they would change here)
    if getattr(req, "spaces_between_special_tokens", True) is False:
        sampling["spaces_between_special_tokens"] = False
    if getattr(req, "thinking_token_budget", None) not in (None, -1):
        sampling["thinking_token_budget"] = req.thinking_token_budget
    if getattr(req, "top_k", None) == -1 and not sampling.get("top_k") and sampling.get("temperature", 1.0) >= 1e-5:
        sampling["top_k"] = -1  # vLLM keeps "off" as given, unless greedy sampling reset it
    offsets = token_offsets(tokenizer, text, token_ids, bool(getattr(req, "add_special_tokens", True))) \
        if getattr(req, "return_token_offsets", False) else None
    return {"request_id": rid, "token_ids": token_ids, "assistant_tokens_mask": None, "token_offsets": offsets,
            "features": None, "sampling_params": sampling, "model": req.model,
            "stream": bool(req.stream), "stream_options": req.stream_options.model_dump() if req.stream and
            req.stream_options else None, "cache_salt": getattr(req, "cache_salt", None), "priority": req.priority,
            "kv_transfer_params": None, "ec_transfer_params": None}


async def _rendered(serving, rid: str, prompt, params: SamplingParams, max_tokens: int | None, field: str,
                    req) -> tuple[list[int], SamplingParams]:
    """The prompt through the completion routes' own front half (template, truncation, every check)."""
    _, core_req = await serving.process_inputs(rid, prompt, msgspec.structs.replace(params, n=1), max_tokens, field,
                                               req.truncate_prompt_tokens, getattr(req, "add_special_tokens", True),
                                               req.truncation_side)
    return core_req.prompt_token_ids, msgspec.structs.replace(core_req.sampling_params, n=params.n)


async def render_completion(serving, req: CompletionRequest) -> JSONResponse:
    """vLLM's ServingRender.render_completion_request: one GenerateRequest per prompt."""
    from minivllm.entrypoints.openai.api_server import _prompts, completion_params

    params = completion_params(serving, req, req.max_tokens)
    out = []
    for p in _prompts(req.prompt):
        rid = f"cmpl-{uuid.uuid4().hex[:16]}"
        ids, used = await _rendered(serving, rid, p, params, req.max_tokens, "max_tokens", req)
        out.append(_generate_request(rid, ids, used, req, serving.tokenizer, p))
    return JSONResponse(out)


async def render_chat(serving, req: ChatCompletionRequest) -> JSONResponse:
    """vLLM's ServingRender.render_chat_request: the conversation templated and tokenized, as chat would run it."""
    from minivllm.entrypoints.openai.api_server import chat_inputs

    serving.check_model(req.model)
    if req.use_beam_search:
        raise ValueError("Beam search is not supported by the render endpoint")
    params, prompt, max_tokens, field = await chat_inputs(serving, req)
    rid = f"chatcmpl-{uuid.uuid4().hex[:16]}"
    ids, used = await _rendered(serving, rid, prompt, params, max_tokens, field, req)
    return JSONResponse(_generate_request(rid, ids, used, req, serving.tokenizer, prompt["prompt"]))


def _token_logprobs(token_ids, logprobs, num: int) -> dict:
    """vLLM's ServingTokens._create_tokens_logprobs: every token as "token_id:N", no bytes."""
    content = []
    for tok, lps in zip(token_ids, logprobs, strict=False):
        chosen = lps.get(tok)
        if chosen is None:
            content.append({"token": f"token_id:{tok}", "logprob": -9999.0, "bytes": None, "top_logprobs": []})
            continue
        top = [{"token": f"token_id:{t}", "logprob": max(float(lp), -9999.0), "bytes": None}
               for t, lp in list(lps.items())[:max(num, 1)]]
        content.append({"token": f"token_id:{tok}", "logprob": max(float(chosen), -9999.0), "bytes": None,
                        "top_logprobs": top})
    return {"content": content}


async def generate(serving, req: GenerateRequest, raw: Request):
    """vLLM's ServingTokens.serve_tokens: the ids run as given (no template, no tokenizer), ids come back.

    n > 1 answers every sample, choice i for sample i (vLLM's non-streaming answer keeps only the sample
    that finished last: a listed difference)."""
    from minivllm.entrypoints.openai.api_server import (
        CancellableStreamingResponse,
        _usage,
        finals_of,
        merge_async_iterators,
        now,
        sse,
        sse_body,
        start_children,
        with_cancellation,
    )

    serving.check_model(req.model)
    params, given = req.params()
    max_seqs = serving.engine.vllm_config.scheduler_config.max_num_seqs
    if params.n > max_seqs:
        raise VLLMValidationError(f"sampling_params.n must be at most the server's max_num_seqs ({max_seqs}), got "
                                  f"{params.n}.")
    if not given:  # vLLM: whatever fits the context
        params = msgspec.structs.replace(params, max_tokens=None)
    rid = f"generate-tokens-{raw.headers.get('X-Request-Id') or req.request_id}"
    gens = await start_children(serving, rid, [req.token_ids], params, bool(req.stream), None)
    model = serving.model_name
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        continuous = include_usage and bool(req.stream_options.continuous_usage_stats)

        async def stream():
            n_prompt, n_gen = len(req.token_ids), [0] * len(gens)
            async for i, out in merge_async_iterators(*[g.iterate() for g in gens]):
                c = out.outputs[0]
                n_gen[i] += len(c.token_ids)
                if not c.token_ids:
                    continue
                lp = _token_logprobs(c.token_ids, c.logprobs, params.logprobs) if params.logprobs is not None \
                    else None
                chunk = {"request_id": rid, "choices": [{"index": i, "logprobs": lp, "finish_reason": c.finish_reason,
                                                         "token_ids": list(c.token_ids), "routed_experts": None}],
                         "usage": _usage(n_prompt, n_gen[i]) if continuous else None}
                yield sse(chunk)
            if include_usage:
                yield sse({"request_id": rid, "choices": [], "usage": _usage(n_prompt, sum(n_gen), False)})
        return CancellableStreamingResponse(sse_body(stream(), gens), media_type="text/event-stream")

    async def run():
        created = now()
        finals = await finals_of(gens)
        choices, n_gen = [], 0
        for i, out in enumerate(finals):
            c = out.outputs[0]
            n_gen += len(c.token_ids)
            choices.append({"index": i, "logprobs": _token_logprobs(c.token_ids, c.logprobs, params.logprobs)
                            if params.logprobs is not None else None, "finish_reason": c.finish_reason or "stop",
                            "token_ids": list(c.token_ids), "routed_experts": None})
        return JSONResponse({"request_id": rid, "model": model, "created": created, "choices": choices,
                             "usage": _usage(len(req.token_ids), n_gen),
                             "prompt_logprobs": serving.prompt_logprobs_json(finals[0].prompt_logprobs),
                             "kv_transfer_params": None, "ec_transfer_params": None})
    return await with_cancellation(raw, run())



# ---------------------------------------------------------------------------- derender: generated ids -> an answer
class GenerateChoice(OpenAIBaseModel):
    index: int
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = "stop"
    token_ids: list[int] | None = None


class GenerateResponse(OpenAIBaseModel):
    """An /inference/v1/generate answer, as the derender routes take it back."""

    request_id: str
    choices: list[GenerateChoice]
    prompt_logprobs: list | None = None
    kv_transfer_params: dict[str, Any] | None = None


class DerenderCompletionRequest(OpenAIBaseModel):
    stream: Literal[False] = False
    model: str
    generate_responses: list[GenerateResponse]
    prompt_tokens: list[int] | None = None
    completion_request: CompletionRequest | None = None

    @model_validator(mode="after")
    def _validate_prompt_tokens_length(self) -> DerenderCompletionRequest:
        if self.prompt_tokens is not None and len(self.prompt_tokens) != len(self.generate_responses):
            raise ValueError(f"prompt_tokens length ({len(self.prompt_tokens)}) must equal generate_responses length "
                             f"({len(self.generate_responses)})")
        return self


class DerenderChatRequest(OpenAIBaseModel):
    stream: Literal[False] = False
    model: str
    generate_response: GenerateResponse
    prompt_tokens: int | None = None
    chat_request: ChatCompletionRequest | None = None


class GenerateStreamChoice(OpenAIBaseModel):
    index: int
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None


class StreamUsage(OpenAIBaseModel):
    prompt_tokens: int = 0
    completion_tokens: int | None = 0
    total_tokens: int = 0


class GenerateStreamResponse(OpenAIBaseModel):
    """One SSE chunk of a streamed /inference/v1/generate, as the streamed derender takes it back."""

    request_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    choices: list[GenerateStreamChoice]
    usage: StreamUsage | None = None


class DerenderStreamState(OpenAIBaseModel):
    """vLLM's DerenderStreamState: what the client carries between streamed derender calls, so the server keeps no
    session. prev_tokens is the tail of token strings the incremental detokenizer still reads (from prefix_offset),
    trimmed and rebased after every chunk so it does not grow with the output."""

    prev_tokens: list[str] = Field(default_factory=list)
    prefix_offset: int = Field(0, ge=0)
    read_offset: int = Field(0, ge=0)
    role_sent: bool = False
    last_content: str | None = None  # vLLM carries these three for a parser it does not run yet either
    last_reasoning: str | None = None
    last_tool_call_ids: list[str] = Field(default_factory=list)

    @field_validator("prev_tokens")
    @classmethod
    def _bound_prev_tokens(cls, v: list[str]) -> list[str]:
        if len(v) > 1024:  # the window is a few tokens long: a bigger one is a malformed payload
            raise ValueError(f"prev_tokens length ({len(v)}) exceeds maximum (1024)")
        return v


class DerenderStreamRequest(OpenAIBaseModel):
    stream: Literal[True]
    model: str
    generate_chunk: GenerateStreamResponse
    stream_state: DerenderStreamState | None = None
    prompt_tokens: int | None = None


class DerenderChatStreamRequest(DerenderStreamRequest):
    chat_request: ChatCompletionRequest | None = None


class DerenderCompletionStreamRequest(DerenderStreamRequest):
    completion_request: CompletionRequest | None = None


def _token_text(tokenizer, token_id: int) -> str:
    """vLLM's resolve_token_id_placeholder: the token's own text (convert_tokens_to_string of its piece)."""
    piece = tokenizer.convert_ids_to_tokens([token_id])[0]
    return "" if piece is None else tokenizer.convert_tokens_to_string([piece])


def _resolve_logprobs(logprobs: dict, tokenizer) -> list[dict]:
    """vLLM's _resolve_logprobs: each "token_id:N" as its text and UTF-8 bytes (other tokens kept)."""
    def resolve(token: str) -> tuple[str, list[int] | None]:
        suffix = token.removeprefix("token_id:")
        if suffix == token or not suffix.lstrip("-").isdigit():
            return token, None
        text = _token_text(tokenizer, int(suffix))
        return text, list(text.encode("utf-8", errors="replace"))
    out = []
    for entry in logprobs.get("content") or []:
        text, raw = resolve(entry["token"])
        top = [{"token": (r := resolve(t["token"]))[0], "logprob": t.get("logprob", -9999.0), "bytes": r[1]}
               for t in entry.get("top_logprobs") or []]
        out.append({"token": text, "logprob": entry.get("logprob", -9999.0), "bytes": raw, "top_logprobs": top})
    return out


def _check_derender_bounds(serving, responses: list[GenerateResponse]) -> None:
    """vLLM's _validate_derender_bounds: no decode work beyond what one request could have produced."""
    from minivllm.sampling_params import MAX_N_SEQUENCES

    if len(responses) > MAX_N_SEQUENCES:
        raise VLLMValidationError(f"generate_responses count ({len(responses)}) exceeds server maximum "
                                  f"({MAX_N_SEQUENCES}). Set VLLM_MAX_N_SEQUENCES to increase this limit.")
    for gen in responses:
        if len(gen.choices) > MAX_N_SEQUENCES:
            raise VLLMValidationError(f"choices count ({len(gen.choices)}) in response '{gen.request_id}' exceeds "
                                      f"server maximum ({MAX_N_SEQUENCES}).")
        for c in gen.choices:
            if c.token_ids and len(c.token_ids) > serving.max_model_len:
                raise VLLMValidationError(f"token_ids length ({len(c.token_ids)}) in choice {c.index} exceeds "
                                          f"max_model_len ({serving.max_model_len}).")


def _detokenize_delta(tokenizer, token_ids: list[int], state: DerenderStreamState, skip_special_tokens: bool
                      ) -> tuple[str, DerenderStreamState]:
    """vLLM's OnlineDerenderer._detokenize_delta: the text of a chunk's new tokens, resumed from the client's state.

    vLLM's slow incremental detokenizer (tokenizers/detokenizer_utils.py detokenize_incrementally) one token at a
    time: the text of tokens [prefix_offset:] minus that of [prefix_offset:read_offset] is what the new token
    added; nothing is emitted while it is shorter or ends in U+FFFD (a character still split across tokens). The
    window is then trimmed to what the next call still reads, and the offsets rebased to it."""
    prev, prefix, read = list(state.prev_tokens), state.prefix_offset, state.read_offset
    parts = []
    for tid in token_ids:
        new = tokenizer.convert_ids_to_tokens([tid], skip_special_tokens=skip_special_tokens) \
            if 0 <= tid < len(tokenizer) else [""]
        out = prev + ["" if t is None else t for t in new]
        prefix_text = tokenizer.convert_tokens_to_string(out[prefix:read])
        text = tokenizer.convert_tokens_to_string(out[prefix:])
        if len(text) > len(prefix_text) and not text.endswith("\ufffd"):
            parts.append(text[len(prefix_text):])
            prefix, read = read, len(out)
        prev = out
    return "".join(parts), state.model_copy(update={"prev_tokens": prev[prefix:], "prefix_offset": 0,
                                                    "read_offset": read - prefix})


def _stream_chunk(serving, req: DerenderStreamRequest, skip: bool, choice_fn, name: str, obj: str) -> dict:
    """One streamed derender answer: the chunk of the one choice in `req.generate_chunk` (vLLM threads one state
    through a chunk, so it refuses more than one) and the state the client passes to the next call."""
    from minivllm.entrypoints.openai.api_server import _usage, now

    serving.check_model(req.model)
    gen = req.generate_chunk
    if len(gen.choices) > 1:
        raise VLLMValidationError(f"{name} expects at most one choice per chunk")
    state, choices = req.stream_state or DerenderStreamState(), []
    for c in gen.choices:
        text, state = _detokenize_delta(serving.tokenizer, c.token_ids or [], state, skip)
        state, choice = choice_fn(c, text, state)
        choices.append(choice)
    usage = None
    if gen.usage is not None:
        usage = _usage(req.prompt_tokens if req.prompt_tokens is not None else gen.usage.prompt_tokens or 0,
                       gen.usage.completion_tokens or 0)
    return {"id": gen.request_id, "object": obj, "created": now(), "model": req.model, "choices": choices, "usage": usage,
            "system_fingerprint": None}, state


def _completion_stream_choice(c, text, state):
    return state, {"index": c.index, "text": text, "logprobs": None, "finish_reason": c.finish_reason,
                   "stop_reason": None, "prompt_token_ids": None, "token_ids": None}


def _chat_stream_choice(c, text, state):
    role = None if state.role_sent else "assistant"  # the role goes out once, on the first chunk with a choice
    return state.model_copy(update={"role_sent": True}), {
        "index": c.index, "delta": {"role": role, "content": text or None, "reasoning": None}, "logprobs": None,
        "finish_reason": c.finish_reason, "stop_reason": None, "token_ids": None}


async def derender_completion(serving, req: DerenderCompletionRequest | DerenderCompletionStreamRequest
                              ) -> JSONResponse:
    """vLLM's ServingDerender.derender_completion_response: each prompt's generated ids as a completion choice."""
    from minivllm.entrypoints.openai.api_server import _RESPONSE_EXTRAS, _TRANSFER_EXTRAS, _usage, now

    skip = req.completion_request.skip_special_tokens if req.completion_request is not None else True
    if isinstance(req, DerenderCompletionStreamRequest):
        chunk, state = _stream_chunk(serving, req, skip, _completion_stream_choice, "derender_completion_stream",
                                     "text_completion")
        return JSONResponse({"chunk": chunk | {"metrics": None},
                             "stream_state": state.model_dump()})
    serving.check_model(req.model)
    if not req.generate_responses:
        raise VLLMValidationError("generate_responses must not be empty")
    _check_derender_bounds(serving, req.generate_responses)
    tok = serving.tokenizer
    prompt_tokens = req.prompt_tokens or [0] * len(req.generate_responses)
    choices, n_gen = [], 0
    for gen in req.generate_responses:
        for c in gen.choices:
            if not c.token_ids:
                raise VLLMValidationError(f"choice {c.index} in response {gen.request_id} has empty or null "
                                          "token_ids")
            lp = None
            if c.logprobs is not None:
                entries, offset, lp = _resolve_logprobs(c.logprobs, tok), 0, {
                    "text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
                for e in entries:  # vLLM's _convert_chat_logprobs_to_completion_logprobs
                    lp["text_offset"].append(offset)
                    lp["tokens"].append(e["token"])
                    lp["token_logprobs"].append(e["logprob"])
                    lp["top_logprobs"].append({t["token"]: t["logprob"] for t in e["top_logprobs"]} or None)
                    offset += len(e["token"])
            choices.append({"index": len(choices), "text": tok.decode(c.token_ids, skip_special_tokens=skip),
                            "logprobs": lp, "finish_reason": c.finish_reason, "stop_reason": None,
                            "token_ids": None, "prompt_logprobs": None, "prompt_token_ids": None,
                            "routed_experts": None})
            n_gen += len(c.token_ids)
    first = req.generate_responses[0]
    return JSONResponse({"id": first.request_id, "object": "text_completion", "created": now(), "model": req.model,
                         "choices": choices} | _RESPONSE_EXTRAS | {"usage": _usage(sum(prompt_tokens), n_gen)}
                        | _TRANSFER_EXTRAS)


async def derender_chat(serving, req: DerenderChatRequest | DerenderChatStreamRequest) -> JSONResponse:
    """vLLM's ServingDerender.derender_chat_response, plain detokenization (minivllm's tool parser reads a chat
    request's own answer only)."""
    from minivllm.entrypoints.openai.api_server import (
        _MESSAGE_EXTRAS,
        _RESPONSE_EXTRAS,
        _TRANSFER_EXTRAS,
        _usage,
        error_response,
        now,
    )

    skip = req.chat_request.skip_special_tokens if req.chat_request is not None else True
    if isinstance(req, DerenderChatStreamRequest):
        serving.check_model(req.model)
        if serving.auto_tool_parser is not None:  # vLLM streams no parsed output yet and refuses rather than leak
            return error_response(501, "Streaming chat derender is not yet supported for models with a reasoning or "
                                  "tool parser configured. Use the non-streaming derender endpoint (stream=false) "
                                  "for parsed output.", "NotImplementedError")
        chunk, state = _stream_chunk(serving, req, skip, _chat_stream_choice, "derender_chat_stream",
                                     "chat.completion.chunk")
        return JSONResponse({"chunk": chunk | {
            "prompt_token_ids": None, "prompt_text": None, "metrics": None}, "stream_state": state.model_dump()})
    serving.check_model(req.model)
    gen = req.generate_response
    _check_derender_bounds(serving, [gen])
    tok = serving.tokenizer
    choices = []
    for c in gen.choices:
        if not c.token_ids:
            raise VLLMValidationError(f"choice {c.index} has empty or null token_ids")
        text = tok.decode(c.token_ids, skip_special_tokens=skip)
        choices.append({"index": c.index, "message": {"role": "assistant", "content": text} | _MESSAGE_EXTRAS,
                        "logprobs": {"content": _resolve_logprobs(c.logprobs, tok)} if c.logprobs is not None
                        else None, "finish_reason": c.finish_reason, "stop_reason": None, "token_ids": None,
                        "routed_experts": None})
    n_gen = sum(len(c.token_ids) for c in gen.choices)
    return JSONResponse({"id": gen.request_id, "object": "chat.completion", "created": now(), "model": req.model,
                         "choices": choices} | _RESPONSE_EXTRAS | {
        "usage": _usage(req.prompt_tokens or 0, n_gen), "prompt_logprobs": gen.prompt_logprobs,
        "prompt_token_ids": None, "prompt_text": None} | _TRANSFER_EXTRAS)
