"""The OpenAI-compatible server, driven by the real openai client over loopback.

One `minivllm serve` subprocess (with its EngineCore grandchild) on a tiny random model serves the
module; the last test kills its EngineCore and checks that streams fail fast and /health says 503.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from httpx_sse import connect_sse

from minivllm.benchmarks.ready_checker import wait_for_health
from minivllm.distributed.parallel_state import get_open_port as free_port  # noqa: F401  (other tests import it from here)
from minivllm.entrypoints.llm import LLM
from minivllm.entrypoints.openai.metrics import parse_prometheus
from minivllm.sampling_params import SamplingParams

API_KEY = "sk-minivllm-test"
NAME = "tiny"
ENGINE = dict(device="cpu", attention_backend="torch", max_num_seqs=64)


@pytest.fixture(scope="module")
def model(tiny_model):
    # Long context: a request of 4000 tokens cannot finish by itself while the abort test watches.
    return tiny_model("llama", max_position_embeddings=4096)


def launch_server(model: str, port: int, log, *extra: str, env: dict | None = None) -> subprocess.Popen:
    """`minivllm serve` on loopback, returned once /health answers 200."""
    cmd = [sys.executable, "-m", "minivllm.entrypoints.cli", "serve", model, "--host", "127.0.0.1", "--port",
           str(port), "--api-key", API_KEY, "--served-model-name", NAME, "--device", "cpu",
           "--attention-backend", "torch", "--max-num-seqs", "64", *extra]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parent.parent,
                            env=env)
    wait_for_health(f"http://127.0.0.1:{port}", proc, 120, log.name)
    return proc


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    port = free_port()
    log = open(tmp_path_factory.mktemp("log") / "server.log", "w+")
    proc = launch_server(model, port, log, "--enable-server-load-tracking")
    try:
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        stop_server(proc)
        log.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[1] + "/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def offline(model):
    return LLM(model, multiprocess=False, **ENGINE)


def greedy_text(offline, prompts, n=16) -> list[str]:
    outs = offline.generate(prompts, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True), use_tqdm=False)
    return [o.outputs[0].text for o in outs]


def metrics(base) -> dict[str, float]:
    text = httpx.get(base + "/metrics", timeout=10).text
    return {k.split("{")[0].removeprefix("minivllm:") + ("{" + k.split("{")[1] if "finished_reason" in k else ""): v
            for k, v in parse_prometheus(text).items()}


GREEDY = dict(temperature=0.0, extra_body={"ignore_eos": True})


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [NAME]
    assert httpx.get(server[1] + "/health").status_code == 200  # no key needed outside /v1


def test_completion_stream_and_not(client, offline, server):
    [ref] = greedy_text(offline, ["ROMEO: wherefore"])
    full = client.completions.create(model=NAME, prompt="ROMEO: wherefore", max_tokens=16, **GREEDY)
    assert full.choices[0].text == ref and full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 16 and full.usage.prompt_tokens > 0
    chunks = list(client.completions.create(model=NAME, prompt="ROMEO: wherefore", max_tokens=16, stream=True,
                                            stream_options={"include_usage": True}, **GREEDY))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == ref
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    # the raw SSE framing: what this checks, so read by hand rather than through httpx_sse
    body = httpx.post(server[1] + "/v1/completions", headers={"Authorization": f"Bearer {API_KEY}"},
                      json={"prompt": "x", "max_tokens": 3, "stream": True}).text
    events = [e for e in body.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    assert all("choices" in json.loads(e[6:]) for e in events[:-1])


def test_render_generate_derender_round_trip_gives_the_completion(server, offline):
    """The disaggregated path, as a router runs it: render the request, stream tokens from /inference/v1/generate,
    and turn each chunk back into text with the streamed derender, carrying its state between calls (the pinned vLLM's
    scale_out routes). The text equals the completions route's; non-streamed derender of the ids equals it too."""
    base, auth = server[1], {"Authorization": f"Bearer {API_KEY}"}
    [ref] = greedy_text(offline, ["ROMEO: wherefore"], 24)
    [gen_req] = httpx.post(base + "/v1/completions/render", headers=auth, json={
        "model": NAME, "prompt": "ROMEO: wherefore", "max_tokens": 24, "temperature": 0, "ignore_eos": True}).json()
    with httpx.Client(headers=auth, timeout=60) as c, \
            connect_sse(c, "POST", base + "/inference/v1/generate", json=gen_req | {"stream": True}) as source:
        chunks = [sse.json() for sse in source.iter_sse() if sse.data != "[DONE]"]
    assert len(chunks) > 1
    state, text, ids = None, "", []
    for chunk in chunks:
        r = httpx.post(base + "/v1/completions/derender", headers=auth, json={
            "model": NAME, "stream": True, "generate_chunk": chunk, "stream_state": state}).json()
        state = r["stream_state"]
        assert len(state["prev_tokens"]) <= 8  # the carried window stays a few tokens, however long the output
        text += "".join(c["text"] for c in r["chunk"]["choices"])
        ids += [t for c in chunk["choices"] for t in c["token_ids"] or []]
    assert len(ids) == 24 and text == ref
    whole = httpx.post(base + "/v1/completions/derender", headers=auth, json={
        "model": NAME, "generate_responses": [{"request_id": "r", "choices": [{"index": 0, "token_ids": ids}]}]})
    assert whole.json()["choices"][0]["text"] == ref


def test_batch_prompts_and_token_ids(client, offline):
    refs = greedy_text(offline, ["a", "b c", [5, 6, 7, 8]], 8)
    out = client.completions.create(model=NAME, prompt=["a", "b c"], max_tokens=8, **GREEDY)
    assert [c.text for c in sorted(out.choices, key=lambda c: c.index)] == refs[:2]
    assert client.completions.create(model=NAME, prompt=[5, 6, 7, 8], max_tokens=8, **GREEDY).choices[0].text == refs[2]


def test_chat_stream_and_not(client, server):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Speak, Horatio."}]
    full = client.chat.completions.create(model=NAME, messages=msgs, max_tokens=12, **GREEDY)
    assert full.choices[0].message.role == "assistant" and full.usage.completion_tokens == 12
    chunks = list(client.chat.completions.create(model=NAME, messages=msgs, max_tokens=12, stream=True,
                                                 stream_options={"include_usage": True}, **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full.choices[0].message.content
    assert chunks[-1].usage.total_tokens == full.usage.total_tokens
    tok = httpx.post(server[1] + "/tokenize", json={"messages": msgs},
                     headers={"Authorization": f"Bearer {API_KEY}"}).json()
    assert tok["count"] == full.usage.prompt_tokens


def test_responses_answers_text_input_through_the_chat_template(server, client, offline):
    """POST /v1/responses (vLLM's Responses API, non-streamed text): the instructions and input render as a chat
    (system, user), tokenized with the special tokens added as vLLM's ResponsesRequest.build_tok_params does; the
    greedy output is the offline one for those ids, in a response object with vLLM's fields."""
    auth = {"Authorization": f"Bearer {API_KEY}"}
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Speak, Horatio."}]
    tok = httpx.post(server[1] + "/tokenize", json={"messages": msgs, "add_special_tokens": True}, headers=auth).json()
    [ref] = greedy_text(offline, [tok["tokens"]], 6)
    r = client.responses.create(model=NAME, instructions="Be brief.", input="Speak, Horatio.", max_output_tokens=6,
                                **GREEDY)
    assert r.object == "response" and r.output_text == ref and r.output[0].role == "assistant"
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert (r.usage.input_tokens, r.usage.output_tokens, r.max_output_tokens) == (tok["count"], 6, 6)
    assert r.tool_choice == "none" and r.temperature == 0.0 and r.instructions == "Be brief."
    listed = client.responses.create(model=NAME, input=[{"role": "system", "content": "Be brief."}, {
        "role": "user", "content": [{"type": "input_text", "text": "Speak, Horatio."}]}], max_output_tokens=6, **GREEDY)
    assert listed.output_text == ref
    refused = httpx.post(server[1] + "/v1/responses", headers=auth, json={"input": "hi", "background": True})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "background"
    assert httpx.post(server[1] + "/v1/responses", headers=auth, json={}).json()["error"]["param"] == "body.input"


def test_logprob_tokens_of_a_split_character_join_to_the_text(client):
    """A character split across byte tokens: each logprob `token` is the engine's decoded token, as vLLM's
    _get_decoded_token gives it ('' for the bytes before the last, then the whole character, never U+FFFD), so the
    tokens join to the text; and a streamed token whose text is held back still goes out with its entry."""
    text = "café — naïve ✓"
    echo = client.completions.create(model=NAME, prompt=text, max_tokens=1, logprobs=1, echo=True, **GREEDY)
    tokens = echo.choices[0].logprobs.tokens
    assert "".join(tokens[1:echo.usage.prompt_tokens]) == text and "\ufffd" not in "".join(tokens)
    assert "" in tokens  # the leading bytes of é, — and ✓
    chunks = list(client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "x"}], max_tokens=16, logprobs=True, top_logprobs=1,
        stream=True, stream_options={"include_usage": True}, temperature=0.0,
        extra_body={"structured_outputs": {"choice": ["café ✓ naïve"]}}))
    entries = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "café ✓ naïve"
    assert len(entries) == chunks[-1].usage.completion_tokens
    assert "".join(e.token for e in entries).startswith("café ✓ naïve")
    assert all("\ufffd" not in e.token and "\ufffd" not in t.token for e in entries for t in e.top_logprobs)


def test_sampling_options(client):
    kw = dict(model=NAME, prompt="KING:", max_tokens=12, temperature=1.0)
    a = client.completions.create(seed=7, **kw).choices[0].text
    assert a == client.completions.create(seed=7, **kw).choices[0].text
    texts = {client.completions.create(seed=s, **kw).choices[0].text for s in range(4)}
    assert len(texts) > 1, "different seeds should sample differently"
    lp = client.completions.create(model=NAME, prompt="KING:", max_tokens=4, logprobs=3, **GREEDY).choices[0].logprobs
    assert len(lp.tokens) == 4 and all(len(t) == 3 for t in lp.top_logprobs)
    assert all(t <= 0 and abs(t - max(top.values())) < 1e-5 for t, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True))
    chat = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                          logprobs=True, top_logprobs=2, **GREEDY)
    assert len(chat.choices[0].logprobs.content) == 3 and len(chat.choices[0].logprobs.content[0].top_logprobs) == 2
    base = client.completions.create(model=NAME, prompt="KING:", max_tokens=20, **GREEDY).choices[0].text
    stop = base[6:9]
    cut = client.completions.create(model=NAME, prompt="KING:", max_tokens=20, stop=[stop], **GREEDY).choices[0]
    assert cut.text == base[:base.index(stop)] and cut.finish_reason == "stop"
    k1 = client.completions.create(model=NAME, prompt="KING:", max_tokens=8, temperature=2.0, seed=1,
                                   extra_body={"top_k": 1, "min_p": 0.0, "ignore_eos": True}).choices[0].text
    assert k1 == client.completions.create(model=NAME, prompt="KING:", max_tokens=8, **GREEDY).choices[0].text


def test_concurrent_streams_equal_offline(server, offline):
    prompts = [f"Scene {i}: enter {'the king ' * (i % 5)}and {i} lords" for i in range(64)]
    refs = greedy_text(offline, prompts, 16)
    aclient = openai.AsyncOpenAI(base_url=server[1] + "/v1", api_key=API_KEY, max_retries=0, timeout=120)

    async def one(p):
        text = ""
        async for c in await aclient.completions.create(model=NAME, prompt=p, max_tokens=16, stream=True, **GREEDY):
            text += c.choices[0].text if c.choices else ""
        return text

    async def main():
        try:
            return await asyncio.gather(*(one(p) for p in prompts))
        finally:
            await aclient.close()
    assert asyncio.run(main()) == refs


def test_load_counts_requests_in_flight(server, client):
    """vLLM's /load with --enable-server-load-tracking: a request counts until its last byte is sent (a stream
    the client drops included), so the counter returns to 0."""
    base = server[1]

    def load() -> int:
        return httpx.get(base + "/load", timeout=10).json()["server_load"]

    def settles_at_zero() -> bool:
        deadline = time.monotonic() + 30
        while load() and time.monotonic() < deadline:
            time.sleep(0.1)
        return load() == 0
    assert settles_at_zero()
    stream = client.completions.create(model=NAME, prompt="A long speech:", max_tokens=4000, stream=True, **GREEDY)
    for i, _ in enumerate(stream):
        if i == 2:
            break
    assert load() == 1
    stream.close()
    assert settles_at_zero()
    client.completions.create(model=NAME, prompt="KING:", max_tokens=4, **GREEDY)
    assert load() == 0


def test_disconnect_aborts_and_frees_kv(server, client):
    base = server[1]
    before = metrics(base)
    stream = client.completions.create(model=NAME, prompt="A long speech:", max_tokens=4000, stream=True, **GREEDY)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    busy = metrics(base)
    assert busy["num_requests_running"] == 1 and busy["kv_cache_usage_perc"] > 0
    stream.close()  # the client goes away mid-stream
    m = wait_idle(base)
    assert m["num_free_kv_blocks"] == before["num_free_kv_blocks"] == m["num_total_kv_blocks"]
    # Aborted, not run to its 4,000 tokens (counted, not timed: a slow machine changes no verdict).
    assert m[ABORTED] == before.get(ABORTED, 0) + 1, m
    assert m["generation_tokens_total"] - busy["generation_tokens_total"] < 3000


def test_disconnect_non_streaming_aborts(server):
    base = server[1]
    before = metrics(base)
    with pytest.raises(httpx.ReadTimeout):  # the client gives up while the server is still generating
        httpx.post(base + "/v1/completions", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=1.0,
                   json={"model": NAME, "prompt": "Another long speech:", "max_tokens": 4000, "ignore_eos": True})
    m = wait_idle(base)
    assert m[ABORTED] == before.get(ABORTED, 0) + 1, m
    assert m["generation_tokens_total"] - before["generation_tokens_total"] < 4000


ABORTED = 'request_success_total{finished_reason="abort",model_name="tiny"}'


def wait_idle(base, limit_s: float = 120.0) -> dict[str, float]:
    """The metrics once no request runs and no KV block is held. The limit only keeps a hung server from hanging
    the suite; the verdicts are the counters the caller asserts on."""
    t0 = time.monotonic()
    while (m := metrics(base))["num_requests_running"] or m["kv_cache_usage_perc"]:
        assert time.monotonic() - t0 < limit_s, f"the core still holds the request after {limit_s:.0f} s: {m}"
        time.sleep(0.05)
    return m


BAD_REQUESTS = [  # (path, json body or raw bytes, expected status)
    ("/v1/completions", {"model": NAME}, 400),                                   # no prompt
    ("/v1/completions", {"model": NAME, "prompt": "x", "max_tokens": 0}, 400),
    ("/v1/completions", {"model": NAME, "prompt": "x", "max_tokens": -5}, 400),
    ("/v1/completions", {"model": NAME, "prompt": "x", "temperature": -1}, 400),
    ("/v1/completions", {"model": NAME, "prompt": "x", "top_p": 0}, 400),
    ("/v1/completions", {"model": NAME, "prompt": "x", "top_p": 1.5}, 400),
    ("/v1/completions", {"model": NAME, "prompt": "x", "top_k": -7}, 400),
    ("/v1/completions", {"model": NAME, "prompt": "x", "min_p": 2}, 400),
    ("/v1/completions", {"model": NAME, "prompt": "x", "n": 3, "temperature": 0}, 400),  # greedy n > 1
    ("/v1/completions", {"model": NAME, "prompt": "x", "logprobs": 999}, 400),
    ("/v1/completions", {"model": NAME, "prompt": "x", "stop": [""]}, 400),
    ("/v1/completions", {"model": NAME, "prompt": "x", "temperature": "hot"}, 400),
    ("/v1/completions", {"model": NAME, "prompt": [], "max_tokens": 2}, 400),
    ("/v1/completions", {"model": NAME, "prompt": [1, 10 ** 7]}, 400),          # out of vocabulary
    ("/v1/completions", {"model": NAME, "prompt": list(range(10, 4200))}, 400),  # longer than max_model_len
    ("/v1/completions", {"model": NAME, "prompt": "x", "presence_penalty": 3}, 400),
    ("/v1/completions", {"model": NAME, "prompt": "x", "repetition_penalty": 0}, 400),
    ("/v1/completions", {"model": NAME, "prompt": "", "max_tokens": 2}, 400),
    ("/v1/completions", {"model": NAME, "prompt": "x", "stream_options": {"include_usage": True}}, 400),
    ("/v1/completions", {"model": NAME, "prompt": "x", "min_tokens": 9, "max_tokens": 2}, 400),
    ("/v1/completions", {"model": "gpt-9", "prompt": "x"}, 404),
    ("/v1/completions", {"model": NAME, "prompt": "x", "stream": True, "temperature": -2}, 400),
    ("/v1/completions", b"{not json", 400),
    ("/v1/completions", b"[1, 2]", 400),
    ("/v1/chat/completions", {"model": NAME, "messages": []}, 400),
    ("/v1/chat/completions", {"model": NAME, "messages": [{"content": "x"}]}, 400),  # no role
    ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, 400),
    ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "user",
                              "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400),
    ("/v1/chat/completions", {"model": NAME, "messages": "hello"}, 400),
    ("/detokenize", {"tokens": [-1]}, 400),
    ("/tokenize", {}, 400),
]


def test_malformed_requests_get_4xx(server, client, offline):
    headers = {"Authorization": f"Bearer {API_KEY}"}
    for path, body, status in BAD_REQUESTS:
        kw = {"content": body, "headers": headers | {"Content-Type": "application/json"}} if isinstance(body, bytes) \
            else {"json": body, "headers": headers}
        r = httpx.post(server[1] + path, timeout=30, **kw)
        assert r.status_code == status, (path, body, r.status_code, r.text)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == status and err["message"], err
    assert httpx.get(server[1] + "/health").status_code == 200
    [ref] = greedy_text(offline, ["still serving"], 4)
    assert client.completions.create(model=NAME, prompt="still serving", max_tokens=4, **GREEDY).choices[0].text == ref
    with pytest.raises(openai.BadRequestError) as e:  # the openai client sees the same shape
        client.completions.create(model=NAME, prompt="x", temperature=-1)
    assert e.value.body["param"] == "temperature"


def test_structured_outputs_with_response_format_and_extra_body(client, offline):
    """OpenAI's response_format and vLLM's structured_outputs extra-body key, through the real client."""
    import jsonschema
    import xgrammar as xgr
    schema = {"type": "object", "required": ["answer", "n"], "additionalProperties": False,
              "properties": {"answer": {"enum": ["yes", "no"]}, "n": {"type": "integer", "minimum": 0, "maximum": 9}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema}}
    info = xgr.TokenizerInfo.from_huggingface(offline.get_tokenizer(), vocab_size=len(offline.get_tokenizer()))
    for seed in range(3):
        out = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Judge him."}],
                                             max_tokens=48, temperature=1.0, seed=seed, response_format=fmt)
        text, reason = out.choices[0].message.content, out.choices[0].finish_reason
        if reason == "stop":
            jsonschema.validate(json.loads(text), schema)
        else:  # length-capped: a prefix the grammar still accepts
            matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_json_schema(json.dumps(schema)))
            assert reason == "length" and matcher.accept_string(text), text
    obj = client.completions.create(model=NAME, prompt="ROMEO:", max_tokens=4, temperature=0.0,
                                    extra_body={"response_format": {"type": "json_object"}}).choices[0].text
    assert obj.lstrip().startswith("{")
    choices = ["alas", "forsooth", "anon"]
    for seed in range(3):
        out = client.completions.create(model=NAME, prompt="ROMEO:", max_tokens=8, temperature=1.0, seed=seed,
                                        extra_body={"structured_outputs": {"choice": choices}})
        assert out.choices[0].text in choices and out.choices[0].finish_reason == "stop"
    out = client.completions.create(model=NAME, prompt="ROMEO:", max_tokens=12, temperature=0.0,
                                    extra_body={"structured_outputs": {"regex": "[0-9]{2}-[a-z]{2,4}"}})
    assert re.fullmatch("[0-9]{2}-[a-z]{2,4}", out.choices[0].text)


def test_bad_structured_outputs_are_400_naming_the_problem(client):
    bad_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}
    cases = [({"extra_body": {"response_format": bad_schema}}, "structured_outputs.json: invalid JSON schema"),
             ({"extra_body": {"structured_outputs": {"regex": "(unclosed"}}}, "structured_outputs.regex"),
             ({"extra_body": {"structured_outputs": {"choice": ["a"], "regex": "b"}}}, "one kind of constraints"),
             ({"extra_body": {"structured_outputs": {"choise": ["a"]}}}, "unknown field `choise`")]
    for kwargs, message in cases:
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model=NAME, prompt="ROMEO:", max_tokens=4, **kwargs)
        assert e.value.status_code == 400 and message in e.value.message, e.value.message
    assert client.completions.create(model=NAME, prompt="ROMEO:", max_tokens=2).choices[0].text is not None


def test_api_key(server):
    for key in ("wrong-key", ""):
        c = openai.OpenAI(base_url=server[1] + "/v1", api_key=key or "x", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            c.completions.create(model=NAME, prompt="x", max_tokens=2)
    r = httpx.post(server[1] + "/v1/completions", json={"model": NAME, "prompt": "x"})  # no header at all
    assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}  # vLLM's AuthenticationMiddleware
    assert httpx.get(server[1] + "/v1/models").status_code == 401


def test_tokenize_detokenize(server):
    headers = {"Authorization": f"Bearer {API_KEY}"}
    tok = httpx.post(server[1] + "/tokenize", json={"prompt": "héllo wörld"}, headers=headers).json()
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 4096
    assert httpx.post(server[1] + "/detokenize", json={"tokens": tok["tokens"]},
                      headers=headers).json()["prompt"].endswith("héllo wörld")
    for path in ("/tokenize", "/detokenize"):  # vLLM's API key guards /v1/* only
        assert httpx.post(server[1] + path, json={"prompt": "x", "tokens": [5]}).status_code == 200
    assert httpx.post(server[1] + "/v1/completions", json={"prompt": "x"}).status_code == 401


def test_metrics_prometheus(server):
    text = httpx.get(server[1] + "/metrics").text
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prefix_cache_hit_rate",
                 "prompt_tokens_total", "generation_tokens_total", "time_to_first_token_seconds_bucket",
                 "inter_token_latency_seconds_bucket", "e2e_request_latency_seconds_count"):
        assert f"minivllm:{name}" in text, name
    m = metrics(server[1])
    assert m["time_to_first_token_seconds_count"] >= 64 and m["generation_tokens_total"] >= 64 * 16
    assert m["request_queue_time_seconds_count"] == m["time_to_first_token_seconds_count"]  # one per request
    assert m["prefix_cache_queries_total"] > 0


def test_bench_serve(server, tmp_path, capsys):
    from minivllm.entrypoints.cli import main
    port = server[1].rsplit(":", 1)[1]
    rc = main(["bench", "serve", "--port", port, "--api-key", API_KEY, "--num-prompts", "12", "--random-input-len",
               "16", "--random-output-len", "8", "--request-rate", "50", "--max-concurrency", "4", "--save-result",
               "--result-dir", str(tmp_path), "--result-filename", "r.json"])
    assert rc == 0
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["completed"] == 12 and res["failed"] == 0 and res["total_output_tokens"] == 12 * 8
    assert res["mean_ttft_ms"] > 0 and res["p99_itl_ms"] >= res["median_itl_ms"] > 0 and res["request_throughput"] > 0
    assert (tmp_path / "r.png").stat().st_size > 10_000
    out, err = capsys.readouterr()
    assert "Mean TPOT (ms):" in out and "12/12" in err  # the progress bar reached every request


AUTH = {"Authorization": f"Bearer {API_KEY}"}
BIG = 2**64
EDGE_CASES = [  # (path, json body or raw bytes, expected status, expected param)
    ("/v1/completions", {"prompt": "x", "seed": BIG}, 400, "body.seed"),
    ("/v1/completions", {"prompt": "x", "seed": -(2**63) - 1}, 400, "body.seed"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 10**9}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": BIG}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "logprobs": BIG}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "x", "n": BIG}, 400, None),  # vLLM's SamplingParams names no param for n
    ("/v1/completions", {"prompt": "x", "min_tokens": BIG}, 400, None),
    ("/v1/completions", {"prompt": "x", "stop_token_ids": [BIG]}, 400, "stop_token_ids"),
    ("/v1/completions", {"prompt": [5, BIG]}, 400, None),
    ("/v1/completions", {"prompt": "x", "temperature": 2.5}, 400, "temperature"),
    ("/v1/completions", {"prompt": "x", "top_k": -2}, 400, None),
    ("/v1/completions", {"prompt": "x", "presence_penalty": 2.5}, 400, None),
    ("/v1/completions", {"prompt": "", "max_tokens": 2}, 400, "prompt"),
    ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("/v1/completions", b'{"prompt": "x", "temperature": 1e400}', 400, "temperature"),
    ("/v1/completions", b'{"prompt": "a\\ud800b"}', 400, "body.prompt"),
    ("/v1/completions", b'{"prompt": "x", "stop": ["\\udfff"]}', 400, "body.stop"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud83d"}]}', 400,
     "body.messages.0.content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 10**6},
     400, "max_completion_tokens"),
    ("/v1/completions", {"prompt": list(range(10, 4095)), "max_tokens": 16}, 400, "input_tokens"),  # 4085 + 16 > 4096
    ("/v1/completions", {"prompt": [10 + i % 4000 for i in range(4096)], "max_tokens": None}, 400, "input_tokens"),
    ("/tokenize", b'{"prompt": "\\ud800"}', 400, "body.prompt"),
]


def test_numbers_and_text_at_the_edge(server, client, offline):
    """Big ints, out-of-range numbers, lone surrogates, no room in the context: a 400 naming the field."""
    base = server[1]
    for path, body, status, param in EDGE_CASES:
        kw = {"content": body, "headers": AUTH | {"Content-Type": "application/json"}} if isinstance(body, bytes) \
            else {"json": body, "headers": AUTH}
        r = httpx.post(base + path, timeout=30, **kw)
        assert r.status_code == status and r.json()["error"]["param"] == param, (path, body, r.text)
    r = httpx.post(base + "/v1/completions", json={"prompt": "x", "max_tokens": 10**9}, headers=AUTH)
    assert "cannot be greater than max_model_len=4096" in r.json()["error"]["message"]
    r = httpx.post(base + "/v1/completions", json={"prompt": list(range(10, 4095))}, headers=AUTH)
    assert r.json()["error"]["message"].startswith("This model's maximum context length is 4096 tokens. However, "
                                                   "you requested 16 output tokens and your prompt contains 4085")
    # top_k at or beyond the vocabulary is "off" (vLLM), not an int64 overflow that kills the engine
    kw = dict(model=NAME, prompt="KING:", max_tokens=6, temperature=1.0, seed=5)
    ref = client.completions.create(**kw).choices[0].text
    for top_k in (-1, 4096, 2**63, BIG):
        assert client.completions.create(**kw, extra_body={"top_k": top_k}).choices[0].text == ref
    # "max_tokens": null is vLLM's default of 16, not "whatever fits": no room for it after 4095 prompt tokens
    r = httpx.post(base + "/v1/completions", json={"prompt": [10 + i % 4000 for i in range(4095)], "max_tokens": None},
                   headers=AUTH, timeout=120)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_tokens", r.text
    [ref] = greedy_text(offline, ["still serving"], 4)
    assert client.completions.create(model=NAME, prompt="still serving", max_tokens=4, **GREEDY).choices[0].text == ref


def test_authorization_scheme_any_case(server):
    for header, status in ((f"bearer {API_KEY}", 200), (f"BEARER {API_KEY}", 200), (f"Bearer  {API_KEY}", 200),
                           (f"Basic {API_KEY}", 401), ("Bearer wrong", 401), (API_KEY, 401)):
        assert httpx.get(server[1] + "/v1/models", headers={"Authorization": header}).status_code == status, header
    r = httpx.get(server[1] + "/v1/models", headers={"Authorization": "Bearer wrong"})
    assert r.json() == {"error": "Unauthorized"}


def test_request_body_cap(server):
    big = b'{"prompt": "' + b"x" * (9 << 20) + b'"}'  # over the default 8 MiB
    r = httpx.post(server[1] + "/v1/completions", content=big, headers=AUTH | {"Content-Type": "application/json"},
                   timeout=60)
    assert r.status_code == 413 and r.json()["error"]["code"] == 413
    chunks = (big[i:i + (1 << 20)] for i in range(0, len(big), 1 << 20))  # no Content-Length: counted as it comes
    r = httpx.post(server[1] + "/v1/completions", content=chunks, headers=AUTH | {"Content-Type": "application/json"},
                   timeout=60)
    assert r.status_code == 413 and "8388608 bytes" in r.json()["error"]["message"]


def test_huge_prompt_does_not_stall_other_clients(server, client):
    """A 10 MB prompt trickles in; it may only be answered after another client's short completion finished,
    so the server must serve that client while the big body is still arriving (ordering, not timing)."""
    short_done = threading.Event()
    order: list[str] = []

    def big_body():
        payload = b'{"prompt": "' + b"y" * (10 << 20) + b'", "max_tokens": 4}'
        yield payload[:1 << 20]
        assert short_done.wait(120), "the short completion never finished"
        for i in range(1 << 20, len(payload), 1 << 20):
            yield payload[i:i + (1 << 20)]

    def send_big():
        r = httpx.post(server[1] + "/v1/completions", content=big_body(),
                       headers=AUTH | {"Content-Type": "application/json"}, timeout=180)
        order.append(f"big {r.status_code}")
    big = threading.Thread(target=send_big)
    big.start()
    out = client.completions.create(model=NAME, prompt="short", max_tokens=4, **GREEDY)
    order.append(f"short {out.choices[0].finish_reason}")
    short_done.set()
    big.join(180)
    assert order == ["short length", "big 413"]


def _engine_core_pid(server_pid: int) -> int:
    for child in Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split():
        if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
            return int(child)
    raise AssertionError("no EngineCore child process found")


def test_parallel_sampling_offline_and_served(client, offline):
    """n > 1 as vLLM's ParentRequest fans it out: sample j of a seeded request is the single request with seed + j,
    offline (LLM.generate groups them into one RequestOutput) and served (choices index j)."""
    sp = dict(max_tokens=6, temperature=1.0, ignore_eos=True)
    [grouped] = offline.generate(["KING:"], SamplingParams(n=3, seed=40, **sp), use_tqdm=False)
    singles = [offline.generate(["KING:"], SamplingParams(seed=40 + j, **sp), use_tqdm=False)[0].outputs[0].text
               for j in range(3)]
    assert [c.index for c in grouped.outputs] == [0, 1, 2] and [c.text for c in grouped.outputs] == singles
    served = client.completions.create(model=NAME, prompt="KING:", n=3, seed=40, max_tokens=6, temperature=1.0,
                                       extra_body={"ignore_eos": True})
    assert [c.text for c in sorted(served.choices, key=lambda c: c.index)] == singles
    assert served.usage.completion_tokens == 18 and served.usage.prompt_tokens == len(grouped.prompt_token_ids)
    with pytest.raises(ValueError, match="fan it out"):
        offline.llm_engine.add_request(None, "x", SamplingParams(n=2))


def test_killed_engine_core_fails_fast(server, client):
    """Last: SIGKILL the EngineCore with streams in flight. Each stream ends with the server's EngineDeadError
    event: the frontend saw the core die and failed its requests (a hang would end in the client's timeout, a
    dropped connection in APIConnectionError; neither is this error)."""
    proc, base = server
    aclient = openai.AsyncOpenAI(base_url=base + "/v1", api_key=API_KEY, max_retries=0, timeout=60)

    async def one(i, started):
        try:
            async for _ in await aclient.completions.create(model=NAME, prompt=f"p{i}", max_tokens=4000, stream=True,
                                                            **GREEDY):
                started.add(i)
        except openai.APIError as e:
            return (e.body or {}).get("type") if isinstance(e.body, dict) else repr(e)
        return "completed"

    async def main():
        started: set[int] = set()
        tasks = [asyncio.create_task(one(i, started)) for i in range(3)]
        while len(started) < 3:
            await asyncio.sleep(0.02)
        os.kill(_engine_core_pid(proc.pid), signal.SIGKILL)
        try:
            return await asyncio.wait_for(asyncio.gather(*tasks), 30)  # a hang guard only
        finally:
            await aclient.close()
    ends = asyncio.run(main())
    assert ends == ["EngineDeadError"] * 3, ends
    assert httpx.get(base + "/health").status_code == 503
    r = httpx.post(base + "/v1/completions", json={"model": NAME, "prompt": "x"},
                   headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 503 and r.json()["error"]["type"] == "EngineDeadError"
    assert proc.wait(20) == 1, "as vLLM, the server exits non-zero soon after its core died (for a supervisor)"
