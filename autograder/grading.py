"""The instructor's side: a course folder, nbgrader autograde of every submission, a CSV and a table.

Submissions are read from SUBMISSIONS/<student>/<lessonNN>/<lessonNN>.ipynb (nbgrader's collected
layout) or SUBMISSIONS/<student>/<lessonNN>.ipynb.

`grade -j N` runs N workers, one student each (nbgrader autograde against a gradebook that holds only the
lesson's cells, without mark schemes or hidden tests, then the sandbox); only the main thread writes the course
gradebook, one student at a time, into a staged copy swapped in when the whole run is done (`staged_gradebook`).
A submission that cannot be graded at all (not a notebook, a worker's error) scores 0 for its lesson with one line
naming the student and the cause (`student_failure`); the class goes on.

A code part's final score is the lower of nbgrader's (the grade cell in the student's kernel, bounded by
autograder/limits.py) and the sandbox's (autograder/sandbox.py: only the answer definitions, checks out of the
student's reach). It is written into the gradebook as the part's manual score, so a deleted or stripped grade
cell is scored, never left pending, and the export, feedback and formgrader all show the final score.
"""
from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

from autograder import isolation
from autograder.build import dumps, nbgrader, nbgrader_env, new_course, solution_notebook
from autograder.common import cell_source, discover_lessons, load_lesson, nbgrader_meta, read_notebook
from autograder.diagnosis import label
from autograder.limits import cell_timeout

COURSE_ID = "minivllm-v1"  # autograder/nbgrader_config.py's CourseDirectory.course_id
GRADEBOOK = "gradebook.db"
NO_ANSWER = "未作答（no answer）：这个答案单元格和发下去时一样"
NOTEBOOK_TIMEOUT_FACTOR = 3  # a whole notebook under nbgrader: at most this many cell limits
# (phase, seconds) per student and phase, appended by autograde_one/autograde (list.append is thread-safe):
# where a class's time goes, for benchmarks/grade_parallel.py. Timing only; no verdict reads it.
PHASES: list[tuple[str, float]] = []


_staged: dict[Path, Path] = {}  # course -> the gradebook its running `grade` writes; staged_gradebook alone sets it


def gradebook_db(course: Path) -> Path:
    """The course gradebook every read and write of this module goes to: while `grade` runs, its staged copy."""
    return _staged.get(course, course / GRADEBOOK)


def _copy_db(src: Path, dest: Path) -> None:
    """A consistent copy of a SQLite file, even while formgrader has it open (SQLite's online backup)."""
    with contextlib.closing(sqlite3.connect(src)) as a, contextlib.closing(sqlite3.connect(dest)) as b:
        a.backup(b)


@contextlib.contextmanager
def staged_gradebook(course: Path):
    """A run's gradebook writes go to a copy of the course gradebook, put in its place (os.replace: atomic) only
    when the run is done: a run that stops on the way (a refused canary, a changed grader, Ctrl-C, a kill) leaves
    the course gradebook as it was, never half graded. Manual grades entered in formgrader while `grade` runs
    are overwritten by the swap: grade Q1-Q3 after it."""
    live, staged = course / GRADEBOOK, course / ".gradebook-staged.db"
    course.mkdir(parents=True, exist_ok=True)
    staged.unlink(missing_ok=True)
    if live.is_file():
        _copy_db(live, staged)
    _staged[course] = staged
    try:
        yield staged
        os.replace(staged, live)
    finally:
        _staged.pop(course, None)
        staged.unlink(missing_ok=True)


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
        nbgrader(["generate_assignment", lesson_id, "--force", f"--db=sqlite:///{gradebook_db(course)}"], course)
    return course


def kernel_gradebook(course: Path, lesson_id: str) -> Path:
    """The gradebook nbgrader's autograde gets inside a student's run, where the student's code can read it: this
    lesson only, every mark scheme and hidden test cleared by nbgrader's own ClearMarkScheme and ClearHiddenTests
    (a cleared cell's checksum recomputed, so OverwriteCells still restores a tampered locked cell), and no
    student, score or comment. The kernel runs each grade cell's visible asserts; the hidden checks run in the
    sandbox, out of the student's reach, and the lower score counts. A copy of the course gradebook (its schema and
    alembic stamp) with the rest deleted and then VACUUMed, so no deleted text stays in SQLite's free pages;
    replaced atomically, so workers may share it."""
    from nbformat import NotebookNode
    from nbgrader.api import Gradebook
    from nbgrader.preprocessors import ClearHiddenTests, ClearMarkScheme
    from nbgrader.utils import compute_checksum

    out = course / f".kernel-gradebook-{lesson_id}.db"
    tmp = out.with_name(f"{out.name}.{os.getpid()}-{threading.get_ident()}")
    _copy_db(gradebook_db(course), tmp)
    clear = (ClearHiddenTests(enforce_metadata=False), ClearMarkScheme(enforce_metadata=False))
    with Gradebook(f"sqlite:///{tmp}", COURSE_ID) as kb:
        for student in [s.id for s in kb.students]:
            kb.remove_student(student)
        for other in [a.name for a in kb.assignments if a.name != lesson_id]:
            kb.remove_assignment(other)
        for nb in kb.find_assignment(lesson_id).notebooks:
            graded = {c.name: c.max_score for c in nb.grade_cells}
            solutions, tasks = {c.name for c in nb.solution_cells}, {c.name for c in nb.task_cells}
            for c in nb.source_cells:
                meta = {"grade": c.name in graded, "solution": c.name in solutions, "task": c.name in tasks,
                        "locked": c.locked, "grade_id": c.name, "points": graded.get(c.name, 0)}
                cell = NotebookNode(cell_type=c.cell_type, source=c.source, metadata=NotebookNode(nbgrader=meta))
                for pp in clear:
                    cell, _ = pp.preprocess_cell(cell, {}, 0)
                if cell.source != c.source:
                    c.source, c.checksum = cell.source, compute_checksum(cell)
        kb.db.commit()
    with contextlib.closing(sqlite3.connect(tmp)) as con:
        con.execute("VACUUM")
    os.replace(tmp, out)
    return out


def collect(course: Path, lesson_id: str, submissions: Path) -> list[str]:
    """Each student's notebook into the course's submitted/ folder, with its time (nbgrader's timestamp.txt where
    the collected layout has one, else the file's own mtime, kept by copy2) for `submission_time`."""
    students = []
    for student, path in find_submissions(submissions, lesson_id).items():
        dest = course / "submitted" / student / lesson_id
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        shutil.copy2(path, dest / f"{lesson_id}.ipynb")
        if (path.parent / "timestamp.txt").is_file() and path.parent.name == lesson_id:
            shutil.copy2(path.parent / "timestamp.txt", dest / "timestamp.txt")
        students.append(student)
    return students


def submission_time(course: Path, lesson_id: str, student: str):
    """When the student handed the lesson in (naive UTC, as nbgrader stores it), read on the grader's side: the
    worker's gradebook went through the student's kernel."""
    from datetime import datetime, timezone

    from nbgrader.utils import parse_utc

    folder = course / "submitted" / student / lesson_id
    with contextlib.suppress(OSError, ValueError):
        return parse_utc((folder / "timestamp.txt").read_text(encoding="utf-8").strip())
    with contextlib.suppress(OSError):
        return datetime.fromtimestamp((folder / f"{lesson_id}.ipynb").stat().st_mtime, timezone.utc).replace(tzinfo=None)
    return None


def scores(course: Path, lesson_id: str) -> dict[str, dict[str, float | None]]:
    """student -> {grade_id: score (None while a manual grade is pending)} from the gradebook."""
    from nbgrader.api import Gradebook, MissingEntry

    out = {}
    if not gradebook_db(course).is_file():  # no run has completed here (opening it would create one)
        return out
    with Gradebook(f"sqlite:///{gradebook_db(course)}", COURSE_ID) as gb:
        for student in sorted(s.id for s in gb.students):
            try:
                nb = gb.find_submission_notebook(lesson_id, lesson_id, student)
            except MissingEntry:
                continue
            out[student] = {g.name: (None if g.needs_manual_grade else g.score) for g in nb.grades}
    return out


def unanswered(course: Path, lesson_id: str) -> dict[str, set[str]]:
    """student -> the written answers (grade_ids) left as released, as `merge` marked them (NO_ANSWER)."""
    from nbgrader.api import Gradebook

    manual = {p.grade_id for p in load_lesson(lesson_id).parts if p.manual}
    out: dict[str, set[str]] = {}
    with Gradebook(f"sqlite:///{gradebook_db(course)}", COURSE_ID) as gb:
        for sub in gb.find_assignment(lesson_id).submissions:
            for nb in sub.notebooks:
                for c in nb.comments:
                    if c.name in manual and c.manual_comment is None and c.auto_comment == NO_ANSWER:
                        out.setdefault(sub.student.id, set()).add(c.name)
    return out


def table(lesson_id: str, results: dict[str, dict[str, float | None]],
          blank: dict[str, set[str]] | None = None) -> str:
    """The terminal table; a written answer in `blank` (left as released) reads "no answer", and so does the
    verdict of a student who has not passed with one."""
    lesson = load_lesson(lesson_id)
    blank = blank or {}
    head = ["student"] + [p.grade_id.split("_", 1)[-1] for p in lesson.parts]
    rows = [head + ["code", "pending", "verdict"]]
    for student, got in results.items():
        code = sum(got.get(p.grade_id) or 0 for p in lesson.parts if not p.manual)
        pending = sum(p.points for p in lesson.parts if got.get(p.grade_id) is None)
        done = sum(v or 0 for v in got.values())
        verdict = "FAIL" if done + pending < lesson.pass_mark else ("PASS" if pending == 0 and done >= lesson.pass_mark
                                                                    else "pending")
        code_max = sum(p.points for p in lesson.parts if not p.manual)
        if blank.get(student) and verdict != "PASS":
            verdict = "no answer"
        cells = ["no answer" if p.grade_id in blank.get(student, ()) else "-" if got.get(p.grade_id) is None
                 else f"{got[p.grade_id]:g}" for p in lesson.parts]
        rows.append([student, *cells, f"{code:g}/{code_max}", str(pending), verdict])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head) + 3)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def _nbgrader_autograde(work: Path, lesson_id: str, student: str, log) -> subprocess.Popen:
    """nbgrader autograde of one student in its private course folder `work`, started isolated and bounded."""
    env = nbgrader_env(grading=True)
    argv = [sys.executable, "-m", "nbgrader", "autograde", lesson_id, "--student", student, "--force",
            f"--db=sqlite:///{work / 'gradebook.db'}"]
    return subprocess.Popen(isolation.wrap(argv, work.parent, cwd=work), cwd=work, env=env, stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=isolation.limit_run,
                            start_new_session=True)


def unreadable(nb_path: Path) -> str:
    """Why a submission is no notebook the grader can read (not UTF-8 JSON, no list of cells with sources), or ""."""
    try:
        nb = json.loads(Path(nb_path).read_text(encoding="utf-8"))
        cells = nb["cells"]
        if not isinstance(cells, list) or not all(isinstance(c, dict) and isinstance(c.get("source", ""), (str, list))
                                                  for c in cells):
            raise ValueError("'cells' is not a list of cells")
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"提交的笔记本无法读取（{type(e).__name__}: {str(e)[:200]}），本课按 0 分计；请学生重新提交完整的 .ipynb"
    return ""


def student_failure(course: Path, lesson_id: str, student: str, cause: str | Exception) -> tuple[Path, list, str]:
    """In place of a worker's result for a submission that could not be graded at all (not a notebook; an
    exception of its worker, e.g. `autograde_one` on it): every part of the lesson 0 with `cause`, printed as one
    line naming the student; `merge` writes it as any verdict and the class goes on. An earlier run's graded copy
    and feedback page are removed, so no page shows stale work."""
    from autograder.common import PartResult

    if isinstance(cause, Exception):
        cause = f"评分这份提交时出错（{type(cause).__name__}: {str(cause)[:200]}），本课按 0 分计"
    for stale in ("autograded", "feedback"):
        shutil.rmtree(course / stale / student / lesson_id, ignore_errors=True)
    print(f"{student} {lesson_id}: {cause}", flush=True)
    verdict = [PartResult(p, 0, cause) for p in load_lesson(lesson_id).parts]
    return course / f".gradebook-{lesson_id}-{student}.db", verdict, cause


def no_answers(lesson_id: str, nb_path: Path, verdict: list) -> list:
    """The verdict with each manual part whose answer cell is left as released (or missing) scored 0, NO_ANSWER,
    read from the submission itself: the same whether nbgrader's run reached the end or was stopped."""
    from autograder.common import PartResult
    from autograder.sandbox import release_cells, submitted_sources

    release = {c["id"]: cell_source(c).strip() for c in release_cells(lesson_id)}
    manual = [r.part.grade_id for r in verdict if r.part.manual and r.score is None and r.part.grade_id in release]
    written = submitted_sources(nb_path, manual, cell_type=None)
    blank = {gid for gid in manual if written.get(gid, "").strip() in ("", release[gid])}
    return [PartResult(r.part, 0, NO_ANSWER) if r.part.grade_id in blank else r for r in verdict]


def autograde_one(course: Path, lesson_id: str, student: str) -> tuple[Path, list, str]:
    """One worker: nbgrader autograde of one student and the sandbox, side by side, each where the student's
    code cannot reach the course folder, the grader or anyone else's files (autograder/isolation.py).

    nbgrader works in a private course folder holding the config, `kernel_gradebook` (no mark scheme, hidden test,
    other student or score) and this one submission; of what it leaves, only the graded notebook is copied out
    and the gradebook is trusted no further than `merge` says. When the sandbox finds an answer that hangs,
    nbgrader's run (stuck in the same answer) is stopped at once: a looping answer costs one cell limit in all,
    not one in each. A submission that is no readable notebook is not run: `student_failure`. Nothing here writes
    the course gradebook: `merge` does, one student at a time. Returns (gradebook copy, verdict, note)."""
    from autograder.sandbox import grade_file

    submitted = course / "submitted" / student / lesson_id / f"{lesson_id}.ipynb"
    broken = unreadable(submitted)
    if broken:
        return student_failure(course, lesson_id, student, broken)
    db = course / f".gradebook-{lesson_id}-{student}.db"
    kernel_db = course / f".kernel-gradebook-{lesson_id}.db"
    if not kernel_db.is_file():
        kernel_gradebook(course, lesson_id)
    note = ""
    with isolation.scratch_dir("minivllm-grade-") as scratch, tempfile.TemporaryFile() as log:
        work = scratch / "course"
        sub = work / "submitted" / student / lesson_id
        sub.mkdir(parents=True)
        shutil.copy(course / "nbgrader_config.py", work / "nbgrader_config.py")
        shutil.copyfile(kernel_db, work / GRADEBOOK)
        shutil.copy(submitted, sub / f"{lesson_id}.ipynb")
        isolation.give(work)
        started, wall = time.perf_counter(), time.time()
        proc = _nbgrader_autograde(work, lesson_id, student, log)
        try:
            verdict = no_answers(lesson_id, submitted, grade_file(lesson_id, submitted)[0])
        except BaseException:  # GraderBroken (the grader, not this student) or an interrupt: the run stops here
            isolation.kill(proc)
            raise
        PHASES.append(("sandbox re-grade", time.perf_counter() - started))
        if proc.poll() is None and any(r.message.startswith("超时") for r in verdict):
            isolation.kill(proc)
            note = "nbgrader 的运行已停止：答案在沙箱中已超时（同一答案只计一次时限），代码部分按沙箱成绩计"
        else:
            try:
                proc.wait(timeout=NOTEBOOK_TIMEOUT_FACTOR * cell_timeout())
            except subprocess.TimeoutExpired:
                isolation.kill(proc)
                note = f"nbgrader 运行整本笔记本超过 {NOTEBOOK_TIMEOUT_FACTOR * cell_timeout():g} s，已停止"
        if proc.returncode != 0 and not note:
            log.seek(0)
            tail = log.read()[-2000:].decode("utf-8", "replace").strip().splitlines()
            note = f"nbgrader autograde failed ({(tail or [''])[-1][:120]})"
        # nbgrader's own run: to its last gradebook write (it may have ended while the sandbox still ran)
        elapsed, wdb = time.perf_counter() - started, work / GRADEBOOK
        written = wdb.lstat().st_mtime - wall if wdb.is_file() and not wdb.is_symlink() else 0.0
        PHASES.append(("nbgrader execution", written if 0 < written < elapsed else elapsed))
        graded = course / "autograded" / student / lesson_id
        shutil.rmtree(graded, ignore_errors=True)  # an earlier run's copy, and anything written beside it
        isolation.copy_out(work / "autograded" / student / lesson_id / f"{lesson_id}.ipynb",
                           graded / f"{lesson_id}.ipynb")
        db.unlink(missing_ok=True)
        isolation.copy_out(wdb, db)
    if note and student != CANARY:
        print(f"{student}: {note}" + ("; the sandbox's scores stand" if note.startswith("nbgrader autograde") else ""))
    return db, verdict, note


def answer_cells(lesson_id: str) -> dict[str, str]:
    """grade_id of each part -> the answer cell whose comment carries its reasons: for a code part the last answer
    (solution) cell above its grade cell in the release, for a written answer the answer cell itself."""
    from autograder.sandbox import release_cells

    out, last = {}, None
    for c in release_cells(lesson_id):
        meta = nbgrader_meta(c)
        if meta.get("solution"):
            last = c["id"] if c["cell_type"] == "code" else last
        if meta.get("grade"):
            out[meta["grade_id"]] = c["id"] if meta.get("solution") else (last or c["id"])
    return out


def show_mark_schemes(course: Path, lesson_id: str, student: str, gb) -> None:
    """nbgrader's run saw no mark schemes (`kernel_gradebook`): put the course gradebook's locked text cells
    (questions with their mark schemes, never executed) back into the graded notebook, where formgrader shows them
    to the instructor; nbgrader's feedback clears them again (ClearMarkScheme)."""
    import nbformat

    path = course / "autograded" / student / lesson_id / f"{lesson_id}.ipynb"
    if not path.is_file():
        return
    text = {c.name: c.source for c in gb.find_notebook(lesson_id, lesson_id).source_cells
            if c.locked and c.cell_type == "markdown"}
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception:  # noqa: BLE001  (written by the student's run: a page it broke is left as it is)
        return
    for cell in nb.cells:
        gid = nbgrader_meta(cell).get("grade_id")
        if cell.get("cell_type") == "markdown" and gid in text:
            cell.source = text[gid]
    nbformat.write(nb, path)


def merge(course: Path, lesson_id: str, student: str, db: Path, verdict: list, note: str = "") -> dict[str, str]:
    """Serialized gradebook write: one student's verdict into the course gradebook. Each code part's score is
    the lower of nbgrader's kernel (the worker's gradebook `db`, if nbgrader ran) and the sandbox, written as the
    part's manual score so none is left pending; its reason, when it is short of full marks, goes into the comment
    of the answer cell above it, which formgrader and the feedback show. The worker's gradebook went through the
    student's kernel, so only its automatic code scores are read from it, never its timestamp, a comment or a
    manual score. A written answer left as released (the verdict's 0, NO_ANSWER) scores 0 unless an instructor
    graded it; one the student wrote is pending until graded. Returns the message of each code part short of
    full marks."""
    from nbgrader.api import Gradebook, MissingEntry

    # nbgrader's own update_or_create_submission trips SQLAlchemy autoflush warnings; the rows are written.
    warnings.filterwarnings("ignore", message="Object of type <Submitted")
    failed, kernel = {}, {}
    if db.is_file():
        with Gradebook(f"sqlite:///{db}", COURSE_ID) as wb, contextlib.suppress(MissingEntry):
            sub = wb.find_submission(lesson_id, student)
            kernel = {g.name: g.auto_score for nb in sub.notebooks for g in nb.grades}
    ran = bool(kernel)
    where = answer_cells(lesson_id)
    reasons: dict[str, list[str]] = {}
    with Gradebook(f"sqlite:///{gradebook_db(course)}", COURSE_ID) as gb:
        gb.update_or_create_student(student)
        stamp = submission_time(course, lesson_id, student)
        gb.update_or_create_submission(lesson_id, student, **({"timestamp": stamp} if stamp else {}))
        mine = gb.find_submission(lesson_id, student)
        grades = {g.name: g for nb in mine.notebooks for g in nb.grades}
        comments = {c.name: c for nb in mine.notebooks for c in nb.comments}
        for r in verdict:
            gid, g = r.part.grade_id, grades.get(r.part.grade_id)
            if g is None:
                continue
            if r.part.manual:
                g.auto_score = 0.0 if r.score == 0 else None  # the answer left as released (or unreadable)
                g.needs_manual_grade = g.manual_score is None and g.auto_score is None
                if g.manual_score is None and r.score == 0:
                    reasons.setdefault(where.get(gid, gid), []).append(r.message)
                continue
            g.auto_score = kernel.get(gid)
            g.manual_score = r.score if g.auto_score is None else min(g.auto_score, r.score)
            g.needs_manual_grade = False
            if r.score < r.part.points:
                failed[gid] = r.message
            elif not ran:
                failed[gid] = note or "nbgrader 没能运行这份笔记本，本部分按沙箱成绩计"
            if g.manual_score < r.part.points:
                why = r.message if r.score < r.part.points else (note or "nbgrader 运行评分单元格未通过（见该单元格的输出）")
                reasons.setdefault(where.get(gid, gid), []).append(
                    f"{r.part.title}（{gid}）{g.manual_score:g}/{r.part.points} 分：{why}")
        for name, c in comments.items():
            c.auto_comment = "\n\n".join(reasons.get(name, [])) or None
        gb.db.commit()
        show_mark_schemes(course, lesson_id, student, gb)
    db.unlink(missing_ok=True)
    return failed


CANARY = "_reference_solution"  # the student id the canary runs under (never written to the course gradebook)
STUDENT_WORDING = re.compile(r"^(运行你的代码时出错：)+")  # a student-facing prefix; the canary's code is no student's
LIMIT_SETTINGS = ("MINIVLLM_MEMORY_LIMIT_MB", "MINIVLLM_CELL_TIMEOUT", "MINIVLLM_PROCESS_LIMIT", "MINIVLLM_DISK_LIMIT_MB")


def _first_error(notebook: Path) -> str:
    """'cell_id: Ename: evalue' of the first error output of an autograded notebook, else ""."""
    if not notebook.is_file():
        return ""
    for cell in read_notebook(notebook).get("cells", []):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                text = " ".join(f"{out.get('ename', '')}: {out.get('evalue', '')}".split())
                return f"{cell.get('id', '?')}: {text[:300]}"
    return ""


def _limits_set() -> str:
    """' (limits set here: MINIVLLM_MEMORY_LIMIT_MB=64, ...)' when the shell sets any: a cap too low for the engine
    to import is the likeliest cause of a refusal after an edit to the environment."""
    limits = [f"{k}={os.environ[k]}" for k in LIMIT_SETTINGS if k in os.environ]
    return f" (limits set here: {', '.join(limits)})" if limits else ""


def canary(course: Path, lesson_id: str) -> None:
    """Grade the lesson's reference solution as a student, in the same isolated environment and by the same
    worker (nbgrader's kernel and the sandbox) as the class, before the class. Anything short of full marks on
    every code part means the grader cannot grade here (an engine the isolated run cannot import, a broken
    kernel, ...): raise GraderBroken naming the cause, so no student is given the 0 the grader would give anyone.
    Nothing of it reaches the course gradebook, the autograded folder or the feedback."""
    from nbgrader.api import Gradebook, MissingEntry

    from autograder.sandbox import GraderBroken

    lesson = load_lesson(lesson_id)
    sub = course / "submitted" / CANARY / lesson_id
    sub.mkdir(parents=True, exist_ok=True)
    (sub / f"{lesson_id}.ipynb").write_text(dumps(solution_notebook(lesson_id)), encoding="utf-8")
    problems: list[str] = []
    phases = len(PHASES)
    try:
        try:
            db, verdict, note = autograde_one(course, lesson_id, CANARY)
        except GraderBroken as e:
            raise GraderBroken(f"{lesson_id}: grading did not start: the sandbox cannot run the grader: {e}"
                               f"{_limits_set()}") from None
        finally:
            del PHASES[phases:]  # the students' phases only; `grade` times the canary as a whole
        problems += [f"the sandbox scored {r.part.grade_id} {r.score:g}/{r.part.points} "
                     f"({STUDENT_WORDING.sub('', r.message)[:300]})" for r in verdict
                     if not r.part.manual and r.score != r.part.points]
        if note:
            problems.append(note)
        kernel = {}
        if db.is_file():
            with contextlib.suppress(MissingEntry), Gradebook(f"sqlite:///{db}", COURSE_ID) as gb:
                kernel = {g.name: g.auto_score for g in gb.find_submission_notebook(lesson_id, lesson_id, CANARY).grades}
        db.unlink(missing_ok=True)
        short = [f"{p.grade_id} {kernel.get(p.grade_id) or 0:g}/{p.points}" for p in lesson.parts
                 if not p.manual and kernel.get(p.grade_id) != p.points]
        if short and not note:
            error = _first_error(course / "autograded" / CANARY / lesson_id / f"{lesson_id}.ipynb")
            problems.append(f"nbgrader's kernel scored {', '.join(short)}" + (f" (first error, {error})" if error else ""))
    finally:
        shutil.rmtree(course / "submitted" / CANARY, ignore_errors=True)
        shutil.rmtree(course / "autograded" / CANARY, ignore_errors=True)
    if problems:
        raise GraderBroken(f"{lesson_id}: grading did not start: the reference solution does not score full marks in "
                           f"the grading environment: {'; '.join(problems)}{_limits_set()}. Fix the environment "
                           "(e.g. `python -m autograder check " f"{lesson_id} solutions/{lesson_id}/{lesson_id}.ipynb`"
                           " must give 4/4) before grading.")


class GraderChanged(RuntimeError):
    """A file of the grader, the engine or the release changed while submissions ran: the run stops."""


def autograde(course: Path, lesson_id: str, students: list[str], jobs: int = 1,
              digest: dict[str, str] | None = None) -> dict[str, dict[str, str]]:
    """Every student graded by `jobs` workers (nbgrader + sandbox each); the gradebook is written by this
    thread only, as each student finishes, with a progress bar. After each student the grader's files are
    hashed again (`digest`, from before the class): a change stops the run before that student's scores are
    written, naming the students whose notebooks had run since the last clean check."""
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    from tqdm import tqdm

    from autograder.sandbox import GraderBroken

    digest = digest or isolation.grader_digest()
    messages: dict[str, dict[str, str]] = {}
    queue, running = iter(students), {}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool, \
            tqdm(total=len(students), desc=f"{lesson_id} autograde -j {jobs}", unit="student") as bar:

        def start_next() -> None:  # a new student starts only once a finished one is checked and merged
            student = next(queue, None)
            if student is not None:
                running[pool.submit(autograde_one, course, lesson_id, student)] = student

        for _ in range(max(1, jobs)):
            start_next()
        while running:
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                student = running.pop(fut)
                try:
                    db, verdict, note = fut.result()
                except GraderBroken:  # the grader, not this student: no one may be given its 0
                    raise
                except Exception as e:  # noqa: BLE001  (this student's worker failed: 0 with the cause, and on)
                    db, verdict, note = student_failure(course, lesson_id, student, e)
                hashed = time.perf_counter()
                changed = isolation.changed_files(digest, isolation.grader_digest())
                PHASES.append(("grader files re-hashed", time.perf_counter() - hashed))
                if changed:
                    db.unlink(missing_ok=True)
                    suspects = sorted({student, *running.values()})  # and whoever ran beside it
                    raise GraderChanged(
                        f"{lesson_id}: grader files changed while {', '.join(suspects)} ran: "
                        f"{', '.join(changed[:5])}{' ...' if len(changed) > 5 else ''}; their scores were not "
                        "written. Restore the files (e.g. `git checkout -- autograder minivllm notebooks`) "
                        "before grading again.")
                merged = time.perf_counter()
                messages[student] = merge(course, lesson_id, student, db, verdict, note)
                PHASES.append(("gradebook merge", time.perf_counter() - merged))
                bar.update(1)
                start_next()
    return messages


def submitted_lessons(submissions: Path) -> list[str]:
    """The lessons at least one student submitted, from the submissions' layout."""
    return [lesson_id for lesson_id in discover_lessons() if find_submissions(submissions, lesson_id)]


def grade(submissions: Path, course: Path, csv_path: Path, lessons: list[str] | None = None, jobs: int = 1,
          cluster=None) -> dict:
    """Autograde every submission of the given lessons (default: every lesson someone submitted); export
    nbgrader's CSV (submitted lessons only, with a pending-manual-grading column) plus a per-part CSV. With
    `cluster` (autograder/cluster.py) each submission is a task on Dask's workers (each runs the canary);
    this process still writes the gradebook and the CSVs."""
    lessons = lessons or submitted_lessons(submissions)
    if not lessons:
        raise SystemExit(f"no submissions found in {submissions} (expected <student>/<lessonNN>/<lessonNN>.ipynb)")
    m = isolation.mode()
    print(f"isolation: {m}"
          + ("" if m.isolated else "; submissions run with your rights (the grader's files are still verified)"))
    digest = isolation.grader_digest()
    results, messages = {}, {}
    with staged_gradebook(course):  # all of this run's grades, or none of them
        print(f"[1/3] course folder {course}: releasing {len(lessons)} lesson(s) into the gradebook", flush=True)
        prepare_course(course, lessons)
        classes = {lesson_id: collect(course, lesson_id, submissions) for lesson_id in lessons}
        classes = {lesson_id: students for lesson_id, students in classes.items() if students}
        # every lesson's canary before any student, so a refusal grades no one (on a cluster each worker runs it
        # before its first task of the lesson)
        for lesson_id in classes if cluster is None else ():
            print(f"{lesson_id}: grading the reference solution first (canary)", flush=True)
            started = time.perf_counter()
            kernel_gradebook(course, lesson_id)
            canary(course, lesson_id)
            PHASES.append(("canary", time.perf_counter() - started))
        print("[2/3] autograde (nbgrader + sandbox, each submission isolated)", flush=True)
        for lesson_id, students in classes.items():
            messages[lesson_id] = (autograde(course, lesson_id, students, jobs, digest) if cluster is None
                                   else cluster.autograde(course, lesson_id, students, digest))
            results[lesson_id] = scores(course, lesson_id)
    print("[3/3] export", flush=True)
    nbgrader(["export", "--to", str(csv_path.resolve())], course)
    mark_export(csv_path, results)
    parts_csv = csv_path.with_name(csv_path.stem + "-parts.csv")
    diagnoses: dict[str, dict[str, set[str]]] = {}  # lesson -> misconception -> students
    with open(parts_csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["lesson", "student", "grade_id", "score", "max_score", "message", "diagnosis"])
        for lesson_id, per_student in results.items():
            lesson = load_lesson(lesson_id)
            for student, got in per_student.items():
                for p in lesson.parts:
                    s = got.get(p.grade_id)
                    msg = messages[lesson_id].get(student, {}).get(p.grade_id, "")
                    why = label(lesson_id, p.grade_id, msg) if s is not None and s < p.points else ""
                    w.writerow([lesson_id, student, p.grade_id, "pending" if s is None else f"{s:g}", p.points,
                                msg, why])
                    if why:
                        diagnoses.setdefault(lesson_id, {}).setdefault(why, set()).add(student)
    figures = [histogram(csv_path, lesson_id, found) for lesson_id, found in diagnoses.items()]
    for lesson_id, per_student in results.items():
        print(f"== {lesson_id} ==\n{table(lesson_id, per_student, unanswered(course, lesson_id))}")
        for student, failed in messages[lesson_id].items():
            if len(failed) > 1 and len(set(failed.values())) == 1:  # one cause (an unreadable notebook): one line
                print(f"  {student} {', '.join(failed)}: {next(iter(failed.values()))}")
                continue
            for gid, msg in failed.items():
                print(f"  {student} {gid}: {msg}")
    print(f"CSV: {csv_path} (nbgrader export), {parts_csv} (per part); course folder: {course}")
    for fig in figures:
        print(f"misconceptions: {fig}")
    return results


def histogram(csv_path: Path, lesson_id: str, found: dict[str, set[str]]) -> Path:
    """One bar per misconception (mutant names, or 'unknown') -> how many students' answers behave like it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted(found, key=lambda k: (-len(found[k]), k))
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.35 * len(names)))
    ax.barh(names[::-1], [len(found[k]) for k in names[::-1]])
    ax.set_xlabel("students")
    ax.set_title(f"{lesson_id}: misconceptions")
    ax.xaxis.get_major_locator().set_params(integer=True)
    fig.tight_layout()
    out = csv_path.with_name(f"{csv_path.stem}-{lesson_id}-diagnosis.png")
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def mark_export(csv_path: Path, results: dict[str, dict[str, dict[str, float | None]]]) -> None:
    """nbgrader's export lists every lesson for every student (0.0 where nothing was submitted) and has no
    word for pending manual grades: keep only submitted lessons and add `pending_manual_points`."""
    with open(csv_path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    fields = list(rows[0].keys()) + ["pending_manual_points"] if rows else ["assignment", "student_id"]
    kept = []
    for row in rows:
        got = results.get(row.get("assignment"), {}).get(row.get("student_id"))
        if got is None:
            continue
        row["pending_manual_points"] = f"{sum(p.points for p in load_lesson(row['assignment']).parts if p.manual and got.get(p.grade_id) is None):g}"
        kept.append(row)
    kept.sort(key=lambda r: (r["assignment"], r["student_id"]))
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(kept)


def feedback(course: Path, lessons: list[str] | None = None) -> list[Path]:
    """nbgrader's HTML feedback for every autograded submission in the course folder; parts still waiting for
    an instructor read "pending manual grading", and the heading gives the code subtotal beside the total."""
    out = []
    for lesson_id in lessons or discover_lessons():
        if (course / "autograded").exists() and any((course / "autograded").glob(f"*/{lesson_id}")):
            nbgrader(["generate_feedback", lesson_id, "--force"], course)
            got = scores(course, lesson_id)
            for page in sorted((course / "feedback").glob(f"*/{lesson_id}/{lesson_id}.html")):  # nothing else
                student = page.parent.parent.name
                if student in got:
                    page.write_text(mark_pending(page.read_text(encoding="utf-8"), lesson_id, got[student]),
                                    encoding="utf-8")
                out.append(page)
    for p in out:
        print(p)
    return out


PENDING = "待人工评分 (pending manual grading)"


def mark_pending(html: str, lesson_id: str, got: dict[str, float | None]) -> str:
    """nbgrader's feedback page shows a manual part nobody has graded yet as 0: say it is pending instead."""
    lesson = load_lesson(lesson_id)
    pending = [p for p in lesson.parts if p.manual and got.get(p.grade_id) is None]
    if not pending:
        return html
    for p in pending:
        gid = re.escape(p.grade_id)
        html = re.sub(rf'(<a href="#{gid}">[^<]*</a> \(Score: )[\d.]+', rf"\g<1>{PENDING}", html)
        html = re.sub(rf'(<a name="(?:comment-)?{gid}"></a>\s*<div class="panel-heading">(?:(?!</div>).)*?Score: )[\d.]+',
                      rf"\g<1>{PENDING}", html, flags=re.S)
    code = sum(got.get(p.grade_id) or 0 for p in lesson.parts if not p.manual)
    code_max = sum(p.points for p in lesson.parts if not p.manual)
    waiting = sum(p.points for p in pending)
    return re.sub(r"(\(Score: [\d.]+ / [\d.]+)\)</h4>",
                  rf"\g<1>; 代码 code {code:g}/{code_max:g}, {waiting:g} 分待人工评分 points pending manual grading)</h4>",
                  html, count=1)
