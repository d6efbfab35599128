"""Install the course into a venv that fits this machine: `python3 install.py` (`make install`) at the top of the
student release.

1. `.venv` (python3 -m venv), unless it exists.
2. torch 2.13.0: the CPU build (`torch==2.13.0+cpu`, from https://download.pytorch.org/whl/cpu) on Linux without a
   CUDA GPU, since PyPI's default Linux x86-64 torch is a CUDA build that pulls ~3 GB of nvidia-* packages; PyPI's
   default build where there is a CUDA GPU (and on macOS and Windows, where it is the CPU build). A local wheel
   (pip's find-links) is tried before the PyTorch index, so an offline mirror needs no network.
3. The course: `pip install -e ".[triton,course]"` with the installed torch pinned as a constraint, so nothing
   swaps it for another build. Then an import check, and `.venv/.installed` is written (last: a re-run after a
   failure repairs).

Settings (environment): MINIVLLM_TORCH=cpu|default overrides the detection; MINIVLLM_PIP_ARGS adds pip arguments.
Stdlib only; ships in the release as install.py (and as autograder/install.py).
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import venv
from pathlib import Path

TORCH = "2.13.0"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
EXTRAS = "triton,course"


def has_cuda_gpu() -> bool:
    """An NVIDIA GPU with a working driver: `nvidia-smi -L` lists one (or /dev/nvidia0 exists)."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
            if out.returncode == 0 and "GPU" in out.stdout:
                return True
        except (OSError, subprocess.TimeoutExpired):
            pass
    return os.path.exists("/dev/nvidia0")


def torch_build() -> str:
    """'cpu' or 'default' (PyPI's): the CPU build only matters on Linux, where PyPI's default is CUDA's."""
    forced = os.environ.get("MINIVLLM_TORCH")
    if forced in ("cpu", "default"):
        return forced
    return "cpu" if platform.system() == "Linux" and not has_cuda_gpu() else "default"


def pip(py: Path, *args: str, check: bool = True) -> bool:
    cmd = [str(py), "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off", *args,
           *os.environ.get("MINIVLLM_PIP_ARGS", "").split()]
    print("+", " ".join(cmd[1:]), flush=True)
    ok = subprocess.run(cmd).returncode == 0
    if check and not ok:
        raise SystemExit(f"pip failed: {' '.join(cmd[3:])} (fix the cause above and run install.py again)")
    return ok


def install(home: Path) -> None:
    home = home.resolve()
    env_dir = home / ".venv"
    py = env_dir / "bin" / "python"
    if not py.exists():
        print(f"[1/4] venv {env_dir}", flush=True)
        venv.create(env_dir, with_pip=True)
    build = torch_build()
    print(f"[2/4] torch {TORCH} ({'CPU build: no CUDA GPU here' if build == 'cpu' else 'default build'})", flush=True)
    if build == "cpu":
        spec = f"torch=={TORCH}+cpu"
        # a local wheel first (pip's find-links); else the PyTorch CPU index, PyPI still serving torch's deps
        if not pip(py, spec, check=False):
            pip(py, spec, "--extra-index-url", CPU_INDEX)
    else:
        pip(py, f"torch=={TORCH}")
    installed = subprocess.run([str(py), "-c", "import torch; print(torch.__version__)"], capture_output=True,
                               text=True, check=True).stdout.strip()
    constraints = env_dir / "torch-constraint.txt"
    constraints.write_text(f"torch=={installed}\n")
    print(f"[3/4] the course: pip install -e .[{EXTRAS}] (torch {installed} kept)", flush=True)
    pip(py, "-c", str(constraints), "-e", f"{home}[{EXTRAS}]")
    print("[4/4] import check", flush=True)
    subprocess.run([str(py), "-c", "import minivllm, autograder.common, torch, nbgrader, jupyterlab"], check=True)
    (env_dir / ".installed").write_text(f"torch {installed}\n")
    print(f"done: {env_dir} (torch {installed}). Next: make lab, or\n"
          f"  JUPYTER_CONFIG_PATH=autograder/jupyter-student .venv/bin/jupyter lab --notebook-dir=notebooks")


def main() -> int:
    if sys.version_info < (3, 10):  # noqa: UP036 (install.py runs under whichever python3 a student has)
        raise SystemExit(f"Python 3.10 or newer is needed (this is {platform.python_version()})")
    here = Path(__file__).resolve().parent  # the release's top (install.py) or its autograder/ (the same file)
    default = here if (here / "pyproject.toml").exists() else here.parent
    install(Path(os.environ.get("MINIVLLM_HOME", default)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
