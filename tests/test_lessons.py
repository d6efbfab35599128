"""What every lesson shares, once for all of them (discovered by folder): its declaration meets the course's rules,
and a lesson that breaks one fails when it is declared, with what to add."""

import pytest

from autograder.common import CODE_PARTS, TOTAL, Lesson, SourceMap, discover_lessons, load_lesson

LESSONS = discover_lessons()


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
