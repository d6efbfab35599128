"""`minivllm bench serve` (vLLM: vllm/benchmarks/serve.py): load-test a running OpenAI-compatible server.

Random dataset (prompts of random token ids, fixed output length with ignore_eos), Poisson arrivals at
--request-rate (or all at once with inf), at most --max-concurrency in flight. Each request streams
/v1/completions; per request we record TTFT, the gaps between streamed chunks (ITL), TPOT and E2EL.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm


@dataclass
class RequestFuncOutput:
    """One request's timings as the client saw them."""

    success: bool = False
    prompt_len: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    generated_text: str = ""
    error: str = ""


def add_cli_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default=None, help="server URL (default http://HOST:PORT)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--endpoint", default="/v1/completions")
    p.add_argument("--model", default=None, help="model id (default: the first one /v1/models lists)")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder for the random dataset (default: the "
                                                     "server model's folder, from /v1/models)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--dataset-name", default="random", choices=["random"])
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--random-input-len", type=int, default=64)
    p.add_argument("--random-output-len", type=int, default=32)
    p.add_argument("--random-range-ratio", type=float, default=0.0,
                   help="lengths drawn uniformly from [len*(1-r), len*(1+r)]")
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="requests per second, Poisson arrivals; inf sends all at once")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-result", action="store_true", help="write a JSON result (and a figure)")
    p.add_argument("--result-dir", default=".")
    p.add_argument("--result-filename", default=None)
    p.add_argument("--figure", default=None, help="PNG of the latency distributions (default beside the JSON)")
    p.add_argument("--disable-tqdm", action="store_true")


def sample_random_requests(vocab_size: int, num: int, input_len: int, output_len: int, ratio: float,
                           seed: int) -> list[tuple[list[int], int]]:
    """[(prompt token ids, output length)], reproducible from seed."""
    rng = random.Random(seed)

    def draw(n: int) -> int:
        return max(1, rng.randint(int(n * (1 - ratio)), int(n * (1 + ratio))))
    return [([rng.randrange(10, vocab_size) for _ in range(draw(input_len))], draw(output_len))
            for _ in range(num)]


async def request_completions(client, url: str, model: str, prompt: list[int], output_len: int,
                              headers: dict) -> RequestFuncOutput:
    out = RequestFuncOutput(prompt_len=len(prompt))
    payload = {"model": model, "prompt": prompt, "max_tokens": output_len, "temperature": 0.0,
               "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    start = last = time.perf_counter()
    try:
        async with client.stream("POST", url, json=payload, headers=headers) as resp:
            if resp.status_code != 200:
                out.error = f"HTTP {resp.status_code}: {(await resp.aread()).decode(errors='replace')[:200]}"
                return out
            # by hand, as vLLM's endpoint_request_func does: no SSE package in the engine's own dependencies
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    out.error = chunk["error"]["message"]
                    return out
                if chunk.get("usage"):
                    out.output_tokens = chunk["usage"]["completion_tokens"]
                if chunk.get("choices"):
                    t = time.perf_counter()
                    if out.ttft == 0.0:
                        out.ttft = t - start
                    else:
                        out.itl.append(t - last)
                    last = t
                    out.generated_text += chunk["choices"][0].get("text", "")
        out.latency = time.perf_counter() - start
        out.success = out.ttft > 0.0
    except Exception as e:  # a benchmark reports failures, it does not stop on them
        out.error = f"{type(e).__name__}: {e}"
    return out


async def get_request_intervals(n: int, rate: float, seed: int):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        yield
        if rate != float("inf"):
            await asyncio.sleep(float(rng.exponential(1.0 / rate)))


def calculate_metrics(outputs: list[RequestFuncOutput], duration: float) -> dict:
    ok = [o for o in outputs if o.success]
    ms = 1000.0

    def stats(name: str, values: list[float]) -> dict:
        v = np.asarray(values or [0.0]) * ms
        return {f"mean_{name}_ms": float(v.mean()), f"median_{name}_ms": float(np.median(v)),
                f"p99_{name}_ms": float(np.percentile(v, 99)), f"std_{name}_ms": float(v.std())}
    tpots = [(o.latency - o.ttft) / (o.output_tokens - 1) for o in ok if o.output_tokens > 1]
    total_in = sum(o.prompt_len for o in ok)
    total_out = sum(o.output_tokens for o in ok)
    m = {"completed": len(ok), "failed": len(outputs) - len(ok), "duration": duration,
         "total_input_tokens": total_in, "total_output_tokens": total_out,
         "request_throughput": len(ok) / duration, "output_throughput": total_out / duration,
         "total_token_throughput": (total_in + total_out) / duration}
    m |= stats("ttft", [o.ttft for o in ok]) | stats("tpot", tpots)
    m |= stats("itl", [x for o in ok for x in o.itl]) | stats("e2el", [o.latency for o in ok])
    return m


async def benchmark(args: argparse.Namespace) -> tuple[dict, list[RequestFuncOutput]]:
    import httpx
    base = args.base_url or f"http://{args.host}:{args.port}"
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None), limits=limits) as client:
        models = (await client.get(base + "/v1/models", headers=headers)).json()["data"]
        model = args.model or models[0]["id"]
        vocab = _vocab_size(args.tokenizer or models[0].get("root"))
        requests = sample_random_requests(vocab, args.num_prompts, args.random_input_len, args.random_output_len,
                                          args.random_range_ratio, args.seed)
        sem = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None
        url = base + args.endpoint
        pbar = None if args.disable_tqdm else tqdm(total=len(requests))  # as vLLM's benchmark: one tick a request

        async def one(prompt, out_len):
            if sem is None:
                res = await request_completions(client, url, model, prompt, out_len, headers)
            else:
                async with sem:
                    res = await request_completions(client, url, model, prompt, out_len, headers)
            if pbar is not None:
                pbar.update(1)
            return res
        print(f"Benchmarking {model} at {url}: {args.num_prompts} prompts, rate {args.request_rate}, "
              f"max concurrency {args.max_concurrency}", file=sys.stderr)
        t0 = time.perf_counter()
        tasks = []
        i = 0
        async for _ in get_request_intervals(len(requests), args.request_rate, args.seed):
            tasks.append(asyncio.create_task(one(*requests[i])))
            i += 1
        outputs = await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
        if pbar is not None:
            pbar.close()
    metrics = calculate_metrics(outputs, duration)
    metrics |= {"model_id": model, "num_prompts": args.num_prompts, "request_rate": args.request_rate,
                "max_concurrency": args.max_concurrency}
    return metrics, outputs


def _vocab_size(tokenizer_path: str | None) -> int:
    if tokenizer_path:
        try:
            from minivllm.tokenizer import get_tokenizer
            return len(get_tokenizer(tokenizer_path))
        except Exception:
            pass
    return 1000


def print_metrics(m: dict) -> None:
    """vLLM's result block, padded with format specs as vLLM's benchmarks/serve.py prints it (ASCII labels, so
    no table library is simpler)."""
    line = "=" * 50
    print(f"{' Serving Benchmark Result ':=^50}")
    rows = [("Successful requests:", m["completed"]), ("Failed requests:", m["failed"]),
            ("Benchmark duration (s):", f"{m['duration']:.2f}"), ("Total input tokens:", m["total_input_tokens"]),
            ("Total generated tokens:", m["total_output_tokens"]),
            ("Request throughput (req/s):", f"{m['request_throughput']:.2f}"),
            ("Output token throughput (tok/s):", f"{m['output_throughput']:.2f}"),
            ("Total token throughput (tok/s):", f"{m['total_token_throughput']:.2f}")]
    for k, v in rows:
        print(f"{k:<40}{v:<10}")
    for key, title in (("ttft", "Time to First Token"), ("tpot", "Time per Output Token (excl. 1st token)"),
                       ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency")):
        print(f"{title:-^50}")
        for stat in ("mean", "median", "p99"):
            print(f"{f'{stat.capitalize()} {key.upper()} (ms):':<40}{m[f'{stat}_{key}_ms']:<10.2f}")
    print(line)


def plot_latencies(outputs: list[RequestFuncOutput], path: str) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ok = [o for o in outputs if o.success]
    series = {"TTFT (ms)": [o.ttft * 1e3 for o in ok],
              "TPOT (ms)": [(o.latency - o.ttft) / (o.output_tokens - 1) * 1e3 for o in ok if o.output_tokens > 1],
              "ITL (ms)": [x * 1e3 for o in ok for x in o.itl], "E2EL (ms)": [o.latency * 1e3 for o in ok]}
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.5))
    for ax, (title, values) in zip(axes, series.items(), strict=True):
        ax.hist(values or [0.0], bins=40, color="tab:blue", alpha=0.8)
        if values:
            for q, style in ((50, "--"), (99, ":")):
                ax.axvline(float(np.percentile(values, q)), color="k", linestyle=style, label=f"p{q}")
            ax.legend()
        ax.set_title(title)
        ax.set_xlabel("ms")
    axes[0].set_ylabel("count")
    fig.suptitle(f"minivllm bench serve: {len(ok)} requests")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(args: argparse.Namespace) -> int:
    metrics, outputs = asyncio.run(benchmark(args))
    print_metrics(metrics)
    if args.save_result:
        import os
        name = args.result_filename or f"minivllm-bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
        path = os.path.join(args.result_dir, name)
        os.makedirs(args.result_dir, exist_ok=True)
        result = metrics | {"ttfts": [o.ttft for o in outputs], "itls": [o.itl for o in outputs],
                            "e2els": [o.latency for o in outputs], "output_lens": [o.output_tokens for o in outputs],
                            "input_lens": [o.prompt_len for o in outputs], "errors": [o.error for o in outputs]}
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
        fig = plot_latencies(outputs, args.figure or os.path.splitext(path)[0] + ".png")
        print(f"saved {path} and {fig}")
    return 0 if metrics["completed"] else 1
