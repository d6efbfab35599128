"""The nbgrader end-to-end flow every lesson's grading test has: release, three students, autograde.

A solution student (the answers from solutions/), a blank student (the release as is) and a mutant
student (one answer cell replaced by a wrong version) are collected and graded by autograder.grading.

The flow is the same code for every lesson and costs minutes per lesson (three notebook executions in
nbgrader, then the sandbox), so `make test` runs it once, for FLOW_LESSON; what differs per lesson is
covered there by cheaper tests (grade-cell metadata, the solution notebook run, the release self-check,
every mutant in the sandbox). `make test-grading` (MINIVLLM_ALL_GRADING_FLOWS=1) runs every lesson's flow.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from autograder.common import REPO

FLOW_LESSON = "lesson01"


def solution_cells(lesson: str) -> dict[str, str]:
    """Cell id -> source of the instructor's notebook, with the ### BLANK markers removed."""
    nb = json.loads((REPO / f"solutions/{lesson}/{lesson}.ipynb").read_text(encoding="utf-8"))
    return {c["id"]: "".join(c["source"]).replace("  ### BLANK", "") for c in nb["cells"]}


def code_scores(lesson_id: str, nb: dict, tmp_path: Path, messages: dict | None = None) -> dict[str, float]:
    """Code points per part of notebook `nb`, graded in this process (its setup and answer cells, then the checks);
    each part's verdict message goes into `messages` when given."""
    from autograder.common import grade_namespace, load_lesson, student_namespace

    path = tmp_path / f"{lesson_id}.ipynb"
    path.write_text(json.dumps(nb, ensure_ascii=False), encoding="utf-8")
    ns, errors = student_namespace(path)
    assert not errors, errors
    results = [r for r in grade_namespace(load_lesson(lesson_id), ns) if not r.part.manual]
    if messages is not None:
        messages.update({r.part.grade_id: r.message for r in results})
    return {r.part.grade_id: r.score for r in results}


def namespace_scores(lesson_id: str, namespace: dict, parts: tuple[str, ...] | None = None) -> dict[str, float]:
    """Code points per part of a namespace graded in this process: every code part as grade_namespace runs them,
    or only `parts`, each on its own (run_part)."""
    from autograder.common import grade_namespace, load_lesson, run_part

    lesson = load_lesson(lesson_id)
    if parts is None:
        return {r.part.grade_id: r.score for r in grade_namespace(lesson, namespace) if not r.part.manual}
    return {p.grade_id: run_part(p, namespace).score for p in lesson.parts if p.grade_id in parts}


def notebook_part_scores(lesson_id: str, nb) -> dict[str, float]:
    """Code points per part of an executed notebook (tests/conftest.py's executed_solution), scored as nbgrader
    scores a grade cell: its points when it ran without an error or stderr output, else 0."""
    from autograder.common import load_lesson

    points = {p.grade_id: p.points for p in load_lesson(lesson_id).parts if not p.manual}
    got = {}
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in points and cell.cell_type == "code":
            bad = [o for o in cell.get("outputs", []) if o.output_type == "error"
                   or (o.output_type == "stream" and o.name == "stderr")]
            got[gid] = points[gid] if cell.get("execution_count") and not bad else 0
    return got


def make_submission(root: Path, lesson: str, student: str, replace: dict[str, str]) -> Path:
    """The student release with the given cells replaced, in nbgrader's collected layout."""
    nb = json.loads((REPO / f"notebooks/{lesson}/{lesson}.ipynb").read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["id"] in replace:
            cell["source"] = replace[cell["id"]]
    dest = root / student / lesson
    dest.mkdir(parents=True)
    path = dest / f"{lesson}.ipynb"
    path.write_text(json.dumps(nb, ensure_ascii=False), encoding="utf-8")
    return path


def grade_three_students(tmp_path: Path, lesson: str, answer_ids: tuple[str, ...], mutant_cell: str,
                         mutant_source: str, jobs: int = 1) -> tuple[Path, dict, Path]:
    """Grade solution/blank/mutant students (the first two with a written Q1); returns (submissions folder,
    points per part, CSV path)."""
    if lesson != FLOW_LESSON and not os.environ.get("MINIVLLM_ALL_GRADING_FLOWS"):
        pytest.skip(f"the nbgrader flow runs once per `make test` ({FLOW_LESSON}); "
                    "`make test-grading` runs it for every lesson")
    from autograder.common import load_lesson
    from autograder.grading import grade

    sol = solution_cells(lesson)
    answers = {k: sol[k] for k in answer_ids}
    # Q1 written (pending until an instructor grades it), Q2 and Q3 untouched (nbgrader scores those 0)
    answers[next(p.grade_id for p in load_lesson(lesson).parts if p.manual)] = "（学生写下的回答）"
    subs = tmp_path / "submissions"
    make_submission(subs, lesson, "solution_student", answers)
    make_submission(subs, lesson, "blank_student", {})
    make_submission(subs, lesson, "mutant_student", dict(answers, **{mutant_cell: mutant_source}))
    csv_path = tmp_path / "grades.csv"
    results = grade(subs, tmp_path / "course", csv_path, [lesson], jobs=jobs)[lesson]
    assert not list((tmp_path / "course").glob(".gradebook-*.db"))  # every worker's gradebook was merged
    return subs, results, csv_path
