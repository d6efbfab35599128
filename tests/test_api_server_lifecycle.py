"""The server's life and death, with real `minivllm serve` processes on loopback: kill -9 of the server
takes its EngineCore with it and the next start on the same port is not blocked; SIGTERM mid-stream stops
accepting, ends what is left after the grace period with an error event, exits 0 and removes the IPC
directory; an unexpected exception in a handler is an OpenAI-shaped 500 with a request id, logged.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn
from httpx_sse import connect_sse
from test_api_server import API_KEY, NAME, _engine_core_pid, free_port, launch_server, stop_server

from minivllm.config import EngineArgs
from minivllm.entrypoints.openai.api_server import build_app

AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def model(tiny_model):
    return tiny_model("llama", max_position_embeddings=4096)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_kill_9_then_restart_then_sigterm_mid_stream(model, tmp_path):
    port = free_port()
    ipc1, ipc2 = tmp_path / "ipc1", tmp_path / "ipc2"  # each server's IPC directory is made here (mkdtemp)
    ipc1.mkdir()
    ipc2.mkdir()
    log = open(tmp_path / "server.log", "w+")
    first = launch_server(model, port, log, env=os.environ | {"TMPDIR": str(ipc1)})
    core = _engine_core_pid(first.pid)
    first.kill()
    first.wait(10)
    deadline = time.monotonic() + 120  # a hang guard only
    while _alive(core):  # the core's parent watch notices within about a second
        assert time.monotonic() < deadline, "EngineCore outlived its killed server"
        time.sleep(0.1)

    second = launch_server(model, port, log, "--shutdown-grace-period", "1",  # same port: not blocked
                           env=os.environ | {"TMPDIR": str(ipc2)})
    assert list(ipc2.iterdir()), "the IPC directory should be under TMPDIR while serving"
    try:
        events: list[str] = []
        streaming = threading.Event()

        def stream():
            with httpx.Client(headers=AUTH, timeout=60) as c, connect_sse(
                    c, "POST", f"http://127.0.0.1:{port}/v1/completions", json={
                        "prompt": "long", "max_tokens": 4000, "ignore_eos": True, "stream": True,
                        "temperature": 0.0}) as source:
                for sse in source.iter_sse():
                    events.append(sse.data)
                    streaming.set()
        reader = threading.Thread(target=stream)
        reader.start()
        assert streaming.wait(60)
        second.send_signal(signal.SIGTERM)
        reader.join(60)
        assert second.wait(30) == 0
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert "shutting down" in error["message"] and "grace period" in error["message"], error
        # cut at the grace period (1 s), not served to its end: no chunk before the error finished the request
        reasons = {c.get("finish_reason") for e in events[:-2] for c in json.loads(e)["choices"]}
        assert len(events) > 3 and reasons == {None}, (len(events), reasons)
        with pytest.raises(httpx.ConnectError):  # no longer accepting
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
        log.seek(0)
        text = log.read()
        assert "Socket operation on non-socket" not in text and "Traceback" not in text.split("Application startup")[-1]
        assert not list(ipc2.iterdir()), "SIGTERM must remove the IPC directory"
    finally:
        if second.poll() is None:
            stop_server(second)
        log.close()


def test_unexpected_exception_is_an_openai_500_with_request_id(model, caplog):
    app = build_app(EngineArgs(model=model, device="cpu", attention_backend="torch"), NAME)

    @app.get("/v1/broken")
    async def broken():
        raise RuntimeError("a bug in a handler")

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.1)
        with caplog.at_level(logging.ERROR, logger="minivllm.api_server"):
            r = httpx.get(f"http://127.0.0.1:{port}/v1/broken", timeout=30)
        assert r.status_code == 500 and r.headers["content-type"] == "application/json"
        err = r.json()["error"]
        rid = r.headers["X-Request-Id"]
        assert err["code"] == 500 and err["type"] == "InternalServerError" and err["param"] is None
        assert rid in err["message"] and "RuntimeError" in err["message"] and "a bug" not in err["message"]
        assert any(rid in rec.getMessage() and rec.exc_info for rec in caplog.records)
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200
    finally:
        server.should_exit = True
        thread.join(30)
