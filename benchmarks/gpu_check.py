"""One-command validation of the GPU path (`make gpu-check`): correctness first, then the figures.

On one CUDA GPU, within --budget-s (8 minutes by default), this runs:
  1. the GPU tests: CUDA-graph capture and replay, Triton kernels against torch, the engine against HF
     transformers (float32 exact greedy; bfloat16 within tests/test_cuda_vs_hf.py's BF16_NATS);
  2. every solution notebook (solutions/**/*.ipynb), executed on the GPU;
  3. measurements: the decode kernel's bandwidth as a share of device-copy bandwidth at long context
     (goal >= 70%), CUDA-graph vs eager decode at batch 1/8/64 (goal >= 2x at batch 1), throughput
     against HF generate on the same prompts, and the share of each engine step spent outside the
     forward pass.
It writes gpu_check.json and gpu_check.md to --out-dir. Each stage runs in its own process with a
timeout taken from what is left of the budget; a stage that fails or times out is reported, not fatal.

The GPU box has torch, triton and transformers but no network. What else the checks import is listed in
WHEELS (import name -> distribution); the missing ones are installed from --wheels (a folder of wheels,
64 MiB at most; the full list for CPython 3.12 measured 47 wheels, 41 MiB). Fill it on a machine with
network, for the GPU box's Python version (`python3 -V` there; 3.12 below):

    pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \\
        -d .gpu_wheels $(python benchmarks/gpu_check.py --list-wheels)

--dry-run works without a GPU: it checks the wheel folder, plans the stages and writes the report
(every stage "skipped"), which is what tests/test_gpu_check.py runs on CPU.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

MAX_WHEELS_BYTES = 64 << 20
# import name -> distribution: the engine (msgspec, pyzmq), pytest, and the notebook runner with its
# kernel (nbclient, ipykernel and their dependencies), plus matplotlib for the lessons' figures.
WHEELS: dict[str, str] = {
    "msgspec": "msgspec", "zmq": "pyzmq",
    "pytest": "pytest", "pluggy": "pluggy", "iniconfig": "iniconfig",
    "nbclient": "nbclient", "nbformat": "nbformat", "fastjsonschema": "fastjsonschema",
    "jsonschema": "jsonschema", "jsonschema_specifications": "jsonschema-specifications",
    "referencing": "referencing", "rpds": "rpds-py", "attrs": "attrs",
    "jupyter_client": "jupyter-client", "jupyter_core": "jupyter-core", "traitlets": "traitlets",
    "platformdirs": "platformdirs", "dateutil": "python-dateutil", "six": "six", "tzdata": "tzdata",
    "tornado": "tornado",
    "ipykernel": "ipykernel", "comm": "comm", "debugpy": "debugpy", "psutil": "psutil",
    "nest_asyncio2": "nest-asyncio2", "IPython": "ipython", "ipython_pygments_lexers": "ipython-pygments-lexers",
    "jedi": "jedi", "parso": "parso", "matplotlib_inline": "matplotlib-inline", "pexpect": "pexpect",
    "ptyprocess": "ptyprocess", "prompt_toolkit": "prompt-toolkit", "wcwidth": "wcwidth",
    "stack_data": "stack-data", "executing": "executing", "asttokens": "asttokens", "pure_eval": "pure-eval",
    "pygments": "pygments",
    "matplotlib": "matplotlib", "contourpy": "contourpy", "cycler": "cycler", "fontTools": "fonttools",
    "kiwisolver": "kiwisolver", "PIL": "pillow", "pyparsing": "pyparsing",
}
GPU_TESTS = ["tests/test_cudagraph.py", "tests/test_triton_attention.py", "tests/test_triton_e2e.py",
             "tests/test_cuda_vs_hf.py"]
# stage -> (share of the budget it may use at most, what it checks)
STAGES: dict[str, tuple[float, str]] = {
    "tests": (0.35, "GPU tests: CUDA graphs, Triton vs torch, engine vs HF"),
    "notebooks": (0.3, "every solution notebook on CUDA"),
    "decode_bandwidth": (0.1, "decode kernel bandwidth / device-copy bandwidth at long context"),
    "graph_speedup": (0.12, "CUDA graph vs eager decode at batch 1/8/64"),
    "throughput": (0.2, "throughput vs HF generate; share of step time outside the forward"),
}
GOALS = {"decode_bandwidth": ("frac_copy", 0.70), "graph_speedup": ("speedup_batch1", 2.0)}


# ---------------------------------------------------------------- wheels
def missing_distributions(wheels: dict[str, str] = WHEELS) -> list[str]:
    """Distributions whose import name this Python cannot find."""
    return sorted({dist for mod, dist in wheels.items() if importlib.util.find_spec(mod) is None})


def check_wheel_folder(folder: Path, needed: list[str]) -> dict:
    """Which needed distributions have a wheel in folder, and whether the folder fits the 64 MiB limit."""
    files = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    size = sum(f.stat().st_size for f in files)

    def norm(name: str) -> str:
        return name.lower().replace("-", "_").replace(".", "_")
    have = {norm(f.name.split("-")[0]) for f in files}
    absent = [d for d in needed if norm(d) not in have]
    return {"folder": str(folder), "wheels": len(files), "bytes": size, "over_limit": size > MAX_WHEELS_BYTES,
            "needed": needed, "absent": absent}


def install_wheels(folder: Path, needed: list[str]) -> dict:
    info = check_wheel_folder(folder, needed)
    if not needed:
        return info | {"status": "nothing to install"}
    if info["over_limit"]:
        return info | {"status": f"refused: {info['bytes'] / 2**20:.1f} MiB of wheels > 64 MiB"}
    if info["absent"]:
        return info | {"status": f"missing wheels: {' '.join(info['absent'])} (see --list-wheels)"}
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "-q",
                           "--find-links", str(folder), *needed], capture_output=True, text=True)
    return info | {"status": "installed" if proc.returncode == 0 else "pip failed",
                   "tail": (proc.stdout + proc.stderr)[-2000:]}


# ---------------------------------------------------------------- stages (each in its own process)
def child_env() -> dict[str, str]:
    """Children (pytest, notebook kernels, stages) import this checkout's minivllm without installing it."""
    path = os.environ.get("PYTHONPATH")
    return os.environ | {"PYTHONPATH": str(ROOT) + (os.pathsep + path if path else "")}


def stage_tests(timeout: float) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-rfs", *GPU_TESTS]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=child_env())
    except subprocess.TimeoutExpired as e:
        return {"status": "timeout", "seconds": timeout, "tail": str(e.stdout or "")[-3000:]}
    lines = proc.stdout.strip().splitlines()
    return {"status": "pass" if proc.returncode == 0 else "fail", "seconds": time.perf_counter() - start,
            "summary": lines[-1] if lines else "", "tail": proc.stdout[-3000:] if proc.returncode else ""}


def stage_notebooks(timeout: float, paths: list[Path] | None = None) -> dict:
    import nbclient
    import nbformat
    results, deadline = {}, time.perf_counter() + timeout
    for nb_path in paths or sorted(ROOT.glob("solutions/**/*.ipynb")):
        left = deadline - time.perf_counter()
        name = str(nb_path.relative_to(ROOT)) if nb_path.is_relative_to(ROOT) else str(nb_path)
        if left < 5:
            results[name] = {"status": "skipped: out of time"}
            continue
        nb = nbformat.read(nb_path, as_version=4)
        start = time.perf_counter()
        client = nbclient.NotebookClient(nb, timeout=int(left), kernel_name="python3",
                                         resources={"metadata": {"path": str(nb_path.parent)}})
        try:
            client.execute()
            results[name] = {"status": "pass", "seconds": time.perf_counter() - start}
        except Exception as e:  # a failed cell, a timeout or a dead kernel: report it and go on
            results[name] = {"status": "fail", "seconds": time.perf_counter() - start,
                             "error": f"{type(e).__name__}: {str(e)[-1500:]}"}
    ok = all(r["status"] == "pass" for r in results.values()) and results
    return {"status": "pass" if ok else "fail", "notebooks": results}


def stage_decode_bandwidth(timeout: float, device: str = "cuda", argv: list[str] | None = None) -> dict:
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))  # paged_attention imports its sibling common.py
    spec = importlib.util.spec_from_file_location("paged_attention", ROOT / "benchmarks" / "paged_attention.py")
    pa = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pa)
    args = pa.parse_args(argv or ["--batch-sizes", "32", "128", "--context-lens", "8192", "32768",
                                  "--max-cache-gib", "24", "--max-baseline-gib", "4"])
    rows = pa.run(args, device)
    longest = max(r["context"] for r in rows)
    best = max((r for r in rows if r["context"] == longest), key=lambda r: r["frac_copy"])
    return {"status": "measured", "rows": rows, "context": longest, "batch": best["batch"],
            "frac_copy": best["frac_copy"], "gbs": best["gbs"], "max_err": max(r["max_err"] for r in rows
                                                                                 if r["max_err"] == r["max_err"])}


def _engine(device: str, enforce_eager: bool, max_num_seqs: int, trace: bool = False):
    from minivllm import LLM
    return LLM(device=device, multiprocess=False, enforce_eager=enforce_eager, max_num_seqs=max_num_seqs,
               trace=trace)


def _prompts(n: int, lo: int, hi: int, seed: int = 0) -> list[list[int]]:
    import random
    rng = random.Random(seed)
    return [[rng.randrange(4, 4000) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def stage_graph_speedup(timeout: float, device: str = "cuda", batches=(1, 8, 64), decode_tokens: int = 64,
                        pairs: int = 3) -> dict:
    """Decode tokens/s with graphs vs eager, A B A B after a warm-up; the median ratio per batch.

    On CPU (tests) "graph" is the padded path with an eager replay: the ratio then measures padding cost.
    """
    from minivllm import SamplingParams
    engines = {"graph": _engine(device, False, max(batches)), "eager": _engine(device, True, max(batches))}
    params = SamplingParams(max_tokens=decode_tokens, temperature=0.0, ignore_eos=True)
    out = {}
    for b in batches:
        prompts = _prompts(b, 8, 8, seed=b)
        times: dict[str, list[float]] = {"graph": [], "eager": []}
        for i in range(pairs + 1):
            for name, llm in engines.items():
                start = time.perf_counter()
                llm.generate(prompts, params, use_tqdm=False)
                if i:  # pair 0 is the warm-up
                    times[name].append(time.perf_counter() - start)
        g, e = statistics.median(times["graph"]), statistics.median(times["eager"])
        out[b] = {"graph_tok_s": b * decode_tokens / g, "eager_tok_s": b * decode_tokens / e, "speedup": e / g}
    return {"status": "measured", "batches": out, "speedup_batch1": out[batches[0]]["speedup"]}


def stage_throughput(timeout: float, device: str = "cuda", n: int = 64, lo: int = 16, hi: int = 256) -> dict:
    """The engine (graphs on) vs HF generate on the same prompts; the engine's step-time breakdown."""
    import torch
    import transformers

    from minivllm import SamplingParams
    from minivllm.config import DEFAULT_MODEL
    prompts, outs = _prompts(n, lo, hi, seed=1), _prompts(n, lo, hi, seed=2)
    out_lens = [len(o) for o in outs]
    llm = _engine(device, False, n, trace=True)
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in out_lens]
    llm.generate(prompts[:4], params[:4], use_tqdm=False)  # warm-up
    tracer = llm.llm_engine.engine_core.tracer
    tracer.clear()
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    engine_s = time.perf_counter() - start
    steps: dict[int, list] = {}
    for ev in tracer.events:
        steps.setdefault(ev.step, []).append(ev)
    wall = fwd = 0.0
    for evs in steps.values():
        wall += max(e.end for e in evs) - min(e.start for e in evs)
        fwd += sum(e.end - e.start for e in evs if e.phase in ("forward", "sample"))
    del llm
    if device == "cuda":
        torch.cuda.empty_cache()
    model = transformers.AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL, dtype=torch.float32).to(device).eval()
    model.generation_config.eos_token_id = None
    pad = model.config.pad_token_id or 0
    start = time.perf_counter()
    with torch.inference_mode():  # left-padded batches of 16; each generates up to its longest output
        for i in range(0, n, 16):
            batch = prompts[i:i + 16]
            width = max(map(len, batch))
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
            model.generate(ids, attention_mask=mask, max_new_tokens=max(out_lens[i:i + 16]), do_sample=False,
                           pad_token_id=pad)
    if device == "cuda":
        torch.cuda.synchronize()
    hf_s = time.perf_counter() - start
    tokens = sum(out_lens)
    return {"status": "measured", "requests": n, "output_tokens": tokens, "engine_tok_s": tokens / engine_s,
            "hf_tok_s": tokens / hf_s, "ratio_vs_hf": hf_s / engine_s, "steps": len(steps),
            "share_outside_forward": 1 - fwd / wall if wall else float("nan")}


STAGE_FNS = {"tests": stage_tests, "notebooks": stage_notebooks, "decode_bandwidth": stage_decode_bandwidth,
             "graph_speedup": stage_graph_speedup, "throughput": stage_throughput}


def run_stage(name: str, timeout: float) -> dict:
    """Run one stage in a child process (own CUDA context, killable); its result comes back as JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        cmd = [sys.executable, __file__, "--stage", name, "--stage-out", str(result), "--stage-timeout", str(timeout)]
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout + 15,
                                  env=child_env())
        except subprocess.TimeoutExpired as e:
            return {"status": "timeout", "seconds": timeout, "tail": str(e.stderr or "")[-2000:]}
        if proc.returncode or not result.exists():
            return {"status": "error", "seconds": time.perf_counter() - start,
                    "tail": (proc.stdout + proc.stderr)[-3000:]}
        return json.loads(result.read_text()) | {"seconds": time.perf_counter() - start}


# ---------------------------------------------------------------- report
def environment() -> dict:
    env = {"python": platform.python_version(), "machine": platform.machine()}
    for mod in ("torch", "triton", "transformers"):
        try:
            env[mod] = __import__(mod).__version__
        except ImportError:
            env[mod] = None
    try:
        import torch
        env["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        env["gpu"] = None
    return env


def verdict(stage: str, res: dict) -> str:
    if res.get("status") in ("pass", "fail", "timeout", "error") or str(res.get("status", "")).startswith("skipped"):
        return res["status"]
    if stage in GOALS:
        key, goal = GOALS[stage]
        return "meets goal" if res.get(key, 0) >= goal else "misses goal"
    return res.get("status", "?")


def render_markdown(report: dict) -> str:
    env = report["environment"]
    lines = ["# minivllm GPU check", "",
             f"{env.get('gpu') or 'no GPU'} · Python {env['python']} · torch {env['torch']} · triton "
             f"{env['triton']} · transformers {env['transformers']} · {report['seconds']:.0f} s of "
             f"{report['budget_s']:.0f} s{' · DRY RUN' if report['dry_run'] else ''}", "",
             f"Wheels: {report['wheels'].get('status')} ({len(report['wheels'].get('needed', []))} needed, "
             f"{report['wheels'].get('bytes', 0) / 2**20:.1f} MiB in {report['wheels'].get('folder')})", "",
             "| stage | what | result | seconds |", "|---|---|---|---|"]
    for name, (_, what) in STAGES.items():
        res = report["stages"].get(name, {"status": "not run"})
        secs = res.get("seconds")
        lines.append(f"| {name} | {what} | {verdict(name, res)} | {'' if secs is None else f'{secs:.0f}'} |")
    st = report["stages"]
    figures = []
    bw = st.get("decode_bandwidth", {})
    if "frac_copy" in bw:
        figures.append(f"- decode kernel at {bw['context']} tokens, batch {bw['batch']}: {bw['gbs']:.0f} GB/s = "
                       f"**{100 * bw['frac_copy']:.1f}%** of device-copy bandwidth (goal >= 70%)")
    gs = st.get("graph_speedup", {})
    for b, r in gs.get("batches", {}).items():
        figures.append(f"- decode batch {b}: graphs {r['graph_tok_s']:.0f} tok/s vs eager {r['eager_tok_s']:.0f} "
                       f"tok/s = **{r['speedup']:.2f}x**" + (" (goal >= 2x)" if str(b) == "1" else ""))
    tp = st.get("throughput", {})
    if "engine_tok_s" in tp:
        figures.append(f"- throughput, {tp['requests']} requests / {tp['output_tokens']} tokens: minivllm "
                       f"{tp['engine_tok_s']:.0f} tok/s vs HF generate {tp['hf_tok_s']:.0f} tok/s = "
                       f"**{tp['ratio_vs_hf']:.2f}x**")
        figures.append(f"- share of step time outside the forward (and the sampler's sync that waits for it): "
                       f"**{100 * tp['share_outside_forward']:.1f}%** over {tp['steps']} steps")
    if figures:
        lines += ["", "## Figures", "", *figures]
    failures = [(n, r) for n, r in st.items() if r.get("status") in ("fail", "timeout", "error")]
    for name, res in failures:
        lines += ["", f"## {name}: {res['status']}", ""]
        for nb, r in res.get("notebooks", {}).items():
            if r["status"] != "pass":
                lines.append(f"- {nb}: {r['status']} {r.get('error', '')[:500]}")
        if res.get("tail"):
            lines += ["```", res["tail"][-2500:], "```"]
    return "\n".join(lines) + "\n"


def write_report(report: dict, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "gpu_check.json", out_dir / "gpu_check.md"
    json_path.write_text(json.dumps(report, indent=2, default=str))
    md_path.write_text(render_markdown(report))
    return json_path, md_path


# ---------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", type=Path, default=ROOT / "out" / "gpu_check")
    p.add_argument("--wheels", type=Path, default=ROOT / ".gpu_wheels", help="folder of wheels to install from")
    p.add_argument("--budget-s", type=float, default=480.0, help="wall-clock budget for every stage together")
    p.add_argument("--only", nargs="+", choices=list(STAGES), help="run these stages only")
    p.add_argument("--dry-run", action="store_true", help="no GPU needed: check wheels, plan, write the report")
    p.add_argument("--list-wheels", action="store_true", help="print the distributions the checks need")
    p.add_argument("--stage", choices=list(STAGES), help=argparse.SUPPRESS)
    p.add_argument("--stage-out", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--stage-timeout", type=float, default=60.0, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list_wheels:
        print(" ".join(sorted(set(WHEELS.values()))))
        return 0
    if args.stage:  # child process: one stage, result to --stage-out
        args.stage_out.write_text(json.dumps(STAGE_FNS[args.stage](args.stage_timeout), default=str))
        return 0
    start = time.perf_counter()
    needed = missing_distributions()
    if args.dry_run:
        wheels = check_wheel_folder(args.wheels, needed) | {"status": "dry run"}
    else:
        wheels = install_wheels(args.wheels, needed)
    report = {"environment": environment(), "dry_run": args.dry_run, "budget_s": args.budget_s,
              "wheels": wheels, "stages": {}}
    cuda = report["environment"]["gpu"] is not None
    for name, (share, _) in STAGES.items():
        left = args.budget_s - (time.perf_counter() - start)
        if args.only and name not in args.only:
            report["stages"][name] = {"status": "skipped: not selected"}
        elif args.dry_run or not cuda:
            report["stages"][name] = {"status": "skipped: dry run" if args.dry_run else "skipped: no CUDA device",
                                      "timeout_s": round(min(share * args.budget_s, left))}
        elif left < 20:
            report["stages"][name] = {"status": "skipped: out of time"}
        else:
            print(f"[gpu-check] {name} (up to {min(share * args.budget_s, left):.0f} s)", flush=True)
            report["stages"][name] = run_stage(name, min(share * args.budget_s, left))
            print(f"[gpu-check] {name}: {verdict(name, report['stages'][name])}", flush=True)
    report["seconds"] = time.perf_counter() - start
    json_path, md_path = write_report(report, args.out_dir)
    print(md_path.read_text())
    print(f"[gpu-check] wrote {json_path} and {md_path}")
    if not cuda and not args.dry_run:
        print("[gpu-check] no CUDA device: nothing was checked (use --dry-run to test this script on CPU)")
    bad = [n for n, r in report["stages"].items() if r.get("status") in ("fail", "timeout", "error")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
