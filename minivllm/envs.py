"""Every environment variable minivllm reads, in one place: vLLM's vllm/envs.py shape (a dict of getters, read
lazily through the module's __getattr__, so `minivllm.envs.NAME` sees the environment as it is now and a test can
set it). minivllm's own settings are MINIVLLM_*; a vLLM setting minivllm honours keeps its VLLM_* name.
The autograder's and the tests' own variables stay with them."""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    MINIVLLM_MODEL: str | None = None
    MINIVLLM_ENABLE_MULTIPROCESSING: bool = True
    MINIVLLM_ENGINE_READY_TIMEOUT_S: float = 600.0
    MINIVLLM_WORKER_READY_TIMEOUT_S: float = 300.0
    MINIVLLM_EXECUTE_MODEL_TIMEOUT_S: float = 300.0
    MINIVLLM_WORKER_MULTIPROC_METHOD: str = "spawn"
    MINIVLLM_STRUCTURED_OUTPUTS_MAX_BYTES: int = 128 << 10
    MINIVLLM_STRUCTURED_OUTPUTS_MAX_DEPTH: int = 64
    MINIVLLM_GRAMMAR_COMPILE_TIMEOUT_S: float = 30.0
    MINIVLLM_XGRAMMAR_CACHE_MB: int = 512
    VLLM_SERVER_DEV_MODE: bool = False


def _number(name: str, default: str, kind: Callable[[str], Any] = int) -> Callable[[], Any]:
    """A numeric variable; a value that is not a number names the variable in its error."""
    def get() -> Any:
        raw = os.getenv(name, default)
        try:
            return kind(raw)
        except ValueError:
            raise ValueError(f"{name} must be a number, got {raw!r}") from None
    return get


def _choice(name: str, default: str, choices: tuple[str, ...]) -> Callable[[], str]:
    """vLLM's env_with_choices: anything outside `choices` is an error naming the variable."""
    def get() -> str:
        value = os.getenv(name, default)
        if value not in choices:
            raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
        return value
    return get


def _int_flag(name: str, default: str) -> Callable[[], bool]:
    """vLLM's bool(int(os.getenv(...))): any integer but 0 is on; a non-integer is an error naming the variable."""
    def get() -> bool:
        raw = os.getenv(name, default)
        try:
            return bool(int(raw))
        except ValueError:
            raise ValueError(f"{name} must be an integer (0 or 1), not {raw!r}") from None
    return get


environment_variables: dict[str, Callable[[], Any]] = {
    # The checkpoint an engine loads when none is given (None: the tiny model in data/, config.DEFAULT_MODEL).
    "MINIVLLM_MODEL": lambda: os.getenv("MINIVLLM_MODEL") or None,
    # 0/false/no: the EngineCore runs in the caller's process (vLLM: VLLM_ENABLE_V1_MULTIPROCESSING).
    "MINIVLLM_ENABLE_MULTIPROCESSING": lambda: (
        os.getenv("MINIVLLM_ENABLE_MULTIPROCESSING", "1").lower() not in ("0", "false", "no")),
    # Seconds the client waits for the EngineCore process's READY (vLLM: VLLM_ENGINE_READY_TIMEOUT_S).
    "MINIVLLM_ENGINE_READY_TIMEOUT_S": _number("MINIVLLM_ENGINE_READY_TIMEOUT_S", "600", float),
    # Seconds the executor waits for its workers' READY.
    "MINIVLLM_WORKER_READY_TIMEOUT_S": _number("MINIVLLM_WORKER_READY_TIMEOUT_S", "300", float),
    # Seconds one collective RPC waits for every worker (vLLM: VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS).
    "MINIVLLM_EXECUTE_MODEL_TIMEOUT_S": _number("MINIVLLM_EXECUTE_MODEL_TIMEOUT_S", "300", float),
    # How workers start (vLLM: VLLM_WORKER_MULTIPROC_METHOD); fork lets them see layers patched in memory.
    "MINIVLLM_WORKER_MULTIPROC_METHOD": _choice("MINIVLLM_WORKER_MULTIPROC_METHOD", "spawn", ("spawn", "fork")),
    # Structured-output limits (config.StructuredOutputsConfig says what each bounds).
    "MINIVLLM_STRUCTURED_OUTPUTS_MAX_BYTES": _number("MINIVLLM_STRUCTURED_OUTPUTS_MAX_BYTES", str(128 << 10)),
    "MINIVLLM_STRUCTURED_OUTPUTS_MAX_DEPTH": _number("MINIVLLM_STRUCTURED_OUTPUTS_MAX_DEPTH", "64"),
    "MINIVLLM_GRAMMAR_COMPILE_TIMEOUT_S": _number("MINIVLLM_GRAMMAR_COMPILE_TIMEOUT_S", "30", float),
    # Compiled-grammar cache in MiB (vLLM: VLLM_XGRAMMAR_CACHE_MB).
    "MINIVLLM_XGRAMMAR_CACHE_MB": _number("MINIVLLM_XGRAMMAR_CACHE_MB", "512"),
    # vLLM's development routes (entrypoints/serve_dev.py), read as vLLM reads it.
    "VLLM_SERVER_DEV_MODE": _int_flag("VLLM_SERVER_DEV_MODE", "0"),
}


def __getattr__(name: str) -> Any:
    """Read lazily, as vLLM's envs do (minivllm has no enable_envs_cache: nothing here is on a hot path)."""
    if name in environment_variables:
        return environment_variables[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return list(environment_variables)


def is_set(name: str) -> bool:
    """Whether the variable is set in the environment, as vLLM's envs.is_set."""
    if name in environment_variables:
        return name in os.environ
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
