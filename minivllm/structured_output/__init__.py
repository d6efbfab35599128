"""StructuredOutputManager (vLLM: v1/structured_output/__init__.py): grammar bitmasks for constrained decoding.

Lesson 8 fills this in; until a request carries a grammar, grammar_bitmask() returns None at once,
so the phase costs nothing but still has its place in the step.
"""
from __future__ import annotations

from minivllm.core.sched.output import SchedulerOutput


class StructuredOutputManager:
    """Computes the next-token bitmask of every grammar-constrained request in a step."""

    def __init__(self) -> None:
        self.grammars: dict[str, object] = {}

    def grammar_bitmask(self, scheduler_output: SchedulerOutput):
        if not scheduler_output.structured_output_request_ids:
            return None
        raise NotImplementedError("structured outputs arrive with lesson 8")
