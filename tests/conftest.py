"""Test-wide setup. TRITON_INTERPRET must be set before triton is first imported (it is read once, at import)."""
import os
import shutil

import pytest

if shutil.which("nvidia-smi") is None and not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# make test reads the pinned vLLM's recorded answers even where .venv-vllm exists (as in CI, where it runs before
# `make vllm`): the lessons' vLLM sections and every comparison take the same path and time everywhere.
# make test-vllm (MINIVLLM_VLLM_LIVE=1) runs vLLM itself.
if os.environ.get("MINIVLLM_VLLM_LIVE") != "1":
    os.environ["MINIVLLM_VLLM_PYTHON"] = os.devnull + "/no-vllm-in-make-test"
# Tests never download: a notebook's first cell run here (lesson demos, the Colab cell) reads the pinned vLLM's source
# where `make vllm-source` put it, and otherwise says how to fetch it (autograder/vllm_source.py notebook_setup).
os.environ["MINIVLLM_VLLM_SOURCE_FETCH"] = "0"


@pytest.fixture(scope="session")
def student_release(tmp_path_factory):
    """`python -m autograder release` once per session, for every test that reads the student distribution."""
    from autograder.release import release

    dest = tmp_path_factory.mktemp("release") / "minivllm-release"
    release(dest)
    return dest


def _run_root(tmp_path_factory):
    """This run's temporary folder that every pytest-xdist worker sees (each worker's basetemp is a folder of it);
    without xdist, the session's own basetemp."""
    from pathlib import Path

    base = Path(tmp_path_factory.getbasetemp())
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "once"
    root.mkdir(exist_ok=True)
    return root


@pytest.fixture(scope="session")
def once(tmp_path_factory):
    """once(key, compute, dump=json.dumps, load=json.loads): compute() run once per test run, by whichever
    pytest-xdist worker asks first; a worker that asks later (or meanwhile: it waits on the lock) reads the result
    from the run's shared temporary folder (pytest-xdist's recipe for a session fixture built once). Every caller,
    the first included, gets load(dump(value)), so all see the same types. compute(folder) gets a folder of its
    own in that shared place, for files other workers read too. A compute that raises stores nothing: the next
    caller computes again (and fails the same way)."""
    import json

    from filelock import FileLock

    root = _run_root(tmp_path_factory)
    memo: dict = {}

    def get(key: str, compute, dump=json.dumps, load=json.loads):
        if key not in memo:
            path = root / f"{key}.out"
            with FileLock(str(root / f"{key}.lock")):
                if not path.exists():
                    folder = root / f"{key}.files"
                    folder.mkdir(exist_ok=True)
                    part = root / f"{key}.part"
                    part.write_text(dump(compute(folder)), encoding="utf-8")
                    part.replace(path)
                memo[key] = path.read_text(encoding="utf-8")
        return load(memo[key])

    return get


@pytest.fixture(scope="session")
def tiny_model(once):
    """tiny_model(arch, **overrides) -> the folder of tests/tiny_models.make_tiny_model's checkpoint, built once per
    test run (`once`; a seeded build, so every test file that used to build the same one gets the same weights);
    read it, do not change it."""
    import json

    from tiny_models import make_tiny_model

    def get(arch: str, **overrides) -> str:
        key = "tiny-" + arch + "".join(f"-{k}={v}" for k, v in sorted(overrides.items()))
        return once(key, lambda folder: make_tiny_model(arch, folder / arch, **overrides), json.dumps, json.loads)

    return get


@pytest.fixture(scope="session")
def release_scores(once):
    """(lesson, mutant name or None for the solution) -> code points per part of the student release filled with
    the solution's answers (and that mutant's edits), graded once per test run in a test process (`once`):
    test_mutants, the full-speed run of test_grading_determinism, the lessons' grading tests and test_diagnosis
    grade the same notebooks the same way."""
    from grading_flow import code_scores

    from autograder.mutation import filled_notebook, mutant_notebook

    def scores(lesson_id: str, answer: str | None = None, messages: dict | None = None) -> dict[str, float]:
        """`messages`, when given, receives each part's verdict message (for the diagnosis table's check)."""
        def grade(folder):
            nb = filled_notebook(lesson_id) if answer is None else mutant_notebook(lesson_id, answer)
            said: dict = {}
            return [code_scores(lesson_id, nb, folder, said), said]

        got, said = once(f"scores-{lesson_id}-{answer or 'solution'}", grade)
        if messages is not None:
            messages.update(said)
        return dict(got)

    return scores


@pytest.fixture(scope="module")
def solution_ns(request):
    """The solution notebook's namespace (its cells run in this process) for the lesson a test module is named
    for (tests/test_lessonNN_*.py)."""
    import re

    from autograder.common import REPO, student_namespace

    lesson_id = re.search(r"lesson\d\d", request.module.__name__).group(0)
    ns, errors = student_namespace(REPO / f"solutions/{lesson_id}/{lesson_id}.ipynb")
    assert not errors, errors
    return ns


@pytest.fixture(scope="session")
def executed_solution(once):
    """lesson -> its solution notebook run once per test run (`once`; nbclient, each cell within the course's
    per-cell limit), for every test that inspects that run; read it, do not change it."""
    import nbformat

    def run(lesson_id: str):
        def execute(folder):
            from nbclient import NotebookClient

            from autograder.common import REPO
            from autograder.limits import cell_timeout

            nb = nbformat.read(REPO / "solutions" / lesson_id / f"{lesson_id}.ipynb", as_version=4)
            NotebookClient(nb, timeout=round(cell_timeout()), kernel_name="python3",
                           resources={"metadata": {"path": str(folder)}}).execute()
            return nb

        return once(f"executed-{lesson_id}", execute, nbformat.writes, lambda text: nbformat.reads(text, as_version=4))

    return run


# Lesson 1's graded class: the nbgrader three-student flow (tests/grading_flow.py) and the feedback page's wrong
# student, one `grade -j 2` (its canary included) for test_lesson01_grading, test_feedback_page and
# test_grading_canary. Written answers: the solution's and the mutant's Q1 ("pending"), the blank's untouched (0).
LESSON01_Q1 = "（学生写下的回答）"
MISCONCEPTION_Q1 = "**Q1 你的答案**：EngineCore 拥有 busy loop 与 abort 队列。"


@pytest.fixture(scope="session")
def lesson01_class(once):
    """One graded lesson-1 class per test run (`once`): dict with the course, submissions and CSV folders, the
    per-part results, grade's phase timings (PHASES), the feedback pages by student, and what grade printed.
    Students: solution_student, blank_student, mutant_student (update_before_aborts, the flow's mutant) and
    misconception_student (aborts_skipped with its Q1 written and its source map left blank, the feedback's)."""
    from pathlib import Path

    def build(folder):
        import contextlib
        import io

        from grading_flow import make_submission, solution_cells

        from autograder.grading import PHASES, feedback, grade
        from autograder.mutation import mutant_source

        sol = solution_cells("lesson01")
        answers = {k: sol[k] for k in ("l01_engine_core_step", "l01_source_map_answer")}
        answers["l01_q1"] = LESSON01_Q1
        subs = folder / "submissions"
        make_submission(subs, "lesson01", "solution_student", answers)
        make_submission(subs, "lesson01", "blank_student", {})
        make_submission(subs, "lesson01", "mutant_student",
                        dict(answers, l01_engine_core_step=mutant_source("lesson01", "update_before_aborts")))
        make_submission(subs, "lesson01", "misconception_student", {
            "l01_engine_core_step": mutant_source("lesson01", "aborts_skipped"), "l01_q1": MISCONCEPTION_Q1})
        PHASES.clear()
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            results = grade(subs, folder / "course", folder / "grades.csv", ["lesson01"], jobs=2)["lesson01"]
        phases = list(PHASES)
        pages = {p.parts[-3]: str(p) for p in feedback(folder / "course", ["lesson01"])}
        return {"folder": str(folder), "results": results, "phases": phases, "pages": pages,
                "printed": printed.getvalue()}

    got = once("lesson01-class", build)
    folder = Path(got["folder"])
    got.update(course=folder / "course", subs=folder / "submissions", csv=folder / "grades.csv",
               pages={s: Path(p) for s, p in got["pages"].items()})
    return got


# pytest-xdist (`make test`: --dist loadfile) hands each worker whole test files, so a file's module fixtures (a
# graded class, a served engine) are built once; in collection order only with its reordering off (below: by default
# it sorts files by their number of tests, which put the 5-test, 6-minute test_grading_cluster last, one worker busy
# alone at the end). The longest files come first, each to the worker that frees first, from `make test`'s per-file
# table (seconds on 2 loaded cores, 2026-12): mutants 652, autograder 455, grading_cluster 373, grading_limits 249,
# llm_vs_hf 202, tensor_parallel 155, llm_api 149, release 149, grading_determinism 112, lessons 109, feedback_page
# 104, vllm_server_oracle 101, vllm_oracle 94, dev_routes 91, grading_isolation ~70 (with bubblewrap), fault_inputs
# 71; the many short ones fill the end, so the workers finish together.
# (--dist loadgroup would also keep files that share a session fixture together, but pytest-xdist 3.8.0 cannot
# group under pytest 9: it renames `item._nodeid`, which pytest 9 no longer reads.)
# A file that builds a result others read (`once`) starts before its readers, so no worker sits waiting on the lock
# while another builds it: test_autograder runs every executed_solution test_lessons reads; test_feedback_page builds
# lesson01_class (~100 s on 2 loaded cores), test_grading_canary and test_lesson01_grading read it, last.
LONGEST_FIRST = ["test_mutants.py", "test_autograder.py", "test_grading_cluster.py", "test_grading_limits.py",
                 "test_llm_vs_hf.py", "test_tensor_parallel.py", "test_llm_api.py", "test_release.py",
                 "test_grading_determinism.py", "test_lessons.py", "test_feedback_page.py",
                 "test_vllm_server_oracle.py", "test_vllm_oracle.py", "test_dev_routes.py", "test_grading_isolation.py",
                 "test_fault_inputs.py"]
READERS_LAST = ["test_grading_canary.py", "test_lesson01_grading.py"]


def pytest_configure(config):
    """Keep LONGEST_FIRST's order: pytest-xdist's loadfile would otherwise sort the files by their number of tests."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    last = {name: len(rank) + 1 + i for i, name in enumerate(READERS_LAST)}
    items.sort(key=lambda item: rank.get(item.path.name, last.get(item.path.name, len(rank))))  # stable sort


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
