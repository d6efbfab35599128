"""A broken grading environment never zeroes a class silently (#43 §4): before a class, `grade` grades the
lesson's reference solution in the same isolated environment (the canary) and refuses, naming the cause, when it
does not score full; `check` refuses to blame the student when the grader itself cannot run."""
import subprocess
import sys
from pathlib import Path

import pytest

from autograder import isolation
from autograder.common import NOTEBOOKS, REPO

LESSON = "lesson01"
NO_ENGINE = '''import sys


class NoEngine:  # this environment cannot import the engine, as an isolated run that does not mount it
    def find_spec(self, name, path=None, target=None):
        if name == "minivllm" or name.startswith("minivllm."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NoEngine())
'''


@pytest.fixture
def no_engine(tmp_path, monkeypatch):
    """An environment whose grading processes (nbgrader's kernel, the sandbox) cannot import minivllm: isolated,
    the run does not mount minivllm/; else every Python process started from here has an import hook that
    refuses it (a sitecustomize on PYTHONPATH)."""
    if isolation.mode().isolated:
        monkeypatch.setattr(isolation, "GRADER_DIRS", tuple(d for d in isolation.GRADER_DIRS if d != "minivllm"))
    else:  # nbgrader's kernel is given only isolation.run_env's allow-list: this test's hook too
        monkeypatch.setattr(isolation, "KEPT_ENV", (*isolation.KEPT_ENV, "PYTHONPATH"))
    site = tmp_path / "no-engine"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NO_ENGINE)
    monkeypatch.setenv("PYTHONPATH", str(site))
    return site


def test_grade_refuses_a_class_when_the_reference_solution_cannot_score(tmp_path, no_engine, capsys):
    from autograder.grading import CANARY, grade, scores
    from autograder.sandbox import GraderBroken

    subs = tmp_path / "subs"
    for student, nb in (("alice", REPO / "solutions" / LESSON / f"{LESSON}.ipynb"),
                        ("bob", NOTEBOOKS / LESSON / f"{LESSON}.ipynb")):
        (subs / student / LESSON).mkdir(parents=True)
        (subs / student / LESSON / f"{LESSON}.ipynb").write_bytes(nb.read_bytes())
    course = tmp_path / "course"
    with pytest.raises(GraderBroken) as refused:
        grade(subs, course, tmp_path / "grades.csv", [LESSON])
    text = str(refused.value)
    assert text.startswith(f"{LESSON}: grading did not start: ") and "No module named 'minivllm'" in text, text
    assert "运行你的代码" not in text and "scores stand" not in text, text  # no student's code ran
    assert scores(course, LESSON) == {}  # no student was graded, none was given a 0
    assert not (tmp_path / "grades.csv").exists()
    assert not (course / "submitted" / CANARY).exists() and not (course / "autograded" / CANARY).exists()


def test_check_refuses_to_blame_the_student_when_the_grader_cannot_run(no_engine, capsys):
    from autograder.__main__ import main

    with pytest.raises(SystemExit) as refused:  # in-process: the isolated variant patches this process
        main(["check", LESSON, str(NOTEBOOKS / LESSON / f"{LESSON}.ipynb")])
    out = capsys.readouterr().out
    assert refused.value.code == 2, out
    assert "没有评分" in out and "No module named 'minivllm'" in out and "这不是你的答案的问题" in out, out
    assert "0/1" not in out and "代码 0/4" not in out
    if not isolation.mode().isolated:  # the command line as a student runs it (a new process: the hook holds)
        proc = subprocess.run([sys.executable, "-m", "autograder", "check", LESSON], cwd=REPO, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 2 and "No module named 'minivllm'" in proc.stdout, proc.stdout + proc.stderr[-2000:]


def test_the_canary_passes_and_leaves_nothing_behind(lesson01_class):
    """In a working environment the reference solution scores full in nbgrader's kernel and the sandbox: `grade`
    ran the canary before lesson 1's class (tests/conftest.py, graded once per run; a failing canary raises
    GraderBroken there), and nothing of it is left in the course folder or the scores."""
    from autograder.grading import CANARY, scores

    course = lesson01_class["course"]
    assert CANARY not in scores(course, LESSON) and scores(course, LESSON) == lesson01_class["results"]
    assert set(lesson01_class["results"]) == {"solution_student", "blank_student", "mutant_student",
                                              "misconception_student"}
    assert not (course / "submitted" / CANARY).exists() and not (course / "autograded" / CANARY).exists()
    assert not (course / "feedback" / CANARY).exists() and CANARY not in lesson01_class["pages"]
    assert not list(Path(course).glob(".gradebook-*"))
