"""Tool calls and CORS, driven by the official openai client over loopback (issue #55).

One `minivllm serve` on the shipped model with vLLM's tool flags (--enable-auto-tool-choice --tool-call-parser
pythonic), compact JSON (--structured-outputs-config disable_any_whitespace, as the oracle's tools profile) and
a CORS allow-list (--allowed-origins): named and "required" tool_choice are constrained to the tool's JSON
schema, so the shipped model's calls parse as JSON; "auto" reads pythonic calls; parallel_tool_calls=false
keeps the first call.
"""
from __future__ import annotations

import json

import httpx
import openai
import pytest
from test_api_server import free_port, launch_server, stop_server

from autograder.vllm_oracle.server_corpus import CLOSE_ARRAY, PYTHONIC_ONE, PYTHONIC_TWO, TOOLS
from minivllm.entrypoints.openai.api_server import build_app
from minivllm.entrypoints.openai.tool_calls import parse_pythonic

MODEL = "data/models/shakespeare-llama"
API_KEY = "sk-minivllm-test"
ORIGIN = "http://notebook.example"
MESSAGES = [{"role": "user", "content": "What weather in Verona?"}]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    port = free_port()
    log = open(tmp_path_factory.mktemp("log") / "server.log", "w+")
    proc = launch_server(MODEL, port, log, "--max-model-len", "256", "--enable-auto-tool-choice",
                         "--tool-call-parser", "pythonic", "--structured-outputs-config",
                         '{"disable_any_whitespace": true}', "--allowed-origins", json.dumps([ORIGIN]),
                         "--allowed-methods", '["GET", "POST"]')
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_server(proc)
        log.close()


@pytest.fixture(scope="module")
def client(base):
    return openai.OpenAI(base_url=base + "/v1", api_key=API_KEY, max_retries=0)


def _model(client) -> str:
    return client.models.list().data[0].id


def test_named_tool_choice_is_a_call_whose_arguments_match_the_schema(client):
    r = client.chat.completions.create(model=_model(client), messages=MESSAGES, tools=TOOLS, max_tokens=40,
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                       temperature=0)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "stop" and msg.content == "" and len(msg.tool_calls) == 1
    call = msg.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("chatcmpl-tool-")
    assert json.loads(call.function.arguments)["city"] in ("Verona", "Mantua")


def test_named_tool_choice_streams_the_name_once_then_arguments(client):
    stream = client.chat.completions.create(model=_model(client), messages=MESSAGES, tools=TOOLS, max_tokens=40,
                                            tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                            temperature=0, stream=True)
    deltas = [tc for chunk in stream for ch in chunk.choices for tc in (ch.delta.tool_calls or [])]
    assert deltas[0].function.name == "get_weather" and deltas[0].id and deltas[0].type == "function"
    assert all(d.function.name is None and d.index == 0 for d in deltas[1:])
    assert json.loads("".join(d.function.arguments for d in deltas))["city"] in ("Verona", "Mantua")


def test_required_tool_choice_calls_a_listed_tool(client):
    r = client.chat.completions.create(model=_model(client), messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                       temperature=0, extra_body=CLOSE_ARRAY)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == ""
    names = {t["function"]["name"] for t in TOOLS}
    assert choice.message.tool_calls and all(c.function.name in names for c in choice.message.tool_calls)
    for c in choice.message.tool_calls:
        assert isinstance(json.loads(c.function.arguments), dict)


def test_auto_reads_pythonic_calls_and_parallel_tool_calls_off_keeps_the_first(client):
    """The model writes a pythonic call list when a regex makes it; auto tool choice turns it into calls."""
    kw = dict(model=_model(client), messages=MESSAGES, tools=TOOLS, tool_choice="auto", temperature=0, max_tokens=40)
    one = client.chat.completions.create(**kw, extra_body=PYTHONIC_ONE)
    assert one.choices[0].finish_reason == "tool_calls" and one.choices[0].message.content is None
    assert [c.function.name for c in one.choices[0].message.tool_calls] == ["get_weather"]
    both = client.chat.completions.create(**kw, extra_body=PYTHONIC_TWO)
    calls = both.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[1].function.arguments)["tz"] in ("UTC", "CET")
    first = client.chat.completions.create(**kw, parallel_tool_calls=False, extra_body=PYTHONIC_TWO)
    assert [c.function.name for c in first.choices[0].message.tool_calls] == ["get_weather"]
    plain = client.chat.completions.create(**kw)  # unconstrained, the model just talks
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].message.content


def test_auto_streams_pythonic_calls_as_growing_arguments(client):
    stream = client.chat.completions.create(model=_model(client), messages=MESSAGES, tools=TOOLS, tool_choice="auto",
                                            temperature=0, max_tokens=40, stream=True, extra_body=PYTHONIC_TWO)
    chunks = list(stream)
    args: dict[int, str] = {}
    for ch in (c for chunk in chunks for c in chunk.choices):
        for d in ch.delta.tool_calls or []:
            args[d.index] = args.get(d.index, "") + (d.function.arguments or "")
    assert [json.loads(a) for a in args.values()][0]["city"] == "Verona" and len(args) == 2
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_choice_errors_name_the_field(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=_model(client), messages=MESSAGES, tools=TOOLS,
                                       tool_choice={"type": "function", "function": {"name": "fly"}})
    assert e.value.body["param"] == "tool_choice"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=_model(client), messages=MESSAGES, tools=[], tool_choice="auto")
    assert e.value.body["param"] == "tools"


def test_pythonic_parser_reads_literals_and_refuses_other_text():
    calls = parse_pythonic('[f(a=1, b="x", c=[true, null], d={"k": 2.5}), g.h()]')
    assert [c["function"]["name"] for c in calls] == ["f", "g.h"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"a": 1, "b": "x", "c": [True, None], "d": {"k": 2.5}}
    assert parse_pythonic("To be, or not to be") is None and parse_pythonic("[1, 2]") is None


def test_cors_follows_the_allowed_origins(base):
    """Starlette's CORSMiddleware with --allowed-origins: a preflight from the listed origin gets its
    headers, another origin does not; an API-key-less preflight is not refused (browsers send none)."""
    pre = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization,content-type"}
    r = httpx.options(base + "/v1/chat/completions", headers=pre)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in r.headers["access-control-allow-methods"]
    r = httpx.options(base + "/v1/chat/completions", headers=pre | {"Origin": "http://elsewhere.example"})
    assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
    r = httpx.get(base + "/v1/models", headers={"Origin": ORIGIN, "Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN


def test_tool_flags_are_checked_at_startup():
    from minivllm.config import EngineArgs
    with pytest.raises(ValueError, match="requires --tool-call-parser"):
        build_app(EngineArgs(model=MODEL), enable_auto_tool_choice=True)
    with pytest.raises(ValueError, match="hermes"):
        build_app(EngineArgs(model=MODEL), tool_call_parser="hermes")
    with pytest.raises(ValueError, match="backend"):
        build_app(EngineArgs(model=MODEL), structured_outputs_config={"backend": "outlines"})


# ---------------------------------------------------------------------------- the official anthropic client
WEATHER_TOOL = {"name": "get_weather", "description": "The weather in a city",
                "input_schema": TOOLS[0]["function"]["parameters"]}
GREEDY = {"temperature": 0}  # vLLM's Messages API takes temperature; anthropic>=2's create() no longer has it


@pytest.fixture(scope="module")
def claude(base):
    import anthropic

    return anthropic.Anthropic(base_url=base, api_key=API_KEY, max_retries=0,
                               default_headers={"Authorization": f"Bearer {API_KEY}"})


def test_anthropic_messages_answer_as_the_chat_route_does(claude, client):
    """/v1/messages runs the chat path: the same greedy text as /v1/chat/completions, Anthropic's stop reasons."""
    r = claude.messages.create(model=_model(client), max_tokens=6, extra_body=GREEDY, system="Be brief.",
                               messages=[{"role": "user", "content": "Speak, friend."}])
    chat = client.chat.completions.create(model=_model(client), max_tokens=6, temperature=0, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Speak, friend."}])
    assert r.type == "message" and r.role == "assistant" and r.stop_reason == "max_tokens"
    assert [b.type for b in r.content] == ["text"] and r.content[0].text == chat.choices[0].message.content
    assert (r.usage.input_tokens, r.usage.output_tokens) == (chat.usage.prompt_tokens, 6)
    counted = claude.messages.count_tokens(model=_model(client), system="Be brief.",
                                           messages=[{"role": "user", "content": "Speak, friend."}])
    assert counted.input_tokens == chat.usage.prompt_tokens


def test_anthropic_stream_events_build_the_same_message(claude, client):
    kw = {"model": _model(client), "max_tokens": 6, "extra_body": GREEDY,
          "messages": [{"role": "user", "content": "Speak, friend."}]}
    with claude.messages.stream(**kw) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop" and "content_block_delta" in events
    assert final.content[0].text == claude.messages.create(**kw).content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 6


def test_anthropic_named_tool_is_a_tool_use_block_whose_input_matches_the_schema(claude, client):
    r = claude.messages.create(model=_model(client), max_tokens=40, extra_body=GREEDY, tools=[WEATHER_TOOL],
                               tool_choice={"type": "tool", "name": "get_weather"},
                               messages=[{"role": "user", "content": "What weather in Verona?"}])
    (block,) = [b for b in r.content if b.type == "tool_use"]
    assert block.name == "get_weather" and block.input["city"] in ("Verona", "Mantua")


def test_anthropic_errors_have_anthropics_shape(claude, client):
    import anthropic

    with pytest.raises(anthropic.NotFoundError) as e:
        claude.messages.create(model="nope", max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    assert e.value.body == {"type": "error", "error": {"type": "NotFoundError",
                                                      "message": "The model `nope` does not exist."}}
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model=_model(client), max_tokens=1000, messages=[{"role": "user", "content": "Hi"}])
