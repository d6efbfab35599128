"""The course pipeline: blanks, the build, notebook/lesson consistency and the self-check CLI."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.build import build_files
from autograder.common import REPO, discover_lessons, grade_namespace, load_lesson, student_namespace
from autograder.preprocessors import blank_line, blank_source

SEED_STUB = '''def engine_core_step(has_requests, schedule, execute_async,
                     get_grammar, process_aborts, update):
    trace = []
    if not has_requests:
        return {}, False, trace

    # TODO：保持 schedule → async execute/grammar → wait → aborts → update。
    plan = ______
    trace.append("schedule")
    future = ______
    trace.append("execute")
    grammar = ______
    trace.append("grammar")
    model_output = ______
    trace.append("wait")
    ______
    trace.append("aborts")
    outputs = ______
    trace.append("update")
    return outputs, plan["scheduled_tokens"] > 0, trace'''


def cells(path):
    return json.loads(Path(path).read_text(encoding="utf-8"))["cells"]


def src(cell):
    return "".join(cell["source"])


@pytest.mark.parametrize("line, expected", [
    ("    plan = schedule()  ### BLANK", "    plan = ______"),
    ("    process_aborts()  ### BLANK", "    ______"),
    ('    "plan": "scheduler.schedule",  ### BLANK', '    "plan": ______,'),
    ('    "outputs": "x.y"  ### BLANK', '    "outputs": ______'),
    ("    x += f(a=1)  ### BLANK", "    x += ______"),
    ("    f(a=1)  ### BLANK", "    ______"),
    ("    y == 3  ### BLANK", "    ______"),
])
def test_blank_line(line, expected):
    assert blank_line(line) == expected


def test_unmarked_lines_are_kept():
    text = "a = 1\nb = f(a)  # a comment\n"
    assert blank_source(text) == (text, False)
    assert blank_line("a = 1") is None


def test_lessons_are_discovered_by_folder():
    assert "lesson01" in discover_lessons()
    assert all(load_lesson(lid).lesson_id == lid for lid in discover_lessons())


@pytest.mark.slow
@pytest.mark.parametrize("lesson_id", discover_lessons())
def test_generated_notebooks_are_fresh(lesson_id):
    """notebooks/ and solutions/*.ipynb equal a fresh `python -m autograder build`."""
    stale = [str(rel) for rel, text in build_files(lessons=[lesson_id]).items()
             if not (REPO / rel).exists() or (REPO / rel).read_text(encoding="utf-8") != text]
    assert not stale, f"stale generated notebooks (run `python -m autograder build`): {stale}"


@pytest.mark.parametrize("lesson_id", discover_lessons())
def test_grade_cells_match_the_lesson_parts(lesson_id):
    lesson = load_lesson(lesson_id)
    graded = {}
    for c in cells(REPO / "solutions" / lesson_id / f"{lesson_id}.ipynb"):
        meta = c["metadata"].get("nbgrader", {})
        if meta.get("grade") or meta.get("task"):
            graded[meta["grade_id"]] = meta["points"]
    assert graded == {p.grade_id: p.points for p in lesson.parts}
    assert lesson.total == 10 and lesson.pass_mark == 8
    assert sum(p.points for p in lesson.parts if not p.manual) == 4


@pytest.mark.parametrize("lesson_id", discover_lessons())
def test_release_holds_no_answers(lesson_id):
    text = (REPO / "notebooks" / lesson_id / f"{lesson_id}.ipynb").read_text(encoding="utf-8")
    for leak in ("### BLANK", "BEGIN SOLUTION", "MARK SCHEME", "HIDDEN TESTS", "参考答案**", "NotImplementedError"):
        assert leak not in text, leak
    assert "/tmp/" not in text and str(REPO) not in text
    for c in cells(REPO / "notebooks" / lesson_id / f"{lesson_id}.ipynb"):
        assert c.get("outputs", []) == [] and c.get("execution_count") is None


def test_lesson01_student_copy_shows_the_seed_blanks():
    by_id = {c["id"]: c for c in cells(REPO / "notebooks/lesson01/lesson01.ipynb")}
    assert src(by_id["l01_engine_core_step"]) == SEED_STUB
    assert src(by_id["l01_source_map_answer"]).count(": ______,") == 6
    sol = {c["id"]: c for c in cells(REPO / "solutions/lesson01/lesson01.ipynb")}
    assert "future.result" in src(sol["l01_source_map_answer"])
    assert "参考答案" in src(sol["l01_q1"]) and "参考答案" not in src(by_id["l01_q1"])


def run_check(nb):
    return subprocess.run([sys.executable, "-m", "autograder", "check", "lesson01", str(nb)],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_check_cli_on_the_solution():
    """(The CLI on the unfilled release: tests/test_release.py's self-check, every lesson, run from the release.)"""
    good = run_check(REPO / "solutions/lesson01/lesson01.ipynb")
    assert good.returncode == 0, good.stdout + good.stderr
    assert "代码 4/4" in good.stdout and "待人工评分" in good.stdout


@pytest.mark.parametrize("lesson_id", discover_lessons())
def test_reading_table_names_exist_in_minivllm(lesson_id):
    """Every `minivllm/...py`：`Name`、`name` in a lesson's reading table is a real file that names them."""
    import re

    text = "".join(src(c) for c in cells(REPO / "solutions" / lesson_id / f"{lesson_id}.ipynb"))
    refs = re.findall(r"`(minivllm/[\w/]+\.py)`(?:：((?:`[\w.]+`、?)+))?", text)
    assert refs
    for path, names in refs:
        code = (REPO / path).read_text(encoding="utf-8")
        for name in re.findall(r"`([\w.]+)`", names or ""):
            for part in name.split("."):
                assert re.search(rf"\b{part}\b", code), f"{path} has no {part!r} ({name})"


@pytest.mark.slow
@pytest.mark.parametrize("lesson_id", discover_lessons())
def test_solution_notebook_runs_on_cpu_with_all_grade_cells_passing(lesson_id, executed_solution):
    """Every cell within the course's per-cell limit (autograder/limits.py), no errors, no stderr in grade cells,
    and the report cell gives every code point. (Not a speed assertion: the limit is the bound grading enforces.)"""
    nb = executed_solution(lesson_id)
    text = ""
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        for out in cell.get("outputs", []):
            assert out.output_type != "error", (cell.id, out.get("evalue"))
            if meta.get("grade"):  # nbgrader scores a grade cell that writes to stderr 0
                assert not (out.output_type == "stream" and out.name == "stderr"), (cell.id, out.text)
            text += out.get("text", "")
    code_max = sum(p.points for p in load_lesson(lesson_id).parts if not p.manual)
    assert f"代码 {code_max}/{code_max}；" in text
    assert SOLUTION_PRINTS.get(lesson_id, "") in text


SOLUTION_PRINTS = {"lesson06": "真实引擎检查通过"}  # a lesson's own line that only a passing run prints


@pytest.mark.parametrize("lesson_id", discover_lessons())
def test_unfilled_release_gets_zero_and_does_not_crash(lesson_id):
    """Every lesson's student copy, blanks left as `______`, runs and scores 0 on every code part."""
    ns, errors = student_namespace(REPO / f"notebooks/{lesson_id}/{lesson_id}.ipynb")
    assert not errors  # `______` is defined: the cells run, the checks fail
    results = [r for r in grade_namespace(load_lesson(lesson_id), ns) if not r.part.manual]
    assert [r.score for r in results] == [0, 0, 0, 0]
    assert all("______" in r.message for r in results), [r.message for r in results]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_student_lab_has_no_formgrader(tmp_path):
    """`make lab`'s config (autograder/jupyter-student): nbgrader's server extensions and lab UI are off."""
    import os
    import socket
    import time
    import urllib.error
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, JUPYTER_CONFIG_PATH=str(REPO / "autograder" / "jupyter-student"))
    lab = subprocess.Popen([sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}", "--allow-root",
                            "--IdentityProvider.token=t", f"--notebook-dir={tmp_path}"], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def status(path):
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}?token=t", timeout=5).status
            except urllib.error.HTTPError as e:
                return e.code
            except OSError:
                return None
        for _ in range(90):
            if status("/lab") == 200:
                break
            time.sleep(1)
        assert status("/lab") == 200
        assert status("/formgrader") == 404
    finally:
        lab.terminate()
        lab.wait(timeout=30)
    listed = subprocess.run([sys.executable, "-m", "jupyter", "labextension", "list"], env=env, capture_output=True,
                            text=True, timeout=60)
    assert "@jupyter/nbgrader v0.9.6 \x1b[31mdisabled" in listed.stdout + listed.stderr or \
        "@jupyter/nbgrader v0.9.6 disabled" in listed.stdout + listed.stderr


@pytest.mark.parametrize("lesson_id", discover_lessons())
def test_lesson_source_is_in_jupytext_normal_form(lesson_id):
    """Every markdown line of a lesson source carries its `# ` prefix: jupytext reads a bare line into the cell
    anyway (`### x` even becomes `## x`), so only a round trip shows the source is not what it seems."""
    import jupytext

    text = (REPO / "solutions" / lesson_id / f"{lesson_id}.py").read_text(encoding="utf-8")
    again = jupytext.writes(jupytext.reads(text, fmt="py:percent"), fmt="py:percent")
    again = re.sub(r"#   jupytext:\n(#     .*\n|#       .*\n)+", "", again)
    assert again == text


def _names(source: str) -> tuple[set[str], set[str]]:
    """(names a cell binds at its top level, names it reads) — enough to see which cell a name comes from. A name
    bound only inside a function, class, lambda or comprehension is that scope's, not the notebook's (lesson 8's
    grade cell read `row`, which its answer cell binds only as a local of choice_bitmask)."""
    import ast

    from autograder.common import _to_python

    scopes = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp, ast.SetComp,
              ast.DictComp, ast.GeneratorExp)
    binds, top_reads, nested_reads, local = set(), set(), set(), set()

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if top and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                binds.add(child.name)
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                (binds if top else local).update(a.asname or a.name.split(".")[0] for a in child.names)
            if isinstance(child, ast.Name):
                if isinstance(child.ctx, ast.Load):
                    (top_reads if top else nested_reads).add(child.id)
                else:
                    (binds if top else local).add(child.id)
            if isinstance(child, ast.arg):
                local.add(child.arg)
            visit(child, top and not isinstance(child, scopes))

    visit(ast.parse(_to_python(source)), True)
    return binds, top_reads | (nested_reads - local)


@pytest.mark.parametrize("lesson_id", discover_lessons())
def test_graded_cells_do_not_read_names_only_the_skipped_cells_bind(lesson_id):
    """Autograde skips the release's ungraded code cells (SkipUngradedCells): no setup, answer or grade cell may
    read a name that only such a cell binds (lesson 6's boundary cell once read `out_hot` from its exploration)."""
    bound_by_graded, from_skipped, bad = set(), {}, []
    for c in cells(REPO / "notebooks" / lesson_id / f"{lesson_id}.ipynb"):
        if c["cell_type"] != "code":
            continue
        binds, reads = _names(src(c))
        if "nbgrader" in c["metadata"]:
            bad += [(c["id"], n, from_skipped[n]) for n in reads - binds - bound_by_graded if n in from_skipped]
            bound_by_graded |= binds
        else:
            from_skipped.update(dict.fromkeys(binds - from_skipped.keys(), c["id"]))
    assert not bad, bad


def test_autograde_skips_the_release_demo_cells_and_runs_the_students_own(tmp_path):
    """The preprocessor alone (the lesson 1 nbgrader flow checks a real autograde): release demo cells tagged and
    marked not run; a student's added cell and every nbgrader cell run; a student's own skip tag is removed."""
    import nbformat

    from autograder.preprocessors import NOT_RUN, UNGRADED_TAG, SkipUngradedCells

    nb = nbformat.read(REPO / "notebooks/lesson01/lesson01.ipynb", as_version=4)
    grade_cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade") and c.cell_type == "code")
    grade_cell.metadata["tags"] = [UNGRADED_TAG]
    nb.cells.append(nbformat.v4.new_code_cell("print('mine')", id="student-added"))
    nb, _ = SkipUngradedCells().preprocess(nb, {"nbgrader": {"notebook": "lesson01"}})
    skipped = {c.id for c in nb.cells if UNGRADED_TAG in c.metadata.get("tags", [])}
    release = {c["id"] for c in cells(REPO / "notebooks/lesson01/lesson01.ipynb")
               if c["cell_type"] == "code" and "nbgrader" not in c["metadata"]}
    assert skipped == release and len(release) >= 5
    assert all(c.outputs[0].text == NOT_RUN for c in nb.cells if c.id in skipped)
    nb, _ = SkipUngradedCells().preprocess(nb, {"nbgrader": {"notebook": "no-such-lesson"}})
    assert not [c for c in nb.cells if UNGRADED_TAG in c.metadata.get("tags", [])]  # not ours: everything runs


def test_nbformat_import_does_not_build_the_rfc3987_parser():
    """Every nbgrader call imports nbformat -> jsonschema; jsonschema 4.25+ then imports rfc3987-syntax, which
    builds an Earley parser at import (1.7 s per process here). pyproject pins jsonschema<4.25 (#33)."""
    out = subprocess.run([sys.executable, "-c", "import sys, nbformat.validator, nbgrader.apps; "
                          "print('rfc3987_syntax' in sys.modules)"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(("written", "name"), [
    ("self.block_pool.touch()", "touch"), ("`vllm.v1.core.block_pool.BlockPool.touch`", "touch"),
    ("self.input_batch.optimistic_seq_lens_cpu[:num_reqs]", "optimistic_seq_lens_cpu"), ("Touch", "touch")])
def test_a_source_map_answer_is_compared_by_its_last_name(written, name):
    """A name copied from a shown line with its call, subscript or dotted path is the name (lesson 5's review)."""
    from autograder.common import last_name

    assert last_name(written) == name
