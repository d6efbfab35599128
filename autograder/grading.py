"""The instructor's side: a course folder, nbgrader autograde of every submission, a CSV and a table.

Submissions are read from SUBMISSIONS/<student>/<lessonNN>/<lessonNN>.ipynb (nbgrader's collected
layout) or SUBMISSIONS/<student>/<lessonNN>.ipynb.

A code part's final score is the lower of nbgrader's (the grade cell in the student's kernel, bounded by
autograder/limits.py) and the sandbox's (autograder/sandbox.py: only the answer definitions, checks out of the
student's reach). It is written into the gradebook as the part's manual score, so a deleted or stripped grade
cell is scored, never left pending, and the export, feedback and formgrader all show the final score.
"""
from __future__ import annotations

import csv
import shutil
from pathlib import Path

from autograder.build import dumps, nbgrader, new_course, solution_notebook
from autograder.common import discover_lessons, load_lesson


def find_submissions(submissions: Path, lesson_id: str) -> dict[str, Path]:
    found = {}
    for student in sorted(p for p in submissions.iterdir() if p.is_dir()):
        for cand in (student / lesson_id / f"{lesson_id}.ipynb", student / f"{lesson_id}.ipynb"):
            if cand.exists():
                found[student.name] = cand
                break
    return found


def prepare_course(course: Path, lessons: list[str]) -> Path:
    """A course folder with the lessons' source notebooks released into its gradebook."""
    new_course(course)
    for lesson_id in lessons:
        src = course / "source" / lesson_id
        src.mkdir(parents=True, exist_ok=True)
        (src / f"{lesson_id}.ipynb").write_text(dumps(solution_notebook(lesson_id)), encoding="utf-8")
        nbgrader(["generate_assignment", lesson_id, "--force"], course)
    return course


def collect(course: Path, lesson_id: str, submissions: Path) -> list[str]:
    students = []
    for student, path in find_submissions(submissions, lesson_id).items():
        dest = course / "submitted" / student / lesson_id
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, dest / f"{lesson_id}.ipynb")
        students.append(student)
    return students


def scores(course: Path, lesson_id: str) -> dict[str, dict[str, float | None]]:
    """student -> {grade_id: score (None while a manual grade is pending)} from the gradebook."""
    from nbgrader.api import Gradebook, MissingEntry

    out = {}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", "minivllm-v1") as gb:
        for student in sorted(s.id for s in gb.students):
            try:
                nb = gb.find_submission_notebook(lesson_id, lesson_id, student)
            except MissingEntry:
                continue
            out[student] = {g.name: (None if g.needs_manual_grade else g.score) for g in nb.grades}
    return out


def table(lesson_id: str, results: dict[str, dict[str, float | None]]) -> str:
    lesson = load_lesson(lesson_id)
    head = ["student"] + [p.grade_id.split("_", 1)[-1] for p in lesson.parts]
    rows = [head + ["code", "pending", "verdict"]]
    for student, got in results.items():
        code = sum(got.get(p.grade_id) or 0 for p in lesson.parts if not p.manual)
        pending = sum(p.points for p in lesson.parts if got.get(p.grade_id) is None)
        done = sum(v or 0 for v in got.values())
        verdict = "FAIL" if done + pending < lesson.pass_mark else ("PASS" if pending == 0 and done >= lesson.pass_mark
                                                                    else "pending")
        code_max = sum(p.points for p in lesson.parts if not p.manual)
        cells = ["-" if got.get(p.grade_id) is None else f"{got[p.grade_id]:g}" for p in lesson.parts]
        rows.append([student, *cells, f"{code:g}/{code_max}", str(pending), verdict])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head) + 3)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def sandbox_regrade(course: Path, lesson_id: str, students: list[str]) -> dict[str, dict[str, str]]:
    """Score every student's code parts in the sandbox; keep the lower score in the gradebook.
    Returns student -> {grade_id: the sandbox's one-line message} for the parts it failed."""
    from nbgrader.api import Gradebook, MissingEntry

    from autograder.sandbox import grade_file

    messages: dict[str, dict[str, str]] = {}
    verdicts = {s: grade_file(lesson_id, course / "submitted" / s / lesson_id / f"{lesson_id}.ipynb")[0]
                for s in students}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", "minivllm-v1") as gb:
        for student, results in verdicts.items():
            messages[student] = {}
            for r in results:
                if r.part.manual:
                    continue
                try:
                    g = gb.find_grade(r.part.grade_id, lesson_id, lesson_id, student)
                except MissingEntry:
                    continue
                kernel = g.auto_score if g.manual_score is None else g.manual_score
                g.manual_score = r.score if kernel is None else min(kernel, r.score)
                g.needs_manual_grade = False
                if r.score < r.part.points:
                    messages[student][r.part.grade_id] = r.message
            gb.db.commit()
    return messages


def grade(submissions: Path, course: Path, csv_path: Path, lessons: list[str] | None = None) -> dict:
    """Autograde every submission of every lesson found; export nbgrader's CSV plus a per-part CSV."""
    lessons = lessons or discover_lessons()
    prepare_course(course, lessons)
    results, messages = {}, {}
    for lesson_id in lessons:
        students = collect(course, lesson_id, submissions)
        if students:
            nbgrader(["autograde", lesson_id, "--force"], course, bounded=True)
            messages[lesson_id] = sandbox_regrade(course, lesson_id, students)
            results[lesson_id] = scores(course, lesson_id)
    nbgrader(["export", "--to", str(csv_path.resolve())], course)
    parts_csv = csv_path.with_name(csv_path.stem + "-parts.csv")
    with open(parts_csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["lesson", "student", "grade_id", "score", "max_score", "message"])
        for lesson_id, per_student in results.items():
            lesson = load_lesson(lesson_id)
            for student, got in per_student.items():
                for p in lesson.parts:
                    s = got.get(p.grade_id)
                    w.writerow([lesson_id, student, p.grade_id, "" if s is None else f"{s:g}", p.points,
                                messages[lesson_id].get(student, {}).get(p.grade_id, "")])
    for lesson_id, per_student in results.items():
        print(f"== {lesson_id} ==\n{table(lesson_id, per_student)}")
        for student, failed in messages[lesson_id].items():
            for gid, msg in failed.items():
                print(f"  {student} {gid}: {msg}")
    print(f"CSV: {csv_path} (nbgrader export), {parts_csv} (per part); course folder: {course}")
    return results


def feedback(course: Path, lessons: list[str] | None = None) -> list[Path]:
    """nbgrader's HTML feedback for every autograded submission in the course folder."""
    out = []
    for lesson_id in lessons or discover_lessons():
        if (course / "autograded").exists() and any((course / "autograded").glob(f"*/{lesson_id}")):
            nbgrader(["generate_feedback", lesson_id, "--force"], course)
            out += sorted((course / "feedback").glob(f"*/{lesson_id}/*.html"))
    for p in out:
        print(p)
    return out
