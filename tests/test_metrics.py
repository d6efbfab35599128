"""PrometheusStatLogger on prometheus_client: vLLM's metric names under minivllm:, counters fed from the core's
cumulative totals, histograms from IterationStats, and PROMETHEUS_MULTIPROC_DIR aggregation across processes."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from minivllm.entrypoints.openai.metrics import PrometheusStatLogger, build_1_2_5_buckets, parse_prometheus
from minivllm.metrics.stats import IterationStats, SchedulerStats

VLLM_NAMES = ["num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prefix_cache_queries_total",
              "prefix_cache_hits_total", "num_preemptions_total", "prompt_tokens_total", "generation_tokens_total",
              "request_success_total", "time_to_first_token_seconds_bucket", "inter_token_latency_seconds_bucket",
              "request_time_per_output_token_seconds_bucket", "e2e_request_latency_seconds_bucket",
              "request_prompt_tokens_bucket", "request_generation_tokens_bucket", "request_queue_time_seconds_bucket",
              "request_prefill_time_seconds_bucket", "request_decode_time_seconds_bucket",
              "request_inference_time_seconds_bucket", "request_prefill_kv_computed_tokens_bucket",
              "iteration_tokens_total_bucket", "request_max_num_generation_tokens_bucket", "request_params_n_bucket",
              "request_params_max_tokens_bucket", "prompt_tokens_cached_total", "prompt_tokens_by_source_total"]


def test_vllm_metric_set_and_values():
    logger = PrometheusStatLogger("m", max_model_len=100)
    logger.record(SchedulerStats(num_running_reqs=2, num_waiting_reqs=1, kv_cache_usage=0.25, num_free_blocks=30,
                                 num_total_blocks=40, prefix_cache_queries=10, prefix_cache_hits=4, num_preemptions=1),
                  IterationStats(num_prompt_tokens=5, num_generation_tokens=7, time_to_first_tokens=[0.07],
                                 inter_token_latencies=[0.02, 0.3], e2e_latencies=[1.2], finished_reasons=["stop"],
                                 time_per_output_tokens=[0.16], request_prompt_tokens=[5], request_generation_tokens=[7],
                                 queue_times=[0.4]))
    logger.record(SchedulerStats(prefix_cache_queries=30, prefix_cache_hits=4, num_preemptions=1), None)
    logger.record_abort(2)
    m = parse_prometheus(logger.render())
    lab = '{model_name="m"}'
    for name in VLLM_NAMES:
        assert any(k.startswith(f"minivllm:{name}{{") for k in m), name
    assert m[f"minivllm:prefix_cache_queries_total{lab}"] == 30 and m[f"minivllm:prefix_cache_hits_total{lab}"] == 4
    assert m[f"minivllm:num_preemptions_total{lab}"] == 1  # a cumulative total seen twice counts once
    assert m[f"minivllm:num_requests_running{lab}"] == 0 and m[f"minivllm:prefix_cache_hit_rate{lab}"] == 4 / 30
    assert m[f"minivllm:prompt_tokens_total{lab}"] == 5 and m[f"minivllm:generation_tokens_total{lab}"] == 7
    assert m['minivllm:request_success_total{finished_reason="stop",model_name="m"}'] == 1
    assert m['minivllm:request_success_total{finished_reason="abort",model_name="m"}'] == 2
    assert m['minivllm:time_to_first_token_seconds_bucket{le="0.06",model_name="m"}'] == 0
    assert m['minivllm:time_to_first_token_seconds_bucket{le="0.08",model_name="m"}'] == 1
    assert m['minivllm:inter_token_latency_seconds_bucket{le="0.025",model_name="m"}'] == 1
    assert m[f"minivllm:inter_token_latency_seconds_count{lab}"] == 2
    assert abs(m[f"minivllm:inter_token_latency_seconds_sum{lab}"] - 0.32) < 1e-9
    assert m['minivllm:request_generation_tokens_bucket{le="10.0",model_name="m"}'] == 1
    assert m['minivllm:request_generation_tokens_bucket{le="5.0",model_name="m"}'] == 0
    assert m['minivllm:request_queue_time_seconds_bucket{le="0.3",model_name="m"}'] == 0
    assert m['minivllm:request_queue_time_seconds_bucket{le="0.5",model_name="m"}'] == 1
    assert build_1_2_5_buckets(100) == [1, 2, 5, 10, 20, 50, 100]
    # a second logger (another app in this process) has its own registry
    assert parse_prometheus(PrometheusStatLogger("m").render())[f"minivllm:prompt_tokens_total{lab}"] == 0


_CHILD = """
import sys
from minivllm.metrics.stats import IterationStats
from minivllm.entrypoints.openai.metrics import PrometheusStatLogger
logger = PrometheusStatLogger("m")
if sys.argv[1] == "record":
    logger.record(None, IterationStats(num_generation_tokens=int(sys.argv[2]), e2e_latencies=[1.0],
                                       finished_reasons=["length"]))
else:
    print(logger.render())
"""


def test_multiprocess_dir_aggregates_processes(tmp_path):
    env = os.environ | {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
                        "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    for n in (3, 4):
        subprocess.run([sys.executable, "-c", _CHILD, "record", str(n)], env=env, check=True, timeout=120)
    out = subprocess.run([sys.executable, "-c", _CHILD, "render"], env=env, check=True, timeout=120,
                         capture_output=True, text=True).stdout
    m = parse_prometheus(out)
    assert m['minivllm:generation_tokens_total{model_name="m"}'] == 7
    assert m['minivllm:e2e_request_latency_seconds_count{model_name="m"}'] == 2
    assert m['minivllm:request_success_total{finished_reason="length",model_name="m"}'] == 2


def test_request_phase_times_follow_vllm():
    """prefill = first scheduled -> first token, decode = first -> last token, inference = scheduled -> last
    (vLLM's RequestStateStats), from the output processor to the histograms (vLLM's request-latency buckets)."""
    from minivllm.config import DEFAULT_MODEL
    from minivllm.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
    from minivllm.engine.output_processor import OutputProcessor
    from minivllm.sampling_params import SamplingParams
    from minivllm.tokenizer import get_tokenizer
    proc = OutputProcessor(get_tokenizer(DEFAULT_MODEL))
    proc.add_request(EngineCoreRequest("r", [5, 6, 7, 8], SamplingParams(max_tokens=9), arrival_time=100.0), None)
    stats = IterationStats()
    proc.process_outputs([EngineCoreOutput("r", [11], num_cached_tokens=3, queue_time=0.5)], 101.0, stats)
    proc.process_outputs([EngineCoreOutput("r", [12, 13], num_cached_tokens=3)], 101.2, stats)  # the core sends
    proc.process_outputs([EngineCoreOutput("r", [14], finish_reason=FinishReason.LENGTH, num_cached_tokens=3)],
                         102.4, stats)  # num_cached_tokens with every output
    assert stats.prefill_times == [0.5] and stats.queue_times == [0.5]
    assert abs(stats.decode_times[0] - 1.4) < 1e-9 and abs(stats.inference_times[0] - 1.9) < 1e-9
    assert stats.num_prompt_tokens == 4 and stats.num_cached_prompt_tokens == 3
    assert stats.request_prefill_kv_computed_tokens == [1] and stats.request_max_tokens == [9]
    logger = PrometheusStatLogger("m", max_model_len=100)
    logger.record(None, stats)
    m = parse_prometheus(logger.render())
    for name, below, at in (("prefill", "0.3", "0.5"), ("decode", "1.0", "1.5"), ("inference", "1.5", "2.0")):
        assert m[f'minivllm:request_{name}_time_seconds_bucket{{le="{below}",model_name="m"}}'] == 0, name
        assert m[f'minivllm:request_{name}_time_seconds_bucket{{le="{at}",model_name="m"}}'] == 1, name
    assert m['minivllm:prompt_tokens_by_source_total{model_name="m",source="local_compute"}'] == 1
    assert m['minivllm:prompt_tokens_by_source_total{model_name="m",source="local_cache_hit"}'] == 3
    assert m['minivllm:prompt_tokens_by_source_total{model_name="m",source="external_kv_transfer"}'] == 0
    assert m['minivllm:prompt_tokens_cached_total{model_name="m"}'] == 3
    # one record() = one engine step: 1 computed prompt token + 4 generated ones
    assert m['minivllm:iteration_tokens_total_bucket{le="1.0",model_name="m"}'] == 0
    assert m['minivllm:iteration_tokens_total_bucket{le="8.0",model_name="m"}'] == 1
    assert m['minivllm:request_params_max_tokens_bucket{le="10.0",model_name="m"}'] == 1
    assert m['minivllm:request_params_n_bucket{le="1.0",model_name="m"}'] == 1
    assert m['minivllm:request_max_num_generation_tokens_sum{model_name="m"}'] == 4
    assert m['minivllm:request_prefill_kv_computed_tokens_sum{model_name="m"}'] == 1


def test_prefix_cache_queries_count_a_prompt_prefilled_in_chunks():
    """A deliberate difference (README): minivllm counts every admitted request's lookup, so a 40-token prompt
    prefilled 16 tokens a step alone counts 40 queries; vLLM's offline LLM drops the scheduler stats of steps that
    produce no output (InprocClient.get_output): it counts 0 here (run on the pinned vLLM with the same settings). A
    prompt-logprobs request is no query in either."""
    from minivllm import LLM, SamplingParams

    llm = LLM("data/models/shakespeare-llama", multiprocess=False, enforce_eager=True, max_num_batched_tokens=16,
              max_num_seqs=4, enable_prefix_caching=True, disable_log_stats=False)
    prompt = list(range(100, 140))
    llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=2), use_tqdm=False)
    llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=2, prompt_logprobs=1), use_tqdm=False)
    counters = {m.name: m.value for m in llm.get_metrics() if m.name.endswith(("prefix_cache_queries",
                                                                               "prefix_cache_hits"))}
    assert counters == {"minivllm:prefix_cache_queries": 40, "minivllm:prefix_cache_hits": 0}


def test_estimated_work_and_waiting_by_reason():
    """FLOPs/bytes per step from the shipped model's config (2 per weight per token, weights read once a step,
    K and V written per token); waiting requests all wait for capacity (minivllm defers none)."""
    from transformers import AutoConfig

    from minivllm.entrypoints.openai.metrics import PerfEstimate
    cfg = AutoConfig.from_pretrained("data/models/shakespeare-llama", local_files_only=True)
    perf = PerfEstimate.from_hf_config(cfg, dtype_bytes=4)
    h, i, L, v = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    kv = (cfg.num_key_value_heads or cfg.num_attention_heads) * (h // cfg.num_attention_heads)
    assert perf.params == L * (2 * h * h + 2 * h * kv + 3 * h * i) + h * v
    logger = PrometheusStatLogger("m", perf=perf)
    logger.record(SchedulerStats(num_waiting_reqs=3), IterationStats(num_prompt_tokens=6, num_generation_tokens=2,
                                                                     num_cached_prompt_tokens=2))
    logger.record(None, IterationStats())  # a step that computed nothing adds nothing
    m = parse_prometheus(logger.render())
    lab = '{model_name="m"}'
    assert m[f"minivllm:estimated_flops_per_gpu_total{lab}"] == 2 * perf.params * 6
    assert m[f"minivllm:estimated_read_bytes_per_gpu_total{lab}"] == 4 * perf.params
    assert m[f"minivllm:estimated_write_bytes_per_gpu_total{lab}"] == 6 * 2 * L * kv * 4
    assert m['minivllm:num_requests_waiting_by_reason{model_name="m",reason="capacity"}'] == 3
    assert m['minivllm:num_requests_waiting_by_reason{model_name="m",reason="deferred"}'] == 0
