"""Tensor parallelism: TP=2 vs TP=1 offline throughput, and the all-reduce's share of a TP=2 step.

    python benchmarks/tensor_parallel.py [--model PATH] [--num-prompts 32] [--output-len 32] [--pairs 3]

Both engines stay up (in-process EngineCore; TP=2 adds two worker processes) and runs alternate
A B A B after a warm-up, so a change in machine load hits both alike; prints each pair's tokens/s, the
median TP2/TP1 ratio and its min-max. Then one profiled TP=2 run: rank 0's torch.profiler trace gives
the time inside all-reduce (and all-gather) ops as a share of the time inside execute_model.

On a 2-core CPU do not expect a speed-up: TP=1 already uses both cores for each matmul, TP=2 gives each
rank one core and adds two all-reduces per layer plus the per-step broadcast of the scheduler output.
The all-reduce time includes waiting for the slower rank, so it is the cost of synchronising, not just
of moving bytes.

Measured (2026-12-01, the shared 2-core CPU box under other engineers' load, defaults, default model):
TP=2 / TP=1 median 0.474 (min 0.388, max 0.783) over 3 pairs (TP=1 ~870-1790 tok/s, TP=2 ~650-850);
rank 0: all-reduce 21% of execute_model time (288 calls = 32 steps x (1 embedding + 2 x 4 layers)),
logits all-gather 4%.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time

from common import add_bench_args, environment, environment_line, interleave, ratio, spread, write_json

from minivllm.entrypoints.llm import LLM
from minivllm.sampling_params import SamplingParams


def workload(n: int, input_len: int, vocab: int = 4000, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab) for _ in range(rng.randint(input_len // 2, input_len))] for _ in range(n)]


def tokens_per_s(llm: LLM, prompts, params) -> float:
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t0)


def comm_share(trace_path: str) -> tuple[float, float, float, int]:
    """(all-reduce ms, all-gather ms, execute_model ms, all-reduce calls) from a Chrome trace (rank 0)."""
    events = [e for e in json.load(open(trace_path))["traceEvents"] if e.get("ph") == "X"]
    # one name per collective: the c10d op (its gloo:* twin covers the same interval)
    reduce_ = [e for e in events if e["name"] == "c10d::allreduce_"]
    gather = [e for e in events if e["name"] == "c10d::allgather_"]
    steps = [e for e in events if e["name"] == "execute_model"]
    ms = lambda es: sum(e["dur"] for e in es) / 1e3  # noqa: E731
    return ms(reduce_), ms(gather), ms(steps), len(reduce_)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--device", default="cpu")
    add_bench_args(p)
    args = p.parse_args()
    env = environment()
    kw = dict(device=args.device, attention_backend="torch", max_num_seqs=args.max_num_seqs, multiprocess=False)
    if args.model:
        kw["model"] = args.model
    prompts = workload(args.num_prompts, args.input_len)
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)

    tp1, tp2 = LLM(tensor_parallel_size=1, **kw), LLM(tensor_parallel_size=2, **kw)
    rates = interleave({"tp1": lambda: tokens_per_s(tp1, prompts, params),
                        "tp2": lambda: tokens_per_s(tp2, prompts, params)}, args.pairs, args.warmup)
    r = ratio("tok/s, TP=2 / TP=1", rates["tp2"], rates["tp1"],
              f"TP=1 on the same {os.cpu_count()} cores (no speedup expected on a 2-core CPU)")
    print(f"TP=1 {spread(rates['tp1'])} tok/s, TP=2 {spread(rates['tp2'])} tok/s; {environment_line(env)}")
    print(r.line())

    path = os.path.join(tempfile.mkdtemp(prefix="minivllm-tp-"), "tp2.json")
    tp2.start_profile(path)
    tp2.generate(prompts, params, use_tqdm=False)
    trace = tp2.stop_profile()
    ar, ag, step, calls = comm_share(trace)
    print(f"rank 0, one profiled TP=2 run: execute_model {step:.1f} ms; all-reduce {ar:.1f} ms "
          f"({100 * ar / step:.1f}%, {calls} calls); all-gather (logits) {ag:.1f} ms ({100 * ag / step:.1f}%)")
    print(f"trace: {trace}")
    write_json(args.json_out, "tensor_parallel", [r], {"allreduce_share": ar / step, "allgather_share": ag / step,
                                                        "allreduce_calls": calls}, env)
    tp2.llm_engine.shutdown()


if __name__ == "__main__":
    main()
