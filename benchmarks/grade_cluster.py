"""`grade --cluster local:2` (Dask's distributed scheduler, 2 worker processes) vs `grade -j 2`, on lesson 2.

    python benchmarks/grade_cluster.py [--submissions 24] [--workers 2] [--pairs 3] [--warmup 1]

The same submissions as benchmarks/grade_parallel.py (the solution, the release, every lesson-2 mutant). The sides
alternate (-j N, cluster, -j N, ...), each round in a fresh course folder; the cluster side starts a fresh
LocalCluster each round (its start-up is timed apart, not in the side's time), so each worker runs the lesson's
canary once, as a real run does. Printed: each side's median (min-max) seconds, the per-pair ratio cluster / local,
the scheduler's overhead per task ((cluster - local) / submissions, per pair: it also holds the second worker's
canary and its process's first imports, so it is an upper bound), the mean seconds of one submission's grading
on a worker, and the throughput model for W workers in README.
Not a test: run it on an otherwise idle machine (N free cores).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_bench_args, environment_line, interleave, ratio, spread, write_json  # noqa: E402
from grade_parallel import LESSON, make_submissions  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--submissions", type=int, default=24)
    ap.add_argument("--workers", type=int, default=2, help="-j N locally, N Dask workers")
    add_bench_args(ap)
    args = ap.parse_args()
    from autograder.cluster import connect
    from autograder.grading import grade

    startups: list[float] = []
    task_seconds: list[float] = []
    canaries: list[float] = []

    def run(subs: Path, cluster=None) -> float:
        with tempfile.TemporaryDirectory(prefix="grade-bench-") as tmp, contextlib.redirect_stdout(io.StringIO()):
            t = time.perf_counter()
            grade(subs, Path(tmp) / "course", Path(tmp) / "grades.csv", [LESSON], jobs=args.workers,
                  cluster=cluster)
            return time.perf_counter() - t

    def local(subs: Path) -> float:
        return run(subs)

    def on_dask(subs: Path) -> float:
        from autograder.grading import PHASES

        t = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), connect(f"local:{args.workers}") as cluster:
            startups.append(time.perf_counter() - t)
            del PHASES[:]
            took = run(subs, cluster)
            task_seconds.extend(cluster.task_seconds)
            canaries.extend(sec for name, sec in PHASES if name == "canary")
        return took

    print(environment_line(), flush=True)
    with tempfile.TemporaryDirectory(prefix="grade-bench-subs-") as tmp:
        subs = make_submissions(Path(tmp) / "class", args.submissions)
        n = args.submissions

        def show(i: int, got: dict[str, float]) -> None:
            print(f"pair {i + 1}: -j {args.workers} {got['local']:.0f} s, local:{args.workers} {got['dask']:.0f} s "
                  f"({(got['dask'] - got['local']) / n:+.2f} s/task)", flush=True)

        times = interleave({"local": lambda: local(subs), "dask": lambda: on_dask(subs)}, args.pairs, args.warmup,
                           on_round=show)
    r = ratio(f"cluster local:{args.workers} / -j {args.workers}", times["dask"], times["local"],
              f"grade -j {args.workers} on the same {n} lesson-2 submissions (goal: about 1)")
    overhead = [(d - lo) / n for d, lo in zip(times["dask"], times["local"], strict=True)]
    task = statistics.mean(task_seconds) if task_seconds else float("nan")
    canary = statistics.median(canaries) if canaries else float("nan")
    print(f"-j {args.workers}: {spread(times['local'])} s; local:{args.workers}: {spread(times['dask'])} s "
          f"(+ cluster start-up {spread(startups)} s, not counted)")
    print(r.line())
    print(f"scheduler overhead per task, (cluster - local) / submissions: median {statistics.median(overhead):+.2f} s (min {min(overhead):+.2f}, "
          f"max {max(overhead):+.2f}), the second worker's canary included")
    print(f"one submission's grading on a worker: mean {task:.1f} s over {len(task_seconds)} tasks; a worker's canary "
          f"(once per lesson): median {canary:.1f} s")
    per = task + max(0.0, statistics.median(overhead))
    print(f"model: W workers grade ≈ 60·W / {per:.1f} submissions/min, plus one canary per worker and lesson; "
          f"6,000 submissions on W = 50 ≈ {6000 * per / 50 / 3600:.1f} h + 12 × {canary:.0f} s")
    write_json(args.json_out, "grade_cluster", [r], {"task_s": task, "canary_s": canary, "overhead_s": overhead,
                                                    "startup_s": startups})


if __name__ == "__main__":
    main()
