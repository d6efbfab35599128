"""LLM.get_metrics()'s snapshot (vLLM: v1/metrics/reader.py): Prometheus families as plain dataclasses.

The classes and their fields are vLLM's. Names keep the project's `minivllm:` prefix, and the registry is
the stat logger's own (vLLM reads prometheus_client's global REGISTRY).
"""
from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry

PER_POSITION = "spec_decode_num_accepted_tokens_per_pos"


@dataclass
class Metric:
    """One metric with one set of key=value labels (a name can appear with several label sets)."""

    name: str
    labels: dict[str, str]


@dataclass
class Counter(Metric):
    value: int


@dataclass
class Vector(Metric):
    """Counters indexed by position: only spec_decode_num_accepted_tokens_per_pos, as in vLLM."""

    values: list[int]


@dataclass
class Gauge(Metric):
    value: float


@dataclass
class Histogram(Metric):
    """buckets: cumulative count per upper bound (the `le` label, '+Inf' included); count = the '+Inf' one."""

    count: int
    sum: float
    buckets: dict[str, int]


def _without(labels: dict[str, str], key: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k != key))


def get_metrics_snapshot(registry: CollectorRegistry, prefix: str = "minivllm:") -> list[Metric]:
    """Every family of the registry whose name starts with prefix, in registration order."""
    out: list[Metric] = []
    for family in registry.collect():
        if not family.name.startswith(prefix):
            continue
        by_suffix: dict[str, list] = {}
        for s in family.samples:
            by_suffix.setdefault(s.name[len(family.name):], []).append(s)
        if family.type == "gauge":
            out += [Gauge(family.name, dict(s.labels), s.value) for s in by_suffix.get("", [])]
        elif family.type == "counter" and family.name.endswith(PER_POSITION):
            rows: dict[tuple, dict[int, int]] = {}
            for s in by_suffix.get("_total", []):
                rows.setdefault(_without(s.labels, "position"), {})[int(s.labels["position"])] = int(s.value)
            for labels, per_pos in rows.items():
                values = [0] * (max(per_pos) + 1)
                for pos, v in per_pos.items():
                    values[pos] = v
                out.append(Vector(family.name, dict(labels), values))
        elif family.type == "counter":
            out += [Counter(family.name, dict(s.labels), int(s.value)) for s in by_suffix.get("_total", [])]
        elif family.type == "histogram":
            buckets: dict[tuple, dict[str, int]] = {}
            for s in by_suffix.get("_bucket", []):
                buckets.setdefault(_without(s.labels, "le"), {})[s.labels["le"]] = int(s.value)
            counts = {_without(s.labels, ""): int(s.value) for s in by_suffix.get("_count", [])}
            sums = {_without(s.labels, ""): s.value for s in by_suffix.get("_sum", [])}
            out += [Histogram(family.name, dict(k), counts[k], sums[k], b) for k, b in buckets.items()]
        else:
            raise ValueError(f"metric {family.name}: unexpected type {family.type!r}")
    return out
