"""BlankSolutions: nbgrader's ClearSolutions, plus one-line blanks written as the seed shows them.

In solutions/, a line that ends with ``### BLANK`` is a blank:

    plan = schedule()              ### BLANK   ->   plan = ______
    process_aborts()               ### BLANK   ->   ______
    "plan": "scheduler.schedule",  ### BLANK   ->   "plan": ______,

An assignment keeps its target, a dict entry keeps its key, anything else becomes a bare ``______``.
``### BEGIN SOLUTION`` / ``### END SOLUTION`` regions still work as in nbgrader.
"""
from __future__ import annotations

import re

from nbgrader.preprocessors import ClearSolutions
from traitlets import Unicode

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
