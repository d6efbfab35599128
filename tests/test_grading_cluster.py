"""Grading on Dask's distributed scheduler (autograder/cluster.py, #57), against the local path.

One class — lesson 1 with a right, a wrong, a blank, a hanging and a tampering student, and one student of a second
lesson — graded by `grade -j 1` (a module fixture) and by a LocalCluster of 2 worker processes: the gradebook (every
student's grades and comments), nbgrader's CSV, the per-part CSV and the printed tables are equal, timestamps aside.
A worker killed mid-task is replaced and the task retried, the result written once and the same; a worker started
from another grader tree is refused, naming it and the file that differs. The cell limit is 25 s, as in
tests/test_grading_limits.py: the hanging student costs one limit per run, asleep (busy loops are that file's), so
the other test worker has the CPU meanwhile.
"""
import contextlib
import csv
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_grading_limits import BROKEN, PATCH_CHECKS, WRONG, body

from autograder.common import REPO
from autograder.mutation import filled_notebook

LESSON, OTHER = "lesson01", "lesson05"  # two of the cheapest lessons to grade
STEP = "l01_engine_core_step"
KILLED = "wrong"  # the student whose first worker is killed mid-task


@pytest.fixture(scope="module")
def limits():
    """Small limits (the workers get them with each task) and sandbox uids no other test file uses."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINIVLLM_CELL_TIMEOUT", "25")
        mp.setenv("MINIVLLM_SANDBOX_UIDS", "60140-60171")
        yield


@pytest.fixture(scope="module")
def subs(tmp_path_factory) -> Path:
    from autograder.mutation import mutant_notebook, mutants

    root = tmp_path_factory.mktemp("cluster") / "subs"
    blank = json.loads((REPO / f"notebooks/{LESSON}/{LESSON}.ipynb").read_text(encoding="utf-8"))
    students = {(LESSON, "right"): filled_notebook(LESSON), (LESSON, "wrong"): filled_notebook(LESSON, {STEP: WRONG}),
                (LESSON, "blank"): blank, (LESSON, "hanging"): filled_notebook(LESSON, {STEP: body(BROKEN["sleeps"])}),
                (LESSON, "tampering"): filled_notebook(LESSON, {STEP: WRONG + "\n" + PATCH_CHECKS}),
                (OTHER, "other_wrong"): mutant_notebook(OTHER, sorted(mutants(OTHER))[0])}
    for (lesson, name), nb in students.items():
        (root / name / lesson).mkdir(parents=True)
        (root / name / lesson / f"{lesson}.ipynb").write_text(json.dumps(nb, ensure_ascii=False), encoding="utf-8")
    return root


def gradebook_rows(db: Path) -> list[tuple]:
    """Every student's grades and comments in a gradebook, by name (nbgrader's row ids are random uuids)."""
    from nbgrader.api import Gradebook

    rows = []
    with Gradebook(f"sqlite:///{db}", "minivllm-v1") as gb:
        rows += [("student", s.id, s.first_name, s.last_name, s.email) for s in gb.students]
        for a in gb.assignments:
            for sub in gb.assignment_submissions(a.name):
                for nb in sub.notebooks:
                    key = (a.name, sub.student.id, nb.name)
                    rows.append(("notebook", *key, nb.flagged, nb.late_submission_penalty))
                    rows += [("grade", *key, g.name, g.auto_score, g.manual_score, g.extra_credit,
                              g.needs_manual_grade) for g in nb.grades]
                    rows += [("comment", *key, c.name, c.auto_comment, c.manual_comment) for c in nb.comments]
    return sorted(rows, key=repr)


def outcome(folder: Path, printed: str) -> dict:
    """What a grade run left, comparable across runs: the gradebook's rows, the CSVs (the export's timestamp
    column dropped), each lesson's table with the failure lines under it, and the notes printed per student."""
    with open(folder / "grades.csv", newline="", encoding="utf-8") as f:
        export = [{k: v for k, v in row.items() if k != "timestamp"} for row in csv.DictReader(f)]
    tables = dict(re.findall(r"^== (lesson\d\d) ==\n(.*?)(?=^== |^CSV: )", printed, flags=re.M | re.S))
    return {"gradebook": gradebook_rows(folder / "course" / "gradebook.db"), "csv": export,
            "parts": (folder / "grades-parts.csv").read_text(encoding="utf-8").splitlines(), "tables": tables,
            "notes": sorted(line for line in printed.splitlines() if re.match(r"^\w+: nbgrader", line))}


def run_grade(subs: Path, folder: Path, lessons: list[str], **kw) -> dict:
    from autograder.grading import grade

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        grade(subs, folder / "course", folder / "grades.csv", lessons, **kw)
    assert not list((folder / "course").glob(".gradebook-*.db"))  # every result was merged
    return outcome(folder, printed.getvalue())


def only(result: dict, lesson: str, student: str) -> dict:
    """The part of an outcome that belongs to one student's submission of one lesson."""
    rows = [r for r in result["gradebook"] if r[0] == "student" and r[1] == student or r[1:3] == (lesson, student)]
    table = result["tables"][lesson].splitlines()
    return {"gradebook": rows, "csv": [r for r in result["csv"] if (r["assignment"], r["student_id"]) == (lesson, student)],
            "parts": [p for p in result["parts"] if p.startswith(f"{lesson},{student},")],
            # the table's column widths follow the longest name in the class: compare cells
            "table": [line.split() for line in table[:1] + [t for t in table if t.startswith((f"{student} ", f"  {student} "))]]}


@pytest.fixture(scope="module")
def cluster(limits):
    """One LocalCluster of 2 worker processes for the file: each worker runs a lesson's canary once."""
    from autograder.cluster import connect

    with connect("local:2") as on:
        yield on


@pytest.fixture(scope="module")
def local_run(subs, limits, tmp_path_factory) -> dict:
    """The class graded once by the local path (`grade -j 1`), for every comparison in this file."""
    return run_grade(subs, tmp_path_factory.mktemp("local"), [LESSON, OTHER], jobs=1)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_local_cluster_grades_the_class_as_the_local_path_does(subs, local_run, cluster, tmp_path):
    before = dict(cluster.per_worker)
    got = run_grade(subs, tmp_path, [LESSON, OTHER], cluster=cluster)
    ran = {w: n - before.get(w, 0) for w, n in cluster.per_worker.items() if n > before.get(w, 0)}
    assert got == local_run
    code: dict[str, float] = {}  # a code part's final score is its manual score (merge writes the sandbox's)
    for _, lesson, student, _, part, _, final, *_ in (r for r in got["gradebook"] if r[0] == "grade"):
        if lesson == LESSON and not part.startswith("l01_q"):
            code[student] = code.get(student, 0) + final
    assert (code["right"], code["wrong"], code["blank"], code["hanging"]) == (4, 1, 0, 1), code
    assert code["tampering"] <= 1, code
    assert sum(ran.values()) == 6 and len(ran) == 2, ran  # both workers graded
    assert any("hanging: nbgrader" in n for n in got["notes"]), got["notes"]  # the timeout, for that student only


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_worker_killed_mid_task_is_replaced_and_the_task_retried(subs, local_run, cluster, tmp_path):
    """One student of the class; the worker that starts the task is killed 3 s in: its Nanny restarts it, the
    scheduler reschedules the task, one result is written, the same as the local run's."""
    shutil.copytree(subs / KILLED, tmp_path / "subs" / KILLED)
    killed: list[int] = []

    def kill_first_worker(start: dict) -> None:
        if not killed:
            killed.append(start["pid"])
            threading.Timer(3.0, os.kill, (start["pid"], signal.SIGKILL)).start()

    cluster.starts.clear()  # this run's starts only
    cluster.on_start = kill_first_worker
    try:
        got = run_grade(tmp_path / "subs", tmp_path, [LESSON], cluster=cluster)
    finally:
        cluster.on_start = None
    starts = cluster.starts[LESSON, KILLED]
    assert cluster.retried == [(LESSON, KILLED)] and not cluster.failed
    assert len(starts) == 2 and starts[0]["pid"] == killed[0] != starts[1]["pid"], starts
    assert only(got, LESSON, KILLED) == only(local_run, LESSON, KILLED)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_task_past_its_limit_is_scored_as_a_timeout_and_the_class_goes_on(subs, cluster, tmp_path, monkeypatch):
    """MINIVLLM_TASK_TIMEOUT counts from the task's start on a worker: past it the client cancels the task and
    writes that student's code parts as 0 with the reason; the export and the table are still written."""
    shutil.copytree(subs / "right", tmp_path / "subs" / "right")
    monkeypatch.setenv("MINIVLLM_TASK_TIMEOUT", "2")
    cluster.failed.clear()
    got = run_grade(tmp_path / "subs", tmp_path, [LESSON], cluster=cluster)
    assert [failed[:2] for failed in cluster.failed] == [(LESSON, "right")]
    code = [p for p in got["parts"] if p.startswith(f"{LESSON},right,") and ",l01_q" not in p]
    assert len(code) == 4 and all(",0,1," in p and "MINIVLLM_TASK_TIMEOUT" in p for p in code), code
    assert [row["student_id"] for row in got["csv"]] == ["right"]


def test_a_worker_with_another_grader_tree_is_refused(tmp_path):
    """`python -m autograder worker` started from a copy of the grader with one file changed joins the scheduler,
    takes no task, and the client's refusal names the worker and the file (on the worker's console too)."""
    from distributed import Client, LocalCluster

    from autograder.cluster import ClusterRefused, DaskGrading

    tree = tmp_path / "tree"
    for name in ("autograder", "minivllm", "notebooks"):
        shutil.copytree(REPO / name, tree / name, ignore=shutil.ignore_patterns("__pycache__"))
    with open(tree / "autograder" / "limits.py", "a") as f:
        f.write("# another commit\n")
    scheduler = LocalCluster(n_workers=0, processes=False, protocol="tcp://", host="127.0.0.1", dashboard_address=None)
    worker = subprocess.Popen([sys.executable, "-m", "autograder", "worker", scheduler.scheduler_address,
                               "--name", "stale-tree"], cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        client = Client(scheduler)
        deadline = time.monotonic() + 120
        while not client.scheduler_info()["workers"] and time.monotonic() < deadline and worker.poll() is None:
            time.sleep(0.5)
        with pytest.raises(ClusterRefused, match=r"worker stale-tree \(tcp://[^)]+\) refused: .* 1 file\(s\): "
                                                 r"autograder/limits\.py"):
            DaskGrading(client, wait_s=0)
        client.close()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGTERM)
        printed = worker.communicate(timeout=60)[0]
        scheduler.close()
    assert "autograder worker: worker stale-tree" in printed and "autograder/limits.py" in printed, printed[-3000:]


def test_a_worker_whose_tree_differs_or_changed_writes_nothing(tmp_path, monkeypatch):
    """Both hashes of a task, without a cluster: a worker whose tree is not the client's refuses the task before
    grading (TreeMismatch names the worker and the file), and a result whose worker saw its tree change while the
    student ran stops the run before anything is written (GraderChanged names the worker, the student, the file)."""
    import distributed

    from autograder import cluster, grading

    class FakeWorker:
        address, name, local_directory = "tcp://10.0.0.7:4000", "node7", str(tmp_path)

        def log_event(self, topic, msg):
            pass

    monkeypatch.setattr(distributed, "get_worker", lambda: FakeWorker())
    client_tree = dict(cluster.isolation.grader_digest(), **{"autograder/limits.py": "0" * 64})
    with pytest.raises(cluster.TreeMismatch, match=r"worker node7 \(tcp://10\.0\.0\.7:4000\) refused: .*"
                                                   r"1 file\(s\): autograder/limits\.py"):
        cluster.grade_task(LESSON, "right", {}, client_tree, {})

    class Finished:
        status = "finished"

        def result(self):
            return {"changed": ["minivllm/config.py"], "worker": FakeWorker.address, "name": FakeWorker.name}

    grader = object.__new__(cluster.DaskGrading)
    grader.per_worker, grader.task_seconds = {}, []
    monkeypatch.setattr(grading, "merge", lambda *a: pytest.fail("a changed worker's result was merged"))
    with pytest.raises(grading.GraderChanged, match=r"worker node7 .* while right ran: minivllm/config\.py"):
        grader._outcome(Finished(), LESSON, "right")
    assert grader.per_worker == {}

