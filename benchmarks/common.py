"""What every benchmark here shares: interleaved sides, median ratios with their spread, the machine's state.

A ratio measured as "run A, then run B" moves with whatever load lands on one phase (on a 2-core machine
shared with other work, 1.07x, 5.40x and 21.9x on one commit). So every script runs its sides in turn
(A B A B ..., a warm-up round first, then at least three pairs), takes one ratio per pair, and reports
the median with its min-max. Load that comes and goes then hits both sides of a pair alike, and the
spread says how far to trust the median.

    from common import add_bench_args, interleave, environment, ratio, write_json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

MIN_PAIRS = 3


def add_bench_args(parser: argparse.ArgumentParser, pairs: int = MIN_PAIRS, warmup: int = 1) -> None:
    """--pairs, --warmup and --json-out, the same in every script."""
    parser.add_argument("--pairs", type=int, default=pairs,
                        help=f"measured rounds of every side, interleaved (at least {MIN_PAIRS})")
    parser.add_argument("--warmup", type=int, default=warmup, help="unmeasured rounds first")
    parser.add_argument("--json-out", default=None, help="also write the result records as JSON here")


def interleave(sides: dict[str, Callable[[], float]], pairs: int = MIN_PAIRS, warmup: int = 1,
               on_round: Callable[[int, dict[str, float]], None] | None = None) -> dict[str, list[float]]:
    """Run every side once per round, in order, `warmup` unmeasured rounds then `pairs` measured ones.

    Each side returns its measurement of one round (seconds, us per request, ...). The result holds one
    list per side, index i = round i, so round i of two sides makes one pair.
    """
    if pairs < MIN_PAIRS:
        raise ValueError(f"pairs must be >= {MIN_PAIRS} (got {pairs}): fewer cannot show the spread")
    results: dict[str, list[float]] = {name: [] for name in sides}
    for i in range(warmup + pairs):
        measured = {name: float(fn()) for name, fn in sides.items()}
        if i >= warmup:
            for name, value in measured.items():
                results[name].append(value)
            if on_round is not None:
                on_round(i - warmup, measured)
    return results


@dataclass
class Ratio:
    """One reported ratio: the median of per-pair ratios, their min-max, and what it is compared with."""

    name: str
    median: float
    min: float
    max: float
    pairs: int
    anchor: str  # what the denominator is and the goal, in words
    unit: str = "x"
    values: list[float] = field(default_factory=list)

    def line(self) -> str:
        return (f"{self.name}: median {self.median:.3f}{self.unit} (min {self.min:.3f}, max {self.max:.3f}, "
                f"{self.pairs} pairs) vs {self.anchor}")


def ratio(name: str, numerator: list[float], denominator: list[float], anchor: str) -> Ratio:
    """Per-pair numerator[i] / denominator[i], summarized by median and min-max."""
    if len(numerator) != len(denominator) or not numerator:
        raise ValueError("ratio needs two equally long, non-empty series (one value per pair)")
    values = [a / b for a, b in zip(numerator, denominator, strict=True)]
    return Ratio(name, statistics.median(values), min(values), max(values), len(values), anchor, values=values)


def spread(values: list[float]) -> str:
    """'median (min-max)' of one side's rounds."""
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def environment() -> dict:
    """What the machine was doing: torch's thread count, cores, and the load average around the run."""
    env = {"cpu_count": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()],
           "python": platform.python_version(), "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        import torch
        env["torch_threads"] = torch.get_num_threads()
        env["torch"] = torch.__version__
        env["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        env["torch_threads"] = None
    return env


def environment_line(env: dict | None = None) -> str:
    env = env or environment()
    return (f"torch threads {env.get('torch_threads')}, cores {env['cpu_count']}, load average "
            f"{' '.join(f'{x:.2f}' for x in env['loadavg'])} (1/5/15 min)"
            + (f", GPU {env['cuda']}" if env.get("cuda") else ""))


def write_json(path: str | None, benchmark: str, ratios: list[Ratio], figures: dict | None = None,
               env_before: dict | None = None) -> None:
    """The records `make bench` collects: every ratio with its anchor, other figures, the environment."""
    if not path:
        return
    record = {"benchmark": benchmark, "ratios": [asdict(r) for r in ratios], "figures": figures or {},
              "env_before": env_before, "env_after": environment()}
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
