"""Lesson 12 — what the notebook shows (never called by a check), all on the checks' real server: one streamed
request's timeline across the two processes, `minivllm bench serve` at several request rates, and LLM throughput
with the EngineCore in this process vs its own. The numbers the lesson's prose discusses are printed by these
functions from the student's own run.
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import threading
import time

import httpx

from autograder.figures import interleaved, vllm_answers
from autograder.lesson12.checks import DEFAULT_MODEL, ENGINE, NAME, SERVER_PROMPT, server


def request_timeline(max_tokens: int = 12) -> dict:
    """Monotonic times: the core's step ends (EngineCoreOutputs.timestamp), the frontend's receipt of each batch,
    and the client's SSE chunks. Comparable only because both processes run on this host (Linux's
    CLOCK_MONOTONIC is one clock per machine); vLLM's EngineCoreEvent docstring warns against comparing them
    across processes in general."""
    from autograder.lesson12 import checks
    if checks._SERVER is None or not checks._SERVER.thread.is_alive():
        print("启动 minivllm 服务器（本课第一次用到它；2 核机器上十几秒到一分钟）……", flush=True)
    srv = server()
    core = srv.app.state.serving.engine.engine_core
    original = core.get_output_async
    steps: list[tuple[float, float, int]] = []

    async def recording():
        outs = await original()
        steps.append((outs.timestamp, time.monotonic(), sum(len(o.new_token_ids) for o in outs.outputs)))
        return outs

    core.get_output_async = recording
    chunks = []
    try:
        t_send = time.monotonic()
        with httpx.stream("POST", srv.url + "/v1/completions", timeout=60, json={
                "model": NAME, "prompt": SERVER_PROMPT, "max_tokens": max_tokens, "temperature": 0.0,
                "ignore_eos": True, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(time.monotonic())
        t_done = time.monotonic()
    finally:
        core.get_output_async = original
    steps = [s for s in steps if s[2] and t_send <= s[0] <= t_done]
    return {"t_send": t_send, "t_done": t_done, "steps": steps, "chunks": chunks}


def print_timeline(tl: dict) -> None:
    t0 = tl["t_send"]
    print(f"{'step':>4} {'core step end (ms)':>19} {'frontend got it':>16} {'ZMQ+decode (ms)':>16}")
    for i, (core_t, recv_t, _) in enumerate(tl["steps"]):
        print(f"{i:>4} {1e3 * (core_t - t0):>19.1f} {1e3 * (recv_t - t0):>16.1f} {1e3 * (recv_t - core_t):>16.2f}")
    print(f"TTFT seen by the client: {1e3 * (tl['chunks'][0] - t0):.1f} ms; {len(tl['chunks'])} SSE chunks; "
          f"whole request {1e3 * (tl['t_done'] - t0):.1f} ms")
    lag = [1e3 * (recv - core) for core, recv, _ in tl["steps"]]
    gaps = [1e3 * (b[0] - a[0]) for a, b in zip(tl["steps"], tl["steps"][1:], strict=False)]
    if lag and gaps:
        print(f"本次运行：核心一步约 {statistics.median(gaps):.1f} ms（中位数），核心 -> 前端中位数 "
              f"{statistics.median(lag):.2f} ms、最大 {max(lag):.1f} ms")


def plot_timeline(tl: dict):
    import matplotlib.pyplot as plt
    t0 = tl["t_send"]
    fig, ax = plt.subplots(figsize=(9, 2.8), layout="tight")
    lanes = {"EngineCore process\n(step ends)": [s[0] for s in tl["steps"]],
             "API server process\n(outputs received)": [s[1] for s in tl["steps"]],
             "client\n(SSE chunks)": tl["chunks"]}
    for y, ts in enumerate(lanes.values()):
        ax.scatter([1e3 * (t - t0) for t in ts], [y] * len(ts), marker="|", s=300)
    for core_t, recv_t, _ in tl["steps"]:
        ax.plot([1e3 * (core_t - t0), 1e3 * (recv_t - t0)], [0, 1], color="gray", lw=0.6)
    ax.axvline(0, color="k", ls=":", lw=0.8)
    ax.set_yticks(range(3), list(lanes))
    ax.set(ylim=(-0.5, 2.5), xlabel="ms after the client sent the request (0: HTTP POST)")
    ax.set_title("Figure 12-1: one streamed request across the two processes")
    return fig


def leaked_increment(chunks: list[str], text: str) -> tuple[int, str] | None:
    """(number, increment) of the first streamed increment whose text runs past `text`, or None."""
    sent = ""
    for k, c in enumerate(chunks):
        sent += c
        if not text.startswith(sent):
            return k + 1, c
    return None


def _bench_args(rate: float, num_prompts: int, input_len: int, output_len: int) -> argparse.Namespace:
    from minivllm.benchmarks.serve import add_cli_args
    p = argparse.ArgumentParser()
    add_cli_args(p)
    return p.parse_args(["--base-url", server().url, "--model", NAME, "--tokenizer", DEFAULT_MODEL,
                         "--num-prompts", str(num_prompts), "--random-input-len", str(input_len),
                         "--random-output-len", str(output_len), "--request-rate", str(rate), "--disable-tqdm"])


def bench_rates(rates=(2.0, 8.0, float("inf")), num_prompts: int = 16, input_len: int = 32,
                output_len: int = 16) -> list[dict]:
    """`minivllm bench serve`'s benchmark() at each rate against the running server (in a thread: the
    notebook's kernel already runs an event loop)."""
    from minivllm.benchmarks.serve import benchmark
    print(f"{len(rates)} 个请求率各发 {num_prompts} 个请求（负载下的 2 核机器上共约 15～25 秒）……", flush=True)
    rows = []
    for rate in rates:
        box: dict = {}
        args = _bench_args(rate, num_prompts, input_len, output_len)
        th = threading.Thread(target=lambda box=box, args=args: box.setdefault("r", asyncio.run(benchmark(args))))
        th.start()
        th.join(120)
        if "r" not in box:
            raise RuntimeError(f"bench serve at rate {rate} did not finish in 120 s")
        rows.append(box["r"][0])
    return rows


def print_bench(rows: list[dict]) -> None:
    print(f"{'rate':>6} {'req/s':>6} {'tok/s':>7} | {'TTFT p50':>8} {'p99':>7} | {'TPOT p50':>8} {'p99':>6} | "
          f"{'ITL p50':>7} {'p99':>6}  (ms)")
    for m in rows:
        print(f"{m['request_rate']:>6} {m['request_throughput']:>6.2f} {m['output_throughput']:>7.1f} | "
              f"{m['median_ttft_ms']:>8.1f} {m['p99_ttft_ms']:>7.1f} | {m['median_tpot_ms']:>8.1f} "
              f"{m['p99_tpot_ms']:>6.1f} | {m['median_itl_ms']:>7.1f} {m['p99_itl_ms']:>6.1f}")
    lo, hi = rows[-2], rows[-1]  # the highest finite rate against all at once: the two rows Q3 compares
    print(f"本次运行，请求率 {lo['request_rate']} -> {hi['request_rate']}：TTFT 中位数 {lo['median_ttft_ms']:.0f} -> "
          f"{hi['median_ttft_ms']:.0f} ms，TPOT 中位数 {lo['median_tpot_ms']:.1f} -> {hi['median_tpot_ms']:.1f} ms，"
          f"吞吐 {lo['request_throughput']:.2f} -> {hi['request_throughput']:.2f} req/s")


def plot_bench(rows: list[dict]):
    import matplotlib.pyplot as plt
    labels = [str(m["request_rate"]) for m in rows]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2), layout="tight")
    for ax, key, title in zip(axes, ("ttft", "tpot", "itl"), ("TTFT", "TPOT", "ITL"), strict=True):
        ax.plot(labels, [m[f"median_{key}_ms"] for m in rows], "o-", label="p50")
        ax.plot(labels, [m[f"p99_{key}_ms"] for m in rows], "s--", label="p99")
        ax.set(xlabel="request rate (req/s)", ylabel="ms")
        ax.set_title(title)
        ax.legend()
    fig.suptitle("Figure 12-2: latency vs request rate (minivllm bench serve, 2-core CPU)")
    return fig


def process_split(rounds: int = 3, num_prompts: int = 8, max_tokens: int = 16) -> dict:
    """Output tokens/s of LLM.generate with the EngineCore in this process (InprocClient) and in its own
    (SyncMPClient), interleaved A B A B after one warm-up round; medians and the ratio."""
    from minivllm.entrypoints.llm import LLM
    from minivllm.sampling_params import SamplingParams
    print(f"启动两个引擎，再交替跑 1 轮热身 + {rounds} 轮（负载下的 2 核机器上 10～20 秒）……", flush=True)
    llms = {"in-process": LLM(DEFAULT_MODEL, multiprocess=False, **ENGINE),
            "multiprocess": LLM(DEFAULT_MODEL, multiprocess=True, **ENGINE)}
    prompts = [f"{name}:" for name in ("ROMEO", "JULIET", "HAMLET", "OTHELLO", "PORTIA", "LEAR", "IAGO", "PUCK")]
    prompts = (prompts * (num_prompts // len(prompts) + 1))[:num_prompts]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    try:
        seconds = interleaved({name: functools.partial(llm.generate, prompts, params, use_tqdm=False)
                               for name, llm in llms.items()}, rounds)
    finally:
        for llm in llms.values():
            llm.llm_engine.shutdown()
    tokens = len(prompts) * max_tokens  # ignore_eos: every request runs to max_tokens
    rates = {name: [tokens / s for s in v] for name, v in seconds.items()}
    med = {k: statistics.median(v) for k, v in rates.items()}
    return {"tok_per_s": med, "ratio_mp_over_inproc": med["multiprocess"] / med["in-process"], "runs": rates}


def print_split(split: dict) -> None:
    for name, v in split["tok_per_s"].items():
        print(f"{name:<13} 中位数 {v:7.1f} output tok/s   各轮 {[round(x) for x in split['runs'][name]]}")
    r = split["ratio_mp_over_inproc"]
    lo = min(split["runs"]["multiprocess"]) / max(split["runs"]["in-process"])
    hi = max(split["runs"]["multiprocess"]) / min(split["runs"]["in-process"])
    verdict = "多进程更快" if lo > 1 else "同进程更快" if hi < 1 else "各轮的范围重叠，这几轮分不出快慢"
    print(f"multiprocess / in-process = {r:.2f}（各轮之间 {lo:.2f}～{hi:.2f}）：这台机器上这次{verdict}。")


# ---------------------------------------------------------------------------- the same thing in the pinned vLLM
def vllm_side_by_side(cls, detail: str = "stop_across_steps") -> dict:
    """The pinned vLLM's IncrementalDetokenizer on the lesson's stop-string streams next to cls (live or recorded):
    one line per stream, then one stream step by step, then a prompt ending inside a character."""
    from autograder.lesson12.checks import vllm_events
    from autograder.lesson12.vllm_view import SCENARIOS

    got = vllm_answers("lesson12")
    mine = {name: vllm_events(cls, case) for name, case in SCENARIOS.items()}
    print(f"{'stream':<32}{'stop':<30}{'steps':>6}  {'vLLM text ends':<26}same")
    for name, case in SCENARIOS.items():
        a = got[name]
        print(f"{name:<32}{str(case['params']['stop'])[:28]:<30}{len(a['events']):>6}  {a['text'][-22:]!r:<26}"
              f"{'=' if mine[name] == a else 'DIFFERENT'}")
    case = SCENARIOS[detail]
    print(f"\n{detail}: stop {case['params']['stop']}, per step [stop string, delta]")
    for k, (v, y) in enumerate(zip(got[detail]["events"], mine[detail]["events"], strict=False)):
        print(f"  step {k + 1:>2} {str(case['steps'][k]):<22} vLLM {str(v):<34} yours {y}")
    split = "prompt_ends_inside_a_character"
    print(f"\n{split}: first deltas  vLLM {[e[1] for e in got[split]['events'][:3]]}  "
          f"yours {[e[1] for e in mine[split]['events'][:3]]}")
    return {"vllm": got, "yours": mine}
