"""`python -m autograder grade -j N`: N students at once vs one at a time, on lesson 2 submissions.

    python benchmarks/grade_parallel.py [--submissions 24] [--jobs 2] [--pairs 3]

The submissions cycle through the solution, the unfilled release and every lesson-2 mutant (built from the
release by autograder.mutation). After a warm-up of each side on the first two submissions (imports, disk
cache), the sides alternate (-j 1, -j N, -j 1, ...)
for --pairs pairs in fresh course folders; the script prints each run with where its time went (per
submission: nbgrader's execution and the sandbox's re-grade, which run side by side; the serialized gradebook
merge and grader re-hash; the rest is the release into the gradebook and the export), the medians, the ratio
and submissions per minute. `--pairs 0` grades the class once, with -j N only (a quicker look at the phases).
Not a test: run it on an otherwise idle machine (each student is one nbgrader kernel plus one sandbox process,
so -j N wants N free cores).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import tempfile
import time
from pathlib import Path

from autograder.mutation import filled_notebook, mutant_notebook, mutants

LESSON = "lesson02"


def make_submissions(root: Path, n: int) -> Path:
    kinds = ["solution", "blank", *sorted(mutants(LESSON))]
    for i in range(n):
        kind = kinds[i % len(kinds)]
        if kind == "solution":
            nb = filled_notebook(LESSON)
        elif kind == "blank":
            nb = json.loads((Path(__file__).resolve().parent.parent / f"notebooks/{LESSON}/{LESSON}.ipynb").read_text())
        else:
            nb = mutant_notebook(LESSON, kind)
        dest = root / f"s{i:02d}_{kind}" / LESSON
        dest.mkdir(parents=True)
        (dest / f"{LESSON}.ipynb").write_text(json.dumps(nb, ensure_ascii=False), encoding="utf-8")
    return root


def phases(total: float, jobs: int, n: int) -> str:
    """autograder.grading.PHASES of the last run: mean seconds per submission, and the serial rest."""
    from autograder.grading import PHASES

    sums: dict[str, float] = {}
    for name, sec in PHASES:
        sums[name] = sums.get(name, 0.0) + sec
    per = ", ".join(f"{name} {sec / n:.1f}" for name, sec in sums.items())
    serial = sums.get("gradebook merge", 0.0) + sums.get("grader files re-hashed", 0.0)
    workers = max(sums.get("nbgrader execution", 0.0), sums.get("sandbox re-grade", 0.0))
    return (f"  per submission (s): {per}; release + export + rest of the run ≈ "
            f"{max(0.0, total - serial - workers / jobs):.0f} s")


def run(subs: Path, jobs: int) -> float:
    from autograder.grading import PHASES, grade

    PHASES.clear()
    with tempfile.TemporaryDirectory(prefix="grade-bench-") as tmp:
        t = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            grade(subs, Path(tmp) / "course", Path(tmp) / "grades.csv", [LESSON], jobs=jobs)
        total = time.perf_counter() - t
    n = sum(1 for _ in subs.iterdir())
    print(f"-j {jobs}, {n} submissions: {total:.0f} s ({n / total * 60:.1f} submissions/min)\n"
          + phases(total, jobs, n), flush=True)
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--submissions", type=int, default=24)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="grade-bench-subs-") as tmp:
        warm = make_submissions(Path(tmp) / "warm-up", 2)
        subs = make_submissions(Path(tmp) / "class", args.submissions)
        print("warm-up (2 submissions):", flush=True)
        if args.pairs:
            run(warm, 1)
        run(warm, args.jobs)
        if args.pairs == 0:
            run(subs, args.jobs)
            return
        one, many = [], []
        for k in range(args.pairs):
            one.append(run(subs, 1))
            many.append(run(subs, args.jobs))
            print(f"pair {k + 1}: -j 1 {one[-1]:.0f} s, -j {args.jobs} {many[-1]:.0f} s", flush=True)
    m1, mn = statistics.median(one), statistics.median(many)
    n = args.submissions
    print(f"median -j 1 {m1:.0f} s ({n / m1 * 60:.1f} submissions/min), -j {args.jobs} {mn:.0f} s "
          f"({n / mn * 60:.1f} submissions/min); ratio -j 1 / -j {args.jobs} = {m1 / mn:.2f}")


if __name__ == "__main__":
    main()
