"""Mutants as data: a wrong answer is a few edits of the solution's exercise cell, named by its misconception.

Each autograder/lessonNN/mutants.py defines ``MUTANTS = {name: Mutant(cell, edits, why, fails, hint)}``. An edit is
``(old, new)``: ``old`` occurs exactly once in the solution cell (``### BLANK`` markers removed) and is
replaced by ``new``. ``mutant_notebook`` builds the whole wrong submission from the student release, so a
test grades exactly what a student with that misconception would hand in.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

from autograder.common import REPO, ______, cell_source, exec_source, nbgrader_meta, read_notebook


@dataclass(frozen=True)
class Mutant:
    cell: str                               # grade_id of the exercise cell it changes
    edits: tuple[tuple[str, str], ...]      # (solution text, wrong text), each solution text unique in the cell
    why: str                                # the misconception, one line
    fails: frozenset[str] | set[str] = frozenset()  # grade ids it must fail (it may fail more)
    hint: str = ""                          # what to reconsider (Simplified Chinese, never the fix); shipped


def mutants(lesson_id: str) -> dict[str, Mutant]:
    return importlib.import_module(f"autograder.{lesson_id}.mutants").MUTANTS


def solution_cells(lesson_id: str) -> dict[str, str]:
    """Code answer cells of the instructor's notebook (grade_id -> source), ``### BLANK`` markers removed (the
    written answers of Q1–Q3 are answer cells too, left as released)."""
    nb = read_notebook(REPO / "solutions" / lesson_id / f"{lesson_id}.ipynb")
    return {c["id"]: cell_source(c).replace("  ### BLANK", "") for c in nb.cells
            if nbgrader_meta(c).get("solution") and c["cell_type"] == "code"}


def apply(source: str, mutant: Mutant) -> str:
    """Every edit located in the solution first, then applied back to front (edits never see each other)."""
    spans = []
    for old, new in mutant.edits:
        if source.count(old) != 1:
            raise ValueError(f"mutant edit does not match the solution cell {mutant.cell} exactly once: {old!r}")
        spans.append((source.index(old), len(old), new))
    for start, length, new in sorted(spans, reverse=True):
        source = source[:start] + new + source[start + length:]
    return source


def mutant_source(lesson_id: str, name: str) -> str:
    m = mutants(lesson_id)[name]
    return apply(solution_cells(lesson_id)[m.cell], m)


def filled_notebook(lesson_id: str, replace: dict[str, str] | None = None) -> dict:
    """The student release with every answer cell filled from the solution, then `replace` (id -> source)."""
    nb = read_notebook(REPO / "notebooks" / lesson_id / f"{lesson_id}.ipynb")
    answers = dict(solution_cells(lesson_id), **(replace or {}))
    for cell in nb["cells"]:
        if cell["id"] in answers:
            cell["source"] = answers[cell["id"]]
    return nb


def mutant_notebook(lesson_id: str, name: str) -> dict:
    m = mutants(lesson_id)[name]
    return filled_notebook(lesson_id, {m.cell: mutant_source(lesson_id, name)})


def mutant_namespace(lesson_id: str, name: str) -> dict:
    """The names the mutant's cell defines (its functions, its imports)."""
    ns: dict = {"______": ______}
    exec_source(mutant_source(lesson_id, name), ns, f"<mutant {lesson_id}:{name}>")
    return ns
