"""One lesson end to end, in the order a maintainer would run it by hand (instructor side): build, diagnosis,
the reference scored full and the blank release 0 in the sandbox `grade` uses, the student release, the lesson's
tests and its nbgrader flow. Stops at the first step that fails and says which."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autograder.common import NOTEBOOKS, REPO, load_lesson, read_notebook

# the parametrized test files that hold every lesson (selected with -k lessonNN), besides tests/test_lessonNN_*.py
SHARED_TESTS = ("test_lessons.py", "test_autograder.py", "test_mutants.py", "test_diagnosis.py",
                "test_vllm_source.py", "test_lesson_budget.py", "test_grade_cell_verdicts.py")


def _run(*cmd: str, env: dict | None = None) -> None:
    r = subprocess.run([sys.executable, *cmd], cwd=REPO, env={**os.environ, **(env or {})})
    if r.returncode:
        raise SystemExit(f"failed ({r.returncode}): python {' '.join(cmd)}")


def _scores(lesson_id: str, nb: dict) -> dict[str, float]:
    from autograder.sandbox import grade_file

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{lesson_id}.ipynb"
        path.write_text(json.dumps(nb, ensure_ascii=False), encoding="utf-8")
        results, _ = grade_file(lesson_id, path)
    return {r.part.grade_id: r.score for r in results if not r.part.manual}


def _grades(lesson_id: str) -> None:
    from autograder.mutation import filled_notebook

    full = {p.grade_id: p.points for p in load_lesson(lesson_id).parts if not p.manual}
    got = _scores(lesson_id, filled_notebook(lesson_id))
    if got != full:
        raise SystemExit(f"the reference scores {got}, not {full}")
    blank = read_notebook(NOTEBOOKS / lesson_id / f"{lesson_id}.ipynb")
    got = _scores(lesson_id, blank)
    if any(got.values()):
        raise SystemExit(f"the blank release scores {got}, not 0")


def _release(lesson_id: str) -> None:
    from autograder.release import release

    with tempfile.TemporaryDirectory() as tmp:
        written = {p.as_posix() for p in release(Path(tmp) / "release")}
    want = f"notebooks/{lesson_id}/{lesson_id}.ipynb"
    if want not in written or any(f"solutions/{lesson_id}" in p for p in written):
        raise SystemExit(f"the release lacks {want} or ships the solution")


def _tests(lesson_id: str) -> None:
    own = sorted(p.name for p in (REPO / "tests").glob(f"test_{lesson_id}_*.py"))
    shared = [f for f in SHARED_TESTS if (REPO / "tests" / f).is_file()]
    _run("-m", "pytest", "-q", "-p", "no:cacheprovider", *(f"tests/{f}" for f in shared), "-k", lesson_id)
    if own:
        _run("-m", "pytest", "-q", "-p", "no:cacheprovider", *(f"tests/{f}" for f in own))


def _flow(lesson_id: str) -> None:
    """-k matches the module's name too: lesson 1's flow is in its own file, the others' in test_lessons.py."""
    files = ["tests/test_lessons.py", *(f"tests/{p.name}" for p in (REPO / "tests").glob(f"test_{lesson_id}_grading.py"))]
    _run("-m", "pytest", "-q", "-p", "no:cacheprovider", *files, "-k", f"nbgrader_end_to_end and {lesson_id}",
         env={"MINIVLLM_ALL_GRADING_FLOWS": "1"})


def verify(lesson_id: str) -> int:
    load_lesson(lesson_id)  # the declaration's rules first: a missing part fails here, with what to add
    steps = [("build (every lesson: a neighbour's previous/next line names this one)",
              lambda: _run("-m", "autograder", "build")),
             ("diagnosis", lambda: _run("-m", "autograder", "diagnose", "--build", lesson_id)),
             ("reference full, blank 0 (sandbox)", lambda: _grades(lesson_id)),
             ("release", lambda: _release(lesson_id)),
             ("tests", lambda: _tests(lesson_id)),
             ("nbgrader flow", lambda: _flow(lesson_id))]
    for name, step in steps:
        t = time.monotonic()
        print(f"== {lesson_id}: {name}", flush=True)
        step()
        print(f"== {lesson_id}: {name} ok ({time.monotonic() - t:.0f} s)", flush=True)
    return 0
