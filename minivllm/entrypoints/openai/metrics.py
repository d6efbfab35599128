"""Prometheus metrics for /metrics (vLLM: v1/metrics/loggers.py PrometheusStatLogger), on prometheus_client.

vLLM's metric set under the `minivllm:` prefix, labelled by model_name. The frontend records what it
sees: the core's SchedulerStats snapshot (gauges; its cumulative prefix-cache and preemption totals turn
into counter increments) and each batch's IterationStats (token counters, latency histograms). Each
logger has its own registry, so several apps in one process never collide. Multiprocess-safe as in vLLM:
with PROMETHEUS_MULTIPROC_DIR set (several server processes), values live in the directory's mmap files
and render() aggregates every process's with a MultiProcessCollector.
Beyond vLLM's set: num_free_kv_blocks, num_total_kv_blocks and prefix_cache_hit_rate (for the lessons).
Also vLLM's unprefixed families: the HTTP ones of prometheus_fastapi_instrumentator's default set (the server
instruments its app into this logger's registry, vLLM's excluded handlers left out), and prometheus_client's process_* and
python_* collectors. cache_config_info carries the CacheConfig as labels; engine_sleep_state is always
awake (minivllm has no sleep mode).
num_requests_waiting_by_reason splits num_requests_waiting as vLLM does: all "capacity" (minivllm defers no
request: no LoRA budget, no KV transfer). estimated_flops/read_bytes/write_bytes_per_gpu are PerfEstimate's, from
the model's config and each step's token count (the matmul part of vLLM's v1/metrics/perf.py).
Not computed (nothing in minivllm produces them): corrupted_requests, external_prefix_cache_* (no KV
connector), mm_cache_* (no multimodal inputs), kv_block_* (KV-cache residency sampling), lora_requests_info. The phase times use the
frontend's arrival of the first and last token where vLLM uses the EngineCore's output timestamps.
"""
from __future__ import annotations

import dataclasses
import os

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

from minivllm.metrics.stats import IterationStats, SchedulerStats

PREFIX = "minivllm:"
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PROMPT_TOKEN_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's token-count buckets)."""
    buckets, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return buckets
            buckets.append(m * scale)
        scale *= 10


# The handlers vLLM leaves out of the instrumentator's HTTP families (serve/instrumentator/metrics.py).
HTTP_EXCLUDED_HANDLERS = ["/metrics", "/health", "/load", "/ping", "/version", "/server_info"]


def multiprocess_mode() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


@dataclasses.dataclass(frozen=True)
class PerfEstimate:
    """A step's work from the model's shape: 2 FLOPs per weight per token (the linear layers and the LM head),
    every weight read once a step, each token's K and V written once. vLLM's perf.py also counts attention over
    the context and activations; this is its matmul part, enough for a utilization estimate of a dense Llama."""

    params: int  # weights the linear layers and the LM head multiply by, per token
    weight_bytes: int
    kv_bytes_per_token: int

    @classmethod
    def from_hf_config(cls, cfg, dtype_bytes: int = 4) -> PerfEstimate:
        hidden, layers = cfg.hidden_size, cfg.num_hidden_layers
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or hidden // heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        attn = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q, k, v and o projections
        mlp = 3 * hidden * cfg.intermediate_size  # gate, up, down
        params = layers * (attn + mlp) + hidden * cfg.vocab_size
        return cls(params, params * dtype_bytes, 2 * layers * kv_heads * head_dim * dtype_bytes)

    def step(self, num_tokens: int) -> tuple[int, int, int]:
        """(FLOPs, bytes read, bytes written) of a step that computes num_tokens tokens."""
        if num_tokens <= 0:
            return 0, 0, 0
        return 2 * self.params * num_tokens, self.weight_bytes, self.kv_bytes_per_token * num_tokens


class PrometheusStatLogger:
    """Records what AsyncLLM's output handler reports; render() gives the /metrics body."""

    def __init__(self, model_name: str, max_model_len: int = 2048, cache_config=None,
                 perf: PerfEstimate | None = None, registry: CollectorRegistry | None = None) -> None:
        self.registry = CollectorRegistry() if registry is None else registry
        r, labels = self.registry, ["model_name"]
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):  # this process's own numbers
            r.register(collector)

        def gauge(name: str, doc: str):
            return Gauge(PREFIX + name, doc, labels, registry=r, multiprocess_mode="mostrecent").labels(model_name)

        def counter(name: str, doc: str):
            return Counter(PREFIX + name, doc, labels, registry=r).labels(model_name)

        def histogram(name: str, doc: str, buckets):
            return Histogram(PREFIX + name, doc, labels, registry=r, buckets=buckets).labels(model_name)

        self.num_requests_running = gauge("num_requests_running", "Number of requests in model execution batches.")
        self.num_requests_waiting = gauge("num_requests_waiting", "Number of requests waiting to be processed.")
        by_reason = Gauge(PREFIX + "num_requests_waiting_by_reason", "Number of waiting requests by reason. Reason "
                          "labels: 'capacity' = waiting for scheduling capacity; 'deferred' = deferred by transient "
                          "constraints (none in minivllm).", ["model_name", "reason"], registry=r,
                          multiprocess_mode="mostrecent")
        self.waiting_capacity = by_reason.labels(model_name, "capacity")
        by_reason.labels(model_name, "deferred").set(0)
        self.perf = perf
        self.estimated = [counter(f"estimated_{what}_per_gpu", f"Estimated number of {doc} per GPU (for Model "
                                  f"Flops Utilization calculations).") if perf is not None else None
                          for what, doc in (("flops", "floating point operations"),
                                            ("read_bytes", "bytes read from memory"),
                                            ("write_bytes", "bytes written to memory"))]
        self.kv_cache_usage = gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.num_free_blocks = gauge("num_free_kv_blocks", "Free KV blocks (cached or not).")
        self.num_total_blocks = gauge("num_total_kv_blocks", "KV blocks (without the null block).")
        self.hit_rate = gauge("prefix_cache_hit_rate", "prefix_cache_hits / prefix_cache_queries since start.")
        self.prefix_cache_queries = counter("prefix_cache_queries",
                                            "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_cache_hits = counter("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        self.num_preemptions = counter("num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("generation_tokens", "Number of generation tokens processed.")
        self.request_success = Counter(PREFIX + "request_success", "Count of successfully processed requests.",
                                       ["model_name", "finished_reason"], registry=r)
        self.model_name = model_name
        for reason in ("stop", "length", "abort", "error"):
            self.request_success.labels(model_name, reason)
        self.ttft = histogram("time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             TPOT_BUCKETS)
        self.tpot = histogram("request_time_per_output_token_seconds",
                              "Histogram of time_per_output_token_seconds per request.", TPOT_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             E2E_BUCKETS)
        self.queue_time = histogram("request_queue_time_seconds",
                                    "Histogram of time spent in WAITING phase for request.", E2E_BUCKETS)
        self.inference_time = histogram("request_inference_time_seconds",
                                        "Histogram of time spent in RUNNING phase for request.", E2E_BUCKETS)
        self.prefill_time = histogram("request_prefill_time_seconds",
                                      "Histogram of time spent in PREFILL phase for request.", E2E_BUCKETS)
        self.decode_time = histogram("request_decode_time_seconds",
                                     "Histogram of time spent in DECODE phase for request.", E2E_BUCKETS)
        token_buckets = build_1_2_5_buckets(max_model_len)
        self.request_prompt_tokens = histogram("request_prompt_tokens", "Number of prefill tokens processed.",
                                               token_buckets)
        self.request_generation_tokens = histogram("request_generation_tokens",
                                                   "Number of generation tokens processed.", token_buckets)
        self.request_prefill_kv_computed = histogram(
            "request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).", token_buckets)
        self.iteration_tokens = histogram("iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                                          ITERATION_TOKENS_BUCKETS)
        self.request_max_num_generation_tokens = histogram(
            "request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.",
            token_buckets)
        self.request_params_n = histogram("request_params_n", "Histogram of the n request parameter.", [1, 2, 5, 10, 20])
        self.request_params_max_tokens = histogram("request_params_max_tokens",
                                                   "Histogram of the max_tokens request parameter.", token_buckets)
        self.prompt_tokens_cached = counter("prompt_tokens_cached", "Number of cached prompt tokens (local + external).")
        self.prompt_tokens_by_source = Counter(PREFIX + "prompt_tokens_by_source", "Number of prompt tokens by source.",
                                               ["model_name", "source"], registry=r)
        for source in PROMPT_TOKEN_SOURCES:  # no KV connector here: external_kv_transfer stays 0
            self.prompt_tokens_by_source.labels(model_name, source)
        self.spec_decode_num_drafts = counter("spec_decode_num_drafts", "Number of spec decoding drafts.")
        self.spec_decode_num_draft_tokens = counter("spec_decode_num_draft_tokens", "Number of draft tokens.")
        self.spec_decode_num_accepted_tokens = counter("spec_decode_num_accepted_tokens",
                                                       "Number of accepted tokens.")
        self.spec_decode_accepted_per_pos = Counter(PREFIX + "spec_decode_num_accepted_tokens_per_pos",
                                                    "Accepted tokens per draft position.",
                                                    ["model_name", "position"], registry=r)
        self.spec_decode_acceptance_rate = gauge("spec_decode_acceptance_rate",
                                                 "Accepted / draft tokens since start (minivllm; vLLM derives it).")
        self.spec_decode_mean_acceptance_length = gauge(
            "spec_decode_mean_acceptance_length", "1 + accepted tokens per draft since start (minivllm).")
        sleep_state = Gauge(PREFIX + "engine_sleep_state", "Engine sleep state; awake = 1 means engine is awake "
                            "(minivllm has no sleep mode).", ["model_name", "sleep_state"], registry=r,
                            multiprocess_mode="mostrecent")
        for state, value in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            sleep_state.labels(model_name, state).set(value)
        if cache_config is not None:  # an info metric as vLLM emulates it: a gauge at 1, the config as labels
            info = {k: str(v) for k, v in dataclasses.asdict(cache_config).items()} | {"engine": "0"}
            Gauge(PREFIX + "cache_config_info", "Information of the LLMEngine CacheConfig", list(info),
                  registry=r, multiprocess_mode="mostrecent").labels(**info).set(1)
        self._totals = {"queries": 0, "hits": 0, "preemptions": 0}  # the core's cumulative counts seen so far

    def _set_scheduler_stats(self, s: SchedulerStats) -> None:
        self.num_requests_running.set(s.num_running_reqs)
        self.num_requests_waiting.set(s.num_waiting_reqs)
        self.waiting_capacity.set(s.num_waiting_reqs)
        self.kv_cache_usage.set(s.kv_cache_usage)
        self.num_free_blocks.set(s.num_free_blocks)
        self.num_total_blocks.set(s.num_total_blocks)
        self.hit_rate.set(s.prefix_cache_hits / s.prefix_cache_queries if s.prefix_cache_queries else 0.0)
        for key, total, counter in (("queries", s.prefix_cache_queries, self.prefix_cache_queries),
                                    ("hits", s.prefix_cache_hits, self.prefix_cache_hits),
                                    ("preemptions", s.num_preemptions, self.num_preemptions)):
            seen = self._totals[key]
            counter.inc(total - seen if total >= seen else total)  # a lower total: the core's stats were reset
            self._totals[key] = total
        if s.spec_decoding_stats is not None:
            self._set_spec_decoding_stats(s.spec_decoding_stats)

    def _set_spec_decoding_stats(self, sd) -> None:
        """The core's cumulative draft counts become counter increments (vLLM's spec_decode_* names)."""
        totals = [("drafts", sd.num_drafts, self.spec_decode_num_drafts),
                  ("draft_tokens", sd.num_draft_tokens, self.spec_decode_num_draft_tokens),
                  ("accepted", sd.num_accepted_tokens, self.spec_decode_num_accepted_tokens)]
        totals += [(f"pos{i}", n, self.spec_decode_accepted_per_pos.labels(self.model_name, str(i)))
                   for i, n in enumerate(sd.num_accepted_tokens_per_pos)]
        for key, total, counter in totals:
            seen = self._totals.get(key, 0)
            counter.inc(total - seen if total >= seen else total)
            self._totals[key] = total
        self.spec_decode_acceptance_rate.set(sd.acceptance_rate)
        self.spec_decode_mean_acceptance_length.set(sd.mean_acceptance_length)

    def record(self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None) -> None:
        if scheduler_stats is not None:
            self._set_scheduler_stats(scheduler_stats)
        if iteration_stats is None:
            return
        it = iteration_stats
        computed = it.num_prompt_tokens - it.num_cached_prompt_tokens
        self.prompt_tokens.inc(it.num_prompt_tokens)
        self.prompt_tokens_by_source.labels(self.model_name, "local_compute").inc(computed)
        self.prompt_tokens_by_source.labels(self.model_name, "local_cache_hit").inc(it.num_cached_prompt_tokens)
        self.prompt_tokens_cached.inc(it.num_cached_prompt_tokens)
        self.generation_tokens.inc(it.num_generation_tokens)
        self.iteration_tokens.observe(computed + it.num_generation_tokens)
        if self.perf is not None:
            for counter, amount in zip(self.estimated, self.perf.step(computed + it.num_generation_tokens),
                                       strict=True):
                counter.inc(amount)
        for hist, values in ((self.ttft, iteration_stats.time_to_first_tokens),
                             (self.itl, iteration_stats.inter_token_latencies),
                             (self.tpot, iteration_stats.time_per_output_tokens),
                             (self.e2e, iteration_stats.e2e_latencies),
                             (self.queue_time, iteration_stats.queue_times),
                             (self.request_prompt_tokens, iteration_stats.request_prompt_tokens),
                             (self.request_generation_tokens, iteration_stats.request_generation_tokens),
                             (self.prefill_time, it.prefill_times), (self.decode_time, it.decode_times),
                             (self.inference_time, it.inference_times),
                             (self.request_prefill_kv_computed, it.request_prefill_kv_computed_tokens),
                             # each of an n > 1 request's children is its own request (n = 1) here, so these
                             # record per child where vLLM records the parent's n and its children's max
                             (self.request_max_num_generation_tokens, it.request_generation_tokens),
                             (self.request_params_n, it.n_params),
                             (self.request_params_max_tokens, it.request_max_tokens)):
            for v in values:
                hist.observe(v)
        for reason in iteration_stats.finished_reasons:
            self.request_success.labels(self.model_name, reason).inc()

    def record_abort(self, n: int = 1) -> None:
        """Requests the frontend aborted (client gone): they never reach a finished output."""
        self.request_success.labels(self.model_name, "abort").inc(n)

    def render(self, scheduler_stats: SchedulerStats | None = None) -> str:
        """The Prometheus text; scheduler_stats, a fresh snapshot, updates the gauges first."""
        if scheduler_stats is not None:
            self._set_scheduler_stats(scheduler_stats)
        if multiprocess_mode():
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry).decode()
        return generate_latest(self.registry).decode()


def parse_prometheus(text: str) -> dict[str, float]:
    """{'name{labels}': value} from a /metrics body (for tests and the benchmark)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out
