"""Wait for a server started as a subprocess to answer (vLLM: benchmarks/lib/ready_checker.py, which polls with a
test request; this polls /health, which vLLM's and minivllm's servers both answer). One copy for the server tests
and the benchmarks that launch `minivllm serve` or `vllm serve`."""
from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path


def wait_for_health(url: str, proc: subprocess.Popen, timeout_s: float, log_path: str | Path | None = None) -> None:
    """Return once url + "/health" answers 200. RuntimeError if proc exits first (with the end of its log),
    TimeoutError after timeout_s (a hang guard, not a verdict on speed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            tail = Path(log_path).read_text(errors="replace")[-3000:] if log_path else ""
            raise RuntimeError(f"the server exited ({proc.returncode}) before {url}/health answered\n{tail}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url}/health did not answer 200 within {timeout_s:.0f} s")
        time.sleep(0.25)
