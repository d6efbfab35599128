"""The instructor's side: a course folder, nbgrader autograde of every submission, a CSV and a table.

Submissions are read from SUBMISSIONS/<student>/<lessonNN>/<lessonNN>.ipynb (nbgrader's collected
layout) or SUBMISSIONS/<student>/<lessonNN>.ipynb.

`grade -j N` runs N workers, one student each (nbgrader autograde against a private copy of the gradebook,
then the sandbox); only the main thread writes the course gradebook, one student at a time.

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


def autograde_one(course: Path, lesson_id: str, student: str) -> tuple[Path, list]:
    """One worker: nbgrader autograde of one student (bounded) against a private copy of the gradebook, then
    the sandbox. Nothing here writes the course gradebook: `merge` does, one student at a time."""
    from autograder.sandbox import grade_file

    db = course / f".gradebook-{lesson_id}-{student}.db"
    shutil.copy(course / "gradebook.db", db)
    try:
        nbgrader(["autograde", lesson_id, "--student", student, "--force", f"--db=sqlite:///{db}"], course,
                 bounded=True)
    except RuntimeError as e:  # e.g. the kernel died when interrupted at the time limit: the sandbox still grades
        print(f"{student}: nbgrader autograde failed; the sandbox's scores stand ({str(e).splitlines()[0][:120]})")
    return db, grade_file(lesson_id, course / "submitted" / student / lesson_id / f"{lesson_id}.ipynb")[0]


def merge(course: Path, lesson_id: str, student: str, db: Path, verdict: list) -> dict[str, str]:
    """Serialized gradebook write: the worker's grades and comments for one student into the course gradebook,
    each code part lowered to the sandbox's score (so none is left pending). Returns the sandbox's message
    for each code part it failed."""
    import warnings

    from nbgrader.api import Gradebook, MissingEntry

    # nbgrader's own update_or_create_submission trips SQLAlchemy autoflush warnings; the rows are written.
    warnings.filterwarnings("ignore", message="Object of type <Submitted")
    failed = {}
    with Gradebook(f"sqlite:///{db}", "minivllm-v1") as wb, \
            Gradebook(f"sqlite:///{course / 'gradebook.db'}", "minivllm-v1") as gb:
        try:
            sub = wb.find_submission(lesson_id, student)
        except MissingEntry:  # nbgrader failed on this student: only the sandbox's scores
            sub = None
        gb.update_or_create_student(student)
        gb.update_or_create_submission(lesson_id, student, **({"timestamp": sub.timestamp} if sub else {}))
        for nb in sub.notebooks if sub else ():
            for g in nb.grades:
                mine = gb.find_grade(g.name, nb.name, lesson_id, student)
                mine.auto_score, mine.manual_score = g.auto_score, g.manual_score
                mine.needs_manual_grade = g.needs_manual_grade
            for c in nb.comments:
                mine = gb.find_comment(c.name, nb.name, lesson_id, student)
                mine.auto_comment, mine.manual_comment = c.auto_comment, c.manual_comment
        grades = {g.name: g for nb in gb.find_submission(lesson_id, student).notebooks for g in nb.grades}
        for r in verdict:
            g = grades.get(r.part.grade_id)
            if r.part.manual or g is None:
                continue
            kernel = g.auto_score if g.manual_score is None else g.manual_score
            g.manual_score = r.score if kernel is None else min(kernel, r.score)
            g.needs_manual_grade = False
            if r.score < r.part.points:
                failed[r.part.grade_id] = r.message
            elif sub is None:
                failed[r.part.grade_id] = "nbgrader 没能运行这份笔记本，本部分按沙箱成绩计"
        gb.db.commit()
    db.unlink()
    return failed


def autograde(course: Path, lesson_id: str, students: list[str], jobs: int = 1) -> dict[str, dict[str, str]]:
    """Every student graded by `jobs` workers (nbgrader + sandbox each); the gradebook is written by this
    thread only, as each student finishes, with a progress bar."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from tqdm import tqdm

    messages: dict[str, dict[str, str]] = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool, \
            tqdm(total=len(students), desc=f"{lesson_id} autograde -j {jobs}", unit="student") as bar:
        futures = {pool.submit(autograde_one, course, lesson_id, s): s for s in students}
        for done in as_completed(futures):
            student = futures[done]
            db, verdict = done.result()
            messages[student] = merge(course, lesson_id, student, db, verdict)
            bar.update(1)
    return messages


def grade(submissions: Path, course: Path, csv_path: Path, lessons: list[str] | None = None, jobs: int = 1) -> dict:
    """Autograde every submission of every lesson found; export nbgrader's CSV plus a per-part CSV."""
    lessons = lessons or discover_lessons()
    prepare_course(course, lessons)
    results, messages = {}, {}
    for lesson_id in lessons:
        students = collect(course, lesson_id, submissions)
        if students:
            messages[lesson_id] = autograde(course, lesson_id, students, jobs)
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
