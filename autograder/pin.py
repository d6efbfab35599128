"""The vLLM release the course and the engine are checked against, in one place (no imports: the vLLM venv and
the grader's sandbox import it too). Re-pinning starts here: the recordings under data/ name this version and
are re-recorded from it (the repository README's vLLM section says how)."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VLLM_VERSION = "0.27.1"
VLLM_COMMIT = "8e958902eee5"  # the source the lessons cite (the 0.27.1 wheel was built the day before it)
WHEEL_HASHES = REPO / "data" / "vllm_oracle" / f"vllm-{VLLM_VERSION}-wheel-py.sha256"  # every vllm/*.py's sha256
NAMES_LIST = REPO / "data" / f"vllm_names_{VLLM_VERSION}.txt"  # every identifier in vllm/*.py
