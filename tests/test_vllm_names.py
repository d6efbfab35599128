"""Every vLLM name a lesson cites exists in the pinned vLLM (data/vllm_names_<version>.txt, from the wheel).

What counts as a vLLM citation (everything else in a lesson is minivllm's, Python's or torch's and is not
checked), over the markdown cells and the SOURCE_MAP answer of solutions/lessonNN/lessonNN.py:

1. Paths. Every link into github.com/vllm-project/vllm and every backticked `vllm/...` path names a file or
   folder of the wheel. A backticked `*.py` path with another head (`v1/worker/gpu/model_runner.py`,
   `config/vllm.py`) is an abbreviation: it must end a wheel path, or be a minivllm file (`minivllm/<it>`).
   Paths outside the package (`docs/`, `tests/`, `benchmarks/` of vLLM's repo) are not in the wheel and are
   not checked.
2. Names beside a vLLM path. In the vLLM column of a reading table (a column whose header says vLLM), each
   backticked identifier after a link to a vLLM file is checked against that file: a bare name is defined,
   imported or local there, or is a class, function, attribute or module name of some vLLM file (a file
   cites what it calls; a local of another file does not count); `Class.member` is a member of a vLLM class
   of that name; `obj.attr` (lowercase head, an object's attributes) has every part in vLLM. A name before
   any link is checked the same way against all of vLLM. In prose, the backticked identifiers that directly
   follow a vLLM link (`[vllm/x.py](...)：`A`、`B.c``) are scoped to that file the same way.
3. Dotted names anywhere else in prose and tables. A backticked `Class.member` whose head is a vLLM class
   names a member of a vLLM class of that name; a backticked `vllm.a.b` names a module, folder or
   module-level name.
4. Class-like names anywhere else. A backticked CamelCase identifier (`SpecDecodeMetadata`) is a name of
   vLLM, of minivllm (its source, parsed at test time) or of the THIRD_PARTY list below.
   Rules 3 and 4 skip a name whose clause (the text since the last 。；; or opening bracket) names minivllm
   before it: "（minivllm：`Scheduler._preempt`）" and "`minivllm/x.py`：`A.b`" are minivllm's names.
5. SOURCE_MAP answers: each dotted part of each answer (`self.` and a trailing `()` dropped) is a vLLM name.

minivllm-only members that a lesson cites outside such a clause go in the explicit MINIVLLM_ONLY allowlist
below (empty today). PENDING_OTHER_BRANCHES lists failures in lessons other helpers are editing in
parallel; the integrator empties it after merging (the test fails while an entry there no longer fails).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from autograder.build import expand_pin
from autograder.common import discover_lessons
from autograder.pin import VLLM_COMMIT, VLLM_VERSION
from autograder.vllm_names import DEFAULT_OUT, VllmNames, file_facts

REPO = Path(__file__).resolve().parent.parent
LESSONS = discover_lessons()

# minivllm-only members of classes vLLM also has, cited where no "minivllm" marks the clause (rule 2/3 above):
# add `"Class.member",  # why` here rather than loosening a rule. Every lesson marks its own ones today.
MINIVLLM_ONLY: set[str] = set()
# Third-party names vLLM uses through a module attribute (so no import line lists them).
EXTERNAL = {
    "DecodeStream",  # tokenizers.decoders.DecodeStream in vllm/v1/engine/detokenizer.py
    "StreamingResponse",  # fastapi.responses (Starlette), what vLLM's completion/chat api_router.py return
}
# Paths a lesson cites as where vLLM kept something before (lesson 6: the Triton kernels' old home).
FORMER_PATHS = {"vllm/attention/ops/"}
# CamelCase names of Python and of vLLM's dependencies that lessons cite in prose.
THIRD_PARTY = {"CancelledError", "GeneratorExit", "GrammarMatcher"}
# Attribute parts of SOURCE_MAP answers that are Python's, not vLLM's (`self.running.pop()`, `future.result`).
PYTHON_NAMES = {"pop", "result", "self"}

# Failures in lessons that other branches edit now: {(lesson, cited name)}. The integrator empties this set.
PENDING_OTHER_BRANCHES: set[tuple[str, str]] = set()

LINK = r"\[(?P<text>[^\]]*)\]\((?P<url>https://github\.com/vllm-project/vllm/(?:blob|tree)/[0-9a-f]+/(?P<path>[^)#\s]+))[^)]*\)"
CODE = r"`(?P<code>[^`]+)`"
TOKEN = re.compile(f"{LINK}|{CODE}")
CAMEL = re.compile(r"^[A-Z][a-z0-9]+[A-Z]\w*$")
CLAUSE = re.compile(r"[。；;（(|]")
MINIVLLM_WORD = re.compile(r"minivllm(?!\w)")
IDENT = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")
PATHLIKE = re.compile(r"^[\w.\-/]+\.(?:py|md)$|^vllm/[\w.\-/]*$")
NON_VLLM_HEADS = ("minivllm/", "tests/", "benchmarks/", "autograder/", "data/", "solutions/", "notebooks/",
                  "docs/", "examples/", ".ci/")
SEPARATOR = re.compile(r"^[\s：:、，,（）()]*$")

_NAMES = None
_MINIVLLM: set[str] | None = None


def minivllm_names() -> set[str]:
    """Every short name minivllm's source defines (the same parse as the vLLM list)."""
    global _MINIVLLM
    if _MINIVLLM is None:
        _MINIVLLM = set()
        for p in (REPO / "minivllm").rglob("*.py"):
            for ln in file_facts(ast.parse(p.read_text(encoding="utf-8"))):
                _MINIVLLM.update(w.rsplit(".", 1)[-1] for w in ln[2:].split())
    return _MINIVLLM


def names() -> VllmNames:
    global _NAMES
    if _NAMES is None:
        _NAMES = VllmNames(DEFAULT_OUT)
    return _NAMES


def markdown_lines(source: str):
    """(line number, text) of every markdown-cell line of a jupytext percent source."""
    in_md = False
    for i, line in enumerate(source.splitlines(), 1):
        if line.startswith("# %%"):
            in_md = "[markdown]" in line
            continue
        if in_md and line.strip():  # a line without the comment prefix is still the cell's text
            yield i, line[2:] if line.startswith("# ") else line[1:] if line.startswith("#") else line


def source_map_answers(source: str):
    """(line number, answer) of the solution's SOURCE_MAP dict."""
    m = re.search(r"^SOURCE_MAP = \{.*?^\}", source, re.S | re.M)
    if not m:
        return
    first = source[:m.start()].count("\n") + 1
    tree = ast.parse(m.group(0))
    for value in tree.body[0].value.values:
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            yield first + value.lineno - 1, value.value


def check_path(p: str) -> bool:
    n = names()
    if p in FORMER_PATHS:
        return True
    if p.startswith("vllm/"):
        return n.has_path(p)
    if p.startswith(NON_VLLM_HEADS) or not p.endswith(".py"):
        return True
    return (n.has_path("vllm/" + p) or any(f.endswith("/" + p) for f in n.files)
            or (REPO / "minivllm" / p).exists())


def check_in_file(name: str, path: str | None) -> bool:
    """A name in a vLLM cell: `obj.attr.attr` (lowercase head: an object's attributes) has every part in vLLM;
    `Class.member` is a member of a vLLM class; a bare name is defined, imported or local in `path`, or is a
    class, function, attribute or module name of some vLLM file (a file cites what it calls)."""
    n = names()
    name = name.removeprefix("self.")
    if name in MINIVLLM_ONLY or name in EXTERNAL:
        return True
    if "." in name:
        if name[0].islower() and not name.startswith("vllm."):
            return all(part in n.everywhere for part in name.split("."))
        return check_dotted(name, strict=True)
    if path is not None and path in n.files and name in n.names_in(path):
        return True
    return name in n.defined or (path is None and name in n.everywhere)


def check_dotted(name: str, strict: bool = False) -> bool:
    """`Class.member[...]` with a vLLM class head, or `vllm.a.b`; other dotted names pass unless strict."""
    n = names()
    name = name.removeprefix("self.")
    if name in MINIVLLM_ONLY:
        return True
    parts = name.split(".")
    if parts[0] == "vllm":
        mod = "/".join(parts)
        return (n.has_path(mod) or mod + ".py" in n.files
                or any(f"{'/'.join(parts[:i])}.py" in n.files and parts[i] in n.names_in(f"{'/'.join(parts[:i])}.py")
                       for i in range(1, len(parts))))
    if parts[0] in n.classes:
        return parts[1] in n.classes[parts[0]]
    return not strict


def line_citations(text: str, scoped: bool):
    """(name, file or None, kind) cited on one line. scoped: a table's vLLM cell (every name after a link is
    that file's); otherwise prose (only names chained right after a link are)."""
    out = []
    current = None
    chained = False
    last_end = 0
    for m in TOKEN.finditer(text):
        between = text[last_end:m.start()]
        last_end = m.end()
        if m.group("url"):
            path = m.group("path").rstrip("/")
            out.append((path, None, "path"))
            current, chained = (path if path.startswith("vllm/") else None), True
            continue
        code = m.group("code").strip()
        if not scoped and not SEPARATOR.match(between):
            chained = False
        if PATHLIKE.match(code):
            out.append((code, None, "path"))
            continue
        if not IDENT.match(code):
            continue
        if scoped or (chained and current):
            out.append((code, current, "scoped"))
        elif MINIVLLM_WORD.search(CLAUSE.split(text[:m.start()])[-1]):
            continue                                   # "minivllm 的 `X.y`", "（minivllm：`X.y`）"
        elif "." in code:
            out.append((code, None, "dotted"))
        elif CAMEL.match(code):
            out.append((code, None, "camel"))
    return out


def lesson_citations(source: str):
    """(line, name, file, kind) of every vLLM citation in a lesson source."""
    header_cols: list[int] | None = None
    for lineno, text in markdown_lines(source):
        if text.startswith("|"):
            cells = text.strip().strip("|").split("|")
            if header_cols is None:
                header_cols = [i for i, c in enumerate(cells) if "vLLM" in c]
                continue
            if set(text.replace("|", "").strip()) <= set("-: "):
                continue
            for i, cell in enumerate(cells):
                for name, path, kind in line_citations(cell, scoped=i in header_cols):
                    if i in header_cols or kind != "scoped":
                        yield lineno, name, path, kind
            continue
        header_cols = None
        for name, path, kind in line_citations(text, scoped=False):
            yield lineno, name, path, kind
    for lineno, answer in source_map_answers(source):
        yield lineno, answer, None, "source_map"


def failures(source: str) -> list[tuple[int, str, str]]:
    bad = []
    n = names()
    for lineno, name, path, kind in lesson_citations(source):
        if kind == "path":
            ok = check_path(name)
        elif kind == "scoped":
            ok = check_in_file(name, path)
        elif kind == "dotted":
            ok = check_dotted(name)
        elif kind == "camel":
            ok = name in n.everywhere or name in minivllm_names() or name in THIRD_PARTY
        else:
            parts = [p for p in re.sub(r"\(\)$", "", name).split(".") if p not in PYTHON_NAMES]
            ok = bool(parts) and all(p in n.everywhere for p in parts)
        if not ok:
            bad.append((lineno, name, kind if path is None else f"{kind} in {path}"))
    return bad


def test_names_list_provenance():
    header = "\n".join(names().header)
    assert f"vLLM {VLLM_VERSION}" in header and "sha256: " in header and VLLM_COMMIT in header
    assert re.search(r"sha256: [0-9a-f]{64}", header)
    assert DEFAULT_OUT.stat().st_size < 2_500_000
    assert "vllm/v1/sample/rejection_sampler.py" in names().files


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_cited_vllm_name_exists(lesson):
    source = expand_pin((REPO / "solutions" / lesson / f"{lesson}.py").read_text(encoding="utf-8"))
    bad = failures(source)
    unexpected = [b for b in bad if (lesson, b[1]) not in PENDING_OTHER_BRANCHES]
    assert not unexpected, "\n".join(f"{lesson}.py:{ln}: `{name}` not in vLLM {VLLM_VERSION} ({why})"
                                     for ln, name, why in unexpected)
    fixed = {name for le, name in PENDING_OTHER_BRANCHES if le == lesson} - {b[1] for b in bad}
    assert not fixed, f"fixed now, remove from PENDING_OTHER_BRANCHES: {sorted(fixed)}"


FAKE = """\
# %% [markdown]
# | 顺序 | vLLM 文件与入口 | minivllm 对应文件 |
# |---|---|---|
# | 1 | [`vllm/v1/sample/rejection_sampler.py`](https://github.com/vllm-project/vllm/blob/{commit}/vllm/v1/sample/rejection_sampler.py)：`RejectionSampler.forward`、`{table_name}` | `minivllm/x.py`：`my_own_helper` |
#
# 而 minivllm 的 `RejectionSampler.verify_all` 与 `minivllm/x.py`：`Scheduler._preempt` 是 minivllm 的。
# 读 [`{link}`](https://github.com/vllm-project/vllm/blob/{commit}/{link})：`{chained}`；`{dotted}` 与 `minivllm_helper` 和 `{short_path}`，`{camel}`。

# %%
SOURCE_MAP = {{
    "a": "{answer}",  ### BLANK
}}
"""
GOOD = dict(table_name="generate_uniform_probs", link="vllm/v1/worker/gpu/cudagraph_utils.py",
            chained="ModelCudaGraphManager", dotted="SchedulerOutput.scheduled_spec_decode_tokens",
            short_path="v1/worker/gpu/model_runner.py", camel="BatchExecutionDescriptor", answer="self.scheduler.update_from_output")


def test_checker_accepts_real_names_and_ignores_minivllm_ones():
    assert failures(FAKE.format(commit=VLLM_COMMIT, **GOOD)) == []


@pytest.mark.parametrize("field,wrong", [
    ("table_name", "verify_drafts"),                                  # invented function in the table
    ("table_name", "advance_token_ids"),                              # a local of another file (scheduler.py)
    ("link", "vllm/v1/gpu_model_runner.py"),                          # moved path (it is v1/worker/...)
    ("chained", "ModelCudaGraphDispatcher"),                          # invented class chained to a link
    ("dotted", "RejectionSampler.verify"),                            # invented method of a real class
    ("dotted", "vllm.v1.worker.cudagraph_utils"),                     # moved module
    ("short_path", "v1/worker/gpu/cuda_graphs.py"),                   # invented abbreviated path
    ("camel", "DraftVerifier"),                                       # invented class in prose
    ("answer", "num_rejected_drafts"),                                # invented SOURCE_MAP answer
])
def test_checker_rejects_invented_and_moved_names(field, wrong):
    bad = failures(FAKE.format(commit=VLLM_COMMIT, **dict(GOOD, **{field: wrong})))
    assert [b[1] for b in bad] == [wrong], bad
