"""BlankSolutions: nbgrader's ClearSolutions, plus one-line blanks written as the seed shows them.

In solutions/, a line that ends with ``### BLANK`` is a blank:

    plan = schedule()              ### BLANK   ->   plan = ______
    process_aborts()               ### BLANK   ->   ______
    "plan": "scheduler.schedule",  ### BLANK   ->   "plan": ______,

An assignment keeps its target, a dict entry keeps its key, anything else becomes a bare ``______``.
``### BEGIN SOLUTION`` / ``### END SOLUTION`` regions still work as in nbgrader.

SkipUngradedCells: at autograde, the release's code cells that nbgrader does not grade (demos, figures, the
"检查方法" explorations, the install and self-check cells) are not executed.
"""
from __future__ import annotations

import re

from nbformat import NotebookNode
from nbformat.v4 import new_output
from nbgrader.preprocessors import ClearSolutions, NbGraderPreprocessor
from traitlets import Unicode

UNGRADED_TAG = "minivllm-not-graded"  # nbgrader's Execute skips cells with this tag (Execute.skip_cells_with_tag)
NOT_RUN = "（评分时未运行：这个单元格不计分；评分只运行准备单元格、答案单元格、评分单元格和你添加的单元格。）\n"

BLANK = "______"
_ASSIGN = re.compile(r"^(\s*[A-Za-z_][\w.\[\]\"', ]*?\s*(?:[-+*/]?=)(?!=)\s*)(.+?)\s*$")
_DICT_ENTRY = re.compile(r"^(\s*(?:\"[^\"]*\"|'[^']*')\s*:\s*)(.+?)(,?)\s*$")


def blank_line(line: str, marker: str = "### BLANK") -> str | None:
    """The student's version of one marked line, or None when the line carries no marker."""
    if marker not in line:
        return None
    code = line.split(marker, 1)[0].rstrip()
    if code.endswith("#"):
        code = code[:-1].rstrip()
    m = _DICT_ENTRY.match(code)
    if m:
        return f"{m.group(1)}{BLANK}{m.group(3)}"
    m = _ASSIGN.match(code)
    if m and "(" not in m.group(1):
        return f"{m.group(1)}{BLANK}"
    indent = re.match(r"\s*", code).group(0)
    return indent + BLANK


def blank_source(source: str, marker: str = "### BLANK") -> tuple[str, bool]:
    lines, changed = [], False
    for line in source.split("\n"):
        new = blank_line(line, marker)
        changed |= new is not None
        lines.append(line if new is None else new)
    return "\n".join(lines), changed


class BlankSolutions(ClearSolutions):
    """ClearSolutions that also turns ``### BLANK`` lines into ``______`` blanks."""

    blank_marker = Unicode("### BLANK", help="End-of-line marker of a one-line blank").tag(config=True)

    def _replace_solution_region(self, cell, language) -> bool:
        cell.source, blanked = blank_source(cell.source, self.blank_marker)
        return super()._replace_solution_region(cell, language) or blanked


class SkipUngradedCells(NbGraderPreprocessor):
    """Tag the submission's copies of the release's ungraded code cells so Execute skips them (#33).

    They are most of a notebook's run (lesson 2: 11 of 15 s; lesson 12: 33 of 40 s) and no score reads them:
    the grade cells use only the setup and answer cells (tests/test_autograder.py checks that statically), and
    the sandbox never runs them. Cells are found by the release's cell ids; a cell the student added still
    runs, and a tag the student set on any other cell is removed. A skipped cell's output says it was not run.
    """

    def preprocess(self, nb: NotebookNode, resources: dict) -> tuple[NotebookNode, dict]:
        from autograder.common import NOTEBOOKS, read_notebook

        lesson_id = resources.get("nbgrader", {}).get("notebook", "")
        release = NOTEBOOKS / lesson_id / f"{lesson_id}.ipynb"
        ungraded = set()
        if lesson_id and release.is_file():  # an instructor's own assignment: everything runs
            ungraded = {c["id"] for c in read_notebook(release).cells
                        if c["cell_type"] == "code" and "nbgrader" not in c.get("metadata", {})}
        for cell in nb.cells:
            tags = [t for t in cell.metadata.get("tags", []) if t != UNGRADED_TAG]
            skip = cell.cell_type == "code" and cell.get("id") in ungraded and "nbgrader" not in cell.metadata
            if skip:
                tags.append(UNGRADED_TAG)
                cell.outputs = [new_output("stream", name="stdout", text=NOT_RUN)]
                cell.execution_count = None
            if tags or "tags" in cell.metadata:
                cell.metadata["tags"] = tags
        return nb, resources
