"""EngineCoreProc over ZMQ: handshake, the same tokens as in-process, aborts free KV, utilities, crashes.

One spawned core serves the module (start-up costs seconds); the crash test kills it last.
"""
from __future__ import annotations

import os
import random
import time

import pytest

from minivllm.config import EngineArgs, ModelConfig, VllmConfig
from minivllm.engine import EngineCoreRequest
from minivllm.engine.core import make_vllm_config
from minivllm.engine.core_client import EngineCoreClient, InprocClient, SyncMPClient
from minivllm.engine.exceptions import EngineDeadError
from minivllm.entrypoints.llm import LLM
from minivllm.sampling_params import SamplingParams

ARGS = dict(device="cpu", attention_backend="torch", max_num_seqs=8)


@pytest.fixture(scope="module")
def model(tiny_model):
    return tiny_model("llama")


@pytest.fixture(scope="module")
def client(model):
    c = EngineCoreClient.make_client(True, False, make_vllm_config(EngineArgs(model=model, **ARGS)))
    yield c
    c.shutdown()


def requests(n: int, max_tokens: int = 10, seed: int = 0) -> list[EngineCoreRequest]:
    rng = random.Random(seed)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return [EngineCoreRequest(f"r{seed}-{i}", [rng.randrange(4, 4000) for _ in range(rng.randint(3, 40))], params, 2)
            for i in range(n)]


def run(client, reqs) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {r.request_id: [] for r in reqs}
    for r in reqs:
        client.add_request(r)
    done: set[str] = set()
    deadline = time.monotonic() + 120  # a hang guard only
    while len(done) < len(reqs):
        assert time.monotonic() < deadline, "outputs stopped coming"
        for out in client.get_output().outputs:
            tokens[out.request_id] += out.new_token_ids
            if out.finished:
                done.add(out.request_id)
    return tokens


def wait_for_tokens(client, request_id: str) -> None:
    """get_output() until request_id has produced a token (stats-only outputs come too)."""
    deadline = time.monotonic() + 120  # a hang guard only
    while not any(o.request_id == request_id and o.new_token_ids for o in client.get_output().outputs):
        assert time.monotonic() < deadline


def test_handshake(client):
    assert isinstance(client, SyncMPClient)
    assert client.engine_pid == client.resources.proc.pid != os.getpid()
    assert client.vllm_config.cache_config.num_gpu_blocks > 1  # sent back in READY


def test_same_tokens_as_inproc(client, model):
    inproc = InprocClient(make_vllm_config(EngineArgs(model=model, **ARGS)))
    reqs = requests(12, seed=1)
    got = run(client, reqs)
    assert got == run(inproc, reqs)
    assert all(len(t) == 10 for t in got.values())


def test_abort_frees_blocks(client):
    stats0 = client.get_stats()
    [r] = requests(1, max_tokens=200, seed=2)
    client.add_request(r)
    wait_for_tokens(client, r.request_id)
    stats = client.get_stats()
    assert stats.num_running_reqs == 1 and stats.num_free_blocks < stats0.num_free_blocks
    client.abort_requests([r.request_id])
    deadline = time.monotonic() + 120  # a hang guard only: the loop ends on the state, not on a time
    while (s := client.get_stats()).num_running_reqs or s.num_free_blocks != stats0.num_free_blocks:
        assert time.monotonic() < deadline, s
        time.sleep(0.05)
    assert s.kv_cache_usage == 0.0


def test_utility_errors_are_reported_not_fatal(client):
    with pytest.raises(RuntimeError, match="not a utility method"):
        client.call_utility("shutdown")
    with pytest.raises(RuntimeError, match="TypeError"):
        client.call_utility("sleep_for_test", 1, 2, 3)
    assert client.reset_prefix_cache() is True
    assert client.call_utility("sleep_for_test", 0.0) is True


def test_bad_request_in_core_finishes_it(client):
    # The frontend normally validates; a request that reaches the core anyway must still end.
    client.add_request(EngineCoreRequest("empty", [], SamplingParams(max_tokens=3), 2))
    deadline = time.monotonic() + 120  # a hang guard only
    while not (outs := [o for o in client.get_output().outputs if o.request_id == "empty"]):
        assert time.monotonic() < deadline
    out = outs[0]
    assert out.request_id == "empty" and out.finish_reason is not None and "empty" in out.stop_reason


def test_llm_multiprocess_default_equals_inproc(model):
    prompts = [[5, 6, 7, 8], [9, 10, 11] * 5]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=2)
    mp = LLM(model, **ARGS)
    assert isinstance(mp.llm_engine.engine_core, SyncMPClient)
    a = mp.generate(prompts, params, use_tqdm=False)
    proc = mp.llm_engine.engine_core.resources.proc
    del mp
    proc.join(10)
    assert not proc.is_alive(), "a garbage-collected LLM must stop its EngineCore process"
    b = LLM(model, multiprocess=False, **ARGS).generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]
    for x, y in zip(a, b, strict=True):  # float noise only: the two processes may batch differently
        for lx, ly in zip(x.outputs[0].logprobs, y.outputs[0].logprobs, strict=True):
            assert list(lx) == list(ly) and lx == pytest.approx(ly, abs=1e-4)


@pytest.mark.timeout(300)  # a hang guard only
def test_startup_failure_is_reported(tmp_path, monkeypatch):
    """The core's FAILED handshake ends the start-up, not the READY timeout: with the timeout set far beyond the
    test's hang guard, only the handshake can end it (and TimeoutError would not match)."""
    from minivllm.engine import core_client

    monkeypatch.setattr(core_client, "STARTUP_TIMEOUT_S", 10_000)
    config = VllmConfig(model_config=ModelConfig(str(tmp_path / "no-such-model")), device="cpu",
                        attention_backend="torch")
    with pytest.raises(RuntimeError, match="EngineCore failed to start") as e:
        SyncMPClient(config)
    assert "no-such-model" in str(e.value)


@pytest.mark.timeout(300)  # a hang guard only: a get_output() that blocks forever fails here
def test_crash_is_reported_to_client(client):
    """Last: an exception in the busy loop reaches the client as EngineDeadError, never a hang: the outputs
    already queued drain and the next get_output() raises, once the core has exited with its error."""
    proc = client.resources.proc
    [r] = requests(1, max_tokens=200, seed=3)
    client.add_request(r)
    wait_for_tokens(client, r.request_id)
    with pytest.raises(EngineDeadError):
        client.call_utility("raise_for_test", "boom")
    drained = 0
    with pytest.raises(EngineDeadError):
        while True:
            client.get_output()
            drained += 1
    assert drained < 1000, drained  # a bounded drain (the request had at most 200 tokens to give), not a stream
    proc.join(120)
    assert proc.exitcode == 1 and client.engine_dead
    with pytest.raises(EngineDeadError):
        client.add_request(requests(1, seed=4)[0])
