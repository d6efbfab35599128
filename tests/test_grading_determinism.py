"""Every verdict is deterministic: the same answers (each real-engine lesson's solution and a few of its mutants)
graded with the engine at full speed, with the EngineCore thread slowed (a delay at each step and right after
each forward is launched, so the forward finishes before the core's CPU work starts), with the forward slowed
(a delay on the worker thread before each forward, so the core is always ahead) and with a clock that runs 20
times fast (any "within N s" window closes 20 times sooner) get identical per-part scores, and the expected ones.

The delays reach a grading subprocess too: `SPEED` below is also written as a sitecustomize.py on PYTHONPATH
with MINIVLLM_TEST_ENGINE_SPEED set, so an EngineCore in its own process (lesson 12's server) is slowed alike.
"""
import contextlib
import importlib
import os
import sys

import pytest
from grading_flow import code_scores

from autograder.common import load_lesson
from autograder.mutation import filled_notebook, mutant_notebook, mutants

# Installed in this process by `engine_speed`, and in every Python child through sitecustomize.py.
SPEED = '''
import os, time

def install(mode):
    """Patch minivllm's engine for `mode`; returns the undo. Counts each delayed call in CALLS."""
    from minivllm.engine.core import EngineCore
    from minivllm.executor.uniproc_executor import UniProcExecutor
    from minivllm.worker.gpu_worker import Worker
    undo, delay = [], 0.03

    def patch(owner, name, wrap):
        original = owner.__dict__[name]
        setattr(owner, name, wrap(original))
        undo.append(lambda: setattr(owner, name, original))

    def before(original):
        def run(*args, **kw):
            CALLS.append(mode)
            time.sleep(delay)
            return original(*args, **kw)
        return run

    def after(original):
        def run(*args, **kw):
            out = original(*args, **kw)
            CALLS.append(mode)
            time.sleep(delay)
            return out
        return run

    if mode == "slow_core":
        patch(EngineCore, "step", before)
        patch(EngineCore, "step_with_batch_queue", before)
        patch(UniProcExecutor, "execute_model", after)
    elif mode == "slow_forward":
        patch(Worker, "execute_model", before)
    elif mode == "fast_clock":
        for name in ("monotonic", "perf_counter", "time"):
            real, start = getattr(time, name), getattr(time, name)()
            def fast(real=real, start=start):
                CALLS.append(mode)
                return start + 20 * (real() - start)
            setattr(time, name, fast)
            undo.append(lambda name=name, real=real: setattr(time, name, real))
    return lambda: [u() for u in reversed(undo)]

CALLS = []
if os.environ.get("MINIVLLM_TEST_ENGINE_SPEED", "full_speed") != "full_speed":
    install(os.environ["MINIVLLM_TEST_ENGINE_SPEED"])
'''
MODES = ("full_speed", "slow_core", "slow_forward", "fast_clock")

# (lesson, answer): None is the solution. Lessons whose checks run the real engine in this process.
ANSWERS = [
    ("lesson07", None), ("lesson07", "one_generator_for_the_batch"), ("lesson07", "sort_for_top_k"),
    ("lesson08", None), ("lesson08", "rows_in_scheduler_order"),
    ("lesson09", None), ("lesson09", "no_bonus_token"),
    ("lesson11", None), ("lesson11", "padded_logits"),
]
# Lesson 12's checks run the engine in a spawned server process, out of this patch's reach (and its counter's):
# tests/test_lesson12_grading.py::test_disconnect_verdict_does_not_depend_on_engine_speed slows and speeds that
# core itself and grades the solution and `disconnect_not_sent_to_core` the same either way.
LESSON12: list = []


@contextlib.contextmanager
def engine_speed(mode: str, tmp_path, monkeypatch):
    """This process patched for `mode`; children started inside see the same through sitecustomize.py."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "sitecustomize.py").write_text(SPEED, encoding="utf-8")
    monkeypatch.setenv("MINIVLLM_TEST_ENGINE_SPEED", mode)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    ns: dict = {"__name__": "engine_speed"}
    exec(compile(SPEED.split("CALLS = []")[0] + "CALLS = []\n", "<engine speed>", "exec"), ns)  # no auto-install
    undo = ns["install"](mode) if mode != "full_speed" else (lambda: None)
    try:
        yield ns["CALLS"]
    finally:
        undo()


@pytest.mark.slow
@pytest.mark.parametrize("lesson_id, answer", ANSWERS + LESSON12)
def test_scores_do_not_depend_on_engine_speed(lesson_id, answer, tmp_path, monkeypatch, release_scores):
    nb = filled_notebook(lesson_id) if answer is None else mutant_notebook(lesson_id, answer)
    scores = {"full_speed": release_scores(lesson_id, answer)}  # the engine unpatched: test_mutants' grading
    checks = importlib.import_module(f"autograder.{lesson_id}.checks")
    for mode in MODES[1:]:
        with monkeypatch.context() as mp, engine_speed(mode, tmp_path / mode, mp) as calls:
            if hasattr(checks, "_PASSED"):  # lesson 7 runs the engine once per answer and process: run it again
                mp.setattr(checks, "_PASSED", set())
            scores[mode] = code_scores(lesson_id, nb, tmp_path / mode)
            assert mode == "full_speed" or calls, f"{mode} never reached the engine"
    assert all(s == scores["full_speed"] for s in scores.values()), scores
    full = {p.grade_id: p.points for p in load_lesson(lesson_id).parts if not p.manual}
    if answer is None:
        assert scores["full_speed"] == full
    else:
        assert mutants(lesson_id)[answer].fails <= {k for k, v in scores["full_speed"].items() if v == 0}


def test_the_speed_patch_reaches_children_and_undoes_itself(tmp_path, monkeypatch):
    """The patch is real in this process and in a child Python (through sitecustomize.py), and leaves
    minivllm as it was."""
    import subprocess

    from minivllm.engine.core import EngineCore
    from minivllm.worker.gpu_worker import Worker
    before = (EngineCore.step, Worker.execute_model)
    probe = ("import minivllm.engine.core as c, minivllm.worker.gpu_worker as w, time; "
             "print(c.EngineCore.step.__name__, w.Worker.execute_model.__name__, time.monotonic.__name__)")
    want = {"slow_core": "run execute_model monotonic", "slow_forward": "step run monotonic",
            "fast_clock": "step execute_model fast"}
    for mode in MODES[1:]:
        with monkeypatch.context() as mp, engine_speed(mode, tmp_path / mode, mp):
            patched = (EngineCore.step, Worker.execute_model) != before
            assert patched == (mode != "fast_clock"), mode
            child = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
            assert child.stdout.split() == want[mode].split(), (mode, child.stdout, child.stderr[-2000:])
        assert (EngineCore.step, Worker.execute_model) == before
    assert "MINIVLLM_TEST_ENGINE_SPEED" not in os.environ
