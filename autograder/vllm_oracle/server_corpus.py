"""The requests of the server comparison (server_diff.py): minivllm's OpenAI server against the pinned vLLM's.

Written from the pinned vLLM's request models (vllm/entrypoints/openai/completion/protocol.py CompletionRequest,
chat_completion/protocol.py ChatCompletionRequest, engine/protocol.py StreamOptions, the /tokenize and
/detokenize models in vllm/entrypoints/serve/tokenize/protocol.py) and its routes (api_server.py and the
api_router.py files): every request field, streamed and not, with valid, boundary and invalid values,
structured outputs, the API key, every route and unknown ones.

A case: name, cat (valid | streamed | structured | bad_input | routes | auth | metrics | tools), method, path,
and a JSON body (or raw bytes in `raw`, headers in `headers`); `server: "tools"` sends it to servers started
with a tool-call parser (SERVER_PROFILES). Both servers run with --api-key API_KEY, so every case
sends it unless it sets its own Authorization header (the auth cases). `sampled` cases (temperature > 0 without
a seed) are compared by shape only: their text is not reproducible.
"""
from __future__ import annotations

import json

MODEL = "shakespeare-llama"
API_KEY = "sk-minivllm-oracle"
MAX_MODEL_LEN = 256

PROMPTS = ["ROMEO:", "To be, or not to be", "First Citizen:\nBefore we proceed", "KING HENRY:\nOnce more",
           "O", "What light through yonder", "JULIET:\nAy me!", "The quality of mercy", "\n", "Friends, Romans"]
CATS = ("valid", "streamed", "structured", "bad_input", "routes", "auth", "metrics", "tools")
# Server flags beyond the common ones (server_diff.server_command); a case's "server" names its profile.
# The tools profile keeps JSON compact: the shipped model, free to add whitespace, fills max_tokens with it.
SERVER_PROFILES = {"default": [], "tools": [
    "--enable-auto-tool-choice", "--tool-call-parser", "pythonic",
    "--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}'],
    # vLLM's development routes (vllm/entrypoints/serve/dev/), on with an environment variable, not a flag
    "dev": {"flags": [], "env": {"VLLM_SERVER_DEV_MODE": "1"}}}


def _case(name, cat, path, body=None, method="POST", **kw) -> dict:
    c = {"name": name, "cat": cat, "method": method, "path": path}
    if body is not None:
        c["body"] = body
    c.update(kw)
    return c


def each(field: str, **values) -> list[tuple]:
    """A field table's rows for one field: (field, kind, {field: value}) for each kind=value, in order."""
    return [(field, kind, {field: value}) for kind, value in values.items()]


def cmpl(**kw) -> dict:
    return {"model": MODEL, "prompt": "ROMEO:", "max_tokens": 8, "temperature": 0} | kw


def chat(**kw) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Speak, friend."}], "max_tokens": 8,
            "temperature": 0} | kw


# Fields valid for both endpoints (name, value) and what each exercises.
COMMON_VALID = [
    ("stop_str", {"stop": "\n"}), ("stop_list", {"stop": ["e", "\n"]}), ("stop_empty_list", {"stop": []}),
    ("stop_incl", {"stop": ["e"], "include_stop_str_in_output": True}),
    ("stop_token_ids", {"stop_token_ids": [2, 5]}), ("stop_token_ids_empty", {"stop_token_ids": []}),
    ("ignore_eos", {"ignore_eos": True, "max_tokens": 12}), ("min_tokens", {"min_tokens": 4, "max_tokens": 6}),
    ("min_tokens_eq", {"min_tokens": 8, "max_tokens": 8}),
    ("top_k_1", {"top_k": 1, "temperature": 1.0}), ("top_k_minus1", {"top_k": -1}), ("top_k_0", {"top_k": 0}),
    ("top_p_small", {"top_p": 0.01, "temperature": 1.0}), ("top_p_1", {"top_p": 1.0}),
    ("min_p_1", {"min_p": 1.0, "temperature": 1.0}), ("min_p_0", {"min_p": 0.0}),
    ("seed_t1", {"seed": 1234, "temperature": 1.0}), ("seed_t07_topk", {"seed": 7, "temperature": 0.7, "top_k": 20}),
    ("seed_topp", {"seed": 99, "temperature": 1.3, "top_p": 0.9}), ("seed_minp", {"seed": 5, "temperature": 1.0,
                                                                                 "min_p": 0.1}),
    ("seed_negative", {"seed": -3, "temperature": 1.0}), ("temp_null", {"temperature": None}),
    ("temp_small", {"temperature": 1e-6}),
    ("presence_penalty", {"presence_penalty": 1.5}), ("presence_penalty_neg", {"presence_penalty": -1.0}),
    ("frequency_penalty", {"frequency_penalty": 1.2}), ("frequency_penalty_neg", {"frequency_penalty": -0.5}),
    ("repetition_penalty", {"repetition_penalty": 1.3}), ("repetition_penalty_lt1", {"repetition_penalty": 0.8}),
    ("all_penalties", {"presence_penalty": 0.3, "frequency_penalty": 0.4, "repetition_penalty": 1.1, "max_tokens": 16}),
    ("penalties_seeded", {"presence_penalty": 0.5, "frequency_penalty": 0.5, "seed": 3, "temperature": 1.0}),
    ("n2_seeded", {"n": 2, "seed": 11, "temperature": 1.0}), ("n3_greedy", {"n": 3}),
    ("n2_unseeded", {"n": 2, "temperature": 1.0}),
    ("user", {"user": "someone"}), ("skip_special_false", {"skip_special_tokens": False}),
    ("spaces_between_special_false", {"spaces_between_special_tokens": False}),
    ("logit_bias", {"logit_bias": {"5": 100}}), ("allowed_token_ids", {"allowed_token_ids": [5, 6, 7]}),
    ("bad_words", {"bad_words": ["the"]}), ("truncate_prompt_tokens", {"truncate_prompt_tokens": 2}),
    ("priority", {"priority": 0}), ("request_id", {"request_id": "my-request-1"}),
    ("return_token_ids", {"return_token_ids": True}), ("return_tokens_as_token_ids",
                                                      {"return_tokens_as_token_ids": True}),
    ("prompt_logprobs_0", {"prompt_logprobs": 0}), ("prompt_logprobs_2", {"prompt_logprobs": 2}),
    ("cache_salt", {"cache_salt": "salty"}), ("length_penalty", {"length_penalty": 1.0}),
    ("use_beam_search_false", {"use_beam_search": False}), ("add_special_tokens_false", {"add_special_tokens": False}),
    ("unknown_field", {"not_a_field": 1}), ("model_null", {"model": None}),
    ("max_tokens_1", {"max_tokens": 1}), ("max_tokens_null", {"max_tokens": None}),
    ("stream_false", {"stream": False}), ("vllm_xargs", {"vllm_xargs": {"a": 1}}),
]

COMMON_BAD = [
    ("temperature_neg", {"temperature": -1}), ("top_p_0", {"top_p": 0}), ("top_p_gt1", {"top_p": 1.5}),
    ("top_k_minus2", {"top_k": -2}), ("min_p_gt1", {"min_p": 1.5}), ("min_p_neg", {"min_p": -0.1}),
    ("n_0", {"n": 0}), ("n_str", {"n": "two"}), ("max_tokens_neg", {"max_tokens": -1}),
    ("max_tokens_huge", {"max_tokens": 10000}), ("max_tokens_over_ctx", {"max_tokens": 254}),
    ("max_tokens_str", {"max_tokens": "abc"}), ("max_tokens_float", {"max_tokens": 2.5}),
    ("temperature_str", {"temperature": "hot"}), ("stop_int", {"stop": 5}), ("stop_token_ids_str",
                                                                             {"stop_token_ids": ["a"]}),
    ("seed_huge", {"seed": 2 ** 70}), ("model_wrong", {"model": "gpt-4"}),
    ("presence_penalty_big", {"presence_penalty": 3}), ("frequency_penalty_small", {"frequency_penalty": -2.5}),
    ("repetition_penalty_0", {"repetition_penalty": 0}), ("repetition_penalty_neg", {"repetition_penalty": -1}),
    ("min_tokens_neg", {"min_tokens": -1}), ("min_tokens_gt_max", {"min_tokens": 9, "max_tokens": 4}),
    ("stream_options_without_stream", {"stream_options": {"include_usage": True}}),
    ("stream_options_stream_false", {"stream": False, "stream_options": {"include_usage": True}}),
    ("use_beam_search", {"use_beam_search": True}), ("n_huge", {"n": 1000}),
    ("logit_bias_bad_key", {"logit_bias": {"x": 1}}), ("allowed_token_ids_oov", {"allowed_token_ids": [10 ** 6]}),
    ("truncate_prompt_tokens_over", {"truncate_prompt_tokens": 1000}),
    ("prompt_logprobs_neg", {"prompt_logprobs": -2}), ("priority_nonzero", {"priority": 5}),
    ("stream_interval_0", {"stream_interval": 0}), ("stream_str", {"stream": "yes"}),
    ("ignore_eos_str", {"ignore_eos": "maybe"}), ("skip_special_int", {"skip_special_tokens": 3}),
]

STRUCTURED = [
    ("so_choice", {"structured_outputs": {"choice": ["yes", "no", "maybe"]}}),
    ("so_regex", {"structured_outputs": {"regex": "[a-z]{3} [0-9]{2}"}, "max_tokens": 12}),
    ("so_json", {"structured_outputs": {"json": {"type": "object", "properties": {"a": {"type": "integer"}},
                                                 "required": ["a"]}}, "max_tokens": 24}),
    ("so_json_object", {"structured_outputs": {"json_object": True}, "max_tokens": 12}),
    ("so_grammar", {"structured_outputs": {"grammar": 'root ::= "ab" | "cd"'}}),
    ("so_json_enum", {"structured_outputs": {"json": {"enum": ["red", "green"]}}}),
    ("rf_text", {"response_format": {"type": "text"}}),
    ("rf_json_object", {"response_format": {"type": "json_object"}, "max_tokens": 12}),
    ("rf_json_schema", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "t", "schema": {"type": "object", "properties": {"b": {"type": "boolean"}}, "required": ["b"]}}},
        "max_tokens": 24}),
    ("rf_json_schema_strict", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "t", "strict": True, "schema": {"type": "string", "maxLength": 4}}}, "max_tokens": 12}),
    ("so_choice_sampled", {"structured_outputs": {"choice": ["alpha", "beta"]}, "temperature": 1.0, "seed": 1}),
    ("so_regex_logprobs", {"structured_outputs": {"regex": "(ab|cd)e"}, "max_tokens": 6}),
]
STRUCTURED_BAD = [
    ("so_two_kinds", {"structured_outputs": {"regex": "a", "choice": ["a"]}}),
    ("so_bad_regex", {"structured_outputs": {"regex": "(unclosed"}}),
    ("so_bad_schema", {"structured_outputs": {"json": {"type": "nonsense"}}}),
    ("so_bad_grammar", {"structured_outputs": {"grammar": "root ::= ("}}),
    ("so_empty", {"structured_outputs": {}}),
    ("so_unknown_key", {"structured_outputs": {"foo": 1}}),
    ("rf_bad_type", {"response_format": {"type": "xml"}}),
    ("rf_json_schema_missing", {"response_format": {"type": "json_schema"}}),
    ("so_choice_empty", {"structured_outputs": {"choice": []}}),
]


def completion_cases() -> list[dict]:
    p = "/v1/completions"
    cases = []
    for i, prompt in enumerate(PROMPTS):
        for mt in (1, 5, 24):
            cases.append(_case(f"cmpl/greedy/p{i}/mt{mt}", "valid", p, cmpl(prompt=prompt, max_tokens=mt)))
    cases += [_case(f"cmpl/{n}", "valid", p, cmpl(**kw)) for n, kw in COMMON_VALID]
    cases += [
        _case("cmpl/prompt_list2", "valid", p, cmpl(prompt=["ROMEO:", "JULIET:"])),
        _case("cmpl/prompt_token_ids", "valid", p, cmpl(prompt=[1, 20, 30, 40])),
        _case("cmpl/prompt_token_id_lists", "valid", p, cmpl(prompt=[[20, 30], [40, 50, 60]])),
        _case("cmpl/prompt_list2_n2", "valid", p, cmpl(prompt=["A", "B"], n=2, seed=1, temperature=1.0)),
        _case("cmpl/max_tokens_0", "valid", p, cmpl(max_tokens=0)),
        _case("cmpl/max_tokens_fill", "valid", p, cmpl(max_tokens=MAX_MODEL_LEN - 3)),
        _case("cmpl/logprobs_0", "valid", p, cmpl(logprobs=0)),
        _case("cmpl/logprobs_1", "valid", p, cmpl(logprobs=1)),
        _case("cmpl/logprobs_5", "valid", p, cmpl(logprobs=5)),
        _case("cmpl/logprobs_20", "valid", p, cmpl(logprobs=20, max_tokens=3)),
        _case("cmpl/echo", "valid", p, cmpl(echo=True)),
        _case("cmpl/echo_logprobs", "valid", p, cmpl(echo=True, logprobs=1)),
        _case("cmpl/echo_logprobs_0", "valid", p, cmpl(echo=True, logprobs=0)),
        _case("cmpl/echo_max_tokens_0", "valid", p, cmpl(echo=True, max_tokens=0)),
        _case("cmpl/echo_max_tokens_0_logprobs", "valid", p, cmpl(echo=True, max_tokens=0, logprobs=2)),
        _case("cmpl/echo_token_ids", "valid", p, cmpl(prompt=[20, 30, 40], echo=True)),
        _case("cmpl/echo_list", "valid", p, cmpl(prompt=["A", "BC"], echo=True, logprobs=1)),
        _case("cmpl/suffix", "valid", p, cmpl(suffix="END")),
        _case("cmpl/suffix_null", "valid", p, cmpl(suffix=None)),
        _case("cmpl/echo_false", "valid", p, cmpl(echo=False)),
        _case("cmpl/logprobs_penalties", "valid", p, cmpl(logprobs=2, presence_penalty=1.0, frequency_penalty=1.0)),
        _case("cmpl/logprobs_repetition", "valid", p, cmpl(logprobs=2, repetition_penalty=1.5)),
        _case("cmpl/n2_logprobs", "valid", p, cmpl(n=2, logprobs=1)),
        _case("cmpl/return_token_ids_echo", "valid", p, cmpl(return_token_ids=True, echo=True)),
        _case("cmpl/unicode_prompt", "valid", p, cmpl(prompt="naïve café ☃")),
        _case("cmpl/long_prompt_fits", "valid", p, cmpl(prompt="a " * 100, max_tokens=4)),
    ]
    cases += [_case(f"cmpl/bad/{n}", "bad_input", p, cmpl(**kw)) for n, kw in COMMON_BAD]
    cases += [
        _case("cmpl/bad/prompt_empty", "bad_input", p, cmpl(prompt="")),
        _case("cmpl/bad/prompt_empty_list", "bad_input", p, cmpl(prompt=[])),
        _case("cmpl/bad/prompt_empty_nested", "bad_input", p, cmpl(prompt=[[]])),
        _case("cmpl/bad/prompt_missing", "bad_input", p, {"model": MODEL, "max_tokens": 4}),
        _case("cmpl/bad/prompt_int", "bad_input", p, cmpl(prompt=5)),
        _case("cmpl/bad/prompt_oov_token", "bad_input", p, cmpl(prompt=[10 ** 6])),
        _case("cmpl/bad/prompt_neg_token", "bad_input", p, cmpl(prompt=[-1])),
        _case("cmpl/bad/prompt_too_long", "bad_input", p, cmpl(prompt="a " * 400)),
        _case("cmpl/bad/prompt_plus_max_tokens", "bad_input", p, cmpl(prompt="a " * 120, max_tokens=100)),
        _case("cmpl/bad/logprobs_21", "bad_input", p, cmpl(logprobs=21)),
        _case("cmpl/bad/logprobs_neg", "bad_input", p, cmpl(logprobs=-1)),
        _case("cmpl/bad/logprobs_bool", "bad_input", p, cmpl(logprobs="x")),
        _case("cmpl/bad/echo_str", "bad_input", p, cmpl(echo="sure")),
        _case("cmpl/bad/prompt_embeds", "bad_input", p, cmpl(prompt_embeds="AAAA")),
        _case("cmpl/bad/body_list", "bad_input", p, [1, 2]),
        _case("cmpl/bad/invalid_json", "bad_input", p, raw='{"model": ', headers={"Content-Type": "application/json"}),
        _case("cmpl/bad/empty_body", "bad_input", p, raw="", headers={"Content-Type": "application/json"}),
        _case("cmpl/bad/lone_surrogate", "bad_input", p, raw='{"prompt": "\\ud800", "max_tokens": 2}',
              headers={"Content-Type": "application/json"}),
    ]
    cases += [_case(f"cmpl/{n}", "structured", p, cmpl(**kw)) for n, kw in STRUCTURED]
    cases += [_case(f"cmpl/bad/{n}", "structured", p, cmpl(**kw)) for n, kw in STRUCTURED_BAD]
    return cases


def chat_cases() -> list[dict]:
    p = "/v1/chat/completions"
    cases = []
    for i, text in enumerate(PROMPTS[:6]):
        for mt in (3, 20):
            cases.append(_case(f"chat/greedy/p{i}/mt{mt}", "valid", p,
                               chat(messages=[{"role": "user", "content": text}], max_tokens=mt)))
    cases += [_case(f"chat/{n}", "valid", p, chat(**kw)) for n, kw in COMMON_VALID]
    sys_user = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    cases += [
        _case("chat/system_user", "valid", p, chat(messages=sys_user)),
        _case("chat/developer", "valid", p, chat(messages=[{"role": "developer", "content": "x"},
                                                           {"role": "user", "content": "y"}])),
        _case("chat/multi_turn", "valid", p, chat(messages=sys_user + [{"role": "assistant", "content": "Hi."},
                                                                       {"role": "user", "content": "More"}])),
        _case("chat/text_parts", "valid", p, chat(messages=[{"role": "user", "content": [
            {"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}])),
        _case("chat/text_part_single", "valid", p, chat(messages=[{"role": "user", "content": [
            {"type": "text", "text": "only"}]}])),
        _case("chat/custom_role", "valid", p, chat(messages=[{"role": "narrator", "content": "Once"}])),
        _case("chat/name_field", "valid", p, chat(messages=[{"role": "user", "name": "bob", "content": "hi"}])),
        _case("chat/empty_content", "valid", p, chat(messages=[{"role": "user", "content": ""}])),
        _case("chat/null_content_assistant", "valid", p, chat(messages=[
            {"role": "user", "content": "a"}, {"role": "assistant", "content": None},
            {"role": "user", "content": "b"}])),
        _case("chat/add_generation_prompt_false", "valid", p, chat(add_generation_prompt=False)),
        _case("chat/continue_final_message", "valid", p, chat(
            messages=[{"role": "user", "content": "Say"}, {"role": "assistant", "content": "Well"}],
            continue_final_message=True, add_generation_prompt=False)),
        _case("chat/echo", "valid", p, chat(echo=True)),
        _case("chat/echo_continue", "valid", p, chat(
            messages=[{"role": "user", "content": "Say"}, {"role": "assistant", "content": "Well"}],
            continue_final_message=True, add_generation_prompt=False, echo=True)),
        _case("chat/max_completion_tokens", "valid", p, chat(max_completion_tokens=4, max_tokens=None)),
        _case("chat/max_completion_tokens_both", "valid", p, chat(max_completion_tokens=3, max_tokens=10)),
        _case("chat/logprobs", "valid", p, chat(logprobs=True)),
        _case("chat/logprobs_top0", "valid", p, chat(logprobs=True, top_logprobs=0)),
        _case("chat/logprobs_top3", "valid", p, chat(logprobs=True, top_logprobs=3)),
        _case("chat/logprobs_top20", "valid", p, chat(logprobs=True, top_logprobs=20, max_tokens=2)),
        _case("chat/logprobs_false_top0", "valid", p, chat(logprobs=False, top_logprobs=0)),
        _case("chat/n2_logprobs", "valid", p, chat(n=2, logprobs=True, top_logprobs=1)),
        _case("chat/chat_template", "valid", p, chat(chat_template="{% for m in messages %}{{ m['content'] }}"
                                                                   "{% endfor %}")),
        _case("chat/chat_template_kwargs", "valid", p, chat(chat_template_kwargs={"foo": 1})),
        _case("chat/tools_none", "valid", p, chat(tools=[{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": {}}}}], tool_choice="none")),
        _case("chat/tool_choice_none_no_tools", "valid", p, chat(tool_choice="none")),
        _case("chat/parallel_tool_calls", "valid", p, chat(parallel_tool_calls=False)),
        _case("chat/include_reasoning", "valid", p, chat(include_reasoning=False)),
        _case("chat/return_prompt_text", "valid", p, chat(return_prompt_text=True)),
        _case("chat/documents", "valid", p, chat(documents=[{"title": "a", "text": "b"}])),
        _case("chat/tool_message", "valid", p, chat(messages=[{"role": "user", "content": "a"},
                                                              {"role": "tool", "content": "42",
                                                               "tool_call_id": "c1"}])),
    ]
    cases += [_case(f"chat/bad/{n}", "bad_input", p, chat(**kw)) for n, kw in COMMON_BAD]
    cases += [
        _case("chat/bad/messages_empty", "bad_input", p, chat(messages=[])),
        _case("chat/bad/messages_missing", "bad_input", p, {"model": MODEL}),
        _case("chat/bad/messages_not_list", "bad_input", p, chat(messages="hi")),
        _case("chat/bad/message_no_role", "bad_input", p, chat(messages=[{"content": "hi"}])),
        _case("chat/bad/image_part", "bad_input", p, chat(messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}])),
        _case("chat/bad/unknown_part", "bad_input", p, chat(messages=[{"role": "user", "content": [
            {"type": "video", "x": 1}]}])),
        _case("chat/bad/top_logprobs_21", "bad_input", p, chat(logprobs=True, top_logprobs=21)),
        _case("chat/bad/top_logprobs_neg", "bad_input", p, chat(logprobs=True, top_logprobs=-1)),
        _case("chat/bad/top_logprobs_without_logprobs", "bad_input", p, chat(top_logprobs=2)),
        _case("chat/bad/max_completion_tokens_neg", "bad_input", p, chat(max_completion_tokens=-3)),
        _case("chat/bad/continue_and_generation_prompt", "bad_input", p, chat(
            messages=[{"role": "user", "content": "Say"}, {"role": "assistant", "content": "Well"}],
            continue_final_message=True, add_generation_prompt=True)),
        _case("chat/bad/tool_choice_auto", "bad_input", p, chat(tools=[{"type": "function", "function": {
            "name": "f"}}], tool_choice="auto")),
        _case("chat/bad/tool_choice_required_no_tools", "bad_input", p, chat(tool_choice="required")),
        _case("chat/bad/prompt_too_long", "bad_input", p, chat(messages=[{"role": "user", "content": "a " * 400}])),
        _case("chat/bad/content_int", "bad_input", p, chat(messages=[{"role": "user", "content": 5}])),
        _case("chat/bad/invalid_json", "bad_input", p, raw="{", headers={"Content-Type": "application/json"}),
        _case("chat/bad/chat_template_broken", "bad_input", p, chat(chat_template="{% for %}")),
    ]
    cases += [_case(f"chat/{n}", "structured", p, chat(**kw)) for n, kw in STRUCTURED]
    cases += [_case(f"chat/bad/{n}", "structured", p, chat(**kw)) for n, kw in STRUCTURED_BAD]
    return cases


STREAMED = [
    ("plain", {}), ("usage", {"stream_options": {"include_usage": True}}),
    ("usage_false", {"stream_options": {"include_usage": False}}),
    ("continuous_usage", {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}),
    ("continuous_usage_only", {"stream_options": {"continuous_usage_stats": True}}),
    ("n2", {"n": 2, "seed": 5, "temperature": 1.0, "stream_options": {"include_usage": True}}),
    ("stop", {"stop": ["e"], "max_tokens": 20}), ("stop_incl", {"stop": ["e"], "include_stop_str_in_output": True}),
    ("max_tokens_1", {"max_tokens": 1}), ("long", {"max_tokens": 40}),
    ("penalties", {"presence_penalty": 0.5, "repetition_penalty": 1.2}),
    ("return_token_ids", {"return_token_ids": True}), ("seeded", {"seed": 42, "temperature": 0.9}),
    ("structured_choice", {"structured_outputs": {"choice": ["yes", "no"]}}),
    ("structured_json", {"response_format": {"type": "json_object"}, "max_tokens": 10}),
    ("min_tokens", {"min_tokens": 5, "max_tokens": 5}), ("ignore_eos", {"ignore_eos": True, "max_tokens": 10}),
    ("bad_temperature", {"temperature": -2}), ("bad_max_tokens", {"max_tokens": 999}),
]


def streamed_cases() -> list[dict]:
    cases = []
    for n, kw in STREAMED:
        cases.append(_case(f"cmpl/stream/{n}", "streamed", "/v1/completions", cmpl(stream=True, **kw)))
        cases.append(_case(f"chat/stream/{n}", "streamed", "/v1/chat/completions", chat(stream=True, **kw)))
    p = "/v1/completions"
    cases += [
        _case("cmpl/stream/logprobs", "streamed", p, cmpl(stream=True, logprobs=2)),
        _case("cmpl/stream/logprobs_0", "streamed", p, cmpl(stream=True, logprobs=0)),
        _case("cmpl/stream/echo", "streamed", p, cmpl(stream=True, echo=True)),
        _case("cmpl/stream/echo_logprobs", "streamed", p, cmpl(stream=True, echo=True, logprobs=1)),
        _case("cmpl/stream/prompt_list", "streamed", p, cmpl(stream=True, prompt=["A", "B"],
                                                             stream_options={"include_usage": True})),
        _case("cmpl/stream/max_tokens_null", "streamed", p, cmpl(stream=True, max_tokens=None)),
        _case("cmpl/stream/bad_prompt_empty", "streamed", p, cmpl(stream=True, prompt="")),
    ]
    p = "/v1/chat/completions"
    cases += [
        _case("chat/stream/logprobs", "streamed", p, chat(stream=True, logprobs=True, top_logprobs=2)),
        _case("chat/stream/continue_final", "streamed", p, chat(
            stream=True, messages=[{"role": "user", "content": "Say"}, {"role": "assistant", "content": "Well"}],
            continue_final_message=True, add_generation_prompt=False)),
        _case("chat/stream/echo", "streamed", p, chat(stream=True, echo=True)),
        _case("chat/stream/custom_role", "streamed", p, chat(stream=True, messages=[
            {"role": "narrator", "content": "Once"}])),
    ]
    return cases


def route_cases() -> list[dict]:
    tk, dt = "/tokenize", "/detokenize"
    return [
        _case("route/health", "routes", "/health", method="GET"),
        _case("route/version", "routes", "/version", method="GET"),
        _case("route/models", "routes", "/v1/models", method="GET"),
        _case("route/ping_get", "routes", "/ping", method="GET"),
        _case("route/load", "routes", "/load", method="GET"),
        _case("route/unknown_get", "routes", "/no/such/route", method="GET"),
        _case("route/unknown_post", "routes", "/v1/nothing", {"a": 1}),
        _case("route/completions_get", "routes", "/v1/completions", method="GET"),
        _case("route/chat_get", "routes", "/v1/chat/completions", method="GET"),
        _case("route/models_post", "routes", "/v1/models", {}),
        _case("route/model_by_id", "routes", f"/v1/models/{MODEL}", method="GET"),
        _case("route/embeddings", "routes", "/v1/embeddings", {"model": MODEL, "input": "hi"}),
        _case("route/health_post", "routes", "/health", {}),
        _case("route/tokenize", "routes", tk, {"model": MODEL, "prompt": "ROMEO: hi"}),
        _case("route/tokenize_no_special", "routes", tk, {"model": MODEL, "prompt": "ROMEO", "add_special_tokens":
                                                          False}),
        _case("route/tokenize_return_strs", "routes", tk, {"model": MODEL, "prompt": "hi there",
                                                           "return_token_strs": True}),
        _case("route/tokenize_no_model", "routes", tk, {"prompt": "abc"}),
        _case("route/tokenize_empty", "routes", tk, {"model": MODEL, "prompt": ""}),
        _case("route/tokenize_messages", "routes", tk, {"model": MODEL, "messages": [{"role": "user",
                                                                                       "content": "hi"}]}),
        _case("route/tokenize_messages_no_gen", "routes", tk, {
            "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": False}),
        _case("route/tokenize_wrong_model", "routes", tk, {"model": "nope", "prompt": "x"}),
        _case("route/tokenize_both", "routes", tk, {"model": MODEL, "prompt": "x",
                                                    "messages": [{"role": "user", "content": "y"}]}),
        _case("route/tokenize_neither", "routes", tk, {"model": MODEL}),
        _case("route/tokenize_too_long", "routes", tk, {"model": MODEL, "prompt": "a " * 400}),
        _case("route/detokenize", "routes", dt, {"model": MODEL, "tokens": [20, 30, 40]}),
        _case("route/detokenize_empty", "routes", dt, {"model": MODEL, "tokens": []}),
        _case("route/detokenize_special", "routes", dt, {"model": MODEL, "tokens": [1, 20, 2]}),
        _case("route/detokenize_oov", "routes", dt, {"model": MODEL, "tokens": [10 ** 6]}),
        _case("route/detokenize_neg", "routes", dt, {"model": MODEL, "tokens": [-1]}),
        _case("route/detokenize_missing", "routes", dt, {"model": MODEL}),
        _case("route/detokenize_str", "routes", dt, {"model": MODEL, "tokens": "abc"}),
        _case("route/detokenize_wrong_model", "routes", dt, {"model": "nope", "tokens": [5]}),
    ]


def auth_cases() -> list[dict]:
    body = cmpl(max_tokens=2)
    none = {"Authorization": ""}
    return [
        _case("auth/no_key", "auth", "/v1/completions", body, headers=none),
        _case("auth/wrong_key", "auth", "/v1/completions", body, headers={"Authorization": "Bearer wrong"}),
        _case("auth/no_bearer", "auth", "/v1/completions", body, headers={"Authorization": API_KEY}),
        _case("auth/lowercase_bearer", "auth", "/v1/completions", body, headers={"Authorization": f"bearer {API_KEY}"}),
        _case("auth/chat_no_key", "auth", "/v1/chat/completions", chat(max_tokens=2), headers=none),
        _case("auth/models_no_key", "auth", "/v1/models", method="GET", headers=none),
        _case("auth/models_wrong_key", "auth", "/v1/models", method="GET", headers={"Authorization": "Bearer x"}),
        _case("auth/health_no_key", "auth", "/health", method="GET", headers=none),
        _case("auth/version_no_key", "auth", "/version", method="GET", headers=none),
        _case("auth/metrics_no_key", "auth", "/metrics", method="GET", headers=none),
        _case("auth/tokenize_no_key", "auth", "/tokenize", {"model": MODEL, "prompt": "x"}, headers=none),
        _case("auth/detokenize_no_key", "auth", "/detokenize", {"model": MODEL, "tokens": [5]}, headers=none),
        _case("auth/unknown_no_key", "auth", "/v1/nothing", method="GET", headers=none),
        _case("auth/stream_no_key", "auth", "/v1/completions", cmpl(stream=True), headers=none),
    ]


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string", "enum": ["Verona", "Mantua"]}},
                                               "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"]}}}
NO_PARAMS = {"type": "function", "function": {"name": "ping"}}
TOOLS = [WEATHER, CLOCK]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
# The model emits a pythonic call list only when made to: a regex constraint with tool_choice "auto".
# "required" lets the model append calls until max_tokens; a bias on "]" (ids 64 and 358 of the shipped
# tokenizer) closes the array as soon as the grammar allows, after the first call.
CLOSE_ARRAY = {"logit_bias": {"64": 100, "358": 100}, "max_tokens": 80}
PYTHONIC_ONE = {"structured_outputs": {"regex": r'\[get_weather\(city="(Verona|Mantua)"\)\]'}}
PYTHONIC_TWO = {"structured_outputs": {"regex": r'\[get_weather\(city="Verona"\), get_time\(tz="(UTC|CET)"\)\]'}}


def tool_cases() -> list[dict]:
    """tools / tool_choice (vLLM's ChatCompletionRequest.check_tool_usage, ToolParser.adjust_request, the
    chat serving's tool-call messages): on a server with the pythonic parser and auto tool choice, and the
    400s of a server without them."""
    p = "/v1/chat/completions"

    def tc(name, body, **kw):
        return _case(f"chat/tools/{name}", "tools", p, chat(**body), server="tools", **kw)

    cases = [
        tc("named", {"tools": TOOLS, "tool_choice": NAMED, "max_tokens": 30}),
        tc("named_stream", {"tools": TOOLS, "tool_choice": NAMED, "max_tokens": 30, "stream": True}),
        tc("named_no_params", {"tools": [NO_PARAMS], "tool_choice": {"type": "function", "function": {
            "name": "ping"}}, "max_tokens": 20}),
        tc("named_n2_seeded", {"tools": TOOLS, "tool_choice": NAMED, "max_tokens": 30, "n": 2, "seed": 3,
                               "temperature": 1.0}),
        tc("named_logprobs", {"tools": TOOLS, "tool_choice": NAMED, "max_tokens": 30, "logprobs": True,
                              "top_logprobs": 2}),
        tc("named_max_tokens_short", {"tools": TOOLS, "tool_choice": NAMED, "max_tokens": 3}),
        tc("named_overrides_response_format", {"tools": TOOLS, "tool_choice": NAMED, "max_tokens": 30,
                                               "response_format": {"type": "json_object"}}),
        tc("required", {"tools": TOOLS, "tool_choice": "required", "max_tokens": 60}),
        tc("required_stream", {"tools": TOOLS, "tool_choice": "required", "max_tokens": 60, "stream": True}),
        tc("required_one_tool", {"tools": [CLOCK], "tool_choice": "required", "max_tokens": 60}),
        tc("required_parallel_false", {"tools": TOOLS, "tool_choice": "required", "max_tokens": 60,
                                       "parallel_tool_calls": False}),
        tc("required_short", {"tools": TOOLS, "tool_choice": "required", "max_tokens": 4}),
        tc("required_closed", {"tools": TOOLS, "tool_choice": "required"} | CLOSE_ARRAY),
        tc("required_closed_stream", {"tools": TOOLS, "tool_choice": "required", "stream": True} | CLOSE_ARRAY),
        tc("required_closed_parallel_false", {"tools": TOOLS, "tool_choice": "required",
                                              "parallel_tool_calls": False} | CLOSE_ARRAY),
        tc("auto_pythonic_two_stream", {"tools": TOOLS, "tool_choice": "auto", "max_tokens": 40, "stream": True,
                                        "parallel_tool_calls": False} | PYTHONIC_TWO),
        tc("auto_plain", {"tools": TOOLS, "tool_choice": "auto"}),
        tc("auto_default", {"tools": TOOLS}),
        tc("auto_plain_stream", {"tools": TOOLS, "tool_choice": "auto", "stream": True}),
        tc("auto_pythonic", {"tools": TOOLS, "tool_choice": "auto", "max_tokens": 20} | PYTHONIC_ONE),
        tc("auto_pythonic_two", {"tools": TOOLS, "tool_choice": "auto", "max_tokens": 40} | PYTHONIC_TWO),
        tc("auto_pythonic_two_parallel_false", {"tools": TOOLS, "tool_choice": "auto", "max_tokens": 40,
                                                "parallel_tool_calls": False} | PYTHONIC_TWO),
        tc("auto_pythonic_stream", {"tools": TOOLS, "tool_choice": "auto", "max_tokens": 20, "stream": True}
           | PYTHONIC_ONE),
        tc("none_with_tools", {"tools": TOOLS, "tool_choice": "none"}),
        tc("no_tools", {}),
        tc("tool_message_history", {"tools": TOOLS, "tool_choice": "none", "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "get_weather", "arguments": '{"city": "Verona"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]}),
        tc("bad_unknown_name", {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "fly"}}}),
        tc("bad_named_and_structured", {"tools": TOOLS, "tool_choice": NAMED,
                                        "structured_outputs": {"choice": ["a", "b"]}}),
        tc("bad_tools_empty", {"tools": [], "tool_choice": "auto"}),
        tc("bad_tool_choice_str", {"tools": TOOLS, "tool_choice": "always"}),
        tc("bad_tool_choice_no_function", {"tools": TOOLS, "tool_choice": {"type": "function"}}),
        tc("bad_tool_choice_no_name", {"tools": TOOLS, "tool_choice": {"type": "function", "function": {}}}),
        tc("bad_tool_choice_empty_name", {"tools": TOOLS, "tool_choice": {"type": "function", "function": {
            "name": ""}}}),
        tc("bad_tool_no_function", {"tools": [{"type": "function"}], "tool_choice": "auto"}),
        tc("bad_tool_type", {"tools": [{"type": "retrieval", "function": {"name": "f"}}], "tool_choice": "none"}),
        tc("bad_required_without_tools", {"tool_choice": "required"}),
    ]
    d = "/v1/chat/completions"
    cases += [
        _case("chat/bad/tools_no_parser_named", "tools", d, chat(tools=TOOLS, tool_choice=NAMED)),
        _case("chat/bad/tools_no_parser_required", "tools", d, chat(tools=TOOLS, tool_choice="required")),
        _case("chat/bad/tools_no_parser_default_auto", "tools", d, chat(tools=TOOLS)),
        _case("chat/bad/tools_no_parser_unknown_name", "tools", d, chat(tools=TOOLS, tool_choice={
            "type": "function", "function": {"name": "nope"}})),
    ]
    return cases


def round2_cases() -> list[dict]:
    """Issue #55's classes: the sampling fields that were ignored, error params, content types, CORS and the
    routes vLLM's api_server adds (each at a valid, a boundary and an invalid value)."""
    c, ch = "/v1/completions", "/v1/chat/completions"
    long_prompt = list(range(5, 5 + MAX_MODEL_LEN))
    cases = [
        # logprob_token_ids: needs logprobs; with it, minivllm refuses (deliberate) rather than answer top-k
        _case("cmpl/bad/logprob_token_ids_no_logprobs", "bad_input", c, cmpl(logprob_token_ids=[5, 6])),
        _case("chat/bad/logprob_token_ids_no_logprobs", "bad_input", ch, chat(logprob_token_ids=[5, 6])),
        _case("cmpl/bad/logprob_token_ids_echo_max0", "bad_input", c, cmpl(logprob_token_ids=[5], logprobs=1,
                                                                           echo=True, max_tokens=0)),
        _case("cmpl/logprob_token_ids", "valid", c, cmpl(logprob_token_ids=[5, 6], logprobs=1)),
        _case("chat/logprob_token_ids", "valid", ch, chat(logprob_token_ids=[5, 6], logprobs=True)),
        _case("cmpl/logprob_token_ids_empty", "valid", c, cmpl(logprob_token_ids=[], logprobs=1)),
        # truncation_side
        _case("cmpl/truncation_side_right", "valid", c, cmpl(prompt=[20, 30, 40, 50, 60], truncate_prompt_tokens=2,
                                                              truncation_side="right")),
        _case("cmpl/truncation_side_left", "valid", c, cmpl(prompt=[20, 30, 40, 50, 60], truncate_prompt_tokens=2,
                                                             truncation_side="left")),
        _case("chat/truncation_side_right", "valid", ch, chat(truncate_prompt_tokens=3, truncation_side="right")),
        _case("cmpl/truncation_side_alone", "valid", c, cmpl(truncation_side="right")),
        _case("cmpl/bad/truncation_side_middle", "bad_input", c, cmpl(truncation_side="middle")),
        # return_tokens_as_token_ids with logprobs
        _case("cmpl/token_ids_as_tokens_logprobs", "valid", c, cmpl(return_tokens_as_token_ids=True, logprobs=2)),
        _case("cmpl/token_ids_as_tokens_echo", "valid", c, cmpl(return_tokens_as_token_ids=True, logprobs=1,
                                                                 echo=True)),
        _case("chat/token_ids_as_tokens_logprobs", "valid", ch, chat(return_tokens_as_token_ids=True, logprobs=True,
                                                                      top_logprobs=2)),
        # one token: a stream's offsets over "token_id:N" texts depend on how tokens are grouped into chunks,
        # which load decides on either side
        _case("cmpl/stream/token_ids_as_tokens", "streamed", c, cmpl(stream=True, return_tokens_as_token_ids=True,
                                                                      logprobs=1, max_tokens=1)),
        _case("chat/stream/token_ids_as_tokens", "streamed", ch, chat(stream=True, return_tokens_as_token_ids=True,
                                                                       logprobs=True, top_logprobs=1)),
        _case("chat/token_ids_as_tokens_false", "valid", ch, chat(return_tokens_as_token_ids=False, logprobs=True)),
        # prompt_logprobs while streaming
        _case("cmpl/stream/bad_prompt_logprobs", "streamed", c, cmpl(stream=True, prompt_logprobs=1)),
        _case("cmpl/stream/bad_prompt_logprobs_all", "streamed", c, cmpl(stream=True, prompt_logprobs=-1)),
        _case("chat/stream/bad_prompt_logprobs", "streamed", ch, chat(stream=True, prompt_logprobs=2)),
        _case("cmpl/stream/prompt_logprobs_0", "streamed", c, cmpl(stream=True, prompt_logprobs=0)),
        # priority at and beyond int64
        _case("cmpl/bad/priority_huge", "bad_input", c, cmpl(priority=10 ** 30)),
        _case("cmpl/bad/priority_2_63", "bad_input", c, cmpl(priority=2 ** 63)),
        _case("chat/bad/priority_below_int64", "bad_input", ch, chat(priority=-(2 ** 63) - 1)),
        _case("chat/bad/priority_str", "bad_input", ch, chat(priority="high")),
        _case("cmpl/bad/priority_int64_max", "bad_input", c, cmpl(priority=2 ** 63 - 1)),
        # prompts with bad token ids or mixed types
        _case("cmpl/bad/prompt_neg_token_second", "bad_input", c, cmpl(prompt=[5, -1])),
        _case("cmpl/bad/prompt_mixed", "bad_input", c, cmpl(prompt=["To be", 5])),
        _case("cmpl/bad/prompt_list_empty_str", "bad_input", c, cmpl(prompt=["To be", ""])),
        _case("cmpl/bad/prompt_nested_neg", "bad_input", c, cmpl(prompt=[[5, 6], [7, -2]])),
        _case("cmpl/bad/echo_max0_full_context", "bad_input", c, cmpl(prompt=long_prompt, echo=True, max_tokens=0)),
        _case("cmpl/echo_max0_near_full", "valid", c, cmpl(prompt=long_prompt[:-1], echo=True, max_tokens=0)),
        # stop_token_ids outside the vocabulary
        _case("cmpl/stop_token_ids_neg", "valid", c, cmpl(stop_token_ids=[-1])),
        _case("chat/stop_token_ids_oov", "valid", ch, chat(stop_token_ids=[10 ** 6])),
        # NaN / Infinity (Python's json accepts them)
        _case("cmpl/bad/temperature_nan", "bad_input", c, raw='{"prompt": "a", "max_tokens": 2, "temperature": NaN}',
              headers={"Content-Type": "application/json"}),
        _case("cmpl/bad/top_p_infinity", "bad_input", c, raw='{"prompt": "a", "max_tokens": 2, "top_p": Infinity}',
              headers={"Content-Type": "application/json"}),
        # content types other than JSON
        _case("cmpl/bad/content_type_text", "bad_input", c, raw=json.dumps(cmpl()),
              headers={"Content-Type": "text/plain"}),
        _case("cmpl/bad/content_type_form", "bad_input", c, raw="prompt=hi&max_tokens=2",
              headers={"Content-Type": "application/x-www-form-urlencoded"}),
        _case("chat/bad/content_type_none", "bad_input", ch, raw=json.dumps(chat()), headers={"Content-Type": ""}),
        _case("cmpl/content_type_json_charset", "valid", c, raw=json.dumps(cmpl()),
              headers={"Content-Type": "application/json; charset=utf-8"}),
        # chat content of the wrong type
        _case("chat/bad/content_dict", "bad_input", ch, chat(messages=[{"role": "user", "content": {"a": 1}}])),
        _case("chat/bad/content_list_of_str", "bad_input", ch, chat(messages=[{"role": "user", "content": ["a"]}])),
        # cache_salt, spaces_between_special_tokens, echo + logprobs boundaries
        _case("cmpl/bad/cache_salt_empty", "bad_input", c, cmpl(cache_salt="")),
        _case("chat/bad/cache_salt_int", "bad_input", ch, chat(cache_salt=5)),
        _case("cmpl/bad/truncate_prompt_tokens_neg2", "bad_input", c, cmpl(truncate_prompt_tokens=-2)),
        _case("cmpl/truncate_prompt_tokens_minus1", "valid", c, cmpl(truncate_prompt_tokens=-1)),
        _case("chat/bad/top_logprobs_str", "bad_input", ch, chat(logprobs=True, top_logprobs="two")),
        _case("cmpl/bad/prompt_logprobs_str", "bad_input", c, cmpl(prompt_logprobs="x")),
        _case("chat/bad/stream_options_bad_type", "bad_input", ch, chat(stream=True, stream_options={
            "include_usage": "maybe"})),
        _case("chat/bad/response_format_json_schema_none", "bad_input", ch, chat(response_format={
            "type": "json_schema", "json_schema": None})),
        _case("cmpl/bad/structured_outputs_not_dict", "bad_input", c, cmpl(structured_outputs="json")),
        # the remaining request fields of the pinned vLLM's two models, valid and not
        _case("chat/return_token_offsets", "valid", ch, chat(return_token_offsets=True)),
        _case("cmpl/kv_transfer_params_null", "valid", c, cmpl(kv_transfer_params=None)),
        _case("cmpl/bad/kv_transfer_params_str", "bad_input", c, cmpl(kv_transfer_params="x")),
        _case("chat/ec_transfer_params_null", "valid", ch, chat(ec_transfer_params=None)),
        _case("cmpl/repetition_detection_null", "valid", c, cmpl(repetition_detection=None)),
        _case("chat/bad/repetition_detection_str", "bad_input", ch, chat(repetition_detection="x")),
        _case("cmpl/thinking_token_budget_null", "valid", c, cmpl(thinking_token_budget=None)),
        _case("chat/bad/thinking_token_budget_str", "bad_input", ch, chat(thinking_token_budget="x")),
        _case("chat/reasoning_effort_low", "valid", ch, chat(reasoning_effort="low")),
        _case("chat/bad/reasoning_effort_bogus", "bad_input", ch, chat(reasoning_effort="extreme")),
        _case("chat/media_io_kwargs", "valid", ch, chat(media_io_kwargs={})),
        _case("chat/mm_processor_kwargs", "valid", ch, chat(mm_processor_kwargs={})),
        _case("chat/bad/mm_processor_kwargs_list", "bad_input", ch, chat(mm_processor_kwargs=[1])),
        _case("chat/return_assistant_tokens_mask_false", "valid", ch, chat(return_assistant_tokens_mask=False)),
    ]
    return cases


def route2_cases() -> list[dict]:
    """Routes beyond the first round: the batch chat route, CORS preflight and headers, /tokenize options."""
    tk, b = "/tokenize", "/v1/chat/completions/batch"
    origin = {"Origin": "http://example.com"}
    preflight = origin | {"Access-Control-Request-Method": "POST",
                          "Access-Control-Request-Headers": "authorization,content-type"}
    convo = [{"role": "user", "content": "Hello"}]
    return [
        _case("route/chat_batch", "routes", b, {"model": MODEL, "messages": [convo, [{"role": "user", "content":
                                                                                       "Speak"}]], "max_tokens": 4,
                                                 "temperature": 0}),
        _case("route/chat_batch_one", "routes", b, {"model": MODEL, "messages": [convo], "max_tokens": 3,
                                                     "temperature": 0}),
        _case("route/chat_batch_flat", "routes", b, {"model": MODEL, "messages": convo, "max_tokens": 3}),
        _case("route/chat_batch_stream", "routes", b, {"model": MODEL, "messages": [convo], "max_tokens": 3,
                                                        "stream": True}),
        _case("route/chat_batch_empty", "routes", b, {"model": MODEL, "messages": [], "max_tokens": 3}),
        _case("route/chat_batch_get", "routes", b, method="GET"),
        _case("route/cors_preflight", "routes", "/v1/chat/completions", method="OPTIONS", headers=preflight),
        _case("route/cors_preflight_completions", "routes", "/v1/completions", method="OPTIONS", headers=preflight),
        _case("route/cors_preflight_no_key", "routes", "/v1/models", method="OPTIONS",
              headers=preflight | {"Authorization": ""}),
        _case("route/cors_simple_get", "routes", "/load", method="GET", headers=origin),
        _case("route/cors_post", "routes", "/v1/completions", cmpl(max_tokens=2), headers=origin),
        _case("route/cors_unauthorized", "routes", "/v1/models", method="GET", headers=origin | {
            "Authorization": "Bearer wrong"}),
        _case("route/options_no_origin", "routes", "/v1/models", method="OPTIONS"),
        _case("route/tokenize_continue_final", "routes", tk, {"model": MODEL, "messages": [
            {"role": "user", "content": "Say"}, {"role": "assistant", "content": "Well"}],
            "continue_final_message": True, "add_generation_prompt": False}),
        _case("route/tokenize_continue_and_gen", "routes", tk, {"model": MODEL, "messages": [
            {"role": "user", "content": "Say"}, {"role": "assistant", "content": "Well"}],
            "continue_final_message": True, "add_generation_prompt": True}),
        _case("route/tokenize_add_special_chat", "routes", tk, {"model": MODEL, "messages": convo,
                                                                 "add_special_tokens": True}),
        _case("route/tokenize_chat_template_kwargs", "routes", tk, {"model": MODEL, "messages": convo,
                                                                     "chat_template_kwargs": {"x": 1}}),
        _case("route/tokenize_tools", "routes", tk, {"model": MODEL, "messages": convo, "tools": [WEATHER]}),
        _case("route/detokenize_token_id_max", "routes", "/detokenize", {"model": MODEL, "tokens": [4095]}),
        _case("route/version_post", "routes", "/version", {}),
        _case("route/metrics_post", "routes", "/metrics", {}),
        _case("route/ping_post", "routes", "/ping", {}),
        _case("route/load_post", "routes", "/load", {}),
        _case("route/responses", "routes", "/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 3}),
        _case("route/score", "routes", "/score", {"model": MODEL, "text_1": "a", "text_2": "b"}),
        _case("route/invocations", "routes", "/invocations", cmpl(max_tokens=2)),
        _case("route/models_trailing_slash", "routes", "/v1/models/", method="GET"),
    ]


def route3_cases() -> list[dict]:
    """The rest of the routes a generative model's `vllm serve` has (listed from its app): render and tokens-in /
    tokens-out (scale_out), Anthropic's Messages API, stored responses, elastic EP, the OpenAPI pages; each at a
    valid, a boundary and an invalid value."""
    rc, rch, gen, msg, cnt = ("/v1/completions/render", "/v1/chat/completions/render", "/inference/v1/generate",
                              "/v1/messages", "/v1/messages/count_tokens")
    dc, dch, gs = "/v1/completions/derender", "/v1/chat/completions/derender", "/generative_scoring"
    ids = [1, 413, 308, 530, 327]
    greedy = {"max_tokens": 4, "temperature": 0}
    convo = [{"role": "user", "content": "Speak, friend."}]
    am = {"model": MODEL, "max_tokens": 6, "temperature": 0, "messages": convo}
    weather_tool = {"name": "get_weather", "description": "Weather in a city",
                    "input_schema": WEATHER["function"]["parameters"]}

    def r3(name, path, body=None, **kw):
        return _case(f"route3/{name}", "routes", path, body, **kw)

    return [
        # render: the engine's input, nothing generated
        r3("render_cmpl", rc, {"model": MODEL, "prompt": "ROMEO:"}),
        r3("render_cmpl_params", rc, cmpl(prompt=["To be", "or not"], seed=3, stop=["x"],
                                          top_k=5, presence_penalty=0.5, stream=True)),
        r3("render_cmpl_ids", rc, {"model": MODEL, "prompt": ids, "max_tokens": 250}),
        r3("render_cmpl_too_long", rc, {"model": MODEL, "prompt": ids, "max_tokens": 252}),
        r3("render_cmpl_max_over", rc, {"model": MODEL, "prompt": "x", "max_tokens": 1000}),
        r3("render_cmpl_bad_model", rc, {"model": "nope", "prompt": "x"}),
        r3("render_cmpl_no_prompt", rc, {"model": MODEL}),
        r3("render_chat", rch, {"model": MODEL, "messages": convo}),
        r3("render_chat_params", rch, chat(max_completion_tokens=7, top_p=0.5, n=2, stop=["x"],
                                           logprobs=True, top_logprobs=2)),
        r3("render_chat_continue", rch, {"model": MODEL, "messages": convo + [{"role": "assistant", "content": "Well"}],
                                         "continue_final_message": True, "add_generation_prompt": False}),
        r3("render_chat_empty", rch, {"model": MODEL, "messages": []}),
        r3("render_chat_bad_role_type", rch, {"model": MODEL, "messages": [{"role": 5, "content": "Hi"}]}),
        # tokens in, tokens out
        r3("generate", gen, {"token_ids": ids, "sampling_params": greedy}),
        r3("generate_model", gen, {"model": MODEL, "token_ids": ids, "sampling_params": greedy}),
        r3("generate_request_id", gen, {"request_id": "abc", "token_ids": ids, "sampling_params": greedy}),
        r3("generate_logprobs", gen, {"token_ids": ids, "sampling_params": greedy | {"logprobs": 2}}),
        r3("generate_prompt_logprobs", gen, {"token_ids": ids, "sampling_params": greedy | {"prompt_logprobs": 1}}),
        r3("generate_seeded", gen, {"token_ids": ids, "sampling_params": {
            "max_tokens": 5, "temperature": 1.0, "seed": 11, "top_k": 20}}),
        r3("generate_n2_seeded", gen, {"token_ids": ids, "sampling_params": {
            "max_tokens": 3, "temperature": 1.0, "seed": 5, "n": 2}}),
        r3("generate_stop", gen, {"token_ids": ids, "sampling_params": greedy | {
            "max_tokens": 30, "stop_token_ids": [202]}}),
        r3("generate_vllm_only_fields", gen, {"token_ids": ids, "sampling_params": greedy | {
            "detokenize": False, "skip_clone": True, "unknown_field": 1}}),
        r3("generate_to_context_end", gen, {"token_ids": [1] + [413] * 250, "sampling_params": {"temperature": 0}}),
        r3("generate_max_over", gen, {"token_ids": [1] + [413] * 250,
                                      "sampling_params": {"temperature": 0, "max_tokens": 300}}),
        r3("generate_stream", gen, {"token_ids": ids, "sampling_params": greedy, "stream": True}),
        r3("generate_stream_usage", gen, {"token_ids": ids, "sampling_params": greedy, "stream": True,
                                          "stream_options": {"include_usage": True, "continuous_usage_stats": True}}),
        r3("generate_stream_logprobs", gen, {"token_ids": ids, "sampling_params": greedy | {
            "logprobs": 1}, "stream": True}),
        r3("generate_empty_ids", gen, {"token_ids": [], "sampling_params": greedy}),
        r3("generate_negative_id", gen, {"token_ids": [1, -1], "sampling_params": greedy}),
        r3("generate_oov_id", gen, {"token_ids": [1, 99999], "sampling_params": greedy}),
        r3("generate_no_params", gen, {"token_ids": ids}),
        r3("generate_bad_temperature", gen, {"token_ids": ids, "sampling_params": {"temperature": -1}}),
        r3("generate_max_tokens_0", gen, {"token_ids": ids, "sampling_params": {"max_tokens": 0}}),
        r3("generate_bad_model", gen, {"model": "nope", "token_ids": ids, "sampling_params": greedy}),
        r3("generate_prompt_too_long", gen, {"token_ids": [1] * 300, "sampling_params": greedy}),
        # Anthropic's Messages API
        r3("messages", msg, am),
        r3("messages_system_blocks", msg, am | {
            "system": [{"type": "text", "text": "x-anthropic-billing-header: 1"}, {"type": "text", "text": "Be brief."}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}),
        r3("messages_stop_sequence", msg, am | {"stop_sequences": ["\n"], "max_tokens": 20}),
        r3("messages_top_k_top_p", msg, am | {"temperature": 0.8, "top_k": 1, "top_p": 0.9}),
        r3("messages_multi_turn", msg, am | {"messages": convo + [
            {"role": "assistant", "content": "Well met."}, {"role": "user", "content": "Again."}]}),
        r3("messages_metadata", msg, am | {"metadata": {"user_id": "u1"}}),
        r3("messages_stream", msg, am | {"stream": True}),
        r3("messages_stream_stop", msg, am | {"stream": True, "stop_sequences": ["\n"], "max_tokens": 20}),
        r3("messages_tool_named", msg, am | {"max_tokens": 40, "tools": [weather_tool], "tool_choice": {
            "type": "tool", "name": "get_weather"}}, server="tools"),
        r3("messages_tool_none", msg, am | {"tools": [weather_tool], "tool_choice": {"type": "none"}}, server="tools"),
        r3("messages_tools_default_profile", msg, am | {"tools": [weather_tool]}),
        r3("messages_no_max_tokens", msg, {"model": MODEL, "messages": convo}),
        r3("messages_bad_role", msg, am | {"messages": [{"role": "bot", "content": "Hi"}]}),
        r3("messages_bad_block", msg, am | {"messages": [{"role": "user", "content": [{"type": "video"}]}]}),
        r3("messages_bad_model", msg, am | {"model": "nope"}),
        r3("messages_max_tokens_over", msg, am | {"max_tokens": 1000}),
        r3("messages_empty", msg, am | {"messages": []}),
        _case("route3/messages_no_key", "auth", msg, am, headers={"Authorization": ""}),
        r3("count_tokens", cnt, {"model": MODEL, "messages": convo}),
        r3("count_tokens_system", cnt, {"model": MODEL, "system": "Be brief.", "messages": convo}),
        r3("count_tokens_no_messages", cnt, {"model": MODEL}),
        r3("count_tokens_bad_model", cnt, {"model": "nope", "messages": convo}),
        # derender (generated ids back into an OpenAI answer) and generative scoring
        r3("derender_cmpl", dc, {"model": MODEL, "generate_responses": [
            {"request_id": "r", "choices": [{"index": 0, "finish_reason": "length", "token_ids": [413, 308]}]}]}),
        r3("derender_cmpl_missing", dc, {"model": MODEL}),
        r3("derender_chat", dch, {"model": MODEL, "generate_response": {
            "request_id": "r", "choices": [{"index": 0, "finish_reason": "stop", "token_ids": [413, 308]}]}}),
        r3("derender_chat_missing", dch, {"model": MODEL}),
        r3("derender_cmpl_two_logprobs", dc, {"model": MODEL, "prompt_tokens": [3, 4], "generate_responses": [
            {"request_id": "r", "choices": [{"index": 0, "finish_reason": "length", "token_ids": [413, 308],
                                             "logprobs": {"content": [
                                                 {"token": "token_id:413", "logprob": -1.5,
                                                  "top_logprobs": [{"token": "token_id:413", "logprob": -1.5}]},
                                                 {"token": "token_id:308", "logprob": -0.5, "top_logprobs": []}]}}]},
            {"request_id": "r2", "choices": [{"index": 0, "finish_reason": "stop", "token_ids": [530, 2]}]}]}),
        r3("derender_cmpl_prompt_tokens_mismatch", dc, {
            "model": MODEL, "prompt_tokens": [1, 2], "generate_responses": [
                {"request_id": "r", "choices": [{"index": 0, "token_ids": [413]}]}]}),
        r3("derender_cmpl_empty_ids", dc, {
            "model": MODEL, "generate_responses": [{"request_id": "r", "choices": [{"index": 0, "token_ids": []}]}]}),
        r3("derender_chat_special_tokens", dch, {
            "model": MODEL, "generate_response": {"request_id": "r", "choices": [
                {"index": 0, "finish_reason": "stop", "token_ids": [413, 308, 2]}]},
            "chat_request": {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                             "skip_special_tokens": False}}),
        r3("derender_cmpl_stream", dc, {
            "model": MODEL, "stream": True, "generate_chunk": {"request_id": "r", "choices": [
                {"index": 0, "token_ids": [413]}]}}),
        r3("derender_chat_stream", dch, {
            "model": MODEL, "stream": True, "generate_chunk": {"request_id": "r", "choices": [
                {"index": 0, "token_ids": [413]}]}}),
        # streamed derender: one generate chunk per call, the detokenizer's window carried by the client
        *[_case(f"route3/derender_{kind}_stream_{name}", "routes", f"/v1/{path}derender", {
            "model": MODEL, "stream": True} | body)
          for kind, path in (("cmpl", "completions/"), ("chat", "chat/completions/"))
          for name, body in (
              ("carried", {"stream_state": {"prev_tokens": ["To"], "prefix_offset": 0, "read_offset": 1},
                           "generate_chunk": {"request_id": "r", "choices": [
                               {"index": 0, "token_ids": [308, 530]}]}}),
              ("split_char", {"stream_state": {"prev_tokens": ["Ġbe", "Ã"], "prefix_offset": 0, "read_offset": 1},
                              "generate_chunk": {"request_id": "r", "choices": [{"index": 0, "token_ids": [106]}]}}),
              ("split_char_first", {"generate_chunk": {"request_id": "r", "choices": [
                  {"index": 0, "token_ids": [413, 131]}]}}),
              ("last_usage", {"prompt_tokens": 3, "stream_state": {"prev_tokens": ["Ġor"], "read_offset": 1,
                                                                    "role_sent": True},
                              "generate_chunk": {"request_id": "r", "usage": {"prompt_tokens": 5,
                                                                             "completion_tokens": 4},
                                                 "choices": [{"index": 0, "token_ids": [2],
                                                              "finish_reason": "stop"}]}}),
              ("usage_only", {"generate_chunk": {"request_id": "r", "choices": [],
                                                 "usage": {"prompt_tokens": 5, "completion_tokens": 4}}}),
              ("oov", {"generate_chunk": {"request_id": "r", "choices": [{"index": 0, "token_ids": [99999, 413]}]}}),
              ("two_choices", {"generate_chunk": {"request_id": "r", "choices": [
                  {"index": 0, "token_ids": [413]}, {"index": 1, "token_ids": [308]}]}}),
              ("state_too_long", {"stream_state": {"prev_tokens": ["To"] * 1025},
                                  "generate_chunk": {"request_id": "r", "choices": [{"index": 0, "token_ids": [308]}]}}),
              ("negative_offset", {"stream_state": {"prefix_offset": -1},
                                   "generate_chunk": {"request_id": "r", "choices": [{"index": 0, "token_ids": [308]}]}}),
              ("no_chunk", {}),
              ("bad_model", {"model": "nope", "generate_chunk": {"request_id": "r", "choices": []}}),
          )],
        r3("derender_cmpl_stream_special_kept", dc, {
            "model": MODEL, "stream": True, "completion_request": {"model": MODEL, "prompt": "x",
                                                                  "skip_special_tokens": False},
            "generate_chunk": {"request_id": "r", "choices": [{"index": 0, "token_ids": [413, 2],
                                                               "finish_reason": "stop"}]}}),
        _case("route3/derender_chat_stream_with_parser", "tools", dch, {
            "model": MODEL, "stream": True, "generate_chunk": {"request_id": "r", "choices": [
                {"index": 0, "token_ids": [413]}]}}, server="tools"),
        r3("generative_scoring", gs, {"model": MODEL, "query": "To be", "items": ["yes", "no"],
                                      "label_token_ids": [413, 308]}),
        r3("generative_scoring_missing", gs, {"model": MODEL, "query": "x"}),
        r3("generative_scoring_no_softmax", gs, {"model": MODEL, "query": "To be", "items": ["yes"],
                                                 "label_token_ids": [413, 308, 202], "apply_softmax": False}),
        r3("generative_scoring_ids_item_first", gs, {
            "query": [1, 413], "items": [[308], [530]], "label_token_ids": [327], "item_first": True}),
        r3("generative_scoring_no_items", gs, {"model": MODEL, "query": "x", "items": [], "label_token_ids": [1]}),
        r3("generative_scoring_no_labels", gs, {"model": MODEL, "query": "x", "items": ["a"], "label_token_ids": []}),
        r3("generative_scoring_oov_label", gs, {
            "model": MODEL, "query": "x", "items": ["a"], "label_token_ids": [99999]}),
        r3("generative_scoring_bad_model", gs, {"model": "nope", "query": "x", "items": ["a"], "label_token_ids": [1]}),
        # stored responses (nothing is stored unless VLLM_ENABLE_RESPONSES_API_STORE=1)
        r3("responses_get", "/v1/responses/resp_123", method="GET"),
        r3("responses_get_stream", "/v1/responses/resp_123?stream=true", method="GET"),
        r3("responses_cancel", "/v1/responses/resp_123/cancel", {}),
        r3("responses_cancel_get", "/v1/responses/resp_123/cancel", method="GET"),
        # elastic expert parallelism (this server cannot scale)
        r3("scale_elastic_ep", "/scale_elastic_ep", {"new_data_parallel_size": 2}),
        r3("scale_elastic_ep_missing", "/scale_elastic_ep", {}),
        r3("scale_elastic_ep_zero", "/scale_elastic_ep", {"new_data_parallel_size": 0}),
        r3("scale_elastic_ep_drain", "/scale_elastic_ep", {"new_data_parallel_size": 2, "drain_timeout": "soon"}),
        r3("is_scaling_elastic_ep", "/is_scaling_elastic_ep", {}),
        r3("is_scaling_elastic_ep_get", "/is_scaling_elastic_ep", method="GET"),
        # the OpenAPI description and its pages
        r3("openapi", "/openapi.json", method="GET"),
        r3("docs", "/docs", method="GET"),
        r3("redoc", "/redoc", method="GET"),
    ]


def metrics_cases() -> list[dict]:
    """Sent last, after every other case, so each family has seen traffic."""
    return [_case("metrics/families", "metrics", "/metrics", method="GET")]


def resp(**kw) -> dict:
    return {"model": MODEL, "input": "Speak, friend.", "max_output_tokens": 8, "temperature": 0} | kw


# Responses API function tools (flat: name and parameters at the top, not under "function")
RESP_WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
                "parameters": WEATHER["function"]["parameters"]}
RESP_CLOCK = {"type": "function", "name": "get_time", "parameters": CLOCK["function"]["parameters"]}
RESP_TOOLS = [RESP_WEATHER, RESP_CLOCK]
RESP_NAMED = {"type": "function", "name": "get_weather"}
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def responses_cases() -> list[dict]:
    """The Responses API (/v1/responses, vLLM's ResponsesRequest in vllm/entrypoints/openai/responses/protocol.py,
    served without harmony): every field at a valid, a boundary and an invalid value, streamed and not, text.format
    through structured outputs, output logprobs, and function tools on the default and the tools server."""
    p = "/v1/responses"

    def rc(name, cat, body, **kw):
        return _case(f"resp/{name}", cat, p, resp(**body), **kw)

    user = {"role": "user", "content": "Speak, friend."}
    cases = [
        # input: a string, messages (with and without "type"), content parts, every role, a continued reply
        rc("basic", "valid", {}),
        rc("input_messages", "valid", {"input": [user]}),
        rc("input_typed_message", "valid", {"input": [{"type": "message"} | user]}),
        rc("input_parts", "valid", {"input": [{"role": "user", "content": [
            {"type": "input_text", "text": "Speak,"}, {"type": "input_text", "text": "friend."}]}]}),
        rc("input_roles", "valid", {"input": [{"role": "system", "content": "Be brief."},
                                              {"role": "developer", "content": "Rhyme."}, user,
                                              {"role": "assistant", "content": "Who goes there?"}, user]}),
        rc("input_assistant_parts", "valid", {"input": [user, {"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "Who goes there?"}]}, user]}),
        rc("input_continue_final", "valid", {"input": [user, {"type": "message", "role": "assistant",
                                                             "status": "in_progress", "content": [
                                                                 {"type": "output_text", "text": "Good"}]}]}),
        rc("input_function_call_history", "valid", {"input": [
            user, {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Verona"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"}]}),
        rc("input_empty_string", "valid", {"input": ""}),
        rc("bad/input_empty_list", "bad_input", {"input": []}),
        rc("bad/input_null", "bad_input", {"input": None}),
        rc("bad/input_int", "bad_input", {"input": 5}),
        rc("bad/input_bad_role", "bad_input", {"input": [{"role": "wizard", "content": "hi"}]}),
        rc("bad/input_image", "bad_input", {"input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "http://127.0.0.1:9/x.png", "detail": "auto"}]}]}),
        rc("bad/input_item_type", "bad_input", {"input": [{"type": "nonsense"}]}),
        rc("bad/input_too_long", "bad_input", {"input": "to be or not " * 200}),
        # instructions
        rc("instructions", "valid", {"instructions": "Answer in verse."}),
        rc("instructions_empty", "valid", {"instructions": ""}),
        rc("bad/instructions_int", "bad_input", {"instructions": 3}),
        # max_output_tokens
        rc("max_output_tokens_1", "valid", {"max_output_tokens": 1}),
        rc("max_output_tokens_null", "valid", {"max_output_tokens": None, "ignore_eos": False}),
        rc("max_output_tokens_fill", "valid", {"max_output_tokens": 238, "max_tool_calls": None}),
        rc("bad/max_output_tokens_fill_over", "bad_input", {"max_output_tokens": 239}),
        rc("bad/max_output_tokens_0", "bad_input", {"max_output_tokens": 0}),
        rc("bad/max_output_tokens_neg", "bad_input", {"max_output_tokens": -1}),
        rc("bad/max_output_tokens_over", "bad_input", {"max_output_tokens": 300}),
        rc("bad/max_output_tokens_str", "bad_input", {"max_output_tokens": "many"}),
        # sampling
        rc("temperature_default_seeded", "valid", {"temperature": None, "seed": 11}),
        rc("seed_t1", "valid", {"temperature": 1.0, "seed": 1234}),
        rc("top_p_small", "valid", {"temperature": 1.0, "top_p": 0.01}),
        rc("top_k_1", "valid", {"temperature": 1.0, "top_k": 1}),
        rc("top_k_minus1", "valid", {"top_k": -1}),
        rc("bad/temperature_neg", "bad_input", {"temperature": -0.5}),
        rc("bad/top_p_0", "bad_input", {"top_p": 0.0}),
        rc("bad/top_k_minus2", "bad_input", {"top_k": -2}),
        rc("bad/seed_str", "bad_input", {"seed": "x"}),
        rc("stop_str", "valid", {"stop": "e"}),
        rc("stop_list", "valid", {"stop": ["e", "\n"]}),
        rc("stop_null", "valid", {"stop": None}),
        rc("stop_incl", "valid", {"stop": ["e"], "include_stop_str_in_output": True}),
        rc("bad/stop_int", "bad_input", {"stop": 5}),
        rc("ignore_eos", "valid", {"ignore_eos": True, "max_output_tokens": 12}),
        rc("presence_penalty_2", "valid", {"presence_penalty": 2.0}),
        rc("frequency_penalty_neg2", "valid", {"frequency_penalty": -2.0}),
        rc("bad/presence_penalty_over", "bad_input", {"presence_penalty": 2.5}),
        rc("bad/frequency_penalty_under", "bad_input", {"frequency_penalty": -2.01}),
        rc("repetition_penalty", "valid", {"repetition_penalty": 1.3}),
        rc("bad/repetition_penalty_0", "bad_input", {"repetition_penalty": 0}),
        rc("logit_bias", "valid", {"logit_bias": {"5": 100}}),
        rc("logit_bias_clamped", "valid", {"logit_bias": {"5": 1000}}),
        rc("bad/logit_bias_oov", "bad_input", {"logit_bias": {"999999": 5}}),
        rc("bad/logit_bias_str", "bad_input", {"logit_bias": {"5": "up"}}),
        rc("skip_special_tokens_false", "valid", {"skip_special_tokens": False, "ignore_eos": True}),
        # metadata, user, service tier, truncation, store, background, previous response, prompt, reasoning
        rc("metadata", "valid", {"metadata": {"k": "v", "trace": "1"}}),
        rc("bad/metadata_int", "bad_input", {"metadata": {"k": 1}}),
        rc("user", "valid", {"user": "alice"}),
        rc("service_tier_flex", "valid", {"service_tier": "flex"}),
        rc("bad/service_tier", "bad_input", {"service_tier": "gold"}),
        rc("truncation_auto", "valid", {"truncation": "auto"}),
        rc("truncation_auto_long", "valid", {"truncation": "auto", "input": "to be or not " * 200}),
        rc("bad/truncation", "bad_input", {"truncation": "left"}),
        rc("store_false", "valid", {"store": False}),
        rc("bad/background", "bad_input", {"background": True}),
        rc("bad/background_no_store", "bad_input", {"background": True, "store": False}),
        rc("bad/previous_response_id", "bad_input", {"previous_response_id": "resp_123"}),
        rc("bad/prompt", "bad_input", {"prompt": {"id": "pmpt_1"}}),
        rc("reasoning", "valid", {"reasoning": {"effort": "low"}}),
        rc("bad/reasoning_effort", "bad_input", {"reasoning": {"effort": "extreme"}}),
        rc("include_reasoning_false", "valid", {"include_reasoning": False}),
        rc("max_tool_calls", "valid", {"max_tool_calls": 2}),
        rc("bad/max_tool_calls_str", "bad_input", {"max_tool_calls": "two"}),
        rc("chat_template_kwargs", "valid", {"chat_template_kwargs": {"enable_thinking": False}}),
        rc("bad/chat_template_kwargs_list", "bad_input", {"chat_template_kwargs": ["x"]}),
        rc("cache_salt", "valid", {"cache_salt": "salty"}),
        rc("bad/cache_salt_empty", "bad_input", {"cache_salt": ""}),
        rc("priority", "valid", {"priority": 3}),
        rc("bad/priority_str", "bad_input", {"priority": "high"}),
        rc("request_id", "valid", {"request_id": "resp_mine"}),
        rc("prompt_cache_key", "valid", {"prompt_cache_key": "k"}),
        rc("parallel_tool_calls_false", "valid", {"parallel_tool_calls": False}),
        rc("enable_response_messages", "valid", {"enable_response_messages": True}),
        rc("stream_response_messages", "streamed", {"enable_response_messages": True, "stream": True}),
        rc("previous_input_messages", "valid", {"previous_input_messages": [{"role": "user", "content": "Who?"}]}),
        rc("bad/previous_input_messages_and_id", "bad_input", {"previous_input_messages": [user],
                                                                 "previous_response_id": "resp_1"}),
        rc("vllm_xargs", "valid", {"vllm_xargs": {"a": 1}}),
        rc("kv_transfer_params", "valid", {"kv_transfer_params": {"x": 1}}),
        rc("bad/model", "bad_input", {"model": "gpt-9"}),
        rc("bad/not_json", "bad_input", {}, raw="{", headers={"Content-Type": "application/json"}),
        # output logprobs
        rc("logprobs", "valid", {"include": ["message.output_text.logprobs"], "top_logprobs": 2}),
        rc("logprobs_top0", "valid", {"include": ["message.output_text.logprobs"]}),
        rc("logprobs_top20", "valid", {"include": ["message.output_text.logprobs"], "top_logprobs": 20,
                                        "max_output_tokens": 2}),
        rc("top_logprobs_without_include", "valid", {"top_logprobs": 3}),
        rc("bad/top_logprobs_neg", "bad_input", {"include": ["message.output_text.logprobs"], "top_logprobs": -1}),
        rc("bad/top_logprobs_21", "bad_input", {"include": ["message.output_text.logprobs"], "top_logprobs": 21}),
        rc("bad/include_unknown", "bad_input", {"include": ["everything"]}),
        rc("include_other", "valid", {"include": ["reasoning.encrypted_content"]}),
        # text.format: structured outputs
        rc("text_format_text", "structured", {"text": {"format": {"type": "text"}}}),
        rc("text_format_json_object", "structured", {"text": {"format": {"type": "json_object"}},
                                                     "max_output_tokens": 30}),
        rc("text_format_json_schema", "structured", {"text": {"format": {
            "type": "json_schema", "name": "person", "schema": SCHEMA, "strict": True}}, "max_output_tokens": 40}),
        rc("structured_outputs_choice", "structured", {"structured_outputs": {"choice": ["yes", "no"]}}),
        rc("bad/text_format_and_structured_outputs", "bad_input", {"text": {"format": {"type": "json_object"}},
                                                                   "structured_outputs": {"choice": ["a"]}}),
        rc("bad/text_format_schema_missing", "bad_input", {"text": {"format": {"type": "json_schema", "name": "x"}}}),
        rc("bad/text_format_type", "bad_input", {"text": {"format": {"type": "yaml"}}}),
        # streaming
        rc("stream", "streamed", {"stream": True}),
        rc("stream_stop", "streamed", {"stream": True, "stop": "\n", "max_output_tokens": 30}),
        rc("stream_finish", "streamed", {"stream": True, "max_output_tokens": 60}),
        rc("stream_instructions", "streamed", {"stream": True, "instructions": "Answer in verse."}),
        rc("stream_logprobs", "streamed", {"stream": True, "include": ["message.output_text.logprobs"],
                                           "top_logprobs": 2}),
        rc("stream_json_schema", "streamed", {"stream": True, "text": {"format": {
            "type": "json_schema", "name": "person", "schema": SCHEMA}}, "max_output_tokens": 40}),
        rc("stream_max1", "streamed", {"stream": True, "max_output_tokens": 1}),
        rc("stream_seeded", "streamed", {"stream": True, "temperature": 1.0, "seed": 5}),
        rc("stream_json_object", "streamed", {"stream": True, "text": {"format": {"type": "json_object"}},
                                              "max_output_tokens": 20}),
        rc("stream_input_messages", "streamed", {"stream": True, "input": [user, {"role": "assistant", "content": "Who?"},
                                                                          user]}),
        rc("bad/stream_background", "bad_input", {"stream": True, "background": True}),
        # function tools on the default server (no tool-call parser)
        rc("tools_auto_default", "tools", {"tools": RESP_TOOLS}),
        rc("tools_none_default", "tools", {"tools": RESP_TOOLS, "tool_choice": "none"}),
        rc("tools_required_default", "tools", {"tools": RESP_TOOLS, "tool_choice": "required",
                                               "max_output_tokens": 60}),
        rc("tools_named_default", "tools", {"tools": RESP_TOOLS, "tool_choice": RESP_NAMED, "max_output_tokens": 30}),
        rc("bad/tool_choice_required_no_tools", "bad_input", {"tool_choice": "required"}),
        rc("bad/tool_choice_named_no_tools", "bad_input", {"tool_choice": RESP_NAMED}),
        rc("bad/tool_choice_named_unknown", "bad_input", {"tools": RESP_TOOLS, "tool_choice": {
            "type": "function", "name": "fly"}}),
        rc("bad/tool_choice_str", "bad_input", {"tools": RESP_TOOLS, "tool_choice": "always"}),
        rc("bad/tool_no_name", "bad_input", {"tools": [{"type": "function", "parameters": {}}]}),
        rc("bad/tool_type", "bad_input", {"tools": [{"type": "retrieval", "name": "f"}]}),
        rc("tools_empty", "tools", {"tools": [], "tool_choice": "auto"}),
        rc("tools_stream_default", "tools", {"tools": RESP_TOOLS, "tool_choice": RESP_NAMED, "stream": True}),
        rc("tools_builtin", "tools", {"tools": [{"type": "web_search_preview"}]}),
    ]

    def tc(name, body):
        return rc(f"tools/{name}", "tools", body, server="tools")

    cases += [
        tc("auto_plain", {"tools": RESP_TOOLS}),
        tc("auto_plain_stream", {"tools": RESP_TOOLS, "stream": True}),
        tc("auto_pythonic", {"tools": RESP_TOOLS, "max_output_tokens": 30} | PYTHONIC_ONE),
        tc("auto_pythonic_cut", {"tools": RESP_TOOLS, "max_output_tokens": 20} | PYTHONIC_ONE),
        tc("auto_pythonic_stream", {"tools": RESP_TOOLS, "max_output_tokens": 30, "stream": True} | PYTHONIC_ONE),
        tc("auto_pythonic_cut_stream", {"tools": RESP_TOOLS, "max_output_tokens": 20, "stream": True} | PYTHONIC_ONE),
        tc("auto_pythonic_two_stream_parallel_false", {"tools": RESP_TOOLS, "max_output_tokens": 40, "stream": True,
                                                       "parallel_tool_calls": False} | PYTHONIC_TWO),
        tc("json_schema", {"text": {"format": {"type": "json_schema", "name": "person", "schema": SCHEMA}},
                           "max_output_tokens": 40}),
        tc("named_and_structured_outputs", {"tools": RESP_TOOLS, "tool_choice": RESP_NAMED,
                                            "structured_outputs": {"choice": ["a"]}}),
        tc("named_over_text_format", {"tools": RESP_TOOLS, "tool_choice": RESP_NAMED, "max_output_tokens": 30,
                                      "text": {"format": {"type": "json_object"}}}),
        tc("named_logprobs_stream", {"tools": RESP_TOOLS, "tool_choice": RESP_NAMED, "max_output_tokens": 30,
                                     "stream": True, "include": ["message.output_text.logprobs"]}),
        tc("auto_pythonic_two", {"tools": RESP_TOOLS, "max_output_tokens": 40} | PYTHONIC_TWO),
        tc("auto_pythonic_two_stream", {"tools": RESP_TOOLS, "max_output_tokens": 40, "stream": True} | PYTHONIC_TWO),
        tc("auto_pythonic_two_parallel_false", {"tools": RESP_TOOLS, "max_output_tokens": 40,
                                                "parallel_tool_calls": False} | PYTHONIC_TWO),
        tc("none", {"tools": RESP_TOOLS, "tool_choice": "none"}),
        tc("none_pythonic", {"tools": RESP_TOOLS, "tool_choice": "none", "max_output_tokens": 20} | PYTHONIC_ONE),
        tc("named", {"tools": RESP_TOOLS, "tool_choice": RESP_NAMED, "max_output_tokens": 30}),
        tc("named_stream", {"tools": RESP_TOOLS, "tool_choice": RESP_NAMED, "max_output_tokens": 30, "stream": True}),
        tc("required", {"tools": RESP_TOOLS, "tool_choice": "required", "max_output_tokens": 60}),
        tc("required_stream", {"tools": RESP_TOOLS, "tool_choice": "required", "max_output_tokens": 60,
                               "stream": True}),
        tc("required_closed", {"tools": RESP_TOOLS, "tool_choice": "required", "logit_bias": {"64": 100, "358": 100},
                               "max_output_tokens": 80}),
        tc("required_closed_stream", {"tools": RESP_TOOLS, "tool_choice": "required", "stream": True,
                                      "logit_bias": {"64": 100, "358": 100}, "max_output_tokens": 80}),
        tc("required_parallel_false", {"tools": RESP_TOOLS, "tool_choice": "required", "parallel_tool_calls": False,
                                       "logit_bias": {"64": 100, "358": 100}, "max_output_tokens": 80}),
        tc("function_call_history", {"tools": RESP_TOOLS, "input": [
            user, {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Verona"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"}]}),
    ]
    return cases


def dev_cases() -> list[dict]:
    """The development routes vLLM registers with VLLM_SERVER_DEV_MODE=1 (vllm/entrypoints/serve/dev/): each at a
    valid, a boundary and an invalid value, and in sequences whose later answers depend on the earlier ones (pause
    then is_paused, a weight version set then read, sleep then wake_up by tag). They change the server's state,
    so they run one at a time, in this order (serial), on the dev profile's server."""
    def dev(name, path, body=None, method="POST", **kw):
        return _case(f"dev/{name}", "routes", path, body, method=method, server="dev", serial=True, **kw)

    gen = cmpl(max_tokens=6)
    return [
        # the routes are there only with VLLM_SERVER_DEV_MODE=1
        _case("dev/absent_without_dev_mode", "routes", "/reset_prefix_cache"),
        # caches (dev/cache)
        dev("reset_prefix_cache", "/reset_prefix_cache"),
        dev("generate_then_reset", "/v1/completions", gen),
        dev("reset_prefix_cache_idle", "/reset_prefix_cache"),
        dev("reset_prefix_cache_running", "/reset_prefix_cache?reset_running_requests=true&reset_external=true"),
        dev("reset_prefix_cache_false", "/reset_prefix_cache?reset_running_requests=false&reset_external=0"),
        dev("reset_prefix_cache_bad_bool", "/reset_prefix_cache?reset_running_requests=bogus"),
        dev("reset_prefix_cache_get", "/reset_prefix_cache", method="GET"),
        dev("reset_mm_cache", "/reset_mm_cache"),
        dev("reset_encoder_cache", "/reset_encoder_cache"),
        dev("reset_mm_cache_get", "/reset_mm_cache", method="GET"),
        # pause / resume / is_paused (dev/rlhf)
        dev("is_paused_initially", "/is_paused", method="GET"),
        dev("is_paused_post", "/is_paused"),
        dev("pause_bad_mode", "/pause?mode=bogus"),
        dev("pause_bad_clear_cache", "/pause?clear_cache=notbool"),
        dev("is_paused_after_bad_pause", "/is_paused", method="GET"),
        dev("pause_keep", "/pause?mode=keep"),
        dev("is_paused_after_keep", "/is_paused", method="GET"),
        dev("pause_keep_again", "/pause?mode=keep&clear_cache=false"),
        dev("resume", "/resume"),
        dev("is_paused_after_resume", "/is_paused", method="GET"),
        dev("pause_abort", "/pause"),
        dev("is_paused_after_abort", "/is_paused", method="GET"),
        dev("resume_after_abort", "/resume"),
        dev("pause_wait", "/pause?mode=wait"),
        dev("resume_after_wait", "/resume"),
        dev("pause_deprecated_wait", "/pause?wait_for_inflight_requests=true&clear_cache=false"),
        dev("resume_after_deprecated", "/resume"),
        dev("resume_not_paused", "/resume"),
        dev("generate_after_resume", "/v1/completions", gen),
        dev("pause_get", "/pause", method="GET"),
        dev("resume_get", "/resume", method="GET"),
        # abort_requests (dev/rlhf): "aborted" counts what was asked for
        dev("abort_all", "/abort_requests", {}),
        dev("abort_ids", "/abort_requests", {"request_ids": ["no-such-request", "another"]}),
        dev("abort_ids_empty", "/abort_requests", {"request_ids": []}),
        dev("abort_ids_null", "/abort_requests", {"request_ids": None}),
        dev("abort_ids_string", "/abort_requests", {"request_ids": "abc"}),
        dev("abort_ids_int", "/abort_requests", {"request_ids": 5}),
        dev("abort_no_body", "/abort_requests"),
        dev("abort_invalid_json", "/abort_requests", raw="notjson"),
        dev("abort_body_list", "/abort_requests", [1]),
        dev("abort_get", "/abort_requests", method="GET"),
        # weight version and weight transfer (dev/rlhf): no weight transfer engine is configured
        dev("weight_info_initially", "/weight_info", method="GET"),
        dev("update_weight_version", "/update_weight_version", {"new_version": "v1"}),
        dev("weight_info_after_update", "/weight_info", method="GET"),
        dev("update_weight_version_missing", "/update_weight_version", {}),
        dev("update_weight_version_int", "/update_weight_version", {"new_version": 5}),
        dev("update_weight_version_no_body", "/update_weight_version"),
        dev("init_weight_transfer_engine", "/init_weight_transfer_engine", {"init_info": {}}),
        dev("init_weight_transfer_engine_missing", "/init_weight_transfer_engine", {}),
        dev("init_weight_transfer_engine_null", "/init_weight_transfer_engine", {"init_info": None}),
        dev("init_weight_transfer_engine_bad_json", "/init_weight_transfer_engine", raw="bad"),
        dev("start_weight_update", "/start_weight_update"),
        dev("start_draft_weight_update", "/start_draft_weight_update"),
        dev("update_weights", "/update_weights", {"update_info": {"names": []}}),
        dev("update_weights_missing", "/update_weights", {}),
        dev("update_weights_bad_json", "/update_weights", raw="{"),
        dev("finish_weight_update", "/finish_weight_update"),
        dev("finish_weight_update_version", "/finish_weight_update", {"weight_version": "v2"}),
        dev("finish_weight_update_version_int", "/finish_weight_update", {"weight_version": 3}),
        dev("weight_info_after_failed_finish", "/weight_info", method="GET"),
        dev("update_weight_version_empty", "/update_weight_version", {"new_version": ""}),
        dev("weight_info_empty", "/weight_info", method="GET"),
        dev("weight_info_post", "/weight_info"),
        dev("start_weight_update_get", "/start_weight_update", method="GET"),
        # world size (dev/rlhf)
        dev("get_world_size", "/get_world_size", method="GET"),
        dev("get_world_size_no_dp", "/get_world_size?include_dp=false", method="GET"),
        dev("get_world_size_bad_bool", "/get_world_size?include_dp=xx", method="GET"),
        dev("get_world_size_post", "/get_world_size"),
        # worker RPC (dev/rpc)
        dev("collective_rpc", "/collective_rpc", {"method": "check_health"}),
        dev("collective_rpc_timeout", "/collective_rpc", {"method": "check_health", "timeout": 5, "args": [],
                                                          "kwargs": {}}),
        dev("collective_rpc_missing_method", "/collective_rpc", {"args": []}),
        dev("collective_rpc_bad_json", "/collective_rpc", raw="bad"),
        dev("collective_rpc_no_body", "/collective_rpc"),
        dev("collective_rpc_body_list", "/collective_rpc", [1]),
        dev("collective_rpc_unknown_method", "/collective_rpc", {"method": "nonexistent_method"}),
        dev("collective_rpc_extra_args", "/collective_rpc", {"method": "check_health", "args": ["x"]}),
        dev("collective_rpc_method_int", "/collective_rpc", {"method": 5}),
        dev("collective_rpc_get", "/collective_rpc", method="GET"),
        # server info (dev/server_info)
        dev("server_info", "/server_info", method="GET"),
        dev("server_info_json", "/server_info?config_format=json", method="GET"),
        dev("server_info_bad_format", "/server_info?config_format=bogus", method="GET"),
        dev("server_info_post", "/server_info"),
        # sleep / wake_up / is_sleeping (dev/sleep); on CPU vLLM's worker ignores sleep, its engine pauses
        dev("is_sleeping_initially", "/is_sleeping", method="GET"),
        dev("sleep_bad_level", "/sleep?level=bogus"),
        dev("sleep_level_float", "/sleep?level=1.5"),
        dev("sleep_level_empty", "/sleep?level="),
        dev("sleep_bad_mode", "/sleep?mode=bogus"),
        dev("is_sleeping_after_bad_mode", "/is_sleeping", method="GET"),
        dev("sleep", "/sleep"),
        dev("is_sleeping_asleep", "/is_sleeping", method="GET"),
        dev("is_paused_asleep", "/is_paused", method="GET"),
        dev("sleep_again", "/sleep?level=1"),
        dev("wake_up_weights", "/wake_up?tags=weights"),
        dev("is_sleeping_kv_cache_asleep", "/is_sleeping", method="GET"),
        dev("wake_up_unknown_tag", "/wake_up?tags=bogus"),
        dev("is_sleeping_after_unknown_tag", "/is_sleeping", method="GET"),
        dev("wake_up_kv_cache", "/wake_up?tags=kv_cache"),
        dev("is_sleeping_awake", "/is_sleeping", method="GET"),
        dev("is_paused_awake", "/is_paused", method="GET"),
        dev("generate_after_wake_up", "/v1/completions", gen),
        dev("sleep_level0", "/sleep?level=0"),
        dev("is_sleeping_level0", "/is_sleeping", method="GET"),
        dev("wake_up_scheduling", "/wake_up?tags=scheduling"),
        dev("is_sleeping_after_scheduling", "/is_sleeping", method="GET"),
        dev("sleep_level2_keep", "/sleep?level=2&mode=keep"),
        dev("wake_up_all", "/wake_up"),
        dev("is_sleeping_after_wake_up_all", "/is_sleeping", method="GET"),
        dev("sleep_level_negative", "/sleep?level=-1"),
        dev("is_sleeping_level_negative", "/is_sleeping", method="GET"),
        dev("wake_up_after_negative", "/wake_up"),
        dev("wake_up_awake", "/wake_up"),
        dev("is_sleeping_finally", "/is_sleeping", method="GET"),
        dev("generate_finally", "/v1/completions", gen),
        dev("sleep_get", "/sleep", method="GET"),
        dev("wake_up_get", "/wake_up", method="GET"),
        dev("is_sleeping_post", "/is_sleeping"),
    ]


def field_cases() -> list[dict]:
    """Every field of the pinned vLLM's request models at a valid, a boundary and an invalid value, on its route: the
    fields the other case lists reach fewer than three times (ChatCompletionRequest, CompletionRequest,
    ResponsesRequest, AnthropicMessagesRequest) and those of /tokenize, /detokenize, the batch chat route,
    /inference/v1/generate (GenerateRequest), the render routes, /generative_scoring and /v1/messages/count_tokens.
    Named field/<route>/<field>_<kind>; greedy, a few tokens each."""
    ch, c, r, m = "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"
    convo = [{"role": "user", "content": "Speak, friend."}]
    am = {"model": MODEL, "max_tokens": 6, "temperature": 0, "messages": convo}
    rep = {"ignore_eos": True, "max_tokens": 40}  # greedy over 40 tokens: the shipped model repeats itself
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    cats = {"valid": "valid", "boundary": "valid", "invalid": "bad_input"}

    def cases_of(route, path, base, table, cat=None, **kw):
        out = []
        for field, kind, body in table:
            k = kind.split("_")[0]
            c_ = cat or ("streamed" if body.get("stream") is True else cats[k])
            out.append(_case(f"field/{route}/{field}_{kind}", c_, path, base(**body), **kw))
        return out

    # fields of ChatCompletionRequest and CompletionRequest alike (vLLM's two models share them)
    shared = [
        *each("add_special_tokens", valid=True, invalid="maybe"),
        *each("allowed_token_ids", boundary=[], boundary_max_id=[4095, 413], invalid=["a"]),
        *each("bad_words", boundary=[], valid_two=["the", "and"], invalid="the"),
        *each("cache_salt", boundary=None, valid_long="s" * 64),
        *each("ec_transfer_params", valid={"a": 1}, boundary={}, invalid="x"),
        ("include_stop_str_in_output", "boundary", {"include_stop_str_in_output": False, "stop": ["e"]}),
        *each("include_stop_str_in_output", valid_no_stop=True, invalid="maybe"),
        *each("kv_transfer_params", valid={"do_remote_prefill": False}, boundary={}, invalid=[1]),
        *each("length_penalty", valid=0.5, boundary=0, invalid="long"),
        ("repetition_detection", "valid", rep | {"repetition_detection": {"max_pattern_size": 4, "min_count": 2}}),
        ("repetition_detection", "valid_min_size", rep | {"repetition_detection": {
            "min_pattern_size": 2, "max_pattern_size": 6, "min_count": 3}}),
        ("repetition_detection", "boundary", rep | {"repetition_detection": {"max_pattern_size": 0}}),
        *each("repetition_detection", boundary_empty={}, invalid={"max_pattern_size": 2, "min_count": 1}),
        ("repetition_detection", "invalid_sizes", {"repetition_detection": {"min_pattern_size": 3,
                                                                            "max_pattern_size": 2}}),
        ("repetition_detection", "invalid_type", {"repetition_detection": {"max_pattern_size": "x"}}),
        *each("request_id", boundary="", invalid=5),
        *each("return_token_offsets", valid=True, boundary=False, invalid="maybe"),
        ("skip_special_tokens", "valid", {"skip_special_tokens": True}),
        ("skip_special_tokens", "boundary", {"skip_special_tokens": False, "ignore_eos": True, "max_tokens": 30}),
        ("skip_special_tokens", "invalid_null", {"skip_special_tokens": None}),
        ("spaces_between_special_tokens", "valid", {"spaces_between_special_tokens": True}),
        ("spaces_between_special_tokens", "boundary", {"spaces_between_special_tokens": False,
                                                       "skip_special_tokens": False, "ignore_eos": True,
                                                       "max_tokens": 30}),
        ("spaces_between_special_tokens", "invalid", {"spaces_between_special_tokens": 3}),
        ("stream_interval", "valid", {"stream": True, "stream_interval": 3, "max_tokens": 10}),
        ("stream_interval", "boundary", {"stream": True, "stream_interval": 1}),
        *each("stream_interval", valid_not_streamed=5, invalid="x"),
        *each("thinking_token_budget", valid=10, boundary=-1, boundary_0=0, invalid=-2),
        *each("use_beam_search", invalid="maybe", boundary_null=None),
        *each("user", boundary="", invalid=5),
        *each("vllm_xargs", boundary={}, valid_list={"a": [1, "b", 2.5], "c": "d"}, invalid={"a": {"b": 1}}),
        *each("logit_bias", boundary={}, valid_negative={"413": -100, "308": -100}, invalid={"5": "up"}),
    ]
    chat_only = [
        ("add_special_tokens", "boundary", {"add_special_tokens": False}),
        ("cache_salt", "valid", {"cache_salt": "salty"}),
        *each("chat_template", boundary="", boundary_null=None, invalid=5),
        ("chat_template_kwargs", "boundary", {"chat_template_kwargs": {}}),
        ("chat_template_kwargs", "valid_generation_prompt", {"chat_template_kwargs": {"add_generation_prompt": False}}),
        *each("chat_template_kwargs", invalid="x", invalid_template={"chat_template": "{{ 1 }}"}),
        *each("documents", boundary=[], invalid=[{"title": 5}]),
        *each("include_reasoning", valid=True, invalid="maybe"),
        ("logprob_token_ids", "boundary", {"logprob_token_ids": [], "logprobs": True}),
        ("logprob_token_ids", "invalid", {"logprob_token_ids": ["a"], "logprobs": True}),
        *each("media_io_kwargs", valid={"image": {"x": 1}}, boundary=None, invalid={"image": 5}),
        *each("mm_processor_kwargs", boundary=None, valid={"a": 1}),
        *each("reasoning_effort", boundary="none", boundary_max="max", invalid=5),
        *each("return_assistant_tokens_mask", valid=True, invalid="maybe"),
        *each("return_prompt_text", boundary=False, invalid="maybe"),
        ("return_prompt_text", "valid_stream", {"return_prompt_text": True, "stream": True}),
        *each("return_token_ids", boundary=False, invalid="maybe"),
        ("truncation_side", "valid", {"truncation_side": "left", "truncate_prompt_tokens": 3}),
        ("truncation_side", "boundary", {"truncation_side": None, "truncate_prompt_tokens": 3}),
        ("truncation_side", "invalid", {"truncation_side": 5}),
        ("use_beam_search", "valid", {"use_beam_search": False, "length_penalty": 2.0}),
        ("thinking_token_budget", "valid_stream", {"thinking_token_budget": 10, "stream": True}),
    ]
    cmpl_only = [
        ("add_special_tokens", "boundary", {"add_special_tokens": False, "prompt": [1, 413]}),
        ("cache_salt", "invalid", {"cache_salt": 5}),
        ("kv_transfer_params", "boundary_null", {"kv_transfer_params": None}),
        *each("prompt_embeds", boundary=None, boundary_empty=[], invalid=5),
        ("prompt_embeds", "valid_without_prompt", {"prompt": None, "prompt_embeds": "AAAA"}),
        *each("suffix", boundary="", invalid=5),
        ("use_beam_search", "valid", {"use_beam_search": False, "length_penalty": 2.0}),
    ]
    cases = cases_of("chat", ch, chat, shared + chat_only) + cases_of("cmpl", c, cmpl, shared + cmpl_only)

    resp_table = [
        *each("cache_salt", boundary=None, invalid=5),
        *each("chat_template_kwargs", boundary={}, boundary_null=None),
        *each("ec_transfer_params", valid={"a": 1}, boundary=None, invalid="x"),
        *each("enable_response_messages", boundary=False, invalid="maybe"),
        *each("frequency_penalty", boundary=2.0, invalid="x"),
        *each("include_reasoning", valid=True, invalid="maybe"),
        ("include_stop_str_in_output", "boundary", {"include_stop_str_in_output": False, "stop": ["e"]}),
        ("include_stop_str_in_output", "invalid", {"include_stop_str_in_output": "maybe"}),
        *each("kv_transfer_params", boundary=None, invalid="x"),
        *each("media_io_kwargs", valid={"image": {"x": 1}}, boundary={}, invalid={"image": 5}),
        *each("metadata", boundary={}, boundary_null=None),
        *each("mm_processor_kwargs", valid={"a": 1}, boundary=None, invalid=[1]),
        *each("presence_penalty", boundary=-2.0, invalid="x"),
        *each("previous_input_messages", boundary=[], invalid="x"),
        *each("previous_response_id", boundary=None, invalid=5),
        *each("priority", boundary=0, invalid_huge=2 ** 63),
        *each("prompt", boundary=None, invalid="x"),
        *each("prompt_cache_key", boundary="", invalid=5),
        *each("reasoning", boundary=None, valid_summary={"effort": "high", "summary": "auto"}),
        *each("repetition_penalty", boundary=1.0, invalid="x"),
        *each("request_id", boundary="", invalid=5),
        *each("service_tier", boundary="auto", invalid_null=None),
        *each("skip_special_tokens", valid=True, invalid="maybe"),
        *each("store", boundary=None, invalid="maybe"),
        *each("top_p", boundary=1.0, invalid=1.5),
        *each("user", boundary="", invalid=5),
        *each("vllm_xargs", boundary={}, invalid={"a": {"b": 1}}),
    ]
    cases += cases_of("resp", r, resp, resp_table)

    def amsg(**kw):
        return am | kw

    msg_table = [
        *each("cache_salt", valid="salty", boundary="", invalid=5),
        *each("chat_template_kwargs", valid={"foo": 1}, boundary={}, invalid="x"),
        *each("ec_transfer_params", valid={"a": 1}, boundary=None, invalid="x"),
        *each("kv_transfer_params", valid={"a": 1}, boundary={}, invalid="x"),
        *each("metadata", boundary={}, invalid="x"),
        ("output_config", "valid", {"output_config": {"format": {"type": "json_schema", "schema": schema}},
                                    "max_tokens": 20}),
        ("output_config", "valid_stream", {"output_config": {"format": {"type": "json_schema", "schema": schema}},
                                           "max_tokens": 20, "stream": True}),
        *each("output_config", valid_effort={"effort": "low"}, boundary={},
              boundary_format_no_schema={"format": {"type": "json_schema"}},
              invalid={"format": {"type": "xml", "schema": schema}}, invalid_effort={"effort": "extreme"},
              invalid_type="json"),
        *each("stop_sequences", boundary=[], invalid="\n"),
        *each("stream", boundary=False, invalid="maybe"),
        *each("system", boundary="", boundary_empty_list=[], invalid=5),
        *each("tool_choice", valid_auto={"type": "auto"}, boundary=None, invalid={"type": "tool"},
              invalid_type={"type": "bogus"}),
        *each("top_k", boundary=-1, invalid="x"),
        *each("top_p", boundary=1.0, invalid=0),
        *each("max_tokens", boundary=1, invalid=0),
        ("model", "invalid", {"model": ""}),
    ]
    cases += cases_of("messages", m, amsg, msg_table, cat="routes")

    # /v1/messages/count_tokens (AnthropicCountTokensRequest)
    weather_tool = {"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}

    def cnt(**kw):
        return {"model": MODEL, "messages": convo} | kw

    cases += cases_of("count_tokens", "/v1/messages/count_tokens", cnt, [
        *each("system", boundary="", valid_blocks=[{"type": "text", "text": "Be brief."}], invalid=5),
        *each("tools", valid=[weather_tool], boundary=[], invalid=[{"name": "f"}]),
        ("tool_choice", "valid", {"tools": [weather_tool], "tool_choice": {"type": "any"}}),
        *each("tool_choice", boundary={"type": "none"}, invalid={"type": "tool"}),
        *each("chat_template_kwargs", valid={"foo": 1}, boundary={}, invalid="x"),
        *each("messages", boundary=[], invalid="hi"),
        ("model", "boundary", {"model": ""}),
    ], cat="routes")

    # /tokenize (TokenizeCompletionRequest | TokenizeChatRequest) and /detokenize
    def tok(**kw):
        return {"model": MODEL, "prompt": "ROMEO: hi"} | kw

    def tokc(**kw):
        return {"model": MODEL, "messages": convo} | kw

    cases += cases_of("tokenize", "/tokenize", tok, [
        ("prompt", "invalid", {"prompt": 5}),
        *each("add_special_tokens", boundary=True, invalid="maybe"),
        *each("return_token_strs", boundary=False, boundary_null=None, invalid="maybe"),
        ("model", "boundary", {"model": None}),
    ], cat="routes")
    cases += cases_of("tokenize_chat", "/tokenize", tokc, [
        *each("add_generation_prompt", boundary=True, invalid="maybe"),
        *each("continue_final_message", boundary=False, invalid="maybe"),
        *each("add_special_tokens", boundary=False, invalid="maybe"),
        ("return_token_strs", "valid", {"return_token_strs": True}),
        *each("chat_template", valid="{% for m in messages %}{{ m['content'] }}{% endfor %}", boundary="", invalid=5),
        *each("chat_template_kwargs", boundary={}, invalid="x", invalid_template={"chat_template": "{{ 1 }}"}),
        *each("media_io_kwargs", valid={"image": {"x": 1}}, boundary={}, invalid={"image": 5}),
        *each("mm_processor_kwargs", valid={"a": 1}, boundary=None, invalid=[1]),
        *each("tools", boundary=[], invalid="x"),
        ("messages", "boundary", {"messages": []}),
    ], cat="routes")
    cases += cases_of("detokenize", "/detokenize", lambda **kw: {"model": MODEL, "tokens": [20, 30]} | kw, [
        *each("tokens", boundary=[0], invalid=[2 ** 63], invalid_nested=[[1]]),
        *each("model", boundary=None, invalid=5),
    ], cat="routes")

    # /v1/chat/completions/batch (BatchChatCompletionRequest)
    def batch(**kw):
        return {"model": MODEL, "messages": [convo, [{"role": "user", "content": "Hello"}]], "max_tokens": 4,
                "temperature": 0} | kw

    cases += cases_of("chat_batch", "/v1/chat/completions/batch", batch, [
        *each("n", boundary=1, invalid=2),
        *each("use_beam_search", boundary=False, invalid=True),
        ("logprobs", "valid", {"logprobs": True, "top_logprobs": 2}),
        ("logprobs", "invalid", {"logprobs": "maybe"}),
        ("logprob_token_ids", "invalid", {"logprob_token_ids": [5]}),
        ("stop", "valid", {"stop": ["e"], "max_tokens": 12}),
        ("stop", "invalid", {"stop": 5}),
        ("seed", "valid", {"seed": 3, "temperature": 1.0}),
        ("seed", "invalid", {"seed": 2 ** 70}),
        *each("max_tokens", boundary=1, invalid=-1),
        ("echo", "valid", {"echo": True}),
        ("return_token_ids", "valid", {"return_token_ids": True}),
        ("include_stop_str_in_output", "valid", {"stop": ["e"], "include_stop_str_in_output": True, "max_tokens": 12}),
        *each("tool_choice", boundary="none", invalid="auto"),
        ("structured_outputs", "valid", {"structured_outputs": {"choice": ["yes", "no"]}}),
        ("response_format", "valid", {"response_format": {"type": "json_object"}, "max_tokens": 8}),
        ("cache_salt", "valid", {"cache_salt": "salty"}),
        ("priority", "invalid", {"priority": 5}),
        ("request_id", "valid", {"request_id": "batch-1"}),
        ("add_generation_prompt", "boundary", {"add_generation_prompt": False}),
        ("chat_template", "valid", {"chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"}),
        ("chat_template_kwargs", "valid", {"chat_template_kwargs": {"foo": 1}}),
        ("top_k", "valid", {"top_k": 1, "temperature": 1.0}),
        ("temperature", "invalid", {"temperature": -1}),
        ("stream", "invalid", {"stream": "maybe"}),
        *each("max_completion_tokens", valid=2, boundary=1, invalid=-1),
        *each("frequency_penalty", valid=0.5, boundary=2.0, invalid=3),
        *each("presence_penalty", valid=0.5, boundary=-2.0, invalid=3),
        *each("logit_bias", valid={"5": 100}, boundary={}, invalid={"x": 1}),
        ("logprobs", "boundary", {"logprobs": False}),
        ("top_logprobs", "valid", {"logprobs": True, "top_logprobs": 3}),
        ("top_logprobs", "boundary", {"logprobs": True, "top_logprobs": 0}),
        ("top_logprobs", "invalid", {"logprobs": True, "top_logprobs": -2}),
        ("logprob_token_ids", "boundary", {"logprob_token_ids": [], "logprobs": True}),
        ("logprob_token_ids", "invalid_type", {"logprob_token_ids": ["a"], "logprobs": True}),
        ("n", "invalid_type", {"n": "x"}),
        *each("response_format", boundary={"type": "text"}, invalid={"type": "xml"}),
        ("seed", "boundary", {"seed": -1}),
        ("top_p", "valid", {"top_p": 0.5, "temperature": 1.0, "seed": 4}),
        *each("top_p", boundary=1.0, invalid=0),
        *each("user", valid="u", boundary="", invalid=5),
        ("tool_choice", "boundary_null", {"tool_choice": None}),
        *each("include_reasoning", valid=True, boundary=False, invalid="maybe"),
        *each("best_of", valid=1, boundary=None, invalid="x"),
        ("use_beam_search", "boundary_null", {"use_beam_search": None}),
        *each("top_k", boundary=-1, invalid="x"),
        ("min_p", "valid", {"min_p": 0.1, "temperature": 1.0, "seed": 4}),
        *each("min_p", boundary=0.0, invalid=1.5),
        *each("repetition_penalty", valid=1.2, boundary=1.0, invalid=0),
        *each("length_penalty", valid=2.0, boundary=None, invalid="x"),
        *each("early_stopping", valid=True, boundary=False, invalid="maybe"),
        *each("structured_outputs", valid_regex={"regex": "[a-z]{3}"}, invalid={"choice": ["a"], "regex": "b"}),
        *each("request_id", boundary="", invalid=5),
        *each("add_generation_prompt", valid=True, invalid="maybe"),
        ("continue_final_message", "valid", {"continue_final_message": True, "add_generation_prompt": False,
                                             "messages": [convo + [{"role": "assistant", "content": "Well"}]]}),
        *each("continue_final_message", boundary=False, invalid=True),
        *each("chat_template", boundary=None, invalid=5),
        *each("chat_template_kwargs", boundary={}, invalid="x"),
        *each("media_io_kwargs", valid={"image": {"x": 1}}, boundary=None, invalid={"image": 5}),
        *each("mm_processor_kwargs", valid={"a": 1}, boundary=None, invalid=[1]),
        *each("priority", boundary=0, invalid_type="x"),
        *each("cache_salt", boundary=None, invalid=""),
        *each("include_stop_str_in_output", boundary=False, invalid="maybe"),
        *each("guided_decoding_backend", valid="xgrammar", boundary=None, invalid=5),
        *each("echo", boundary=False, invalid="maybe"),
        ("return_tokens_as_token_ids", "valid", {"return_tokens_as_token_ids": True, "logprobs": True}),
        *each("return_tokens_as_token_ids", boundary=None, invalid="maybe"),
        *each("return_token_ids", boundary=False, invalid="maybe"),
    ], cat="routes")

    # /inference/v1/generate (GenerateRequest)
    ids = [1, 413, 308, 530, 327]

    def gen(**kw):
        return {"token_ids": ids, "sampling_params": {"max_tokens": 4, "temperature": 0}} | kw

    cases += cases_of("generate", "/inference/v1/generate", gen, [
        *each("request_id", boundary="", invalid=5),
        *each("assistant_tokens_mask", valid=[0, 0, 0, 1, 1], boundary=None, invalid="x"),
        *each("token_offsets", valid=[[0, 0], [0, 2], [2, 4], [4, 6], [6, 8]], boundary=[], invalid=[[0]]),
        *each("features", boundary=None, valid_empty={"mm_hashes": {}, "mm_placeholders": {}}, invalid={}),
        ("sampling_params", "boundary", {"sampling_params": {"temperature": 0}}),  # max_tokens: the context's rest
        *each("sampling_params", invalid="greedy", invalid_field={"max_tokens": "x"}),
        *each("stream", boundary=False, invalid="maybe"),
        ("stream_options", "boundary", {"stream_options": {"include_usage": True}}),
        ("stream_options", "invalid", {"stream": True, "stream_options": {"include_usage": "maybe"}}),
        *each("cache_salt", valid="salty", boundary="", invalid=5),
        *each("priority", boundary=0, valid=5, invalid=2 ** 63),
        *each("kv_transfer_params", valid={"a": 1}, boundary=None, invalid="x"),
        *each("ec_transfer_params", valid={"a": 1}, boundary={}, invalid=5),
        *each("model", boundary=None, invalid=5),
        *each("token_ids", boundary=[0], invalid="abc"),
    ], cat="routes")

    # the render routes: a request's fields as the GenerateRequest they become
    def rcmpl(**kw):
        return {"model": MODEL, "prompt": "ROMEO:", "max_tokens": 4} | kw

    def rchat(**kw):
        return {"model": MODEL, "messages": convo, "max_tokens": 4} | kw

    render_shared = [
        *each("cache_salt", valid="salty", invalid=""),
        ("priority", "valid", {"priority": 3}),
        ("request_id", "valid", {"request_id": "render-1"}),
        ("kv_transfer_params", "valid", {"kv_transfer_params": {"a": 1}}),
        ("return_token_offsets", "valid", {"return_token_offsets": True}),
        ("truncate_prompt_tokens", "valid", {"truncate_prompt_tokens": 2}),
        ("vllm_xargs", "valid", {"vllm_xargs": {"a": 1}}),
        ("logit_bias", "valid", {"logit_bias": {"5": 200}}),
        ("allowed_token_ids", "valid", {"allowed_token_ids": [5, 6]}),
        ("bad_words", "valid", {"bad_words": ["the"]}),
        ("repetition_detection", "valid", {"repetition_detection": {"max_pattern_size": 2, "min_count": 2}}),
        ("structured_outputs", "valid", {"structured_outputs": {"choice": ["a", "b"]}}),
        ("stream_interval", "valid", {"stream_interval": 2}),
        ("stop", "valid", {"stop": ["x"], "stop_token_ids": [5], "include_stop_str_in_output": True}),
        ("temperature", "invalid", {"temperature": -1}),
    ]
    cases += cases_of("render_cmpl", "/v1/completions/render", rcmpl, render_shared + [
        ("add_special_tokens", "boundary", {"add_special_tokens": False}),
        ("echo", "valid", {"echo": True, "logprobs": 1}),
        ("suffix", "valid", {"suffix": "x"}),
    ], cat="routes")
    cases += cases_of("render_chat", "/v1/chat/completions/render", rchat, render_shared + [
        ("add_special_tokens", "valid", {"add_special_tokens": True}),
        ("return_assistant_tokens_mask", "valid", {"return_assistant_tokens_mask": True}),
        ("chat_template", "valid", {"chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"}),
        ("add_generation_prompt", "boundary", {"add_generation_prompt": False}),
        ("max_completion_tokens", "valid", {"max_completion_tokens": 7}),
    ], cat="routes")

    tool = [WEATHER]
    render_extra = [
        ("echo", "valid", {"echo": True}), ("echo", "boundary", {"echo": False}), ("echo", "invalid", {"echo": "x"}),
        ("logprobs", "valid", {"logprobs": 2}), ("logprobs", "boundary", {"logprobs": 0}),
        ("logprobs", "invalid", {"logprobs": -1}),
        ("truncation_side", "valid", {"truncation_side": "left", "truncate_prompt_tokens": 2}),
        *each("truncation_side", boundary=None, invalid="middle"),
        ("logprob_token_ids", "boundary", {"logprob_token_ids": [], "logprobs": 1}),
        *each("logprob_token_ids", invalid_no_logprobs=[5], invalid=["a"]),
        *each("return_tokens_as_token_ids", valid=True, boundary=None, invalid="x"),
        *each("return_token_ids", valid=True, boundary=None, invalid="x"),
        ("top_logprobs", "valid", {"logprobs": True, "top_logprobs": 2}),
        ("top_logprobs", "boundary", {"logprobs": True, "top_logprobs": 0}),
        ("top_logprobs", "invalid", {"logprobs": True, "top_logprobs": 21}),
        ("max_completion_tokens", "boundary", {"max_completion_tokens": 1}),
        ("tools", "valid", {"tools": tool, "tool_choice": "none"}),
        *each("tools", boundary=None, invalid=[]),
        *each("tool_choice", boundary="none", invalid="required"),
        ("tool_choice", "invalid_no_parser", {"tools": tool, "tool_choice": "auto"}),
        *each("parallel_tool_calls", valid=False, boundary=None, invalid="x"),
        ("add_generation_prompt", "invalid", {"add_generation_prompt": "x"}),
        ("continue_final_message", "valid", {"continue_final_message": True, "add_generation_prompt": False,
                                             "messages": convo + [{"role": "assistant", "content": "Well"}]}),
        ("continue_final_message", "invalid", {"continue_final_message": True}),
        ("documents", "valid", {"documents": [{"title": "a", "text": "b"}]}),
        ("include_reasoning", "boundary", {"include_reasoning": False}),
        ("mm_processor_kwargs", "invalid", {"mm_processor_kwargs": [1]}),
        ("return_assistant_tokens_mask", "boundary", {"return_assistant_tokens_mask": False}),
        ("stream_options", "valid", {"stream": True, "stream_options": {"include_usage": True}}),
    ]

    # the rest of the two request models' fields on the render routes: the valid and invalid values the
    # completion and chat cases use, each field up to three times
    for route, path, base, table in (("render_cmpl", "/v1/completions/render", rcmpl, shared + cmpl_only),
                                     ("render_chat", "/v1/chat/completions/render", rchat, shared + chat_only)):
        seen = {}
        for c_ in cases:
            if c_["path"] == path:
                for k in c_["body"]:
                    seen[k] = seen.get(k, 0) + 1
        entries = [(f"valid_{n}", kw) for n, kw in COMMON_VALID + STRUCTURED + STREAMED] \
            + [(f"invalid_{n}", kw) for n, kw in COMMON_BAD + STRUCTURED_BAD] \
            + [(f"{f}_{kind}", kw) for f, kind, kw in table + render_extra]
        names = {c_["name"] for c_ in cases}
        for kind, kw in entries:
            field = next((k for k in kw if seen.get(k, 0) < 3 and k not in ("model", "max_tokens")), None)
            if field is None or (name := f"field/{route}/{field}_{kind.removeprefix(field + '_')}") in names:
                continue
            names.add(name)
            for k in kw:
                seen[k] = seen.get(k, 0) + 1
            cases.append(_case(name, "routes", path, base(**kw)))

    # /generative_scoring (GenerativeScoringRequest)
    def score(**kw):
        return {"model": MODEL, "query": "To be", "items": ["yes", "no"], "label_token_ids": [413, 308]} | kw

    cases += cases_of("generative_scoring", "/generative_scoring", score, [
        *each("add_special_tokens", boundary=False, valid=True, invalid="maybe"),
        *each("apply_softmax", valid=True, invalid="maybe"),
        *each("item_first", boundary=False, invalid="maybe"),
        *each("priority", boundary=0, valid=3, invalid="high"),
        *each("request_id", valid="score-1", boundary="", invalid=5),
        *each("query", boundary="", invalid=5),
        ("items", "invalid", {"items": "yes"}),
        ("label_token_ids", "invalid", {"label_token_ids": [-1]}),
        ("model", "boundary", {"model": None}),
    ], cat="routes")
    return cases


def server_cases() -> list[dict]:
    cases = (completion_cases() + chat_cases() + streamed_cases() + route_cases() + auth_cases() + tool_cases()
             + round2_cases() + route2_cases() + route3_cases() + responses_cases() + field_cases() + dev_cases()
             + metrics_cases())
    names = [c["name"] for c in cases]
    assert len(names) == len(set(names)), "case names must be unique"
    return cases


if __name__ == "__main__":
    cs = server_cases()
    print(json.dumps({cat: sum(c["cat"] == cat for c in cs) for cat in CATS} | {"total": len(cs)}))
