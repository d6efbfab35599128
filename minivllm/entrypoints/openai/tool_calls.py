"""Tool calls in chat completions, as vLLM returns them (vllm/parser/abstract_parser.py
DelegatingParser._extract_tool_calls, vllm/tool_parsers/streaming.py, vllm/tool_parsers/pythonic_tool_parser.py).

A named `tool_choice` or `"required"` constrains the reply to the tool's JSON schema (protocol.tool_json_schema,
through structured outputs), so the reply *is* the call: named -> one call whose arguments are the text;
required -> a JSON array of {name, parameters}. `"auto"` needs `--enable-auto-tool-choice` and a
`--tool-call-parser`: minivllm has vLLM's `pythonic` one (`[f(a=1), g(b="x")]`, which any tokenizer can spell;
the others need model-specific special tokens the shipped tokenizer does not have).
"""
from __future__ import annotations

import ast
import json
import re
import uuid

from minivllm.entrypoints.openai.protocol import ChatCompletionNamedToolChoiceParam, ChatCompletionRequest

TOOL_CALL_PARSERS = ("pythonic",)

# vLLM's PythonicToolParser.TOOL_CALL_REGEX: a list of calls with keyword arguments only.
_PYTHONIC = re.compile(r"\[([a-zA-Z]+\w*\(([a-zA-Z]+\w*=.*,\s*)*([a-zA-Z]+\w*=.*\s)?\),\s*)*([a-zA-Z]+\w*\("
                       r"([a-zA-Z]+\w*=.*,\s*)*([a-zA-Z]+\w*=.*\s*)?\)\s*)+\]", re.DOTALL)
_JSON_NAMES = {"null": None, "true": True, "false": False}


def tool_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def tool_call(name: str, arguments: str) -> dict:
    return {"id": tool_call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}


def _literal(node: ast.expr):
    """A Python literal, or JSON's null/true/false spelled as names (vLLM's get_parameter_value)."""
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.Dict):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values, strict=True)}
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e) for e in node.elts]
    return ast.literal_eval(node)


def _dotted(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return f"{_dotted(func.value)}.{func.attr}"
    raise ValueError("tool call name is not a name")


def _calls(text: str) -> list[dict] | None:
    try:
        parsed = getattr(ast.parse(text).body[0], "value", None)
        if not isinstance(parsed, ast.List) or not all(isinstance(e, ast.Call) for e in parsed.elts):
            return None
        return [tool_call(_dotted(c.func), json.dumps({k.arg: _literal(k.value) for k in c.keywords},
                                                      ensure_ascii=False)) for c in parsed.elts]
    except (SyntaxError, ValueError, IndexError):
        return None


def parse_pythonic(text: str) -> list[dict] | None:
    """`[f(a=1), g(b="x")]` -> tool calls (arguments as JSON text); None when the text is not such a list."""
    return _calls(text) if _PYTHONIC.match(text) is not None else None


def _closed(text: str) -> tuple[str, str]:
    """A prefix of a pythonic call list made parseable: (text + the quote and brackets it still needs, those)."""
    stack, quote, escaped = [], None, False
    for ch in text:
        if quote:
            escaped, quote = (False, quote) if escaped else (ch == "\\", None if ch == quote else quote)
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            stack.append({"(": ")", "[": "]", "{": "}"}[ch])
        elif ch in ")]}" and stack:
            stack.pop()
    added = (quote or "") + "".join(reversed(stack))
    return text + added, added


def extract(req: ChatCompletionRequest, text: str, auto_parser: str | None) -> tuple[list[dict] | None, str | None]:
    """(tool calls or None, content) of a finished reply. None: no tool handling (a plain message)."""
    if isinstance(req.tool_choice, ChatCompletionNamedToolChoiceParam):
        return ([tool_call(req.tool_choice.function.name, text)] if text.strip() else []), None
    if req.tool_choice == "required":
        try:
            calls = json.loads(text)
            calls = [tool_call(c["name"], json.dumps(c["parameters"], ensure_ascii=False)) for c in calls]
        except (ValueError, TypeError, KeyError):
            calls = []
        return calls, None
    if req.tools and req.tool_choice == "auto" and auto_parser:
        calls = parse_pythonic(text)
        return (calls, None) if calls else (None, text)
    return None, text


def finish_reason(req: ChatCompletionRequest, calls: list | None, reason: str | None) -> str | None:
    """OpenAI's rule, as vLLM applies it: "tool_calls" after auto calls or a required call that stopped;
    a named call keeps "stop"."""
    if (req.tool_choice == "auto" and calls) or (req.tool_choice == "required" and reason == "stop"):
        return "tool_calls"
    return reason


def message(req: ChatCompletionRequest, role: str, text: str, auto_parser: str | None) -> tuple[dict, list | None]:
    """The reply's message fields: content, and tool_calls only when calls were made or forced (vLLM drops an
    empty list); parallel_tool_calls=false keeps the first call."""
    calls, content = extract(req, text, auto_parser)
    msg = {"role": role, "content": content if not req.forced_tool else (content or "")}
    if calls is not None and req.parallel_tool_calls is False:
        calls = calls[:1]
    if calls:
        msg["tool_calls"] = calls
    return msg, calls


def _json_scan(text: str):
    """Each character of JSON text, with the brace depth and whether a string is open, after it."""
    level, in_string, escaped = 0, False, False
    for ch in text:
        if escaped:
            escaped = False
        elif in_string:
            escaped, in_string = ch == "\\", ch != '"'
        elif ch == '"':
            in_string = True
        elif ch in "{}":
            level += 1 if ch == "{" else -1
        yield ch, level, in_string


def _inside_calls(delta: str, previous: str) -> str:
    """The part of `delta` inside a call object of the "required" array: the array's brackets, the commas
    between calls and each call's closing brace are no argument text (vLLM's filter_delta_text)."""
    out = []
    for i, (ch, level, in_string) in enumerate(_json_scan(previous + delta)):
        if i >= len(previous):
            if level != 0:
                out.append(ch)
            elif not in_string and ch == ",":
                break
    return "".join(out)


def _object_starts(text: str) -> list[int]:
    """Where each top-level object of a JSON array (text so far) begins."""
    return [i for i, (ch, level, in_string) in enumerate(_json_scan(text)) if ch == "{" and level == 1
            and not in_string]


class StreamState:
    """One choice's tool-call deltas while streaming (vLLM's extract_named/required_tool_call_streaming and the
    pythonic parser): the first delta of a call carries id, type and name, later ones only argument text."""

    def __init__(self, req: ChatCompletionRequest, auto_parser: str | None) -> None:
        self.req, self.auto = req, auto_parser if req.tools and req.tool_choice == "auto" else None
        self.text, self.name_sent, self.calls_streamed = "", False, False
        self.required_index = -1
        self.sent_args: list[str] = []  # pythonic: the argument text streamed per call
        self.done_calls = 0  # pythonic: calls seen complete (vLLM's current_tool_index)

    def delta(self, text: str, finished: bool) -> dict | None:
        """The delta message for this piece of text (None: nothing to send yet)."""
        previous, self.text = self.text, self.text + text
        req = self.req
        if isinstance(req.tool_choice, ChatCompletionNamedToolChoiceParam):
            return self._call_delta(0, req.tool_choice.function.name, text)
        if req.tool_choice == "required":
            return self._required(previous, text)
        if self.auto is not None and self.text.startswith("["):
            return self._pythonic(finished)
        return {"content": text}

    def _pythonic(self, finished: bool) -> dict | None:
        """vLLM's PythonicToolParser.extract_tool_calls_streaming (vllm/tool_parsers/pythonic_tool_parser.py:117-196):
        the list so far is closed and parsed; a call still open withholds the JSON its closing adds (its string's
        quote and the final brace), so arguments grow as a prefix. Calls seen complete are not looked at again
        (current_tool_index); once the list is closed and every call went out, each further delta is an empty
        content delta. parallel_tool_calls=false then drops the later calls' deltas, leaving an empty delta
        (vllm/entrypoints/serve/utils/tool_calls_utils.py:19-37)."""
        text, added = (self.text, "") if finished else _closed(self.text)
        calls = _calls(text)
        if calls is None:
            return None
        deltas = []
        for i, call in enumerate(calls):
            if i < self.done_calls:
                continue
            complete = i < len(calls) - 1 or ")]" not in added
            self.done_calls = i + complete
            args = call["function"]["arguments"]
            if not complete and added.endswith(")]"):  # still open: withhold what closing it added
                withheld = added[:-2].replace("'", '"') + "}"
                args = args[:-len(withheld)] if args.endswith(withheld) else args
            if i == len(self.sent_args):
                self.sent_args.append(args)
                deltas.append({"id": call["id"], "type": "function", "index": i,
                               "function": {"name": call["function"]["name"], "arguments": args}})
            elif args.startswith(self.sent_args[i]) and len(args) > len(self.sent_args[i]):
                deltas.append({"id": None, "index": i, "function": {"arguments": args[len(self.sent_args[i]):]}})
                self.sent_args[i] = args
        if deltas:
            self.calls_streamed = True
            if self.req.parallel_tool_calls is False:
                deltas = [d for d in deltas if d["index"] == 0]
            return {"tool_calls": deltas} if deltas else {}
        if not added and self.done_calls > 0:
            return {"content": ""}
        return None

    def finish_reason(self, reason: str | None) -> str | None:
        """vLLM's streaming rule (unlike its non-streaming one): "tool_calls" once any call went out, unless the
        call was named."""
        if reason is not None and self.calls_streamed and self.req.tool_choice in ("auto", "required"):
            return "tool_calls"
        return reason

    def _call_delta(self, index: int, name: str | None, arguments: str) -> dict:
        self.calls_streamed = True
        if self.name_sent:
            return {"tool_calls": [{"index": index, "function": {"arguments": arguments}}]}
        self.name_sent = True
        return {"tool_calls": [{"id": tool_call_id(), "type": "function", "index": index,
                                "function": {"name": name, "arguments": arguments}}]}

    def _required(self, previous: str, text: str) -> dict | None:
        """vLLM's extract_required_tool_call_streaming (vllm/tool_parsers/streaming.py:127-222): the call is the
        array's last object begun (its index); its name goes out once the value of its "parameters" has begun,
        with that value so far; then the argument text as it comes. An object whose name and parameters have not
        both begun sends nothing yet."""
        starts = _object_starts(self.text)
        index = len(starts) - 1
        if index < 0:
            return None
        if index != self.required_index:
            m = re.search(r'"name"\s*:\s*"([^"]*)"\s*,\s*"parameters"\s*:\s*(?=\S)', self.text[starts[index]:])
            if m is None:
                return None
            self.required_index, self.name_sent = index, False
            if self.req.parallel_tool_calls is False and index > 0:
                return None
            return self._call_delta(index, m.group(1), self.text[starts[index] + m.end():])
        text = _inside_calls(text, previous)
        if not text or (self.req.parallel_tool_calls is False and index > 0):
            return None
        return {"tool_calls": [{"index": index, "function": {"name": None, "arguments": text}}]}
