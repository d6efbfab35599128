"""The vLLM release the course and the engine are checked against, in one place (no imports: the vLLM venv and
the grader's sandbox import it too; the Makefile reads VLLM_VERSION from this file). Re-pinning starts here:
change these, then the repository's repin command (autograder/vllm_oracle/repin.py, instructor side) regenerates
what names them (tests/test_vllm_oracle.py checks that code reads them from here)."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VLLM_VERSION = "0.27.1"
VLLM_COMMIT = "8e958902eee5"  # the source the lessons cite (the 0.27.1 wheel was built the day before it)
WHEEL_HASHES = REPO / "data" / "vllm_oracle" / f"vllm-{VLLM_VERSION}-wheel-py.sha256"  # every vllm/*.py's sha256
NAMES_LIST = REPO / "data" / f"vllm_names_{VLLM_VERSION}.txt"  # every identifier in vllm/*.py
