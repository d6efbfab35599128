"""The offline API's edges: prompt forms, the profiler hooks, the `minivllm generate` CLI."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from minivllm import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm():
    return LLM(multiprocess=False, device="cpu", attention_backend="torch", max_model_len=128)


def test_prompt_forms_agree(llm):
    tok = llm.get_tokenizer()
    ids = tok.encode("ROMEO:")
    sp = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    by_text, by_ids, by_dict = (llm.generate(p, sp, use_tqdm=False)[0] for p in
                                ("ROMEO:", ids, {"prompt_token_ids": ids}))
    assert by_text.prompt_token_ids == ids
    assert by_text.outputs[0].token_ids == by_ids.outputs[0].token_ids == by_dict.outputs[0].token_ids
    assert by_text.outputs[0].text == tok.decode(by_text.outputs[0].token_ids, skip_special_tokens=True)
    assert by_text.outputs[0].finish_reason == "length"


def test_mismatched_params_list_is_rejected(llm):
    with pytest.raises(ValueError, match="2 prompts but 1 sampling params"):
        llm.generate(["a", "b"], [SamplingParams()], use_tqdm=False)


def test_profile_writes_chrome_trace(llm, tmp_path):
    path = tmp_path / "trace.json"
    llm.start_profile(str(path))
    llm.generate("JULIET:", SamplingParams(max_tokens=3, temperature=0.0), use_tqdm=False)
    assert llm.stop_profile() == str(path)
    events = json.loads(path.read_text())["traceEvents"]
    assert any("linear" in e.get("name", "") or "mm" in e.get("name", "") for e in events)
    with pytest.raises(RuntimeError):
        llm.stop_profile()


def test_cli_generate():
    res = subprocess.run([sys.executable, "-m", "minivllm.entrypoints.cli", "generate", "--prompt", "ROMEO:",
                          "--max-tokens", "8", "--device", "cpu"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "ROMEO:" in res.stdout and "tok/s" in res.stderr


def test_cli_bad_argument_is_a_clear_error():
    res = subprocess.run([sys.executable, "-m", "minivllm.entrypoints.cli", "generate", "--prompt", "x",
                          "--temperature", "-1", "--device", "cpu"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "temperature must be non-negative" in res.stderr


def test_profile_through_engine_core_process(tmp_path):
    llm = LLM(device="cpu", attention_backend="torch", max_model_len=128)  # EngineCore in its own process
    path = tmp_path / "mp_trace.json"
    llm.start_profile(str(path))
    llm.generate("JULIET:", SamplingParams(max_tokens=3, temperature=0.0), use_tqdm=False)
    llm.stop_profile()
    names = {e.get("name", "") for e in json.loads(path.read_text())["traceEvents"]}
    assert any("linear" in n or n.endswith("mm") for n in names), sorted(names)[:20]  # the model's GEMMs
    assert any("scaled_dot_product" in n for n in names)  # and its attention


def test_cli_async_scheduling_flag():
    """vLLM's BooleanOptionalAction pair: --async-scheduling / --no-async-scheduling, default None."""
    from minivllm.entrypoints.cli import build_parser, engine_kwargs
    parser = build_parser()
    for cmd in ("serve", "generate"):
        for flags, want in (([], None), (["--async-scheduling"], True), (["--no-async-scheduling"], False)):
            args = parser.parse_args([cmd, *flags])
            assert args.async_scheduling is want and engine_kwargs(args)["async_scheduling"] is want


def test_cli_engine_flags_come_from_engine_args():
    """Each engine flag's default is its EngineArgs field's and its value parses to the field's type."""
    from minivllm.config import CLI_HELP, EngineArgs
    from minivllm.entrypoints.cli import build_parser, engine_kwargs
    defaults = EngineArgs(model="m")
    args = build_parser().parse_args(["serve"])
    assert engine_kwargs(args) == {k: getattr(defaults, k) for k in CLI_HELP}
    args = build_parser().parse_args(["generate", "--cudagraph-capture-sizes", "1", "2", "--no-enable-prefix-caching",
                                      "--speculative-config", '{"method": "ngram"}', "--max-model-len", "64",
                                      "--enforce-eager"])
    kw = engine_kwargs(args)
    assert (kw["cudagraph_capture_sizes"], kw["enable_prefix_caching"], kw["speculative_config"],
            kw["max_model_len"], kw["enforce_eager"]) == ([1, 2], False, {"method": "ngram"}, 64, True)


def test_serve_with_async_scheduling(tmp_path):
    """One real request through `minivllm serve --async-scheduling`; the flag reaches the EngineCore, where
    speculation with async scheduling is still refused by name."""
    import httpx
    from test_api_server import API_KEY, NAME, free_port, launch_server, stop_server

    from minivllm.config import DEFAULT_MODEL
    log = open(tmp_path / "server.log", "w+")
    port = free_port()
    proc = launch_server(DEFAULT_MODEL, port, log, "--async-scheduling")
    try:
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", headers={"Authorization": f"Bearer {API_KEY}"},
                       json={"model": NAME, "prompt": "ROMEO:", "max_tokens": 8, "temperature": 0,
                             "ignore_eos": True}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 8 and r.json()["choices"][0]["text"]
        from minivllm.entrypoints.openai.metrics import parse_prometheus
        m = parse_prometheus(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)
        for phase in ("prefill", "decode", "inference"):  # the finished request's phases reached /metrics
            assert m[f'minivllm:request_{phase}_time_seconds_count{{model_name="{NAME}"}}'] == 1, phase
        assert (m[f'minivllm:request_inference_time_seconds_sum{{model_name="{NAME}"}}']
                >= m[f'minivllm:request_decode_time_seconds_sum{{model_name="{NAME}"}}'])
    finally:
        stop_server(proc)
    res = subprocess.run([sys.executable, "-m", "minivllm.entrypoints.cli", "serve", DEFAULT_MODEL, "--port",
                          str(free_port()), "--device", "cpu", "--async-scheduling", "--speculative-config",
                          '{"method": "ngram", "num_speculative_tokens": 2}'],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode != 0 and "async_scheduling" in res.stderr + res.stdout


def test_get_metrics_matches_vllm_reader_shapes():
    """vLLM's LLM.get_metrics (v1/metrics/reader.py shapes), read the way its spec_decode.py example reads it."""
    from minivllm.metrics.reader import Counter, Gauge, Histogram, Vector
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    llm = LLM(multiprocess=False, disable_log_stats=False, speculative_config=spec, device="cpu",
              attention_backend="torch", max_model_len=128)
    try:
        prompts = ["ROMEO:\nWhat light through yonder window breaks?\nROMEO:\nWhat light", "JULIET:\nO Romeo"]
        outs = llm.generate(prompts, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True), use_tqdm=False)
        metrics = {m.name: m for m in llm.get_metrics()}
        sd = llm.llm_engine.get_stats().spec_decoding_stats
    finally:
        llm.llm_engine.engine_core.shutdown()
    drafts, draft_tokens = metrics["minivllm:spec_decode_num_drafts"], metrics["minivllm:spec_decode_num_draft_tokens"]
    accepted = metrics["minivllm:spec_decode_num_accepted_tokens"]
    per_pos = metrics["minivllm:spec_decode_num_accepted_tokens_per_pos"]
    assert isinstance(drafts, Counter) and isinstance(per_pos, Vector)
    assert (drafts.value, draft_tokens.value, accepted.value) == (sd.num_drafts, sd.num_draft_tokens,
                                                                  sd.num_accepted_tokens)
    assert per_pos.values == sd.num_accepted_tokens_per_pos and sum(per_pos.values) == accepted.value > 0
    assert len(per_pos.values) == 3 and "position" not in per_pos.labels
    gen = metrics["minivllm:generation_tokens"]
    assert isinstance(gen, Counter) and gen.value == sum(len(o.outputs[0].token_ids) for o in outs) == 48
    e2e = metrics["minivllm:e2e_request_latency_seconds"]
    assert isinstance(e2e, Histogram) and e2e.count == 2 == e2e.buckets["+Inf"] and e2e.sum > 0
    assert list(e2e.buckets.values()) == sorted(e2e.buckets.values())  # cumulative, as Prometheus keeps them
    assert isinstance(metrics["minivllm:num_requests_running"], Gauge)
    assert metrics["minivllm:request_generation_tokens"].buckets["20.0"] == 0
    assert metrics["minivllm:request_generation_tokens"].buckets["50.0"] == 2


def test_get_metrics_needs_stats(llm):
    with pytest.raises(AssertionError, match="Stat logging disabled"):
        llm.get_metrics()
