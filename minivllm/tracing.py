"""Trace events for EngineCore phases, exportable as Chrome-trace JSON (chrome://tracing, Perfetto).

Off by default: a disabled Tracer's span() returns one shared no-op context manager, so the engine
pays one attribute check per phase.
"""
from __future__ import annotations

import contextlib
import json
import threading
import time
from dataclasses import asdict, dataclass, field


@dataclass
class TraceEvent:
    """One phase of one engine step, on one thread."""

    phase: str
    step: int
    start: float
    end: float
    thread: str
    req_ids: list[str] = field(default_factory=list)


_NULL = contextlib.nullcontext()


class Tracer:
    """Collects TraceEvents; the only writer of its event list."""

    def __init__(self, enabled: bool = False) -> None:
        self.enabled = enabled
        self.events: list[TraceEvent] = []
        self._lock = threading.Lock()

    def span(self, phase: str, step: int, req_ids=()):
        if not self.enabled:
            return _NULL
        return self._span(phase, step, req_ids)

    @contextlib.contextmanager
    def _span(self, phase: str, step: int, req_ids):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.record(phase, step, start, time.perf_counter(), req_ids)

    def record(self, phase: str, step: int, start: float, end: float, req_ids=()) -> None:
        if self.enabled:
            ev = TraceEvent(phase, step, start, end, threading.current_thread().name, list(req_ids))
            with self._lock:
                self.events.append(ev)

    def clear(self) -> None:
        with self._lock:
            self.events.clear()

    def phases(self, step: int | None = None, thread: str | None = None) -> list[str]:
        """Phase names in start order, optionally for one step and/or one thread."""
        evs = [e for e in self.events if (step is None or e.step == step) and (thread is None or e.thread == thread)]
        return [e.phase for e in sorted(evs, key=lambda e: e.start)]

    def to_chrome_trace(self, path: str | None = None) -> dict:
        """Chrome-trace 'complete' events (ph=X), microseconds from the first event."""
        t0 = min((e.start for e in self.events), default=0.0)
        threads = {name: i for i, name in enumerate(dict.fromkeys(e.thread for e in self.events))}
        trace = {"traceEvents": [
            {"name": e.phase, "ph": "X", "ts": (e.start - t0) * 1e6, "dur": (e.end - e.start) * 1e6,
             "pid": 0, "tid": threads[e.thread], "args": {"step": e.step, "req_ids": e.req_ids}}
            for e in self.events] + [
            {"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": name}}
            for name, tid in threads.items()]}
        if path is not None:
            with open(path, "w") as f:
                json.dump(trace, f)
        return trace

    def as_dicts(self) -> list[dict]:
        return [asdict(e) for e in self.events]
