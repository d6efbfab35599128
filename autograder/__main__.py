"""python -m autograder {build,check,grade,worker,feedback,release,diagnose,new,verify} — the course's one command line."""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m autograder", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="solutions/*.py -> solutions/*.ipynb and notebooks/ (nbgrader release)")
    b.add_argument("lessons", nargs="*", help="lesson ids (default: every solutions/lessonNN/)")
    b.add_argument("--check", action="store_true", help="write nothing; exit 1 if a generated file is stale")
    c = sub.add_parser("check", help="self-check a notebook without nbgrader (e.g. in Colab)")
    c.add_argument("lesson", help="lesson id, e.g. lesson01")
    c.add_argument("notebook", type=Path, nargs="?",
                   help="the student's .ipynb (default: LESSON.ipynb here, or notebooks/LESSON/LESSON.ipynb)")
    g = sub.add_parser("grade", help="autograde every submission with nbgrader; CSV + table")
    g.add_argument("submissions", type=Path, help="folder of <student>/<lessonNN>/<lessonNN>.ipynb")
    g.add_argument("--lesson", action="append", help="only these lessons (repeatable)")
    g.add_argument("--course", type=Path, default=Path("minivllm-course"), help="course folder to build/use")
    g.add_argument("--csv", type=Path, default=Path("grades.csv"))
    g.add_argument("-j", "--jobs", type=int, default=1, help="students graded at once (default 1)")
    on = g.add_mutually_exclusive_group()
    on.add_argument("--scheduler", metavar="tcp://HOST:8786",
                    help="grade on this Dask scheduler's workers (started with `python -m autograder worker`)")
    on.add_argument("--cluster", metavar="local:N", help="grade on a Dask LocalCluster of N worker processes")
    w = sub.add_parser("worker", help="a Dask worker for `grade --scheduler`: takes tasks only of this grader tree")
    w.add_argument("scheduler", help="the scheduler's address, e.g. tcp://HOST:8786")
    w.add_argument("--name", help="the worker's name in the client's messages (default: Dask's)")
    f = sub.add_parser("feedback", help="nbgrader HTML feedback for a course folder that `grade` built")
    f.add_argument("--course", type=Path, default=Path("minivllm-course"))
    f.add_argument("--lesson", action="append")
    r = sub.add_parser("release", help="the student distribution (no solutions, mark schemes, hidden tests, mutants)")
    r.add_argument("dest", type=Path, help="a new, empty folder")
    d = sub.add_parser("diagnose", help="grade every mutant; write autograder/LESSON/diagnosis.json (instructor)")
    d.add_argument("lessons", nargs="*", help="lesson ids (default: every lesson)")
    d.add_argument("--build", action="store_true", required=True, help="(re)build the misconception tables")
    d.add_argument("--hints-only", action="store_true", help="keep the signatures, rewrite only the hint texts")
    n = sub.add_parser("new", help="scaffold a lesson from lesson 1 (source, package, vLLM view), ids renamed (instructor)")
    n.add_argument("lesson", help="the new lesson's id, e.g. lesson13")
    n.add_argument("--title", required=True, help="its title (Chinese, as the other lessons')")
    v = sub.add_parser("verify", help="one lesson end to end: build, diagnosis, reference full and blank 0, release, "
                                      "its tests and nbgrader flow (instructor)")
    v.add_argument("lesson", help="lesson id, e.g. lesson01")
    args = ap.parse_args(argv)

    if args.cmd == "build":
        from autograder.build import build

        stale = build(check=args.check, lessons=args.lessons or None)
        verb = "stale" if args.check else "written"
        for rel in stale:
            print(f"{verb}: {rel}")
        if args.check and stale:
            print("notebooks are stale: run `python -m autograder build`", file=sys.stderr)
            return 1
        if not stale:
            print("up to date")
        return 0
    if args.cmd == "check":
        from autograder.common import find_notebook, self_check

        return 0 if self_check(args.lesson, notebook=find_notebook(args.lesson, args.notebook)) else 1
    if args.cmd == "grade":
        from autograder.grading import grade
        from autograder.sandbox import GraderBroken

        try:
            if args.scheduler or args.cluster:
                from autograder.cluster import connect

                with connect(args.scheduler or args.cluster) as cluster:
                    grade(args.submissions, args.course.resolve(), args.csv, args.lesson, cluster=cluster)
            else:
                grade(args.submissions, args.course.resolve(), args.csv, args.lesson, jobs=args.jobs)
        except GraderBroken as e:
            print(f"grade refused: {e}", file=sys.stderr)
            return 3
        return 0
    if args.cmd == "worker":
        from autograder.cluster import start_worker

        start_worker(args.scheduler, args.name)
        return 0
    if args.cmd == "feedback":
        from autograder.grading import feedback

        return 0 if feedback(args.course.resolve(), args.lesson) else 1
    if args.cmd == "release":
        from autograder.release import release

        written = release(args.dest)
        size = sum((args.dest / p).stat().st_size for p in written)
        print(f"{len(written)} files, {size / 2**20:.1f} MiB in {args.dest}")
        return 0
    if args.cmd == "diagnose":
        from autograder.common import discover_lessons
        from autograder.diagnosis import build

        lessons = args.lessons or discover_lessons()
        if len(lessons) > 1:  # one process per lesson, as a student's kernel (lesson 6 sets up Triton first)
            flags = ["--hints-only"] if args.hints_only else []
            return max(subprocess.run([sys.executable, "-m", "autograder", "diagnose", "--build", *flags, lesson_id]
                                      ).returncode for lesson_id in lessons)
        print(f"written: {build(lessons[0], only_hints=args.hints_only)}", flush=True)
        return 0
    if args.cmd == "new":
        from autograder.scaffold import new_lesson

        for rel in new_lesson(args.lesson, args.title):
            print(f"written: {rel}")
        print(f"next: fill them, then `python -m autograder verify {args.lesson}`")
        return 0
    if args.cmd == "verify":
        from autograder.verify import verify

        return verify(args.lesson)
    return 2


if __name__ == "__main__":
    sys.exit(main())
