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
    assert any("mm" in e.get("name", "") for e in json.loads(path.read_text())["traceEvents"])


def test_cli_async_scheduling_flag():
    """vLLM's BooleanOptionalAction pair: --async-scheduling / --no-async-scheduling, default None."""
    from minivllm.entrypoints.cli import build_parser, engine_kwargs
    parser = build_parser()
    for cmd in ("serve", "generate"):
        for flags, want in (([], None), (["--async-scheduling"], True), (["--no-async-scheduling"], False)):
            args = parser.parse_args([cmd, *flags])
            assert args.async_scheduling is want and engine_kwargs(args)["async_scheduling"] is want


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
    finally:
        stop_server(proc)
    res = subprocess.run([sys.executable, "-m", "minivllm.entrypoints.cli", "serve", DEFAULT_MODEL, "--port",
                          str(free_port()), "--device", "cpu", "--async-scheduling", "--speculative-config",
                          '{"method": "ngram", "num_speculative_tokens": 2}'],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode != 0 and "async_scheduling" in res.stderr + res.stdout
