"""The requests of the server comparison (server_diff.py): minivllm's OpenAI server against vLLM 0.27.1's.

Written from vLLM 0.27.1's request models (vllm/entrypoints/openai/completion/protocol.py CompletionRequest,
chat_completion/protocol.py ChatCompletionRequest, engine/protocol.py StreamOptions, the /tokenize and
/detokenize models in vllm/entrypoints/serve/tokenize/protocol.py) and its routes (api_server.py and the
api_router.py files): every request field, streamed and not, with valid, boundary and invalid values,
structured outputs, the API key, every route and unknown ones.

A case: name, cat (valid | streamed | structured | bad_input | routes | auth | metrics), method, path, and a
JSON body (or raw bytes in `raw`, headers in `headers`). Both servers run with --api-key API_KEY, so every case
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
CATS = ("valid", "streamed", "structured", "bad_input", "routes", "auth", "metrics")


def _case(name, cat, path, body=None, method="POST", **kw) -> dict:
    c = {"name": name, "cat": cat, "method": method, "path": path}
    if body is not None:
        c["body"] = body
    c.update(kw)
    return c


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
    ("all_penalties", {"presence_penalty": 0.3, "frequency_penalty": 0.4, "repetition_penalty": 1.1,
                       "max_tokens": 16}),
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
    ("use_beam_search_false", {"use_beam_search": False}), ("add_special_tokens_false",
                                                          {"add_special_tokens": False}),
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
        _case("auth/lowercase_bearer", "auth", "/v1/completions", body,
              headers={"Authorization": f"bearer {API_KEY}"}),
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


def metrics_cases() -> list[dict]:
    """Sent last, after every other case, so each family has seen traffic."""
    return [_case("metrics/families", "metrics", "/metrics", method="GET")]


def server_cases() -> list[dict]:
    cases = completion_cases() + chat_cases() + streamed_cases() + route_cases() + auth_cases() + metrics_cases()
    names = [c["name"] for c in cases]
    assert len(names) == len(set(names)), "case names must be unique"
    return cases


if __name__ == "__main__":
    cs = server_cases()
    print(json.dumps({cat: sum(c["cat"] == cat for c in cs) for cat in CATS} | {"total": len(cs)}))
