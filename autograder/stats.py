"""Per-lesson reading load of the student notebooks: markdown characters, longest paragraph, reading time.

    python -m autograder.stats            # the table, from notebooks/lessonNN/lessonNN.ipynb
    python -m autograder.stats --run      # also each solution notebook's code-cell run time (nbclient)

A lesson is a core path (what every student reads, runs and answers) and an optional appendix that starts at the
heading `## 附录（选读）` after the grading rules (autograder/build.py makes it start collapsed in JupyterLab).
The budget: at most 7,000 markdown characters in the core path, 4,000 in the appendix and 200 in a paragraph.
A lesson not yet split into the two is held to the earlier single budget (11,000 characters, 250 a paragraph) and
listed as such. A paragraph is a run of markdown lines between blank lines, without tables, code fences and
headings (a table row or a list item is its own paragraph). Reading time assumes 300 Chinese characters a minute.
"""
from __future__ import annotations

import argparse
import re
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from autograder.common import NOTEBOOKS, SOLUTIONS, discover_lessons

APPENDIX_HEADING = "## 附录（选读）"
MAX_CORE_CHARS = 7_000
MAX_APPENDIX_CHARS = 4_000
MAX_PARAGRAPH_CHARS = 200
UNSPLIT_MAX_CHARS, UNSPLIT_MAX_PARAGRAPH = 11_000, 250  # a lesson without an appendix yet
CHARS_PER_MINUTE = 300
_FENCE = re.compile(r"^\s*(```|~~~)")
_ITEM = re.compile(r"^\s*([-*+]|\d+[.)])\s+")


def paragraphs(markdown: str) -> list[str]:
    """Prose paragraphs of one markdown cell: fenced code, headings and images left out; each list item and
    each table row stands alone (a table row's length is the row's, cells joined)."""
    out: list[str] = []
    current: list[str] = []
    in_fence = False

    def flush() -> None:
        if current:
            out.append(" ".join(s.strip() for s in current))
            current.clear()

    for line in markdown.splitlines():
        if _FENCE.match(line):
            flush()
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or stripped.startswith("!["):
            flush()
        elif stripped.startswith("|"):
            flush()
            if not set(stripped) <= set("|-: "):
                out.append(stripped)
        elif _ITEM.match(line):
            flush()
            current.append(stripped)
        else:
            current.append(stripped)
    flush()
    return out


def appendix_start(cells) -> int | None:
    """Index of the appendix's heading cell (a markdown cell whose first line is APPENDIX_HEADING), else None."""
    found = [i for i, c in enumerate(cells)
             if c.cell_type == "markdown" and c.source.split("\n", 1)[0].strip() == APPENDIX_HEADING]
    if len(found) > 1:
        raise ValueError(f"{len(found)} appendix headings `{APPENDIX_HEADING}`; a lesson has one")
    return found[0] if found else None


@dataclass
class LessonStats:
    lesson: str
    core_chars: int
    appendix_chars: int | None  # None: the lesson has no appendix yet
    longest_paragraph: int
    longest_text: str
    run_seconds: float | None = None

    @property
    def markdown_chars(self) -> int:
        return self.core_chars + (self.appendix_chars or 0)

    @property
    def split(self) -> bool:
        return self.appendix_chars is not None

    @property
    def core_reading_minutes(self) -> float:
        """The core path's prose at CHARS_PER_MINUTE (without its code, the exercise or the questions)."""
        return self.core_chars / CHARS_PER_MINUTE

    @property
    def over(self) -> list[str]:
        """What breaks the budget, one phrase each (empty: within it)."""
        if not self.split:
            limits = [("markdown", self.markdown_chars, UNSPLIT_MAX_CHARS),
                      ("paragraph", self.longest_paragraph, UNSPLIT_MAX_PARAGRAPH)]
        else:
            limits = [("core", self.core_chars, MAX_CORE_CHARS), ("appendix", self.appendix_chars, MAX_APPENDIX_CHARS),
                      ("paragraph", self.longest_paragraph, MAX_PARAGRAPH_CHARS)]
        return [f"{name} {got:,} > {limit:,}" for name, got, limit in limits if got > limit]

    @property
    def within_budget(self) -> bool:
        return not self.over


def lesson_stats(lesson_id: str, notebook: Path | None = None) -> LessonStats:
    nb = nbformat.read(notebook or NOTEBOOKS / lesson_id / f"{lesson_id}.ipynb", as_version=4)
    start = appendix_start(nb.cells)
    cut = len(nb.cells) if start is None else start
    core = [c.source for c in nb.cells[:cut] if c.cell_type == "markdown"]
    appendix = [c.source for c in nb.cells[cut:] if c.cell_type == "markdown"]
    paras = [p for t in core + appendix for p in paragraphs(t)]
    longest = max(paras, key=len, default="")
    return LessonStats(lesson_id, sum(map(len, core)), None if start is None else sum(map(len, appendix)),
                       len(longest), longest)


def run_seconds(lesson_id: str, timeout: int = 900) -> float:
    """Wall time of every code cell of the solution notebook, run top to bottom in a fresh kernel."""
    from nbclient import NotebookClient

    path = SOLUTIONS / lesson_id / f"{lesson_id}.ipynb"
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
                   ).execute()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m autograder.stats", description=__doc__.splitlines()[0])
    ap.add_argument("lessons", nargs="*", help="lesson ids (default: every lesson)")
    ap.add_argument("--run", action="store_true", help="also run each solution notebook and time it")
    ap.add_argument("--show-longest", action="store_true", help="print each lesson's longest paragraph")
    args = ap.parse_args(argv)
    rows = []
    for lesson_id in args.lessons or discover_lessons():
        s = lesson_stats(lesson_id)
        if args.run:
            s.run_seconds = run_seconds(lesson_id)
        rows.append(s)
    print(f"{'lesson':9} {'core':>6} {'appendix':>8} {'longest ¶':>9} {'core read min':>13} {'run s':>7}  budget")
    for s in rows:
        run = f"{s.run_seconds:7.1f}" if s.run_seconds is not None else f"{'-':>7}"
        appendix = f"{s.appendix_chars:8,}" if s.split else f"{'(none)':>8}"
        verdict = ("OVER: " + ", ".join(s.over)) if s.over else ("ok" if s.split else "ok (not split yet)")
        print(f"{s.lesson:9} {s.core_chars:6,} {appendix} {s.longest_paragraph:9} {s.core_reading_minutes:13.0f} "
              f"{run}  {verdict}")
        if args.show_longest:
            print(f"    longest: {s.longest_text[:300]}")
    print(f"budget: core path <= {MAX_CORE_CHARS:,} markdown characters, appendix (from `{APPENDIX_HEADING}`) <= "
          f"{MAX_APPENDIX_CHARS:,}, <= {MAX_PARAGRAPH_CHARS} a paragraph (a lesson not split yet: <= "
          f"{UNSPLIT_MAX_CHARS:,} and {UNSPLIT_MAX_PARAGRAPH}); reading at {CHARS_PER_MINUTE} characters a minute")
    return 0 if all(s.within_budget for s in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
