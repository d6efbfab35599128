"""The names the pinned vLLM (autograder/pin.py) defines, as a committed list of facts the course's name check reads (no code).

    python -m autograder.vllm_names --wheel-dir DIR [--wheel FILE] [--out data/vllm_names_VERSION.txt]

DIR is the unzipped wheel (the folder that holds vllm/ and vllm-VERSION.dist-info/). Every vllm/**/*.py file is
parsed (never imported) and listed with what it defines, under its file line:

    F vllm/v1/sample/rejection_sampler.py   a file of the wheel
    C RejectionSampler                      a class (nested: Outer.Inner); the indented lines below it are its
     D forward                                methods, and its attributes: dataclass / msgspec / pydantic
     A is_processed_logprobs_mode             fields, enum members, class-body assignments, `self.x = ...`
    D rejection_sample                      a module-level function
    V PLACEHOLDER_TOKEN_ID                  a module-level name (assignment, annotated or not)
    L bonus_logits num_rejected ...         the file's function locals and arguments (one line, sorted)
    I DecodeStream Tokenizer ...            the names the file imports from outside vllm (one line, sorted)

Vendored code (vllm/third_party/, vllm/vllm_flash_attn/) gets its file lines only; model and HF-config files
(vllm/model_executor/models/, vllm/models/, vllm/transformers_utils/) and quantization methods
(vllm/model_executor/layers/quantization/) get no L/I line: no lesson cites
their locals, and they would double the list.

The header records the wheel's version, build date (its newest member's timestamp) and sha256, so the list can
be regenerated and compared. tests/test_vllm_names.py reads the list; it never needs the wheel.
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import sys
import zipfile
from datetime import datetime
from pathlib import Path

from autograder.pin import NAMES_LIST as DEFAULT_OUT  # noqa: E402
from autograder.pin import REPO, VLLM_COMMIT  # noqa: E402,F401


def _targets(node: ast.AST):
    """Plain names bound by an assignment target (tuples unpacked)."""
    if isinstance(node, ast.Name):
        yield node.id
    elif isinstance(node, (ast.Tuple, ast.List)):
        for elt in node.elts:
            yield from _targets(elt)
    elif isinstance(node, ast.Starred):
        yield from _targets(node.value)


def _self_attrs(func: ast.AST):
    """`self.x` assigned anywhere in a method."""
    for node in ast.walk(func):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for t in targets:
            for sub in ast.walk(t):
                if (isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self"
                        and isinstance(sub.ctx, ast.Store)):
                    yield sub.attr


def _locals(func: ast.AST):
    for node in ast.walk(func):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            yield node.id
        elif isinstance(node, ast.arg):
            yield node.arg
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not func:
            yield node.name  # a nested helper (e.g. choice_as_grammar's escape_ebnf_string)


VENDORED = ("vllm/third_party/", "vllm/vllm_flash_attn/")
NO_LOCALS = ("vllm/model_executor/models/", "vllm/models/", "vllm/transformers_utils/",
             "vllm/model_executor/layers/quantization/")


def file_facts(tree: ast.Module, with_locals: bool = True) -> list[str]:
    """The lines of one parsed file, in source order, without duplicates."""
    out: list[str] = []
    local_names: set[str] = set()

    def cls(node: ast.ClassDef, prefix: str) -> None:
        q = prefix + node.name
        members: list[str] = []
        nested: list[ast.ClassDef] = []
        for item in node.body:
            if isinstance(item, ast.ClassDef):
                nested.append(item)
            elif isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                members.append(f" D {item.name}")
                members.extend(f" A {a}" for a in _self_attrs(item))
                local_names.update(_locals(item))
            elif isinstance(item, ast.Assign):
                members.extend(f" A {n}" for t in item.targets for n in _targets(t))
            elif isinstance(item, ast.AnnAssign):
                members.extend(f" A {n}" for n in _targets(item.target))
        out.append(f"C {q}")
        out.extend(dict.fromkeys(members))
        for item in nested:
            cls(item, q + ".")

    def top(body) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                cls(node, "")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append(f"D {node.name}")
                local_names.update(_locals(node))
            elif isinstance(node, ast.Assign):
                out.extend(f"V {n}" for t in node.targets for n in _targets(t))
            elif isinstance(node, ast.AnnAssign):
                out.extend(f"V {n}" for n in _targets(node.target))
            elif isinstance(node, (ast.If, ast.Try)):  # `if TYPE_CHECKING:` / try-import blocks
                top(node.body)
                top(getattr(node, "orelse", []))
                for h in getattr(node, "handlers", []):
                    top(h.body)

    top(tree.body)
    # A class listed twice (if/else definitions) keeps its first block; top-level duplicates go.
    lines, seen, in_dup = [], set(), False
    for ln in out:
        if ln.startswith(" "):
            if not in_dup:
                lines.append(ln)
            continue
        in_dup = ln in seen
        if not in_dup:
            seen.add(ln)
            lines.append(ln)
    if with_locals and local_names:
        lines.append("L " + " ".join(sorted(local_names)))
    imported = {a.asname or a.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and not (node.module or "").startswith("vllm") and node.level == 0 for a in node.names}
    if with_locals and imported - {"*"}:
        lines.append("I " + " ".join(sorted(imported - {"*"})))
    return lines


def build(wheel_dir: Path) -> tuple[list[str], int]:
    root = wheel_dir / "vllm"
    lines: list[str] = []
    n = 0
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(wheel_dir).as_posix()
        lines.append(f"F {rel}")
        if rel.startswith(VENDORED):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        facts = file_facts(tree, with_locals=not rel.startswith(NO_LOCALS))
        lines.extend(facts)
        n += len(facts)
    return lines, n


class VllmNames:
    """The committed list, read back: per file its classes, functions, attributes, module names and locals."""

    def __init__(self, path: Path = DEFAULT_OUT) -> None:
        self.header: list[str] = []
        self.files: dict[str, dict[str, set[str]]] = {}
        cur = cls = None
        for ln in path.read_text(encoding="utf-8").splitlines():
            if ln.startswith("#"):
                self.header.append(ln)
            elif ln.startswith("F "):
                cur = self.files.setdefault(ln[2:], {k: set() for k in "CDAVLI"})
                cls = None
            elif ln.startswith("C "):
                cls = ln[2:]
                cur["C"].add(cls)
            elif ln.startswith(" "):
                kind, name = ln.split()
                cur[kind].add(f"{cls}.{name}")
            elif ln.startswith(("L ", "I ")):
                cur[ln[0]].update(ln[2:].split())
            elif ln:
                kind, name = ln.split(" ", 1)
                cur[kind].add(name)
        self.dirs = {f.rsplit("/", i)[0] for f in self.files for i in range(1, f.count("/") + 1)}
        self.classes: dict[str, set[str]] = {}      # short class name -> members (of every class so named)
        self.everywhere: set[str] = set()           # every short name: classes, members, functions, locals
        self.defined: set[str] = set()              # the same without locals and imports
        for facts in self.files.values():
            for c in facts["C"]:
                self.classes.setdefault(c.rsplit(".", 1)[-1], set())
            for q in facts["D"] | facts["A"]:
                if "." in q:
                    owner, member = q.rsplit(".", 1)
                    self.classes.setdefault(owner.rsplit(".", 1)[-1], set()).add(member)
            for kind in "CDAV":
                self.defined.update(q.rsplit(".", 1)[-1] for q in facts[kind])
            self.everywhere.update(facts["L"] | facts["I"])
        self.everywhere |= self.defined

    def names_in(self, path: str) -> set[str]:
        """Every name a file defines, short and qualified (`RejectionSampler`, `RejectionSampler.forward`,
        `forward`), locals and imports included."""
        facts = self.files[path]
        out: set[str] = set()
        for kind in "CDAVLI":
            for q in facts[kind]:
                out.add(q)
                out.add(q.rsplit(".", 1)[-1])
                if q.count(".") > 1:          # Outer.Inner.member -> Inner.member
                    out.add(".".join(q.split(".")[-2:]))
        return out

    def has_path(self, path: str) -> bool:
        path = path.rstrip("/")
        return path in self.files or path in self.dirs


def wheel_provenance(wheel: Path) -> tuple[str, str]:
    """(sha256, build date): the date is the newest member's timestamp inside the wheel."""
    h = hashlib.sha256()
    with wheel.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    with zipfile.ZipFile(wheel) as z:
        newest = max(datetime(*i.date_time) for i in z.infolist())
    return h.hexdigest(), newest.strftime("%Y-%m-%d %H:%M")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel-dir", type=Path, required=True, help="the unzipped wheel (holds vllm/)")
    ap.add_argument("--wheel", type=Path, help="the .whl file, for the sha256 and build date in the header")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    dist = sorted(args.wheel_dir.glob("vllm-*.dist-info"))
    version = dist[0].name[len("vllm-"):-len(".dist-info")] if dist else "unknown"
    sha, built = wheel_provenance(args.wheel) if args.wheel else ("not given", "not given")
    lines, n = build(args.wheel_dir)
    header = [
        f"# Names defined by vLLM {version} (facts only, no code), generated by autograder/vllm_names.py.",
        f"# wheel: {args.wheel.name if args.wheel else 'not given'}",
        f"# wheel sha256: {sha}",
        f"# wheel build date (newest member): {built}",
        f"# pin: vLLM commit {VLLM_COMMIT} (the wheel was built the day before it)",
        "# command: python -m autograder.vllm_names --wheel-dir DIR --wheel FILE",
        "# kinds: F file, C class, (indented) D method / A attribute or field of it, D function, V module name,",
        "#        L the file's locals, I names it imports from outside vllm",
    ]
    args.out.write_text("\n".join(header + lines) + "\n", encoding="utf-8")
    print(f"{args.out}: {sum(ln.startswith('F ') for ln in lines)} files, {n} names", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
