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
        """key -> xgrammar CompiledGrammar (shared by every request with this key)."""
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


def validate_xgrammar_grammar(sampling_params: SamplingParams) -> None:
    """Build (not compile) the request's grammar; a ValueError names the field and xgrammar's complaint.

    Unlike vLLM, it never rewrites the params (vLLM turns choice into grammar here); the key does that.
    Lark grammars are not converted: `grammar` must be xgrammar's EBNF.
    """
    params = sampling_params.structured_outputs
    if params is None:
        return
    import xgrammar as xgr
    if params.json_object is not None and params.json_object is not True:
        raise ValueError("structured_outputs.json_object must be true when given")
    if params.whitespace_pattern is not None:
        raise ValueError("structured_outputs.whitespace_pattern is not supported by the xgrammar backend")
    if params.json is not None:
        schema = params.json
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ValueError(f"structured_outputs.json: the schema is not valid JSON: {e}") from None
        if not isinstance(schema, (dict, bool)):
            raise ValueError(f"structured_outputs.json: a schema is an object, got {type(schema).__name__}")
        from jsonschema.exceptions import SchemaError
        from jsonschema.validators import validator_for
        try:
            validator_for(schema).check_schema(schema)
        except SchemaError as e:
            raise ValueError(f"structured_outputs.json: invalid JSON schema: {e.message}") from None
        feature = unsupported_json_feature(schema)
        if feature:
            raise ValueError(f"structured_outputs.json: the schema uses {feature}, which xgrammar does not support")
        _build("json", xgr.Grammar.from_json_schema, json.dumps(schema))
    elif params.regex is not None:
        _build("regex", xgr.Grammar.from_regex, params.regex)
    elif params.choice is not None:
        if not params.choice:
            raise ValueError("structured_outputs.choice must not be empty")
        _build("choice", xgr.Grammar.from_ebnf, choice_as_grammar(params.choice))
    elif params.grammar is not None:
        _build("grammar", xgr.Grammar.from_ebnf, params.grammar)
    elif params.structural_tag is not None:
        _build("structural_tag", xgr.Grammar.from_structural_tag, params.structural_tag)


def _build(name: str, build, spec: str) -> None:
    try:
        build(spec)
    except Exception as e:  # xgrammar raises RuntimeError (and a few others) with a C++ location prefix
        raise ValueError(f"structured_outputs.{name}: {xgrammar_error(e)}") from None
