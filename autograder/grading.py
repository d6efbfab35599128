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

import contextlib
import csv
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autograder import isolation
from autograder.build import dumps, nbgrader, nbgrader_env, new_course, solution_notebook
from autograder.common import discover_lessons, load_lesson
from autograder.diagnosis import label
from autograder.limits import cell_timeout

NOTEBOOK_TIMEOUT_FACTOR = 3  # a whole notebook under nbgrader: at most this many cell limits
# (phase, seconds) per student and phase, appended by autograde_one/autograde (list.append is thread-safe):
# where a class's time goes, for benchmarks/grade_parallel.py. Timing only; no verdict reads it.
PHASES: list[tuple[str, float]] = []


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


def _nbgrader_autograde(work: Path, lesson_id: str, student: str, log) -> subprocess.Popen:
    """nbgrader autograde of one student in its private course folder `work`, started isolated and bounded."""
    env = nbgrader_env(grading=True)
    argv = [sys.executable, "-m", "nbgrader", "autograde", lesson_id, "--student", student, "--force",
            f"--db=sqlite:///{work / 'gradebook.db'}"]
    return subprocess.Popen(isolation.wrap(argv, work.parent, cwd=work), cwd=work, env=env, stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=isolation.limit_run,
                            start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def autograde_one(course: Path, lesson_id: str, student: str) -> tuple[Path, list, str]:
    """One worker: nbgrader autograde of one student and the sandbox, side by side, each where the student's
    code cannot reach the course folder, the grader or anyone else's files (autograder/isolation.py).

    nbgrader works in a private copy of the course (config, gradebook, this one submission); what it leaves
    (the autograded notebook, its gradebook) is copied back as plain files and trusted no further than
    `merge` says. When the sandbox finds an answer that hangs, nbgrader's run (stuck in the same answer) is
    stopped at once: a looping answer costs one cell limit in all, not one in each. Nothing here writes the
    course gradebook: `merge` does, one student at a time. Returns (gradebook copy, verdict, note)."""
    from autograder.sandbox import grade_file

    db = course / f".gradebook-{lesson_id}-{student}.db"
    note = ""
    with isolation.scratch_dir("minivllm-grade-") as scratch, tempfile.TemporaryFile() as log:
        work = scratch / "course"
        sub = work / "submitted" / student / lesson_id
        sub.mkdir(parents=True)
        shutil.copy(course / "nbgrader_config.py", work / "nbgrader_config.py")
        shutil.copy(course / "gradebook.db", work / "gradebook.db")
        shutil.copy(course / "submitted" / student / lesson_id / f"{lesson_id}.ipynb", sub / f"{lesson_id}.ipynb")
        isolation.give(work)
        started, wall = time.perf_counter(), time.time()
        proc = _nbgrader_autograde(work, lesson_id, student, log)
        try:
            verdict = grade_file(lesson_id, course / "submitted" / student / lesson_id / f"{lesson_id}.ipynb")[0]
        except BaseException:  # GraderBroken (the grader, not this student) or an interrupt: the run stops here
            _stop(proc)
            raise
        PHASES.append(("sandbox re-grade", time.perf_counter() - started))
        if proc.poll() is None and any(r.message.startswith("超时") for r in verdict):
            _stop(proc)
            note = "nbgrader 的运行已停止：答案在沙箱中已超时（同一答案只计一次时限），代码部分按沙箱成绩计"
        else:
            try:
                proc.wait(timeout=NOTEBOOK_TIMEOUT_FACTOR * cell_timeout())
            except subprocess.TimeoutExpired:
                _stop(proc)
                note = f"nbgrader 运行整本笔记本超过 {NOTEBOOK_TIMEOUT_FACTOR * cell_timeout():g} s，已停止"
        if proc.returncode != 0 and not note:
            log.seek(0)
            tail = log.read()[-2000:].decode("utf-8", "replace").strip().splitlines()
            note = f"nbgrader autograde failed; the sandbox's scores stand ({(tail or [''])[-1][:120]})"
        # nbgrader's own run: to its last gradebook write (it may have ended while the sandbox still ran)
        elapsed, wdb = time.perf_counter() - started, work / "gradebook.db"
        written = wdb.lstat().st_mtime - wall if wdb.is_file() and not wdb.is_symlink() else 0.0
        PHASES.append(("nbgrader execution", written if 0 < written < elapsed else elapsed))
        isolation.copy_out(work / "autograded" / student / lesson_id, course / "autograded" / student / lesson_id)
        if wdb.is_file() and not wdb.is_symlink():
            shutil.copyfile(wdb, db)
        else:
            shutil.copy(course / "gradebook.db", db)
    if note:
        print(f"{student}: {note}")
    return db, verdict, note


def merge(course: Path, lesson_id: str, student: str, db: Path, verdict: list, note: str = "") -> dict[str, str]:
    """Serialized gradebook write: the worker's grades and comments for one student into the course gradebook,
    each code part lowered to the sandbox's score (so none is left pending). The worker's gradebook went
    through the student's kernel, so only its automatic scores and comments are taken, never a manual score:
    a manual part is pending until an instructor grades it, or 0 where nbgrader found the answer untouched. Returns
    the sandbox's message for each code part it failed."""
    import warnings

    from nbgrader.api import Gradebook, MissingEntry

    # nbgrader's own update_or_create_submission trips SQLAlchemy autoflush warnings; the rows are written.
    warnings.filterwarnings("ignore", message="Object of type <Submitted")
    manual = {p.grade_id for p in load_lesson(lesson_id).parts if p.manual}
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
                if g.name not in manual:
                    mine.auto_score, mine.manual_score = g.auto_score, None
                elif g.auto_score == 0 and not g.needs_manual_grade and mine.manual_score is None:
                    mine.auto_score = 0.0  # an answer left as released: nbgrader's 0 (it can only lower a score)
            for c in nb.comments:
                mine = gb.find_comment(c.name, nb.name, lesson_id, student)
                mine.auto_comment = c.auto_comment
        grades = {g.name: g for nb in gb.find_submission(lesson_id, student).notebooks for g in nb.grades}
        for gid in manual & grades.keys():
            g = grades[gid]
            g.needs_manual_grade = g.manual_score is None and g.auto_score is None
        for r in verdict:
            g = grades.get(r.part.grade_id)
            if r.part.manual or g is None:
                continue
            kernel = g.auto_score if g.manual_score is None else g.manual_score
            g.manual_score = r.score if kernel is None or sub is None else min(kernel, r.score)
            g.needs_manual_grade = False
            if r.score < r.part.points:
                failed[r.part.grade_id] = r.message
            elif sub is None:
                failed[r.part.grade_id] = note or "nbgrader 没能运行这份笔记本，本部分按沙箱成绩计"
        gb.db.commit()
    db.unlink()
    return failed


CANARY = "_reference_solution"  # the student id the canary runs under (never written to the course gradebook)


def _first_error(notebook: Path) -> str:
    """'cell_id: Ename: evalue' of the first error output of an autograded notebook, else ""."""
    import json

    if not notebook.is_file():
        return ""
    for cell in json.loads(notebook.read_text(encoding="utf-8")).get("cells", []):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                text = " ".join(f"{out.get('ename', '')}: {out.get('evalue', '')}".split())
                return f"{cell.get('id', '?')}: {text[:300]}"
    return ""


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
            raise GraderBroken(f"{lesson_id}: the sandbox cannot run the grader: {e}") from None
        finally:
            del PHASES[phases:]  # the students' phases only; `grade` times the canary as a whole
        problems += [f"sandbox {r.part.grade_id} {r.score:g}/{r.part.points}: {r.message[:300]}" for r in verdict
                     if not r.part.manual and r.score != r.part.points]
        if note:
            problems.append(f"nbgrader: {note}")
        kernel = {}
        with contextlib.suppress(MissingEntry), Gradebook(f"sqlite:///{db}", "minivllm-v1") as gb:
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
        raise GraderBroken(f"{lesson_id}: the reference solution does not score full marks in the grading "
                           f"environment, so no submission was graded: {'; '.join(problems)}. Fix the environment "
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
                db, verdict, note = fut.result()
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
    print(f"isolation: {'bubblewrap, ' + m.kind if m.isolated else 'OFF — ' + m.reason}"
          + ("" if m.isolated else "; submissions run with your rights (the grader's files are still verified)"))
    digest = isolation.grader_digest()
    print(f"[1/3] course folder {course}: releasing {len(lessons)} lesson(s) into the gradebook", flush=True)
    prepare_course(course, lessons)
    results, messages = {}, {}
    print("[2/3] autograde (nbgrader + sandbox, each submission isolated)", flush=True)
    for lesson_id in lessons:
        students = collect(course, lesson_id, submissions)
        if students and cluster is not None:
            messages[lesson_id] = cluster.autograde(course, lesson_id, students, digest)
            results[lesson_id] = scores(course, lesson_id)
        elif students:
            print(f"{lesson_id}: grading the reference solution first (canary)", flush=True)
            started = time.perf_counter()
            canary(course, lesson_id)
            PHASES.append(("canary", time.perf_counter() - started))
            messages[lesson_id] = autograde(course, lesson_id, students, jobs, digest)
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
        print(f"== {lesson_id} ==\n{table(lesson_id, per_student)}")
        for student, failed in messages[lesson_id].items():
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
            for page in sorted((course / "feedback").glob(f"*/{lesson_id}/*.html")):
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
