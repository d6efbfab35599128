"""Async scheduling vs synchronous scheduling: the same engine and workload, interleaved in one run.

With async_scheduling, EngineCore plans step N+1 (schedule, and the frontend-facing update of step N-1)
while step N's forward runs, so the scheduler's CPU time hides behind the forward. On a GPU the forward
runs on the device and the gain is the whole control plane; on a CPU the forward's torch threads occupy
the cores, so the overlap buys little or nothing there. This prints both throughputs, the median ratio
(async / sync) with its min-max, and from a traced async run how many steps overlapped their successor's
schedule with their forward.

    .venv/bin/python benchmarks/async_scheduling.py                 # 32 prompts x 32 tokens, 3 pairs
    .venv/bin/python benchmarks/async_scheduling.py --num-prompts 64 --output-len 64 --device cuda
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

from common import add_bench_args, environment, environment_line, interleave, ratio, spread, write_json


def make_prompts(n: int, lo: int, hi: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(4, 4000) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def overlap(tracer) -> tuple[int, int]:
    """(steps whose forward overlapped the next step's schedule, steps with a forward)."""
    span = {(e.step, e.phase): e for e in tracer.events}
    steps = sorted(s for s, p in span if p == "forward")
    hit = sum(1 for s in steps if (s + 1, "schedule") in span
              and span[(s + 1, "schedule")].start < span[(s, "forward")].end)
    return hit, len(steps)


def main() -> None:
    from minivllm import LLM, SamplingParams
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--min-len", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--device", default="cpu")
    add_bench_args(ap)
    args = ap.parse_args()
    env_before = environment()
    kw = dict(device=args.device, max_num_seqs=args.num_prompts, multiprocess=False)
    if args.model:
        kw["model"] = args.model
    prompts = make_prompts(args.num_prompts, args.min_len, args.max_len)
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    engines = {"sync": LLM(async_scheduling=False, **kw), "async": LLM(async_scheduling=True, **kw)}
    outputs = {}

    def side(name: str):
        def fn() -> float:
            t0 = time.perf_counter()
            outs = engines[name].generate(prompts, params, use_tqdm=False)
            elapsed = time.perf_counter() - t0
            outputs[name] = [o.outputs[0].token_ids for o in outs]
            return elapsed
        return fn

    times = interleave({name: side(name) for name in engines}, args.pairs, args.warmup)
    assert outputs["sync"] == outputs["async"], "async scheduling changed the greedy outputs"
    n_tok = args.num_prompts * args.output_len
    r = ratio("throughput async / sync scheduling", times["sync"], times["async"],
              "the same engine with synchronous scheduling (> 1: the overlap pays; on CPU expect ~1)")
    print(f"workload: {args.num_prompts} prompts ({args.min_len}-{args.max_len} tokens) x {args.output_len} "
          f"output tokens, device {args.device}; {environment_line(env_before)}")
    for name, ts in times.items():
        print(f"{name:6s}: {spread(ts)} s   {n_tok / statistics.median(ts):8.1f} tok/s (median)")
    print(r.line())
    traced = LLM(async_scheduling=True, trace=True, **kw)
    traced.generate(prompts, params, use_tqdm=False)
    hit, steps = overlap(traced.llm_engine.engine_core.tracer)
    print(f"traced async run: {hit} of {steps} steps ran the next step's schedule during their forward")
    print(f"after: {environment_line()}")
    write_json(args.json_out, "async_scheduling", [r], {"steps overlapped": [hit, steps]}, env_before)


if __name__ == "__main__":
    main()
