"""The engine's stats, each where vLLM keeps it (v1/metrics/stats.py): the scheduler's snapshot (msgspec, as
it crosses the process boundary inside EngineCoreOutputs), the prefix cache's counters, and one iteration's
frontend stats. SpecDecodingStats lives in spec_decode/metrics.py, as vLLM's."""
from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from minivllm.spec_decode.metrics import SpecDecodingStats


@dataclass
class PrefixCacheStats:
    """Prefix-cache lookups of admitted requests since the last reset: requests, tokens asked for, hit.

    Lookups by previously preempted requests count apart (preempted_*, as vLLM's PrefixCacheStats): a
    recomputed request mostly hits its own freed blocks, which would inflate the hit rate. Unlike vLLM,
    which resets the stats on every read (make_prefix_cache_stats) and turns them into a hit rate over
    the last 1,000 requests (CachingMetrics), minivllm keeps them cumulative until reset_prefix_cache.
    """

    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class SchedulerStats(msgspec.Struct, omit_defaults=True):
    """A snapshot of the scheduler for metrics: queue lengths, KV usage, prefix-cache hits."""

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0
    num_free_blocks: int = 0
    num_total_blocks: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0
    spec_decoding_stats: SpecDecodingStats | None = None


@dataclass
class IterationStats:
    """What one batch of core outputs did, for the metrics (vLLM: v1/metrics/stats.py IterationStats)."""

    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    time_to_first_tokens: list[float] = field(default_factory=list)
    inter_token_latencies: list[float] = field(default_factory=list)
    e2e_latencies: list[float] = field(default_factory=list)
    finished_reasons: list[str] = field(default_factory=list)
    queue_times: list[float] = field(default_factory=list)
    # per finished request
    time_per_output_tokens: list[float] = field(default_factory=list)
    request_prompt_tokens: list[int] = field(default_factory=list)
    request_generation_tokens: list[int] = field(default_factory=list)
    num_cached_prompt_tokens: int = 0  # prefix-cache hits among num_prompt_tokens
    prefill_times: list[float] = field(default_factory=list)    # first scheduled -> first token
    decode_times: list[float] = field(default_factory=list)     # first token -> last token
    inference_times: list[float] = field(default_factory=list)  # first scheduled -> last token
    request_prefill_kv_computed_tokens: list[int] = field(default_factory=list)
    request_max_tokens: list[int] = field(default_factory=list)
    n_params: list[int] = field(default_factory=list)
