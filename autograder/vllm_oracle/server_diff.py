"""minivllm's OpenAI server against the pinned vLLM's, request for request, over real HTTP on loopback.

    python -m autograder.vllm_oracle record server                 # vLLM's answers -> data/vllm_oracle/server.json.xz
    python -m autograder.vllm_oracle.server_diff compare [--live]  # minivllm against the recording (or live vLLM)

Each side is a real uvicorn server in its own process (`python -m minivllm.entrypoints.cli serve` and
`python -m vllm.entrypoints.openai.api_server` on .venv-vllm's Python), on a free port, with the shipped model,
float32, eager, max_model_len 256 and an API key; both are killed in a finally. The corpus (server_corpus.py)
goes out over httpx; each answer is normalized (ids, timestamps, fingerprints and error messages dropped; JSON
reduced to its shape at every level plus its values; the access-control-* headers; an SSE stream to its framing, chunk shapes and the merged
text, token ids, logprobs, finish reasons and usage; /metrics to its families) and compared, floats within 1e-3.
"""
from __future__ import annotations

import asyncio
import copy
import json
import math
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx

from autograder import isolation
from autograder.vllm_oracle import REPO, SERVER, record, recorded, vllm_python
from autograder.vllm_oracle.server_corpus import (
    API_KEY,
    CATS,
    MAX_MODEL_LEN,
    MODEL,
    SERVER_PROFILES,
    server_cases,
)
from minivllm.benchmarks.ready_checker import wait_for_health
from minivllm.distributed.parallel_state import get_open_port

MODEL_DIR = "data/models/shakespeare-llama"
IGNORED_KEYS = {"id", "created", "created_at", "system_fingerprint"}
# Values that differ between any two runs of the same server: compared by type only.
TYPE_ONLY_PATHS = {"error.message"}
# Prefix-cache hits (the Responses API's usage.input_tokens_details.cached_tokens) depend on which requests ran
# before, in which order and how many at once; vLLM's CPU server reports 0 for every request.
TYPE_ONLY_KEYS = {"cached_tokens"}
TEXT_KEYS = {"text", "content", "tokens", "token_logprobs", "top_logprobs", "text_offset", "token_ids", "token",
             "logprob", "bytes", "completion_tokens", "total_tokens", "finish_reason", "stop_reason", "reasoning"}
ANTHROPIC_EVENTS = {"message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
                    "message_stop", "ping", "error"}
TOL = 1e-3
REQUEST_TIMEOUT = 60.0
START_TIMEOUT = 240.0


def profile_flags(profile: str) -> list[str]:
    """A profile is a list of flags, or {"flags": [...], "env": {...}} (environment variables for both servers)."""
    p = SERVER_PROFILES[profile]
    return list(p.get("flags", [])) if isinstance(p, dict) else list(p)


def profile_env(profile: str) -> dict[str, str]:
    p = SERVER_PROFILES[profile]
    return dict(p.get("env", {})) if isinstance(p, dict) else {}


def server_command(side: str, port: int, profile: str = "default") -> list[str]:
    common = ["--dtype", "float32", "--enforce-eager", "--max-model-len", str(MAX_MODEL_LEN),
              "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port), "--api-key", API_KEY,
              *profile_flags(profile)]
    if side == "vllm":
        py = vllm_python()
        if py is None:
            raise RuntimeError("no .venv-vllm: run `make vllm` first (or compare against the recording)")
        return [str(py), "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL_DIR,
                "--kv-cache-memory-bytes", str(256 << 20), *common]
    return [sys.executable, "-m", "minivllm.entrypoints.cli", "serve", MODEL_DIR, *common]


@contextmanager
def running_server(side: str, log_path: Path | None = None, profile: str = "default") -> Iterator[str]:
    """A server of `side` ("vllm" or "minivllm") on loopback, started with the flags of `profile`
    (SERVER_PROFILES); yields its base URL, kills it (and its children)."""
    port = get_open_port()
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "PYTHONHASHSEED": "0", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"} | profile_env(profile)
    if side == "minivllm":
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    log = open(log_path or os.devnull, "wb")  # noqa: SIM115 (closed in the finally)
    proc = subprocess.Popen(server_command(side, port, profile), cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(url, proc, START_TIMEOUT, log_path)
        yield url
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            isolation.kill(proc)
        log.close()


# ---------------------------------------------------------------------------- sending
async def _send(client: httpx.AsyncClient, case: dict) -> dict:
    headers = {"Authorization": f"Bearer {API_KEY}"} | case.get("headers", {})
    headers = {k: v for k, v in headers.items() if v}
    kw: dict = {"headers": headers}
    if "raw" in case:
        kw["content"] = case["raw"].encode("utf-8", "surrogatepass")
    elif "body" in case:
        kw["json"] = case["body"]
    try:
        r = await client.request(case["method"], case["path"], **kw)
    except httpx.HTTPError as e:
        return {"status": None, "content_type": None, "text": f"{type(e).__name__}: {e}"}
    cors = {k: v for k, v in sorted(r.headers.items()) if k.startswith("access-control-")}
    return {"status": r.status_code, "content_type": r.headers.get("content-type", "").split(";")[0],
            "text": r.text} | ({"cors": cors} if cors else {})


async def _send_all(url: str, cases: list[dict], concurrency: int) -> list[dict]:
    sem = asyncio.Semaphore(concurrency)
    # A fresh connection per request: uvicorn closes a connection after a 500 that an exception raised, and a
    # request sent next on it would race that close (ReadError), whichever case came before.
    async with httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT,
                                 limits=httpx.Limits(max_keepalive_connections=0)) as client:
        async def one(case):
            async with sem:
                return await _send(client, case)
        # metrics, and the serial cases (the dev routes: each changes the server's state), one at a time, in order
        last = [i for i, c in enumerate(cases) if c["cat"] == "metrics" or c.get("serial")]
        first = [i for i in range(len(cases)) if i not in last]
        raw: list = [None] * len(cases)
        for i, r in zip(first, await asyncio.gather(*[one(cases[i]) for i in first]), strict=True):
            raw[i] = r
        for i in last:  # after everything else, so every family has seen traffic
            raw[i] = await one(cases[i])
    return raw


# One request at a time: every request then runs alone in its batch, so neither server's answer depends on
# what else was in flight (batched CPU matmuls can flip a near-tie between two tokens).
CONCURRENCY = 1


def send_all(url: str, cases: list[dict], concurrency: int = CONCURRENCY) -> list[dict]:
    return asyncio.run(_send_all(url, cases, concurrency))


# ---------------------------------------------------------------------------- normalizing
def shape(obj):
    """Key sets and value types at every level; a list's shape is its items' distinct shapes."""
    if isinstance(obj, dict):
        return {k: shape(v) for k, v in sorted(obj.items())}
    if isinstance(obj, list):
        shapes = []
        for s in (shape(v) for v in obj):
            if s not in shapes:
                shapes.append(s)
        return shapes
    if isinstance(obj, bool) or obj is None:
        return type(obj).__name__
    if isinstance(obj, (int, float)):
        return "number"
    return type(obj).__name__


def flatten(obj, prefix: str = "") -> dict:
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k in IGNORED_KEYS:
                continue
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(obj, list) and obj:
        out = {}
        for i, v in enumerate(obj):
            out.update(flatten(v, f"{prefix}[{i}]"))
        return out
    return {prefix: obj}


def sampled(case: dict) -> bool:
    """Temperature > 0 without a seed: the text is not reproducible, so only shapes count. A render or derender
    answer samples nothing; /inference/v1/generate carries its temperature and seed in sampling_params."""
    body = case.get("body")
    if not isinstance(body, dict) or case["path"].endswith(("/render", "/derender", "/count_tokens")):
        return False
    if case["path"] == "/inference/v1/generate":
        body = body.get("sampling_params") if isinstance(body.get("sampling_params"), dict) else {}
    t = body.get("temperature", 1.0)
    return (t is None or (isinstance(t, (int, float)) and t > 1e-5)) and body.get("seed") is None


# The pinned vLLM's SamplingParams defaults (vllm/sampling_params.py). Its render answer serializes the struct with
# msgspec's omit_defaults, which keeps a float passed explicitly even at its default (0.0 is not the default's
# object) and drops an equal int: which keys appear is an artifact, so both sides are compared with every
# default filled in.
SAMPLING_DEFAULTS = {"n": 1, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
                     "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": None, "stop": [],
                     "stop_token_ids": [], "ignore_eos": False, "max_tokens": 16, "min_tokens": 0, "logprobs": None,
                     "prompt_logprobs": None, "include_stop_str_in_output": False, "skip_special_tokens": True,
                     "structured_outputs": None, "logit_bias": None, "allowed_token_ids": None, "bad_words": [],
                     "output_kind": 0, "skip_clone": False, "skip_reading_prefix_cache": None}
RANDOM_ID = re.compile(r"^(.*?)[0-9a-f]{16,32}$")


def _canonical(obj):
    """Render answers' sampling_params with the defaults filled in; random request ids as <random>."""
    if isinstance(obj, list):
        return [_canonical(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    out = {k: _canonical(v) for k, v in obj.items()}
    if isinstance(out.get("sampling_params"), dict):
        out["sampling_params"] = SAMPLING_DEFAULTS | out["sampling_params"]
    for key in ("request_id", "call_id", "item_id"):  # random ids (a Responses function call's and item's too)
        if isinstance(out.get(key), str) and (m := RANDOM_ID.match(out[key])):
            out[key] = m.group(1) + "<random>"
    return out


def _responses_event(m: dict, c: dict) -> None:
    """/v1/responses' typed events merged: the event types in order (repeats collapsed: how many deltas a text
    takes depends on load), whether sequence_number counts from 0, the text, call arguments and logprobs the
    deltas carry, every other event whole (random ids as <random>), and the responses in created, in_progress and
    completed."""
    kind = c["type"]
    if kind not in m["events"][-1:]:
        m["events"].append(kind)
    m["sequence_ok"] = m.get("sequence_ok", True) and c.get("sequence_number") == m.setdefault("count", 0)
    m["count"] += 1
    if kind == "response.output_text.delta":
        m["text"] += c.get("delta") or ""
        m["logprobs"] += c.get("logprobs") or []
    elif kind == "response.function_call_arguments.delta":
        m["arguments"] += c.get("delta") or ""
    elif "response" in c:
        m[kind.rsplit(".", 1)[-1]] = _canonical(c["response"])
    else:
        m["items"].append(_canonical({k: v for k, v in c.items() if k != "sequence_number"}))


def _values(obj, case: dict) -> dict:
    values = {}
    mask = sampled(case)
    for path, v in flatten(obj).items():
        last = path.rsplit(".", 1)[-1].split("[", 1)[0]
        if path in TYPE_ONLY_PATHS or last in TYPE_ONLY_KEYS or (mask and (last in TEXT_KEYS or
                                                                          ".top_logprobs." in path)):
            v = shape(v)
        values[path] = v
    if mask:  # sampled top_logprobs are keyed by token text: keep their count only
        values = {p: v for p, v in values.items() if ".top_logprobs." not in p}
    return values


def _stream(text: str, case: dict) -> dict:
    """An SSE body: framing, the distinct chunk shapes, and the chunks' content merged per choice."""
    events, bad_lines = [], []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        for line in block.split("\n"):
            if line.startswith("data: "):
                events.append(line[len("data: "):])
            elif not line.startswith("event: "):  # Anthropic's streams name each event's type before its data
                bad_lines.append(line[:40])
    done = bool(events) and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    shapes = []
    for c in chunks:
        s = shape({k: v for k, v in c.items() if k not in IGNORED_KEYS})
        if s not in shapes:
            shapes.append(s)
    merged: dict = {}
    for c in chunks:
        if str(c.get("type")).startswith("response.") or (c.get("type") == "error" and "sequence_number" in c):
            _responses_event(merged.setdefault("response", {"events": [], "text": "", "arguments": "", "logprobs": [],
                                                            "items": []}), c)
            continue
        if c.get("type") in ANTHROPIC_EVENTS:  # /v1/messages: the message merged from its events
            m = merged.setdefault("message", {"events": [], "text": "", "partial_json": ""})
            if c["type"] not in m["events"][-1:]:
                m["events"].append(c["type"])
            delta = c.get("delta") or {}
            m["text"] += delta.get("text") or ""
            m["partial_json"] += delta.get("partial_json") or ""
            for key in ("stop_reason", "stop_sequence"):
                if key in delta:
                    m[key] = delta[key]
            if c.get("usage") is not None:
                m["usage"] = c["usage"]
            if c.get("error") is not None:
                m["error"] = {k: v for k, v in c["error"].items() if k != "message"}
            continue
        if "error" in c:
            merged["error"] = {k: v for k, v in c["error"].items() if k != "message"}
        if c.get("usage") is not None and not c.get("choices"):
            merged["usage"] = c["usage"]
        for ch in c.get("choices", []):
            m = merged.setdefault(f"choice{ch['index']}", {"text": "", "token_ids": [], "logprobs": []})
            delta = ch.get("delta", {})
            m["text"] += ch.get("text") or delta.get("content") or ""
            if delta.get("role"):
                m["role"] = delta["role"]
            m["token_ids"] += ch.get("token_ids") or []
            if ch.get("prompt_token_ids"):
                m["prompt_token_ids"] = ch["prompt_token_ids"]
            lp = ch.get("logprobs")
            if isinstance(lp, dict):
                if "content" in lp:
                    m["logprobs"] += lp["content"] or []
                else:
                    m["logprobs"] += [dict(zip(("token", "logprob", "top", "offset"), t, strict=True)) for t in
                                      zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], lp["text_offset"],
                                          strict=True)]
            if ch.get("finish_reason") is not None:
                m["finish_reason"], m["stop_reason"] = ch["finish_reason"], ch.get("stop_reason")
    if "response" in merged:
        merged["response"].pop("count", None)  # how many events: the number of deltas, which load changes
    return {"done_last": done, "bad_lines": sorted(set(bad_lines)), "chunk_shapes": shapes,
            "values": _values(merged, case)}


def _metric_families(text: str) -> list[str]:
    fams = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            fams.add(f"{name.replace('minivllm:', 'vllm:', 1)} {kind}")
    return sorted(fams)


def normalize(case: dict, raw: dict) -> dict:
    out = {"status": raw["status"], "content_type": raw["content_type"]}
    if raw.get("cors"):  # the CORS headers a browser client needs (CORSMiddleware on both sides)
        out["cors"] = raw["cors"]
    text = raw["text"]
    if case["path"] == "/metrics" and raw["status"] == 200:
        out["families"] = _metric_families(text)
    elif case["path"] == "/openapi.json" and raw["status"] == 200:  # the routes and their methods, not the schemas
        out["routes"] = sorted(f"{m.upper()} {p}" for p, ops in json.loads(text)["paths"].items() for m in ops)
    elif raw["content_type"] == "text/html":  # FastAPI's /docs and /redoc pages: their title is the app's
        out["text"] = "<html>"
    elif raw["content_type"] == "text/event-stream":
        out["sse"] = _stream(text, case)
    else:
        try:
            body = json.loads(text) if text else None
        except ValueError:
            out["text"] = text[:200]
        else:
            body = _canonical(body)
            out["shape"] = shape(body if not isinstance(body, dict) else
                                 {k: v for k, v in body.items() if k not in IGNORED_KEYS})
            out["values"] = _values(body, case)
    return out


# ---------------------------------------------------------------------------- comparing
def _equal(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a == b and type(a) is type(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, abs_tol=TOL) if isinstance(a, float) or isinstance(b, float) else a == b
    return a == b


def _chunk_schemas(shapes: list) -> list:
    """Chunk shapes with each completions `top_logprobs` entry keyed "<token i>" instead of by the token's text, then
    deduplicated: those keys are values (compared in the merged stream), and under load either server sends two
    steps' tokens in one chunk, whose list of entries would otherwise be a shape of its own."""
    out = []
    for s in shapes:
        s = copy.deepcopy(s)
        for ch in s.get("choices") or [] if isinstance(s, dict) else []:
            lp = ch.get("logprobs") if isinstance(ch, dict) else None
            if isinstance(lp, dict) and isinstance(lp.get("top_logprobs"), list):
                entries = [{f"<token {i}>": v for i, v in enumerate(d.values())} if isinstance(d, dict) else d
                           for d in lp["top_logprobs"]]
                lp["top_logprobs"] = [e for i, e in enumerate(entries) if e not in entries[:i]]
        if s not in out:
            out.append(s)
    return out


def differences(a: dict, b: dict) -> list[str]:
    """Every field where the normalized answers a (vLLM) and b (minivllm) differ, as 'field: vLLM ... minivllm ...'."""
    diffs = []
    for key in ("status", "content_type", "text", "cors"):
        if a.get(key) != b.get(key):
            diffs.append(f"{key}: vLLM {a.get(key)!r}, minivllm {b.get(key)!r}")
    for key, what in (("routes", "route"), ("families", "metric family")):  # /openapi.json's routes, /metrics'
        xa, xb = set(a.get(key, [])), set(b.get(key, []))
        diffs += [f"{what} {x}: vLLM only" for x in sorted(xa - xb)]
        diffs += [f"{what} {x}: minivllm only" for x in sorted(xb - xa)]
    sa, sb = a.get("sse"), b.get("sse")
    if (sa is None) != (sb is None):
        diffs.append(f"sse: vLLM {'streamed' if sa else 'did not stream'}, minivllm "
                     f"{'streamed' if sb else 'did not stream'}")
    elif sa is not None:
        for key in ("done_last", "bad_lines"):
            if sa[key] != sb[key]:
                diffs.append(f"sse.{key}: vLLM {sa[key]!r}, minivllm {sb[key]!r}")
        shapes_a, shapes_b = _chunk_schemas(sa["chunk_shapes"]), _chunk_schemas(sb["chunk_shapes"])
        only_a = [s for s in shapes_a if s not in shapes_b]
        only_b = [s for s in shapes_b if s not in shapes_a]
        if only_a or only_b:
            diffs.append(f"sse.chunk_shapes: vLLM only {json.dumps(only_a)[:300]}, minivllm only "
                         f"{json.dumps(only_b)[:300]}")
        diffs += _value_diffs(sa["values"], sb["values"], "sse.")
    if a.get("shape") != b.get("shape") and "shape" in a and "shape" in b:
        diffs.append(f"shape: vLLM {json.dumps(a['shape'])[:400]}, minivllm {json.dumps(b['shape'])[:400]}")
    if "values" in a and "values" in b:
        diffs += _value_diffs(a["values"], b["values"], "")
    elif ("values" in a) != ("values" in b):
        diffs.append("body: one side is not JSON")
    return diffs


def _value_diffs(va: dict, vb: dict, prefix: str) -> list[str]:
    out = []
    for path in sorted(set(va) | set(vb)):
        if path not in va or path not in vb:
            out.append(f"{prefix}{path}: vLLM {va.get(path, '<absent>')!r}, minivllm {vb.get(path, '<absent>')!r}")
        elif not _equal(va[path], vb[path]):
            out.append(f"{prefix}{path}: vLLM {va[path]!r}, minivllm {vb[path]!r}")
    return out


def first_divergence(case: dict, a: dict, b: dict) -> str | None:
    d = differences(a, b)
    return f"{case['name']} ({case['method']} {case['path']}): {'; '.join(d[:3])}" if d else None


# ---------------------------------------------------------------------------- recording and reports
def answers_of(side: str, cases: list[dict], log_path: Path | None = None,
               concurrency: int = CONCURRENCY) -> list[dict]:
    """Each profile's cases go to a server started with that profile's flags, one server after the other."""
    raw: list = [None] * len(cases)
    for profile in SERVER_PROFILES:
        idx = [i for i, c in enumerate(cases) if c.get("server", "default") == profile]
        if not idx:
            continue
        with running_server(side, log_path, profile) as url:
            for i, r in zip(idx, send_all(url, [cases[i] for i in idx], concurrency), strict=True):
                raw[i] = r
    return [normalize(c, r) for c, r in zip(cases, raw, strict=True)]


def recording_header() -> dict:
    """What the server recording says beyond the common header: the profiles and vLLM's command line."""
    return {"server_profiles": SERVER_PROFILES,
            "served_by": "python -m vllm.entrypoints.openai.api_server " + " ".join(
                server_command("vllm", 0)[3:]).replace("--port 0 ", "")}


def load_golden() -> dict:
    """The recording's header and vLLM's answers, case by case (refused if server_corpus.py changed since)."""
    from autograder.vllm_oracle import load_recording

    return {"header": load_recording(SERVER)["header"], "answers": recorded(SERVER, payload=server_cases())}


def check(live: bool = False) -> list[str]:
    """minivllm's server against the recording (or live vLLM's): each diverging case's first divergence."""
    cases = server_cases()
    vllm = answers_of("vllm", cases) if live else load_golden()["answers"]
    return list(report(cases, vllm, answers_of("minivllm", cases))["diverging"].values())


def report(cases: list[dict], vllm: list[dict], mine: list[dict]) -> dict:
    """Matching counts by category, and the first divergence of every case that differs."""
    by_cat = {cat: [0, 0] for cat in CATS}
    diverging = {}
    for c, a, b in zip(cases, vllm, mine, strict=True):
        d = first_divergence(c, a, b)
        by_cat[c["cat"]][1] += 1
        by_cat[c["cat"]][0] += d is None
        if d:
            diverging[c["name"]] = d
    fams = [(set(a.get("families", [])), set(b.get("families", []))) for c, a, b in
            zip(cases, vllm, mine, strict=True) if c["cat"] == "metrics"]
    out = {"by_category": {k: f"{v[0]}/{v[1]}" for k, v in by_cat.items()},
           "total": f"{sum(v[0] for v in by_cat.values())}/{len(cases)}", "diverging": diverging}
    if fams:
        fa, fb = fams[0]
        out["metric_families"] = f"{len(fa & fb)}/{len(fa)} of vLLM's families in minivllm"
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m autograder.vllm_oracle.server_diff", description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=["record", "compare"])
    ap.add_argument("--live", action="store_true", help="compare against a live vLLM server, not the recording")
    ap.add_argument("--save", type=Path, help="write the report (counts and divergences) here as JSON")
    args = ap.parse_args(argv)
    cases = server_cases()
    if args.command == "record":
        vllm = record(SERVER)["answers"]["cases"]
        print(f"server: recorded {len(vllm)} answers")
    else:
        vllm = answers_of("vllm", cases) if args.live else load_golden()["answers"]
    mine = answers_of("minivllm", cases)
    rep = report(cases, vllm, mine)
    if args.save:
        args.save.write_text(json.dumps(rep, indent=1, ensure_ascii=False))
    print(json.dumps({k: v for k, v in rep.items() if k != "diverging"}, indent=1))
    for d in list(rep["diverging"].values())[:40]:
        print("   ", d[:400])
    return 1 if rep["diverging"] else 0


if __name__ == "__main__":
    sys.exit(main())
