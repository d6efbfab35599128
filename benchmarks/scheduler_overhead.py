"""Scheduler overhead: the CPU cost of one decode step's control plane, with no model at all.

Each measured step is Scheduler.schedule() followed by Scheduler.update_from_output() with a fake
ModelRunnerOutput (one sampled token per scheduled request, built outside the timed region: building it
is the worker's job). The workload is steady-state decode: --num-reqs requests, all RUNNING, each
computing one token per step. Prompt lengths are staggered (base + i % block_size), so block
allocations and block hashing are spread evenly over the steps instead of all landing on every
block_size-th step, which would flatter the median.

The anchor is nano-vllm's Scheduler + BlockManager on the same workload in the same run (schedule() +
postprocess() per step), loaded from a local checkout given with --nano-vllm PATH (or $NANO_VLLM): its
code is read at benchmark time, never shipped here. The two sides run in rounds, interleaved (A B A B,
after a warm-up round); each round gives one median per side, each pair one ratio.

    python benchmarks/scheduler_overhead.py                          # minivllm alone: 256 requests, bs 16
    python benchmarks/scheduler_overhead.py --nano-vllm /work/ref/nano-vllm   # side by side, with the ratio
    python benchmarks/scheduler_overhead.py --profile                # cProfile of minivllm's measured loop

Where the time goes is in --profile's table; the figures measured on the course machine are in the
closing notes of the issues that changed them, and `make bench` writes today's into its report.
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import importlib
import inspect
import io
import os
import pstats
import statistics
import sys
import time
import types
from pathlib import Path

from common import add_bench_args, environment, environment_line, interleave, ratio, spread, write_json

from minivllm.config import CacheConfig, SchedulerConfig
from minivllm.core.sched.scheduler import Scheduler
from minivllm.request import Request
from minivllm.sampling_params import SamplingParams
from minivllm.worker.outputs import ModelRunnerOutput

FAKE_TOKEN = 7
EOS = 2


def make_prompts(num_reqs: int, block_size: int, prompt_len: int, aligned: bool) -> list[list[int]]:
    """Distinct first tokens: no prefix sharing, every request owns its blocks."""
    prompts = []
    for i in range(num_reqs):
        length = prompt_len + (0 if aligned else i % block_size)
        prompts.append([i + 1000] + [(i * 31 + j) % 30000 for j in range(length - 1)])
    return prompts


def fake_model_output(scheduler_output) -> ModelRunnerOutput:
    """One token per scheduled request (the harness keeps every request at the end of its tokens)."""
    req_ids = list(scheduler_output.num_scheduled_tokens)
    return ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)}, [[FAKE_TOKEN] for _ in req_ids])


class MinivllmSide:
    """minivllm's Scheduler, prefilled, then decoding one token per request per step."""

    name = "minivllm"

    def __init__(self, prompts: list[list[int]], block_size: int, max_model_len: int,
                 prefix_caching: bool = True) -> None:
        num_reqs = len(prompts)
        self.num_reqs = num_reqs
        self.splits: list[tuple[float, float]] = []  # per round: (schedule, update) us per request
        num_blocks = num_reqs * (max_model_len // block_size + 2) + 1
        self.scheduler = Scheduler(
            SchedulerConfig(max_num_batched_tokens=max(8192, sum(map(len, prompts))), max_num_seqs=num_reqs,
                            max_model_len=max_model_len),
            CacheConfig(block_size=block_size, enable_prefix_caching=prefix_caching), num_gpu_blocks=num_blocks)
        params = SamplingParams(max_tokens=None, ignore_eos=True)
        for i, prompt in enumerate(prompts):
            self.scheduler.add_request(Request(f"r{i}", prompt, params, eos_token_id=EOS))
        self.step()  # the prefill: the budget holds every prompt
        assert len(self.scheduler.running) == num_reqs and not self.scheduler.waiting

    def step(self) -> None:
        out = self.scheduler.schedule()
        self.scheduler.update_from_output(out, fake_model_output(out))

    def round(self, steps: int, profiler: cProfile.Profile | None = None) -> list[int]:
        """ns of schedule + update per step; the fake model output is built outside the timed region."""
        scheduler, clock, num_reqs = self.scheduler, time.perf_counter_ns, self.num_reqs
        step_ns, split = [], []
        gc.collect()
        for _ in range(steps):
            if profiler:
                profiler.enable()
            t0 = clock()
            out = scheduler.schedule()
            t1 = clock()
            if profiler:
                profiler.disable()
            assert out.total_num_scheduled_tokens == num_reqs, "not a pure decode step"
            mro = fake_model_output(out)
            if profiler:
                profiler.enable()
            t2 = clock()
            scheduler.update_from_output(out, mro)
            t3 = clock()
            if profiler:
                profiler.disable()
            step_ns.append(t1 - t0 + t3 - t2)
            split.append((t1 - t0, t3 - t2))
        self.splits.append(split_per_request(split, num_reqs))
        return step_ns


def split_per_request(split: list[tuple[int, int]], num_reqs: int) -> tuple[float, float]:
    """us per request of the first and the second half of a step (schedule, update), medians over steps."""
    return (statistics.median(s for s, _ in split) / 1e3 / num_reqs,
            statistics.median(u for _, u in split) / 1e3 / num_reqs)


def load_nano_vllm(path: str) -> types.SimpleNamespace:
    """Import nano-vllm's scheduler modules from a checkout without running nanovllm/__init__.py
    (which loads the model runner, flash-attn and friends). A missing xxhash (its block hash) is replaced
    by blake2b with the same interface, and the run says so: it only costs on block-boundary steps."""
    pkg = Path(path).expanduser().resolve() / "nanovllm"
    if not (pkg / "engine" / "scheduler.py").is_file():
        raise SystemExit(f"--nano-vllm {path}: no nanovllm/engine/scheduler.py there (a nano-vllm checkout?)")
    shim = False
    try:
        import xxhash  # noqa: F401
    except ImportError:
        import hashlib
        shim = True

        class _XXH64:
            def __init__(self) -> None:
                self._h = hashlib.blake2b(digest_size=8)

            def update(self, data: bytes) -> None:
                self._h.update(data)

            def intdigest(self) -> int:
                return int.from_bytes(self._h.digest(), "little")
        sys.modules["xxhash"] = types.SimpleNamespace(xxh64=_XXH64)
    if "nanovllm" not in sys.modules:
        package = types.ModuleType("nanovllm")
        package.__path__ = [str(pkg)]
        sys.modules["nanovllm"] = package
    return types.SimpleNamespace(
        scheduler=importlib.import_module("nanovllm.engine.scheduler"),
        sequence=importlib.import_module("nanovllm.engine.sequence"),
        sampling_params=importlib.import_module("nanovllm.sampling_params"),
        xxhash_shim=shim)


class NanoVllmSide:
    """nano-vllm's Scheduler on the same prompts: schedule() + postprocess() per step."""

    name = "nano-vllm"

    def __init__(self, nano: types.SimpleNamespace, prompts: list[list[int]], block_size: int,
                 max_model_len: int) -> None:
        num_reqs = len(prompts)
        self.num_reqs = num_reqs
        self.splits: list[tuple[float, float]] = []  # per round: (schedule, postprocess) us per request
        nano.sequence.Sequence.block_size = block_size  # nano-vllm's LLMEngine sets it from its config
        config = types.SimpleNamespace(
            max_num_seqs=num_reqs, max_num_batched_tokens=max(8192, sum(map(len, prompts))), eos=EOS,
            kvcache_block_size=block_size, num_kvcache_blocks=num_reqs * (max_model_len // block_size + 2) + 1)
        self.scheduler = nano.scheduler.Scheduler(config)
        post = self.scheduler.postprocess  # before nano-vllm's chunked-prefill refactor (2026-04-26): no is_prefill
        self.postprocess = post if len(inspect.signature(post).parameters) == 3 else (lambda s, t, _: post(s, t))
        params = nano.sampling_params.SamplingParams(temperature=1.0, max_tokens=1 << 40, ignore_eos=True)
        for prompt in prompts:
            self.scheduler.add(nano.sequence.Sequence(prompt, params))
        while self.scheduler.waiting:  # the prefill
            seqs, is_prefill = self.scheduler.schedule()
            self.postprocess(seqs, [FAKE_TOKEN] * len(seqs), is_prefill)
        assert len(self.scheduler.running) == num_reqs

    def round(self, steps: int, profiler=None) -> list[int]:
        scheduler, postprocess, clock, num_reqs = self.scheduler, self.postprocess, time.perf_counter_ns, self.num_reqs
        token_ids = [FAKE_TOKEN] * num_reqs
        step_ns, split = [], []
        gc.collect()
        for _ in range(steps):
            t0 = clock()
            seqs, is_prefill = scheduler.schedule()
            t1 = clock()
            assert len(seqs) == num_reqs and not is_prefill, "not a pure decode step"
            t2 = clock()
            postprocess(seqs, token_ids, is_prefill)
            t3 = clock()
            step_ns.append(t1 - t0 + t3 - t2)
            split.append((t1 - t0, t3 - t2))
        self.splits.append(split_per_request(split, num_reqs))
        return step_ns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-reqs", type=int, default=256)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=400, help="decode steps per round and side")
    parser.add_argument("--no-prefix-caching", action="store_true")
    parser.add_argument("--aligned-prompts", action="store_true",
                        help="equal prompt lengths: every request crosses a block boundary on the same step, "
                             "so the median step does no block allocation or hashing at all")
    parser.add_argument("--nano-vllm", default=os.environ.get("NANO_VLLM"), metavar="PATH",
                        help="a nano-vllm checkout to measure side by side (default: $NANO_VLLM)")
    parser.add_argument("--profile", action="store_true", help="print a cProfile table of minivllm (one round)")
    add_bench_args(parser, pairs=5)
    args = parser.parse_args()
    env_before = environment()
    rounds = args.warmup + args.pairs
    max_model_len = args.prompt_len + args.block_size + (rounds + 1) * args.steps + 64
    prompts = make_prompts(args.num_reqs, args.block_size, args.prompt_len, args.aligned_prompts)
    mini = MinivllmSide(prompts, args.block_size, max_model_len, not args.no_prefix_caching)
    print(f"{args.num_reqs} running decode requests, block_size {args.block_size}, {args.steps} steps per round, "
          f"prefix caching {'off' if args.no_prefix_caching else 'on'}, prompt lengths "
          f"{'aligned' if args.aligned_prompts else 'staggered'}; {environment_line(env_before)}")
    if args.profile:
        profiler = cProfile.Profile()
        mini.round(args.steps, profiler)
        buf = io.StringIO()
        pstats.Stats(profiler, stream=buf).sort_stats("tottime").print_stats(20)
        print(buf.getvalue())
        return

    sides = {"minivllm": mini}
    if args.nano_vllm:
        nano = load_nano_vllm(args.nano_vllm)
        sides["nano-vllm"] = NanoVllmSide(nano, prompts, args.block_size, max_model_len)
        if nano.xxhash_shim:
            print("  (xxhash is not installed: nano-vllm's block hash runs on a blake2b stand-in)")
        if not args.aligned_prompts:
            # Where the time goes: with aligned prompts the median step allocates, hashes and caches no block,
            # so staggered minus aligned is each side's block work, and aligned alone its per-request loop.
            aligned = make_prompts(args.num_reqs, args.block_size, args.prompt_len, True)
            sides["minivllm, no block step"] = MinivllmSide(aligned, args.block_size, max_model_len,
                                                            not args.no_prefix_caching)
            sides["nano-vllm, no block step"] = NanoVllmSide(nano, aligned, args.block_size, max_model_len)
            for name in ("minivllm, no block step", "nano-vllm, no block step"):
                sides[name].name = name
    mean_per_req: dict[str, list[float]] = {name: [] for name in sides}

    def measure(side):
        def fn() -> float:
            ns = side.round(args.steps)
            mean_per_req[side.name].append(statistics.fmean(ns) / 1e3 / args.num_reqs)
            return statistics.median(ns) / 1e3 / args.num_reqs
        return fn

    per_req = interleave({name: measure(side) for name, side in sides.items()}, args.pairs, args.warmup)
    figures = {}
    for name, values in per_req.items():
        means = mean_per_req[name][args.warmup:]
        splits = sides[name].splits[args.warmup:]
        first, second = (statistics.median(x[i] for x in splits) for i in (0, 1))
        print(f"  {name:10s} us per running request per step: median of rounds {spread(values)}; "
              f"mean step {statistics.median(means):.3f}; schedule() {first:.3f} + "
              f"{'update_from_output' if name.startswith('minivllm') else 'postprocess'}() {second:.3f}")
        figures[f"{name} us/req-step"] = {"median": statistics.median(values), "min": min(values),
                                          "max": max(values), "mean_step": statistics.median(means),
                                          "schedule": first, "update": second}
    ratios = []
    if "nano-vllm" in per_req:
        r = ratio("scheduler cost minivllm / nano-vllm", per_req["minivllm"], per_req["nano-vllm"],
                  "nano-vllm's Scheduler in the same run (goal <= 1.0)")
        ratios.append(r)
        print("  " + r.line())
    if "nano-vllm, no block step" in per_req:
        r = ratio("scheduler cost minivllm / nano-vllm, steps without block work", per_req["minivllm, no block step"],
                  per_req["nano-vllm, no block step"], "nano-vllm's Scheduler, aligned prompts (the loops alone)")
        ratios.append(r)
        print("  " + r.line())
        for side in ("minivllm", "nano-vllm"):
            block = [a - b for a, b in zip(per_req[side], per_req[f"{side}, no block step"], strict=True)]
            figures[f"{side} block work us/req-step"] = statistics.median(block)
            print(f"  {side:10s} block allocation, hashing and caching: {statistics.median(block):.3f} us per "
                  f"request-step (staggered minus aligned, median of rounds)")
    if "nano-vllm" not in per_req:
        print("  (no --nano-vllm PATH: no side-by-side anchor in this run)")
    print(f"  after: {environment_line()}")
    write_json(args.json_out, "scheduler_overhead", ratios, figures, env_before)


if __name__ == "__main__":
    main()
