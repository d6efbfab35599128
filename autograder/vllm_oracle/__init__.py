"""The pinned vLLM (autograder/pin.py) itself as the oracle, for the engine and for the lessons, with one recording format.

A subject ("name") is one of:
  - an engine comparison (KINDS: scheduler, sampler, ...; and "server", server_diff.py): seeded cases
    (workloads.py) through vLLM's own objects (vllm_side.py, on .venv-vllm's Python) and minivllm's, compared
    case by case; recorded in data/vllm_oracle/NAME.json.xz (instructor-only).
  - a lesson's vLLM view (autograder/lessonNN/vllm_view.py: SCENARIOS by name, vllm_answer(name, payload), run
    under .venv-vllm only: it imports vllm, never minivllm): the lesson's section "在真实 vLLM 上看同一件事"
    and the answers some graders compare a student's function with; recorded in data/vllm_views/lessonNN.json.xz,
    shipped with the student release. Graders call `recorded()`: grading never needs vLLM.

A recording is {"header": {"vllm_version", "name", "digests": {scenario: sha256 of its JSON}, "recorded_by",
[provenance: the check of the vllm/*.py that answered], ...}, "answers": {scenario: vLLM's answer}}; an engine
comparison is one scenario, "cases", whose payload is its list of cases. A recording answers only the inputs
whose digests it holds.

    python -m autograder.vllm_oracle record [NAME ...]        # re-record (needs .venv-vllm; `make record-vllm`)
    python -m autograder.vllm_oracle check [--live] [NAME ...]  # recording answers today's inputs, minivllm equals
                                                                # it; --live: vLLM re-answers it identically
    python -m autograder.vllm_oracle repin --wheel WHEEL [--dry-run]  # re-do what names the pinned vLLM (repin.py)
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import lzma
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from autograder.pin import REPO, VLLM_VERSION

GOLDEN_DIR = REPO / "data" / "vllm_oracle"
RECORDINGS = REPO / "data" / "vllm_views"
CASES = "cases"  # an engine comparison's one scenario
# The lessons with a vLLM side, by folder (the student release has no solutions/ to discover lessons from);
# tests/test_vllm_views.py checks that every lesson has one.
LESSONS = tuple(sorted(p.parent.name for p in (REPO / "autograder").glob("lesson[0-9][0-9]/vllm_view.py")))


# ---------------------------------------------------------------------------- the vLLM venv
def vllm_python() -> Path | None:
    """The interpreter of the pinned vLLM's venv (MINIVLLM_VLLM_PYTHON, else REPO/.venv-vllm), if it exists."""
    env = os.environ.get("MINIVLLM_VLLM_PYTHON")
    path = Path(env) if env else REPO / ".venv-vllm" / "bin" / "python"
    return path if path.exists() else None


def vllm_site_packages() -> Path | None:
    """Where the pinned vLLM's source is once `make vllm` ran (vllm/ under it): SOURCE_MAP questions, offline."""
    py = vllm_python()
    if py is None:
        return None
    found = sorted(py.parent.parent.glob("lib/python3*/site-packages/vllm"))
    return found[0].parent if found else None


class VllmUnavailable(RuntimeError):
    """No .venv-vllm here: run `make vllm` (or use the recorded answers)."""


def run_in_vllm(module_args: list[str], what: str, stdin: str | None = None, timeout: float = 1800, **env: str):
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


def provenance_summary() -> dict:
    """The provenance check of the vLLM that answers (summary: counts, and whether it is the pinned code)."""
    from autograder.vllm_oracle.provenance import check

    report = check(vllm_site_packages())
    return {k: (len(v) if isinstance(v, list) else v) for k, v in report.items()}


# ---------------------------------------------------------------------------- the lessons' views
def view_module(lesson: str):
    """autograder/<lesson>/vllm_view.py, loaded from its file: under .venv-vllm (and in a release read without
    minivllm) importing the lesson's package would import its checks, and with them minivllm."""
    name = f"autograder.{lesson}.vllm_view"
    if name not in sys.modules:
        path = REPO / "autograder" / lesson / "vllm_view.py"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or not path.exists():
            raise KeyError(f"no vLLM view for {lesson!r}; known: {', '.join(LESSONS)}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


# ---------------------------------------------------------------------------- the engine's comparisons
@dataclass
class Comparison:
    """One differential comparison: its cases, minivllm's answers, and where an answer pair first differs."""

    cases: Callable[[], list]
    minivllm: Callable[[list], list]
    first_divergence: Callable[[dict, dict], str | None]


def _minivllm(runner: str) -> Callable[[list], list]:
    """minivllm's answers: minivllm_side.<runner>, imported only when called (it imports the engine)."""
    def run(cases):
        from autograder.vllm_oracle import minivllm_side
        return getattr(minivllm_side, runner)(cases)

    return run


def _scheduler() -> Comparison:
    from autograder.vllm_oracle import scheduler_harness
    from autograder.vllm_oracle.workloads import scheduler_workload

    return Comparison(lambda: [scheduler_workload(seed) for seed in range(1200)], _minivllm("run_scheduler"),
                      scheduler_harness.first_divergence)


def _sampler() -> Comparison:
    from autograder.vllm_oracle.workloads import first_sampler_divergence, sampler_case

    return Comparison(lambda: [sampler_case(seed) for seed in range(400)], _minivllm("run_sampler"),
                      first_sampler_divergence)


def _on_checkpoints(model_names: tuple[str, ...], make_cases: Callable[[], list], runner: str,
                    first_divergence: Callable[[dict, dict], str | None]) -> Comparison:
    """A comparison of LLM runs on checkpoints: the tiny ones are built (once) before the cases are made, and
    minivllm answers with minivllm_side.<runner>."""
    from autograder.vllm_oracle import models

    def cases():
        for name in model_names:
            models.ensure(name)
        return make_cases()

    return Comparison(cases, _minivllm(runner), first_divergence)


def _engine() -> Comparison:
    from autograder.vllm_oracle.workloads import ENGINE_MODELS, engine_cases, first_engine_divergence

    return _on_checkpoints(ENGINE_MODELS, engine_cases, "run_engine", first_engine_divergence)


def _generate() -> Comparison:
    from autograder.vllm_oracle.workloads import GENERATE_MODELS, first_sampling_divergence, sampling_cases

    return _on_checkpoints(GENERATE_MODELS, sampling_cases, "run_generate", first_sampling_divergence)


def _detokenizer() -> Comparison:
    from autograder.vllm_oracle.workloads import detokenizer_case, first_detokenizer_divergence

    def cases():
        from tokenizers import Tokenizer

        from autograder.vllm_oracle.models import SHIPPED, ensure_metaspace_tokenizer
        shipped = Tokenizer.from_file(str(SHIPPED / "tokenizer.json"))
        metaspace = Tokenizer.from_file(str(ensure_metaspace_tokenizer() / "tokenizer.json"))
        return ([detokenizer_case(seed, shipped) for seed in range(400)]
                + [detokenizer_case(seed, metaspace, "metaspace") for seed in range(400, 600)])

    return Comparison(cases, _minivllm("run_detokenizer"), first_detokenizer_divergence)


def _structured_output() -> Comparison:
    from autograder.vllm_oracle.workloads import first_structured_output_divergence, structured_output_case

    return Comparison(lambda: [structured_output_case(seed) for seed in range(48)], _minivllm("run_structured_output"),
                      first_structured_output_divergence)


class _Lazy(dict):
    """COMPARISONS[kind], built on first use (each imports only what it needs)."""

    FACTORIES = {"scheduler": _scheduler, "sampler": _sampler, "detokenizer": _detokenizer,
                 "structured_output": _structured_output, "engine": _engine, "generate": _generate}

    def __missing__(self, kind: str) -> Comparison:
        if kind not in self.FACTORIES:
            raise KeyError(f"unknown comparison {kind!r}; known: {', '.join(self.FACTORIES)}")
        self[kind] = self.FACTORIES[kind]()
        return self[kind]


COMPARISONS: dict[str, Comparison] = _Lazy()
KINDS = tuple(_Lazy.FACTORIES)
SERVER = "server"  # server_diff.py: minivllm's OpenAI server against vLLM's, over HTTP
NAMES = (*KINDS, SERVER, *LESSONS)


# ---------------------------------------------------------------------------- one recording format
def digest(payload) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def scenarios(name: str) -> dict:
    """The inputs of `name`, by scenario: a lesson's SCENARIOS, or {"cases": an engine comparison's cases}."""
    if name in KINDS:
        return {CASES: COMPARISONS[name].cases()}
    if name == SERVER:
        from autograder.vllm_oracle.server_corpus import server_cases
        return {CASES: server_cases()}
    return view_module(name).SCENARIOS


def recording_path(name: str) -> Path:
    return (RECORDINGS if name in LESSONS else GOLDEN_DIR) / f"{name}.json.xz"


def load_recording(name: str) -> dict:
    path = recording_path(name)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: `python -m autograder.vllm_oracle record {name}` writes it")
    with lzma.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def recorded(name: str, scenario: str = CASES, payload=None):
    """vLLM's recorded answer to scenarios(name)[scenario] (or to `payload`, already built); refuses a recording
    made for other inputs."""
    rec = load_recording(name)
    want = digest(scenarios(name)[scenario] if payload is None else payload)
    if rec["header"]["digests"].get(scenario) != want:
        raise RuntimeError(f"{name}: the recording of {scenario!r} was made for other inputs "
                           f"(re-record: python -m autograder.vllm_oracle record {name})")
    return rec["answers"][scenario]


def save_recording(name: str, cases: dict, answers: dict, **header) -> dict:
    """Write `name`'s recording: vLLM's answers to `cases` (by scenario), with their digests."""
    rec = {"header": {"vllm_version": VLLM_VERSION, "name": name, "digests": {n: digest(p) for n, p in cases.items()},
                      "recorded_by": f"python -m autograder.vllm_oracle record {name}", **header},
           "answers": answers}
    path = recording_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    with lzma.open(path, "wt", encoding="utf-8", preset=9) as f:
        json.dump(rec, f, ensure_ascii=False, separators=(",", ":"))
    return rec


def live_answers(name: str, names: list[str] | None = None, cases: dict | None = None) -> dict:
    """vLLM's answers computed now under .venv-vllm, by scenario."""
    if name in KINDS:
        cases = cases or scenarios(name)
        return {CASES: run_in_vllm(["autograder.vllm_oracle.vllm_side", name], name,
                                   stdin=json.dumps(cases[CASES]))}
    if name == SERVER:
        from autograder.vllm_oracle import server_diff
        return {CASES: server_diff.answers_of("vllm", (cases or scenarios(name))[CASES])}
    return run_in_vllm(["autograder.vllm_oracle", "_answer", name, *(names or [])], name, timeout=900,
                       VLLM_ENABLE_V1_MULTIPROCESSING="0")


def answers(lesson: str, names: list[str] | None = None, live: bool | None = None) -> tuple[dict, str]:
    """A lesson's (answers by name, a line saying where they come from): live if .venv-vllm exists (or live=True)."""
    names = list(names or scenarios(lesson))
    live = vllm_python() is not None if live is None else live
    if live:
        return live_answers(lesson, names), f"vLLM {VLLM_VERSION}：现场运行（{vllm_python()}）。"
    return {n: recorded(lesson, n) for n in names}, (
        f"vLLM {VLLM_VERSION}：读取录制结果 data/vllm_views/{lesson}.json.xz"
        "（本机没有 .venv-vllm；`make vllm` 之后这里会现场运行）。")


def record(name: str) -> dict:
    """Re-record `name` from the vLLM in .venv-vllm, which must be the pinned version's own code."""
    cases = scenarios(name)
    prov = provenance_summary()
    if not prov["ok"]:
        raise SystemExit(f"the vLLM in .venv-vllm is not vLLM {VLLM_VERSION}'s code: {prov}")
    header = {"provenance": prov}
    if name == SERVER:
        from autograder.vllm_oracle import server_diff
        header.update(server_diff.recording_header())
    return save_recording(name, cases, live_answers(name, cases=cases), **header)


def compare(kind: str, answers: list | None = None) -> tuple[int, list[str]]:
    """minivllm against vLLM's answers (the recording unless given): (cases, first divergence of each that differs)."""
    comparison = COMPARISONS[kind]
    cases = comparison.cases()
    if answers is None:
        answers = recorded(kind, CASES, cases)
    mine = comparison.minivllm(cases)
    diffs = [d for a, b in zip(answers, mine, strict=True) if (d := comparison.first_divergence(a, b))]
    return len(cases), diffs


def check_live(name: str) -> list[str]:
    """Scenarios whose live vLLM answer differs from the recording (JSON-equal after a round trip; an engine
    comparison: case by case with its first_divergence)."""
    cases = scenarios(name)
    live = json.loads(json.dumps(live_answers(name, cases=cases)))
    rec = load_recording(name)
    if name in KINDS:
        first = COMPARISONS[name].first_divergence
        return [d for a, b in zip(live[CASES], rec["answers"][CASES], strict=True) if (d := first(a, b))]
    return [n for n in cases if live.get(n) != rec["answers"].get(n)
            or rec["header"]["digests"].get(n) != digest(cases[n])]


def _answer(lesson: str, names: list[str]) -> None:
    """Under .venv-vllm: answer each scenario of a lesson's view, JSON on stdout (vLLM's logging goes to stderr)."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    mod = view_module(lesson)
    real_stdout, sys.stdout = sys.stdout, sys.stderr
    try:
        out = {n: mod.vllm_answer(n, mod.SCENARIOS[n]) for n in (names or mod.SCENARIOS)}
    finally:
        sys.stdout = real_stdout
    json.dump(out, sys.stdout, ensure_ascii=False)


def check(name: str, live: bool = False) -> list[str]:
    """What is wrong with `name`, in lines: a recording made for other inputs, minivllm differing from it (an
    engine comparison), vLLM's live answers differing from it (live=True)."""
    if name == SERVER:
        from autograder.vllm_oracle import server_diff
        return server_diff.check(live)
    cases = scenarios(name)
    digests = load_recording(name)["header"]["digests"]
    bad = [f"{n}: recorded for other inputs" for n in cases if digests.get(n) != digest(cases[n])]
    if not bad and name in KINDS:
        bad = compare(name)[1]
    if not bad and live:
        bad = [f"live vLLM differs: {d}" for d in check_live(name)]
    return bad


def main(argv: list[str] | None = None) -> int:
    import argparse

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_answer"]:
        _answer(argv[1], argv[2:])
        return 0
    ap = argparse.ArgumentParser(prog="python -m autograder.vllm_oracle", description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["record", "check", "repin"])
    ap.add_argument("names", nargs="*", help=f"default: all ({', '.join(NAMES)}) but {SERVER}, which starts "
                                              "two servers: name it")
    ap.add_argument("--live", action="store_true", help="check: vLLM (.venv-vllm) re-answers, equal to the recording")
    ap.add_argument("--dry-run", action="store_true", help="repin: list the steps, run nothing")
    ap.add_argument("--wheel", type=Path, help="repin: the official wheel of the version pin.py names")
    args = ap.parse_args(argv)
    if args.command == "repin":
        from autograder.vllm_oracle.repin import repin
        return repin(args.wheel, dry_run=args.dry_run)
    status = 0
    for name in args.names or [n for n in NAMES if n != SERVER]:
        if args.command == "record":
            rec = record(name)
            print(f"{name}: recorded {len(rec['answers'])} answers -> {recording_path(name)}")
        bad = check(name, args.live)
        print(f"{name}:", f"{len(bad)} DIFFER" if bad else f"equal to vLLM {VLLM_VERSION}'s recorded answers")
        for line in bad[:5]:
            print("   ", line[:400])
        status |= bool(bad)
    return status


if __name__ == "__main__":
    sys.exit(main())
