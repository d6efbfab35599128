"""What a structured-output request asks for, as a hashable key (vLLM: v1/structured_output/backend_types.py)."""
from __future__ import annotations

import enum


class StructuredOutputOptions(enum.Enum):
    """The kind of constraint; with its spec string (and whitespace option) it is the compile-cache key."""

    JSON = enum.auto()
    JSON_OBJECT = enum.auto()
    REGEX = enum.auto()
    GRAMMAR = enum.auto()
    CHOICE = enum.auto()
    STRUCTURAL_TAG = enum.auto()


StructuredOutputKey = tuple[StructuredOutputOptions, str, bool]  # kind, spec, any_whitespace
