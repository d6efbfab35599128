"""vLLM 0.27.1 itself as the oracle: run a workload in vLLM (a subprocess on .venv-vllm's Python, JSON in and
out) and in minivllm, and compare; record vLLM's answers as golden files so that tests, lessons and Colab compare
against vLLM without installing it.

    python -m autograder.vllm_oracle record [KIND ...]   # re-record data/vllm_oracle/KIND.json.xz (needs make vllm)
    python -m autograder.vllm_oracle compare [KIND ...]  # minivllm against the recording (and vLLM live, if there)

A golden file holds a header (vLLM's version, the provenance check of the vllm/*.py that answered, the cases'
sha256) and vLLM's answers, one per case; the cases themselves are regenerated from their seeds (workloads.py).
"""
from __future__ import annotations

import json
import lzma
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from autograder.pin import REPO, VLLM_VERSION  # noqa: E402
from autograder.vllm_views import VllmUnavailable, run_in_vllm, vllm_python, vllm_site_packages  # noqa: F401 (re-exported)
from autograder.vllm_views import digest as cases_digest

GOLDEN_DIR = REPO / "data" / "vllm_oracle"


def run_vllm(kind: str, cases: list, timeout: float = 1800) -> list:
    """vLLM 0.27.1's answers to `cases`, from vllm_side.py in a subprocess on .venv-vllm's Python."""
    return run_in_vllm(["autograder.vllm_oracle.vllm_side", kind], kind, stdin=json.dumps(cases), timeout=timeout)


def golden_path(kind: str) -> Path:
    return GOLDEN_DIR / f"{kind}.json.xz"


def load_golden(kind: str) -> dict:
    with lzma.open(golden_path(kind), "rt", encoding="utf-8") as f:
        return json.load(f)


def provenance_summary() -> dict:
    """The provenance check of the vLLM that answers (summary: counts, and whether it is 0.27.1's code)."""
    from autograder.vllm_oracle.provenance import check

    report = check(vllm_site_packages())
    return {k: (len(v) if isinstance(v, list) else v) for k, v in report.items()}


def record(kind: str) -> dict:
    comparison = COMPARISONS[kind]
    cases = comparison.cases()
    prov = provenance_summary()
    if not prov["ok"]:
        raise SystemExit(f"the vLLM in .venv-vllm is not vLLM {VLLM_VERSION}'s code: {prov}")
    answers = run_vllm(kind, cases)
    golden = {"header": {"vllm_version": VLLM_VERSION, "provenance": prov, "kind": kind, "num_cases": len(cases),
                         "cases_sha256": cases_digest(cases),
                         "recorded_by": f"python -m autograder.vllm_oracle record {kind}"},
              "answers": answers}
    GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
    with lzma.open(golden_path(kind), "wt", encoding="utf-8", preset=9) as f:
        json.dump(golden, f, separators=(",", ":"))
    return golden


@dataclass
class Comparison:
    """One differential comparison: its cases, minivllm's answers, and where an answer pair first differs."""

    cases: Callable[[], list]
    minivllm: Callable[[list], list]
    first_divergence: Callable[[dict, dict], str | None]


def _scheduler() -> Comparison:
    from autograder.vllm_oracle import scheduler_harness
    from autograder.vllm_oracle.workloads import scheduler_workload

    def minivllm(cases):
        from autograder.vllm_oracle.minivllm_side import run_scheduler
        return run_scheduler(cases)

    return Comparison(lambda: [scheduler_workload(seed) for seed in range(1200)], minivllm,
                      scheduler_harness.first_divergence)


def _sampler() -> Comparison:
    from autograder.vllm_oracle.workloads import first_sampler_divergence, sampler_case

    def minivllm(cases):
        from autograder.vllm_oracle.minivllm_side import run_sampler
        return run_sampler(cases)

    return Comparison(lambda: [sampler_case(seed) for seed in range(400)], minivllm, first_sampler_divergence)


def _on_checkpoints(model_names: tuple[str, ...], make_cases: Callable[[], list], runner: str,
                    first_divergence: Callable[[dict, dict], str | None]) -> Comparison:
    """A comparison of LLM runs on checkpoints: the tiny ones are built (once) before the cases are made, and
    minivllm answers with minivllm_side.<runner>."""
    from autograder.vllm_oracle import models

    def cases():
        for name in model_names:
            models.ensure(name)
        return make_cases()

    def minivllm(cases):
        from autograder.vllm_oracle import minivllm_side
        return getattr(minivllm_side, runner)(cases)

    return Comparison(cases, minivllm, first_divergence)


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

    def minivllm(cases):
        from autograder.vllm_oracle.minivllm_side import run_detokenizer
        return run_detokenizer(cases)

    return Comparison(cases, minivllm, first_detokenizer_divergence)


def _structured_output() -> Comparison:
    from autograder.vllm_oracle.workloads import first_structured_output_divergence, structured_output_case

    def minivllm(cases):
        from autograder.vllm_oracle.minivllm_side import run_structured_output
        return run_structured_output(cases)

    return Comparison(lambda: [structured_output_case(seed) for seed in range(48)], minivllm,
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


def compare(kind: str, answers: list | None = None) -> tuple[int, list[str]]:
    """minivllm against vLLM's answers (the recording unless given): (cases, first divergence of each that differs)."""
    comparison = COMPARISONS[kind]
    cases = comparison.cases()
    if answers is None:
        golden = load_golden(kind)
        if golden["header"]["cases_sha256"] != cases_digest(cases):
            raise RuntimeError(f"{golden_path(kind).name} was recorded for other cases: re-record with "
                               f"`make record-vllm` (workloads.py changed)")
        answers = golden["answers"]
    mine = comparison.minivllm(cases)
    diffs = [d for a, b in zip(answers, mine, strict=True) if (d := comparison.first_divergence(a, b))]
    return len(cases), diffs


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m autograder.vllm_oracle", description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["record", "compare"])
    ap.add_argument("kinds", nargs="*", help=f"default: all ({', '.join(KINDS)})")
    args = ap.parse_args(argv)
    status = 0
    for kind in args.kinds or KINDS:
        if args.command == "record":
            golden = record(kind)
            print(f"{kind}: recorded {golden['header']['num_cases']} cases -> {golden_path(kind)}")
        n, diffs = compare(kind)
        print(f"{kind}: {n - len(diffs)} of {n} cases equal vLLM {VLLM_VERSION}'s recorded answers")
        for d in diffs[:5]:
            print("   ", d)
        status |= bool(diffs)
    return status


if __name__ == "__main__":
    sys.exit(main())
