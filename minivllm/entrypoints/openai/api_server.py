"""OpenAI-compatible server (vLLM: entrypoints/openai/api_server.py + serving_*.py), FastAPI over AsyncLLM.

Routes: /v1/completions, /v1/chat/completions (streaming as SSE `data: {...}` ... `data: [DONE]`),
/v1/models, /health and /ping (503 once the core is dead), /version, /load, /metrics (Prometheus text),
/tokenize, /detokenize, /v1/responses, the batch chat and SageMaker routes, tokens in / tokens out
(/v1/*/render, /inference/v1/generate: entrypoints/scale_out.py), Anthropic's /v1/messages (entrypoints/
anthropic.py), /generative_scoring and derender (streamed: one generate chunk per call, the detokenizer's window
carried by the client). Request and response fields, errors and routes answer as vLLM's server does, request for
request (tests/test_vllm_server_oracle.py against its recorded answers): errors are OpenAI-shaped,
{"error": {"message", "type", "param", "code"}}, with vLLM's types and params (a schema-level error is
"Bad Request" with param "body.<field>"); unknown routes get FastAPI's {"detail": ...}; a missing or wrong
API key on /v1/* gets 401 {"error": "Unauthorized"}; anything unexpected a logged 500 carrying a request id.
n > 1 fans out into n engine requests (vLLM's ParentRequest). A client
that disconnects has its request aborted in the core (streaming or not). Request bodies are capped
(413), and tokenization runs on a thread pool, so one huge prompt never stalls the event loop.

`minivllm serve` builds the config and starts the EngineCore before uvicorn, so a bad setting or a core that
fails to start is one line on stderr (StartupError / ValueError), not a lifespan traceback.
Lifecycle as vLLM's: when the EngineCore dies, in-flight streams get an error, /health answers 503 and
the server exits non-zero a moment later (for a supervisor to restart it). On SIGTERM it stops accepting,
gives in-flight requests a grace period, ends the rest with an error event, and exits 0.
"""
from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import logging
import os
import re
import signal
import sys
from collections.abc import AsyncGenerator, AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from functools import partial
from http import HTTPStatus
from types import SimpleNamespace

import anyio
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry
from prometheus_fastapi_instrumentator import Instrumentator
from pydantic import ValidationError
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

import minivllm
from minivllm.config import EngineArgs
from minivllm.engine import EngineCoreRequest
from minivllm.engine.async_llm import AsyncLLM
from minivllm.engine.exceptions import EngineDeadError, EngineGenerateError
from minivllm.engine.parallel_sampling import ParentRequest
from minivllm.entrypoints import anthropic, generative_scoring, scale_out, serve_dev
from minivllm.entrypoints.openai import responses, tool_calls
from minivllm.entrypoints.openai.metrics import HTTP_EXCLUDED_HANDLERS, PerfEstimate, PrometheusStatLogger
from minivllm.entrypoints.openai.protocol import (
    BatchChatCompletionRequest,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    now,
    random_id,
    tool_json_schema,
)
from minivllm.exceptions import StartupError, VLLMValidationError
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import SamplingParams
from minivllm.tokenizer import encode_truncated

logger = logging.getLogger("minivllm.api_server")
DEFAULT_MAX_REQUEST_BODY_BYTES = 8 << 20
VLLM_API_VERSION = "0.27.1"  # what /version answers, as the pinned vLLM's server does: a value, not a citation
# vLLM's FrontendArgs defaults: any origin, method and header; no credentials.
DEFAULT_CORS = {"allow_origins": ["*"], "allow_methods": ["*"], "allow_headers": ["*"], "allow_credentials": False}


def check_tool_args(tool_call_parser: str | None, enable_auto_tool_choice: bool) -> None:
    """vLLM's startup checks: auto tool choice needs a parser, and the parser must be one this server has."""
    if enable_auto_tool_choice and not tool_call_parser:
        raise ValueError("--enable-auto-tool-choice requires --tool-call-parser")
    if tool_call_parser is not None and tool_call_parser not in tool_calls.TOOL_CALL_PARSERS:
        raise ValueError(f"--tool-call-parser {tool_call_parser!r} is not available in minivllm; choose one of "
                         f"{', '.join(tool_calls.TOOL_CALL_PARSERS)}")

DEFAULT_CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant:{% endif %}")


# ---------------------------------------------------------------------------- errors
def error_response(status: int, message: str, err_type: str | None = None, param: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    err_type = err_type or HTTPStatus(status).phrase.replace(" ", "") + "Error"
    message = message.encode("utf-8", "backslashreplace").decode()  # text a client sent may not be UTF-8
    return JSONResponse({"error": {"message": message, "type": err_type, "param": param, "code": status}}, status,
                        headers=headers)


def stream_error(exc: BaseException) -> str:
    """The SSE event that ends a stream which failed after its 200 went out."""
    status = 503 if isinstance(exc, EngineDeadError) else 500
    if status == 500 and not isinstance(exc, EngineGenerateError):
        logger.error("stream failed", exc_info=exc)
    return sse({"error": {"message": str(exc), "type": type(exc).__name__, "param": None, "code": status}})


async def sse_body(events: AsyncIterator[str], gens: list) -> AsyncGenerator[str, None]:
    """A stream's SSE body: its events; an error event if they fail after the 200 went out; every engine request
    closed (aborted if unfinished, also when the client leaves); then `data: [DONE]`."""
    try:
        async for event in events:
            yield event
    except Exception as e:
        yield stream_error(e)
    finally:
        for g in gens:
            await g.aclose()
    yield "data: [DONE]\n\n"


class ModelNotFound(Exception):
    """A request named a model this server does not serve (vLLM: 404 NotFoundError, param "model")."""


class RequestTooLarge(StarletteHTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"The request body is larger than the server's limit of {limit} bytes "
                              f"(--max-request-body-bytes).")


class BodySizeLimitMiddleware:
    """413 for a body over max_bytes: at once from Content-Length, or as soon as a chunked body passes it."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            e = RequestTooLarge(self.max_bytes)
            return await error_response(413, e.detail)(scope, receive, send)
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise RequestTooLarge(self.max_bytes)
            return message
        await self.app(scope, limited_receive, send)


# pydantic-core's schema kinds in an error's loc, which vLLM's param leaves out (serve/utils/server_utils.py:440-473)
_LOC_TYPE_MARKERS = frozenset({
    "function-wrap", "function-after", "function-before", "function-plain", "json-or-python", "lax-or-strict",
    "chain", "default", "nullable", "tagged-union", "union", "call", "arguments", "is-instance", "is-subclass",
    "callable", "str", "int", "float", "bool", "bytes", "bytearray", "list", "tuple", "dict", "set", "frozenset",
    "complex", "none", "nonetype"})


def clean_loc_for_param(loc: tuple) -> str:
    """A pydantic error's loc as vLLM's `param` ("body.max_tokens"), without union-branch markers."""
    parts = [str(p) for p in loc if not (re.search(r"[\[\]{}()]", str(p)) or str(p).lower() in _LOC_TYPE_MARKERS)]
    return ".".join(parts or [str(p) for p in loc])


_MESSAGE_FIELD = re.compile(r"^(body\.messages\.\d+)\.(role|content|name)$")


def message_branch_param(param: str) -> str:
    """vLLM validates a message against a union of message types, so its param names the first branch
    (ChatCompletionDeveloperMessageParam); minivllm's one message model answers with the same spelling."""
    return _MESSAGE_FIELD.sub(r"\1.ChatCompletionDeveloperMessageParam.\2", param)


async def require_json(request: Request) -> None:
    """vLLM's validate_json_request: a POST body must say it is JSON (a 400 with param null otherwise)."""
    if request.headers.get("content-type", "").lower().split(";", 1)[0].strip() != "application/json":
        raise RequestValidationError(["Unsupported Media Type: Only 'application/json' is allowed"])


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        """vLLM's validation_exception_handler: type "Bad Request", param the failing field's dotted loc."""
        errs = exc.errors()
        ctx_errors = [(e.get("loc"), e.get("ctx", {}).get("error")) for e in errs if isinstance(e, dict)]
        checked = next((err for loc, err in ctx_errors if isinstance(err, VLLMValidationError) and loc == ("body",)),
                       None)
        if checked is not None:  # a whole-request check (vLLM's before-validators): its own type and param
            return error_response(400, str(checked), "BadRequestError", checked.parameter)
        param = next((err.parameter for _, err in ctx_errors if isinstance(err, VLLMValidationError)), None)
        if param is None and errs and isinstance(errs[0], dict) and errs[0].get("loc"):
            param = clean_loc_for_param(errs[0]["loc"])
            # a type error, not minivllm's own check (lone surrogates), in an OpenAI message (Anthropic's is one model)
            if errs[0].get("type") != "value_error" and not request.url.path.startswith("/v1/messages"):
                param = message_branch_param(param)
        msg = "; ".join(e if isinstance(e, str) else
                        f"{'.'.join(str(x) for x in e.get('loc', ()) if x != 'body') or 'body'}: {e.get('msg')}"
                        for e in errs[:5]) or "invalid request"
        return error_response(400, msg, HTTPStatus.BAD_REQUEST.phrase, param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_, exc: StarletteHTTPException):
        """FastAPI's own {"detail": ...} for unknown routes and methods, as vLLM leaves them."""
        if isinstance(exc, RequestTooLarge):
            return error_response(exc.status_code, str(exc.detail))
        return JSONResponse({"detail": exc.detail}, exc.status_code, headers=exc.headers)

    @app.exception_handler(ModelNotFound)
    async def model_not_found(_, exc: ModelNotFound):
        return error_response(404, str(exc), "NotFoundError", "model")

    @app.exception_handler(ValueError)
    async def value_error(_, exc: ValueError):
        return error_response(400, str(exc), "BadRequestError", getattr(exc, "parameter", None))

    @app.exception_handler(EngineDeadError)
    async def engine_dead(_, exc: EngineDeadError):
        return error_response(503, str(exc), "EngineDeadError")

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):
        """Anything unexpected (or a request the engine failed): a logged 500 whose id finds the log line."""
        rid = random_id("req")
        if not isinstance(exc, EngineGenerateError):
            logger.error("%s %s failed, request id %s", request.method, request.url.path, rid, exc_info=exc)
        return error_response(500, f"{exc} (request id {rid})" if isinstance(exc, EngineGenerateError) else
                              f"Internal server error ({type(exc).__name__}); request id {rid}",
                              "InternalServerError", headers={"X-Request-Id": rid})


# ---------------------------------------------------------------------------- streaming helpers
class CancellableStreamingResponse(StreamingResponse):
    """Always watch for http.disconnect and cancel the body iterator (so generate() aborts at once).

    Starlette skips the watcher for ASGI spec >= 2.4 and notices a gone client only at the next send.
    """

    async def __call__(self, scope, receive, send) -> None:
        try:
            async with anyio.create_task_group() as tg:
                async def wrap(func) -> None:
                    await func()
                    tg.cancel_scope.cancel()
                tg.start_soon(wrap, partial(self.stream_response, send))
                await wrap(partial(self.listen_for_disconnect, receive))
        except OSError:
            pass
        finally:
            if hasattr(self.body_iterator, "aclose"):
                await self.body_iterator.aclose()
            if self.background is not None:  # as StreamingResponse runs it, also after a disconnect
                await self.background()


async def with_cancellation(request: Request, coro):
    """Run a non-streaming handler; if the client disconnects first, cancel it (aborting its requests)."""
    handler = asyncio.ensure_future(coro)

    async def listen() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
    listener = asyncio.ensure_future(listen())
    done, _ = await asyncio.wait([handler, listener], return_when=asyncio.FIRST_COMPLETED)
    if handler in done:
        listener.cancel()
        return handler.result()
    handler.cancel()
    return Response(status_code=499)


async def merge_async_iterators(*iterators: AsyncIterator) -> AsyncGenerator[tuple[int, object], None]:
    """(index, item) from several async iterators as items arrive; closing this cancels them all."""
    if len(iterators) == 1:
        async for item in iterators[0]:
            yield 0, item
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def drain(i: int, it: AsyncIterator) -> None:
        try:
            async for item in it:
                await queue.put((i, item))
        except BaseException as e:
            await queue.put((i, e))
        finally:
            await queue.put((i, done))
    tasks = [asyncio.ensure_future(drain(i, it)) for i, it in enumerate(iterators)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def perf_estimate(vllm_config) -> PerfEstimate | None:
    """The estimated FLOPs/bytes counters' model shape, from the checkpoint's config.json (None: unreadable)."""
    try:
        with open(os.path.join(vllm_config.model_config.model, "config.json")) as f:
            cfg = json.load(f)
        dtype = str(vllm_config.model_config.dtype)
        if dtype == "auto":
            dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32")
        return PerfEstimate.from_hf_config(SimpleNamespace(**cfg), 2 if "16" in dtype else 4)
    except (OSError, ValueError, TypeError, AttributeError, ZeroDivisionError):
        return None


# ---------------------------------------------------------------------------- the server state
class OpenAIServing:
    """What every handler needs: the engine, the tokenizer, served names, metrics."""

    def __init__(self, engine: AsyncLLM, served_model_name: str, tool_call_parser: str | None = None,
                 enable_auto_tools: bool = False, structured_outputs_config: dict | None = None,
                 registry: CollectorRegistry | None = None) -> None:
        self.engine = engine
        self.structured_outputs_config = structured_outputs_config or {}
        self.tool_call_parser, self.enable_auto_tools = tool_call_parser, enable_auto_tools
        self.tokenizer = engine.get_tokenizer()
        self.model_name = served_model_name
        self.max_model_len = engine.vllm_config.scheduler_config.max_model_len
        self.stat_logger = PrometheusStatLogger(served_model_name, self.max_model_len,
                                                engine.vllm_config.cache_config, perf_estimate(engine.vllm_config),
                                                registry)
        engine.stat_loggers.append(self.stat_logger)
        # Tokenizing and chat templating run here, off the event loop (HF tokenizers release the GIL).
        self.tokenizer_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tokenizer")

    @property
    def auto_tool_parser(self) -> str | None:
        """The parser that reads calls the model chose to make: only with --enable-auto-tool-choice (as vLLM)."""
        return self.tool_call_parser if self.enable_auto_tools else None

    async def in_pool(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.tokenizer_pool, fn, *args)

    def check_context(self, num_prompt_tokens: int, max_tokens: int | None, field: str = "max_tokens") -> None:
        """vLLM's 400s when prompt + requested output cannot fit the context (max_tokens=None: whatever fits)."""
        if max_tokens is None:
            return
        if max_tokens > self.max_model_len:
            raise VLLMValidationError(f"{field}={max_tokens} cannot be greater than max_model_len="
                                      f"{self.max_model_len}. Please request fewer output tokens.", field, max_tokens)
        if num_prompt_tokens + max_tokens > self.max_model_len:
            raise VLLMValidationError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{max_tokens} output tokens and your prompt contains {num_prompt_tokens} input tokens, for a total "
                f"of {num_prompt_tokens + max_tokens} tokens. Please reduce the length of the input prompt or the "
                f"number of requested output tokens.", "input_tokens", num_prompt_tokens)

    def _process(self, request_id: str, prompt, params: SamplingParams, max_tokens: int | None,
                 field: str, truncate: int | None = None, add_special_tokens: bool = True,
                 truncation_side: str | None = None) -> tuple[str | None, EngineCoreRequest]:
        processor = self.engine.input_processor
        if truncate is not None and truncate > self.max_model_len:
            raise VLLMValidationError(f"truncate_prompt_tokens value ({truncate}) is greater than max_model_len "
                                      f"({self.max_model_len}). Please request a smaller truncation size.",
                                      "truncate_prompt_tokens", truncate)
        if isinstance(prompt, str) and max_tokens is not None and max_tokens < self.max_model_len and truncate is None:
            processor.check_text_len(prompt, self.max_model_len - max_tokens)
        if isinstance(prompt, str) and not add_special_tokens:
            processor.check_text_len(prompt)
            prompt = {"prompt": prompt, "prompt_token_ids": self.tokenizer.encode(prompt, add_special_tokens=False)}
        keep = None
        if truncate is not None:  # -1: as many as the context holds beside max_tokens (vLLM's max_input_tokens)
            keep = self.max_model_len - (max_tokens or 0) if truncate == -1 else truncate
        if isinstance(prompt, str) and keep and truncation_side is None:
            # vLLM hands this truncation to the tokenizer (renderers/base.py:479-481): the special tokens (BOS)
            # stay, so "ROMEO:" cut to 2 is [BOS, ":"], not ["ROMEO", ":"]
            processor.check_text_len(prompt)
            prompt = {"prompt": prompt,
                      "prompt_token_ids": encode_truncated(self.tokenizer, prompt, keep, add_special_tokens)}
        text, token_ids = processor.tokenize(prompt)
        if keep is not None:  # vLLM keeps the last tokens, or the first with truncation_side "right"
            token_ids = (token_ids[:keep] if truncation_side == "right" else token_ids[-keep:]) if keep else []
        self.check_context(len(token_ids), max_tokens, field)
        if len(token_ids) >= self.max_model_len:  # vLLM's engine-side check (echo with max_tokens 0 reaches it)
            raise VLLMValidationError(
                f"The decoder prompt (length {len(token_ids)}) plus the number of requested output tokens (at least 1) "
                f"is longer than the maximum model length of {self.max_model_len}. Make sure that `max_model_len` is no "
                f"smaller than the number of text tokens (prompt + requested output tokens).")
        return processor.process_inputs(request_id, {"prompt": text, "prompt_token_ids": token_ids}, params)

    async def process_inputs(self, request_id: str, prompt, params: SamplingParams, max_tokens: int | None,
                             field: str = "max_tokens", truncate: int | None = None,
                             add_special_tokens: bool = True,
                             truncation_side: str | None = None) -> tuple[str | None, EngineCoreRequest]:
        """Tokenize and validate on the pool: (prompt text, the EngineCoreRequest for AsyncLLM.generate)."""
        return await self.in_pool(self._process, request_id, prompt, params, max_tokens, field, truncate,
                                  add_special_tokens, truncation_side)

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise ModelNotFound(f"The model `{model}` does not exist.")

    def token_str(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def chat_prompt(self, messages: list[ChatMessage], add_generation_prompt: bool = True,
                    continue_final_message: bool = False, chat_template_kwargs: dict | None = None,
                    add_special_tokens: bool = False, documents: list | None = None) -> dict:
        """The chat template applied; text parts joined with "\\n" and any role passed through, as vLLM does.
        The request's own fields override chat_template_kwargs' keys of the same name (vLLM's build_chat_params
        and merge_kwargs, chat_completion/protocol.py:555-590, renderers/params.py:28-40)."""
        msgs = []
        for m in messages:
            content = m.content or ""
            if isinstance(content, dict) or (isinstance(content, list) and
                                             any(not isinstance(p, dict) for p in content)):
                raise ValueError("messages: content must be a string or a list of content parts (objects)")
            if isinstance(content, list):
                if any(p.get("type") != "text" for p in content):
                    raise ValueError("messages: only text content parts are supported")
                content = "\n".join(str(p.get("text", "")) for p in content)
            msgs.append({"role": m.role, "content": content})
        template = None if getattr(self.tokenizer, "chat_template", None) else DEFAULT_CHAT_TEMPLATE
        msgs = developer_as_system(msgs, template or self.tokenizer.chat_template)
        kwargs = (chat_template_kwargs or {}) | {"add_generation_prompt": add_generation_prompt,
                                                 "continue_final_message": continue_final_message}
        if documents is not None:
            kwargs["documents"] = documents
        kwargs = {k: v for k, v in kwargs.items() if k not in ("chat_template", "tokenize", "conversation")}
        text = self.tokenizer.apply_chat_template(msgs, chat_template=template, tokenize=False, **kwargs)
        self.engine.input_processor.check_text_len(text)
        return {"prompt": text, "prompt_token_ids": self.tokenizer.encode(text, add_special_tokens=add_special_tokens)}

    def logprob_token(self, token_id: int, logprob, as_ids: bool | None = False) -> str:
        """vLLM's _get_decoded_token (entrypoints/generate/base/serving.py:253-270): the engine's decoded token,
        which for a byte of a character split across tokens is '' until the token that completes it, then the
        whole character (LogprobsProcessor._verify_tokens, v1/engine/logprobs.py:249-346), so the tokens join to
        the text; the token decoded on its own (U+FFFD for such a byte) only where the engine gave none."""
        if as_ids:
            return token_id_placeholder(token_id)
        decoded = getattr(logprob, "decoded_token", None)
        return decoded if decoded is not None else self.token_str(token_id)

    def completion_logprobs(self, token_ids, logprobs, offset: int, num: int, as_ids: bool | None = False) -> dict | None:
        """OpenAI's completion logprobs; each position lists its token and its top `num` (vLLM's
        _create_completion_logprobs). A None entry is the prompt's first token, which has no logprob.
        as_ids (return_tokens_as_token_ids): tokens spelled "token_id:N", offsets counted over that text."""
        if logprobs is None:
            return None
        tokens, token_lps, tops, offsets = [], [], [], []
        for tok, lps in zip(token_ids, logprobs, strict=False):
            s = (token_id_placeholder(tok) if as_ids else self.token_str(tok)) if lps is None else \
                self.logprob_token(tok, lps.get(tok), as_ids)
            tokens.append(s)
            token_lps.append(None if lps is None else _finite(lps.get(tok)))
            tops.append(None if lps is None else {self.logprob_token(t, lp, as_ids): _finite(lp)
                                                  for t, lp in list(lps.items())[:num + 1]})
            offsets.append(offset)
            offset += len(s)
        return {"text_offset": offsets, "token_logprobs": token_lps, "tokens": tokens, "top_logprobs": tops}

    @staticmethod
    def prompt_logprobs_json(prompt_logprobs) -> list | None:
        """vLLM's prompt_logprobs: per prompt position, {token id: {logprob, rank, decoded_token}}."""
        if prompt_logprobs is None:
            return None
        return [None if d is None else {str(t): {"logprob": float(lp), "rank": lp.rank,
                                                 "decoded_token": lp.decoded_token} for t, lp in d.items()}
                for d in prompt_logprobs]

    def chat_logprobs(self, token_ids, logprobs, num: int, as_ids: bool | None = False) -> dict | None:
        """vLLM's _create_chat_logprobs (chat_completion/serving.py:1167-1230): tokens as logprob_token gives them
        ("token_id:N" with as_ids); the chosen token's bytes are its decoded text's, the top entries' bytes their
        token's."""
        if logprobs is None:
            return None
        content = []
        for tok, lps in zip(token_ids, logprobs, strict=False):
            chosen = lps.get(tok)
            decoded = getattr(chosen, "decoded_token", None)
            top = []
            for t, lp in list(lps.items())[:num]:
                name = self.logprob_token(t, lp, as_ids)
                top.append({"token": name, "logprob": _finite(lp), "bytes": list(name.encode("utf-8", "replace"))})
            content.append({"token": self.logprob_token(tok, chosen, as_ids), "logprob": _finite(chosen),
                            "bytes": list((self.token_str(tok) if decoded is None else decoded).encode(
                                "utf-8", "replace")),
                            "top_logprobs": top})
        return {"content": content}


def developer_as_system(msgs: list[dict], chat_template: str) -> list[dict]:
    """vLLM's rendering of `developer` messages for a chat template that never names that role: each becomes a
    `system` message, and the system messages are merged (non-empty contents joined by a blank line) into one at
    the front when one is not first or there are several (vllm/renderers/hf.py:720-728, with
    _detect_developer_role_support at 445-447, _convert_developer_to_system 450-462 and
    _consolidate_system_messages 465-502)."""
    if not any(m["role"] == "developer" for m in msgs) or \
            '"developer"' in chat_template or "'developer'" in chat_template:
        return msgs
    msgs = [m | {"role": "system"} if m["role"] == "developer" else m for m in msgs]
    system = [i for i, m in enumerate(msgs) if m["role"] == "system"]
    if system == [] or system == [0]:
        return msgs
    merged = {"role": "system", "content": "\n\n".join(msgs[i]["content"] for i in system if msgs[i]["content"])}
    return [merged, *(m for m in msgs if m["role"] != "system")]


def _finite(logprob):
    """vLLM's floor for logprobs (-inf, e.g. a token a constraint forbids, is not JSON)."""
    return logprob if logprob is None else max(float(logprob), -9999.0)


def token_id_placeholder(token_id: int) -> str:
    return f"token_id:{token_id}"


def _prompts(prompt) -> list:
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], int)):
        prompts = [prompt]
    elif isinstance(prompt, list) and not prompt:
        raise ValueError("prompt must not be empty")
    else:
        prompts = list(prompt)
    if any(isinstance(p, list) and not p for p in prompts):
        raise ValueError("a prompt of token ids must not be empty")
    if any(p == "" for p in prompts):
        raise VLLMValidationError("Prompt cannot be empty", "prompt")
    return prompts


def _usage(prompt_tokens: int, completion_tokens: int, details: bool = True) -> dict:
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
             "completion_tokens": completion_tokens}
    return usage | {"prompt_tokens_details": None} if details else usage


# Fields vLLM always writes (null unless a feature minivllm does not have is in use).
_RESPONSE_EXTRAS = {"service_tier": None, "system_fingerprint": None}
_TRANSFER_EXTRAS = {"kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}
_MESSAGE_EXTRAS = {"refusal": None, "annotations": None, "audio": None, "function_call": None, "reasoning": None}


async def start_children(serving: OpenAIServing, rid: str, prompts: list, params: SamplingParams, stream: bool,
                         max_tokens: int | None, field: str = "max_tokens", truncate: int | None = None,
                         add_special_tokens: bool = True, truncation_side: str | None = None) -> list[PrimedGenerate]:
    """One engine request per (prompt, sample): n > 1 fans out as vLLM's ParentRequest does (child i of a
    seeded request gets seed + i). All are validated and registered before a stream starts, so bad input
    is a 400, not a broken stream. Generator k answers choice k = prompt index * n + sample index."""
    processed = []
    for i, p in enumerate(prompts):
        parent = ParentRequest(f"{rid}-{i}" if len(prompts) > 1 else rid, params)
        for j in range(params.n):
            child_id, child_params = parent.get_child_info(j) if params.n > 1 else (parent.request_id, params)
            text, request = await serving.process_inputs(child_id, p, child_params, max_tokens, field, truncate,
                                                         add_special_tokens, truncation_side)
            processed.append((text, request, child_params))
    gens: list[PrimedGenerate] = []
    try:
        for text, request, child_params in processed:
            gens.append(PrimedGenerate(serving.engine.generate(request, child_params, request.request_id,
                                                               delta=stream, prompt_text=text)))
            await gens[-1].start()
    except BaseException:
        for g in gens:
            await g.aclose()
        raise
    return gens


async def finals_of(gens: list[PrimedGenerate]) -> list[RequestOutput]:
    finals: list = [None] * len(gens)
    try:
        async for i, out in merge_async_iterators(*[g.iterate() for g in gens]):
            finals[i] = out
    finally:
        for g in gens:
            await g.aclose()
    return finals


# ---------------------------------------------------------------------------- completions
def completion_params(serving: OpenAIServing, req: CompletionRequest, max_tokens: int | None) -> SamplingParams:
    """/v1/completions' request checks and its SamplingParams (/v1/completions/render runs the same front half)."""
    serving.check_model(req.model)
    if req.prompt_embeds:  # vLLM: an empty list is no embeds
        raise VLLMValidationError("You must set `--enable-prompt-embeds` to input `prompt_embeds`.", "prompt_embeds")
    if req.prompt is None:
        raise VLLMValidationError("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
    req.check_stream_options()
    check_unsupported(req)
    if req.suffix is not None:  # vLLM refuses any suffix, "" included
        raise ValueError("suffix is not supported")
    prompt_logprobs = req.prompt_logprobs if req.prompt_logprobs is not None or not req.echo else req.logprobs
    return req.to_sampling_params(max_tokens, req.logprobs, prompt_logprobs, serving.structured_outputs_config)


async def create_completion(serving: OpenAIServing, req: CompletionRequest, raw: Request):
    # vLLM: echo with max_tokens 0 generates one token it does not return (echo_without_generation).
    echo_only = bool(req.echo) and req.max_tokens == 0
    params = completion_params(serving, req, 1 if echo_only else req.max_tokens)
    prompts = _prompts(req.prompt)
    if (refusal := thinking_budget_refusal(req)) is not None:
        return refusal
    rid, created = random_id("cmpl"), now()
    gens = await start_children(serving, rid, prompts, params, bool(req.stream), req.max_tokens,
                                truncate=req.truncate_prompt_tokens, add_special_tokens=req.add_special_tokens,
                                truncation_side=req.truncation_side)
    # vLLM leaves the echoed prompt out of the text when return_token_ids is set: its ids are in prompt_token_ids
    # (vllm/entrypoints/openai/completion/serving.py:339-342 streamed, 530-532 not)
    echo_texts = [(p if isinstance(p, str) else serving.tokenizer.decode(p)) if req.echo and not req.return_token_ids
                  else "" for p in prompts]
    echo_texts = [t for t in echo_texts for _ in range(params.n)]
    if req.stream:
        return CancellableStreamingResponse(sse_body(_completion_stream(serving, req, gens, rid, created, echo_texts,
                                                                        params.n, echo_only), gens),
                                            media_type="text/event-stream")

    async def run():
        finals = await finals_of(gens)
        choices, n_prompt, n_gen = [], 0, 0
        for k, out in enumerate(finals):
            c = out.outputs[0]
            if k % params.n == 0:
                n_prompt += len(out.prompt_token_ids)
            n_gen += len(c.token_ids)
            text = echo_texts[k] if echo_only else echo_texts[k] + c.text
            pl = out.prompt_logprobs
            if req.echo and req.logprobs is not None:  # the prompt's logprobs come first, offsets from 0
                ids, lps = list(out.prompt_token_ids), list(pl or [])
                if not echo_only:
                    ids, lps = ids + list(c.token_ids), lps + list(c.logprobs or [])
                lp = serving.completion_logprobs(ids, lps, 0, req.logprobs, req.return_tokens_as_token_ids)
            else:
                lp = serving.completion_logprobs(c.token_ids, c.logprobs, len(echo_texts[k]), req.logprobs or 0,
                                                 req.return_tokens_as_token_ids)
            choices.append({"index": k, "text": text, "logprobs": lp, "finish_reason": c.finish_reason,
                            "stop_reason": c.stop_reason,
                            "token_ids": list(c.token_ids) if req.return_token_ids else None,
                            "prompt_logprobs": serving.prompt_logprobs_json(pl),
                            "prompt_token_ids": list(out.prompt_token_ids) if req.return_token_ids else None,
                            "routed_experts": None})
        return JSONResponse({"id": rid, "object": "text_completion", "created": created, "model": serving.model_name,
                             "choices": choices} | _RESPONSE_EXTRAS | {"usage": _usage(n_prompt, n_gen)}
                            | _TRANSFER_EXTRAS)
    return await with_cancellation(raw, run())


class PrimedGenerate:
    """A generate() run up to its first wait, so InputProcessor's ValueError raises before a stream starts."""

    def __init__(self, gen: AsyncGenerator) -> None:
        self.gen = gen
        self.first: asyncio.Future | None = None

    async def start(self) -> PrimedGenerate:
        self.first = asyncio.ensure_future(self.gen.__anext__())
        await asyncio.sleep(0)  # add_request runs synchronously up to the first output wait
        if self.first.done():
            self.first.result()
        return self

    async def iterate(self) -> AsyncGenerator[RequestOutput, None]:
        try:
            item = await self.first
        except StopAsyncIteration:
            return
        yield item
        async for item in self.gen:
            yield item

    async def aclose(self) -> None:
        if self.first is not None and not self.first.done():
            self.first.cancel()
            await asyncio.gather(self.first, return_exceptions=True)
        await self.gen.aclose()


def _stream_usage_flags(req) -> tuple[bool, bool]:
    so = req.stream_options
    include = bool(so and so.include_usage)
    return include, include and bool(so.continuous_usage_stats)


async def _completion_stream(serving, req, gens, rid, created, echo_texts, n, echo_only):
    include_usage, continuous = _stream_usage_flags(req)
    head = {"id": rid, "object": "text_completion", "created": created, "model": serving.model_name}
    n_prompt, n_gen = [0] * len(gens), [0] * len(gens)
    offsets = [0] * len(gens)  # vLLM counts the offsets of later chunks from the generated text alone
    first = [True] * len(gens)
    async for i, out in merge_async_iterators(*[g.iterate() for g in gens]):
        c = out.outputs[0]
        text = "" if echo_only else c.text
        prompt_ids = None
        if first[i]:
            first[i] = False
            n_prompt[i] = len(out.prompt_token_ids) if i % n == 0 else 0
            text = echo_texts[i] + text
            prompt_ids = list(out.prompt_token_ids) if req.return_token_ids or req.echo else None
        n_gen[i] += len(c.token_ids)
        if not text and not c.token_ids and not c.finish_reason:
            continue  # vLLM skips only a step with nothing in it: a token whose text is held back (a byte of
            # a split character, a stop string forming) still goes out, with its logprobs and ids
            # (completion/serving.py:366-377)
        if prompt_ids is not None and req.echo and req.logprobs is not None:  # first chunk: prompt + token
            ids, lps = list(out.prompt_token_ids), list(out.prompt_logprobs or [])
            if not echo_only:
                ids, lps = ids + list(c.token_ids), lps + list(c.logprobs or [])
            lp = serving.completion_logprobs(ids, lps, 0, req.logprobs, req.return_tokens_as_token_ids)
        else:
            lp = None if echo_only else serving.completion_logprobs(c.token_ids, c.logprobs, offsets[i],
                                                                    req.logprobs or 0, req.return_tokens_as_token_ids)
        offsets[i] += len(c.text)
        chunk = head | {"choices": [{"index": i, "text": text, "logprobs": lp, "finish_reason": c.finish_reason,
                                     "stop_reason": c.stop_reason, "prompt_token_ids": prompt_ids,
                                     "token_ids": list(c.token_ids) if req.return_token_ids else None}]}
        if continuous:
            chunk["usage"] = _usage(n_prompt[i], n_gen[i], details=False)
        yield sse(chunk)
    if include_usage:
        yield sse(head | {"choices": [], "usage": _usage(sum(n_prompt), sum(n_gen), details=False)})


# ---------------------------------------------------------------------------- chat
def check_generation_prompt(req) -> None:
    """vLLM's check_generation_prompt, for chat completions and /tokenize alike."""
    if req.continue_final_message and req.add_generation_prompt:
        raise ValueError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")


def thinking_budget_refusal(req) -> StreamingResponse | None:
    """vLLM's InputProcessor refuses a thinking_token_budget (-1 is none) without a reasoning config, which minivllm
    has no way to give (v1/engine/input_processor.py:111-119). It checks while adding the request to the engine,
    so a streamed request gets its 200 and then the error event; a non-streamed one raises (a 400)."""
    if req.thinking_token_budget is None or req.thinking_token_budget == -1:
        return None
    err = VLLMValidationError("thinking_token_budget is set but reasoning_config is not configured. Please set "
                              "--reasoning-parser and/or --reasoning-config to use thinking_token_budget.")
    if not req.stream:
        raise err

    async def events():
        yield sse({"error": {"message": str(err), "type": "BadRequestError", "param": None, "code": 400}})
        yield "data: [DONE]\n\n"
    return StreamingResponse(events(), media_type="text/event-stream")


def check_unsupported(req) -> None:
    """Fields minivllm cannot honour yet: a clear 400 rather than an answer that ignores them."""
    if req.logprob_token_ids:
        raise VLLMValidationError("logprob_token_ids is not supported by minivllm yet (the sampler returns the "
                                  "top-k logprobs only); use logprobs / top_logprobs", "logprob_token_ids")


def _check_chat_request(serving: OpenAIServing, req: ChatCompletionRequest) -> None:
    """vLLM's 400s for chat options this server cannot honour or that contradict each other."""
    req.check_stream_options()
    check_unsupported(req)
    if not req.messages:
        raise ValueError("messages must not be empty")
    if req.top_logprobs and not req.logprobs:
        raise VLLMValidationError("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs")
    check_generation_prompt(req)
    check_request_chat_template(req)
    if req.tool_choice not in (None, "none") and serving.tool_call_parser is None:  # vLLM's online_renderer
        if req.tool_choice == "auto":
            raise ValueError('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set')
        desc = f'function "{req.tool_choice.function.name}"' if req.forced_tool and req.tool_choice != "required" \
            else f'"{req.tool_choice}"'
        raise ValueError(f"tool_choice={desc} requires --tool-call-parser to be set")
    schema = tool_json_schema(req.tool_choice, req.tools) if req.forced_tool else None
    if schema is not None:  # vLLM's ToolParser.adjust_request: the tool's schema replaces any other constraint
        req.structured_outputs, req.response_format = {"json": schema}, None


def check_request_chat_template(req) -> None:
    """vLLM's validate_chat_template (renderers/online_renderer.py:310-329): a template in the request, or in its
    chat_template_kwargs, is refused without --trust-request-chat-template (which minivllm does not have)."""
    kwargs = req.chat_template_kwargs
    if getattr(req, "chat_template", None) is not None or (kwargs and kwargs.get("chat_template") is not None):
        raise ValueError("Chat template is passed with request, but --trust-request-chat-template is not set. "
                         "Refused request with untrusted chat template.")


async def create_batch_chat_completion(serving: OpenAIServing, req: BatchChatCompletionRequest, raw: Request):
    """Each conversation as a chat completion of its own (in turn); the first error answers for the batch."""
    choices, usage, first = [], {"prompt_tokens": 0, "total_tokens": 0, "completion_tokens": 0}, None
    for k, conv in enumerate(req.conversations()):
        # vLLM's batch echo (batch_serving.py:289-298): the last message's text before the reply, whatever its role
        echo, conv.echo = conv.echo, False
        response = await create_chat_completion(serving, conv, raw)
        if response.status_code != 200:
            return response
        body = json.loads(response.body)
        first = first or body
        for c in body["choices"]:
            if echo:
                last = conv.messages[-1].content or ""
                last = last if isinstance(last, str) else "\n".join(p.get("text", "") for p in last)
                c["message"]["content"] = last + (c["message"]["content"] or "")
            choices.append(c | {"index": k})
        for key in usage:
            usage[key] += body["usage"][key]
    # vLLM's batch answer carries no prompt logprobs, ids or text
    return JSONResponse(first | {"id": random_id("chatcmpl"), "choices": choices, "usage": usage | {
        "prompt_tokens_details": None}, "prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None})


async def chat_inputs(serving: OpenAIServing, req: ChatCompletionRequest
                      ) -> tuple[SamplingParams, dict, int | None, str]:
    """/v1/chat/completions' request checks, SamplingParams and templated prompt (/v1/chat/completions/render runs
    the same front half): (params, prompt, max_tokens, the field max_tokens came from)."""
    serving.check_model(req.model)
    _check_chat_request(serving, req)
    num_lp = (req.top_logprobs or 0) if req.logprobs else None
    max_tokens = req.max_completion_tokens or req.max_tokens
    # vLLM: echo reports the prompt's logprobs (top_logprobs of them) unless prompt_logprobs says otherwise
    prompt_logprobs = req.prompt_logprobs if req.prompt_logprobs is not None or not req.echo else req.top_logprobs
    params = req.to_sampling_params(max_tokens, num_lp, prompt_logprobs, serving.structured_outputs_config)
    prompt = await serving.in_pool(serving.chat_prompt, req.messages, req.add_generation_prompt,
                                   req.continue_final_message, req.chat_template_kwargs, req.add_special_tokens,
                                   req.documents)
    return params, prompt, max_tokens, "max_completion_tokens" if req.max_completion_tokens else "max_tokens"


async def create_chat_completion(serving: OpenAIServing, req: ChatCompletionRequest, raw: Request):
    params, prompt, max_tokens, field = await chat_inputs(serving, req)
    num_lp = params.logprobs  # the top_logprobs count, None without logprobs
    # vLLM's get_chat_request_role: the reply speaks as the assistant only when the prompt asks for one.
    role = "assistant" if req.add_generation_prompt else req.messages[-1].role
    # vLLM's echo: the reply starts with the last message's content when that message speaks as the reply does
    last = req.messages[-1]
    echo_text = ""
    if req.echo and last.role == role and last.content:
        echo_text = last.content if isinstance(last.content, str) else \
            "\n".join(str(p.get("text", "")) for p in last.content if p.get("type") == "text")
    if (refusal := thinking_budget_refusal(req)) is not None:
        return refusal
    rid, created = random_id("chatcmpl"), now()
    gens = await start_children(serving, rid, [prompt], params, bool(req.stream), max_tokens, field,
                                truncate=req.truncate_prompt_tokens, truncation_side=req.truncation_side)
    if req.stream:
        return CancellableStreamingResponse(sse_body(_chat_stream(serving, req, gens, rid, created, num_lp or 0, role,
                                                                  echo_text), gens),
                                            media_type="text/event-stream")

    async def run():
        finals = await finals_of(gens)
        choices, n_gen = [], 0
        for k, out in enumerate(finals):
            c = out.outputs[0]
            n_gen += len(c.token_ids)
            message, calls = tool_calls.message(req, role, c.text, serving.auto_tool_parser)
            if echo_text and message["content"] is not None:
                message["content"] = echo_text + message["content"]
            choices.append({"index": k, "message": _MESSAGE_EXTRAS | message,
                            "logprobs": serving.chat_logprobs(c.token_ids, c.logprobs, num_lp or 0, req.return_tokens_as_token_ids),
                            "finish_reason": tool_calls.finish_reason(req, calls, c.finish_reason),
                            "stop_reason": c.stop_reason,
                            "token_ids": list(c.token_ids) if req.return_token_ids else None,
                            "routed_experts": None})
        ids = finals[0].prompt_token_ids
        return JSONResponse({"id": rid, "object": "chat.completion", "created": created, "model": serving.model_name,
                             "choices": choices} | _RESPONSE_EXTRAS | {
            "usage": _usage(len(ids), n_gen), "prompt_logprobs": serving.prompt_logprobs_json(finals[0].prompt_logprobs),
            "prompt_token_ids": list(ids) if req.return_token_ids else None,
            "prompt_text": prompt["prompt"] if req.return_prompt_text else None}
                            | _TRANSFER_EXTRAS)
    return await with_cancellation(raw, run())


async def _chat_stream(serving, req, gens, rid, created, num_lp, role, echo_text=""):
    include_usage, continuous = _stream_usage_flags(req)
    head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": serving.model_name}
    n_prompt, n_gen = 0, [0] * len(gens)
    first = [True] * len(gens)
    tools = [tool_calls.StreamState(req, serving.auto_tool_parser) for _ in gens]
    async for i, out in merge_async_iterators(*[g.iterate() for g in gens]):
        c = out.outputs[0]
        n_prompt = len(out.prompt_token_ids)
        if first[i]:
            first[i] = False
            chunk = head | {"choices": [{"index": i, "delta": {"role": role, "content": ""}, "logprobs": None,
                                         "finish_reason": None}],
                            "prompt_token_ids": list(out.prompt_token_ids) if req.return_token_ids else None,
                            "prompt_text": out.prompt if req.return_prompt_text else None}
            if continuous:
                chunk["usage"] = _usage(n_prompt, 0, details=False)
            yield sse(chunk)
            if echo_text:
                yield sse(head | {"choices": [{"index": i, "delta": {"content": echo_text}, "logprobs": None,
                                               "finish_reason": None}]})
        n_gen[i] += len(c.token_ids)
        if not c.text and not c.token_ids and not c.finish_reason and not req.forced_tool:
            continue  # as vLLM (chat_completion/serving.py:604-610): a token with no text yet still goes out
        delta = tools[i].delta(c.text, c.finish_reason is not None)
        if delta is None and c.finish_reason is None:
            continue
        reason = tools[i].finish_reason(c.finish_reason)
        choice = {"index": i, "delta": delta or {},
                  "logprobs": serving.chat_logprobs(c.token_ids, c.logprobs, num_lp, req.return_tokens_as_token_ids),
                  "finish_reason": reason}
        if c.finish_reason is not None:
            choice["stop_reason"] = c.stop_reason
        choice["token_ids"] = list(c.token_ids) if req.return_token_ids else None
        chunk = head | {"choices": [choice]}
        if continuous:
            chunk["usage"] = _usage(n_prompt, n_gen[i], details=False)
        yield sse(chunk)
    if include_usage:
        yield sse(head | {"choices": [], "usage": _usage(n_prompt, sum(n_gen), details=False)})


# ---------------------------------------------------------------------------- the app
async def watch_engine(app: FastAPI, exit_delay: float) -> None:
    """vLLM's terminate_if_errored: once the core is dead, let streams deliver their errors, then exit 1."""
    engine = app.state.serving.engine
    while not engine.errored:
        await asyncio.sleep(0.1)
    logger.error("EngineCore died; the server exits in %.1f s (status 1) so a supervisor can restart it", exit_delay)
    await asyncio.sleep(exit_delay)
    app.state.exit_code = 1
    server = getattr(app.state, "server", None)
    if server is not None:
        server.should_exit = True


def _authorized(header: str, api_key: str) -> bool:
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())


def build_app(engine_args: EngineArgs, served_model_name: str | None = None, api_key: str | None = None,
              engine: AsyncLLM | None = None, max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES,
              dead_engine_exit_delay: float = 1.0, enable_server_load_tracking: bool = False,
              tool_call_parser: str | None = None, enable_auto_tool_choice: bool = False,
              cors: dict | None = None, structured_outputs_config: dict | None = None) -> FastAPI:
    """The FastAPI app; the AsyncLLM (and its EngineCore process) starts in the app's lifespan. `cors`: Starlette
    CORSMiddleware's allow_* settings (vLLM's --allowed-origins etc.; default: everything, as vLLM)."""
    name = served_model_name or os.path.basename(os.path.normpath(engine_args.model))
    check_tool_args(tool_call_parser, enable_auto_tool_choice)
    so_config = dict(structured_outputs_config or {})
    if so_config.pop("backend", "xgrammar") not in ("xgrammar", "auto"):
        raise ValueError("--structured-outputs-config: minivllm's only backend is xgrammar")
    if set(so_config) - {"disable_any_whitespace"}:
        raise ValueError(f"--structured-outputs-config: minivllm has only backend and disable_any_whitespace, not "
                         f"{sorted(set(so_config) - {'disable_any_whitespace'})}")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        eng = engine or AsyncLLM.from_engine_args(engine_args)
        app.state.serving = OpenAIServing(eng, name, tool_call_parser, enable_auto_tool_choice, so_config,
                                          registry)
        app.state.exit_code = 0
        watchdog = asyncio.ensure_future(watch_engine(app, dead_engine_exit_delay))
        try:
            yield
        finally:
            watchdog.cancel()
            app.state.serving.tokenizer_pool.shutdown(wait=False, cancel_futures=True)
            if engine is None:
                eng.shutdown()

    app = FastAPI(title="minivllm OpenAI-compatible server", lifespan=lifespan)
    app.state.server_load_metrics = 0  # requests in /v1/completions and /v1/chat/completions, if tracked
    install_error_handlers(app)
    app.add_middleware(CORSMiddleware, **(DEFAULT_CORS | (cors or {})))  # first, so inside the API-key check
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=max_request_body_bytes)
    registry = CollectorRegistry()  # the app's own: the HTTP families here, the engine's from the stat logger
    Instrumentator(excluded_handlers=HTTP_EXCLUDED_HANDLERS, registry=registry).add().instrument(app)

    if api_key:
        @app.middleware("http")
        async def authentication(request: Request, call_next):
            """vLLM's AuthenticationMiddleware: /v1/* needs the key (other routes, /tokenize included, do not)."""
            if request.method != "OPTIONS" and request.url.path.startswith("/v1") and \
                    not _authorized(request.headers.get("Authorization", ""), api_key):
                return JSONResponse({"error": "Unauthorized"}, 401)
            return await call_next(request)

    def serving(request: Request) -> OpenAIServing:
        return request.app.state.serving

    @app.get("/health")
    async def health(request: Request):
        if serving(request).engine.errored:
            return error_response(503, "EngineCore is dead", "EngineDeadError")
        return Response(status_code=200)

    @app.api_route("/ping", methods=["GET", "POST"])
    async def ping(request: Request):
        """SageMaker's liveness route, as vLLM serves it: /health under another name."""
        return await health(request)

    @app.get("/version")
    async def version():
        """The vLLM version whose API this server answers like (clients test it for features), and minivllm's."""
        return {"version": VLLM_API_VERSION, "minivllm_version": minivllm.__version__}

    @app.get("/v1/models")
    async def models(request: Request):
        s = serving(request)
        permission = {"id": random_id("modelperm"), "object": "model_permission", "created": now(),
                      "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                      "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                      "organization": "*", "group": None, "is_blocking": False}
        return {"object": "list", "data": [{"id": s.model_name, "object": "model", "created": now(),
                                            "owned_by": "minivllm", "root": engine_args.model, "parent": None,
                                            "max_model_len": s.max_model_len, "permission": [permission]}]}

    @app.get("/load")
    async def load(request: Request):
        """vLLM's server-load counter: 0 unless the server runs with --enable-server-load-tracking."""
        return {"server_load": request.app.state.server_load_metrics}

    async def load_aware(request: Request, handler):
        """vLLM's load_aware_call: count the request until its answer (a stream: its last byte) is sent."""
        if not enable_server_load_tracking:
            return await handler
        state = request.app.state
        state.server_load_metrics += 1
        try:
            response = await handler
        except BaseException:
            state.server_load_metrics -= 1
            raise
        if isinstance(response, StreamingResponse):
            response.background = BackgroundTask(_decrement_load, state)
        else:
            state.server_load_metrics -= 1
        return response

    json_only = [Depends(require_json)]

    @app.post("/v1/completions", dependencies=json_only)
    async def completions(req: CompletionRequest, request: Request):
        return await load_aware(request, create_completion(serving(request), req, request))

    @app.post("/v1/chat/completions", dependencies=json_only)
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        return await load_aware(request, create_chat_completion(serving(request), req, request))

    @app.post("/v1/responses", dependencies=json_only)
    async def create_response(req: responses.ResponsesRequest, request: Request):
        return await load_aware(request, responses.create_responses(serving(request), req, request))

    @app.post("/v1/chat/completions/batch", dependencies=json_only)
    async def batch_chat_completions(req: BatchChatCompletionRequest, request: Request):
        """vLLM's batch route: one choice per conversation, each run as its own chat completion."""
        return await load_aware(request, create_batch_chat_completion(serving(request), req, request))

    @app.post("/v1/completions/render", dependencies=json_only)
    async def render_completion(req: CompletionRequest, request: Request):
        return await scale_out.render_completion(serving(request), req)

    @app.post("/v1/chat/completions/render", dependencies=json_only)
    async def render_chat(req: ChatCompletionRequest, request: Request):
        return await scale_out.render_chat(serving(request), req)

    @app.post("/v1/completions/derender", dependencies=json_only)
    async def derender_completion(req: scale_out.DerenderCompletionRequest | scale_out.DerenderCompletionStreamRequest,
                                  request: Request):
        return await scale_out.derender_completion(serving(request), req)

    @app.post("/v1/chat/completions/derender", dependencies=json_only)
    async def derender_chat(req: scale_out.DerenderChatRequest | scale_out.DerenderChatStreamRequest,
                            request: Request):
        return await scale_out.derender_chat(serving(request), req)

    @app.post("/inference/v1/generate", dependencies=json_only)
    async def generate_tokens(req: scale_out.GenerateRequest, request: Request):
        return await load_aware(request, scale_out.generate(serving(request), req, request))

    @app.post("/v1/messages", dependencies=json_only)
    async def messages(req: anthropic.AnthropicMessagesRequest, request: Request):
        return await load_aware(request, anthropic.create_messages(serving(request), req, request))

    @app.post("/v1/messages/count_tokens", dependencies=json_only)
    async def count_tokens(req: anthropic.AnthropicCountTokensRequest, request: Request):
        return await anthropic.count_tokens(serving(request), req)

    @app.get("/v1/responses/{response_id}")
    async def retrieve_response(response_id: str):
        """Nothing is stored (vLLM's store is off unless VLLM_ENABLE_RESPONSES_API_STORE=1): every id is unknown."""
        return error_response(404, f"Response with id '{response_id}' not found.", "invalid_request_error",
                              "response_id")

    @app.post("/generative_scoring", dependencies=json_only)
    async def generative_scoring_route(request: Request):
        return await load_aware(request, generative_scoring.create_generative_scoring(serving(request), request))

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(response_id: str):
        return await retrieve_response(response_id)

    @app.post("/scale_elastic_ep", dependencies=json_only)
    async def scale_elastic_ep(request: Request):
        """vLLM's checks, then its answer for a server that cannot scale (no elastic expert parallelism)."""
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return error_response(400, "Invalid JSON format", HTTPStatus.BAD_REQUEST.phrase)
        size, drain = body.get("new_data_parallel_size"), body.get("drain_timeout", 120)
        if size is None:
            return error_response(400, "new_data_parallel_size is required", HTTPStatus.BAD_REQUEST.phrase)
        if not isinstance(size, int) or size <= 0:
            return error_response(400, "new_data_parallel_size must be a positive integer",
                                  HTTPStatus.BAD_REQUEST.phrase)
        if not isinstance(drain, int) or drain <= 0:
            return error_response(400, "drain_timeout must be a positive integer", HTTPStatus.BAD_REQUEST.phrase)
        logger.error("Scale failed: minivllm has no elastic expert parallelism")
        return error_response(500, "Scale failed", HTTPStatus.INTERNAL_SERVER_ERROR.phrase)

    @app.post("/is_scaling_elastic_ep")
    async def is_scaling_elastic_ep():
        return {"is_scaling_elastic_ep": False}

    @app.post("/invocations", dependencies=json_only)
    async def invocations(request: Request):
        """SageMaker's route, as vLLM serves it: the body's own shape picks chat or completions."""
        body = await request.json()
        for model, create in ((ChatCompletionRequest, create_chat_completion), (CompletionRequest, create_completion)):
            try:
                req = model.model_validate(body)
            except (ValidationError, ValueError):
                continue
            return await load_aware(request, create(serving(request), req, request))
        return error_response(400, "Cannot find suitable handler for request. Expected one of: "
                                   "['ChatCompletionRequest', 'CompletionRequest']")

    @app.post("/tokenize", dependencies=json_only)
    async def tokenize(req: TokenizeRequest, request: Request):
        """vLLM's two request kinds: chat (messages, when no prompt is given) or completion (prompt)."""
        s = serving(request)
        s.check_model(req.model)
        if req.messages is not None:
            check_generation_prompt(req)
            check_request_chat_template(req)
            tokens = (await s.in_pool(s.chat_prompt, req.messages, req.add_generation_prompt,
                                      req.continue_final_message, req.chat_template_kwargs,
                                      bool(req.add_special_tokens)))["prompt_token_ids"]
        elif req.prompt is None:
            raise RequestValidationError([{"type": "missing", "loc": ("body", "prompt"), "msg": "Field required",
                                           "input": None}])
        else:
            tokens = await s.in_pool(partial(s.tokenizer.encode, req.prompt,
                                             add_special_tokens=req.add_special_tokens is not False))
        strs = s.tokenizer.convert_ids_to_tokens(tokens) if req.return_token_strs else None
        return {"count": len(tokens), "max_model_len": s.max_model_len, "tokens": tokens, "token_strs": strs}

    @app.post("/detokenize", dependencies=json_only)
    async def detokenize(req: DetokenizeRequest, request: Request):
        s = serving(request)
        s.check_model(req.model)
        return {"prompt": await s.in_pool(s.tokenizer.decode, [t for t in req.tokens if t < len(s.tokenizer)])}

    # vLLM mounts prometheus' app, which takes either method; its OpenAPI description lists GET only
    @app.get("/metrics")
    @app.post("/metrics", include_in_schema=False)
    async def metrics(request: Request):
        s = serving(request)
        stats = None
        if not s.engine.errored:
            try:
                stats = await asyncio.wait_for(s.engine.get_stats(), 2.0)
            except (asyncio.TimeoutError, EngineDeadError):
                stats = None
        return PlainTextResponse(s.stat_logger.render(stats), media_type=CONTENT_TYPE_LATEST)

    if serve_dev.dev_mode_enabled():  # VLLM_SERVER_DEV_MODE=1: vLLM's development routes (entrypoints/serve_dev.py)
        serve_dev.attach_router(app)
    return app


def run_server(args: argparse.Namespace, engine_args: EngineArgs) -> int:
    """Serve until SIGTERM/SIGINT (exit status 0) or the core's death (1)."""
    grace = getattr(args, "shutdown_grace_period", 5.0)
    engine = start_engine(engine_args)  # before uvicorn: a bad setting is one line, not a lifespan traceback
    try:
        return _serve(args, engine_args, engine, grace)
    finally:
        engine.shutdown()


def _decrement_load(state) -> None:
    state.server_load_metrics -= 1


def start_engine(engine_args: EngineArgs) -> AsyncLLM:
    """The config (ValueError naming the setting), then the EngineCore; a failed start is a one-line
    StartupError carrying the core's own last error line (its traceback is in the core's log)."""
    from minivllm.engine.core import make_vllm_config
    vllm_config = make_vllm_config(engine_args)
    try:
        return AsyncLLM(vllm_config)
    except (RuntimeError, TimeoutError) as e:
        lines = [line for line in str(e).splitlines() if line.strip()]
        raise StartupError(f"{lines[0].rstrip(':')}: {lines[-1]}" if len(lines) > 1 else str(e)) from None


def _serve(args: argparse.Namespace, engine_args: EngineArgs, engine: AsyncLLM, grace: float) -> int:
    import uvicorn

    app = build_app(engine_args, args.served_model_name, args.api_key, engine=engine,
                    max_request_body_bytes=getattr(args, "max_request_body_bytes", DEFAULT_MAX_REQUEST_BODY_BYTES),
                    enable_server_load_tracking=getattr(args, "enable_server_load_tracking", False),
                    tool_call_parser=getattr(args, "tool_call_parser", None),
                    enable_auto_tool_choice=getattr(args, "enable_auto_tool_choice", False),
                    structured_outputs_config=getattr(args, "structured_outputs_config", None),
                    cors={"allow_origins": getattr(args, "allowed_origins", ["*"]),
                          "allow_methods": getattr(args, "allowed_methods", ["*"]),
                          "allow_headers": getattr(args, "allowed_headers", ["*"]),
                          "allow_credentials": getattr(args, "allow_credentials", False)})

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            """Listening sockets close first (uvicorn); after the grace period, streams still open end with an
            error event, so they finish before uvicorn's own (longer) timeout would cut them silently."""
            timer = asyncio.get_running_loop().call_later(grace, end_streams)
            try:
                await super().shutdown(sockets)
            finally:
                timer.cancel()

    def end_streams() -> None:
        serving = getattr(app.state, "serving", None)
        if serving is not None and serving.engine.output_processor.request_states:
            ids = list(serving.engine.output_processor.request_states)
            logger.warning("shutting down: %d request(s) unfinished after the %.1f s grace period", len(ids), grace)
            serving.engine.output_processor.propagate_error(EngineDeadError(
                f"The server is shutting down; this request did not finish within the {grace:.0f} s grace period."))
            if not serving.engine.errored:
                serving.engine.engine_core.abort_requests(ids)

    server = Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.uvicorn_log_level,
                                   timeout_graceful_shutdown=grace + 5))
    app.state.server = server
    # uvicorn re-raises the SIGTERM/SIGINT it handled once it has shut down; a finished graceful shutdown
    # is a clean exit (0), not death by signal.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(getattr(app.state, "exit_code", 0)))
    server.run()
    return getattr(app.state, "exit_code", 0)
