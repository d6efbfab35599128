"""Errors the frontend raises about the engine (vLLM: v1/engine/exceptions.py)."""
from __future__ import annotations


class EngineDeadError(RuntimeError):
    """The EngineCore process died; every in-flight and future request fails with this."""

    def __init__(self, message: str = "EngineCore process died unexpectedly; see its log above for the cause. "
                                      "Restart the engine.") -> None:
        super().__init__(message)


class EngineGenerateError(RuntimeError):
    """One request failed in the frontend (bad output handling); the engine itself is still alive."""
