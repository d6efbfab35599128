"""Re-pin: after autograder/pin.py names a new vLLM (and `make vllm` installed it in .venv-vllm), re-do every
file that names the pinned release, in dependency order. `--dry-run` lists the steps and runs nothing.

    python -m autograder.vllm_oracle repin --wheel vllm-X.Y.Z-...whl [--dry-run]
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from autograder.pin import NAMES_LIST, REPO, VLLM_VERSION, WHEEL_HASHES


def steps(wheel: Path, wheel_dir: Path) -> list[tuple[str, list[str]]]:
    """(what, command) in order: the facts from the official wheel first, then vLLM's answers (which the
    provenance check of the new hashes guards), then what the lessons derive from their checks."""
    from autograder.common import discover_lessons
    from autograder.vllm_oracle import KINDS, LESSONS, SERVER

    py = sys.executable
    return [
        (f"names list -> {NAMES_LIST.relative_to(REPO)}",
         [py, "-m", "autograder.vllm_names", "--wheel-dir", str(wheel_dir), "--wheel", str(wheel),
          "--out", str(NAMES_LIST)]),
        (f"provenance hashes -> {WHEEL_HASHES.relative_to(REPO)}",
         [py, "-m", "autograder.vllm_oracle.provenance", "--from-wheel", str(wheel)]),
        ("goldens -> data/vllm_oracle/", [py, "-m", "autograder.vllm_oracle", "record", *KINDS, SERVER]),
        ("lesson recordings -> data/vllm_views/", [py, "-m", "autograder.vllm_oracle", "record", *LESSONS]),
        *((f"diagnosis -> autograder/{lesson}/diagnosis.json",
           [py, "-m", "autograder", "diagnose", "--build", lesson]) for lesson in discover_lessons()),
    ]


def repin(wheel: Path | None, dry_run: bool = False) -> int:
    if wheel is None and not dry_run:
        raise SystemExit(f"repin needs --wheel: the official vllm-{VLLM_VERSION} wheel (names and hashes come "
                         "from it)")
    wheel = wheel or Path(f"vllm-{VLLM_VERSION}-WHEEL.whl")
    with tempfile.TemporaryDirectory() as tmp:
        if not dry_run:
            zipfile.ZipFile(wheel).extractall(tmp)  # the names list is read from the unpacked wheel
        for what, cmd in steps(wheel, Path(tmp)):
            print(f"[repin {VLLM_VERSION}] {what}: {' '.join(cmd[1:])}", flush=True)
            if dry_run:
                continue
            if subprocess.run(cmd, cwd=REPO).returncode:
                print(f"[repin] failed at: {what}", file=sys.stderr)
                return 1
    return 0
