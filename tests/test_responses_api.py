"""POST /v1/responses (vLLM's Responses API, minivllm/entrypoints/openai/responses.py), driven by the official
openai client against a real `minivllm serve` on a tiny random model: streamed and not, text.format through
structured outputs, output logprobs, and function tools with the pythonic parser and auto tool choice."""
from __future__ import annotations

import json

import openai
import pytest
from test_api_server import API_KEY, NAME, launch_server, stop_server

from minivllm.distributed.parallel_state import get_open_port

GREEDY = {"temperature": 0.0}
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Verona", "Mantua"]}}, "required": ["city"]}}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def client(tiny_model, tmp_path_factory):
    """The server with auto tool choice (pythonic parser) and compact JSON, as the corpus' "tools" profile."""
    model = tiny_model("llama")
    port = get_open_port()
    log = open(tmp_path_factory.mktemp("log") / "server.log", "w+")
    proc = launch_server(model, port, log, "--enable-auto-tool-choice", "--tool-call-parser", "pythonic",
                         "--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}')
    try:
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=API_KEY, max_retries=0)
    finally:
        stop_server(proc)
        log.close()


def test_streamed_text_is_the_non_streamed_text(client):
    """Greedy: the deltas join to the answer, and the events come in vLLM's order, numbered from 0."""
    kw = dict(model=NAME, instructions="Be brief.", input="Speak, Horatio.", max_output_tokens=10, **GREEDY)
    full = client.responses.create(**kw)
    assert full.status == "incomplete" and full.usage.output_tokens == 10 and full.output_text
    events = list(client.responses.create(stream=True, **kw))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == full.output_text
    done = events[-1].response
    assert done.output_text == full.output_text and done.usage.output_tokens == 10 and done.status == "incomplete"


def test_json_schema_output_parses_and_matches_the_schema(client):
    r = client.responses.create(model=NAME, input="Who are you?", max_output_tokens=60, text={"format": {
        "type": "json_schema", "name": "person", "schema": PERSON, "strict": True}}, **GREEDY)
    if r.status == "completed":  # a random model may run out of tokens inside the string; if it closed, it is valid
        person = json.loads(r.output_text)
        assert set(person) == {"name", "age"} and isinstance(person["age"], int) and len(person["name"]) <= 6
    assert r.output_text.startswith("{") and r.text.format.name == "person"
    obj = client.responses.create(model=NAME, input="Who?", max_output_tokens=30, text={"format": {
        "type": "json_object"}}, **GREEDY)
    assert obj.output_text.startswith("{")


def test_output_logprobs(client):
    r = client.responses.create(model=NAME, input="Speak.", max_output_tokens=5, include=[
        "message.output_text.logprobs"], top_logprobs=3, **GREEDY)
    lps = r.output[0].content[0].logprobs
    assert "".join(lp.token for lp in lps) == r.output_text and r.top_logprobs == 3
    assert all(len(lp.top_logprobs) == 3 and lp.top_logprobs[0].logprob == pytest.approx(lp.logprob) for lp in lps)


def test_forced_function_call_arguments_match_the_tool(client):
    """A named tool_choice constrains the reply to the tool's parameters: one function_call item whose arguments
    parse and satisfy the schema, streamed as the same arguments."""
    kw = dict(model=NAME, input="Weather?", tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"},
              max_output_tokens=40, **GREEDY)
    r = client.responses.create(**kw)
    [call] = r.output
    assert call.type == "function_call" and call.name == "get_weather" and r.status == "completed"
    assert json.loads(call.arguments)["city"] in ("Verona", "Mantua")
    assert r.text.format.name == "tool_calling_response"
    events = list(client.responses.create(stream=True, **kw))
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(args) == json.loads(call.arguments)
    assert [e.item.type for e in events if e.type == "response.output_item.done"] == ["function_call"]


def test_required_tool_choice_calls_a_tool(client):
    r = client.responses.create(model=NAME, input="Weather?", tools=[WEATHER], tool_choice="required",
                                max_output_tokens=60, extra_body={"logit_bias": {"64": 100, "358": 100}}, **GREEDY)
    if r.status == "completed":
        assert r.output and all(o.type == "function_call" and o.name == "get_weather" for o in r.output)
        assert all(json.loads(o.arguments)["city"] in ("Verona", "Mantua") for o in r.output)


def test_errors(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=NAME, input="hi", background=True)
    assert e.value.body["param"] == "background"
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=NAME, input="hi", previous_response_id="resp_nope")
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=NAME, input="hi", tool_choice="required")
