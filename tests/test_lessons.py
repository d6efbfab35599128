"""What every lesson shares, once for all of them (discovered by folder; a lesson's own tests stay in
tests/test_lessonNN_grading.py): its declaration meets the course's rules (a lesson that breaks one fails when it
is declared, with what to add); its solution scores full in each grading path that differs — the notebook kernel
(nbclient, executed_solution), this process (release_scores, the grading every mutant is compared with), nbgrader
(the end-to-end flow) — the sandbox's is tests/test_mutants.py's; its SOURCE_MAP answers are not printed by the
lesson, and the release leaves a blank for every key."""
import ast
import json
import re

import pytest
from grading_flow import FLOW_LESSON, grade_three_students, namespace_scores, notebook_part_scores

from autograder.common import (
    CODE_PARTS,
    NOTEBOOKS,
    REPO,
    TOTAL,
    Lesson,
    SourceMap,
    discover_lessons,
    load_lesson,
    student_namespace,
)
from autograder.mutation import mutant_source, mutants, solution_cells

LESSONS = discover_lessons()
SOURCE_MAP_LESSONS = [lesson for lesson in LESSONS if load_lesson(lesson).source_map is not None]
# The wrong answer each lesson's nbgrader flow grades, and its code points (lesson 1's flow, with the feedback
# pages, is tests/test_lesson01_grading.py's). A lesson not listed grades its first mutant, checked against the
# in-process grading only.
FLOW_MUTANT = {"lesson02": ("admission_after_preemption", 2), "lesson03": ("no_cap", 2),
               "lesson04": ("min_tokens_ignored", 3), "lesson05": ("logits_for_partial_chunk", 1),
               "lesson06": ("no_acc_rescale", 1), "lesson07": ("top_p_drops_crossing_token", 2),
               "lesson08": ("rows_in_scheduler_order", 1), "lesson09": ("recover_from_p", 2),
               "lesson10": ("row_bias_every_rank", 3), "lesson11": ("pad_slot_block_0", 2),
               "lesson12": ("text_after_stop_kept", 1)}  # lesson 12's also drops an included stop

# Besides the answers themselves (a one- or two-letter answer, lesson 6's kernel variables `p` and `L`, is
# not searched for: it occurs in any text): a stem the lesson must not print either.
NOT_PRINTED_ALSO = {"lesson05": ("optimistic_seq_lens",)}


def full_marks(lesson_id: str) -> dict[str, int]:
    return {p.grade_id: p.points for p in load_lesson(lesson_id).parts if not p.manual}


def check(f):
    return None


def declare(**kw):
    base = dict(lesson_id="lesson99", title="测试", answer=("f",), questions=("一", "二", "三"),
                code={"main_path": ("主路径", check), "real_engine": ("真实引擎", check), "boundary": ("边界", check)},
                source_map=SourceMap(["a"], {"a": {"0123456789abcdef"}}))
    return Lesson(**{**base, **kw})


@pytest.mark.parametrize("lesson_id", LESSONS)
def test_every_lesson_declares_four_one_point_code_parts_and_three_questions(lesson_id):
    lesson = load_lesson(lesson_id)
    code = [p for p in lesson.parts if not p.manual]
    assert [p.points for p in code] == [1] * CODE_PARTS and lesson.total == TOTAL
    assert [p.grade_id for p in lesson.parts if p.manual] == [f"l{lesson_id[-2:]}_q{i}" for i in (1, 2, 3)]
    assert all(p.grade_id.startswith(f"l{lesson_id[-2:]}_") and p.needs and callable(p.check) for p in code)
    if lesson.source_map is not None:  # the grade cell calls LNN.check_source_map
        assert __import__(f"autograder.{lesson_id}", fromlist=["x"]).check_source_map is lesson.source_map.check


def test_a_valid_declaration_builds_its_parts():
    lesson = declare()
    assert [p.grade_id for p in lesson.parts] == ["l99_main_path", "l99_real_engine", "l99_boundary", "l99_source_map",
                                                  "l99_q1", "l99_q2", "l99_q3"]
    assert lesson.part("l99_q2").title == "Q2 二" and lesson.part("l99_source_map").needs == ("SOURCE_MAP",)


@pytest.mark.parametrize("kw, says", [
    (dict(source_map=None), "it has 3: add 1"),
    (dict(code={k: ("x", check) for k in "abcd"}), "it has 5: remove 1"),
    (dict(questions=("一", "二")), "exactly 3 questions"),
    (dict(answer=()), "grades nothing"),
    (dict(code={"main_path": ("主路径", "check_main_path"), "b": ("b", check), "c": ("c", check)}),
     "(title, check)"),
    (dict(source_map=SourceMap(["a", "b"], {"a": {"0123456789abcdef"}})), "missing ['b']"),
    (dict(source_map=SourceMap(["a"], {"a": {"plain_name"}})), "16 hex digits"),
    (dict(lesson_id="lesson9"), "lessonNN"),
    (dict(pass_mark=11), "pass_mark 11"),
])
def test_a_declaration_that_breaks_a_rule_says_what_to_add(kw, says):
    with pytest.raises(ValueError) as e:
        declare(**kw)
    assert says in str(e.value), str(e.value)


@pytest.mark.slow
@pytest.mark.parametrize("lesson_id", LESSONS)
def test_solution_grade_cells_score_full_in_the_notebook_kernel(lesson_id, executed_solution):
    """Per part, from the solution notebook's own run (nbclient, once per test run: tests/conftest.py), each grade
    cell scored as nbgrader scores it; test_autograder checks that run whole."""
    assert notebook_part_scores(lesson_id, executed_solution(lesson_id)) == full_marks(lesson_id)


@pytest.mark.slow
@pytest.mark.parametrize("lesson_id", LESSONS)
def test_solution_scores_full_in_process(lesson_id, release_scores):
    """The release filled with the solution's answers, graded in this process (release_scores: once per test run,
    the grading test_mutants compares every mutant with)."""
    assert release_scores(lesson_id) == full_marks(lesson_id)


@pytest.mark.parametrize("lesson_id", SOURCE_MAP_LESSONS)
def test_source_map_answers_are_not_printed_by_the_lesson(lesson_id):
    """A student who only skims the lesson cannot copy them: no answer occurs in the lesson's source outside its
    SOURCE_MAP cell, nor in its demo.py and checks.py (which ship with the release)."""
    text = (REPO / f"solutions/{lesson_id}/{lesson_id}.py").read_text(encoding="utf-8")
    start = text.index("SOURCE_MAP = {")
    outside = text[:start] + text[text.index("}", start):]
    for f in ("demo.py", "checks.py"):
        outside += (REPO / "autograder" / lesson_id / f).read_text(encoding="utf-8")
    m = re.search(r"^SOURCE_MAP = (\{.*?^\})", text, re.S | re.M)
    answers = ast.literal_eval(m.group(1))
    for name in [*answers.values(), *NOT_PRINTED_ALSO.get(lesson_id, ())]:
        assert len(name) < 3 or name not in outside, name


@pytest.mark.parametrize("lesson_id", SOURCE_MAP_LESSONS)
def test_release_leaves_a_blank_for_every_source_map_key(lesson_id):
    cells = {c["id"]: "".join(c["source"])
             for c in json.loads((NOTEBOOKS / lesson_id / f"{lesson_id}.ipynb").read_text(encoding="utf-8"))["cells"]}
    cell = cells[f"l{lesson_id[-2:]}_source_map_answer"]
    assert re.findall(r"[\"'](\w+)[\"']\s*:\s*______,", cell) == list(load_lesson(lesson_id).source_map.keys)


@pytest.mark.slow
@pytest.mark.parametrize("lesson_id", [lesson for lesson in LESSONS if lesson != FLOW_LESSON])
def test_nbgrader_end_to_end(lesson_id, tmp_path):
    """generate_assignment -> submissions (solution, blank, mutant) -> autograde -> export; the Colab self-check
    (this process) gives each student the same points per part."""
    name, points = FLOW_MUTANT.get(lesson_id) or (sorted(mutants(lesson_id))[0], None)
    subs, results, _ = grade_three_students(tmp_path, lesson_id, tuple(solution_cells(lesson_id)),
                                            mutants(lesson_id)[name].cell, mutant_source(lesson_id, name))
    parts = full_marks(lesson_id)
    code = {s: sum(v or 0 for k, v in got.items() if k in parts) for s, got in results.items()}
    assert code["solution_student"] == sum(parts.values()) and code["blank_student"] == 0, code
    assert code["mutant_student"] == points if points is not None else code["mutant_student"] < sum(parts.values())
    assert {s: got[f"l{lesson_id[-2:]}_q1"] for s, got in results.items()} == {  # written: pending; untouched: 0
        "solution_student": None, "mutant_student": None, "blank_student": 0}
    for student, got in results.items():
        ns, _ = student_namespace(subs / student / lesson_id / f"{lesson_id}.ipynb")
        assert namespace_scores(lesson_id, ns) == {k: v for k, v in got.items() if k in parts}, student


def test_new_copies_lesson_one_with_every_id_renamed(tmp_path):
    """`python -m autograder new` on a tree holding lesson 1 only (its files as they are)."""
    from autograder.scaffold import new_lesson

    for rel in ("solutions/lesson01/lesson01.py", *(f"autograder/lesson01/{f}" for f in
                                                   ("__init__.py", "checks.py", "demo.py", "mutants.py"))):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((REPO / rel).read_text(encoding="utf-8"), encoding="utf-8")
    written = new_lesson("lesson13", "新课", root=tmp_path)
    assert {p.as_posix() for p in written} >= {"solutions/lesson13/lesson13.py", "autograder/lesson13/checks.py"}
    for p in written:
        text = (tmp_path / p).read_text(encoding="utf-8")
        assert not re.search(r"lesson01|\bl01_|\bL01\b|第 1 课", text), p
    assert 'title="新课"' in (tmp_path / "autograder/lesson13/checks.py").read_text(encoding="utf-8")
    with pytest.raises(SystemExit, match="exists"):
        new_lesson("lesson13", "新课", root=tmp_path)
