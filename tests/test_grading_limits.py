"""Bounded, tamper-resistant grading (autograder/limits.py, autograder/sandbox.py), on lesson 1.

Looping, sleeping and memory-hungry answers are graded within the per-cell limit (set small here through its
one environment variable), score 0 on the parts they break and keep the others; tampering with the checks,
the engine or the notebook's grade cells scores no more than the honest wrong answer.
"""
import json
import os
import re

import pytest

from autograder.mutation import filled_notebook, mutant_source, solution_cells
from autograder.sandbox import answer_definitions, audit, grade_file

LESSON = "lesson01"
STEP = "l01_engine_core_step"
ENGINE_PARTS = ("l01_main_path", "l01_real_engine", "l01_boundary")
WRONG = mutant_source(LESSON, "update_before_aborts")  # the honest wrong answer: 1/4 (its source map is right)


@pytest.fixture
def small_limits(monkeypatch):
    monkeypatch.setenv("MINIVLLM_CELL_TIMEOUT", "4")
    monkeypatch.setenv("MINIVLLM_MEMORY_LIMIT_MB", "3072")


def write(tmp_path, replace, name="sub.ipynb", nb=None):
    nb = nb or filled_notebook(LESSON, replace)
    path = tmp_path / name
    path.write_text(json.dumps(nb, ensure_ascii=False), encoding="utf-8")
    return path


def scores(path):
    results, notes = grade_file(LESSON, path)
    return {r.part.grade_id: r.score for r in results if not r.part.manual}, \
        {r.part.grade_id: r.message for r in results}, notes


def body(extra: str) -> str:
    """The solution's step with `extra` run first inside the function body."""
    sol = solution_cells(LESSON)[STEP]
    return sol.replace("    trace = []\n", f"    trace = []\n{extra}", 1)


BROKEN = {
    "loops": "    while True:\n        pass\n",
    "sleeps": "    import time\n    time.sleep(3600)\n",
    "allocates": "    hoard = []\n    while True:\n        hoard.append(bytearray(16 * 2**20))\n",
}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", sorted(BROKEN))
def test_broken_answer_is_graded_within_the_limits(how, tmp_path, small_limits, monkeypatch):
    if how == "allocates":  # a cap the bomb reaches (~0.6 GB above the ~1.1 GB baseline) before the clock
        monkeypatch.setenv("MINIVLLM_MEMORY_LIMIT_MB", "1700")
        monkeypatch.setenv("MINIVLLM_CELL_TIMEOUT", "30")
    got, msg, _ = scores(write(tmp_path, {STEP: body(BROKEN[how])}))
    assert got == {"l01_main_path": 0, "l01_real_engine": 0, "l01_boundary": 0, "l01_source_map": 1}, msg
    named = "内存超限" if how == "allocates" else "超时"
    assert all(named in msg[p] and "MINIVLLM_" in msg[p] for p in ENGINE_PARTS), msg
    if how != "allocates":  # one time limit per hanging answer, not one per part
        assert sum("不再运行" in msg[p] for p in ENGINE_PARTS) == 2, msg
    assert all("Traceback" not in m and "\n" not in m for m in msg.values())


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_answer_that_swallows_the_alarm_is_killed_and_the_rest_still_graded(tmp_path, small_limits):
    swallow = "    while True:\n        try:\n            while True:\n                pass\n        except BaseException:\n            pass\n"
    got, msg, _ = scores(write(tmp_path, {STEP: body(swallow)}))
    assert got == {"l01_main_path": 0, "l01_real_engine": 0, "l01_boundary": 0, "l01_source_map": 1}, msg
    assert all("超时" in msg[p] for p in ENGINE_PARTS)
    assert sum("不再运行" in msg[p] for p in ENGINE_PARTS) == 2, msg  # one kill, not three


def test_only_answer_definitions_run():
    src = ("import math\nL01.check_main_path = lambda *a, **k: None\nprint('hi')\nfor i in range(3):\n    pass\n"
           "def f(x):\n    return math.sqrt(x)\nSOURCE_MAP = {'a': 'b'}\n")
    text, dropped, refused = answer_definitions(src, "c")
    assert "check_main_path" not in text and "print" not in text and "for i" not in text
    assert "def f(x)" in text and "SOURCE_MAP" in text and "import math" in text
    assert len(dropped) == 3 and not refused
    assert text.count("\n") == src.count("\n")  # line numbers kept for tracebacks and @triton.jit


@pytest.mark.parametrize("code", [
    "def f():\n    import autograder.lesson01 as m\n    m.check_main_path = None\n",
    "def f():\n    L01.expect = print\n",
    "def f():\n    import sys\n",
    "def f():\n    return ().__class__.__base__.__subclasses__()\n",
    "def f(e):\n    return e.__traceback__.tb_frame.f_globals\n",
    "def f(o):\n    setattr(o, 'x', 1)\n",
    "import os\n",
    "def f():\n    return eval('1')\n",
    "_w = minivllm.config.os.system('true')\n",
    "def f():\n    return torch.multiprocessing.get_context()\n",
])
def test_audit_refuses_reaching_for_the_grader_or_the_interpreter(code):
    import ast

    assert audit(ast.parse(code), "c")


def test_solutions_and_mutants_pass_the_audit():
    import ast

    from autograder.common import discover_lessons
    from autograder.mutation import mutants

    for lesson in discover_lessons():
        for cid, src in solution_cells(lesson).items():
            assert not audit(ast.parse(src), cid), (lesson, cid)
        for name in mutants(lesson):
            assert not audit(ast.parse(mutant_source(lesson, name)), name), (lesson, name)


# ---------------------------------------------------------------------------- tampering, sandbox side
PATCH_CHECKS = "".join(f"L01.{c} = lambda *a, **k: None\n" for c in
                       ("check_main_path", "check_real_engine", "check_boundary", "check_source_map"))
PATCH_ENGINE = ("import minivllm.engine.core as _core\n"
                "_core.EngineCore.abort_requests = lambda self, ids: None\n")
TAMPER_IN_BODY = ("    from minivllm.engine import core as engine_core\n"
                  "    engine_core.EngineCore.step = engine_core.EngineCore.step\n"
                  "    engine_core.EngineCore.abort_requests = lambda self, ids: None\n")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tampering_scores_no_more_than_the_honest_wrong_answer(tmp_path):
    """Tampering from inside the answer's body, on the sandbox alone. (Patching the checks or the engine beside
    the answer, and the honest wrong answer's own scores: test_nbgrader_tampering_and_limits grades those notebooks
    through `grade`, which scores code parts with this same sandbox.)"""
    honest = {"l01_main_path": 0, "l01_real_engine": 0, "l01_boundary": 0, "l01_source_map": 1}  # WRONG's scores
    replace = {STEP: WRONG.replace("    trace = []\n", "    trace = []\n" + TAMPER_IN_BODY, 1)}
    got, msg, _ = scores(write(tmp_path, replace, "patched_in_body.ipynb"))
    assert sum(got.values()) <= 1, (got, msg)
    # The notebook's grade cells and metadata play no part in the sandbox: strip or delete them all.
    nb = filled_notebook(LESSON, {STEP: WRONG})
    for cell in nb["cells"]:
        cell.get("metadata", {}).pop("nbgrader", None)
    nb["cells"] = [c for c in nb["cells"] if not (c["id"].startswith("l01_") and c["id"] not in
                                                   (STEP, "l01_source_map_answer", "l01_setup"))]
    got, _, _ = scores(write(tmp_path, {}, "stripped.ipynb", nb=nb))
    assert got == honest


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_missing_exercise_cell_scores_zero_not_pending(tmp_path):
    nb = filled_notebook(LESSON)
    nb["cells"] = [c for c in nb["cells"] if c["id"] != STEP]
    got, msg, notes = scores(write(tmp_path, {}, nb=nb))
    assert got == {"l01_main_path": 0, "l01_real_engine": 0, "l01_boundary": 0, "l01_source_map": 1}, msg
    assert any(STEP in n for n in notes)


def test_limits_are_one_setting_each(monkeypatch):
    from autograder import limits

    monkeypatch.delenv("MINIVLLM_CELL_TIMEOUT", raising=False)
    assert limits.cell_timeout() == 120
    monkeypatch.setenv("MINIVLLM_CELL_TIMEOUT", "7")
    assert limits.cell_timeout() == 7
    config = (os.path.dirname(limits.__file__) + "/nbgrader_config.py")
    assert "c.Execute.timeout = max(1, round(cell_timeout()))" in open(config, encoding="utf-8").read()


def test_time_limit_interrupts_a_loop_in_the_main_thread():
    from autograder.limits import LimitExceeded, time_limit

    with pytest.raises(LimitExceeded, match="MINIVLLM_CELL_TIMEOUT"), time_limit(0.2):
        while True:
            pass


# ---------------------------------------------------------------------------- tampering and limits, through nbgrader
def edited_asserts(cells):
    for c in cells:
        if c.get("metadata", {}).get("nbgrader", {}).get("grade"):
            c["source"] = "pass\n"


def deleted_grade_cells(cells):
    cells[:] = [c for c in cells if not c.get("metadata", {}).get("nbgrader", {}).get("grade")]


def stripped_metadata(cells):
    for c in cells:
        c.get("metadata", {}).pop("nbgrader", None)


def deleted_hidden_tests(cells):
    for c in cells:
        src = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
        c["source"] = src.split("### BEGIN HIDDEN TESTS")[0]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_nbgrader_tampering_and_limits(tmp_path, monkeypatch, capsys):
    """One class through `autograder grade`: every tampering student scores no more than the honest wrong one,
    no code part is left pending, a sleeping answer is cut at the per-cell limit once (nbgrader's run of the
    same notebook is stopped when the sandbox times out), the others are graded."""
    from autograder.grading import grade

    monkeypatch.setenv("MINIVLLM_CELL_TIMEOUT", "25")
    subs = tmp_path / "subs"
    students = {
        "solution": filled_notebook(LESSON),
        "honest_wrong": filled_notebook(LESSON, {STEP: WRONG}),
        "patched_checks": filled_notebook(LESSON, {STEP: WRONG + "\n" + PATCH_CHECKS}),
        "patched_engine": filled_notebook(LESSON, {STEP: PATCH_ENGINE + WRONG}),
        "sleeps": filled_notebook(LESSON, {STEP: body(BROKEN["sleeps"])}),
    }
    for name, edit in (("edited_asserts", edited_asserts), ("deleted_grade_cells", deleted_grade_cells),
                       ("stripped_metadata", stripped_metadata), ("deleted_hidden_tests", deleted_hidden_tests)):
        nb = filled_notebook(LESSON, {STEP: WRONG})
        edit(nb["cells"])
        students[name] = nb
    for name, nb in students.items():
        (subs / name / LESSON).mkdir(parents=True)
        (subs / name / LESSON / f"{LESSON}.ipynb").write_text(json.dumps(nb, ensure_ascii=False), encoding="utf-8")
    results = grade(subs, tmp_path / "course", tmp_path / "grades.csv", [LESSON], jobs=2)[LESSON]
    code = {s: {k: v for k, v in got.items() if k.startswith("l01_") and not k.startswith("l01_q")}
            for s, got in results.items()}
    assert all(v is not None for got in code.values() for v in got.values()), code  # nothing pending
    total = {s: sum(got.values()) for s, got in code.items()}
    assert total["solution"] == 4 and total["honest_wrong"] == 1, total
    assert all(total[s] <= 1 for s in students if s not in ("solution", "sleeps")), total
    # the sandbox reads only the answer cells: a notebook whose grade cells were edited scores as its answers do
    assert all(code[s] == code["honest_wrong"] for s in ("edited_asserts", "deleted_grade_cells",
                                                         "stripped_metadata", "deleted_hidden_tests")), code
    assert code["sleeps"] == {"l01_main_path": 0, "l01_real_engine": 0, "l01_boundary": 0, "l01_source_map": 1}
    parts_csv = (tmp_path / "grades-parts.csv").read_text(encoding="utf-8")
    assert "sleeps,l01_main_path,0,1,超时" in parts_csv
    printed = capsys.readouterr().out
    assert "sleeps: nbgrader 的运行已停止" in printed and "solution: nbgrader" not in printed
    # #53: the looping student's 0s say why where people look (the answer cell's comment: formgrader, feedback),
    # and its untouched written answers read "no answer" as the solution's do, though nbgrader's run was stopped
    from nbgrader.api import Gradebook

    from autograder.grading import NO_ANSWER

    with Gradebook(f"sqlite:///{tmp_path / 'course' / 'gradebook.db'}") as gb:
        comments = {s: {c.name: c.comment for c in gb.find_submission_notebook(LESSON, LESSON, s).comments}
                    for s in ("sleeps", "solution")}
    assert comments["sleeps"][STEP].count("超时") >= 3 and "（l01_main_path）0/1 分" in comments["sleeps"][STEP]
    assert comments["solution"][STEP] is None, comments
    for s in ("sleeps", "solution"):
        assert [comments[s][q] for q in ("l01_q1", "l01_q2", "l01_q3")] == [NO_ANSWER] * 3, comments
        assert [results[s][q] for q in ("l01_q1", "l01_q2", "l01_q3")] == [0, 0, 0], results
    assert re.search(r"^sleeps .* no answer\s*$", printed, re.M) and re.search(r"^solution .* no answer\s*$",
                                                                                 printed, re.M), printed[-3000:]
