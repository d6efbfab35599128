"""Each lesson's section "在真实 vLLM 0.27.1 上看同一件事": the lesson's scenario through vLLM 0.27.1's own objects
on CPU, next to minivllm's; and the vLLM answers some graders compare a student's function with.

A lesson's vLLM side is autograder/vllm_views/lessonNN.py, which runs under .venv-vllm's Python only (it imports
vllm, never minivllm, and this package imports neither):

    SCENARIOS: dict[str, JSON]                 # the inputs, by name (lesson scenario, grading cases)
    def vllm_answer(name, payload) -> JSON     # vLLM 0.27.1's answer to one of them

`answers(lesson)` runs them live when vLLM 0.27.1 is installed here (`make vllm` -> .venv-vllm), otherwise reads
the answers recorded in data/vllm_views/lessonNN.json.xz (shipped with the student release, Colab included), and
says which in one line. Graders call `recorded()`: grading never needs vLLM and never depends on this machine.

    python -m autograder.vllm_views record [lessonNN ...]   # re-record (needs .venv-vllm)
    python -m autograder.vllm_views check [lessonNN ...]    # live answers == recording (needs .venv-vllm)
"""
from __future__ import annotations

import hashlib
import importlib
import json
import lzma
import os
import subprocess
import sys
from pathlib import Path

from autograder.pin import REPO, VLLM_VERSION  # noqa: E402

RECORDINGS = REPO / "data" / "vllm_views"
# The lessons with a vLLM side, by file (the student release has no solutions/ to discover lessons from);
# tests/test_vllm_views.py checks that every lesson has one.
LESSONS = tuple(sorted(p.stem for p in Path(__file__).parent.glob("lesson[0-9][0-9].py")))


def vllm_python() -> Path | None:
    """The interpreter of the vLLM 0.27.1 venv (MINIVLLM_VLLM_PYTHON, else REPO/.venv-vllm), if it exists."""
    env = os.environ.get("MINIVLLM_VLLM_PYTHON")
    path = Path(env) if env else REPO / ".venv-vllm" / "bin" / "python"
    return path if path.exists() else None


def vllm_site_packages() -> Path | None:
    """Where vLLM 0.27.1's source is once `make vllm` ran (vllm/ under it): SOURCE_MAP questions, offline."""
    py = vllm_python()
    if py is None:
        return None
    found = sorted(py.parent.parent.glob("lib/python3*/site-packages/vllm"))
    return found[0].parent if found else None


class VllmUnavailable(RuntimeError):
    """No .venv-vllm here: run `make vllm` (or use the recorded answers)."""


def digest(payload) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def scenarios(lesson: str) -> dict:
    return importlib.import_module(f"autograder.vllm_views.{lesson}").SCENARIOS


def run_in_vllm(module_args: list[str], what: str, stdin: str | None = None, timeout: float = 900, **env: str):
    """The JSON that `python -m MODULE_ARGS` prints under .venv-vllm's Python (REPO on the path, vLLM quiet, offline)."""
    py = vllm_python()
    if py is None:
        raise VllmUnavailable("no .venv-vllm: run `make vllm` first (or use the recorded answers)")
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_LOGGING_LEVEL": "ERROR", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "PYTHONHASHSEED": "0", **env}
    proc = subprocess.run([str(py), "-m", *module_args], input=stdin, capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=env)
    if proc.returncode:
        raise RuntimeError(f"vLLM side of {what} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout)


def run_live(lesson: str, names: list[str] | None = None, timeout: float = 900) -> dict:
    """vLLM 0.27.1's answers, computed now by autograder/vllm_views/<lesson>.py in a .venv-vllm subprocess."""
    return run_in_vllm(["autograder.vllm_views", "_answer", lesson, *(names or [])], lesson, timeout=timeout,
                       VLLM_ENABLE_V1_MULTIPROCESSING="0")


def recording_path(lesson: str) -> Path:
    return RECORDINGS / f"{lesson}.json.xz"


def load_recording(lesson: str) -> dict:
    path = recording_path(lesson)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: `python -m autograder.vllm_views record {lesson}` writes it")
    with lzma.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def recorded(lesson: str, name: str):
    """vLLM 0.27.1's recorded answer to SCENARIOS[name]; refuses a recording made for other inputs."""
    rec = load_recording(lesson)
    want = digest(scenarios(lesson)[name])
    got = rec["header"]["digests"].get(name)
    if got != want:
        raise RuntimeError(f"{lesson}: the recording of {name!r} was made for other inputs "
                           f"(re-record: python -m autograder.vllm_views record {lesson})")
    return rec["answers"][name]


def answers(lesson: str, names: list[str] | None = None, live: bool | None = None) -> tuple[dict, str]:
    """(answers by name, a line saying where they come from): live if .venv-vllm exists (or live=True)."""
    names = list(names or scenarios(lesson))
    live = vllm_python() is not None if live is None else live
    if live:
        out = run_live(lesson, names)
        return out, f"vLLM {VLLM_VERSION}：现场运行（{vllm_python()}）。"
    out = {n: recorded(lesson, n) for n in names}
    return out, (f"vLLM {VLLM_VERSION}：读取录制结果 data/vllm_views/{lesson}.json.xz"
                 "（本机没有 .venv-vllm；`make vllm` 之后这里会现场运行）。")


def record(lesson: str) -> dict:
    cases = scenarios(lesson)
    out = run_live(lesson)
    rec = {"header": {"vllm_version": VLLM_VERSION, "lesson": lesson, "digests": {n: digest(p) for n, p in cases.items()},
                      "recorded_by": f"python -m autograder.vllm_views record {lesson}"},
           "answers": out}
    RECORDINGS.mkdir(parents=True, exist_ok=True)
    with lzma.open(recording_path(lesson), "wt", encoding="utf-8", preset=9) as f:
        json.dump(rec, f, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return rec


def check(lesson: str) -> list[str]:
    """Names whose live vLLM answer differs from the recording (JSON-equal after a round trip)."""
    live = json.loads(json.dumps(run_live(lesson)))
    rec = load_recording(lesson)
    return [n for n in scenarios(lesson) if live.get(n) != rec["answers"].get(n)
            or rec["header"]["digests"].get(n) != digest(scenarios(lesson)[n])]


def _answer(lesson: str, names: list[str]) -> None:
    """Under .venv-vllm: answer each scenario, JSON on stdout (vLLM's logging goes to stderr)."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    mod = importlib.import_module(f"autograder.vllm_views.{lesson}")
    real_stdout, sys.stdout = sys.stdout, sys.stderr
    try:
        out = {n: mod.vllm_answer(n, mod.SCENARIOS[n]) for n in (names or mod.SCENARIOS)}
    finally:
        sys.stdout = real_stdout
    json.dump(out, sys.stdout, ensure_ascii=False)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd, lessons = (argv[0], argv[1:]) if argv else ("", [])
    if cmd == "_answer":
        _answer(lessons[0], lessons[1:])
        return 0
    lessons = lessons or [name for name in LESSONS if (Path(__file__).parent / f"{name}.py").exists()]
    if cmd == "record":
        for lesson in lessons:
            print(lesson, len(record(lesson)["answers"]), "answers recorded")
        return 0
    if cmd == "check":
        bad = {lesson: check(lesson) for lesson in lessons}
        for lesson, names in bad.items():
            print(lesson, "live == recording" if not names else f"DIFFERS: {names}")
        return 1 if any(bad.values()) else 0
    print(__doc__)
    return 2
