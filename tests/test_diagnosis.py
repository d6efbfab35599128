"""Misconception diagnosis (autograder/diagnosis.py): signatures are stable, a known wrong answer is named with
its hint in the self-check, the report cell and the grade cell, and the release carries only hashes and hint
texts. (Through nbgrader and `grade`'s CSV and histogram: test_feedback_page, on its graded class.)"""
import json
import re

from autograder import diagnosis
from autograder.common import NOTEBOOKS, PartResult, discover_lessons, format_report, load_lesson
from autograder.mutation import mutant_notebook, mutant_source, mutants, solution_cells

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def test_normalize_drops_what_differs_between_runs():
    a = "运行你的代码时出错：TypeError: <Foo object at 0x7f3a2b>（单元格 In[8]，第 12 行：x = f()） in /tmp/ipykernel_1/a.py 0.53 s"
    b = "TypeError: <Foo object at 0x55e1c0>（单元格 cell l01_x，第 3 行：x = f()） in /tmp/minivllm-grade-9/b.py 1.2 s"
    assert diagnosis.normalize(a) == diagnosis.normalize(b)
    assert diagnosis.signature("s", "g", a) == diagnosis.signature("s", "g", b)
    assert diagnosis.signature("s", "g", "expected [1, 2], got [1, 3]") != diagnosis.signature("s", "g", "expected [1, 2], got [1, 4]")
    assert diagnosis.signature("s", "g", a) != diagnosis.signature("t", "g", a)  # salted per lesson


def failing(release_scores, lesson_id: str, name: str) -> dict[str, str]:
    """diagnosis.failing_messages of the mutant's notebook, from its grading test_mutants reads (release_scores:
    the same notebook graded the same way, once per test run)."""
    said: dict = {}
    got = release_scores(lesson_id, name, said)
    points = {p.grade_id: p.points for p in load_lesson(lesson_id).parts if not p.manual}
    return {g: said[g] for g, v in got.items() if v < points[g]}


def test_the_same_mutant_graded_twice_has_the_same_signatures(release_scores):
    """A second grading of each mutant (diagnosis's own, as `diagnose --build` grades) beside the run's first."""
    salt = diagnosis.table("lesson02")["salt"]
    for name in sorted(mutants("lesson02"))[:3]:
        runs = [failing(release_scores, "lesson02", name),
                diagnosis.failing_messages("lesson02", mutant_notebook("lesson02", name))]
        assert runs[0] and runs[0].keys() == runs[1].keys(), name
        assert {g: diagnosis.signature(salt, g, m) for g, m in runs[0].items()} == \
               {g: diagnosis.signature(salt, g, m) for g, m in runs[1].items()}, name


def test_every_lesson_has_a_table_with_a_hint_for_every_mutant():
    salts = set()
    for lesson_id in discover_lessons():
        t = diagnosis.table(lesson_id)
        assert len(t["salt"]) == 16 and t["parts"], lesson_id
        salts.add(t["salt"])
        assert set(t["hints"]) == {diagnosis.hint_id(t["salt"], n) for n in mutants(lesson_id)}, lesson_id
        code = {p.grade_id for p in load_lesson(lesson_id).parts if not p.manual}
        assert set(t["parts"]) <= code and all(ids for s in t["parts"].values() for ids in s.values()), lesson_id
    assert len(salts) == len(discover_lessons())


def test_self_check_table_names_the_misconception_or_says_nothing(release_scores):
    lesson = load_lesson("lesson01")
    got = failing(release_scores, "lesson01", "aborts_skipped")
    hint = diagnosis.hint_text("lesson01", mutants("lesson01")["aborts_skipped"])
    results = [PartResult(p, 0 if p.grade_id in got else p.points, got.get(p.grade_id, "通过")) if not p.manual
               else PartResult(p, None, "待人工评分") for p in lesson.parts]
    text, _ = format_report(lesson, results)
    rows = [r for r in text.splitlines() if "0/1" in r]
    assert rows and all(diagnosis.PREFIX + hint in r for r in rows), text
    assert text.count(diagnosis.PREFIX) == len(got)
    made_up = "SOURCE_MAP 的键应恰好是 ['x']，实际 []。 a made-up verdict"
    results[0] = PartResult(lesson.parts[0], 0, made_up)
    text = format_report(lesson, results)[0]
    row = next(r for r in text.splitlines() if made_up in r)
    assert row.rstrip().endswith(made_up), row  # no known mistake: the verdict alone, no "not a known mistake"
    assert "not a known mistake" not in text and "不是已知的错误类型" not in text
    assert diagnosis.diagnose("lesson01", lesson.parts[0].grade_id, made_up) == ""
    assert diagnosis.label("lesson01", lesson.parts[0].grade_id, made_up) == "unknown"  # the instructor's CSV
    blank = PartResult(lesson.parts[0], 0, "还有空 ______ 没有填写：把它换成正确的表达式后再运行。")
    assert diagnosis.PREFIX not in format_report(lesson, [blank])[0]  # an unfilled blank is not a mistake


def test_report_cell_and_grade_cell_show_the_diagnosis(capsys):
    from IPython.core.interactiveshell import InteractiveShell

    from autograder.common import report

    cells = {c["id"]: "".join(c["source"]) for c in
             json.loads((NOTEBOOKS / "lesson01" / "lesson01.ipynb").read_text(encoding="utf-8"))["cells"]}
    hint = diagnosis.hint_text("lesson01", mutants("lesson01")["aborts_skipped"])
    sh = InteractiveShell.instance()
    try:
        assert sh.run_cell(cells["l01_setup"]).success
        assert sh.run_cell(mutant_source("lesson01", "aborts_skipped")).success
        capsys.readouterr()
        report("lesson01", sh.user_ns)
        out = capsys.readouterr().out.splitlines()
        i = next(k for k, x in enumerate(out) if x.startswith("✗"))
        assert out[i + 1].strip() == diagnosis.PREFIX + hint, out
        assert not sh.run_cell(cells["l01_main_path"]).success  # a visible assert fails first
        lines = [ANSI.sub("", x) for x in capsys.readouterr().out.strip().splitlines()]
        assert len(lines) == 3 and lines[0].endswith(diagnosis.PREFIX + hint), lines
    finally:
        InteractiveShell.clear_instance()


def test_grade_labels_and_histogram(tmp_path, release_scores):
    from autograder.grading import histogram

    got = failing(release_scores, "lesson01", "waits_twice")
    gid, msg = next(iter(got.items()))
    assert "waits_twice" in diagnosis.label("lesson01", gid, msg).split("+")
    assert diagnosis.label("lesson01", gid, "made up") == "unknown" and diagnosis.label("lesson01", gid, "") == ""
    png = histogram(tmp_path / "grades.csv", "lesson01", {"waits_twice": {"a", "b"}, "unknown": {"c"}})
    assert png == tmp_path / "grades-lesson01-diagnosis.png" and png.read_bytes()[:4] == b"\x89PNG"


def test_release_ships_hashes_and_hints_only(student_release):
    """Each lesson's diagnosis.json ships; nothing in it (or anywhere in the release) is mutant code, a mutant's
    `why` or name, a right fill or a SOURCE_MAP answer."""
    from tests.test_release import answer_texts, normalized, released_texts, source_map_answers, word

    texts = released_texts(student_release)
    every = "\n".join(p.read_text(encoding="utf-8", errors="ignore") for p in student_release.rglob("*")
                      if p.is_file() and p.suffix in (".py", ".ipynb", ".md", ".json", ".txt"))
    for lesson_id in discover_lessons():
        shipped = (student_release / "autograder" / lesson_id / "diagnosis.json").read_text(encoding="utf-8")
        data = json.loads(shipped)
        assert set(data) == {"salt", "parts", "hints"}
        assert all(re.fullmatch(r"[0-9a-f]{16}", s) for sigs in data["parts"].values() for s in sigs)
        flat = normalized(shipped)
        cells = solution_cells(lesson_id)
        for name, m in mutants(lesson_id).items():
            assert m.why not in every, (lesson_id, name)
            assert not word(name).search(shipped), (lesson_id, name)
            wrong = {x.strip() for _, new in m.edits for x in new.splitlines() if len(x.strip()) > 8}
            assert not [x for x in wrong if x not in cells[m.cell] and normalized(x) in flat], (lesson_id, name)
        fills = {normalized(f) for f in answer_texts(lesson_id)["fill"]} - {""}
        assert not [f for f in fills if f in flat], lesson_id
        assert not [a for a in source_map_answers(lesson_id).values() if word(a.rsplit(".", 1)[-1]).search(
            " ".join(data["hints"].values()))], lesson_id
    assert "autograder/diagnosis.py" in texts  # the student side needs it


def test_every_mutant_has_a_one_line_chinese_hint_that_is_not_its_why():
    for lesson_id in discover_lessons():
        for name, m in mutants(lesson_id).items():
            assert m.hint and "\n" not in m.hint and re.search(r"[\u4e00-\u9fff]", m.hint), (lesson_id, name)
            assert m.hint != m.why and len(m.hint) <= 80, (lesson_id, name)


def test_signatures_do_not_depend_on_the_process(release_scores):
    """Lesson 3's verdicts print block hashes (Python's hash(), seeded per process): a process with another hash
    seed than the test process's (whose grading of the mutant test_mutants reads) gives the same signatures, and
    the committed table's."""
    import os
    import subprocess
    import sys

    code = ("import json; from autograder import diagnosis as d; from autograder.mutation import mutant_notebook\n"
            "m = d.failing_messages('lesson03', mutant_notebook('lesson03', 'partial_blocks_hashed'))\n"
            "print(json.dumps({g: d.signature(d.table('lesson03')['salt'], g, x) for g, x in m.items()}))")
    here = {g: diagnosis.signature(diagnosis.table("lesson03")["salt"], g, x)
            for g, x in failing(release_scores, "lesson03", "partial_blocks_hashed").items()}
    # the test processes hash with the environment's seed (a random one per process when it is unset, as in
    # `make test`): the child's fixed seed is another one
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env=dict(os.environ, PYTHONHASHSEED=seed)).stdout.splitlines()[-1]
    runs = [here, json.loads(child)]
    assert runs[0] == runs[1] and "l03_boundary" in runs[0]
    assert all(s in diagnosis.table("lesson03")["parts"][g] for g, s in runs[0].items())


