"""The notebooks' Colab cell keeps an installed torch and triton exactly as they are (offline, from local wheels).

A fresh venv sees this environment's packages through a .pth file (torch 2.13.0+cpu: older than the newest the
project allows, 2.14.1, which is in the local wheel folder) and gets triton 3.6.0 installed into it (older than
the `[triton]` extra's 3.8.0 pin). The cell, run as in Colab against a local git copy of the student release,
must leave both versions unchanged and the release's self-check must run.
"""
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from autograder.release import release

WHEELS = [Path("/opt/pypi/files"), Path("/opt/pypi-more/files"), Path("/opt/wheels")]
OLD_TRITON = "triton-3.6.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"


def version_of(python: Path, pkg: str) -> str:
    return subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version({pkg!r}))"],
                          capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_colab_cell_keeps_torch_and_triton(tmp_path):
    triton_wheel = next((d / OLD_TRITON for d in WHEELS if (d / OLD_TRITON).exists()), None)
    if triton_wheel is None or sys.version_info[:2] != (3, 11):
        pytest.skip("needs the local triton 3.6.0 cp311 wheel to build the venv offline")
    rel = tmp_path / "release"
    release(rel)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", str(rel)], check=True)
    subprocess.run([*git, "-C", str(rel), "add", "-A"], check=True)
    subprocess.run([*git, "-C", str(rel), "commit", "-qm", "release"], check=True)

    venv = tmp_path / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "course-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # after the venv's own
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(triton_wheel)], check=True)
    # The venv's bundled setuptools predates PEP 660 wheels: build with this environment's (offline, no isolation).
    subprocess.run([str(py), "-m", "pip", "uninstall", "-q", "-y", "setuptools"], check=True)
    before = {p: version_of(py, p) for p in ("torch", "triton")}
    assert before["triton"] == "3.6.0" and before["torch"].startswith("2.13"), before

    cell = json.loads((rel / "notebooks/lesson01/lesson01.ipynb").read_text(encoding="utf-8"))["cells"][0]
    home = tmp_path / "home"
    links = [a for d in WHEELS if d.exists() for a in ("--find-links", str(d))]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(MINIVLLM_COLAB_INSTALL="1", MINIVLLM_RELEASE_URL=str(rel), MINIVLLM_HOME=str(home),
               MINIVLLM_PIP_ARGS=" ".join(["--no-index", "--no-build-isolation", *links]), PIP_NO_INPUT="1")
    proc = subprocess.run([str(py), "-c", "".join(cell["source"])], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert {p: version_of(py, p) for p in ("torch", "triton")} == before
    check = subprocess.run([str(py), "-m", "autograder", "check", "lesson01",
                            str(home / "notebooks/lesson01/lesson01.ipynb")],
                           cwd=tmp_path, env={k: v for k, v in env.items() if not k.startswith("MINIVLLM_")},
                           capture_output=True, text=True, timeout=600)
    assert check.returncode == 1 and "代码 0/4" in check.stdout, check.stdout + check.stderr[-3000:]
    where = subprocess.run([str(py), "-c", "import autograder, minivllm; print(autograder.__file__, minivllm.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, env=env).stdout
    assert str(home) in where, where  # the release's packages, installed editable from the clone
