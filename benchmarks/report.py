"""`make bench`: run every benchmark at its default (2-core-sized) settings and write one report.

Each script writes its records (ratios with min-max and anchor, other figures, torch threads and load
before and after) to a JSON file; this collects them into build/bench/report.md and draws every ratio
with its min-max against its goal in build/bench/ratios.png.

    python benchmarks/report.py [--out build/bench] [--nano-vllm PATH] [--only scheduler_overhead,...]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import environment, environment_line

from autograder.pin import VLLM_VERSION

HERE = Path(__file__).resolve().parent
# (script, extra arguments, what it measures); paged_attention only measures on a GPU.
BENCHMARKS = [
    ("scheduler_overhead", [], "scheduler schedule + update per running request per step (no model)"),
    ("async_scheduling", [], "engine throughput with async scheduling vs synchronous"),
    ("throughput", [], "offline throughput vs HF transformers generate"),
    ("inproc_vs_mp", [], "multiprocess EngineCore vs in-process"),
    ("paged_attention", [], "Triton paged decode attention bandwidth (GPU only)"),
    ("structured_output", ["--batch", "16", "--max-tokens", "48"], "half the batch JSON-constrained vs none"),
    ("spec_decode", ["--num-prompts", "2", "--max-tokens", "96"], "n-gram speculative decoding vs plain, batch 1"),
    ("tensor_parallel", ["--num-prompts", "16"], "TP=2 vs TP=1 (gloo, 2 CPU ranks) and the all-reduce share"),
    ("vs_vllm", [], f"throughput (shipped, ~100M Llama) and scheduler cost vs vLLM {VLLM_VERSION} itself (needs make vllm)"),
    ("profile_vs_vllm", [], f"where the time goes per generated token (torch.profiler), minivllm and vLLM {VLLM_VERSION}, ~100M Llama"),
    ("serve_vs_vllm", [], f"serving TTFT / TPOT / throughput vs vLLM {VLLM_VERSION}'s server, by vLLM's own bench client"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(HERE.parent / "build" / "bench"))
    ap.add_argument("--nano-vllm", default=os.environ.get("NANO_VLLM"), metavar="PATH",
                    help="a nano-vllm checkout for the scheduler anchor (default: $NANO_VLLM)")
    ap.add_argument("--only", default=None, help="comma-separated benchmark names")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    only = set(args.only.split(",")) if args.only else None
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")])))
    records, sections = [], []
    start_env = environment()
    for name, extra, what in BENCHMARKS:
        if only and name not in only:
            continue
        script = HERE / f"{name}.py"
        if not script.exists():
            continue
        json_path = out / f"{name}.json"
        json_path.unlink(missing_ok=True)
        cmd = [sys.executable, str(script), *extra, "--json-out", str(json_path)]
        if name == "scheduler_overhead" and args.nano_vllm:
            cmd += ["--nano-vllm", args.nano_vllm]
        print(f"== {name}: {what}", flush=True)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        elapsed = time.perf_counter() - t0
        print(proc.stdout, end="")
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
        record = json.loads(json_path.read_text()) if json_path.exists() else None
        if record:
            records.append(record)
        sections.append((name, what, " ".join(Path(c).name if i == 1 else c for i, c in enumerate(cmd[1:], 1)),
                         elapsed, proc.returncode, record, proc.stdout))
    write_report(out, sections, start_env)


def write_report(out: Path, sections, start_env: dict) -> None:
    lines = ["# minivllm benchmark report", "",
             f"{time.strftime('%Y-%m-%d %H:%M:%S')}; at the start: {environment_line(start_env)}; "
             f"at the end: {environment_line()}.", "",
             "Every ratio is the median of per-pair ratios from interleaved runs (A B A B ..., after a warm-up; "
             "benchmarks/common.py), with the min and max over the pairs.", "",
             "| benchmark | ratio | median | min | max | pairs | compared with |", "|---|---|---|---|---|---|---|"]
    all_ratios = []
    for name, _what, _cmd, _elapsed, rc, record, _stdout in sections:
        if record is None:
            lines.append(f"| {name} | (no result{': exit ' + str(rc) if rc else ', nothing to measure here'}) "
                         "| | | | | |")
            continue
        for r in record["ratios"]:
            all_ratios.append(r)
            lines.append(f"| {name} | {r['name']} | {r['median']:.3f} | {r['min']:.3f} | {r['max']:.3f} | "
                         f"{r['pairs']} | {r['anchor']} |")
    lines += ["", "## Per benchmark", ""]
    for name, what, cmd, elapsed, rc, record, stdout in sections:
        lines += [f"### {name}", "", f"{what}. `{cmd}` ({elapsed:.0f} s, exit {rc}).", ""]
        if record:
            lines += [f"torch threads {record['env_before'].get('torch_threads')}, load before "
                      f"{record['env_before']['loadavg']}, after {record['env_after']['loadavg']}.", ""]
            for key, value in record["figures"].items():
                lines.append(f"- {key}: {json.dumps(value)}")
        lines += ["", "```", stdout.strip(), "```", ""]
        if (out / f"{name}.png").exists():
            lines += [f"![{name}]({name}.png)", ""]
    if all_ratios and plot(out / "ratios.png", all_ratios):
        lines += ["![ratios](ratios.png)", ""]
    (out / "report.md").write_text("\n".join(lines))
    print(f"wrote {out / 'report.md'}")


def plot(path: Path, ratios: list[dict]) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * len(ratios)))
    for i, r in enumerate(ratios):
        ax.errorbar(r["median"], i, xerr=[[r["median"] - r["min"]], [r["max"] - r["median"]]], fmt="o", capsize=4)
    ax.axvline(1.0, color="gray", lw=0.8, ls="--")
    ax.set_yticks(range(len(ratios)), [r["name"] for r in ratios], fontsize=8)
    ax.set_xlabel("ratio (median of interleaved pairs, bars = min-max)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


if __name__ == "__main__":
    main()
