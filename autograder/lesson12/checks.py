"""Lesson 12 — 前端与在线服务: the checks behind the grade cells, and the plug into the real frontend.

The student writes `StreamingDetokenizer(tokenizer, params, prompt_token_ids)` with `update(new_token_ids,
stop_terminated) -> stop string | None` and `get_next_output_text(finished, delta) -> str` (the interface of
minivllm's IncrementalDetokenizer, vLLM's BaseIncrementalDetokenizer), and `abort_stream(engine, request_id)`,
the path AsyncLLM takes when a stream is cancelled (client disconnect).

    check_main_path(cls, abort)   OutputProcessor (real) with cls: deltas of a Shakespeare text in uneven
                                  token groups concatenate to the whole text; a stop string split across
                                  tokens never shows in any delta and nothing after it is kept; Chinese and
                                  emoji, one byte token at a time, never yield U+FFFD
    check_real_server(cls, abort) a real server (uvicorn on loopback in a thread, its EngineCore in its own
                                  process) with cls plugged in, driven by the openai client: streamed deltas
                                  concatenated equal the non-streamed text; with a stop string taken from
                                  that text, no chunk holds it and the stream ends right before it
    check_boundary(cls, abort)    a stop string in the first token; a held-back prefix that never completes
                                  (flushed at the end); no stop strings; and a client that disconnects
                                  mid-stream frees its KV blocks (read from /metrics)
    check_source_map(SOURCE_MAP)

`plugged(cls, abort)` replaces the name IncrementalDetokenizer in minivllm.engine.output_processor and
AsyncLLM._abort for its duration; the server (shared by the checks of one process) is started lazily.
"""
from __future__ import annotations

import asyncio
import atexit
import contextlib
import hashlib
import random
import re
import socket
import threading
import time

import httpx

from autograder.common import REPO, BlankNotFilled, CheckFailed, Lesson, Part, check_name_map, expect

DEFAULT_MODEL = str(REPO / "data" / "models" / "shakespeare-llama")
NAME = "shakespeare"
REPLACEMENT = "\ufffd"
TEXT = ("ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n"
        "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?")
MULTIBYTE = "你好，世界！😀 café — naïve 日本語"
SERVER_PROMPT = "ROMEO:"
ENGINE = dict(device="cpu", attention_backend="torch", max_num_seqs=16, max_model_len=1024)


# ---------------------------------------------------------------------------- the plug
@contextlib.contextmanager
def plugged(cls, abort_fn):
    """The frontend's detokenizer and its abort path are the student's while inside."""
    import minivllm.engine.output_processor as op
    from minivllm.engine.async_llm import AsyncLLM
    old_cls, old_abort = op.IncrementalDetokenizer, AsyncLLM._abort

    def _abort(self, request_id):
        for rid in [request_id] if isinstance(request_id, str) else list(request_id):
            abort_fn(self, rid)

    op.IncrementalDetokenizer, AsyncLLM._abort = cls, _abort
    try:
        yield
    finally:
        op.IncrementalDetokenizer, AsyncLLM._abort = old_cls, old_abort


def _call(fn, *args):
    try:
        return fn(*args)
    except (BlankNotFilled, CheckFailed):
        raise
    except Exception as e:
        if "______" in str(e) or "_Blank" in repr(e):
            raise BlankNotFilled("还有空 ______ 没有填写：把它换成正确的表达式后再运行。") from None
        raise


_TOKENIZER = None


def tokenizer():
    global _TOKENIZER
    if _TOKENIZER is None:
        from minivllm.tokenizer import get_tokenizer
        _TOKENIZER = get_tokenizer(DEFAULT_MODEL)
    return _TOKENIZER


# ---------------------------------------------------------------------------- unit level: the real OutputProcessor
def stream_ids(cls, abort_fn, token_ids, params, groups, finish_last=None, delta=True):
    """Feed token_ids in groups through a real OutputProcessor using cls; returns (chunks, finish_reason, stop)."""
    from minivllm.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
    from minivllm.engine.output_processor import OutputProcessor, RequestOutputCollector
    proc = OutputProcessor(tokenizer())
    req = EngineCoreRequest("r", [1], params, arrival_time=0.0)
    queue = RequestOutputCollector(delta)
    with plugged(cls, abort_fn):
        _call(proc.add_request, req, None, delta, queue)
        chunks, i, out = [], 0, None
        for n in groups:
            if i >= len(token_ids):
                break
            new = token_ids[i:i + n]
            i += n
            last = i >= len(token_ids)
            reason = (finish_last or FinishReason.LENGTH) if last else None
            _call(proc.process_outputs, [EngineCoreOutput("r", new, finish_reason=reason)])
            out = queue.get_nowait()
            if out is not None:
                chunks.append(out.outputs[0].text)
                if out.finished:
                    break
    expect(out is not None and out.finished, "请求结束后，最后一个输出应带 finished=True。")
    return chunks, out.outputs[0].finish_reason, out.outputs[0].stop_reason


def uneven_groups(seed: int, n: int = 400) -> list[int]:
    rng = random.Random(seed)
    return [rng.choice([1, 1, 1, 2, 3, 5]) for _ in range(n)]


def stop_params(**kw):
    from minivllm.sampling_params import SamplingParams
    return SamplingParams(max_tokens=1000, **kw)


def _show(chunks) -> str:
    return repr(chunks[:12])[:300]


def expect_stream(cls, abort_fn, text, stop, groups, label, finish_last=None):
    ids = tokenizer().encode(text, add_special_tokens=False)
    params = stop_params(stop=stop) if stop else stop_params()
    chunks, reason, stop_reason = stream_ids(cls, abort_fn, ids, params, groups, finish_last)
    cut = min((text.find(s) for s in stop or [] if s in text), default=-1)
    want = text if cut == -1 else text[:cut]
    joined = "".join(chunks)
    for s in stop or []:
        expect(all(s not in c for c in chunks), f"{label}：停止串 {s!r} 出现在流式输出的某个增量里：{_show(chunks)}")
    expect(REPLACEMENT not in joined, f"{label}：增量里出现了替换字符 U+FFFD（多字节字符被拆开了）：{_show(chunks)}")
    expect(joined == want, f"{label}：增量拼起来应等于 {want[-60:]!r}（结尾），实际结尾 {joined[-60:]!r}"
           f"（共 {len(joined)} 个字符，应为 {len(want)}）。")
    if cut != -1:
        expect(reason == "stop" and stop_reason in stop, f"{label}：遇到停止串应以 finish_reason='stop' 结束，"
               f"stop_reason 是那个停止串；实际 {reason!r}, {stop_reason!r}。")
    return chunks


def check_main_path(cls, abort_fn) -> None:
    expect_stream(cls, abort_fn, TEXT, None, uneven_groups(0), "没有停止串")
    expect_stream(cls, abort_fn, TEXT, ["Juliet is"], uneven_groups(1), "停止串跨 token")
    expect_stream(cls, abort_fn, TEXT, ["wherefore", "yonder win"], [1] * 400, "两个停止串、逐 token")
    chunks = expect_stream(cls, abort_fn, MULTIBYTE, None, [1] * 400, "多字节字符、逐 token")
    expect(len([c for c in chunks if c]) > 3, "多字节文本应在多个增量里逐步流出，而不是攒到最后一次性给出。")
    expect_stream(cls, abort_fn, MULTIBYTE + "。停下", ["停下"], uneven_groups(2), "多字节停止串")


def check_boundary(cls, abort_fn) -> None:
    expect_stream(cls, abort_fn, TEXT, ["ROMEO"], [3, 1, 1] * 100, "停止串在第一个 token 里")
    expect_stream(cls, abort_fn, TEXT, ["Romeo?!"], uneven_groups(3), "停止串的前缀在结尾但没有完成（结束时要全部送出）")
    expect_stream(cls, abort_fn, TEXT, ["xyzzy-never"], [len(TEXT)], "一步给出全部 token")
    from minivllm.engine import FinishReason
    ids = tokenizer().encode(TEXT, add_special_tokens=False)
    chunks, _, _ = stream_ids(cls, abort_fn, ids + [2], stop_params(), [1] * 400, FinishReason.STOP)
    expect("".join(chunks) == TEXT, "以 EOS 结束时，EOS 本身不产生文本，其余文本一个不少；实际结尾 "
           f"{''.join(chunks)[-40:]!r}。")
    check_disconnect(cls, abort_fn)


# ---------------------------------------------------------------------------- the real server
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Server:
    """build_app + uvicorn on loopback in a daemon thread; the EngineCore is its own process."""

    def __init__(self) -> None:
        import uvicorn

        from minivllm.config import EngineArgs
        from minivllm.entrypoints.openai.api_server import build_app
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        app = build_app(EngineArgs(model=DEFAULT_MODEL, **ENGINE), NAME)
        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="critical"))
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()), daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 90
        while not self.server.started:
            expect(self.thread.is_alive() and time.monotonic() < deadline, "服务器没有在 90 s 内启动。")
            time.sleep(0.05)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


_SERVER: _Server | None = None


def server() -> _Server:
    global _SERVER
    if _SERVER is None or not _SERVER.thread.is_alive():
        _SERVER = _Server()
    return _SERVER


def close_server() -> None:
    global _SERVER
    if _SERVER is not None:
        _SERVER.close()
        _SERVER = None


atexit.register(close_server)


def client(srv: _Server):
    import openai
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=60)


def complete(srv, stream: bool, max_tokens: int = 48, stop=None, prompt: str = SERVER_PROMPT):
    """(text, chunks): non-streamed text, or the streamed deltas and their concatenation."""
    kw = dict(model=NAME, prompt=prompt, max_tokens=max_tokens, temperature=0.0, stop=stop)
    c = client(srv)
    if not stream:
        r = c.completions.create(**kw)
        return r.choices[0].text, None, r.choices[0].finish_reason
    chunks, reason = [], None
    for ev in c.completions.create(stream=True, **kw):
        chunks.append(ev.choices[0].text)
        reason = ev.choices[0].finish_reason or reason
    return "".join(chunks), chunks, reason


def metrics(srv) -> dict[str, float]:
    from minivllm.entrypoints.openai.metrics import parse_prometheus
    return parse_prometheus(httpx.get(srv.url + "/metrics", timeout=10).text)


def _metric(m: dict, name: str) -> float:
    for k, v in m.items():
        if k == name or k.startswith(name + "{"):
            return v
    raise KeyError(name)


def pick_stop(text: str) -> str:
    """A 7-character piece of the text, first occurring in its middle, that spans a token boundary."""
    ids = tokenizer().encode(text, add_special_tokens=False)
    ends, acc = set(), ""
    for i in range(len(ids)):
        acc = tokenizer().decode(ids[:i + 1])
        ends.add(len(acc))
    for start in range(len(text) // 3, len(text) - 7):
        s = text[start:start + 7]
        if text.find(s) == start and any(start < e < start + 7 for e in ends) and s.strip() == s and s.strip():
            return s
    raise CheckFailed("参考输出太短，找不到合适的停止串（请检查模型）。")


_REFERENCE: dict = {}


def reference(srv) -> str:
    """The greedy text from the server with minivllm's own detokenizer (never the student's)."""
    if "text" not in _REFERENCE:
        _REFERENCE["text"] = complete(srv, False)[0]
    return _REFERENCE["text"]


def check_real_server(cls, abort_fn) -> None:
    srv = server()
    want = reference(srv)
    stop = pick_stop(want)
    with plugged(cls, abort_fn):
        text, _, _ = _call(complete, srv, False)
        expect(text == want, f"非流式输出应为 {want[:60]!r}…，实际 {text[:60]!r}…")
        joined, chunks, _ = _call(complete, srv, True)
        expect(joined == want, f"流式增量拼起来应等于非流式文本 {want[-50:]!r}（结尾），实际 {joined[-50:]!r}；"
               f"增量 {_show(chunks)}")
        joined, chunks, reason = _call(complete, srv, True, 48, [stop])
        expect(all(stop not in c for c in chunks), f"停止串 {stop!r} 出现在某个流式增量里：{_show(chunks)}")
        cut = want[:want.find(stop)]
        expect(joined == cut and reason == "stop", f"带停止串 {stop!r} 时，流应正好停在它前面（结尾 {cut[-40:]!r}，"
               f"finish_reason='stop'）；实际结尾 {joined[-40:]!r}，finish_reason={reason!r}。")


def check_disconnect(cls, abort_fn) -> None:
    """A client that goes away mid-stream: its request leaves the EngineCore and its blocks are free again."""
    srv = server()
    m = metrics(srv)
    total = _metric(m, "minivllm:num_total_kv_blocks")
    with plugged(cls, abort_fn):
        with httpx.stream("POST", srv.url + "/v1/completions", timeout=60, json={
                "model": NAME, "prompt": SERVER_PROMPT, "max_tokens": 1000, "ignore_eos": True,
                "stream": True, "temperature": 0.0}) as r:
            busy = False
            for n, _ in enumerate(r.iter_lines()):  # until /metrics shows the stream's blocks in use
                busy = _metric(metrics(srv), "minivllm:num_free_kv_blocks") < total
                if busy or n > 200:
                    break
        expect(busy, "流进行中应占用 KV 块（检查本身出了问题）。")
        deadline = time.monotonic() + 3.0
        while True:
            m = metrics(srv)
            free, running = _metric(m, "minivllm:num_free_kv_blocks"), _metric(m, "minivllm:num_requests_running")
            if free == total and running == 0:
                return
            if time.monotonic() > deadline:
                close_server()  # the leaked request would keep the shared engine busy: start afresh next time
                raise CheckFailed(f"客户端断开 3 s 后，EngineCore 里仍有 {running:g} 个运行中的请求、"
                                  f"{total - free:g} 个 KV 块没有释放：断开没有传到 EngineCore（KV 泄漏）。")
            time.sleep(0.05)


# ---------------------------------------------------------------------------- source map
SOURCE_KEYS = ("hold_back", "fast_detokenizer", "stop_search", "mailbox", "output_loop", "wire_encoder")
SOURCE_HASHES = {
    "hold_back": {"2971b05702041de1"},            # stop_buffer_length
    "fast_detokenizer": {"4647d0f105d075f8"},     # FastIncrementalDetokenizer
    "stop_search": {"66933d8a029e3e3b"},          # check_stop_strings
    "mailbox": {"237de583886c3b55"},              # RequestOutputCollector
    "output_loop": {"f582c0619c641c9c"},          # _run_output_handler
    "wire_encoder": {"a2714119a463688b"},         # MsgpackEncoder
}


def normalize_name(name: str) -> str:
    s = re.sub(r"\(.*\)", "", str(name)).strip().strip("`").replace(" ", "")
    return s.rsplit(".", 1)[-1].lower()


def name_hash(name: str) -> str:
    return hashlib.sha256(normalize_name(name).encode()).hexdigest()[:16]


def check_source_map(source_map) -> None:
    check_name_map(source_map, SOURCE_KEYS, SOURCE_HASHES, name_hash, "这些概念没有对应到 vLLM 源码中实现它的名字")


LESSON = Lesson(
    lesson_id="lesson12",
    title="前端与在线服务：AsyncLLM、ZMQ/msgspec、SSE 与基准测试",
    parts=[
        Part("l12_main_path", "主路径·输出处理器", 1, check_main_path, ("StreamingDetokenizer", "abort_stream")),
        Part("l12_real_server", "主路径·真实服务器", 1, check_real_server, ("StreamingDetokenizer", "abort_stream")),
        Part("l12_boundary", "边界条件与断开连接", 1, check_boundary, ("StreamingDetokenizer", "abort_stream")),
        Part("l12_source_map", "映射回源码对象", 1, check_source_map, ("SOURCE_MAP",)),
        Part("l12_q1", "Q1 进程拆分的收益与代价", 2, group="manual"),
        Part("l12_q2", "Q2 没有 hold-back 时流式输出坏在哪", 2, group="manual"),
        Part("l12_q3", "Q3 从 TTFT/TPOT 曲线判断饱和", 2, group="manual"),
    ],
)
