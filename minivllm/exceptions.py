"""Errors about a request's input (vLLM: vllm/exceptions.py)."""
from __future__ import annotations


class VLLMValidationError(ValueError):
    """A bad request field: the server answers 400 with `param` set to the field's name (or null)."""

    def __init__(self, message: str, parameter: str | None = None, value: object = None) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.value = value


class StartupError(RuntimeError):
    """The server or engine could not start; the CLI prints it as one line and exits 1."""
