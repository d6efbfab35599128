"""Lesson 12 — 前端与在线服务: the checks behind the grade cells, and the plug into the real frontend.

The student writes `StreamingDetokenizer(tokenizer, params, prompt_token_ids)` with `update(new_token_ids,
stop_terminated) -> stop string | None` and `get_next_output_text(finished, delta) -> str` (the interface of
minivllm's IncrementalDetokenizer, vLLM's BaseIncrementalDetokenizer / FastIncrementalDetokenizer), and
`abort_stream(engine, request_id)`, the path AsyncLLM takes when a stream is cancelled (client disconnect).

Input space of the exercise (what changes what the answer must do) and the part that covers each value:

| dimension | values | part |
|---|---|---|
| decoder | byte-level BPE: multi-byte characters span tokens | main_path, real_server |
|         | SentencePiece-like Metaspace: a "▁word" token is " word" after other text, "word" at the start | main_path |
| prompt | one BOS id; a text prompt the stream must be primed with (Metaspace); a prompt ending inside a | main_path |
|        | multi-byte character whose bytes the output completes (2 or 3 of its bytes in the prompt: priming |  |
|        | with the last 1-2 prompt tokens, or without the first, shows U+FFFD; vLLM's primed stream repeats |  |
|        | the prompt's text before that character, and the output without the repeat is accepted too) |  |
| stop | none; one; several of different lengths (longest neither first, last, nor lexicographic max; the | main_path, |
|      | match in the middle of the list); one whose text repeats; one never completed | boundary, real_server |
|      | one with leading whitespace (" breaks"), split so that all of it but its last character, the space | main_path, |
|      | included, is pending after a token: the hold-back is len(stop) - 1 of the stop as given, not stripped | real_server |
| include_stop_str_in_output | False: cut before the stop, hold back len(longest) - 1; True: cut after, no hold-back | main_path, boundary, real_server |
| skip_special_tokens | True; False (a special token inside the output shows as text) | boundary |
| finish | length; stop string; EOS / stop token (stop_terminated: its text only with include_stop_str_in_output); | all; |
|        | an empty output; abort (the client disconnects) | boundary |
| output kind | delta (streaming); cumulative (delta=False: each output the whole text so far); final only | main_path, real_server |
| step shape | 1 token per step; 1–5 (speculative decoding's k+1 per step); the whole output in one step; a stop | main_path, |
|            | spanning steps; the last character of a stop alone in a step; text after a stop in the same step | boundary |
| length | output shorter than the hold-back window (a long stop at the very start; a stop prefix at the end) | boundary |
| engine | OpenAI server, EngineCore in its own process (an abort must cross the socket); speculative decoding | real_server, |
|        | and async scheduling change only the step shape the OutputProcessor sees (covered above) | boundary |
| abort | the cancelled stream's one id; the core's abort_requests takes a list of ids | boundary |
| min_tokens | not part of the exercise: 0 in every check (minivllm's and vLLM's detokenizers have it) | - |

Every stream is compared increment by increment with the engine's own IncrementalDetokenizer (vLLM's rules) fed
the same groups through the same OutputProcessor; whole texts come from the string itself. Grade cells and
`python -m autograder check lesson12 ...` call the same check_* functions here (each docstring says what it covers).

`plugged(cls, abort)` replaces the name IncrementalDetokenizer in minivllm.engine.output_processor and
AsyncLLM._abort for its duration; the server (shared by the checks of one process) is started lazily.
"""
from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import random
import re
import threading
import time
from unittest import mock

import httpx

from autograder.common import (
    DEFAULT_MODEL,
    BlankNotFilled,
    CheckFailed,
    Lesson,
    SourceMap,
    expect,
)
from autograder.pin import VLLM_VERSION

NAME = "shakespeare"
REPLACEMENT = "\ufffd"
TEXT = ("ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n"
        "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?")
MULTIBYTE = "你好，世界！😀 café — naïve 日本語"
SERVER_PROMPT = "ROMEO:"
ENGINE = dict(device="cpu", attention_backend="torch", max_num_seqs=16, max_model_len=1024)
DISCONNECT_MAX_TOKENS = 1000  # far more steps than a disconnect takes to reach the core, on any machine


# ---------------------------------------------------------------------------- the plug
@contextlib.contextmanager
def plugged(cls, abort_fn, on_abort=None):
    """The frontend's detokenizer and its abort path are the student's while inside; on_abort(request_id) is
    called after the student's abort_stream returned (or raised) for a request."""
    import minivllm.engine.output_processor as op
    from minivllm.engine.async_llm import AsyncLLM

    def _abort(self, request_id):
        for rid in [request_id] if isinstance(request_id, str) else list(request_id):
            try:
                abort_fn(self, rid)
            finally:
                if on_abort is not None:
                    on_abort(rid)

    with mock.patch.object(op, "IncrementalDetokenizer", cls), mock.patch.object(AsyncLLM, "_abort", _abort):
        yield


def _call(fn, *args):
    try:
        return fn(*args)
    except (BlankNotFilled, CheckFailed):
        raise
    except Exception as e:
        if "______" in str(e) or "_Blank" in repr(e):
            raise BlankNotFilled("还有空 ______ 没有填写：把它换成正确的表达式后再运行。") from None
        raise


@functools.cache
def tokenizer():
    """The course model's tokenizer: byte-level BPE."""
    from minivllm.tokenizer import get_tokenizer
    return get_tokenizer(DEFAULT_MODEL)


@functools.cache
def metaspace_tokenizer():
    """A SentencePiece-like tokenizer built here (nothing downloads): a word-level model over TEXT's words with a
    Metaspace pre-tokenizer and decoder, whose "▁word" decodes to " word" except at the start of a sequence."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    words = sorted({"▁" + w for w in TEXT.split(" ")})
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    rust = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    rust.pre_tokenizer = pre_tokenizers.Metaspace()
    rust.decoder = decoders.Metaspace()
    return PreTrainedTokenizerFast(tokenizer_object=rust, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


# ---------------------------------------------------------------------------- unit level: the real OutputProcessor
def stream_ids(cls, abort_fn, token_ids, params, groups, finish_last=None, delta=True, tok=None, prompt_ids=(1,)):
    """Feed token_ids in groups through a real OutputProcessor using cls (None: the engine's own detokenizer);
    returns (texts of the outputs, finish_reason, stop_reason)."""
    from minivllm.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
    from minivllm.engine.output_processor import OutputProcessor, RequestOutputCollector
    proc = OutputProcessor(tok or tokenizer())
    req = EngineCoreRequest("r", list(prompt_ids), params, arrival_time=0.0)
    queue = RequestOutputCollector(delta)
    with plugged(cls, abort_fn) if cls is not None else contextlib.nullcontext():
        _call(proc.add_request, req, None, delta, queue)
        chunks, i, out = [], 0, None
        for n in groups:
            if i >= len(token_ids):
                break
            new = token_ids[i:i + n]
            i += n
            last = i >= len(token_ids)
            reason = (FinishReason.LENGTH if finish_last is None else finish_last) if last else None
            _call(proc.process_outputs, [EngineCoreOutput("r", new, finish_reason=reason)])
            out = queue.get_nowait()
            if out is not None:
                chunks.append(out.outputs[0].text)
                if out.finished:
                    break
    expect(out is not None and out.finished, "请求结束后，最后一个输出应带 finished=True。")
    return chunks, out.outputs[0].finish_reason, out.outputs[0].stop_reason


def uneven_groups(seed: int, n: int = 400) -> list[int]:
    """1–5 tokens per step, as a step with speculative decoding delivers them."""
    rng = random.Random(seed)
    return [rng.choice([1, 1, 1, 2, 3, 5]) for _ in range(n)]


def stop_params(**kw):
    from minivllm.sampling_params import SamplingParams
    return SamplingParams(max_tokens=1000, **kw)


def _clip(text: str, n: int = 40) -> str:
    """repr of text, its head cut off when long (the end is where increments differ)."""
    return repr(text) if len(text) <= n else f"…{text[-n:]!r}（共 {len(text)} 个字符）"


def first_difference(got: list[str], want: list[str], stop) -> str:
    """The first increment that differs from vLLM's, named by its number, with what leaked or went missing."""
    for k, (g, w) in enumerate(zip(got, want, strict=False)):
        if g != w:
            leaked = next((s for s in stop or [] if s in g), None)
            why = f"停止串 {leaked!r} 泄漏在这个增量里" if leaked else (
                "出现了替换字符 U+FFFD（多字节字符被拆开了）" if REPLACEMENT in g else "")
            return f"第 {k + 1} 个增量应为 {_clip(w)}，实际 {_clip(g)}" + (f"（{why}）" if why else "")
    if len(got) != len(want):
        return f"应有 {len(want)} 个输出、第 {len(want)} 个结束请求，实际 {len(got)} 个（最后一个 {got[-1:]!r}）"
    return ""


def expect_stream(cls, abort_fn, text, stop, groups, label, finish_last=None, include=False, tok=None,
                  prompt="", delta=True):
    """The stream of `text` (after `prompt`, which primes the detokenizer) in `groups`: each output equals the
    engine's, the whole text equals the string's own cut. Returns the student's outputs."""
    tok = tok or tokenizer()
    prompt_ids = tok.encode(prompt, add_special_tokens=False) if prompt else [1]
    ids = tok.encode(prompt + text, add_special_tokens=False)[len(prompt_ids):] if prompt else \
        tok.encode(text, add_special_tokens=False)
    if prompt:
        expect(tok.decode(prompt_ids + ids) == prompt + text, "检查本身出了问题：prompt 与文本的切分不一致。")
    kw = dict(stop=stop, include_stop_str_in_output=include) if stop else {}
    args = (ids, stop_params(**kw), groups, finish_last, delta, tok, prompt_ids)
    want_chunks, want_reason, want_stop = stream_ids(None, None, *args)
    chunks, reason, stop_reason = stream_ids(cls, abort_fn, *args)
    # vLLM: the stop string that completes earliest wins; the text is cut before it (after it with include)
    cut = min(((text.find(s) + len(s), text.find(s)) for s in stop or [] if s in text), default=None)
    want = text if cut is None else text[:cut[0] if include else cut[1]]
    full = want_chunks[-1] if not delta else "".join(want_chunks)
    expect(full == want, f"检查本身出了问题：引擎的输出 {full[-40:]!r} 与参考文本 {want[-40:]!r} 不同。")
    diff = first_difference(chunks, want_chunks, [] if include else stop)
    expect(not diff, f"{label}：{diff}。")
    if cut is not None:
        expect((reason, stop_reason) == (want_reason, want_stop), f"{label}：遇到停止串应以 finish_reason="
               f"{want_reason!r}、stop_reason={want_stop!r} 结束；实际 {reason!r}, {stop_reason!r}。")
    return chunks


def expect_split_prompt(cls, abort_fn, cut: int, label: str) -> None:
    """MULTIBYTE's byte-level tokens, the prompt ending `cut` tokens in, inside a character whose bytes the output
    completes. The stream must never show U+FFFD. Accepted: the pinned vLLM's increments (with tokenizers 0.23 its
    primed DecodeStream, whose prefix ends in an incomplete character, emits the prompt's text again before the
    completed character), or the same increments without that repeated prompt text (a stream that stepped
    through the prompt). A stream primed with only the last prompt token(s) shows U+FFFD."""
    tok = tokenizer()
    ids = tok.encode(MULTIBYTE, add_special_tokens=False)
    prompt_ids, out_ids = ids[:cut], ids[cut:]
    prompt_text = tok.decode(prompt_ids)
    expect(prompt_text.endswith(REPLACEMENT), "检查本身出了问题：prompt 应以半个字符结尾。")
    args = (out_ids, stop_params(), [1] * 400, None, True, tok, prompt_ids)
    want, got = (stream_ids(c, a, *args)[0] for c, a in ((None, None), (cls, abort_fn)))
    bad = next((k for k, c in enumerate(got) if REPLACEMENT in c), None)
    expect(bad is None, f"{label}：第 {bad + 1 if bad is not None else 0} 个增量 {_clip(got[bad] if bad is not None else '')}"
           f" 含替换字符 U+FFFD：补全这个字符的字节有一部分在 prompt 里，解码流没有看到它们。")
    repeated = prompt_text.rstrip(REPLACEMENT)
    first = next((k for k, c in enumerate(want) if c), None)
    clean = list(want)
    if first is not None and repeated and clean[first].startswith(repeated):
        clean[first] = clean[first][len(repeated):]
    if got != want and got != clean:
        diff = first_difference(got, clean, [])
        expect(False, f"{label}：{diff}（补全的字符应出现在第一段输出里；vLLM 还会在它前面重复 prompt 的文本 "
               f"{_clip(repeated)}，两种都接受）。")


def check_main_path(cls, abort_fn) -> None:
    """Byte-level and Metaspace decoders, primed prompt; stops across steps, several stops of different lengths,
    include_stop_str_in_output, multi-byte text, delta and cumulative outputs; 1–5 tokens per step."""
    stream = functools.partial(expect_stream, cls, abort_fn)
    stream(TEXT, None, uneven_groups(0), "没有停止串")
    stream(TEXT, ["Juliet is"], uneven_groups(1), "停止串跨 token")
    # " break" + "s": after " break" the whole stop but its last character is pending, leading space included
    stream(TEXT, [" breaks"], [1] * 400, "以空格开头的停止串 \" breaks\" 跨 token（逐 token）")
    stream(TEXT, ["wherefore", "yonder win"], [1] * 400, "两个停止串、逐 token")
    stream(TEXT, ["zebra", "Juliet is the sun", "qq"], [1] * 400, "三个长短不同的停止串（最长的在中间）")
    stream(TEXT, ["Juliet is"], uneven_groups(4), "include_stop_str_in_output=True", include=True)
    stream(TEXT, ["qq", "yonder window"], uneven_groups(5), "非流式（cumulative）输出", delta=False)
    chunks = stream(MULTIBYTE, None, [1] * 400, "多字节字符、逐 token")
    expect(len([c for c in chunks if c]) > 3, "多字节文本应在多个增量里逐步流出，而不是攒到最后一次性给出。")
    stream(MULTIBYTE + "。停下", ["停下"], uneven_groups(2), "多字节停止串")
    expect_split_prompt(cls, abort_fn, 5, "prompt 以“好”字的前两个字节结尾")
    expect_split_prompt(cls, abort_fn, 21, "prompt 以 emoji 的前三个字节结尾")
    ms = metaspace_tokenizer()
    stream(TEXT[16:], None, [1] * 400, "SentencePiece（Metaspace）分词器、带 prompt", tok=ms, prompt=TEXT[:16])
    stream(TEXT[16:], ["Juliet is"], uneven_groups(6), "Metaspace 分词器与停止串", tok=ms, prompt=TEXT[:16])
    check_against_vllm(cls)


def vllm_events(cls, case: dict) -> dict:
    """cls driven as vLLM's OutputProcessor drives a detokenizer (autograder/lesson12/vllm_view.py): per step
    update(ids, stop_terminated on the last step) -> stop string, then the delta; the whole text at the end."""
    from minivllm.sampling_params import SamplingParams

    p = case["params"]
    params = SamplingParams(max_tokens=64, stop=p["stop"], include_stop_str_in_output=p["include_stop_str_in_output"],
                            skip_special_tokens=p["skip_special_tokens"])
    detok = _call(cls, tokenizer(), params, list(case["prompt"]))
    events = []
    for k, ids in enumerate(case["steps"]):
        last = k == len(case["steps"]) - 1
        stop = _call(detok.update, list(ids), case["stop_terminated"] and last)
        events.append([stop, _call(detok.get_next_output_text, last or stop is not None, True)])
        if stop is not None:
            break
    return {"seed": case["seed"], "events": events, "text": _call(detok.get_next_output_text, True, False)}


def check_against_vllm(cls) -> None:
    """cls against the pinned vLLM's own IncrementalDetokenizer (recorded: grading never needs vLLM) on the lesson's
    stop-string streams: every step's stop string and delta, and the whole text."""
    from autograder.lesson12.vllm_view import GRADED, SCENARIOS
    from autograder.vllm_oracle import recorded

    for name in GRADED:
        want, got = recorded("lesson12", name), vllm_events(cls, SCENARIOS[name])
        k = next((k for k, (a, b) in enumerate(zip(got["events"], want["events"], strict=False)) if a != b),
                 min(len(got["events"]), len(want["events"])))
        expect(got == want, f"与 vLLM {VLLM_VERSION} 的 IncrementalDetokenizer 不同（用例 {name}，停止串 "
               f"{SCENARIOS[name]['params']['stop']}）：第 {k + 1} 步 [停止串, 增量] vLLM "
               f"{want['events'][k:k + 1]}，你的 {got['events'][k:k + 1]}；全文 vLLM {_clip(want['text'])}，"
               f"你的 {_clip(got['text'])}。")


def check_boundary(cls, abort_fn) -> None:
    """Stop in the first token; output shorter than the hold-back window; the whole output in one step (a stop
    in its middle, a repeated stop, include_stop_str_in_output); a stop's last character alone in a step;
    EOS / stop tokens / special tokens with skip_special_tokens on and off; an empty output; the disconnect."""
    from minivllm.engine import FinishReason
    stream = functools.partial(expect_stream, cls, abort_fn)
    stream(TEXT, ["ROMEO"], [3, 1, 1] * 100, "停止串在第一个 token 里")
    stream(TEXT, ["Romeo?!"], uneven_groups(3), "停止串的前缀在结尾但没有完成（结束时要全部送出）")
    stream(TEXT, ["ROMEO:\nBut soft"], [1] * 400, "很长的停止串就在输出开头")
    stream(TEXT[:9], ["ROMEO:\nBut soft, what"], [1] * 400, "输出比 hold-back 窗口还短")
    stream(TEXT, ["window breaks?"], [1] * 400, "停止串的最后一个字符单独在一步里")
    whole = [len(TEXT)]
    stream(TEXT, ["xyzzy-never"], whole, "一步给出全部 token")
    stream(TEXT, ["Juliet is"], whole, "一步给出全部 token，停止串在中间")
    stream(TEXT, ["Romeo"], whole, "一步给出全部 token，停止串出现两次")
    stream(TEXT, ["the sun", "the east"], whole, "一步里两个停止串，先完成的那个生效", include=True)
    stream(TEXT, ["Juliet is"], [7, 30, 40], "include_stop_str_in_output=True，停止串后还有文本", include=True)
    eos = tokenizer().eos_token_id
    text_ids = tokenizer().encode(TEXT, add_special_tokens=False)

    def same_as_engine(label, ids, finish, **params) -> None:
        """One token a step, the stream equals the engine's own, increment by increment."""
        ref, got = (stream_ids(c, a, ids, stop_params(**params), [1] * 400, finish)[0]
                    for c, a in ((None, None), (cls, abort_fn)))
        diff = first_difference(got, ref, [])
        expect(not diff, f"{label}：{diff}。")
    for include in (False, True):
        for skip in (True, False):
            same_as_engine(f"以 EOS 结束（include_stop_str_in_output={include}, skip_special_tokens={skip}）",
                           text_ids + [eos], FinishReason.STOP, include_stop_str_in_output=include,
                           skip_special_tokens=skip)
    mid = text_ids[:10] + [eos] + text_ids[10:20]  # ignore_eos: a special token inside the output
    for skip in (True, False):
        same_as_engine(f"输出中间有特殊 token（skip_special_tokens={skip}）", mid, None, skip_special_tokens=skip)
    stop_tok = text_ids[6]  # " what" as a stop token id: its text only with include_stop_str_in_output
    for include in (False, True):
        params = stop_params(stop_token_ids=[stop_tok], include_stop_str_in_output=include)
        got = stream_ids(cls, abort_fn, text_ids[:7], params, [2, 2, 3], FinishReason.STOP)[0]
        want = TEXT[:TEXT.find(" what")] + (" what" if include else "")
        expect("".join(got) == want, f"以 stop token 结束（include_stop_str_in_output={include}）：拼起来应为 "
               f"{want[-30:]!r}（结尾），实际 {''.join(got)[-30:]!r}。")
    got = stream_ids(cls, abort_fn, [eos], stop_params(stop=["Romeo"]), [1], FinishReason.STOP)[0]
    expect(got == [""], f"第一个 token 就是 EOS：输出应为 ['']，实际 {got!r}。")
    check_disconnect(cls, abort_fn)


# ---------------------------------------------------------------------------- the real server
class _Server:
    """build_app + uvicorn on loopback in a daemon thread; the EngineCore is its own process."""

    def __init__(self) -> None:
        import uvicorn

        from minivllm.config import EngineArgs
        from minivllm.distributed.parallel_state import get_open_port
        from minivllm.entrypoints.openai.api_server import build_app

        self.port = get_open_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = app = build_app(EngineArgs(model=DEFAULT_MODEL, **ENGINE), NAME)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="critical"))

        async def serve() -> None:
            self.loop = asyncio.get_running_loop()
            await self.server.serve()
        self.thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 90
        while not self.server.started:
            expect(self.thread.is_alive() and time.monotonic() < deadline, "服务器没有在 90 s 内启动。")
            time.sleep(0.05)

    @property
    def engine(self):
        return self.app.state.serving.engine

    def core_stats(self):
        """The EngineCore's own SchedulerStats, asked over the socket the aborts travel (so it answers after them)."""
        fut = asyncio.run_coroutine_threadsafe(self.engine.engine_core.get_stats_async(), self.loop)
        return fut.result(60)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


_SERVER: _Server | None = None


def server() -> _Server:
    """The shared server; a fresh one if an earlier answer's exception killed its output handler."""
    global _SERVER
    if _SERVER is not None and _SERVER.thread.is_alive() and _SERVER.engine.errored:
        close_server()
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


def complete(srv, stream: bool, max_tokens: int = 48, stop=None, prompt: str = SERVER_PROMPT, include=False):
    """(text, chunks, finish_reason): non-streamed text, or the streamed deltas and their concatenation."""
    kw = dict(model=NAME, prompt=prompt, max_tokens=max_tokens, temperature=0.0, stop=stop,
              extra_body={"include_stop_str_in_output": include} if include else None)
    c = client(srv)
    if not stream:
        r = c.completions.create(**kw)
        return r.choices[0].text, None, r.choices[0].finish_reason
    chunks, reason = [], None
    for ev in c.completions.create(stream=True, **kw):
        chunks.append(ev.choices[0].text)
        reason = ev.choices[0].finish_reason or reason
    return "".join(chunks), chunks, reason


def token_ends(text: str) -> list[int]:
    """The character offsets in text where its tokens end."""
    ids = tokenizer().encode(text, add_special_tokens=False)
    return sorted({len(tokenizer().decode(ids[:i + 1])) for i in range(len(ids))})


def pick_spaced_stop(text: str) -> str:
    """A piece of the text that starts with a space and ends one character into the next token (so after that
    token the whole stop but its last character is pending, the space included), first occurring in the
    text's middle; a next token that does not start with whitespace is preferred."""
    ends = token_ends(text)
    found = []
    for start in range(len(text) // 3, len(text) - 2):
        if text[start] != " " or not text[start + 1].strip():
            continue
        for e in ends:
            s = text[start:e + 1]
            if e > start + 2 and e < len(text) and "\n" not in s and text.find(s) == start:
                found.append((not text[e].strip(), start, s))
                break
    if not found:
        raise CheckFailed("参考输出里找不到以空格开头、跨 token 的停止串（请检查模型）。")
    return min(found)[2]


def pick_stop(text: str, length: int = 7) -> str:
    """A piece of the text, first occurring in its middle, that spans a token boundary."""
    ends = token_ends(text)
    for start in range(len(text) // 3, len(text) - length):
        s = text[start:start + length]
        if text.find(s) == start and any(start < e < start + length for e in ends) and s.strip() == s and s.strip():
            return s
    raise CheckFailed("参考输出太短，找不到合适的停止串（请检查模型）。")


_REFERENCE: dict = {}


def reference(srv) -> str:
    """The greedy text from the server with minivllm's own detokenizer (never the student's)."""
    if "text" not in _REFERENCE:
        _REFERENCE["text"] = complete(srv, False)[0]
    return _REFERENCE["text"]


def wrong_increment(chunks: list[str], want: str) -> str:
    """The first streamed increment that does not continue `want` (a leak, a repeat), or where the stream fell short."""
    sent = ""
    for k, c in enumerate(chunks):
        if not want.startswith(sent + c):
            return (f"第 {k + 1} 个增量 {_clip(c)} 与应有的文本不符：这里应是 {_clip(want[len(sent):len(sent) + len(c)])}"
                    + (f"（多出 {_clip((sent + c)[len(want):])}：越过了应有文本的结尾）" if (sent + c).startswith(want)
                       else ""))
        sent += c
    return "" if sent == want else f"流只给出 {len(sent)} 个字符，应有 {len(want)} 个，缺少 {_clip(want[len(sent):])}"


def check_real_server(cls, abort_fn) -> None:
    """The OpenAI server (EngineCore in its own process) and the openai client: non-streamed, streamed, a stop
    string across tokens, several stops of different lengths, include_stop_str_in_output, a stop that starts
    with a space and ends one character into a token (pick_spaced_stop)."""
    srv = server()
    want = reference(srv)
    stop = pick_stop(want)
    spaced = pick_spaced_stop(want)
    with plugged(cls, abort_fn):
        text, _, _ = _call(complete, srv, False)
        expect(text == want, f"非流式输出应为 {want[:60]!r}…，实际 {text[:60]!r}…")
        joined, chunks, _ = _call(complete, srv, True)
        diff = wrong_increment(chunks, want)
        expect(not diff, f"流式增量拼起来应等于非流式文本：{diff}。")
        for stops, first, include in (([stop], stop, False), (["zq#", stop, "q"], stop, False), ([stop], stop, True),
                                      ([spaced], spaced, False)):
            joined, chunks, reason = _call(complete, srv, True, 48, stops, SERVER_PROMPT, include)
            cut = want[:want.find(first) + (len(first) if include else 0)]
            diff = wrong_increment(chunks, cut)
            expect(not diff, f"停止串 {stops}（include_stop_str_in_output={include}）：{diff}。")
            expect(reason == "stop", f"停止串 {stops}：finish_reason 应为 'stop'，实际 {reason!r}。")


def check_disconnect(cls, abort_fn) -> None:
    """A client that goes away mid-stream: its request leaves the EngineCore, its blocks are free again.

    Deterministic: after the student's abort_stream ran, the check asks the EngineCore itself (get_stats, sent
    on the socket the abort travels, so it is answered after it) until the request is gone; every output the
    core sent meanwhile is recorded as it arrives. A request that left without a finishing output from the core
    was aborted there; one that ran to max_tokens (finish_reason "length") never got the abort, however fast
    or slow the machine.
    """
    srv = server()
    core = srv.engine.engine_core
    total = srv.core_stats().num_total_blocks
    queue = core.outputs_queue
    put, finished_by_core, aborted = queue.put_nowait, [], []

    def recording(outputs) -> None:
        if not isinstance(outputs, BaseException):
            finished_by_core.extend((o.request_id, str(o.finish_reason)) for o in outputs.outputs if o.finish_reason)
        put(outputs)

    done = threading.Event()
    queue.put_nowait = recording
    try:
        with plugged(cls, abort_fn, on_abort=lambda rid: (aborted.append(rid), done.set())):
            with httpx.stream("POST", srv.url + "/v1/completions", timeout=60, json={
                    "model": NAME, "prompt": SERVER_PROMPT, "max_tokens": DISCONNECT_MAX_TOKENS, "ignore_eos": True,
                    "stream": True, "temperature": 0.0}) as r:
                seen = 0
                for line in r.iter_lines():  # tokens arrive: until the core reports the request running
                    seen += line.startswith("data: ")
                    busy = srv.core_stats() if seen else None
                    if seen > 100 or busy and busy.num_running_reqs == 1 and busy.num_free_blocks < total:
                        break
            expect(busy is not None and busy.num_running_reqs == 1 and busy.num_free_blocks < total,
                   f"流进行中应有 1 个运行中的请求占着 KV 块（检查本身出了问题：HTTP {r.status_code}，{busy}）。")
            expect(done.wait(60), "服务器没有取消这个流（检查本身出了问题）。")
            while (st := srv.core_stats()).num_running_reqs or st.num_waiting_reqs:
                time.sleep(0.02)
    finally:
        del queue.put_nowait
    rid = aborted[0]
    ran_out = [reason for r, reason in finished_by_core if r == rid]
    expect(not ran_out, f"客户端断开后，EngineCore 仍把请求生成到了结束（finish_reason={ran_out[0]!r}，"
           f"{DISCONNECT_MAX_TOKENS} 个 token）：断开没有传到 EngineCore，它一直占着 batch 的位置和 KV 块。"
           if ran_out else "")
    expect(st.num_free_blocks == total, f"请求离开 EngineCore 后仍有 {total - st.num_free_blocks} 个 KV 块没有释放。")


# ---------------------------------------------------------------------------- source map
# Names in vLLM at the pin that the lesson does not print (found by reading vLLM, not the lesson), as sha256
# prefixes of the lower-cased last dotted name, call parentheses dropped.
SOURCE = SourceMap(("prefix_reset", "fast_switch", "slow_prompt_tokens", "disconnect_listener", "arrivals",
                    "zero_copy_threshold"), {
    "prefix_reset": {"0c46830b76090815"},
    "fast_switch": {"e8e97910936426f9"},
    "slow_prompt_tokens": {"e2f662a28bcbd244"},
    "disconnect_listener": {"2a228c98fa6329fb"},
    "arrivals": {"e67d5729a7e12675"},
    "zero_copy_threshold": {"39e66b1d9a99860e", "d7d552fe1b2ae56c"},
}, name=lambda s: (
    re.sub(r"\(.*\)", "", str(s)).strip().strip("`").replace(" ", "").rsplit(".", 1)[-1].lower()))


LESSON = Lesson(
    lesson_id="lesson12",
    title="前端与在线服务：AsyncLLM、ZMQ/msgspec、SSE 与基准测试",
    answer=("StreamingDetokenizer", "abort_stream"),
    code={
        "main_path": ("主路径·输出处理器", check_main_path),
        "real_server": ("主路径·真实服务器", check_real_server),
        "boundary": ("边界条件与断开连接", check_boundary),
    },
    source_map=SOURCE,
    questions=("进程拆分的收益与代价", "没有 hold-back 时流式输出坏在哪", "排队如何推高 TTFT"),
)
check_source_map = SOURCE.check
