"""The CPU-side logic of benchmarks/gpu_check.py (`make gpu-check`): wheels, planning, the report.

The GPU stages themselves only run on a CUDA machine; here the dry run must plan every stage and write
both reports, the wheel checks must refuse a folder over 64 MiB or one that lacks a needed wheel, and
the markdown must carry the measured figures with their goals.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)


def test_dry_run_plans_every_stage_and_writes_both_reports(tmp_path):
    rc = gpu_check.main(["--dry-run", "--out-dir", str(tmp_path), "--wheels", str(tmp_path / "none"),
                         "--budget-s", "300"])
    assert rc == 0
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert set(report["stages"]) == set(gpu_check.STAGES)
    assert all(s["status"] == "skipped: dry run" and 0 < s["timeout_s"] <= 300 for s in report["stages"].values())
    md = (tmp_path / "gpu_check.md").read_text()
    assert "DRY RUN" in md and all(f"| {name} |" in md for name in gpu_check.STAGES)


def test_wheel_folder_checks(tmp_path, monkeypatch):
    (tmp_path / "msgspec-0.23.0-cp312-cp312-manylinux_2_28_x86_64.whl").write_bytes(b"x" * 10)
    (tmp_path / "pyzmq-27.3.0-cp312-abi3-manylinux_2_28_x86_64.whl").write_bytes(b"x" * 10)
    info = gpu_check.check_wheel_folder(tmp_path, ["msgspec", "pyzmq", "jupyter-client"])
    assert info["absent"] == ["jupyter-client"] and info["bytes"] == 20 and not info["over_limit"]
    assert gpu_check.install_wheels(tmp_path, ["msgspec", "jupyter-client"])["status"].startswith("missing wheels")
    monkeypatch.setattr(gpu_check, "MAX_WHEELS_BYTES", 15)
    assert gpu_check.install_wheels(tmp_path, ["msgspec"])["status"].startswith("refused")
    assert gpu_check.install_wheels(tmp_path, [])["status"] == "nothing to install"


def test_missing_distributions_reads_import_names():
    assert gpu_check.missing_distributions({"json": "stdlib-json", "no_such_module_xyz": "no-such-dist"}) == \
        ["no-such-dist"]


@pytest.mark.parametrize("frac,speedup,want", [(0.81, 3.1, "meets goal"), (0.42, 1.3, "misses goal")])
def test_report_carries_figures_and_goals(tmp_path, frac, speedup, want):
    report = {
        "environment": {"python": "3.12.3", "torch": "2.11.0", "triton": "3.6.0", "transformers": "5.1",
                        "gpu": "NVIDIA H200"},
        "dry_run": False, "budget_s": 480, "seconds": 301.0,
        "wheels": {"status": "installed", "needed": ["msgspec"], "bytes": 1 << 20, "folder": ".gpu_wheels"},
        "stages": {
            "tests": {"status": "pass", "seconds": 90, "summary": "40 passed"},
            "notebooks": {"status": "fail", "seconds": 60, "notebooks": {
                "solutions/lesson01/lesson01.ipynb": {"status": "pass"},
                "solutions/lesson06/lesson06.ipynb": {"status": "fail", "error": "CellExecutionError: boom"}}},
            "decode_bandwidth": {"status": "measured", "frac_copy": frac, "gbs": 3900.0, "context": 32768,
                                 "batch": 128, "seconds": 20},
            "graph_speedup": {"status": "measured", "speedup_batch1": speedup, "seconds": 30, "batches": {
                "1": {"graph_tok_s": 900.0, "eager_tok_s": 900.0 / speedup, "speedup": speedup}}},
            "throughput": {"status": "measured", "requests": 64, "output_tokens": 8000, "engine_tok_s": 5000.0,
                           "hf_tok_s": 1000.0, "ratio_vs_hf": 5.0, "steps": 300, "share_outside_forward": 0.25},
        }}
    json_path, md_path = gpu_check.write_report(report, tmp_path)
    md = md_path.read_text()
    assert json.loads(json_path.read_text())["stages"]["tests"]["summary"] == "40 passed"
    assert f"| decode_bandwidth | decode kernel bandwidth / device-copy bandwidth at long context | {want} |" in md
    assert f"| graph_speedup | CUDA graph vs eager decode at batch 1/8/64 | {want} |" in md
    assert f"**{100 * frac:.1f}%** of device-copy bandwidth" in md and f"**{speedup:.2f}x** (goal >= 2x)" in md
    assert "**5.00x**" in md and "**25.0%**" in md
    assert "lesson06.ipynb: fail CellExecutionError: boom" in md and "lesson01.ipynb: fail" not in md


def test_no_cuda_skips_every_stage_without_failing(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "environment", lambda: {"python": "3", "torch": None, "triton": None,
                                                           "transformers": None, "gpu": None})
    monkeypatch.setattr(gpu_check, "install_wheels", lambda folder, needed: {"status": "nothing to install"})
    assert gpu_check.main(["--out-dir", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert {s["status"] for s in report["stages"].values()} == {"skipped: no CUDA device"}


# ---------------------------------------------------------------- the stages' code paths, run small on CPU
@pytest.mark.slow
def test_notebook_stage_reports_pass_and_fail(tmp_path):
    import nbformat
    good, bad = tmp_path / "good.ipynb", tmp_path / "bad.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import minivllm\nx = 1")]), good)
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("assert 1 == 2, 'boom'")]), bad)
    res = gpu_check.stage_notebooks(120, [good, bad])
    assert res["status"] == "fail"
    assert res["notebooks"][str(good)]["status"] == "pass"
    assert res["notebooks"][str(bad)]["status"] == "fail" and "boom" in res["notebooks"][str(bad)]["error"]


@pytest.mark.slow
def test_measurement_stages_run_on_cpu():
    """Tiny sizes on CPU: the same code as on the GPU, with the eager replay standing in for graphs."""
    gs = gpu_check.stage_graph_speedup(60, device="cpu", batches=(1, 3), decode_tokens=4, pairs=1)
    assert set(gs["batches"]) == {1, 3} and gs["speedup_batch1"] > 0
    tp = gpu_check.stage_throughput(60, device="cpu", n=4, lo=4, hi=8)
    assert tp["output_tokens"] >= 16 and tp["engine_tok_s"] > 0 and tp["hf_tok_s"] > 0
    assert 0 < tp["share_outside_forward"] < 1


@pytest.mark.skipif(__import__("os").environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter")
def test_bandwidth_stage_runs_under_the_interpreter():
    bw = gpu_check.stage_decode_bandwidth(60, device="cpu", argv=[
        "--batch-sizes", "2", "--context-lens", "40", "--num-heads", "4", "--num-kv-heads", "2",
        "--head-size", "64", "--dtype", "float32", "--copy-mib", "16"])
    assert bw["context"] == 40 and bw["max_err"] < 1e-4 and bw["frac_copy"] > 0
