"""The grading limits: one per-cell time limit and one memory cap, shared by nbgrader and the self-check.

    CELL_TIMEOUT_S   120 s    env MINIVLLM_CELL_TIMEOUT      nbgrader's c.Execute.timeout; each check call
                                                            (in the kernel and in the sandbox); the sandbox's
                                                            own kill deadline per part
    MEMORY_LIMIT_MB  6144 MiB env MINIVLLM_MEMORY_LIMIT_MB  RLIMIT_AS of every nbgrader kernel `grade` starts
                                                            and of every sandbox process (0 = no cap)

Every cell of the lessons runs in seconds on a 2-core CPU (the slowest, lesson 2's real-engine check, ~5 s);
120 s is a wrong answer that loops. A solution process peaks at ~1.3 GB of address space; 6 GiB is a wrong
answer that grows without bound. The values are read when used, so a test can set the environment.

The memory cap is an address-space limit: with a CUDA device visible it is not applied (the CUDA driver
reserves far more address space than it uses); there the sandbox's time limit still bounds a run.
"""
from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import threading

DEFAULT_CELL_TIMEOUT_S = 120.0
DEFAULT_MEMORY_LIMIT_MB = 6144


def cell_timeout() -> float:
    return float(os.environ.get("MINIVLLM_CELL_TIMEOUT", DEFAULT_CELL_TIMEOUT_S))


def memory_limit_mb() -> int:
    return int(os.environ.get("MINIVLLM_MEMORY_LIMIT_MB", DEFAULT_MEMORY_LIMIT_MB))


def _cuda_visible() -> bool:
    return shutil.which("nvidia-smi") is not None or os.path.exists("/dev/nvidia0")


def limit_memory() -> None:
    """Cap this process's address space (inherited by every process it starts). Meant as a preexec_fn."""
    mb = memory_limit_mb()
    if mb <= 0 or _cuda_visible():
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = mb * 2**20
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def timeout_message(seconds: float) -> str:
    return (f"超时：运行超过 {seconds:g} s 仍未结束（每个单元格的时限，设置 MINIVLLM_CELL_TIMEOUT），"
            "检查是否有死循环或等待。")


def memory_message() -> str:
    return (f"内存超限：超过 {memory_limit_mb()} MiB（设置 MINIVLLM_MEMORY_LIMIT_MB），"
            "检查是否有无限增长的列表或张量。")


class LimitExceeded(AssertionError):
    """A check ran past CELL_TIMEOUT_S or MEMORY_LIMIT_MB; its message names the limit."""


_depth = threading.local()


def start_alarm(seconds: float) -> tuple | None:
    """SIGALRM raising LimitExceeded after `seconds`, in the main thread only (no SIGALRM elsewhere) and not inside
    another limit (the outer deadline stands). Returns what stop_alarm needs: (the handler it replaced,), or None
    when it set nothing. Apart from time_limit for IPython's hooks around a whole grade cell (common.short_errors)."""
    if threading.current_thread() is not threading.main_thread() or getattr(_depth, "n", 0) or seconds <= 0:
        return None

    def on_alarm(signum, frame):
        raise LimitExceeded(timeout_message(seconds))

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    _depth.n = 1
    return (old,)


def stop_alarm(started: tuple | None) -> None:
    if started is None:
        return
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, started[0])
    _depth.n = 0


@contextlib.contextmanager
def time_limit(seconds: float | None = None):
    """Raise LimitExceeded in the main thread after `seconds` (default: the cell timeout).

    Nested uses keep the outer deadline. Off the main thread (no SIGALRM there) it does nothing: nbgrader's
    own cell timeout and the sandbox's kill deadline still apply.
    """
    started = start_alarm(cell_timeout() if seconds is None else seconds)
    try:
        yield
    finally:
        stop_alarm(started)
