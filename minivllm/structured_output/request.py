"""StructuredOutputRequest: one request's grammar, compiling or compiled (vLLM: v1/structured_output/request.py).

The grammar starts as a Future from the compile pool; the scheduler polls it (never blocks) while the
request sits in WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR, and then holds the per-request matcher.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import time
from concurrent.futures import Future

from minivllm.sampling_params import SamplingParams, StructuredOutputsParams
from minivllm.structured_output.backend_types import StructuredOutputKey, StructuredOutputOptions


@dataclasses.dataclass
class StructuredOutputRequest:
    """The params, and the grammar: a Future while compiling, then a grammar object or the compile error."""

    params: StructuredOutputsParams
    _grammar: Future | object | Exception | None = None
    compile_deadline: float | None = None  # time.monotonic() past which a still-compiling grammar is an error
    compile_timeout_s: float | None = None

    @staticmethod
    def from_sampling_params(sampling_params: SamplingParams | None) -> StructuredOutputRequest | None:
        params = sampling_params.structured_outputs if sampling_params is not None else None
        if params is None or params.all_constraints_none():
            return None
        return StructuredOutputRequest(params)

    def _check_grammar_completion(self) -> bool:
        if isinstance(self._grammar, Future):
            if not self._grammar.done():
                if self.compile_deadline is None or time.monotonic() < self.compile_deadline:
                    return False
                self._grammar = TimeoutError(f"the grammar did not compile within {self.compile_timeout_s:g} s "
                                             "(MINIVLLM_GRAMMAR_COMPILE_TIMEOUT_S)")
                return True
            error = self._grammar.exception()
            self._grammar = error if error is not None else self._grammar.result()
        return True

    @property
    def is_grammar_ready(self) -> bool:
        return self._check_grammar_completion()

    @property
    def grammar(self):
        """The compiled grammar, the compile error, or None while it is still compiling."""
        return self._grammar if self._check_grammar_completion() else None

    @grammar.setter
    def grammar(self, grammar) -> None:
        self._grammar = grammar

    @functools.cached_property
    def structured_output_key(self) -> StructuredOutputKey:
        return get_structured_output_key(self.params)


def get_structured_output_key(params: StructuredOutputsParams) -> StructuredOutputKey:
    """(kind, spec, any_whitespace): equal keys compile to the same grammar and share one cache entry.

    vLLM's key is (kind, spec) with whitespace a server-wide option; minivllm honours the request's
    disable_any_whitespace, so it is part of the key.
    """
    any_ws = not params.disable_any_whitespace
    if params.json is not None:
        spec = params.json if isinstance(params.json, str) else json.dumps(params.json)
        return StructuredOutputOptions.JSON, spec, any_ws
    if params.json_object:
        return StructuredOutputOptions.JSON_OBJECT, "", any_ws
    if params.regex is not None:
        return StructuredOutputOptions.REGEX, params.regex, any_ws
    if params.choice is not None:
        return StructuredOutputOptions.CHOICE, json.dumps(params.choice), any_ws
    if params.grammar is not None:
        return StructuredOutputOptions.GRAMMAR, params.grammar, any_ws
    if params.structural_tag is not None:
        return StructuredOutputOptions.STRUCTURAL_TAG, params.structural_tag, any_ws
    raise ValueError("no valid structured output parameter found")
