"""AsyncLLM: streams equal offline greedy, validation errors, stop strings, cancellation frees KV, dead core.

One AsyncLLM (one spawned EngineCore) on one event loop serves the module; the last test kills the core.
"""
from __future__ import annotations

import asyncio
import os
import signal
import threading

import pytest

from minivllm.config import EngineArgs
from minivllm.engine.async_llm import AsyncLLM
from minivllm.engine.exceptions import EngineDeadError
from minivllm.entrypoints.llm import LLM
from minivllm.sampling_params import SamplingParams

ARGS = dict(device="cpu", attention_backend="torch", max_num_seqs=16)
PROMPTS = ["ROMEO: What light", "JULIET:", "To be, or not to be", "Now is the winter of our discontent"]


def greedy(n: int = 12, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)


@pytest.fixture(scope="module")
def model(tiny_model):
    return tiny_model("llama")


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def engine(model, loop):
    async def make():
        return AsyncLLM.from_engine_args(EngineArgs(model=model, **ARGS))
    engine = loop.run_until_complete(make())
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def offline(model):
    return LLM(model, multiprocess=False, **ARGS)


async def collect(engine, prompt, params, rid, delta=True):
    text, ids, last = "", [], None
    async for out in engine.generate(prompt, params, rid, delta=delta):
        c = out.outputs[0]
        text, ids = (text + c.text, ids + c.token_ids) if delta else (c.text, c.token_ids)
        last = out
    return text, ids, last


async def stats_after_next_step(engine):
    """Core stats once every message sent so far has been through a step's aborts phase.

    The core answers a utility call between steps: the first answer may predate an abort sent just
    before it, but the second call is read only after the step that follows the first answer.
    """
    await engine.get_stats()
    return await engine.get_stats()


def idle(s) -> bool:
    return s.num_running_reqs == 0 and s.num_waiting_reqs == 0 and s.kv_cache_usage == 0.0


def test_concurrent_streams_equal_offline(engine, offline, loop):
    ref = offline.generate(PROMPTS * 4, greedy(), use_tqdm=False)

    async def main():
        return await asyncio.gather(*(collect(engine, p, greedy(), f"s{i}", delta=i % 2 == 0)
                                      for i, p in enumerate(PROMPTS * 4)))
    got = loop.run_until_complete(main())
    for (text, ids, last), r in zip(got, ref, strict=True):
        assert ids == r.outputs[0].token_ids and text == r.outputs[0].text
        assert last.finished and last.outputs[0].finish_reason == "length"


def test_invalid_input_raises_value_error(engine, loop, offline):
    max_len = engine.vllm_config.scheduler_config.max_model_len

    async def main():
        with pytest.raises(ValueError, match="max_model_len"):
            await collect(engine, list(range(5, 5 + max_len + 1)), greedy(), "long")
        with pytest.raises(ValueError, match="out of vocabulary"):
            await collect(engine, [1, 10 ** 6], greedy(), "oov")
        with pytest.raises(ValueError, match="empty"):
            await collect(engine, [], greedy(), "empty")
        with pytest.raises(ValueError, match="SamplingParams"):
            await collect(engine, "hi", {"max_tokens": 3}, "dict-params")
        with pytest.raises(ValueError, match="logprobs"):
            await collect(engine, "hi", greedy(logprobs=1000), "lp")
        await collect(engine, "ok", greedy(2), "dup")
        return await collect(engine, PROMPTS[0], greedy(), "after-errors")
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1.0)
    _, ids, _ = loop.run_until_complete(main())
    assert ids == offline.generate(PROMPTS[0], greedy(), use_tqdm=False)[0].outputs[0].token_ids
    assert engine.output_processor.get_num_unfinished_requests() == 0


def test_stop_string_aborts_in_core(engine, offline, loop):
    full = offline.generate(PROMPTS[1], greedy(40), use_tqdm=False)[0].outputs[0].text
    stop = full[len(full) // 2:len(full) // 2 + 3]
    assert stop.strip(), f"fixture: pick a visible stop string from {full!r}"

    async def main():
        res = await collect(engine, PROMPTS[1], greedy(200, stop=[stop]), "stop")
        return res, await stats_after_next_step(engine)
    (text, _, last), stats = loop.run_until_complete(main())
    assert idle(stats), f"the stop string did not abort the request in the core: {stats}"
    assert text == full[:full.index(stop)]
    assert last.outputs[0].finish_reason == "stop" and last.outputs[0].stop_reason == stop


def test_cancel_aborts_and_frees_kv(engine, loop):
    async def main():
        base = await stats_after_next_step(engine)
        seen = 0

        async def consume():
            nonlocal seen
            async for _ in engine.generate(PROMPTS[2], greedy(200), "cancel-me", delta=True):
                seen += 1
        task = asyncio.create_task(consume())
        while seen < 3:
            await asyncio.sleep(0.01)
        busy = await engine.get_stats()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return base, busy, await stats_after_next_step(engine)
    base, busy, after = loop.run_until_complete(main())
    assert idle(base) and busy.num_running_reqs == 1 and busy.num_free_blocks < base.num_free_blocks
    assert idle(after) and after.num_free_blocks == base.num_free_blocks
    assert "cancel-me" not in engine.output_processor.request_states


def test_closing_generator_aborts(engine, loop):
    async def main():
        gen = engine.generate(PROMPTS[3], greedy(200), "close-me")
        await gen.__anext__()
        await gen.aclose()
        return await stats_after_next_step(engine)
    assert idle(loop.run_until_complete(main()))


def test_server_tokenizes_off_the_event_loop(engine, loop, monkeypatch):
    """The server's OpenAIServing tokenizes on its thread pool: while one prompt's tokenization is held
    (it waits for an event that only the other request's completion sets), another request runs to the
    end on the same event loop. Tokenizing on the loop would block it: the order would be reversed."""
    from minivllm.entrypoints.openai.api_server import OpenAIServing
    serving = OpenAIServing(engine, "tiny")
    engine.stat_loggers.remove(serving.stat_logger)
    encode, release, threads = engine.tokenizer.encode, threading.Event(), []

    def held_encode(text, *a, **k):
        if text.startswith("HELD"):
            threads.append(threading.current_thread().name)
            release.wait(60)
        return encode(text, *a, **k)
    monkeypatch.setattr(engine.tokenizer, "encode", held_encode)
    order = []

    async def held():
        await serving.process_inputs("held", "HELD prompt", greedy(2), 2)
        order.append("held")

    async def main():
        task = asyncio.ensure_future(held())
        await asyncio.sleep(0.05)
        await collect(engine, "quick prompt", greedy(2), "quick")
        order.append("quick")
        release.set()
        await task
    try:
        loop.run_until_complete(main())
    finally:
        release.set()
        serving.tokenizer_pool.shutdown()
    assert order == ["quick", "held"] and threads[0].startswith("tokenizer"), (order, threads)


def test_dead_core_fails_streams_fast(engine, loop):
    """Last: SIGKILL the core with streams in flight; each raises EngineDeadError (the output handler saw the
    core die and failed them; the wait is a hang guard, not a verdict on speed)."""
    async def main():
        results = {}

        async def stream(i):
            try:
                await collect(engine, PROMPTS[i % 4], greedy(200), f"dead{i}")
                results[i] = "finished"
            except EngineDeadError:
                results[i] = "EngineDeadError"
        tasks = [asyncio.create_task(stream(i)) for i in range(4)]
        while not all(f"dead{i}" in engine.output_processor.request_states and
                      engine.output_processor.request_states[f"dead{i}"].output_token_ids for i in range(4)):
            await asyncio.sleep(0.01)
        os.kill(engine.engine_core.resources.proc.pid, signal.SIGKILL)
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        with pytest.raises(EngineDeadError):
            await collect(engine, "x", greedy(), "after-death")
        with pytest.raises(EngineDeadError):
            await engine.check_health()
        return results
    results = loop.run_until_complete(main())
    assert results == dict.fromkeys(range(4), "EngineDeadError"), results
