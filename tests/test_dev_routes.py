"""The development routes (minivllm/entrypoints/serve_dev.py) on a real `minivllm serve` with VLLM_SERVER_DEV_MODE=1:
their effects, not only their answers (those are compared with vLLM's in tests/test_vllm_server_oracle.py): a reset
prefix cache gives no hit to the next identical request, a pause holds new requests until /resume (and aborts,
keeps or waits for the ones in flight), /abort_requests ends a stream by its id, /sleep frees the KV cache and
/wake_up brings it back; without the variable the routes do not exist.
"""
from __future__ import annotations

import asyncio
import os

import httpx
import pytest
from httpx_sse import EventSource
from test_api_server import API_KEY, ENGINE, NAME, free_port, launch_server, metrics, stop_server

from minivllm.entrypoints.llm import LLM
from minivllm.sampling_params import SamplingParams

PROMPT = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings"
LONG = 3000  # tokens: a request this long is still running while a test pauses or aborts it


@pytest.fixture(scope="module")
def model(tiny_model):
    return tiny_model("llama", max_position_embeddings=4096)


def _serve(model, tmp_path_factory, dev_mode: str | None):
    env = {k: v for k, v in os.environ.items() if k != "VLLM_SERVER_DEV_MODE"}
    if dev_mode is not None:
        env["VLLM_SERVER_DEV_MODE"] = dev_mode
    port = free_port()
    log = open(tmp_path_factory.mktemp("log") / "server.log", "w+")  # noqa: SIM115 (closed by the caller)
    return launch_server(model, port, log, env=env), f"http://127.0.0.1:{port}", log


@pytest.fixture(scope="module")
def base(model, tmp_path_factory):
    proc, url, log = _serve(model, tmp_path_factory, "1")
    try:
        yield url
    finally:
        stop_server(proc)
        log.close()


@pytest.fixture(scope="module")
def offline(model):
    return LLM(model, multiprocess=False, **ENGINE)


def greedy(offline, n: int) -> str:
    out = offline.generate([PROMPT], SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True), use_tqdm=False)
    return out[0].outputs[0].text


def body(max_tokens: int, **kw) -> dict:
    return {"model": NAME, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True} | kw


def run(coro):
    return asyncio.run(coro)


def client(url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120)


async def first_chunk(c: httpx.AsyncClient, max_tokens: int):
    """A streamed completion, started: (its response, its events, the first chunk)."""
    r = await c.send(c.build_request("POST", "/v1/completions", json=body(max_tokens, stream=True)), stream=True)
    events = EventSource(r).aiter_sse()
    async for sse in events:
        return r, events, sse.json()
    raise AssertionError("the stream ended before its first chunk")


async def rest_of(r: httpx.Response, events) -> tuple[str, str | None]:
    """The stream's remaining text and its finish reason."""
    text, reason = "", None
    async for sse in events:
        if sse.data != "[DONE]":
            for ch in sse.json().get("choices", []):
                text += ch.get("text") or ""
                reason = ch.get("finish_reason") or reason
    await r.aclose()
    return text, reason


def test_dev_mode_is_read_as_vllm_reads_it(monkeypatch):
    """Unset or 0: no dev routes (a live server without the variable answers 404: the corpus's default-profile
    dev case); any other integer: on; anything else refuses to start."""
    from minivllm.entrypoints.serve_dev import dev_mode_enabled

    monkeypatch.delenv("VLLM_SERVER_DEV_MODE", raising=False)
    assert dev_mode_enabled() is False
    for value, on in (("0", False), ("1", True), ("2", True)):
        monkeypatch.setenv("VLLM_SERVER_DEV_MODE", value)
        assert dev_mode_enabled() is on, value
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "yes")
    with pytest.raises(ValueError, match="VLLM_SERVER_DEV_MODE"):
        dev_mode_enabled()


def test_reset_prefix_cache_gives_the_next_identical_request_no_hit(base, offline):
    async def go():
        async with client(base) as c:
            texts = []
            for reset in (False, False, True):
                if reset:
                    assert (await c.post("/reset_prefix_cache")).json() == {"success": True}
                before = metrics(base)["prefix_cache_hits_total"]
                r = await c.post("/v1/completions", json=body(8))
                texts.append(r.json()["choices"][0]["text"])
                hits.append(metrics(base)["prefix_cache_hits_total"] - before)
            return texts
    hits: list[float] = []
    texts = run(go())
    assert hits[1] > 0, hits  # the second identical request reads the first one's blocks
    assert hits[2] == 0, hits  # after the reset: nothing cached to read
    assert texts == [greedy(offline, 8)] * 3


def test_reset_prefix_cache_refuses_while_a_request_holds_blocks_unless_told_to_preempt(base, offline):
    async def go():
        async with client(base) as c:
            r, events, chunk = await first_chunk(c, 1500)
            refused = (await c.post("/reset_prefix_cache")).json()
            forced = (await c.post("/reset_prefix_cache?reset_running_requests=true")).json()
            text, reason = await rest_of(r, events)
            again = (await c.post("/v1/completions", json=body(8))).json()["choices"][0]["text"]
            return refused, forced, chunk["choices"][0]["text"] + text, reason, again
    refused, forced, text, reason, again = run(go())
    assert refused == {"success": False} and forced == {"success": True}
    assert (text, reason) == (greedy(offline, 1500), "length")  # preempted and recomputed: the same tokens
    # the blocks it cached after its recompute hold its KV (the worker dropped its row with the old blocks)
    assert again == greedy(offline, 8)


def test_pause_holds_new_requests_until_resume(base, offline):
    async def go():
        async with client(base) as c:
            assert (await c.post("/pause")).json() == {"status": "paused"}
            assert (await c.get("/is_paused")).json() == {"is_paused": True}
            new = asyncio.create_task(c.post("/v1/completions", json=body(8)))
            await asyncio.sleep(1.5)
            held = not new.done()
            assert (await c.post("/resume")).json() == {"status": "resumed"}
            r = await asyncio.wait_for(new, 60)
            return held, r.json()["choices"][0], (await c.get("/is_paused")).json()
    held, choice, paused = run(go())
    assert held, "a request sent while paused must wait for /resume"
    assert choice["text"] == greedy(offline, 8) and choice["finish_reason"] == "length"
    assert paused == {"is_paused": False}


@pytest.mark.parametrize("mode", ["abort", "keep", "wait"])
def test_pause_modes_treat_the_request_in_flight_as_vllm_does(base, offline, mode):
    """abort: it ends at once with finish_reason "abort"; keep: it is frozen and finishes after /resume, with the
    same tokens; wait: /pause answers only once it has finished."""
    n = LONG if mode == "abort" else 400

    async def go():
        async with client(base) as c:
            r, events, chunk = await first_chunk(c, n)
            rest = asyncio.create_task(rest_of(r, events))
            assert (await c.post(f"/pause?mode={mode}")).json() == {"status": "paused"}
            done_at_pause = rest.done() or await asyncio.sleep(0.5) or rest.done()
            await c.post("/resume")
            text, reason = await asyncio.wait_for(rest, 120)
            return done_at_pause, chunk["choices"][0]["text"] + text, reason
    done_at_pause, text, reason = run(go())
    assert (done_at_pause, reason) == {"abort": (True, "abort"), "keep": (False, "length"),
                                       "wait": (True, "length")}[mode]
    assert greedy(offline, n).startswith(text) and (mode == "abort" or len(text) == len(greedy(offline, n)))
    after = httpx.post(base + "/v1/completions", json=body(8), headers={"Authorization": f"Bearer {API_KEY}"},
                       timeout=60).json()["choices"][0]["text"]
    assert after == greedy(offline, 8)  # what the request in flight left in the prefix cache is sound


def test_abort_requests_ends_a_stream_by_its_id(base):
    async def go():
        async with client(base) as c:
            r, events, chunk = await first_chunk(c, LONG)
            answer = (await c.post("/abort_requests", json={"request_ids": [chunk["id"]]})).json()
            return answer, (await asyncio.wait_for(rest_of(r, events), 60))[1]
    answer, reason = run(go())
    assert answer == {"status": "aborted", "aborted": 1} and reason == "abort"


def test_sleep_frees_the_kv_cache_and_wake_up_restores_it(base, offline):
    def rpc(method):
        return httpx.post(base + "/collective_rpc", json={"method": method}, timeout=30)

    awake = rpc("get_kv_cache_spec")
    assert awake.status_code == 200 and len(awake.json()["results"]) == 1
    assert httpx.post(base + "/sleep?level=1", timeout=30).status_code == 200
    assert httpx.get(base + "/is_sleeping", timeout=10).json() == {"is_sleeping": True}
    asleep = rpc("get_kv_cache_spec")  # the worker holds no KV cache now
    assert asleep.status_code == 500 and asleep.json()["error"]["type"] == "InternalServerError"
    assert httpx.post(base + "/wake_up?tags=weights", timeout=30).status_code == 200
    assert httpx.get(base + "/is_sleeping", timeout=10).json() == {"is_sleeping": True}  # kv_cache still asleep
    assert httpx.post(base + "/wake_up?tags=kv_cache", timeout=30).status_code == 200
    assert httpx.get(base + "/is_sleeping", timeout=10).json() == {"is_sleeping": False}
    assert rpc("get_kv_cache_spec").json() == awake.json()
    r = httpx.post(base + "/v1/completions", json=body(8), headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)
    assert r.json()["choices"][0]["text"] == greedy(offline, 8)


def test_collective_rpc_and_weight_version(base):
    assert httpx.post(base + "/collective_rpc", json={"method": "check_health"}, timeout=30).json() == {
        "results": [None]}
    bad = httpx.post(base + "/collective_rpc", json={"method": "_private"}, timeout=30)
    assert bad.status_code == 500 and "no attribute" in bad.json()["error"]["message"]
    assert httpx.post(base + "/update_weight_version", json={"new_version": "step-7"}, timeout=10).json() == {
        "success": True, "new_version": "step-7"}
    assert httpx.get(base + "/weight_info", timeout=10).json() == {"weight_version": "step-7"}
    failed = httpx.post(base + "/finish_weight_update", json={"weight_version": "step-8"}, timeout=10)
    assert failed.status_code == 500 and "weight transfer not configured" in failed.json()["error"]["message"]
    assert httpx.get(base + "/weight_info", timeout=10).json() == {"weight_version": "step-7"}
