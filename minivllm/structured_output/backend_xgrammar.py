"""The xgrammar backend (vLLM: v1/structured_output/backend_xgrammar.py), vLLM's default grammar engine.

XgrammarBackend compiles a key into an xgrammar CompiledGrammar (tokenizer-specific: which tokens can
follow which grammar state); XgrammarGrammar wraps one request's GrammarMatcher, the per-request state
that fills bitmask rows and advances with each accepted token. validate_xgrammar_grammar runs in the
frontend, so a schema, regex or grammar xgrammar cannot build is a ValueError (HTTP 400) there.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch

# jsonschema at import, not on first use: two tokenizer threads importing it at once meet its circular import
# half done ("cannot import name ... from partially initialized module").
from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for

from minivllm.exceptions import VLLMValidationError
from minivllm.sampling_params import SamplingParams
from minivllm.structured_output.backend_types import StructuredOutputKey, StructuredOutputOptions
from minivllm.structured_output.utils import choice_as_grammar, xgrammar_error


@dataclass
class XgrammarBackend:
    """One GrammarCompiler over the model's tokenizer; compile() is thread-safe and runs in the compile pool."""

    tokenizer: object
    vocab_size: int
    compiler: object = field(init=False, repr=False)

    def __post_init__(self) -> None:
        import xgrammar as xgr
        # vocab_size is the logits width (the model's), which may exceed len(tokenizer) (padded rows).
        info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab_size)
        # The manager caches compiled grammars by key, so xgrammar's own cache would only duplicate it.
        self.compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)

    def compile(self, key: StructuredOutputKey):
        """key -> xgrammar CompiledGrammar (shared by every request with this key).

        A grammar that allows no first token and cannot end (it matches nothing this tokenizer can
        produce) is a ValueError here, so its request ends with an error before sampling anything.
        """
        import xgrammar as xgr
        compiled = self._compile(key)
        bitmask = xgr.allocate_token_bitmask(1, self.vocab_size)
        xgr.GrammarMatcher(compiled).fill_next_token_bitmask(bitmask, 0)
        if not bitmask.any():
            raise ValueError("the constraint matches no output this tokenizer can produce")
        return compiled

    def _compile(self, key: StructuredOutputKey):
        kind, spec, any_whitespace = key
        if kind == StructuredOutputOptions.JSON:
            return self.compiler.compile_json_schema(spec, any_whitespace=any_whitespace)
        if kind == StructuredOutputOptions.JSON_OBJECT:
            return self.compiler.compile_json_schema('{"type": "object"}', any_whitespace=any_whitespace)
        if kind == StructuredOutputOptions.REGEX:
            return self.compiler.compile_regex(spec)
        if kind == StructuredOutputOptions.CHOICE:  # vLLM rewrites choice into grammar in the frontend
            return self.compiler.compile_grammar(choice_as_grammar(json.loads(spec)))
        if kind == StructuredOutputOptions.GRAMMAR:
            return self.compiler.compile_grammar(spec)
        if kind == StructuredOutputOptions.STRUCTURAL_TAG:
            return self.compiler.compile_structural_tag(spec)
        raise ValueError(f"unsupported structured output kind {kind!r}")

    def grammar(self, compiled) -> XgrammarGrammar:
        """A fresh matcher (per-request state) over a shared compiled grammar."""
        import xgrammar as xgr
        return XgrammarGrammar(xgr.GrammarMatcher(compiled), self.vocab_size)

    def allocate_token_bitmask(self, max_num_seqs: int) -> torch.Tensor:
        """int32 [max_num_seqs, ceil(vocab / 32)]: bit j of word w allows token 32 * w + j."""
        import xgrammar as xgr
        return xgr.allocate_token_bitmask(max_num_seqs, self.vocab_size)


@dataclass
class XgrammarGrammar:
    """One request's matcher: which tokens may come next, and the state after each accepted one."""

    matcher: object
    vocab_size: int
    num_processed_tokens: int = 0
    _is_terminated: bool = False

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        """Advance over tokens; False (state unchanged past the bad token) if one is not allowed."""
        if self._is_terminated:
            return False
        for token in tokens:
            if not self.matcher.accept_token(token):
                return False
            self.num_processed_tokens += 1
        self._is_terminated = self.matcher.is_terminated()
        return True

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        """The longest accepted prefix of tokens, without advancing (for speculative drafts)."""
        accepted = []
        for token in tokens:
            if not self.matcher.accept_token(token):
                break
            accepted.append(token)
        if accepted:
            self.matcher.rollback(len(accepted))
        return accepted

    def rollback(self, num_tokens: int) -> None:
        self.matcher.rollback(num_tokens)
        self.num_processed_tokens -= num_tokens
        self._is_terminated = self.matcher.is_terminated()

    def fill_bitmask(self, bitmask: torch.Tensor, idx: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, idx)

    def is_terminated(self) -> bool:
        return self._is_terminated

    def reset(self) -> None:
        self.num_processed_tokens = 0
        self._is_terminated = False
        self.matcher.reset()


# JSON-schema string formats xgrammar understands (vLLM keeps the same list).
STRING_SUPPORTED_FORMATS = {"email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid",
                            "uri", "uri-reference", "uri-template", "json-pointer", "relative-json-pointer"}


def unsupported_json_feature(schema) -> str | None:
    """The first JSON-schema keyword xgrammar would silently ignore, or None (vLLM: has_xgrammar_unsupported_json_features)."""
    if isinstance(schema, list):
        return next((f for f in map(unsupported_json_feature, schema) if f), None)
    if not isinstance(schema, dict):
        return None
    kind = schema.get("type")
    if kind in ("integer", "number") and "multipleOf" in schema:
        return "multipleOf"
    if kind == "array":
        for key in ("uniqueItems", "contains", "minContains", "maxContains"):
            if key in schema:
                return key
    if kind == "string" and "format" in schema and schema["format"] not in STRING_SUPPORTED_FORMATS:
        return f"format {schema['format']!r}"
    if kind == "object":
        for key in ("patternProperties", "propertyNames"):
            if key in schema:
                return key
    return next((f for f in map(unsupported_json_feature, schema.values()) if f), None)


def json_text_depth(text: str) -> int:
    """The deepest nesting of objects and arrays in JSON text, counted without parsing (so no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def json_value_depth(value) -> int:
    """The deepest nesting of dicts and lists in a parsed value, walked with a stack (no recursion)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = v.values()
        elif not isinstance(v, list):
            continue
        deepest = max(deepest, d)
        stack.extend((c, d + 1) for c in v if isinstance(c, (dict, list)))
    return deepest


def _check_size(name: str, spec: str, config) -> None:
    size = len(spec.encode("utf-8", "surrogatepass"))
    if size > config.max_spec_bytes:
        raise VLLMValidationError(f"structured_outputs.{name} is {size} bytes, more than the server's limit of "
                                  f"{config.max_spec_bytes} bytes (MINIVLLM_STRUCTURED_OUTPUTS_MAX_BYTES)",
                                  f"structured_outputs.{name}", size)


def _check_depth(depth: int, config) -> None:
    if depth > config.max_json_depth:
        raise VLLMValidationError(f"structured_outputs.json: the schema is nested more than {config.max_json_depth} "
                                  f"levels deep (MINIVLLM_STRUCTURED_OUTPUTS_MAX_DEPTH)", "structured_outputs.json",
                                  depth)


def validate_xgrammar_grammar(sampling_params: SamplingParams, config=None) -> None:
    """Build (not compile) the request's grammar; a ValueError names the field and xgrammar's complaint.

    Also the limits of StructuredOutputsConfig (size, JSON depth) and a grammar that matches nothing, so
    such a request is a 400 before anything is sampled. Unlike vLLM, it never rewrites the params (vLLM turns
    choice into grammar here); the key does that. Lark grammars are not converted: `grammar` must be EBNF.
    """
    params = sampling_params.structured_outputs
    if params is None:
        return
    import xgrammar as xgr
    if config is None:
        from minivllm.config import StructuredOutputsConfig
        config = StructuredOutputsConfig()
    if params.json_object is not None and params.json_object is not True:
        raise ValueError("structured_outputs.json_object must be true when given")
    if params.whitespace_pattern is not None:
        raise ValueError("structured_outputs.whitespace_pattern is not supported by the xgrammar backend")
    if params.json is not None:
        schema = params.json
        if isinstance(schema, str):
            _check_size("json", schema, config)
            _check_depth(json_text_depth(schema), config)
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise VLLMValidationError(f"structured_outputs.json: the schema is not valid JSON: {e}",
                                          "structured_outputs.json") from None
        else:
            _check_depth(json_value_depth(schema), config)
        if not isinstance(schema, (dict, bool)):
            raise ValueError(f"structured_outputs.json: a schema is an object, got {type(schema).__name__}")
        text = json.dumps(schema)
        _check_size("json", text, config)
        try:
            validator_for(schema).check_schema(schema)
        except SchemaError as e:
            raise ValueError(f"structured_outputs.json: invalid JSON schema: {e.message}") from None
        feature = unsupported_json_feature(schema)
        if feature:
            raise ValueError(f"structured_outputs.json: the schema uses {feature}, which xgrammar does not support")
        _build("json", xgr.Grammar.from_json_schema, text)
    elif params.regex is not None:
        _check_size("regex", params.regex, config)
        _build("regex", xgr.Grammar.from_regex, params.regex)
    elif params.choice is not None:
        if not params.choice:
            raise ValueError("structured_outputs.choice must not be empty")
        grammar = choice_as_grammar(params.choice)
        _check_size("choice", grammar, config)
        _build("choice", xgr.Grammar.from_ebnf, grammar)
    elif params.grammar is not None:
        _check_size("grammar", params.grammar, config)
        _build("grammar", xgr.Grammar.from_ebnf, params.grammar)
    elif params.structural_tag is not None:
        _check_size("structural_tag", params.structural_tag, config)
        _build("structural_tag", xgr.Grammar.from_structural_tag, params.structural_tag)


def _build(name: str, build, spec: str) -> None:
    try:
        grammar = build(spec)
    except Exception as e:  # xgrammar raises RuntimeError (and a few others) with a C++ location prefix
        raise VLLMValidationError(f"structured_outputs.{name}: {xgrammar_error(e)}",
                                  f"structured_outputs.{name}") from None
    if not grammar_matches_something(grammar):
        raise VLLMValidationError(f"structured_outputs.{name}: the constraint matches no output at all (e.g. a $ref "
                                  "cycle with no value, or an empty character class)", f"structured_outputs.{name}")


_BYTE_COMPILER = None


def grammar_matches_something(grammar) -> bool:
    """Whether any string (the empty one included) is in the grammar's language, tokenizer-independently.

    Compiled over a vocabulary of the 256 single bytes plus a stop token: a language with a word in it
    allows some byte (its first) or the stop token (the empty word) in the matcher's initial state.
    """
    global _BYTE_COMPILER
    import xgrammar as xgr
    if _BYTE_COMPILER is None:
        info = xgr.TokenizerInfo([bytes([i]) for i in range(256)] + [b"</s>"], xgr.VocabType.RAW, vocab_size=257,
                                 stop_token_ids=[256])
        _BYTE_COMPILER = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    try:
        matcher = xgr.GrammarMatcher(_BYTE_COMPILER.compile_grammar(grammar))
    except Exception:
        return True  # a grammar this check cannot compile is left to the engine's compile (and its error)
    bitmask = xgr.allocate_token_bitmask(1, 257)
    matcher.fill_next_token_bitmask(bitmask, 0)
    return bool(bitmask.any())
