"""`grade --scheduler tcp://HOST:8786` / `grade --cluster local:N`: a class graded on Dask's distributed scheduler.

Each submission is one task on Dask's scheduler (`distributed`). On its worker, `grade_task` builds a course
folder of the worker's own from the bytes the client sent (nbgrader_config.py, the released gradebook, the one
submission), grades the lesson's reference solution first (the canary, once per worker process and lesson),
hashes the worker's grader tree before and after, and runs `grading.autograde_one` — the same isolated grading as
`grade -j N` (bubblewrap, a uid of the run's own, the same limits, sent with the task). It returns plain data: the
worker's gradebook copy, the autograded notebook's files, the verdict as (grade_id, score, message), nbgrader's
note and what changed in the tree.

One writer: a task never sees the course folder. The client alone writes it — the gradebook through
`grading.merge` (the function the local path calls), autograded/, and afterwards the CSVs and the table (the rest
of `grading.grade`) — one student at a time, in submission order, whichever worker finished first: the result
does not depend on which worker ran what.

Workers advertise their grader tree as a Dask resource, `minivllm-grader-<hash>` (`python -m autograder worker`,
or the LocalCluster `--cluster local:N` starts); tasks ask for the client's, so a worker with another tree never
takes one, and the client names it and the files that differ. A worker that dies mid-task: the scheduler
reschedules its task on another worker (its `allowed-failures`, default 3) and the client merges the one result.
A task past MINIVLLM_TASK_TIMEOUT (from its start on a worker) is cancelled and its student scored 0 with the
reason, like a task whose workers kept dying; the class goes on. A changed grader tree on a worker stops the run
before that result is written (grading.GraderChanged), as in the local path.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from unittest import mock

from autograder import grading, isolation
from autograder.common import PartResult, load_lesson
from autograder.limits import cell_timeout
from autograder.sandbox import STARTUP_S, GraderBroken

TOPIC = "minivllm-grading"  # workers' task-start events (Dask's structured events): retries and time limits
POLL_S = 1.0


def task_limit() -> float:
    """Seconds a task may run on a worker (MINIVLLM_TASK_TIMEOUT): a canary and a student, each at most a start-up
    and nbgrader's whole-notebook bound, twice over."""
    default = 2 * 2 * (STARTUP_S + grading.NOTEBOOK_TIMEOUT_FACTOR * cell_timeout())
    return float(os.environ.get("MINIVLLM_TASK_TIMEOUT", default))


def tree_tag(digest: dict[str, str]) -> str:
    """The Dask resource a worker with this grader tree advertises and a task of this client asks for."""
    return "minivllm-grader-" + hashlib.sha256(json.dumps(sorted(digest.items())).encode()).hexdigest()[:16]


def refusal(worker: str, changed: list[str]) -> str:
    return (f"worker {worker} refused: its grader tree (autograder/, minivllm/, notebooks/) differs from the "
            f"client's in {len(changed)} file(s): {', '.join(changed[:8])}{' ...' if len(changed) > 8 else ''}. "
            "Start it from the client's commit (`git status` clean on both).")


class ClusterRefused(GraderBroken):
    """No worker on the scheduler can grade for this client (none joined, or each has another grader tree)."""


class TreeMismatch(RuntimeError):
    """This worker's grader tree is not the client's: it grades nothing for it."""


# ----------------------------------------------------------------------------------------------- the worker's side
_canaries: dict[tuple[str, str], str] = {}  # (lesson, tree tag) -> "" (passed) or why not; per worker process


@contextlib.contextmanager
def _limits(values: dict[str, str]):
    """The client's limits (grading.LIMIT_SETTINGS) in this worker process while its one task runs (one task at a
    time per worker), whatever the worker's environment says."""
    with mock.patch.dict(os.environ, values):
        for k in set(grading.LIMIT_SETTINGS) - set(values):
            os.environ.pop(k, None)
        yield


def _worker_course(parent: str, files: dict[str, bytes], lesson_id: str, student: str) -> Path:
    course = Path(tempfile.mkdtemp(prefix="minivllm-course-", dir=parent))
    (course / "nbgrader_config.py").write_bytes(files["nbgrader_config.py"])
    (course / "gradebook.db").write_bytes(files["gradebook.db"])
    sub = course / "submitted" / student / lesson_id
    sub.mkdir(parents=True)
    (sub / f"{lesson_id}.ipynb").write_bytes(files["submission"])
    return course


def _canary(course: Path, lesson_id: str, tag: str) -> None:
    """The lesson's reference solution graded here first, once per worker process: a worker whose environment
    cannot grade refuses every task of the lesson (GraderBroken) instead of giving anyone a 0."""
    key = (lesson_id, tag)
    if key not in _canaries:
        started = time.perf_counter()
        try:
            grading.canary(course, lesson_id)
            _canaries[key] = ""
        except GraderBroken as e:
            _canaries[key] = str(e)
        grading.PHASES.append(("canary", time.perf_counter() - started))
    if _canaries[key]:
        raise GraderBroken(_canaries[key])


def grade_task(lesson_id: str, student: str, files: dict[str, bytes], digest: dict[str, str],
               limits: dict[str, str]) -> dict:
    """One submission on a Dask worker; returns plain data for the client's `write` (nothing here writes the
    course). Refuses (TreeMismatch) when this worker's grader tree is not the client's `digest`."""
    import shutil

    from distributed import get_worker

    worker = get_worker()
    worker.log_event(TOPIC, {"lesson": lesson_id, "student": student, "worker": worker.address,
                             "name": str(worker.name), "pid": os.getpid()})
    mine = isolation.grader_digest()
    differ = isolation.changed_files(digest, mine)
    if differ:
        raise TreeMismatch(refusal(f"{worker.name} ({worker.address})", differ))
    phases = len(grading.PHASES)
    course = _worker_course(worker.local_directory, files, lesson_id, student)
    try:
        with _limits(limits):
            _canary(course, lesson_id, tree_tag(digest))
            started = time.perf_counter()
            db, verdict, note = grading.autograde_one(course, lesson_id, student)
            seconds = time.perf_counter() - started
        out = course / "autograded" / student / lesson_id
        return {"gradebook": db.read_bytes() if db.is_file() else None, "note": note,  # None: nothing ran
                "autograded": {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
                               if p.is_file() and not p.is_symlink()},
                "verdict": [(r.part.grade_id, r.score, r.message) for r in verdict],
                "changed": isolation.changed_files(mine, isolation.grader_digest()),
                "worker": worker.address, "name": str(worker.name), "phases": grading.PHASES[phases:],
                "seconds": seconds}
    finally:
        del grading.PHASES[phases:]
        shutil.rmtree(course, ignore_errors=True)


def _worker_tree() -> dict:
    """What the client checks before it sends a task: this worker's grader tree and isolation (via Client.run)."""
    return {"digest": isolation.grader_digest(), "isolation": str(isolation.mode())}


def _refused(message: str) -> None:
    """Said on the refused worker's own console."""
    print(f"autograder worker: {message}", flush=True)


def start_worker(scheduler: str, name: str | None = None) -> None:
    """`python -m autograder worker tcp://HOST:8786`: a Dask Nanny (it restarts its worker process if that dies)
    with one worker thread that takes only tasks asking for this tree's resource."""
    import asyncio

    from distributed import Nanny

    digest = isolation.grader_digest()
    tag = tree_tag(digest)
    print(f"autograder worker for {scheduler}: grader tree {tag} ({len(digest)} files); isolation: "
          f"{isolation.mode()}", flush=True)

    async def run() -> None:
        # memory_limit=0: each graded run has its own caps (autograder/limits.py); the Nanny's would count the worker
        async with Nanny(scheduler, nthreads=1, resources={tag: 1}, name=name, memory_limit=0) as nanny:
            await nanny.finished()

    asyncio.run(run())


# ----------------------------------------------------------------------------------------------- the client's side
class DaskGrading:
    """The client's end: checks the workers' trees, submits a lesson's submissions as tasks, writes the results.
    `grading.grade(..., cluster=this)` calls `autograde` per lesson in place of the local canary + autograde."""

    def __init__(self, client, local_cluster=None, wait_s: float = 120.0):
        self.client, self.local_cluster = client, local_cluster
        self.digest = isolation.grader_digest()
        self.tag = tree_tag(self.digest)
        self.checked: dict[str, str] = {}  # worker address -> "" (can grade) or why it is refused
        self.starts: dict[tuple[str, str], list[dict]] = {}  # (lesson, student) -> its task's start events
        self.per_worker: dict[str, int] = {}
        self.task_seconds: list[float] = []  # each graded task's autograde_one on its worker (the canary aside)
        self.failed: list[tuple[str, str, str]] = []  # (lesson, student, why): timed out, or its workers died
        self.on_start = None  # a hook, called with each start event (tests kill a worker from it)
        self._released: dict[Path, bytes] = {}
        self._lock = threading.Lock()
        client.subscribe_topic(TOPIC, self._started)
        self.check_workers(wait_s)

    def _started(self, event) -> None:
        _, msg = event
        with self._lock:
            self.starts.setdefault((msg["lesson"], msg["student"]), []).append(dict(msg, at=time.monotonic()))
        if self.on_start:
            self.on_start(msg)

    @property
    def retried(self) -> list[tuple[str, str]]:
        """(lesson, student) of each task that started more than once (its worker died or left mid-task)."""
        with self._lock:
            return sorted(k for k, v in self.starts.items() if len(v) > 1)

    def check_workers(self, wait_s: float = 0.0) -> list[str]:
        """Compare every worker not yet seen with this client's tree; tell refused workers why (on their console
        too). Waits up to wait_s for one that can grade; raises ClusterRefused naming the refused ones."""
        deadline = time.monotonic() + wait_s
        while True:
            info = self.client.scheduler_info(n_workers=-1)["workers"]
            new = [a for a in info if a not in self.checked]
            if new:
                trees = self.client.run(_worker_tree, workers=new, on_error="return")
                for addr in new:
                    who = f"{info[addr].get('name', addr)} ({addr})"
                    tree = trees.get(addr)
                    if not isinstance(tree, dict):
                        why = f"worker {who} refused: it cannot run the grader's check ({tree!r:.200})"
                    elif tree["digest"] != self.digest:
                        why = refusal(who, isolation.changed_files(self.digest, tree["digest"]))
                    elif self.tag not in info[addr].get("resources", {}):
                        why = (f"worker {who} takes no grading task: it does not advertise {self.tag} (start it "
                               "with `python -m autograder worker ADDRESS`)")
                    else:
                        why = ""
                        print(f"worker {who}: grader tree {self.tag}; isolation: {tree['isolation']}", flush=True)
                    if why:
                        print(why, flush=True)
                        with contextlib.suppress(Exception):
                            self.client.run(_refused, why, workers=[addr], on_error="ignore")
                        if self.tag in info[addr].get("resources", {}):  # a plain `dask worker` told the tag
                            self.client.retire_workers([addr], close_workers=True)
                    self.checked[addr] = why
            ready = [a for a in info if not self.checked.get(a)]
            if ready or time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)
        if not ready:
            refused = [why for why in self.checked.values() if why]
            raise ClusterRefused("no Dask worker can grade for this client"
                                 + (": " + "; ".join(refused) if refused else f" (none joined in {wait_s:g} s)"))
        return ready

    def autograde(self, course: Path, lesson_id: str, students: list[str],
                  digest: dict[str, str] | None = None) -> dict[str, dict[str, str]]:
        """The lesson's submissions as tasks; each result written by this thread alone, in `students` order."""
        from distributed import wait
        from tqdm import tqdm

        digest = digest or self.digest
        if digest != self.digest:
            raise grading.GraderChanged(f"{lesson_id}: the client's grader tree changed since it connected: "
                                        f"{', '.join(isolation.changed_files(self.digest, digest)[:5])}")
        # the released gradebook, as prepare_course left it (the students' runs need nothing merged since)
        released = self._released.setdefault(course, grading.gradebook_db(course).read_bytes())
        base = {"nbgrader_config.py": (course / "nbgrader_config.py").read_bytes(), "gradebook.db": released}
        limits = {k: os.environ[k] for k in grading.LIMIT_SETTINGS if k in os.environ}
        sub = course / "submitted"
        futures = {self.client.submit(grade_task, lesson_id, s,
                                      dict(base, submission=(sub / s / lesson_id / f"{lesson_id}.ipynb").read_bytes()),
                                      digest, limits, resources={self.tag: 1}, pure=False,
                                      key=f"grade-{lesson_id}-{s}-{os.urandom(4).hex()}"): s for s in students}
        outcomes: dict[str, dict | None] = {}
        messages: dict[str, dict[str, str]] = {}
        limit, order = task_limit(), iter(students)
        following = next(order, None)
        with tqdm(total=len(students), desc=f"{lesson_id} on Dask", unit="student") as bar, \
                self._cancelled_on_error(futures):
            while following is not None:
                with contextlib.suppress(TimeoutError):
                    wait(list(futures), timeout=POLL_S, return_when="FIRST_COMPLETED")
                for fut, student in list(futures.items()):
                    started = self.starts.get((lesson_id, student))
                    if fut.done():
                        outcomes[student] = self._outcome(fut, lesson_id, student)
                        # the scheduler forgets it now: a worker lost later would otherwise have its finished
                        # tasks recomputed (run again) for as long as this client still held their futures
                        fut.release()
                    elif started and time.monotonic() - started[-1]["at"] > limit:
                        fut.cancel()
                        outcomes[student] = self._failure(lesson_id, student, f"评分任务超过 {limit:g} s"
                                                          "（MINIVLLM_TASK_TIMEOUT），已停止")
                    else:
                        continue
                    del futures[fut]
                    bar.update(1)
                while following is not None and following in outcomes:  # the one writer, in submission order
                    messages[following] = self.write(course, lesson_id, following, outcomes.pop(following))
                    following = next(order, None)
                bar.set_postfix_str(self.progress(), refresh=False)
                if futures:
                    self.check_workers()
        return messages

    @contextlib.contextmanager
    def _cancelled_on_error(self, futures: dict):
        """A run that stops (a broken or changed worker, an interrupt) takes its tasks still queued with it."""
        try:
            yield
        except BaseException:
            self.client.cancel(list(futures))
            raise

    def progress(self) -> str:
        workers = " ".join(f"{n}:{c}" for n, c in sorted(self.per_worker.items()))
        return f"failed {len(self.failed)}, retried {len(self.retried)} | {workers}"

    def _failure(self, lesson_id: str, student: str, why: str | Exception) -> dict:
        self.failed.append((lesson_id, student, str(why)))
        return {"failed": why}

    def _outcome(self, fut, lesson_id: str, student: str) -> dict:
        """A finished task's result, or the student's failure; a broken or changed worker stops the class."""
        from distributed import KilledWorker

        if fut.status == "finished":
            result = fut.result()
            if result["changed"]:
                raise grading.GraderChanged(
                    f"{lesson_id}: grader files changed on worker {result['name']} ({result['worker']}) while "
                    f"{student} ran: {', '.join(result['changed'][:5])}; its scores were not written. Restore the "
                    "worker's files before grading again.")
            self.per_worker[result["name"]] = self.per_worker.get(result["name"], 0) + 1
            self.task_seconds.append(result["seconds"])
            grading.PHASES.extend(result["phases"])
            return result
        error = fut.exception()
        if isinstance(error, KilledWorker):
            return self._failure(lesson_id, student, "评分这份作业的 Dask worker 多次中途退出，已停止重试（"
                                 f"{str(error)[:200]}）")
        if isinstance(error, TreeMismatch):  # the worker's tree changed after it joined
            raise grading.GraderChanged(f"{lesson_id}: {error}") from None
        if isinstance(error, GraderBroken):
            raise GraderBroken(f"on a Dask worker: {error}") from None
        return self._failure(lesson_id, student, error)  # this student's task failed: 0 with the cause, and on

    def write(self, course: Path, lesson_id: str, student: str, result: dict) -> dict[str, str]:
        """The one writer: a task's result into the course folder — its autograded notebook, then its grades
        through grading.merge, exactly as the local path writes one student; a failed task as the sandbox-only
        case (a task that failed, or a submission its worker could not grade at all) as the local path writes it,
        through grading.student_failure: every part 0 with the cause."""
        db = course / f".gradebook-{lesson_id}-{student}.db"
        lesson = load_lesson(lesson_id)
        if "failed" in result or result["gradebook"] is None:
            db, verdict, note = grading.student_failure(course, lesson_id, student,
                                                        result.get("failed") or result["note"])
            return grading.merge(course, lesson_id, student, db, verdict, note)
        out = (course / "autograded" / student / lesson_id).resolve()
        for rel, data in result["autograded"].items():
            target = (out / rel).resolve()
            if out not in target.parents:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        db.write_bytes(result["gradebook"])
        verdict = [PartResult(lesson.part(gid), score, message) for gid, score, message in result["verdict"]]
        if result["note"]:
            print(f"{student}: {result['note']}")
        return grading.merge(course, lesson_id, student, db, verdict, result["note"])

    def close(self) -> None:
        print(f"Dask: {sum(self.per_worker.values())} task(s) graded, {len(self.failed)} failed, "
              f"{len(self.retried)} retried; per worker: {self.per_worker}", flush=True)
        for lesson_id, student, why in self.failed:
            print(f"  failed {lesson_id} {student}: {why}")
        self.client.close()
        if self.local_cluster is not None:
            self.local_cluster.close()

    def __enter__(self) -> DaskGrading:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def local_cluster(n: int, digest: dict[str, str] | None = None):
    """`--cluster local:N`: a LocalCluster of N worker processes (Nannies), one task each at a time, advertising
    this tree's resource."""
    from distributed import LocalCluster

    tag = tree_tag(digest or isolation.grader_digest())
    return LocalCluster(n_workers=n, threads_per_worker=1, processes=True, resources={tag: 1}, memory_limit=0,
                        dashboard_address=None, silence_logs=logging.ERROR)


def connect(target: str, wait_s: float = 120.0) -> DaskGrading:
    """`local:N` (a LocalCluster started here) or a scheduler's address (tcp://HOST:8786)."""
    from distributed import Client

    cluster = local_cluster(int(target.split(":", 1)[1])) if target.startswith("local:") else None
    client = Client(cluster) if cluster is not None else Client(target, timeout=wait_s)
    try:
        return DaskGrading(client, cluster, wait_s)
    except BaseException:
        client.close()
        if cluster is not None:
            cluster.close()
        raise
