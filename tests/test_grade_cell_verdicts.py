"""A grade cell's ✓ means its part passes (#51 item 5), and an unfilled blank reads the same in every cell.

In a student's kernel a grade cell holds only its visible asserts; `short_errors` appends the part's complete check
(the one the report cell, the self-check and the sandbox run), so a wrong answer that passes the visible asserts
fails the cell. Under `grade` the cell says in its first line that it ran only the visible asserts, never a ✓."""
import json
import re

import pytest

from autograder.common import BLANK_HEAD, NOTEBOOKS, PASSED_FULL, PASSED_VISIBLE, REPO, discover_lessons
from autograder.mutation import mutant_source

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def cells(path) -> dict[str, str]:
    return {c["id"]: "".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]}


def notebook(lesson_id: str, kind: str = "release") -> list[dict]:
    path = (NOTEBOOKS if kind == "release" else REPO / "solutions") / lesson_id / f"{lesson_id}.ipynb"
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


@pytest.fixture
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    from autograder import common

    common._PASSED.clear()
    sh = InteractiveShell.instance()
    yield sh
    InteractiveShell.clear_instance()
    common._PASSED.clear()


def out(capsys) -> list[str]:
    return [ANSI.sub("", x) for x in capsys.readouterr().out.strip().splitlines()]


def test_a_wrong_answer_that_passes_the_visible_asserts_fails_its_grade_cell(shell, capsys, monkeypatch):
    """lesson07's `multiply_by_noise` (argmax p·q) passes all three visible grade cells; only the chi-square test of
    the complete main-path check rejects it. Its grade cell must fail, never print a bare ✓."""
    monkeypatch.delenv("MINIVLLM_GRADING", raising=False)
    release = cells(NOTEBOOKS / "lesson07" / "lesson07.ipynb")
    assert shell.run_cell(release["l07_setup"]).success
    assert shell.run_cell(mutant_source("lesson07", "multiply_by_noise")).success
    capsys.readouterr()
    result = shell.run_cell(release["l07_main_path"])
    lines = out(capsys)
    assert not result.success, lines
    assert not any(x.startswith("✓") for x in lines), lines
    assert "l07_main_path" in lines[-3] and "未通过" in lines[-3], lines
    # the boundary cell's part passes for this mutant: its ✓ is the complete check's
    result = shell.run_cell(release["l07_boundary"])
    assert result.success and out(capsys)[-1] == f"✓ 边界条件：{PASSED_FULL}"


def test_under_grade_a_visible_only_cell_says_so_first(shell, capsys, monkeypatch):
    monkeypatch.setenv("MINIVLLM_GRADING", "1")
    release = cells(NOTEBOOKS / "lesson07" / "lesson07.ipynb")
    assert shell.run_cell(release["l07_setup"]).success
    assert shell.run_cell(mutant_source("lesson07", "multiply_by_noise")).success
    capsys.readouterr()
    assert shell.run_cell(release["l07_main_path"]).success  # the visible asserts hold; the sandbox scores 0
    lines = out(capsys)
    assert lines[-1].endswith(PASSED_VISIBLE) and not lines[-1].startswith("✓"), lines
    assert "只运行了可见断言" in lines[-1]


def test_the_report_cells_pass_is_reused_not_rerun(shell, capsys, monkeypatch):
    """Run All: the report cell right after the exercise runs every complete check once; the grade cells after it
    reuse a pass on the same answers, and run the check again once an answer is redefined."""
    from autograder import common

    monkeypatch.delenv("MINIVLLM_GRADING", raising=False)
    solution = cells(REPO / "solutions" / "lesson07" / "lesson07.ipynb")
    release = cells(NOTEBOOKS / "lesson07" / "lesson07.ipynb")
    assert shell.run_cell(release["l07_setup"]).success
    assert shell.run_cell(solution["l07_sampler"]).success
    calls = []
    real = common.graded
    monkeypatch.setattr(common, "graded", lambda check: calls.append(check.__name__) or real(check))
    key = ("lesson07", "l07_boundary")
    common._PASSED[key] = common.answers_key(common.load_lesson("lesson07"), shell.user_ns)
    assert shell.run_cell(release["l07_boundary"]).success and calls == []
    assert shell.run_cell(solution["l07_sampler"]).success  # redefined: new function objects
    assert shell.run_cell(release["l07_boundary"]).success and calls == ["check_boundary"], calls


def grade_cells(lesson_id: str) -> list[str]:
    return [c["id"] for c in notebook(lesson_id) if c["cell_type"] == "code"
            and c.get("metadata", {}).get("nbgrader", {}).get("grade")]


@pytest.mark.parametrize("lesson_id", discover_lessons())
def test_an_unfilled_blank_has_the_same_first_line_in_every_grade_cell(shell, capsys, monkeypatch, lesson_id):
    """The release as handed out (every blank unfilled): every grade cell stops with BLANK_HEAD as its first line,
    whatever the blank ran into (a method of the blank, or C code such as torch.empty that raises TypeError)."""
    monkeypatch.delenv("MINIVLLM_GRADING", raising=False)
    nb = notebook(lesson_id)
    by_id = {c["id"]: "".join(c["source"]) for c in nb}
    assert shell.run_cell(by_id[f"l{lesson_id[-2:]}_setup"]).success
    for c in nb:
        meta = c.get("metadata", {}).get("nbgrader", {})
        if c["cell_type"] == "code" and meta.get("solution"):
            assert shell.run_cell("".join(c["source"])).success or True  # a top-level blank may raise here
    capsys.readouterr()
    for gid in grade_cells(lesson_id):
        result = shell.run_cell(by_id[gid])
        lines = out(capsys)
        error = [x for x in lines if x.startswith("✗")]  # what the cell printed before its error comes first
        assert not result.success and error, (gid, lines)
        assert error[0].startswith(BLANK_HEAD), (gid, lines)
