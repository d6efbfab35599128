"""Misconception diagnosis accuracy (issue #30): grades every mutant of the given lessons afresh and diagnoses it.

    python benchmarks/diagnosis_accuracy.py [LESSON ...]     (default: every lesson; lesson03/lesson10 are slow)

Prints, per lesson and in total:
  named      mutants whose every failing part is diagnosed as that mutant (or one with an identical signature),
             with the committed table (goal >= 95%)
  solution   the solution has no failing part, so it never gets a diagnosis
  held-out   a table built from half the mutants (sorted names, even positions), the other half diagnosed:
             no held-out mutant passes every part (no wrong answer reported as correct), and the share of
             their failing parts diagnosed "not a known mistake"
  cost       time to diagnose every failing part vs the time to grade the mutants
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autograder import diagnosis  # noqa: E402
from autograder.common import discover_lessons  # noqa: E402
from autograder.mutation import filled_notebook, mutant_notebook, mutants  # noqa: E402


def lesson_figures(lesson_id: str) -> dict:
    salt = diagnosis.table(lesson_id)["salt"]
    t0 = time.perf_counter()
    failing = {n: diagnosis.failing_messages(lesson_id, mutant_notebook(lesson_id, n)) for n in sorted(mutants(lesson_id))}
    grade_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    named = [n for n, got in failing.items() if got and all(
        diagnosis.hint_id(salt, n) in diagnosis.lookup(lesson_id, g, m) for g, m in got.items())]
    lines = [diagnosis.diagnose(lesson_id, g, m) for got in failing.values() for g, m in got.items()]
    diag_s = time.perf_counter() - t0
    solution = diagnosis.failing_messages(lesson_id, filled_notebook(lesson_id))
    names = sorted(failing)
    train, test = names[0::2], names[1::2]
    known = {(g, diagnosis.signature(salt, g, m)) for n in train for g, m in failing[n].items()}
    held = [(g, diagnosis.signature(salt, g, m)) for n in test for g, m in failing[n].items()]
    return {"mutants": len(names), "named": len(named), "missed": sorted(set(names) - set(named)),
            "solution_diagnosed": bool(solution), "held_out": len(test),
            "held_out_passing": sum(1 for n in test if not failing[n]), "held_parts": len(held),
            "held_unknown": sum(1 for x in held if x not in known), "grade_s": grade_s, "diag_s": diag_s,
            "lines": len(lines)}


def figures_in_a_fresh_process(lesson_id: str) -> dict:
    """One lesson per process, as a student's kernel (lesson 6's setup sets up Triton before it is imported)."""
    out = subprocess.run([sys.executable, __file__, "--one", lesson_id], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> None:
    if argv[:1] == ["--one"]:
        print(json.dumps(lesson_figures(argv[1])))
        return
    total: dict = {}
    for lesson_id in argv or discover_lessons():
        f = figures_in_a_fresh_process(lesson_id)
        print(f"{lesson_id}: named {f['named']}/{f['mutants']}{' missed ' + ','.join(f['missed']) if f['missed'] else ''}"
              f"; solution diagnosed: {f['solution_diagnosed']}; held-out {f['held_out']} mutants: "
              f"{f['held_out_passing']} reported correct, {f['held_unknown']}/{f['held_parts']} failing parts "
              f"'not a known mistake'; diagnosis {f['diag_s'] * 1e3:.1f} ms vs grading {f['grade_s']:.1f} s", flush=True)
        for k, v in f.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                total[k] = total.get(k, 0) + v
        total["solution_diagnosed"] = total.get("solution_diagnosed", False) or f["solution_diagnosed"]
    print(f"TOTAL: named {total['named']}/{total['mutants']} ({100 * total['named'] / total['mutants']:.1f}%); "
          f"solution ever diagnosed: {total['solution_diagnosed']}; held-out: {total['held_out_passing']}/"
          f"{total['held_out']} reported correct, {total['held_unknown']}/{total['held_parts']} failing parts "
          f"({100 * total['held_unknown'] / max(1, total['held_parts']):.1f}%) 'not a known mistake'; "
          f"diagnosis {total['diag_s'] * 1e3:.1f} ms for {total['lines']} parts vs grading {total['grade_s']:.1f} s "
          f"({100 * total['diag_s'] / total['grade_s']:.3f}%)")


if __name__ == "__main__":
    main(sys.argv[1:])
