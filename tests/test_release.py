"""`python -m autograder release DIR`: the student distribution holds no answer text and self-checks to 0."""
import json
import keyword
import os
import re
import subprocess
import sys

import pytest

from autograder.common import REPO, discover_lessons
from autograder.release import release


def answer_texts(lesson_id: str) -> dict[str, set[str]]:
    """Every solution fill, solution region, mark-scheme line and hidden test of a lesson, by kind."""
    nb = json.loads((REPO / "solutions" / lesson_id / f"{lesson_id}.ipynb").read_text(encoding="utf-8"))
    out: dict[str, set[str]] = {"fill": set(), "mark_scheme": set(), "hidden_test": set()}
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        for line in src.splitlines():
            if "### BLANK" in line and not keyword.iskeyword(fill := line.split("### BLANK")[0].strip()):
                out["fill"].add(fill)  # a bare keyword fill (lesson 9's `break`) occurs in any Python file
        for region in re.findall(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", src, re.S):
            out["fill"] |= {x.strip() for x in region.splitlines() if len(x.strip()) > 8}
        for region in re.findall(r"=== BEGIN MARK SCHEME ===(.*?)=== END MARK SCHEME ===", src, re.S):
            out["mark_scheme"] |= {x.strip("# -*").strip() for x in region.splitlines() if len(x.strip("# -*")) > 12}
        for region in re.findall(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", src, re.S):
            out["hidden_test"].add(region.strip())
    out["mark_scheme"].discard("")
    return out


# Fills the released lesson text itself states while teaching the mechanism (lesson 1: the seed's own demo
# narrative, kept verbatim; lesson 3: its mental-model section). Anything else is a leak.
TAUGHT_IN_THE_TEXT = {
    "lesson01": {"grammar = get_grammar(plan)", "process_aborts()"},
    "lesson03": {"max_cache_hit_length = request.num_tokens - 1"},
}


@pytest.fixture(scope="module")
def student_release(tmp_path_factory):
    dest = tmp_path_factory.mktemp("release") / "minivllm-release"
    release(dest)
    return dest


def test_release_has_the_student_files_and_nothing_of_the_instructors(student_release):
    names = {p.relative_to(student_release).as_posix() for p in student_release.rglob("*") if p.is_file()}
    for lesson_id in discover_lessons():
        assert f"notebooks/{lesson_id}/{lesson_id}.ipynb" in names
        assert f"autograder/{lesson_id}/checks.py" in names
        assert f"autograder/{lesson_id}/mutants.py" not in names
    assert {"README.md", "pyproject.toml", "minivllm/engine/core.py", "autograder/sandbox.py"} <= names
    assert any(n.startswith("data/models/") for n in names)
    assert not [n for n in names if n.startswith(("solutions/", "tests/", "benchmarks/"))
                or n in ("autograder/mutation.py", "autograder/build.py", "autograder/grading.py")]


def test_no_answer_text_anywhere_in_the_release(student_release):
    """Fills and solution regions nowhere outside the engine (the engine is the reference by design, but
    never points at the answer); mark schemes and hidden tests nowhere at all."""
    texts = {p.relative_to(student_release).as_posix(): p.read_text(encoding="utf-8", errors="ignore")
             for p in student_release.rglob("*") if p.is_file() and p.suffix in (".py", ".ipynb", ".md", ".toml", ".txt")}
    assert len(texts) > 50
    for lesson_id in discover_lessons():
        answers = answer_texts(lesson_id)
        assert answers["fill"] and answers["mark_scheme"] and answers["hidden_test"], lesson_id
        for path, text in texts.items():
            kinds = ("mark_scheme", "hidden_test") if path.startswith("minivllm/") else tuple(answers)
            for kind in kinds:
                leaked = [a for a in answers[kind] if a in text and not (
                    kind == "fill" and path == f"notebooks/{lesson_id}/{lesson_id}.ipynb"
                    and a in TAUGHT_IN_THE_TEXT.get(lesson_id, ()))]
                assert not leaked, (lesson_id, path, kind, leaked[:3])
    for path, text in texts.items():
        if path.startswith("minivllm/"):
            assert not re.search(r"exercise|solved|solution|lesson \d+'s", text, re.I), path


@pytest.mark.slow
@pytest.mark.parametrize("lesson_id", discover_lessons())
def test_release_notebooks_self_check_to_zero(student_release, lesson_id):
    """The release runs on its own (its autograder and minivllm, not the repository's) and scores 0 unfilled."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(student_release)
    proc = subprocess.run([sys.executable, "-m", "autograder", "check", lesson_id,
                           f"notebooks/{lesson_id}/{lesson_id}.ipynb"], cwd=student_release, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "代码 0/4" in proc.stdout and "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert proc.stdout.count("______") >= 3, proc.stdout  # each code part names the unfilled blank
