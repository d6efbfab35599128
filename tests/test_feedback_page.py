"""What nbgrader's run, the feedback page and formgrader show (lesson 1, a blank and a wrong student):
every failing grade cell in at most three lines, no instructor path or `__tracebackhide__` in the feedback, and
each manual score on the student's answer cell, with the lesson still worth 10 points; the wrong student's
misconception is named in the run, the feedback and grade's CSV. One graded class serves every test here."""
import csv
import html
import json
import re
import shutil
import subprocess

import pytest

from autograder import diagnosis
from autograder.common import REPO
from autograder.mutation import mutants

ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def graded(lesson01_class):
    """The lesson-1 class tests/conftest.py grades once per run: its blank and misconception students."""
    c = lesson01_class
    return c["course"], c["results"], c["pages"], c["phases"]


def error_outputs(course, student):
    nb = json.loads((course / "autograded" / student / "lesson01" / "lesson01.ipynb").read_text(encoding="utf-8"))
    return {c["id"]: [ANSI.sub("", x) for o in c.get("outputs", []) if o["output_type"] == "error"
                      for x in "\n".join(o["traceback"]).splitlines()] for c in nb["cells"]
            if c["metadata"].get("nbgrader", {}).get("grade") and c["cell_type"] == "code"}


@pytest.mark.slow
def test_grade_times_each_phase_of_each_student(graded):
    """benchmarks/grade_parallel.py's breakdown: one nbgrader run, one sandbox re-grade and one gradebook merge
    per student (timing only: no verdict reads it)."""
    phases = graded[3]
    for phase in ("nbgrader execution", "sandbox re-grade", "gradebook merge", "grader files re-hashed"):
        times = [sec for name, sec in phases if name == phase]
        assert len(times) == len(graded[1]) == 4 and all(sec >= 0 for sec in times), (phase, phases)
    assert sum(sec for name, sec in phases if name == "nbgrader execution") > 0


@pytest.mark.slow
def test_nbgrader_run_shows_three_lines_per_failing_grade_cell(graded):
    course, results, _, _ = graded
    blank, mutant = error_outputs(course, "blank_student"), error_outputs(course, "misconception_student")
    assert all(blank.values()) and blank.keys() == {"l01_main_path", "l01_real_engine", "l01_boundary",
                                                    "l01_source_map"}
    for lines in [*blank.values(), *mutant.values()]:
        assert len(lines) <= 3, lines
    assert blank["l01_main_path"][0].startswith("✗ 还有空 ______ 没有填写：主路径·种子断言（l01_main_path，1 分）")
    assert mutant["l01_main_path"][1].startswith("可见断言不成立（评分单元格第 12 行）：assert events ==")
    assert mutant["l01_main_path"][2].endswith("events 实际是 []")
    assert results["blank_student"]["l01_q1"] == 0  # left as released: nbgrader scores an unchanged answer 0
    assert results["misconception_student"]["l01_q1"] is None  # written: pending until an instructor grades it


@pytest.mark.slow
def test_feedback_page_shows_the_short_failure_and_no_instructor_paths(graded, tmp_path):
    _, _, pages, _ = graded
    text = pages["misconception_student"].read_text(encoding="utf-8")
    plain = html.unescape(re.sub(r"<[^>]+>", "", text))
    assert "__tracebackhide__" not in plain and str(REPO) not in plain and "/tmp/ipykernel" not in plain
    assert "Traceback (most recent call last)" not in plain and "MARK SCHEME" not in plain
    assert "可见断言不成立（评分单元格第 12 行）" in plain and "events 实际是 []" in plain
    assert "Q1 你的答案" in plain and "EngineCore 拥有 busy loop" in plain
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium for the screenshot (the HTML checks above ran)")
    shot = tmp_path / "feedback.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
                    "--window-size=1200,2400", pages["misconception_student"].as_uri()], capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 10_000


@pytest.mark.slow
def test_manual_scores_sit_on_the_answer_cells_and_the_lesson_is_worth_10(graded):
    from nbgrader.api import Gradebook

    course, _, _, _ = graded
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        nb = gb.find_notebook("lesson01", "lesson01")
        assert nb.max_score == 10
        assert not nb.task_cells  # no score box on a question cell
        for q in ("l01_q1", "l01_q2", "l01_q3"):
            assert gb.find_grade_cell(q, "lesson01", "lesson01").max_score == 2
            assert gb.find_solution_cell(q, "lesson01", "lesson01").name == q  # the student's answer itself
    release = json.loads((REPO / "notebooks/lesson01/lesson01.ipynb").read_text(encoding="utf-8"))["cells"]
    for q in ("l01_q1", "l01_q2", "l01_q3"):
        i = next(i for i, c in enumerate(release) if c["id"] == q)
        assert release[i - 1]["id"] == f"{q}_question" and "".join(release[i]["source"]).startswith(f"**{q[-2:].upper()} 你的答案**")


@pytest.mark.slow
def test_formgrader_page_puts_each_score_box_on_its_answer(graded, tmp_path):
    """The page formgrader serves for a submission (its own template and exporter, rendered offline)."""
    from nbconvert import HTMLExporter
    from nbgrader.server_extensions.formgrader import handlers

    course, _, _, _ = graded
    exporter = HTMLExporter(template_name="formgrade", extra_template_basedirs=[handlers.template_path])
    page, _ = exporter.from_filename(str(course / "autograded/misconception_student/lesson01/lesson01.ipynb"), resources={
        "assignment_id": "lesson01", "notebook_id": "lesson01", "submission_id": "s", "index": 0, "total": 1,
        "base_url": "", "student": "misconception_student", "last_name": None, "first_name": None, "notebook_path": "x"})
    boxes = re.findall(r'<input class="score tabbable" id="([^"]+)"', page)
    assert boxes == ["l01_main_path", "l01_real_engine", "l01_boundary", "l01_source_map", "l01_q1", "l01_q2",
                     "l01_q3"]
    for q, nxt in (("q1", "Q2（2 分）"), ("q2", "Q3（2 分）"), ("q3", "评分规则")):
        box = page.index(f'id="l01_{q}"')
        panel_start = page.rindex('<div class="panel panel-primary nbgrader_cell">', 0, box)
        assert "Student&#39;s answer" in page[panel_start:box] or "Student's answer" in page[panel_start:box]
        assert page.index(f"{q.upper()} 你的答案", box) < page.index(nxt, box)  # the box heads its own answer
    (tmp_path / "formgrade.html").write_text(page, encoding="utf-8")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium:
        shot = tmp_path / "formgrade.png"
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
                        "--window-size=1200,2400", (tmp_path / "formgrade.html").as_uri()], capture_output=True,
                       timeout=120)
        assert shot.exists() and shot.stat().st_size > 10_000


@pytest.mark.slow
def test_grade_and_feedback_carry_the_diagnosis(graded):
    """nbgrader's run and feedback page show the hint within the three lines; grade's per-part CSV names the
    mutant in its diagnosis column and the lesson's histogram is drawn beside it (autograder/diagnosis.py)."""
    course, _, pages, _ = graded
    hint = diagnosis.hint_text("lesson01", mutants("lesson01")["aborts_skipped"])
    lines = error_outputs(course, "misconception_student")["l01_main_path"]
    assert len(lines) <= 3 and lines[0].endswith(diagnosis.PREFIX + hint), lines
    assert diagnosis.PREFIX + hint in html.unescape(pages["misconception_student"].read_text(encoding="utf-8"))
    rows = list(csv.DictReader((course.parent / "grades-parts.csv").open(encoding="utf-8")))
    got = {(r["student"], r["grade_id"]): r["diagnosis"] for r in rows}
    assert got[("misconception_student", "l01_main_path")] == "aborts_skipped", got
    assert got[("blank_student", "l01_main_path")] == "" and got[("misconception_student", "l01_source_map")] == ""
    assert (course.parent / "grades-lesson01-diagnosis.png").read_bytes()[:4] == b"\x89PNG"
