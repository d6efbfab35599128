"""Test-wide setup. TRITON_INTERPRET must be set before triton is first imported (DESIGN.md §5)."""
import os
import shutil

import pytest

if shutil.which("nvidia-smi") is None and not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# make test reads vLLM 0.27.1's recorded answers even where .venv-vllm exists (as in CI, where it runs before
# `make vllm`): the lessons' vLLM sections and every comparison take the same path and time everywhere.
# make test-vllm (MINIVLLM_VLLM_LIVE=1) runs vLLM itself.
if os.environ.get("MINIVLLM_VLLM_LIVE") != "1":
    os.environ["MINIVLLM_VLLM_PYTHON"] = os.devnull + "/no-vllm-in-make-test"


@pytest.fixture(scope="session")
def student_release(tmp_path_factory):
    """`python -m autograder release` once per session, for every test that reads the student distribution."""
    from autograder.release import release

    dest = tmp_path_factory.mktemp("release") / "minivllm-release"
    release(dest)
    return dest


@pytest.fixture(scope="session")
def release_scores(tmp_path_factory):
    """(lesson, mutant name or None for the solution) -> code points per part of the student release filled with
    the solution's answers (and that mutant's edits), graded once per session in this process: test_mutants and
    the full-speed run of test_grading_determinism grade the same notebooks the same way."""
    from grading_flow import code_scores

    from autograder.mutation import filled_notebook, mutant_notebook

    done: dict = {}

    def scores(lesson_id: str, answer: str | None = None, messages: dict | None = None) -> dict[str, float]:
        """`messages`, when given, receives each part's verdict message (for the diagnosis table's check)."""
        if (lesson_id, answer) not in done:
            nb = filled_notebook(lesson_id) if answer is None else mutant_notebook(lesson_id, answer)
            said: dict = {}
            done[lesson_id, answer] = code_scores(lesson_id, nb, tmp_path_factory.mktemp(lesson_id), said), said
        got, said = done[lesson_id, answer]
        if messages is not None:
            messages.update(said)
        return dict(got)

    return scores


@pytest.fixture(scope="session")
def executed_solution(tmp_path_factory):
    """lesson -> its solution notebook run once per session (nbclient, each cell within the course's per-cell
    limit), for every test that inspects that run; read it, do not change it."""
    done: dict = {}

    def run(lesson_id: str):
        if lesson_id not in done:
            import nbformat
            from nbclient import NotebookClient

            from autograder.common import REPO
            from autograder.limits import cell_timeout

            nb = nbformat.read(REPO / "solutions" / lesson_id / f"{lesson_id}.ipynb", as_version=4)
            NotebookClient(nb, timeout=round(cell_timeout()), kernel_name="python3",
                           resources={"metadata": {"path": str(tmp_path_factory.mktemp(lesson_id))}}).execute()
            done[lesson_id] = nb
        return done[lesson_id]

    return run


# pytest-xdist (`make test`: --dist loadfile) hands each worker whole test files, in collection order, so a file's
# module fixtures (a graded class, a served engine) are built once. The longest files come first (minutes each on
# 2 cores, from the per-file table below), so the many short ones fill the end and the workers finish together.
# (--dist loadgroup would also keep files that share a session fixture together, but pytest-xdist 3.8.0 cannot
# group under pytest 9: it renames `item._nodeid`, which pytest 9 no longer reads.)
LONGEST_FIRST = ["test_autograder.py", "test_mutants.py", "test_grading_limits.py", "test_grading_isolation.py",
                 "test_grading_cluster.py"]


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its order


_FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::")[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    """Where the suite's time goes (#33): seconds per test file, setup + call + teardown, the 25 largest."""
    if len(_FILE_SECONDS) < 2:
        return
    total = sum(_FILE_SECONDS.values())
    terminalreporter.write_sep("=", f"seconds per test file (setup + call + teardown; {total:.0f} s in all)")
    for path, sec in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])[:25]:
        terminalreporter.write_line(f"{sec:8.1f}  {100 * sec / total:4.1f}%  {path}")
