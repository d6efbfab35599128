"""One list of commands for the student: the release's Makefile. No notebook and no released file names a make
target the release's Makefile lacks, or a `python -m autograder...` module / script the release does not ship."""
import re
from pathlib import Path

import pytest

from autograder.common import NOTEBOOKS, REPO, discover_lessons
from autograder.pin import VLLM_VERSION
from autograder.release import STUDENT_MAKEFILE

# a make command as code: backticked, in brackets, at a line's start or after a shell prompt (not "make every")
MAKE = re.compile(r"(?:[`（(]|^[ \t#]*|\$ |!)make ([a-z][\w-]*)", re.M)
MODULE = re.compile(r"python3? -m (autograder(?:\.\w+)*)")
SCRIPT = re.compile(r"python3? ([\w/]+\.py)\b")
TEXT = (".py", ".ipynb", ".md", ".toml", ".txt", ".json", "")  # "" : Makefile
# Shipped only for the harness the lessons' vLLM sections import; its CLI and messages are the instructors' (they
# run in the course repository, where `make record-vllm` and `python -m autograder.vllm_oracle` exist).
INSTRUCTOR_TOOLS = {"autograder/vllm_oracle/__init__.py"}


def targets(makefile: str) -> set[str]:
    """The targets a Makefile defines (rule heads, not variable assignments)."""
    return {t for line in makefile.splitlines() if (m := re.match(r"^([\w./-]+(?: [\w./-]+)*)\s*:(?!=)", line))
            for t in m.group(1).split()}


def texts(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text(encoding="utf-8", errors="ignore")
            for p in sorted(root.rglob("*")) if p.is_file() and p.suffix in TEXT and "__pycache__" not in p.parts}


def missing_commands(files: dict[str, str], have_targets: set[str], root: Path) -> list[tuple[str, str]]:
    bad = []
    for path, text in files.items():
        bad += [(path, f"make {t}") for t in MAKE.findall(text) if t not in have_targets]
        for mod in MODULE.findall(text):
            rel = Path(*mod.split("."))
            if not ((root / rel).with_suffix(".py").is_file() or (root / rel / "__main__.py").is_file()):
                bad.append((path, f"python -m {mod}"))
        bad += [(path, f"python {s}") for s in SCRIPT.findall(text) if not (root / s).is_file()]
    return bad


def test_the_release_makefile_has_the_targets_the_course_names(student_release):
    have = targets((student_release / "Makefile").read_text(encoding="utf-8"))
    assert {"install", "lab", "check", "vllm-source", "vllm"} <= have
    assert "vllm-source" in targets((REPO / "Makefile").read_text(encoding="utf-8"))
    assert (student_release / "install.py").is_file()
    assert (student_release / f"data/vllm_oracle/vllm-{VLLM_VERSION}-wheel-py.sha256").is_file()


def test_no_released_file_names_a_command_the_release_lacks(student_release):
    have = targets((student_release / "Makefile").read_text(encoding="utf-8"))
    files = {p: t for p, t in texts(student_release).items() if not p.startswith("minivllm/")}
    assert "README.md" in files and "Makefile" in files and any(p.endswith(".ipynb") for p in files)
    for path in INSTRUCTOR_TOOLS:  # each exemption still needed: it ships and names instructor-only commands
        assert missing_commands({path: files.pop(path)}, have, student_release), f"{path}: drop the exemption"
    assert not missing_commands(files, have, student_release)


def test_no_notebook_names_a_command_the_release_lacks(student_release):
    have = targets(STUDENT_MAKEFILE)
    files = {f"notebooks/{p}": t for p, t in texts(NOTEBOOKS).items()}
    assert len([p for p in files if p.endswith(".ipynb")]) == len(discover_lessons())
    assert not missing_commands(files, have, student_release)


@pytest.mark.parametrize("text,found", [
    ("run `make vllm` first", []),
    ("run `make lab`", []),
    ("run `make demo` first", [("x.md", "make demo")]),
    ("本地（make test）", [("x.md", "make test")]),
    ("$ make record-vllm", [("x.md", "make record-vllm")]),
    ("these make every lesson shorter", []),
    ("`python -m autograder.vllm_source fetch`", []),
    ("`python -m autograder.vllm_oracle record`", [("x.md", "python -m autograder.vllm_oracle")]),
    ("python install.py", []),
    ("python setup_course.py", [("x.md", "python setup_course.py")]),
])
def test_the_scan_finds_a_command_the_release_lacks(student_release, text, found):
    have = targets((student_release / "Makefile").read_text(encoding="utf-8"))
    assert missing_commands({"x.md": text}, have, student_release) == found
