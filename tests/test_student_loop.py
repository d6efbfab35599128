"""The student's loop in the notebook's kernel (#43): a looping answer stops the remaining parts as
`python -m autograder check` does, the first timeout is printed as soon as it happens, grade cells are bounded and
say when their visible asserts passed, and a blank or a limit is never dressed up as the check's guess at a cause."""
import json
import re
import time

import pytest

from autograder.common import NOTEBOOKS, REPO, SKIPPED_AFTER_TIMEOUT

ANSI = re.compile(r"\x1b\[[0-9;]*m")
LIMIT_S = 2.0
LOOPING_CHECK_STOP = "def check_stop(request, max_model_len):\n    while True:\n        pass\n"
# The same in the notebook's shell, counting its calls: each call loops until a time limit stops it, so ENTERED is
# how many limits the answer cost (a submitted notebook may not use globals: the sandbox refuses them).
COUNTED_LOOP = ("ENTERED = globals().get('ENTERED', 0)\n"
                "def check_stop(request, max_model_len):\n    global ENTERED\n    ENTERED += 1\n"
                "    while True:\n        pass\n")


def cells(path) -> dict[str, str]:
    return {c["id"]: "".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]}


@pytest.fixture
def lesson04(monkeypatch):
    from IPython.core.interactiveshell import InteractiveShell

    from autograder import common

    monkeypatch.setenv("MINIVLLM_CELL_TIMEOUT", str(LIMIT_S))
    monkeypatch.setattr(common, "KERNEL_HUNG", common.Hung())
    sh = InteractiveShell.instance()
    release = cells(NOTEBOOKS / "lesson04" / "lesson04.ipynb")
    solution = cells(REPO / "solutions" / "lesson04" / "lesson04.ipynb")
    assert sh.run_cell(release["l04_setup"]).success
    assert sh.run_cell(solution["l04_lifecycle"]).success
    yield sh, release
    InteractiveShell.clear_instance()


def out(capsys) -> list[str]:
    return [ANSI.sub("", x) for x in capsys.readouterr().out.strip().splitlines()]


def timed(fn):
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


@pytest.mark.timeout(300, method="thread")  # a hang guard only (not SIGALRM: the cell limit uses it)
def test_a_looping_answer_costs_one_limit_in_the_notebook_as_in_check(lesson04, capsys):
    sh, release = lesson04
    assert sh.run_cell(COUNTED_LOOP).success
    capsys.readouterr()
    # the per-part report: the first part runs into the limit, every later part (same answers) is not run
    took = timed(lambda: sh.run_cell('report("lesson04", globals())'))
    lines = out(capsys)
    assert len(lines) == 4, lines
    assert lines[0].startswith("✗") and "超时：运行超过 2 s" in lines[0], lines
    assert all(SKIPPED_AFTER_TIMEOUT in x for x in lines[1:]), lines
    assert took >= LIMIT_S and sh.user_ns["ENTERED"] == 1, took  # one limit, not four

    # a grade cell after it: not run at all, with the same line (no second limit)
    sh.run_cell(release["l04_stop"])
    lines = out(capsys)
    assert sh.user_ns["ENTERED"] == 1
    assert len(lines) == 3 and "l04_stop" in lines[0] and SKIPPED_AFTER_TIMEOUT in lines[1], lines
    assert "本单元格没有运行" in lines[2], lines

    # the answer redefined (still looping): the self-check runs it again, prints the first timeout at once, then
    # the table, in one limit
    assert sh.run_cell(COUNTED_LOOP).success
    capsys.readouterr()
    took = timed(lambda: sh.run_cell('self_check("lesson04", globals());'))
    lines = out(capsys)
    assert lines[0].startswith("✗") and "超时" in lines[0] and "其余部分不再运行" in lines[0], lines
    table = "\n".join(lines[1:])
    assert table.count(SKIPPED_AFTER_TIMEOUT) == 3 and "代码 0/4" in table, table
    assert took >= LIMIT_S and sh.user_ns["ENTERED"] == 2, took  # one more limit, not four


@pytest.mark.timeout(300, method="thread")  # a hang guard only (not SIGALRM: the cell limit uses it)
def test_a_grade_cell_is_bounded_and_stops_the_next_one(lesson04, capsys):
    """The visible asserts call the answer directly (no check around them): the cell limit still stops them."""
    sh, release = lesson04
    assert sh.run_cell(COUNTED_LOOP).success
    capsys.readouterr()
    took = timed(lambda: sh.run_cell(release["l04_stop"]))
    lines = out(capsys)
    assert took >= LIMIT_S and sh.user_ns["ENTERED"] == 1, took
    assert len(lines) == 3 and "l04_stop" in lines[0] and lines[1].startswith("超时"), lines
    sh.run_cell(release["l04_preempt"])
    lines = out(capsys)
    assert sh.user_ns["ENTERED"] == 1 and SKIPPED_AFTER_TIMEOUT in lines[1], lines  # not run: no second limit
    assert sh.run_cell(cells(REPO / "solutions" / "lesson04" / "lesson04.ipynb")["l04_lifecycle"]).success
    assert sh.run_cell(release["l04_preempt"]).success  # fixed: the cell runs again


def test_a_passing_grade_cell_ran_its_parts_complete_check(lesson04, capsys, monkeypatch):
    """The student's copy holds only the visible asserts: the part's complete check runs after them, so the ✓ is
    the part's; under `grade` (the sandbox runs the complete checks) the cell says it ran only the visible asserts."""
    from autograder.common import PASSED_FULL, PASSED_VISIBLE

    sh, release = lesson04
    monkeypatch.setenv("MINIVLLM_CELL_TIMEOUT", "120")
    capsys.readouterr()
    assert sh.run_cell(release["l04_stop"]).success
    assert out(capsys) == [f"✓ 边界·停止条件：{PASSED_FULL}"]
    monkeypatch.setenv("MINIVLLM_GRADING", "1")
    assert sh.run_cell(release["l04_stop"]).success
    assert out(capsys) == [f"边界·停止条件：{PASSED_VISIBLE}"]
    monkeypatch.delenv("MINIVLLM_GRADING")
    solution = cells(REPO / "solutions" / "lesson04" / "lesson04.ipynb")["l04_stop"]  # nbgrader's: hidden tests too
    assert "HIDDEN TESTS" in solution and sh.run_cell(solution).success
    assert out(capsys) == ["✓ 边界·停止条件：通过（含隐藏检查）。"]


def test_a_blank_or_a_limit_is_not_given_the_checks_cause_hint(lesson04, monkeypatch):
    """Lesson 4's real-engine check wraps any exception of a step in its own verdict with a guess at the cause
    ("某个已结束的请求还留在队列里？"); a blank or a timeout behind it is reported as such, without the guess."""
    from autograder.common import load_lesson, run_part

    sh, _ = lesson04
    monkeypatch.setenv("MINIVLLM_CELL_TIMEOUT", "120")  # the engine and the HF oracle load once here
    part = load_lesson("lesson04").part("l04_real_engine")
    assert run_part(part, sh.user_ns).score == 1
    assert sh.run_cell("def check_stop(request, max_model_len):\n    done = ______\n    return bool(done)\n").success
    r = run_part(part, sh.user_ns)
    assert r.score == 0 and r.message.startswith("还有空 ______ 没有填写"), r.message
    assert "第 2 行：done = ______" in r.message and "？" not in r.message, r.message
    monkeypatch.setenv("MINIVLLM_CELL_TIMEOUT", "5")
    assert sh.run_cell(LOOPING_CHECK_STOP).success
    r = run_part(part, sh.user_ns)
    assert r.score == 0 and r.message.startswith("超时") and "队列" not in r.message, r.message


def test_a_cell_run_before_the_setup_cell_says_so():
    """After a kernel restart every grade, report, self-check and demo cell of every lesson names the setup cell
    (its first line), never a bare `NameError: report`; only the guard runs, so this takes no time."""
    from IPython.core.interactiveshell import InteractiveShell

    from autograder.common import discover_lessons

    sh = InteractiveShell.instance()
    try:
        for lesson_id in discover_lessons():
            nb = json.loads((NOTEBOOKS / lesson_id / f"{lesson_id}.ipynb").read_text("utf-8"))["cells"]
            code = [c for c in nb if c["cell_type"] == "code"]
            setup = next(i for i, c in enumerate(code) if c["id"].endswith("_setup"))
            after = [c for c in code[setup + 1:] if not c["metadata"].get("nbgrader", {}).get("solution")]
            assert len(after) >= 4, lesson_id
            for cell in after:
                result = sh.run_cell("".join(cell["source"]))
                assert not result.success and not isinstance(result.error_in_exec, NameError), cell["id"]
                assert "先运行本课开头的准备单元格" in str(result.error_in_exec), cell["id"]
    finally:
        InteractiveShell.clear_instance()


def test_setup_silences_weight_loading_bars_and_picks_a_cjk_font(lesson04, monkeypatch, capsys):
    """After the setup cell no "Loading weights" bar reaches a check's output; figures take an installed CJK font,
    and without one the setup says once how to get one."""
    import matplotlib
    import transformers
    from matplotlib import font_manager

    from autograder import common

    assert not transformers.utils.logging.is_progress_bar_enabled()
    monkeypatch.setattr(font_manager.fontManager, "ttflist", [font_manager.FontEntry(name="DejaVu Sans")])
    assert common.use_cjk_font() is None and "fonts-noto-cjk" in capsys.readouterr().out
    cjk = font_manager.FontEntry(name="Noto Sans CJK SC")
    monkeypatch.setattr(font_manager.fontManager, "ttflist", [font_manager.FontEntry(name="DejaVu Sans"), cjk])
    with matplotlib.rc_context():
        assert common.use_cjk_font() == "Noto Sans CJK SC"
        assert matplotlib.rcParams["font.sans-serif"][1] == "Noto Sans CJK SC"


def test_check_prints_the_first_timeout_at_once_and_runs_the_answer_once(tmp_path, monkeypatch, capsys):
    """`python -m autograder check`, the bound the notebook now keeps: one limit, the first timeout printed before
    the table."""
    from autograder.common import self_check
    from autograder.mutation import filled_notebook, solution_cells

    monkeypatch.setenv("MINIVLLM_CELL_TIMEOUT", "3")
    nb = filled_notebook("lesson04", {"l04_lifecycle": solution_cells("lesson04")["l04_lifecycle"] + "\n\n"
                                      + LOOPING_CHECK_STOP})
    path = tmp_path / "lesson04.ipynb"
    path.write_text(json.dumps(nb, ensure_ascii=False), encoding="utf-8")
    assert self_check("lesson04", notebook=path) is False
    lines = out(capsys)
    assert lines[0].startswith("✗") and "超时：运行超过 3 s" in lines[0] and "其余部分不再运行" in lines[0], lines
    table = "\n".join(lines[1:])
    assert table.count(SKIPPED_AFTER_TIMEOUT) == 3 and "代码 0/4" in table, table
