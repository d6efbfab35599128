"""Every student notebook within the course's reading budget (shared/COURSE.md): at most 11,000 markdown
characters, no paragraph over 250, and no trace of how the course was written."""
import re

import nbformat
import pytest

from autograder.common import NOTEBOOKS, discover_lessons
from autograder.stats import MAX_MARKDOWN_CHARS, MAX_PARAGRAPH_CHARS, lesson_stats, main, paragraphs

HISTORY = re.compile(r"本课早先的版本|更正（复核|复核时|正由另一项工作|早先的版本")


@pytest.mark.parametrize("lesson_id", discover_lessons())
def test_student_notebook_within_budget(lesson_id):
    s = lesson_stats(lesson_id)
    assert s.markdown_chars <= MAX_MARKDOWN_CHARS, f"{lesson_id}: {s.markdown_chars:,} markdown characters"
    assert s.longest_paragraph <= MAX_PARAGRAPH_CHARS, f"{lesson_id}: a paragraph of {s.longest_paragraph}: {s.longest_text[:120]}"


@pytest.mark.parametrize("lesson_id", discover_lessons())
def test_no_history_of_the_course(lesson_id):
    nb = nbformat.read(NOTEBOOKS / lesson_id / f"{lesson_id}.ipynb", as_version=4)
    found = [m.group(0) for c in nb.cells if c.cell_type == "markdown" for m in HISTORY.finditer(c.source)]
    assert not found, f"{lesson_id}: {found}"


def test_paragraphs_split_as_a_reader_sees_them():
    md = "# 标题\n\n第一段\n接着第一段\n\n- 一项\n- 二项\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n```python\nx = 1\n```\n"
    assert paragraphs(md) == ["第一段 接着第一段", "- 一项", "- 二项", "| a | b |", "| 1 | 2 |"]


def test_the_stats_command_fails_a_lesson_over_budget(monkeypatch, capsys):
    import autograder.stats as stats

    monkeypatch.setattr(stats, "MAX_MARKDOWN_CHARS", 100)
    assert main(["lesson01"]) == 1
    assert "OVER" in capsys.readouterr().out
    monkeypatch.undo()
    assert main(["lesson01"]) == 0
