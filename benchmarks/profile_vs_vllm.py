"""Where the time goes, minivllm against the pinned vLLM, on the same workload and checkpoint (torch.profiler, CPU).

Each side loads its engine once in its own process, with its EngineCore in that process (vLLM:
VLLM_ENABLE_V1_MULTIPROCESSING=0, its model on the profiled thread; minivllm: multiprocess=False, profiled through
LLM.start_profile on its worker thread), so both use every core for torch's threads; it warms up,
and profiles one generate of vs_vllm.py's workload. Only top-level operators count (an op inside another op is
part of its parent), grouped: GEMM, attention (KV write + paged attention), the other model ops (norms, rotary,
activation, residual adds), sampling, and everything else; "outside the ops" is the wall time no operator
covers: Python (scheduler, input preparation, output processing) and waiting. Figures are ms per generated token.

    .venv/bin/python benchmarks/profile_vs_vllm.py                 # ~100M Llama (make vllm first)
    .venv/bin/python benchmarks/profile_vs_vllm.py --model shipped
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from autograder.pin import VLLM_VERSION

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

CATEGORIES = [  # first match wins, on the op's name
    ("GEMM", re.compile(r"onednn_mm|_linear_pointwise|aten::(mm|addmm|linear|matmul|bmm)$")),
    ("attention", re.compile(r"attention|attn|scaled_dot_product|index_select|reshape_and_cache|index_copy_|"
                             r"kv_cache|slot_mapping|index_put_|aten::index$")),
    ("sampling", re.compile(r"argmax|sort|topk|softmax|multinomial|exponential|gather|logits")),
    ("norms, rotary, activation", re.compile(r"rotary|rms|silu|gelu|aten::(mul|div_?|mean|pow|add_?|rsqrt|sum|"
                                             r"cat|chunk|split|neg|embedding)$")),
]


def top_level_ms(trace_path: str) -> tuple[Counter, float]:
    """ms per category over the top-level ops of every thread, and the span the ops cover (ms)."""
    events = [e for e in json.loads(Path(trace_path).read_text())["traceEvents"]
              if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation", None)
              and not e["name"].startswith(("PyTorch Profiler", "execute_model", "ProfilerStep"))]
    by_cat: Counter = Counter()
    for tid in {e.get("tid") for e in events}:
        end = -1.0
        for e in sorted((e for e in events if e.get("tid") == tid), key=lambda e: (e["ts"], -e["dur"])):
            if e["ts"] < end:
                continue  # nested in the op before it
            end = e["ts"] + e["dur"]
            cat = next((c for c, rx in CATEGORIES if rx.search(e["name"])), "other ops")
            by_cat[cat] += e["dur"] / 1e3
    return by_cat, sum(by_cat.values())


def child(side: str, model: str, args) -> None:
    from vs_vllm import workload
    prompts, out_lens = workload(args.num_prompts, args.seed, args.min_len, args.max_len)
    trace = str(Path(args.trace_dir) / f"{side}.json")
    if side == "vllm":
        import torch
        from vllm import LLM, SamplingParams
        llm = LLM(model=model, dtype="float32", enforce_eager=True, seed=0, max_model_len=512,
                  kv_cache_memory_bytes=512 << 20)
    else:
        from minivllm import LLM, SamplingParams
        llm = LLM(model, dtype="float32", enforce_eager=True, seed=0, max_model_len=512, multiprocess=False)
    inputs = [{"prompt_token_ids": p} for p in prompts]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in out_lens]
    llm.generate(inputs, params, use_tqdm=False)
    if side == "vllm":
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            outs = llm.generate(inputs, params, use_tqdm=False)
            wall = time.perf_counter() - t0
        prof.export_chrome_trace(trace)
    else:
        llm.start_profile(trace)
        t0 = time.perf_counter()
        outs = llm.generate(inputs, params, use_tqdm=False)
        wall = time.perf_counter() - t0
        llm.stop_profile()
    import torch
    print(json.dumps({"wall_ms": wall * 1e3, "tokens": sum(len(o.outputs[0].token_ids) for o in outs),
                      "trace": trace, "torch_threads": torch.get_num_threads()}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-100m")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--min-len", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--side", choices=["minivllm", "vllm"], help=argparse.SUPPRESS)
    ap.add_argument("--trace-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    from vs_vllm import model_folder
    model = str(model_folder(args.model))
    if args.side:
        return child(args.side, model, args)
    from common import environment, environment_line, write_json

    from autograder.vllm_oracle import vllm_python
    if vllm_python() is None:
        print(f"skipped: no .venv-vllm here (run `make vllm` to profile vLLM {VLLM_VERSION} too)")
        return
    env = environment()
    print(environment_line(env), flush=True)
    trace_dir = tempfile.mkdtemp(prefix="profile_vs_vllm-")
    rows, figures = {}, {}
    for side, py in (("minivllm", sys.executable), ("vllm", str(vllm_python()))):
        proc = subprocess.run([py, __file__, "--side", side, "--model", args.model, "--trace-dir", trace_dir,
                               "--num-prompts", str(args.num_prompts), "--seed", str(args.seed),
                               "--min-len", str(args.min_len), "--max-len", str(args.max_len)],
                              capture_output=True, text=True, timeout=1800, cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO), "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                                   "VLLM_LOGGING_LEVEL": "ERROR", "TOKENIZERS_PARALLELISM": "false"})
        line = next((x for x in proc.stdout.splitlines() if x.startswith("{")), None)
        if proc.returncode or line is None:
            raise SystemExit(f"{side} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        got = json.loads(line)
        by_cat, covered = top_level_ms(got["trace"])
        by_cat["outside the ops"] = max(0.0, got["wall_ms"] - covered)
        rows[side] = {k: v / got["tokens"] for k, v in by_cat.items()}
        rows[side]["total (wall)"] = got["wall_ms"] / got["tokens"]
        figures[side] = {"wall_ms": got["wall_ms"], "tokens": got["tokens"], "ms": dict(by_cat),
                         "torch_threads": got["torch_threads"]}
    names = [c for c, _ in CATEGORIES] + ["other ops", "outside the ops", "total (wall)"]
    print(f"{args.model}: ms per generated token ({figures['minivllm']['tokens']} tokens; sides one after the other; "
          f"torch threads minivllm {figures['minivllm']['torch_threads']}, vLLM {figures['vllm']['torch_threads']})")
    print(f"  {'':28s} {'minivllm':>9s} {'vLLM':>9s} {'ratio':>7s}")
    for n in names:
        a, b = rows["minivllm"].get(n, 0.0), rows["vllm"].get(n, 0.0)
        print(f"  {n:28s} {a:9.3f} {b:9.3f} {a / b if b else float('nan'):7.2f}")
    figures["rows"] = rows
    write_json(args.json_out, "profile_vs_vllm", [], figures, env)
    if args.json_out:
        plot(Path(args.json_out).with_suffix(".png"), rows, names[:-1], args.model)


def plot(path: Path, rows: dict, names: list[str], model: str) -> None:
    """One stacked bar per engine: ms per generated token by kind."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(8, 2.4))
    sides = ["minivllm", "vllm"]
    left = [0.0, 0.0]
    for n in names:
        widths = [rows[s].get(n, 0.0) for s in sides]
        ax.barh(["minivllm", f"vLLM {VLLM_VERSION}"], widths, left=left, label=n)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.set_xlabel(f"ms per generated token ({model}, torch.profiler, top-level ops)")
    ax.invert_yaxis()
    ax.legend(fontsize=7, ncol=3, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
