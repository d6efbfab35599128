"""What a student reads when a grade cell fails: three lines (the part, what is wrong, the first divergence),
in IPython (JupyterLab, Colab, nbgrader's run and so its feedback) and in the self-check table; the full
traceback one `%tb` or one setting away."""
import json
import re

import pytest

from autograder.common import NOTEBOOKS, REPO, Lesson, PartResult, format_report, width
from autograder.mutation import mutant_source

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def release_cells(lesson_id: str) -> dict[str, str]:
    nb = json.loads((NOTEBOOKS / lesson_id / f"{lesson_id}.ipynb").read_text(encoding="utf-8"))
    return {c["id"]: "".join(c["source"]) for c in nb["cells"]}


@pytest.fixture(scope="module")
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    sh = InteractiveShell.instance()
    cells = release_cells("lesson01")
    assert sh.run_cell(cells["l01_setup"]).success
    yield sh, cells
    InteractiveShell.clear_instance()


def run(sh, capsys, source: str) -> list[str]:
    capsys.readouterr()
    result = sh.run_cell(source)
    assert not result.success
    return [ANSI.sub("", x) for x in capsys.readouterr().out.strip().splitlines()]


def test_a_blank_in_a_grade_cell_is_three_lines(shell, capsys):
    sh, cells = shell
    assert sh.run_cell(cells["l01_engine_core_step"]).success  # the release's blanks
    lines = run(sh, capsys, cells["l01_main_path"])
    assert len(lines) == 3, lines
    assert lines[0].startswith("✗ 还有空 ______ 没有填写") and "主路径·种子断言（l01_main_path，1 分）" in lines[0]
    assert "%tb" in lines[0]
    assert "第 8 行：plan = ______" in lines[1]  # the blank, not its use (l. 20)
    assert lines[2].startswith("评分单元格第 9 行：out, ran, trace = engine_core_step(")  # line 1: the setup guard
    text = "\n".join(lines)
    assert "Traceback" not in text and "__tracebackhide__" not in text and str(REPO) not in text
    full = [ANSI.sub("", x) for x in (sh.run_line_magic("tb", ""), capsys.readouterr().out)[1].splitlines()]
    assert len(full) > 10 and any("_fail" in x for x in full), full  # %tb: the whole traceback


def test_a_bare_visible_assert_names_what_is_false_and_its_value(shell, capsys):
    sh, cells = shell
    assert sh.run_cell(mutant_source("lesson01", "aborts_skipped")).success
    lines = run(sh, capsys, cells["l01_main_path"])
    assert len(lines) == 3, lines
    assert lines[1].startswith("可见断言不成立（评分单元格第 12 行）：assert events == ")
    assert lines[2] == "不成立的是 `events == ['abort-queue-drained']`：events 实际是 []", lines


def test_a_failed_check_shows_its_message(shell, capsys):
    sh, cells = shell
    assert sh.run_cell(cells["l01_source_map_answer"]).success
    lines = run(sh, capsys, cells["l01_source_map"])
    assert len(lines) == 3 and lines[0].startswith("✗ 还有空 ______ 没有填写"), lines
    assert "SOURCE_MAP['plan'] 还是 ______" in lines[1], lines
    assert sh.run_cell('SOURCE_MAP = {"plan": 3}').success
    lines = run(sh, capsys, cells["l01_source_map"])
    assert len(lines) == 3 and "SOURCE_MAP 的键应恰好是" in lines[1], lines


def test_full_traceback_setting_and_other_cells_keep_ipython_traceback(shell, capsys, monkeypatch):
    sh, cells = shell
    assert sh.run_cell(cells["l01_engine_core_step"]).success
    monkeypatch.setenv("MINIVLLM_TRACEBACK", "full")
    assert len(run(sh, capsys, cells["l01_main_path"])) > 10
    monkeypatch.delenv("MINIVLLM_TRACEBACK")
    assert any("ZeroDivisionError" in x for x in run(sh, capsys, "x = 1\n1 / 0"))


def test_self_check_table_aligns_by_display_width():
    lesson = Lesson("lesson99", "测试", answer=("f",), questions=("一", "二", "三"), code={
        "a": ("主路径·种子断言", lambda f: None), "b": ("Boundary", lambda f: None),
        "c": ("能映射回源码对象（SOURCE_MAP）", lambda f: None), "d": ("d", lambda f: None)})
    parts = lesson.parts
    results = [PartResult(parts[0], 0, "第一行\n第二行"), PartResult(parts[1], 1, "通过"),
               PartResult(parts[2], 1, "通过"), PartResult(parts[4], None, "待人工评分")]
    text, _ = format_report(lesson, results)
    rows = text.splitlines()[1:6]
    starts = {width(r[: r.index(score)]) for r, score in zip(rows[1:], ("0/1", "1/1", "1/1", "-/2"), strict=True)}
    assert len(starts) == 1, text  # the score column starts at the same display column in every row
    assert width(rows[0][: rows[0].index("得分")]) in starts
    assert "第一行；第二行" in rows[1]  # a message is one row
    assert width("主路径") == 6 and width("ab") == 2


def test_check_finds_the_notebook_from_its_folder_and_from_the_repo_root(tmp_path):
    from autograder.common import find_notebook

    nb = NOTEBOOKS / "lesson03" / "lesson03.ipynb"
    assert find_notebook("lesson03", cwd=REPO) == nb  # `python -m autograder check lesson03` at the root
    assert find_notebook("lesson03", cwd=nb.parent) == nb  # ... and in the notebook's folder
    assert find_notebook("lesson03", "lesson03.ipynb", cwd=REPO) == nb  # the old printed form, from the root
    with pytest.raises(SystemExit, match="run this in the notebook's folder or the repository root"):
        find_notebook("lesson03", cwd=tmp_path)


def test_self_check_and_report_cells_stay_quiet_under_grade(monkeypatch, capsys):
    """Under `grade` the notebook's report and self-check cells print one line and run no check (the grade
    cells and the sandbox score every part; nbgrader would otherwise pay for every check twice)."""
    from autograder import common

    calls = []
    monkeypatch.setattr(common, "run_part", lambda *a: calls.append(a))
    monkeypatch.setenv("MINIVLLM_GRADING", "1")
    assert common.self_check("lesson01", {}) is False
    common.report("lesson01", {})
    out = capsys.readouterr().out
    assert "评分时跳过自检" in out and "评分时跳过逐项报告" in out and not calls


def test_a_cell_that_hit_a_limit_is_not_run_again_for_its_diagnosis(monkeypatch):
    """The diagnosis of a failed grade cell may run the check once more (after a visible assert), but never after
    the cell ran out of time or memory: a looping answer must cost one limit, not two."""
    from autograder import common
    from autograder.limits import LimitExceeded

    calls = []
    monkeypatch.setattr(common, "run_part", lambda *a: calls.append(a))
    part = common.load_lesson("lesson01").part("l01_main_path")
    assert common.cell_diagnosis("lesson01", part, LimitExceeded("超时"), {}) == ""
    assert common.cell_diagnosis("lesson01", part, MemoryError(), {}) == ""
    assert not calls


def test_the_verdict_never_says_the_code_is_done_below_full_code_marks():
    """3/4 leaves a pass possible (9/10 with full manual marks) but the code part is not done: the pass requires
    every code part."""
    lesson = Lesson("lesson99", "测试", {g: (g, lambda f: None) for g in "abcd"}, answer=("f",),
                    questions=("一", "二", "三"))
    parts = lesson.parts
    code = [PartResult(p, 1, "通过") for p in parts[:4]]
    manual = [PartResult(p, None, "待人工评分") for p in parts[4:]]
    full, _ = format_report(lesson, code + manual)
    assert "结论：代码部分已达标" in full
    three, ok = format_report(lesson, [PartResult(parts[0], 0, "不对"), *code[1:], *manual])
    assert not ok and "已达标" not in three and "代码部分还差 1 分" in three, three
