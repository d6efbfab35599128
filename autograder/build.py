"""Build the course notebooks: solutions/lessonNN/lessonNN.py (jupytext percent) -> the solution .ipynb ->
notebooks/lessonNN/lessonNN.ipynb through `nbgrader generate_assignment`.

Output is deterministic: no outputs, execution counts, timestamps or machine paths; cell ids are stable
(the nbgrader grade_id, else the lesson id and the cell's index).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

from autograder.common import REPO, discover_lessons

KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
CONFIG = Path(__file__).resolve().parent / "nbgrader_config.py"
_KEEP_CELL_META = ("nbgrader", "tags", "deletable", "editable")


def normalize(nb: nbformat.NotebookNode, lesson_id: str) -> nbformat.NotebookNode:
    """Strip everything a run or a machine adds; give every cell a stable id."""
    nb.nbformat, nb.nbformat_minor = 4, 5
    nb.metadata = nbformat.NotebookNode(kernelspec=dict(KERNELSPEC), language_info={"name": "python"})
    for i, cell in enumerate(nb.cells):
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        cell.id = grade_id or f"{lesson_id}-{i:03d}"
        cell.metadata = nbformat.NotebookNode({k: v for k, v in cell.metadata.items() if k in _KEEP_CELL_META})
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        cell.pop("attachments", None)
    return nb


def dumps(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb, version=4).rstrip("\n") + "\n"


def nbgrader(args: list[str], course: Path, bounded: bool = False) -> subprocess.CompletedProcess:
    """Run one nbgrader command in a course folder; raise with its log when it fails. bounded=True caps the
    memory of nbgrader and every kernel it starts (autograder/limits.py)."""
    from autograder.limits import limit_memory

    # nbgrader runs `alembic` and the kernel from PATH: put this interpreter's bin/ first (an unactivated venv).
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if bounded:
        env["MINIVLLM_GRADING"] = "1"  # the notebook's per-part report cell stays quiet while graded
    proc = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, capture_output=True, text=True,
                          env=env, preexec_fn=limit_memory if bounded else None)
    if proc.returncode != 0:
        raise RuntimeError(f"nbgrader {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def new_course(course: Path) -> Path:
    course.mkdir(parents=True, exist_ok=True)
    shutil.copy(CONFIG, course / "nbgrader_config.py")
    (course / "exchange").mkdir(exist_ok=True)
    return course


def solution_notebook(lesson_id: str, root: Path = REPO) -> nbformat.NotebookNode:
    import jupytext

    nb = jupytext.read(root / "solutions" / lesson_id / f"{lesson_id}.py", fmt="py:percent")
    return normalize(nb, lesson_id)


def release_notebook(lesson_id: str, solution: nbformat.NotebookNode) -> nbformat.NotebookNode:
    with tempfile.TemporaryDirectory(prefix="minivllm-build-") as tmp:
        course = new_course(Path(tmp))
        src = course / "source" / lesson_id
        src.mkdir(parents=True)
        (src / f"{lesson_id}.ipynb").write_text(dumps(solution), encoding="utf-8")
        nbgrader(["generate_assignment", lesson_id, "--force"], course)
        release = nbformat.read(course / "release" / lesson_id / f"{lesson_id}.ipynb", as_version=4)
    return normalize(release, lesson_id)


def build_files(root: Path = REPO, lessons: list[str] | None = None) -> dict[Path, str]:
    """Every generated file (path relative to root -> text)."""
    files = {}
    for lesson_id in lessons or discover_lessons(root):
        sol = solution_notebook(lesson_id, root)
        files[Path("solutions", lesson_id, f"{lesson_id}.ipynb")] = dumps(sol)
        files[Path("notebooks", lesson_id, f"{lesson_id}.ipynb")] = dumps(release_notebook(lesson_id, sol))
    return files


def build(root: Path = REPO, check: bool = False, lessons: list[str] | None = None) -> list[Path]:
    """Write the generated files, or with check=True only list the ones that differ from a fresh build."""
    stale = []
    for rel, text in build_files(root, lessons).items():
        path = root / rel
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            stale.append(rel)
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
    return stale
