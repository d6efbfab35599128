"""Grade a notebook file where the student's code cannot reach the checks' verdict.

The parent (this module, in the grader's process) reads the notebook, keeps only the *answer definitions* of
its exercise cells (top-level imports, `def`, `class`, and assignments to plain names; every other top-level
statement is dropped and reported), audits them, and starts a fresh child process
(`python -m autograder.sandbox`) under the limits of autograder/limits.py. The child runs the lesson's locked
setup cell taken from the release (not the student's copy), then the answer definitions, then each part's
check, and reports one line per part on a private pipe. The parent enforces the per-part deadline (it kills
the child and starts another for the remaining parts), and scores a part 0 when the child dies, runs out of
time or memory, or when the grader's or engine's functions changed while the part ran.

Audit: answer definitions may not name the grader, the interpreter's introspection or I/O (os, sys, gc,
builtins, getattr/setattr, eval/exec, dunder attributes, frames ...). An honest answer never needs them; a
submission that uses them scores 0 on every code part with a line that says why.
"""
from __future__ import annotations

import ast
import json
import os
import secrets
import select
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from autograder import isolation
from autograder.common import (
    REPO,
    SKIPPED_AFTER_TIMEOUT,
    Lesson,
    PartResult,
    cell_source,
    load_lesson,
    nbgrader_meta,
    timed_out,
)
from autograder.limits import cell_timeout, memory_limit_mb, memory_message, timeout_message

ALLOWED_IMPORTS = {"math", "collections", "heapq", "itertools", "functools", "hashlib", "dataclasses", "typing",
                   "bisect", "operator", "copy", "random", "re", "time", "enum", "abc", "numpy", "torch", "triton",
                   "minivllm", "__future__"}
STARTUP_S = 60.0  # importing torch and the engine once on a loaded 2-core machine, before any part's clock
FORBIDDEN_NAMES = {
    "os", "sys", "gc", "inspect", "builtins", "importlib", "ctypes", "subprocess", "signal", "resource", "threading",
    "multiprocessing", "socket", "pickle", "marshal", "types", "code", "io", "autograder", "self_check",
    "logging", "warnings", "eval", "exec", "compile", "open", "globals", "locals", "vars", "getattr", "setattr",
    "delattr", "__import__", "breakpoint", "input", "exit", "quit", "memoryview", "super",
}
FORBIDDEN_ATTRS = {"f_globals", "f_locals", "f_back", "f_builtins", "f_code", "tb_frame", "tb_next", "gi_frame",
                   "cr_frame", "ag_frame", "gi_code", "co_code", "func_globals",
                   # a module another module imported (`minivllm.config.os.system(...)`) is still that module
                   "os", "sys", "subprocess", "system", "popen", "spawnv", "execv", "fork", "environ", "modules",
                   "builtins", "importlib", "ctypes", "socket", "signal", "shutil", "pathlib", "multiprocessing"}


class GraderBroken(RuntimeError):
    """The grader itself cannot run here (the lesson's locked setup fails, the grading process cannot start): no
    score may be given, since every answer, right or wrong, would get 0 for it. The message names the cause."""


def broken_message(cause: str) -> str:
    return (f"评分环境本身无法运行（{cause}）。这不是你的答案的问题：评分进程在运行任何答案之前就失败了（本课的准备单元格"
            "或引擎的导入），所以没有给出任何分数。检查 minivllm 与 autograder 能否在这个环境里导入（例如 "
            "`python -c \"import minivllm, autograder.common\"`），修好后再运行。")


@dataclass
class Answers:
    """What the sandbox runs: (cell id, python) per exercise cell, and what it refused to run."""

    cells: list[tuple[str, str]]
    dropped: list[str]
    refused: list[str]


def _is_answer_statement(node: ast.stmt) -> bool:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)):
        return True
    if isinstance(node, ast.Assign):
        return all(isinstance(t, ast.Name) or (isinstance(t, ast.Tuple) and all(isinstance(e, ast.Name) for e in t.elts))
                   for t in node.targets)
    if isinstance(node, ast.AnnAssign):
        return isinstance(node.target, ast.Name)
    return False


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__") and bool(name.strip("_"))


def audit(tree: ast.AST, cell_id: str) -> list[str]:
    """Names and imports an answer may not use, one line each."""
    found = []
    for node in ast.walk(tree):
        bad = None
        if isinstance(node, ast.Name) and (node.id in FORBIDDEN_NAMES or (node.id.startswith("L") and node.id[1:].isdigit())
                                           or _dunder(node.id)):
            bad = node.id
        elif isinstance(node, ast.Attribute) and (node.attr in FORBIDDEN_ATTRS or (
                _dunder(node.attr) and node.attr != "__init__")):
            bad = "." + node.attr
        elif isinstance(node, ast.Import):
            bad = next((a.name for a in node.names if a.name.split(".")[0] not in ALLOWED_IMPORTS), None)
        elif isinstance(node, ast.ImportFrom):
            bad = None if (node.module or "").split(".")[0] in ALLOWED_IMPORTS and node.level == 0 else f"from {node.module}"
        if bad:
            found.append(f"单元格 {cell_id} 第 {node.lineno} 行用到了评分时不允许的 {bad}")
    return found


def answer_definitions(source: str, cell_id: str) -> tuple[str, list[str], list[str]]:
    """(python to run, dropped top-level statements, audit findings) for one exercise cell."""
    from autograder.common import _to_python

    python = _to_python(source)
    try:
        tree = ast.parse(python)
    except SyntaxError:
        return python, [], []  # the child reports the SyntaxError as the cell's error
    keep, dropped = [], []
    for node in tree.body:
        if _is_answer_statement(node):
            keep.append(node)
        else:
            dropped.append(f"单元格 {cell_id} 第 {node.lineno} 行的顶层语句没有运行（评分只运行答案的定义）："
                           f"{ast.get_source_segment(python, node).splitlines()[0][:80]}")
    lines = python.splitlines(keepends=True)
    kept = [i for n in keep for i in range((n.decorator_list[0].lineno if getattr(n, "decorator_list", None)
                                            else n.lineno) - 1, n.end_lineno)]
    # Dropped lines become blank lines so tracebacks and @triton.jit keep the student's line numbers.
    kept_set = set(kept)
    text = "".join(line if i in kept_set else "\n" for i, line in enumerate(lines))
    return text, dropped, audit(ast.Module(body=keep, type_ignores=[]), cell_id)


def _cells(nb_path: Path) -> list[dict]:
    return json.loads(Path(nb_path).read_text(encoding="utf-8"))["cells"]


def release_cells(lesson_id: str) -> list[dict]:
    return _cells(REPO / "notebooks" / lesson_id / f"{lesson_id}.ipynb")


def setup_source(lesson_id: str) -> str:
    """The locked setup cell as released, whatever the student's copy says."""
    return next(cell_source(c) for c in release_cells(lesson_id)
                if str(nbgrader_meta(c).get("grade_id", "")).endswith("_setup"))


def submitted_sources(nb_path: Path, wanted: list[str], cell_type: str | None = "code") -> dict[str, str]:
    """id -> source of the submission's cells that are the release's `wanted` ones (of `cell_type`, None: any),
    found by cell id (metadata may be stripped) and else by nbgrader grade_id; the first match counts."""
    by_id: dict[str, str] = {}
    for c in _cells(nb_path):
        if cell_type is not None and c.get("cell_type") != cell_type:
            continue
        for key in (c.get("id"), nbgrader_meta(c).get("grade_id")):
            if key in wanted and key not in by_id:
                by_id[key] = cell_source(c)
    return by_id


def extract_answers(lesson_id: str, nb_path: Path) -> Answers:
    """The exercise cells are the release's solution cells, found in the submission by cell id (metadata may be
    stripped) and else by nbgrader grade_id."""
    wanted = [c["id"] for c in release_cells(lesson_id)
              if nbgrader_meta(c).get("solution") and c["cell_type"] == "code"]
    by_id = submitted_sources(nb_path, wanted)
    cells, dropped, refused = [], [], []
    for cid in wanted:
        if cid not in by_id:
            dropped.append(f"提交里没有练习单元格 {cid}")
            continue
        text, d, r = answer_definitions(by_id[cid], cid)
        cells.append((cid, text))
        dropped += d
        refused += r
    return Answers(cells, dropped, refused)


def _run_child(lesson_id: str, grade_ids: list[str], answers: Answers, timeout: float,
               on_verdict=None) -> tuple[dict, str | None]:
    """Run parts in one child until done, dead or past a deadline. Returns ({grade_id: (score, msg)}, problem)."""
    rfd, wfd = os.pipe()
    token = secrets.token_hex(16)
    job = {"lesson": lesson_id, "parts": grade_ids, "setup": setup_source(lesson_id), "answers": answers.cells,
           "token": token, "fd": wfd}
    env = isolation.run_env(PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    # stderr: only until the setup has run (the child then points it at /dev/null), to name why a grader that
    # cannot start failed; a student's code never writes here
    with isolation.scratch_dir("minivllm-sandbox-") as scratch, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(isolation.wrap([sys.executable, "-m", "autograder.sandbox"], scratch, cwd=REPO),
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err,
                                pass_fds=(wfd,), env=env, preexec_fn=isolation.limit_run, start_new_session=True,
                                cwd=REPO)
        os.close(wfd)
        got, problem = _read_verdicts(proc, rfd, token, grade_ids, job, timeout, on_verdict)
        if problem == "broken":  # the grader could not start: name the cause from what it wrote
            err.seek(0)
            tail = [x.strip() for x in err.read(1 << 20).decode("utf-8", "replace").splitlines() if x.strip()]
            problem = "broken:" + (tail[-1][:300] if tail else f"评分进程在准备阶段退出（返回码 {proc.returncode}）")
        return got, problem


def _read_verdicts(proc: subprocess.Popen, rfd: int, token: str, grade_ids: list[str], job: dict,
                   timeout: float, on_verdict=None) -> tuple[dict, str | None]:
    proc.stdin.write(json.dumps(job).encode())
    proc.stdin.close()
    got: dict = {}
    buf = b""
    set_up = False  # the lesson's setup ran: from here on, a death or a hang is the answers'
    deadline = time.monotonic() + STARTUP_S + timeout  # the setup, then the answer definitions themselves
    reader = os.fdopen(rfd, "rb", buffering=0)
    try:
        while len(got) < len(grade_ids):
            left = deadline - time.monotonic()
            if left <= 0:
                isolation.kill(proc)
                return got, "timeout" if set_up else f"broken:评分进程的准备阶段超过 {STARTUP_S + timeout:g} s 仍未完成"
            ready, _, _ = select.select([reader], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = reader.read(65536)
            if not chunk:
                proc.wait()
                return got, "died" if set_up else "broken"
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if msg.get("token") != token:
                    continue
                if msg.get("setup") is False:
                    isolation.kill(proc)
                    return got, "broken:" + str(msg.get("error", ""))[:300]
                set_up = set_up or bool(msg.get("setup"))
                if msg.get("ready") or msg.get("part") in grade_ids:
                    deadline = time.monotonic() + timeout + 2.0  # the child's own alarm fires first
                if msg.get("part") in grade_ids:
                    got[msg["part"]] = (msg["score"], msg["message"])
                    if on_verdict is not None:
                        on_verdict(msg["part"], msg["message"])
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        isolation.kill(proc)
    finally:
        reader.close()
        if proc.poll() is None:
            isolation.kill(proc)
    return got, None


def grade_file(lesson_id: str, nb_path: Path, on_timeout=None) -> tuple[list[PartResult], list[str]]:
    """Every part of the lesson scored by the sandbox (manual parts: None); plus notes for the report.
    `on_timeout(result)` is called as soon as a part runs past the time limit (the later parts with the same
    answers are then not run)."""
    lesson: Lesson = load_lesson(lesson_id)
    answers = extract_answers(lesson_id, Path(nb_path))
    code = [p for p in lesson.parts if not p.manual]
    results: dict[str, PartResult] = {}
    if answers.refused:
        msg = answers.refused[0] + "（答案只能定义函数与常量，不能触碰评分器或解释器）"
        results = {p.grade_id: PartResult(p, 0, msg) for p in code}
    todo = [p.grade_id for p in code if p.grade_id not in results]
    timeout = cell_timeout()
    def verdict(gid: str, message: str) -> None:
        if on_timeout is not None and timed_out(message) and SKIPPED_AFTER_TIMEOUT not in message:
            on_timeout(PartResult(lesson.part(gid), 0, message))

    while todo:
        got, problem = _run_child(lesson_id, todo, answers, timeout, verdict)
        if problem and problem.startswith("broken:"):
            raise GraderBroken(problem.partition(":")[2])
        for gid, (score, message) in got.items():
            results[gid] = PartResult(lesson.part(gid), score, message)
        todo = [g for g in todo if g not in got]
        if not todo:
            break
        first = lesson.part(todo.pop(0))  # the part that was running when the child stopped
        why = timeout_message(timeout) if problem == "timeout" else (
            f"评分进程异常退出（可能超出内存上限 {memory_limit_mb()} MiB，或代码让解释器崩溃）")
        results[first.grade_id] = PartResult(first, 0, why)
        verdict(first.grade_id, why)
        if problem == "timeout":  # the answer hangs even past the alarm: do not wait for it once per part
            for gid in [g for g in todo if set(lesson.part(g).needs) & set(first.needs)]:
                results[gid] = PartResult(lesson.part(gid), 0, why + SKIPPED_AFTER_TIMEOUT)
            todo = [g for g in todo if g not in results]
    ordered = [PartResult(p, None, "待人工评分") if p.manual else results[p.grade_id] for p in lesson.parts]
    return ordered, answers.dropped + answers.refused


# ---------------------------------------------------------------------------- the child
def _snapshot() -> dict:
    """Identity of every function and class attribute of the grader's and the engine's modules."""
    snap = {}
    for name, mod in list(sys.modules.items()):
        if not (name.startswith("autograder") or name.startswith("minivllm")) or mod is None:
            continue
        for attr, val in list(vars(mod).items()):
            if callable(val):
                snap[(name, attr)] = id(val)
                if isinstance(val, type) and val.__module__ == name:
                    for k, v in list(vars(val).items()):
                        if callable(v) or isinstance(v, (staticmethod, classmethod, property)):
                            snap[(name, attr, k)] = id(v)
    return snap


def _changed(before: dict) -> list[str]:
    after = _snapshot()
    return [".".join(k) for k, v in before.items() if after.get(k) != v]


def _child() -> None:
    job = json.loads(sys.stdin.buffer.read())
    out = os.fdopen(job.pop("fd"), "w", buffering=1)
    token = job.pop("token")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

    def send(**msg) -> None:  # one line on the private pipe, with the token that marks it the child's
        out.write(json.dumps({"token": token, **msg}) + "\n")
        out.flush()

    import contextlib
    import io
    import warnings

    from autograder.common import Hung, ______, exec_source, run_part, student_error
    from autograder.limits import LimitExceeded, time_limit

    lesson = load_lesson(job["lesson"])
    ns: dict = {"__name__": "__student__", "______": ______}
    warnings.simplefilter("ignore")
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            exec_source(job["setup"], ns, "<cell setup>")
            import minivllm  # noqa: F401  (the engine every check plugs into; setups import it lazily)
    except BaseException as e:  # noqa: BLE001  (the release's own setup: the grader cannot run here)
        send(setup=False, error=f"{type(e).__name__}: {e}")
        os._exit(0)
    try:  # torch and the engine, imported before any part's clock starts: a verdict must not depend on how fast
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            import minivllm.entrypoints.llm  # noqa: F401  (torch imports in seconds on a loaded machine)
    except Exception:  # noqa: BLE001  (not importable here: a check that needs it says so, with its error)
        pass
    send(setup=True)
    null = os.open(os.devnull, os.O_WRONLY)  # from here on the answers run: nothing more reaches the parent's log
    os.dup2(null, 2)
    os.close(null)
    before = _snapshot()
    errors = []
    for cid, text in job["answers"]:
        try:
            with time_limit():
                exec_source(text, ns, f"<cell {cid}>")
        except LimitExceeded as e:
            errors.append(f"单元格 {cid}：{e}")
        except MemoryError:
            errors.append(f"单元格 {cid}：{memory_message()}")
        except BaseException as e:  # noqa: BLE001  (a SystemExit in an answer is an error too)
            errors.append(f"单元格 {cid} 运行出错：{student_error(e)}")
    changed = _changed(before)
    send(ready=True)
    hung = Hung()  # one hang per answer is enough: a looping answer costs one time limit, not one per part
    for gid in job["parts"]:
        part = lesson.part(gid)
        stuck = hung.stuck(part, ns)
        if stuck:
            send(part=gid, score=0, message=stuck)
            continue
        if changed:
            send(part=gid, score=0, message=f"答案在定义时修改了评分器或引擎（{changed[0]}）")
            continue
        missing = [n for n in part.needs if n not in ns]
        if missing and errors:
            send(part=gid, score=0, message=errors[0])
            continue
        r = run_part(part, ns)
        hung.note(part, ns, r)
        changed = _changed(before)
        if changed:
            send(part=gid, score=0, message=f"答案在评分时修改了评分器或引擎（{changed[0]}）")
            continue
        send(part=gid, score=r.score, message=r.message)
    out.close()
    os._exit(0)  # no interpreter teardown: engine threads and atexit hooks of the student's run are not waited on


if __name__ == "__main__":
    _child()
