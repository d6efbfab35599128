"""Per-lesson reading load of the student notebooks: markdown characters, longest paragraph, reading time.

    python -m autograder.stats            # the table, from notebooks/lessonNN/lessonNN.ipynb
    python -m autograder.stats --run      # also each solution notebook's code-cell run time (nbclient)

The budget (shared/COURSE.md): at most 11,000 markdown characters a notebook and 250 characters a paragraph.
A paragraph is a run of markdown lines between blank lines, without tables, code fences and headings (a table
row or a list item is its own paragraph). Reading time assumes 300 Chinese characters a minute for prose.
"""
from __future__ import annotations

import argparse
import re
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from autograder.common import NOTEBOOKS, SOLUTIONS, discover_lessons

MAX_MARKDOWN_CHARS = 11_000
MAX_PARAGRAPH_CHARS = 250
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


@dataclass
class LessonStats:
    lesson: str
    markdown_chars: int
    longest_paragraph: int
    longest_text: str
    run_seconds: float | None = None

    @property
    def reading_minutes(self) -> float:
        return self.markdown_chars / CHARS_PER_MINUTE

    @property
    def within_budget(self) -> bool:
        return self.markdown_chars <= MAX_MARKDOWN_CHARS and self.longest_paragraph <= MAX_PARAGRAPH_CHARS


def lesson_stats(lesson_id: str, notebook: Path | None = None) -> LessonStats:
    nb = nbformat.read(notebook or NOTEBOOKS / lesson_id / f"{lesson_id}.ipynb", as_version=4)
    texts = [c.source for c in nb.cells if c.cell_type == "markdown"]
    paras = [p for t in texts for p in paragraphs(t)]
    longest = max(paras, key=len, default="")
    return LessonStats(lesson_id, sum(len(t) for t in texts), len(longest), longest)


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
    print(f"{'lesson':9} {'md chars':>8} {'longest ¶':>9} {'read min':>8} {'run s':>7}  budget")
    for s in rows:
        run = f"{s.run_seconds:7.1f}" if s.run_seconds is not None else f"{'-':>7}"
        print(f"{s.lesson:9} {s.markdown_chars:8,} {s.longest_paragraph:9} {s.reading_minutes:8.0f} {run}  "
              f"{'ok' if s.within_budget else 'OVER'}")
        if args.show_longest:
            print(f"    longest: {s.longest_text[:300]}")
    print(f"budget: <= {MAX_MARKDOWN_CHARS:,} markdown characters, <= {MAX_PARAGRAPH_CHARS} a paragraph; "
          f"reading at {CHARS_PER_MINUTE} characters a minute")
    return 0 if all(s.within_budget for s in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
