"""Prometheus metrics for /metrics (vLLM: v1/metrics/loggers.py PrometheusStatLogger), in plain text.

The frontend records what it sees: the core's SchedulerStats snapshot (gauges) and each batch's
IterationStats (token counters, TTFT / inter-token / end-to-end histograms).
"""
from __future__ import annotations

import bisect

from minivllm.engine import SchedulerStats
from minivllm.engine.output_processor import IterationStats

PREFIX = "minivllm:"
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0)


class Histogram:
    """Cumulative-bucket histogram, rendered the Prometheus way (_bucket{le=...}, _sum, _count)."""

    def __init__(self, name: str, doc: str, buckets: tuple[float, ...]) -> None:
        self.name, self.doc, self.buckets = name, doc, buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def render(self, labels: str) -> list[str]:
        n = PREFIX + self.name
        lines = [f"# HELP {n} {self.doc}", f"# TYPE {n} histogram"]
        acc = 0
        for le, c in zip([*map(str, self.buckets), "+Inf"], self.counts, strict=True):
            acc += c
            lines.append(f'{n}_bucket{{{labels},le="{le}"}} {acc}')
        lines += [f"{n}_sum{{{labels}}} {self.sum}", f"{n}_count{{{labels}}} {acc}"]
        return lines


class PrometheusStatLogger:
    """Accumulates what AsyncLLM's output handler reports; render() gives the /metrics body."""

    def __init__(self, model_name: str) -> None:
        self.labels = f'model_name="{model_name}"'
        self.scheduler_stats = SchedulerStats()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished: dict[str, int] = {"stop": 0, "length": 0, "abort": 0}
        self.ttft = Histogram("time_to_first_token_seconds", "Time to first token (arrival to first token).",
                              TTFT_BUCKETS)
        self.itl = Histogram("inter_token_latency_seconds", "Time between consecutive output batches of a request.",
                             ITL_BUCKETS)
        self.e2e = Histogram("e2e_request_latency_seconds", "Arrival to last token of a finished request.",
                             E2E_BUCKETS)

    def record(self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None) -> None:
        if scheduler_stats is not None:
            self.scheduler_stats = scheduler_stats
        if iteration_stats is None:
            return
        self.prompt_tokens += iteration_stats.num_prompt_tokens
        self.generation_tokens += iteration_stats.num_generation_tokens
        for v in iteration_stats.time_to_first_tokens:
            self.ttft.observe(v)
        for v in iteration_stats.inter_token_latencies:
            self.itl.observe(v)
        for v in iteration_stats.e2e_latencies:
            self.e2e.observe(v)
        for reason in iteration_stats.finished_reasons:
            self.finished[reason] = self.finished.get(reason, 0) + 1

    def record_abort(self, n: int = 1) -> None:
        """Requests the frontend aborted (client gone): they never reach a finished output."""
        self.finished["abort"] += n

    def render(self, scheduler_stats: SchedulerStats | None = None) -> str:
        s = scheduler_stats or self.scheduler_stats
        lab = self.labels
        hit_rate = s.prefix_cache_hits / s.prefix_cache_queries if s.prefix_cache_queries else 0.0

        def metric(name: str, kind: str, doc: str, value) -> list[str]:
            n = PREFIX + name
            return [f"# HELP {n} {doc}", f"# TYPE {n} {kind}", f"{n}{{{lab}}} {value}"]
        lines = (metric("num_requests_running", "gauge", "Requests in the running queue.", s.num_running_reqs)
                 + metric("num_requests_waiting", "gauge", "Requests in the waiting queue.", s.num_waiting_reqs)
                 + metric("kv_cache_usage_perc", "gauge", "Fraction of KV blocks in use (1 = full).", s.kv_cache_usage)
                 + metric("num_free_kv_blocks", "gauge", "Free KV blocks (cached or not).", s.num_free_blocks)
                 + metric("num_total_kv_blocks", "gauge", "KV blocks (without the null block).", s.num_total_blocks)
                 + metric("prefix_cache_queries_total", "counter", "Tokens looked up in the prefix cache.",
                          s.prefix_cache_queries)
                 + metric("prefix_cache_hits_total", "counter", "Tokens found in the prefix cache.",
                          s.prefix_cache_hits)
                 + metric("prefix_cache_hit_rate", "gauge", "prefix_cache_hits / prefix_cache_queries.", hit_rate)
                 + metric("num_preemptions_total", "counter", "Preemptions (recompute).", s.num_preemptions)
                 + metric("prompt_tokens_total", "counter", "Prefill tokens of requests that started.",
                          self.prompt_tokens)
                 + metric("generation_tokens_total", "counter", "Generated tokens.", self.generation_tokens))
        n = PREFIX + "request_success_total"
        lines += [f"# HELP {n} Finished requests by finish reason.", f"# TYPE {n} counter"]
        lines += [f'{n}{{{lab},finished_reason="{r}"}} {c}' for r, c in sorted(self.finished.items())]
        for h in (self.ttft, self.itl, self.e2e):
            lines += h.render(lab)
        return "\n".join(lines) + "\n"


def parse_prometheus(text: str) -> dict[str, float]:
    """{'name{labels}': value} from a /metrics body (for tests and the benchmark)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out
