"""minivllm against the pinned vLLM itself on this CPU: offline throughput and the scheduler's cost, interleaved.

Throughput: the same seeded workload (token-id prompts and output lengths uniform in [min-len, max-len],
ignore_eos, greedy, fp32, eager) on the same safetensors. Each engine is loaded once in its own process (vLLM's
on .venv-vllm's Python), warmed up, then the parent asks them in turn for one timed generate each (minivllm,
vLLM, minivllm, ...): one ratio per pair, median and min-max. Both engines run with their own defaults otherwise
(vLLM: async scheduling on; minivllm: off). The first round's token ids must be equal.

Scheduler: schedule() + update_from_output() per running request per step, vLLM's Scheduler built on CPU as its
tests build it against minivllm's, both driven by autograder/vllm_oracle's harness (decode steps of a full batch).

    .venv/bin/python benchmarks/vs_vllm.py                      # shipped model, ~100M Llama, scheduler (make vllm first)
    .venv/bin/python benchmarks/vs_vllm.py --models shipped --pairs 5
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from autograder.pin import VLLM_VERSION

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

# A ~99M-parameter Llama: 8 layers, hidden 1024, GQA 16/4, vocab 4096 (the shipped tokenizer's).
LLAMA_100M = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                  num_key_value_heads=4)


def workload(n: int, seed: int, lo: int, hi: int) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(seed)
    return ([[rng.randrange(4, 4000) for _ in range(rng.randint(lo, hi))] for _ in range(n)],
            [rng.randint(lo, hi) for _ in range(n)])


def model_folder(name: str) -> Path:
    from autograder.vllm_oracle import models

    if name == "shipped":
        return models.SHIPPED
    path = models.MODELS_DIR / "llama-100m"
    if not (path / "config.json").exists():
        models.TINY["llama-100m"] = ("LlamaForCausalLM", "llama", LLAMA_100M)
        models.ensure("llama-100m")
    return path


# ------------------------------------------------------------------------------------------ child processes
def serve_engine(side: str, model: str, args) -> None:
    """Load one engine, then answer each 'run' line on stdin with one timed generate (JSON on stdout)."""
    prompts, out_lens = workload(args.num_prompts, args.seed, args.min_len, args.max_len)
    if side == "vllm":
        from vllm import LLM, SamplingParams
        llm = LLM(model=model, dtype="float32", enforce_eager=True, seed=0, max_model_len=512,
                  kv_cache_memory_bytes=512 << 20)
        inputs = [{"prompt_token_ids": p} for p in prompts]
    else:
        from minivllm import LLM, SamplingParams
        llm = LLM(model, dtype="float32", enforce_eager=True, seed=0, max_model_len=512)
        inputs = [{"prompt_token_ids": p} for p in prompts]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in out_lens]
    import torch
    print(json.dumps({"ready": True, "torch_threads": torch.get_num_threads()}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        t0 = time.perf_counter()
        outs = llm.generate(inputs, params, use_tqdm=False)
        elapsed = time.perf_counter() - t0
        tokens = [list(o.outputs[0].token_ids) for o in outs]
        print(json.dumps({"seconds": elapsed, "tokens": sum(map(len, tokens)), "token_ids": tokens}), flush=True)


def scheduler_cost(side: str, args) -> None:
    """us per running request per step: schedule() + update_from_output() on decode steps of a full batch."""
    from autograder.vllm_oracle.scheduler_harness import request, workload
    if side == "vllm":
        from autograder.vllm_oracle.vllm_side import VllmSchedulerBackend as Backend
    else:
        from autograder.vllm_oracle.minivllm_side import MinivllmSchedulerBackend as Backend
    backend = Backend()
    n, steps = args.sched_requests, args.sched_steps
    cfg = workload([], 0, block_size=16, max_model_len=4096, max_num_batched_tokens=8192, max_num_seqs=n,
                   num_blocks=n * 300 // 16 + 16)["config"]
    results = []
    for rnd in range(args.warmup + args.pairs):
        sched = backend.make_scheduler(cfg)
        rng = random.Random(rnd)
        for i in range(n):
            prompt = [rng.randrange(3, 4000) for _ in range(32)]
            sched.add_request(backend.make_request(request(f"r{i}", prompt, steps + 8, [], ignore_eos=True), cfg))
        so = sched.schedule()  # the prefill step: not timed
        backend.update(sched, so, list(so.num_scheduled_tokens), [[5] for _ in so.num_scheduled_tokens])
        t0 = time.perf_counter()
        for _ in range(steps):
            so = sched.schedule()
            ids = list(so.num_scheduled_tokens)
            backend.update(sched, so, ids, [[7] for _ in ids])
        results.append((time.perf_counter() - t0) / (steps * n) * 1e6)
    print(json.dumps({"us_per_request_step": results[args.warmup:]}), flush=True)


# ------------------------------------------------------------------------------------------ the parent
def vllm_python() -> str:
    from autograder.vllm_oracle import vllm_python as find

    py = find()
    if py is None:
        raise SystemExit("no .venv-vllm: run `make vllm` first")
    return str(py)


def child(python: str, argv: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_LOGGING_LEVEL": "ERROR", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen([python, str(Path(__file__).resolve()), *argv], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=REPO)


def read_json(proc: subprocess.Popen) -> dict:
    for line in proc.stdout:
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"benchmark child exited ({proc.wait()}) without an answer")


def throughput(model_name: str, args) -> tuple:
    from common import interleave, ratio, spread

    model = str(model_folder(model_name))
    common_argv = ["--serve", model, "--num-prompts", str(args.num_prompts), "--seed", str(args.seed),
                   "--min-len", str(args.min_len), "--max-len", str(args.max_len)]
    procs = {"minivllm": child(sys.executable, ["--side", "minivllm", *common_argv]),
             "vllm": child(vllm_python(), ["--side", "vllm", *common_argv])}
    try:
        for p in procs.values():
            read_json(p)
        first: dict[str, list] = {}

        def ask(side: str):
            def run() -> float:
                procs[side].stdin.write("run\n")
                procs[side].stdin.flush()
                answer = read_json(procs[side])
                first.setdefault(side, answer["token_ids"])
                print(f"   {side:8s} {answer['tokens'] / answer['seconds']:8.1f} tok/s", flush=True)
                return answer["tokens"] / answer["seconds"]
            return run

        rounds = interleave({"minivllm": ask("minivllm"), "vllm": ask("vllm")}, args.pairs, args.warmup)
    finally:
        for p in procs.values():
            p.stdin.close()
            p.wait(timeout=120)
    equal = first["minivllm"] == first["vllm"]
    r = ratio(f"throughput {model_name}", rounds["minivllm"], rounds["vllm"], f"vLLM {VLLM_VERSION} tok/s (goal >= 1.0)")
    print(f"{model_name}: minivllm {spread(rounds['minivllm'])} tok/s, vLLM {spread(rounds['vllm'])} tok/s; "
          f"{r.line()}; greedy token ids equal: {equal}", flush=True)
    return r, {f"{model_name}_tok_s": rounds, f"{model_name}_greedy_equal": equal}


def scheduler(args) -> tuple:
    from common import ratio, spread

    argv = ["--scheduler-child", "--sched-requests", str(args.sched_requests), "--sched-steps",
            str(args.sched_steps), "--pairs", str(args.pairs), "--warmup", str(args.warmup)]
    got = {}
    for side, py in (("minivllm", sys.executable), ("vllm", vllm_python())):
        p = child(py, ["--side", side, *argv])
        got[side] = read_json(p)["us_per_request_step"]
        p.wait()
    r = ratio("scheduler us per running request per step", got["minivllm"], got["vllm"],
              f"vLLM {VLLM_VERSION}'s Scheduler (goal <= 1.0)")
    print(f"scheduler: minivllm {spread(got['minivllm'])} us, vLLM {spread(got['vllm'])} us; {r.line()}", flush=True)
    return r, {"scheduler_us": got}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="shipped,llama-100m")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--min-len", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sched-requests", type=int, default=256)
    ap.add_argument("--sched-steps", type=int, default=64)
    ap.add_argument("--no-scheduler", action="store_true")
    ap.add_argument("--side", choices=["minivllm", "vllm"], help=argparse.SUPPRESS)
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--scheduler-child", action="store_true", help=argparse.SUPPRESS)
    from common import add_bench_args, environment, environment_line, write_json
    add_bench_args(ap)
    args = ap.parse_args()
    if args.serve:
        return serve_engine(args.side, args.serve, args)
    if args.scheduler_child:
        return scheduler_cost(args.side, args)
    from autograder.vllm_oracle import vllm_python as find_vllm
    if find_vllm() is None:
        print(f"skipped: no .venv-vllm here (run `make vllm` to measure against vLLM {VLLM_VERSION})")
        return
    env = environment()
    print(environment_line(env), flush=True)
    ratios, figures = [], {}
    for name in [m for m in args.models.split(",") if m]:
        r, f = throughput(name, args)
        ratios.append(r)
        figures.update(f)
    if not args.no_scheduler:
        r, f = scheduler(args)
        ratios.append(r)
        figures.update(f)
    write_json(args.json_out, "vs_vllm", ratios, figures, env)


if __name__ == "__main__":
    main()
