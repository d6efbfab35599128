"""Bad input is a 400 (or finish_reason "error"), never a 500, and never takes the server down (issue #31).

A real `minivllm serve` on loopback, driven by the openai client and httpx, with small structured-output
limits set through the environment (so the size check needs no megabyte payload). Then the limits and
bounds without a server: speculative config, the grammar cache's byte bound, the compile timeout, a small
compile next to a blocked big one, and `serve` start-up errors (one line, no traceback).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

import httpx
import openai
import pytest
from test_api_server import API_KEY, NAME, free_port, launch_server, stop_server

from minivllm.config import EngineArgs, SpeculativeConfig, StructuredOutputsConfig
from minivllm.sampling_params import SamplingParams
from minivllm.sampling_params import StructuredOutputsParams as SO
from minivllm.structured_output import StructuredOutputManager
from minivllm.structured_output.backend_xgrammar import json_text_depth, validate_xgrammar_grammar
from minivllm.structured_output.request import StructuredOutputRequest

REPO = Path(__file__).resolve().parent.parent
MAX_BYTES, MAX_DEPTH = 16384, 64  # a 5,000-deep string (10 kB) passes the size check
CYCLE = {"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"}
EMPTY_GRAMMAR = "root ::= [^\\x00-\\U0010FFFF]"


def nested(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth - 1):
        schema = {"items": schema}
    return schema


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model):
    model = tiny_model("llama")
    port = free_port()
    log = open(tmp_path_factory.mktemp("log") / "server.log", "w+")
    env = dict(os.environ, MINIVLLM_STRUCTURED_OUTPUTS_MAX_BYTES=str(MAX_BYTES),
               MINIVLLM_STRUCTURED_OUTPUTS_MAX_DEPTH=str(MAX_DEPTH))
    proc = launch_server(model, port, log, env=env)
    try:
        yield proc, f"http://127.0.0.1:{port}", log
    finally:
        stop_server(proc)
        log.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[1] + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


CASES = {
    "ref_cycle": ({"response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": CYCLE}}},
                  "structured_outputs.json", "matches no output"),
    "empty_grammar": ({"structured_outputs": {"grammar": EMPTY_GRAMMAR}}, "structured_outputs.grammar",
                      "matches no output"),
    "deep_string_5000": ({"structured_outputs": {"json": "[" * 5000 + "]" * 5000}}, "structured_outputs.json",
                         f"nested more than {MAX_DEPTH} levels"),
    "deep_dict_150": ({"structured_outputs": {"json": nested(150)}}, "structured_outputs.json",
                      f"nested more than {MAX_DEPTH} levels"),
    "deep_dict_200": ({"response_format": {"type": "json_schema", "json_schema": {"name": "d",
                                                                                   "schema": nested(200)}}},
                      "structured_outputs.json", f"nested more than {MAX_DEPTH} levels"),
    "big_regex": ({"structured_outputs": {"regex": "(" + "|".join(f"w{i}" for i in range(4000)) + ")"}},
                  "structured_outputs.regex", f"limit of {MAX_BYTES} bytes"),
}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_constraint_is_a_400_naming_the_param(server, case, stream):
    body, param, message = CASES[case]
    _, url, _ = server
    r = httpx.post(f"{url}/v1/completions", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120,
                   json={"model": NAME, "prompt": "ROMEO:", "max_tokens": 8, "stream": stream, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == 400
    assert error["param"] == param and message in error["message"], error


def test_bad_constraints_through_the_openai_client_then_the_server_still_serves(server, client):
    proc, url, log = server
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "c", "schema": CYCLE}})
    assert e.value.status_code == 400 and "matches no output" in e.value.message
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=NAME, prompt="ROMEO:", max_tokens=8,
                                  extra_body={"structured_outputs": {"grammar": EMPTY_GRAMMAR}})
    # A body nested 5,000 levels deep (not a string): FastAPI's parse, not a RecursionError 500.
    deep = json.dumps({"model": NAME, "prompt": "x", "structured_outputs": {"json": "@"}}).replace(
        '"@"', "[" * 5000 + "]" * 5000)
    r = httpx.post(f"{url}/v1/completions", headers={"Authorization": f"Bearer {API_KEY}",
                                                     "Content-Type": "application/json"}, content=deep, timeout=60)
    assert 400 <= r.status_code < 500, r.text
    # Within the limits everything still works: a nested schema 30 deep, a choice, and /health.
    ok = client.completions.create(model=NAME, prompt="ROMEO:", max_tokens=4,
                                   extra_body={"structured_outputs": {"json": nested(30)}})
    assert ok.choices[0].finish_reason in ("length", "stop")
    ok = client.completions.create(model=NAME, prompt="ROMEO:", max_tokens=8,
                                   extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert ok.choices[0].text in ("yes", "no")
    assert httpx.get(f"{url}/health").status_code == 200 and proc.poll() is None
    text = Path(log.name).read_text()
    assert "Traceback" not in text and "RecursionError" not in text, text[-3000:]


# ---------------------------------------------------------------------------- limits without a server
def test_frontend_limits_in_process():
    config = StructuredOutputsConfig(max_spec_bytes=100, max_json_depth=3)
    with pytest.raises(ValueError, match="more than 3 levels") as e:
        validate_xgrammar_grammar(SamplingParams(structured_outputs=SO(json=nested(4))), config)
    assert e.value.parameter == "structured_outputs.json"
    validate_xgrammar_grammar(SamplingParams(structured_outputs=SO(json=nested(3))), config)
    with pytest.raises(ValueError, match="limit of 100 bytes"):
        validate_xgrammar_grammar(SamplingParams(structured_outputs=SO(choice=["x" * 60, "y" * 60])), config)
    assert json_text_depth('{"a": "[[[{{", "b": [[1], {"c": "\\"]"}]}') == 3


def test_the_engine_compile_refuses_a_grammar_that_matches_nothing():
    """The core's own check (a request that skipped the frontend): no first token and no end is an error."""
    from minivllm.config import DEFAULT_MODEL
    from minivllm.structured_output.backend_types import StructuredOutputOptions as Kind
    from minivllm.structured_output.backend_xgrammar import XgrammarBackend
    from minivllm.tokenizer import get_tokenizer
    tokenizer = get_tokenizer(DEFAULT_MODEL)
    backend = XgrammarBackend(tokenizer, len(tokenizer))
    for key in ((Kind.GRAMMAR, EMPTY_GRAMMAR, True), (Kind.JSON, json.dumps(CYCLE), True)):
        with pytest.raises(ValueError, match="matches no output"):
            backend.compile(key)
    assert backend.compile((Kind.GRAMMAR, 'root ::= "a"', True)) is not None


def test_num_speculative_tokens_bounds():
    with pytest.raises(ValueError, match="must be an integer, got True"):
        SpeculativeConfig(num_speculative_tokens=True)
    with pytest.raises(ValueError, match=r"Expected num_speculative_tokens to be greater than zero \(0\)"):
        SpeculativeConfig(num_speculative_tokens=0)
    args = EngineArgs(speculative_config={"method": "ngram", "num_speculative_tokens": 10 ** 6})
    with pytest.raises(ValueError, match="num_speculative_tokens=1000000 must be smaller than max_model_len=256"):
        args.create_engine_config(256)
    args = EngineArgs(max_model_len=4096, max_num_batched_tokens=64,
                      speculative_config={"method": "ngram", "num_speculative_tokens": 100})
    with pytest.raises(ValueError, match="exceeds max_num_batched_tokens=64"):
        args.create_engine_config(4096)
    ok = EngineArgs(speculative_config={"method": "ngram", "num_speculative_tokens": 3}).create_engine_config(256)
    assert ok.speculative_config.num_speculative_tokens == 3


class FakeBackend:
    """compile() returns an object of a given memory size; keys listed in `blocked` wait for `release`."""

    def __init__(self, sizes: dict[str, int], blocked=()) -> None:
        self.sizes, self.blocked, self.release = sizes, set(blocked), threading.Event()

    def compile(self, key):
        if key[1] in self.blocked:
            assert self.release.wait(60)
        return SimpleNamespace(memory_size_bytes=self.sizes.get(key[1], 1))

    def grammar(self, compiled):
        return compiled


def fake_request(regex: str, rid: str = "r"):
    return SimpleNamespace(request_id=rid, structured_output_request=StructuredOutputRequest(SO(regex=regex)))


def manager_with(backend, **config) -> StructuredOutputManager:
    manager = StructuredOutputManager(SimpleNamespace(structured_outputs_config=StructuredOutputsConfig(**config)))
    manager.backend = backend
    return manager


def wait_ready(request) -> object:
    future = request.structured_output_request._grammar
    if isinstance(future, Future):
        try:
            future.result(60)
        except Exception:
            pass
    return request.structured_output_request.grammar


def test_grammar_cache_is_bounded_by_bytes():
    manager = manager_with(FakeBackend({"a": 60, "b": 60, "c": 30}), cache_bytes=100)
    for key in "abc":
        req = fake_request(key)
        manager.grammar_init(req)
        wait_ready(req)
    assert list(k[1] for k in manager.compiled) == ["b", "c"]  # a (60) evicted: 60 + 60 > 100
    assert sum(manager.compiled_bytes.values()) == 90
    manager.shutdown()


def test_compile_timeout_fails_the_request_and_a_small_compile_runs_beside_a_big_one():
    backend = FakeBackend({}, blocked={"big"})
    manager = manager_with(backend, compile_timeout_s=0.05)
    big, big2, small = fake_request("big", "big"), fake_request("big", "big2"), fake_request("small", "small")
    for r in (big, big2, small):
        manager.grammar_init(r)
    # The small grammar compiles while the big one (and a second request waiting on it) is stuck.
    assert not isinstance(wait_ready(small), Exception) and wait_ready(small) is not None
    so = big.structured_output_request
    so.compile_deadline = 0.0  # as if compile_timeout_s had passed
    error = so.grammar
    assert isinstance(error, TimeoutError) and "did not compile within 0.05 s" in str(error)
    backend.release.set()
    assert not isinstance(wait_ready(big2), Exception)
    manager.shutdown()


# ---------------------------------------------------------------------------- serve start-up errors
SPEC_1E6 = json.dumps({"method": "ngram", "num_speculative_tokens": 10 ** 6})


@pytest.mark.parametrize("argv, names", [
    (["--speculative-config", SPEC_1E6], "num_speculative_tokens=1000000"),
    (["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": True})],
     "num_speculative_tokens must be an integer"),
    (["--block-size", "3"], "block_size"),
    (["-tp", "3"], "tensor_parallel_size"),
])
def test_bad_serve_setting_is_one_line_in_process(argv, names, capsys):
    """cli.main as `minivllm serve` runs it: the config fails before any process or socket starts."""
    from minivllm.entrypoints.cli import main
    assert main(["serve", "--device", "cpu", "--port", str(free_port()), *argv]) == 2
    out, err = capsys.readouterr()
    lines = [line for line in (out + err).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("minivllm: error: ") and names in lines[0], lines


def run_serve(*argv: str) -> tuple[int, list[str]]:
    cmd = [sys.executable, "-m", "minivllm.entrypoints.cli", "serve", "--device", "cpu", "--port", str(free_port()),
           *argv]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    return r.returncode, [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]


def test_serve_with_a_million_speculative_tokens_exits_with_one_line():
    code, lines = run_serve("--speculative-config", SPEC_1E6)
    assert code == 2 and len(lines) == 1, lines[-20:]
    assert lines[0] == ("minivllm: error: speculative_config.num_speculative_tokens=1000000 must be smaller than "
                        "max_model_len=1024"), lines


@pytest.mark.slow
def test_serve_whose_engine_core_fails_to_start_exits_with_one_line():
    code, lines = run_serve("--attention-backend", "nope")
    assert code == 1 and len(lines) == 1, lines[-20:]
    assert lines[0].startswith("minivllm: error: EngineCore failed to start: ValueError: unknown attention_backend")
