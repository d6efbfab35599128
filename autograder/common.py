"""What every lesson's checks share: the blank, the parts of a score, and running them on a notebook.

A lesson module (autograder/lessonNN.py) defines ``LESSON = Lesson(...)``; its grade cells call the
same check functions the self-check calls, so nbgrader and ``python -m autograder check`` agree.
"""
from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import importlib
import io
import json
import linecache
import logging
import os
import re
import sys
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from autograder.limits import LimitExceeded, cell_timeout, memory_message, start_alarm, stop_alarm, time_limit
from autograder.pin import REPO  # noqa: E402

SOLUTIONS = REPO / "solutions"
DEFAULT_MODEL = str(REPO / "data" / "models" / "shakespeare-llama")  # the checks' engine model, shipped in data/
NOTEBOOKS = REPO / "notebooks"
LESSON_RE = re.compile(r"^lesson\d\d$")


class BlankNotFilled(NotImplementedError):
    """Raised when code touches a ``______`` the student has not filled in."""


class _Blank:
    """The value of ``______`` in a student notebook: any use of it says which blank is still empty."""

    _MSG = "还有空 ______ 没有填写：把它换成正确的表达式后再运行。"

    def _fail(self, *args, **kwargs):
        raise BlankNotFilled(self._MSG)

    __call__ = __getitem__ = __iter__ = __bool__ = __len__ = _fail
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _fail
    __neg__ = __index__ = __int__ = __float__ = __lt__ = __gt__ = __le__ = __ge__ = _fail

    def __eq__(self, other):  # `answer() == 4` with `return ______`: a use of the blank, not a False
        self._fail()

    __ne__ = __eq__
    __hash__ = object.__hash__

    def __getattr__(self, name: str):
        if name.startswith("_"):  # protocols (numpy, IPython's display, copy) probe with hasattr/getattr
            raise AttributeError(name)
        self._fail()

    def __repr__(self) -> str:
        return "______"


def blank_in(where: str) -> BlankNotFilled:
    """The blank's error for a check that finds it before running the answer; `where` names the spot."""
    e = BlankNotFilled(_Blank._MSG)
    e.where = where
    return e


def blank_in_function(fn) -> BlankNotFilled:
    """blank_in for a function whose code still names ``______``: the first such line of its cell."""
    code = fn.__code__
    lines = linecache.getlines(code.co_filename)
    at = next((i for i in range(code.co_firstlineno, len(lines) + 1) if "______" in lines[i - 1]), None)
    where = (f"单元格 {_cell_name(code.co_filename)}，第 {at} 行：{lines[at - 1].strip()}" if at
             else f"{getattr(fn, '__name__', fn)} 里")
    return blank_in(where)


______ = _Blank()


class CheckFailed(AssertionError):
    """A check's verdict: what was expected, what came, and where. Never a stack trace from our plumbing."""


def expect(cond: bool, msg: str) -> None:
    __tracebackhide__ = True  # IPython and pytest leave our frames out of the student's traceback
    if not cond:
        raise CheckFailed(msg)


def _cell_name(filename: str) -> str:
    """'In[8]' for a cell IPython compiled (its file is /tmp/ipykernel_*/…py), else the name without <>."""
    try:
        from IPython import get_ipython

        label = get_ipython().compile.format_code_name(filename)
        return label[1] if label else filename.strip("<>")
    except Exception:
        return filename.strip("<>")


def _in_cell(filename: str) -> bool:
    return filename.startswith(("<cell", "<ipython-input")) or "/ipykernel_" in filename


def student_error(e: BaseException) -> str:
    """One line for an exception the student's code raised: its type, message and the cell line it came from."""
    tb = traceback.extract_tb(e.__traceback__)
    where = next((f"（单元格 {_cell_name(f.filename)}，第 {f.lineno} 行：{(f.line or '').strip()}）" for f in reversed(tb)
                  if _in_cell(f.filename)), "")
    text = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}{where}"


def out_of_memory(e: BaseException) -> bool:
    """MemoryError, or torch's allocator failing under the memory cap."""
    return isinstance(e, MemoryError) or (isinstance(e, RuntimeError) and (
        "can't allocate memory" in str(e) or "out of memory" in str(e).lower()))


def _blank_where(e: BlankNotFilled) -> str:
    """'单元格 In[8]，第 12 行：plan = ______': the line that holds the blank, not the line that used its value.

    The blank's value may travel (`plan = ______` ... `plan[0]`): the innermost cell frame is searched for a line
    with ``______`` (the last one at or before the raising line, else its first), then the outer cell frames, then
    the whole cell; without one, the raising line."""
    if getattr(e, "where", None):
        return e.where
    frames, tb = [], e.__traceback__
    while tb is not None:
        if _in_cell(tb.tb_frame.f_code.co_filename):
            frames.append((tb.tb_frame, tb.tb_lineno, tb.tb_lasti))
        tb = tb.tb_next
    for frame, lineno, lasti in reversed(frames):
        name = frame.f_code.co_filename
        lines = linecache.getlines(name)
        code = frame.f_code
        span = [n for _, _, n in code.co_lines() if n] + [code.co_firstlineno]
        first, last = (1, len(lines)) if code.co_name == "<module>" else (min(span), max(span))
        blanks = [i for i in range(first, min(last, len(lines)) + 1) if "______" in lines[i - 1]]
        if not blanks:
            continue
        here = lines[lineno - 1] if 0 < lineno <= len(lines) else ""
        with contextlib.suppress(Exception):  # the expression that raised (`plan["k"]`), not its whole line
            start, end, col, end_col = list(frame.f_code.co_positions())[lasti // 2]
            if start == end == lineno and col is not None and end_col:
                here = here.encode()[col:end_col].decode()
        # the names on the raising line that still hold the blank, and the lines that bound them to it
        held = {n for n, v in {**frame.f_globals, **frame.f_locals}.items() if v is ______}
        used = held & set(re.findall(r"[A-Za-z_]\w*", here))
        bound = [i for i in blanks if any(re.match(rf"\s*(?:[\w\s,]*,\s*)?{re.escape(n)}\b[^=]*=\s*______", lines[i - 1])
                                          for n in used)]
        if "______" in here:
            at = lineno
        elif bound:
            at = max((i for i in bound if i <= lineno), default=bound[0])
        else:
            at = max((i for i in blanks if i <= lineno), default=blanks[0])
        return f"单元格 {_cell_name(name)}，第 {at} 行：{lines[at - 1].strip()}"
    for frame, _, _ in frames:
        lines = linecache.getlines(frame.f_code.co_filename)
        at = next((i for i, line in enumerate(lines, 1) if "______" in line), None)
        if at:
            return f"单元格 {_cell_name(frame.f_code.co_filename)}，第 {at} 行：{lines[at - 1].strip()}"
    return student_error(e).split("）", 1)[0].partition("（")[2]


def blank_message(e: BlankNotFilled) -> str:
    """The blank's message plus the line of the student's cell that still holds it."""
    where = _blank_where(e)
    return f"{e}（{where}）" if where else str(e)


def root_cause(e: BaseException) -> BaseException | None:
    """The unfilled blank, time limit or memory limit behind an exception, else None. A check that wraps the
    student's exception in its own CheckFailed (`raise CheckFailed(...) from None`) still keeps it as
    __context__: the verdict then names the blank or the limit, without the check's guess at a cause."""
    seen: set[int] = set()
    x: BaseException | None = e
    chain = []
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        if isinstance(x, (BlankNotFilled, LimitExceeded)) or out_of_memory(x):
            return x
        chain.append(x)
        x = x.__cause__ or x.__context__
    for x in chain:  # a blank handed to C code (`torch.empty(______, n)`) raises TypeError, not BlankNotFilled
        blank = blank_behind(x)
        if blank is not None:
            return blank
    return None


def blank_behind(e: BaseException) -> BlankNotFilled | None:
    """A BlankNotFilled for an exception raised while a frame of the student's cell held ``______`` in a local
    (the blank reached code that does not call its methods, e.g. torch's argument parser), else None."""
    tb = e.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        lines = linecache.getlines(frame.f_code.co_filename)
        here = lines[tb.tb_lineno - 1] if 0 < tb.tb_lineno <= len(lines) else ""
        if _in_cell(frame.f_code.co_filename) and ("______" in here or frame.f_code.co_name != "<module>" and any(
                v is ______ for v in frame.f_locals.values())):
            blank = BlankNotFilled(_Blank._MSG)
            blank.__traceback__ = e.__traceback__
            return blank
        tb = tb.tb_next
    return None


def limit_verdict(e: BaseException) -> str:
    """The one line for a root_cause: the blank and its line, or the limit that was hit."""
    if isinstance(e, BlankNotFilled):
        return blank_message(e)
    return str(e) if isinstance(e, LimitExceeded) else memory_message()


SKIPPED_AFTER_TIMEOUT = "（同一答案在前一部分已超时，本部分不再运行）"


@contextlib.contextmanager
def fixed_rng(seed: int = 0):
    """Every check starts from the same random state, restored after: a wrong answer's unseeded draw, and so
    its verdict text (the key of the misconception table), must not depend on what ran before in the process."""
    import random

    import torch

    state = random.getstate()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        random.seed(seed)
        try:
            yield
        finally:
            random.setstate(state)


def graded(check: Callable) -> Callable:
    """A part check as grade cells call it: bounded by the cell timeout, and failing with one short line.

    CheckFailed and unfilled blanks pass through; running out of time or memory, or any exception from the
    student's code, becomes a CheckFailed naming the part's function and the first line of the cause.
    """
    @functools.wraps(check)
    def run(*args, **kwargs):
        __tracebackhide__ = True
        try:
            with time_limit(), fixed_rng():
                return check(*args, **kwargs)
        except CheckFailed as e:
            cause = root_cause(e)
            if cause is None:
                raise
            raise CheckFailed(limit_verdict(cause)) from None
        except BlankNotFilled as e:
            raise CheckFailed(blank_message(e)) from None
        except LimitExceeded as e:
            raise CheckFailed(str(e)) from None
        except AssertionError as e:
            raise CheckFailed(f"断言失败：{e}" if str(e) else "断言失败") from None
        except Exception as e:
            cause = root_cause(e)
            if cause is not None:
                raise CheckFailed(limit_verdict(cause)) from e
            raise CheckFailed(f"运行你的代码时出错：{student_error(e)}") from None
    return run


def last_name(name) -> str:
    """What most source maps compare: 'self.block_pool.touch()' / '`vllm.v1.core.block_pool.BlockPool.touch`' /
    'self.seq_lens_cpu[:n]' -> 'touch' / 'seq_lens_cpu' (call parentheses, subscripts, quotes, spaces and the dotted
    path dropped, lower-cased)."""
    s = re.sub(r"\(.*\)|\[.*\]", "", str(name)).strip().strip("`").strip('"').replace(" ", "")
    return s.rsplit(".", 1)[-1].lower()


def last_name_hash(name) -> str:
    """The stored form of an answer: a sha256 prefix of last_name, so the key is not one import away."""
    return hashlib.sha256(last_name(name).encode()).hexdigest()[:16]


def check_name_map(source_map, keys, hashes: dict, name_hash, unmapped: str) -> None:
    """Grade a SOURCE_MAP: exactly `keys`, each a string whose name_hash is one of hashes[key].

    `unmapped` opens the message listing the wrong entries. Answers are stored hashed, so the answer
    key is not one import away from the student.
    """
    __tracebackhide__ = True
    expect(isinstance(source_map, dict), f"SOURCE_MAP 应是 dict，实际是 {type(source_map).__name__}。")
    expect(set(source_map) == set(keys), f"SOURCE_MAP 的键应恰好是 {list(keys)}，实际 {sorted(source_map)}。")
    wrong = []
    for key in keys:
        value = source_map[key]
        if value is ______:
            raise blank_in(f"SOURCE_MAP[{key!r}] 还是 ______")
        expect(isinstance(value, str), f"SOURCE_MAP[{key!r}] 还没有填写（应是字符串，实际 {value!r}）。")
        if name_hash(value) not in hashes[key]:
            wrong.append(f"{key} -> {value!r}")
    expect(not wrong, unmapped + "：" + "；".join(wrong) + "。")


@dataclass
class Part:
    """One graded part. ``check`` takes the objects named in ``needs`` and raises CheckFailed on a wrong answer;
    ``check is None`` marks a manually graded part (a task cell in the notebook)."""

    grade_id: str
    title: str
    points: int
    check: Callable | None = None
    needs: tuple[str, ...] = ()
    group: str = "code"

    @property
    def manual(self) -> bool:
        return self.check is None


@dataclass
class SourceMap:
    """A lesson's SOURCE_MAP part as data: the keys the student fills, the accepted names for each as sha256 prefixes
    of ``name(answer)`` (never the names: checks.py ships to students), and the line that opens the list of wrong
    entries. ``name`` is the spelling compared; lessons 6 and 8 keep their own (changing it would change verdicts)."""

    keys: list[str]
    hashes: dict[str, set[str]]
    unmapped: str = "这些概念没有对应到 vLLM 源码中实现它的名字"
    name: Callable[[str], str] = last_name
    title: str = "映射回源码对象"
    check: Callable = field(init=False, repr=False)

    def __post_init__(self) -> None:
        @graded
        def check_source_map(source_map) -> None:
            """Source mapping: for each key, the name in vLLM that holds it (one the lesson does not print)."""
            __tracebackhide__ = True
            check_name_map(source_map, self.keys, self.hashes, self.name_hash, self.unmapped)
        self.check = check_source_map

    def name_hash(self, answer) -> str:
        return hashlib.sha256(self.name(answer).encode()).hexdigest()[:16]


CODE_PARTS, QUESTIONS, QUESTION_POINTS, TOTAL = 4, 3, 2, 10  # every lesson: 4 × 1 code point + Q1～Q3 × 2 = 10


@dataclass
class Lesson:
    """A lesson's graded parts, declared by data; ``lesson_id`` matches solutions/<lesson_id>/.

    ``code`` maps a part's key (its grade id is ``lNN_<key>``) to (title, check) or (title, check, needs); needs
    default to ``answer``, the names the exercise defines. ``source_map`` adds the ``lNN_source_map`` part,
    ``questions`` the manual Q1～Q3 (``lNN_q<i>``, titled ``Q<i> <text>``). Every rule a lesson must meet is
    checked here, when it is declared, with what to add."""

    lesson_id: str
    title: str
    code: dict[str, tuple]
    answer: tuple[str, ...] = ()
    source_map: SourceMap | None = None
    questions: tuple[str, ...] = ()
    pass_mark: int = 8
    parts: list[Part] = field(init=False)
    total: int = field(init=False)

    def __post_init__(self) -> None:
        def rule(ok: bool, what: str) -> None:
            if not ok:
                raise ValueError(f"{self.lesson_id}: {what}")

        rule(LESSON_RE.match(self.lesson_id) is not None, "a lesson id is lessonNN (its folder solutions/lessonNN/)")
        pre = f"l{self.lesson_id[-2:]}"
        self.parts = []
        for key, spec in self.code.items():
            rule(isinstance(spec, tuple) and len(spec) in (2, 3) and callable(spec[1]),
                 f"code[{key!r}] is (title, check) or (title, check, needs), with check the function its grade cell calls")
            needs = tuple(spec[2]) if len(spec) == 3 else tuple(self.answer)
            rule(bool(needs), f"code[{key!r}] grades nothing: give the lesson answer=(the names the exercise defines,) "
                              "or the part its needs")
            self.parts.append(Part(f"{pre}_{key}", spec[0], 1, spec[1], needs))
        if self.source_map is not None:
            sm = self.source_map
            rule(set(sm.hashes) == set(sm.keys), f"source_map.hashes needs exactly the keys {list(sm.keys)}: missing "
                 f"{sorted(set(sm.keys) - set(sm.hashes))}, extra {sorted(set(sm.hashes) - set(sm.keys))}")
            bad = [k for k, hs in sm.hashes.items() if not hs or not all(re.fullmatch(r"[0-9a-f]{16}", h) for h in hs)]
            rule(not bad, f"source_map.hashes{bad}: add each accepted name as SourceMap.name_hash(name), 16 hex digits")
            self.parts.append(Part(f"{pre}_source_map", sm.title, 1, sm.check, ("SOURCE_MAP",)))
        n = len(self.parts)
        rule(n == CODE_PARTS, f"a lesson has exactly {CODE_PARTS} one-point code parts (main path, real engine, "
                              f"boundary, source map, or others in their place); it has {n}: "
                              + (f"add {CODE_PARTS - n}" if n < CODE_PARTS else f"remove {n - CODE_PARTS}"))
        rule(len(self.questions) == QUESTIONS, f"a lesson asks exactly {QUESTIONS} questions (Q1～Q3, the grading "
                                               f"table's `| Q1～Q3 |` row); it has {len(self.questions)}")
        self.parts += [Part(f"{pre}_q{i}", f"Q{i} {q}", QUESTION_POINTS, group="manual")
                       for i, q in enumerate(self.questions, 1)]
        ids = [p.grade_id for p in self.parts]
        rule(len(set(ids)) == len(ids), f"grade ids must differ: {ids}")
        self.total = sum(p.points for p in self.parts)
        rule(self.total == TOTAL, f"the parts add up to {self.total}, not {TOTAL}")
        rule(0 < self.pass_mark <= self.total, f"pass_mark {self.pass_mark} is not within 1..{self.total}")

    def part(self, grade_id: str) -> Part:
        return next(p for p in self.parts if p.grade_id == grade_id)


@dataclass
class PartResult:
    part: Part
    score: float | None  # None: manual, pending
    message: str = ""


def cell_source(cell: dict) -> str:
    """A notebook cell's text: nbformat writes it as one string or as a list of lines."""
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def nbgrader_meta(cell: dict) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def read_notebook(path: Path):
    """A notebook as nbformat reads it (as written: no version conversion). Not for the student's kernel, where
    _grade_cells reads the JSON itself: nbformat's import costs every kernel setup half a second (#33)."""
    import nbformat

    return nbformat.read(Path(path), as_version=nbformat.NO_CONVERT)


def discover_lessons(root: Path = REPO) -> list[str]:
    """Lesson ids, found by folder: solutions/lessonNN/lessonNN.py."""
    sol = root / "solutions"
    return sorted(p.name for p in sol.iterdir() if LESSON_RE.match(p.name) and (p / f"{p.name}.py").exists())


def load_lesson(lesson_id: str) -> Lesson:
    if not LESSON_RE.match(lesson_id):
        raise SystemExit(f"unknown lesson {lesson_id!r}: expected lessonNN, e.g. lesson01")
    try:
        return importlib.import_module(f"autograder.{lesson_id}").LESSON
    except ModuleNotFoundError as e:
        if e.name != f"autograder.{lesson_id}":
            raise
        raise SystemExit(f"no lesson {lesson_id!r}; the course has {', '.join(discover_lessons())}") from None


def run_part(part: Part, namespace: dict) -> PartResult:
    """Run one automatic part on a namespace; any exception is a failed part, reported in one line."""
    missing = [n for n in part.needs if n not in namespace]
    if missing:
        return PartResult(part, 0, f"笔记本里没有定义 {', '.join(missing)}（对应单元格没有运行或出错）")
    sink = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            warnings.simplefilter("ignore")
            with time_limit(), fixed_rng():
                part.check(*(namespace[n] for n in part.needs))
    except CheckFailed as e:
        cause = root_cause(e)
        return PartResult(part, 0, limit_verdict(cause) if cause else str(e))
    except BlankNotFilled as e:
        return PartResult(part, 0, blank_message(e))
    except (LimitExceeded, AssertionError) as e:
        return PartResult(part, 0, f"断言失败：{e}" if type(e) is AssertionError else str(e))
    except Exception as e:  # the student's code raised: show its last frame, not ours
        cause = root_cause(e)
        return PartResult(part, 0, limit_verdict(cause) if cause else student_error(e))
    return PartResult(part, part.points, "通过")


def timed_out(message: str) -> bool:
    return str(message).startswith("超时")


class Hung:
    """The answers that ran past the time limit in this run: a later part that calls one of them scores 0 at once
    with the same line, as the sandbox (`python -m autograder check`) does, so a looping answer costs one time
    limit in all, not one per part. Keyed by name and by the very object (a redefined answer runs again)."""

    def __init__(self) -> None:
        self.answers: dict[str, tuple[object, str]] = {}

    def stuck(self, part: Part, namespace: dict) -> str | None:
        for name in part.needs:
            obj, message = self.answers.get(name, (None, ""))
            if message and namespace.get(name) is obj:
                return message + SKIPPED_AFTER_TIMEOUT
        return None

    def note(self, part: Part, namespace: dict, result: PartResult) -> bool:
        """Remember the answers of a part that just ran into the limit (not of one skipped for an earlier hang)."""
        if not timed_out(result.message) or SKIPPED_AFTER_TIMEOUT in result.message:
            return False
        self.answers.update({n: (namespace.get(n), result.message) for n in part.needs})
        return True


KERNEL_HUNG = Hung()  # in a notebook's kernel: shared by the report, the self-check and the grade cells


def _snapshot(obj) -> object:
    """What must not change for a part's earlier pass to stand: a function's code, a class's functions' code,
    a plain container's repr; any other object only by identity."""
    if isinstance(obj, type):
        return tuple((k, getattr(v, "__code__", None)) for k, v in sorted(vars(obj).items()) if callable(v))
    if callable(obj):
        return getattr(obj, "__code__", None), getattr(obj, "__defaults__", None)
    if isinstance(obj, (dict, list, tuple, set, str, int, float)):
        return repr(obj)[:20000]
    return None


def answers_key(lesson: Lesson, namespace: dict) -> tuple:
    """Every answer the lesson's parts read, as they are now (the very objects and their snapshots): a helper
    the part does not name but calls (defined in the same exercise cell) is another part's answer."""
    names = sorted({n for p in lesson.parts for n in p.needs})
    return tuple((n, id(namespace.get(n)), _snapshot(namespace.get(n))) for n in names)


_PASSED: dict[tuple[str, str], tuple] = {}  # (lesson, grade_id) -> answers_key of the answers that passed it


def remember_pass(lesson: Lesson, r: PartResult, namespace: dict) -> None:
    """A part that passed on these answers in this kernel (the report cell's run, the self-check): its grade cell
    need not run the same complete check again while the answers stay the same objects with the same code."""
    if not r.part.manual and r.score == r.part.points:
        _PASSED[(lesson.lesson_id, r.part.grade_id)] = answers_key(lesson, namespace)


def full_check(lesson_id: str, grade_id: str, namespace: dict) -> None:
    """The end of a grade cell in a student's kernel (short_errors appends it): the part's complete check, the
    one the report cell, the self-check and the sandbox run, so the cell's ✓ means the part passes. Skipped when
    the same answers already passed it in this kernel (the report cell right after the exercise)."""
    __tracebackhide__ = True
    lesson = load_lesson(lesson_id)
    part = lesson.part(grade_id)
    key = answers_key(lesson, namespace)
    if _PASSED.get((lesson_id, grade_id)) != key:
        sink = io.StringIO()
        with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            warnings.simplefilter("ignore")
            graded(part.check)(*(namespace[n] for n in part.needs))
        _PASSED[(lesson_id, grade_id)] = key


def grade_namespace(lesson: Lesson, namespace: dict, on_timeout: Callable | None = None,
                    hung: Hung | None = None) -> list[PartResult]:
    """Every part graded on a live namespace, in order; after a part times out, the later parts that need the
    same answers are not run (Hung). `on_timeout(result)` is called as soon as a part times out."""
    hung, out = hung or Hung(), []
    for p in lesson.parts:
        if p.manual:
            out.append(PartResult(p, None, "待人工评分"))
            continue
        stuck = hung.stuck(p, namespace)
        r = PartResult(p, 0, stuck) if stuck else run_part(p, namespace)
        remember_pass(lesson, r, namespace)
        if hung.note(p, namespace, r) and on_timeout is not None:
            on_timeout(r)
        out.append(r)
    return out


def _to_python(source: str) -> str:
    """IPython syntax (magics, !shell) to plain Python, when IPython is there to do it."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:
        return source
    return TransformerManager().transform_cell(source)


def student_namespace(nb_path: Path) -> tuple[dict, list[str]]:
    """Execute the notebook's setup cell (grade_id ``*_setup``) and answer cells (nbgrader solution cells) in
    a fresh namespace. Demos and figures are skipped, so the self-check takes seconds.
    Returns the namespace and one line per cell that raised.
    """
    nb = read_notebook(nb_path)
    ns: dict = {"__name__": "__student__", "______": ______}
    errors: list[str] = []
    logging_disabled = logging.root.manager.disable  # the setup cell silences logging: undo it after
    with warnings.catch_warnings():
        _exec_cells(nb, ns, errors)
    logging.disable(logging_disabled)
    return ns, errors


def _exec_cells(nb: dict, ns: dict, errors: list[str]) -> None:
    for i, cell in enumerate(nb["cells"]):
        meta = nbgrader_meta(cell)
        setup = str(meta.get("grade_id", "")).endswith("_setup")
        if cell["cell_type"] != "code" or not (meta.get("solution") or setup):
            continue
        try:
            exec_source(_to_python(cell_source(cell)), ns, f"<cell {meta.get('grade_id', i)}>")
        except Exception as e:
            errors.append(f"单元格 {meta.get('grade_id', i)} 运行出错：{type(e).__name__}: {e}")


def exec_source(python: str, ns: dict, filename: str) -> None:
    """Run cell text in ns, output swallowed; @triton.jit reads its function's source through linecache, so the
    text is registered under `filename` first."""
    linecache.cache[filename] = (len(python), None, python.splitlines(keepends=True), filename)
    code = compile(python, filename, "exec")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        exec(code, ns)


def width(text: str) -> int:
    """Terminal columns (wcwidth): East Asian wide and fullwidth characters take two, combining marks none; a
    control character, which wcwidth cannot place, counts none."""
    from wcwidth import wcswidth, wcwidth

    n = wcswidth(text)
    return n if n >= 0 else sum(max(0, wcwidth(ch)) for ch in text)


def pad(text: str, cols: int) -> str:
    """Left-justify to `cols` display columns (at least one space after the text)."""
    return text + " " * max(1, cols - width(text))


def one_line(text: str, limit: int = 300) -> str:
    """A message as one table row: its lines joined, cut at `limit` characters."""
    flat = "；".join(x.strip() for x in str(text).splitlines() if x.strip())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _diagnosis(lesson_id: str, r: PartResult, sep: str) -> str:
    """sep + the misconception line of a failed code part (autograder/diagnosis.py), else ""."""
    if r.part.manual or r.score is None or r.score >= r.part.points:
        return ""
    from autograder.diagnosis import diagnose

    line = diagnose(lesson_id, r.part.grade_id, r.message)
    return sep + line if line else ""


def format_report(lesson: Lesson, results: list[PartResult]) -> tuple[str, bool]:
    """A table of points per part out of the lesson's total, and the pass verdict at the pass mark.
    Columns are aligned by display width (CJK titles count two columns a character)."""
    scores = ["-" if r.score is None else f"{r.score:g}" for r in results]
    cells = [(r.part.title, f"{s}/{r.part.points}", one_line(r.message) + _diagnosis(lesson.lesson_id, r, "　"))
             for r, s in zip(results, scores, strict=True)]
    w1 = max([width("部分"), *(width(c[0]) for c in cells)]) + 2
    w2 = max([width("得分"), *(width(c[1]) for c in cells)]) + 2
    lines = [f"{lesson.lesson_id} 自检：{lesson.title}", f"{pad('部分', w1)}{pad('得分', w2)}说明"]
    lines += [f"{pad(t, w1)}{pad(sc, w2)}{msg}" for t, sc, msg in cells]
    code = [r for r in results if not r.part.manual]
    got = sum(r.score for r in code)
    code_max = sum(r.part.points for r in code)
    pending = sum(r.part.points for r in results if r.score is None)
    best = got + pending
    lines.append(f"代码 {got:g}/{code_max}；人工评分 {pending} 分待评；通过线 {lesson.pass_mark}/{lesson.total}。")
    if best < lesson.pass_mark:
        lines.append(f"结论：未通过（即使人工部分满分，最多 {best:g}/{lesson.total}）。")
    elif got < code_max:  # the pass requires every code part: a partial code score is never "达标"
        lines.append(f"结论：代码部分还差 {code_max - got:g} 分（通过要求代码部分全部通过）：先修好上面标 0 分的部分；"
                     f"之后人工部分（Q1–Q3）至少还需 {lesson.pass_mark - code_max:g} 分。")
    else:
        need = lesson.pass_mark - got
        lines.append(f"结论：代码部分已达标；人工部分（Q1–Q3）至少还需 {need:g} 分才能通过。")
    return "\n".join(lines), all(r.score == r.part.points for r in code)


def report(lesson_id: str, namespace: dict) -> None:
    """Every code part of the lesson, one line each, without raising: the cell right after an exercise.
    Parts whose answers are not defined yet (a later exercise cell) say so instead of failing."""
    if os.environ.get("MINIVLLM_GRADING"):  # set by `grade` for nbgrader: the grade cells and sandbox do this work
        print("（评分时跳过逐项报告：成绩见各评分单元格）")
        return
    lesson, hung = load_lesson(lesson_id), KERNEL_HUNG
    for part in lesson.parts:
        if part.manual:
            continue
        if any(n not in namespace for n in part.needs):
            print(f"·  {part.title}：后面的练习还没运行（需要 {', '.join(n for n in part.needs if n not in namespace)}）",
                  flush=True)
            continue
        stuck = hung.stuck(part, namespace)
        r = PartResult(part, 0, stuck) if stuck else run_part(part, namespace)
        hung.note(part, namespace, r)
        remember_pass(lesson, r, namespace)
        print(f"{'✓' if r.score == part.points else '✗'}  {part.title}：{r.message}{_diagnosis(lesson_id, r, chr(10) + '   ')}",
              flush=True)


def find_notebook(lesson_id: str, given: str | Path | None = None, cwd: Path | None = None) -> Path:
    """The notebook `check` grades, from the notebook's folder or the repository root: the path as given, else
    that name (default LESSON.ipynb) here or under notebooks/LESSON/."""
    cwd = Path(cwd or Path.cwd())
    name = Path(given) if given else Path(f"{lesson_id}.ipynb")
    tried = [cwd / name, cwd / "notebooks" / lesson_id / name.name]
    found = next((p for p in tried if p.is_file()), None)
    if found is None:
        raise SystemExit(f"no notebook at {' or '.join(str(p) for p in tried)}: run this in the notebook's folder "
                         f"or the repository root, or give the path: python -m autograder check {lesson_id} PATH")
    return found


def self_check(lesson_id: str, namespace: dict | None = None, notebook: str | Path | None = None) -> bool:
    """Print the self-check table for a live namespace (inside the notebook: trusts the kernel) or a notebook
    file (the sandbox: only the answer definitions run, in a separate bounded process). Under `grade`
    (MINIVLLM_GRADING) the notebook's own self-check cell only says so: the grade cells and the sandbox score
    every part, and re-running every check in the kernel would cost each submission that time again."""
    if namespace is not None and os.environ.get("MINIVLLM_GRADING"):
        print("（评分时跳过自检：成绩见各评分单元格）")
        return False
    lesson = load_lesson(lesson_id)

    def first_timeout(r: PartResult) -> None:  # at once: the table comes only after every part
        print(f"✗  {r.part.title}：{r.message}（用到同一答案的其余部分不再运行）", flush=True)

    if namespace is None:
        if not Path(notebook).is_file():
            raise SystemExit(f"no notebook at {notebook}")
        from autograder.sandbox import GraderBroken, broken_message, grade_file

        try:
            results, errors = grade_file(lesson_id, Path(notebook), on_timeout=first_timeout)
        except GraderBroken as e:  # no score at all rather than a 0 that blames the answer
            print(f"{lesson_id} 自检：没有评分。{broken_message(str(e))}")
            raise SystemExit(2) from None
    else:
        results, errors = grade_namespace(lesson, namespace, on_timeout=first_timeout, hung=KERNEL_HUNG), []
    text, ok = format_report(lesson, results)
    print("\n".join(errors + [text]))
    return ok


PASSED_VISIBLE = ("只运行了可见断言（都成立）；本部分的完整检查不在这里运行，它的得分见评分反馈（或运行练习后的逐项报告"
                  "单元格与本课最后的自检）。")
PASSED_FULL = "通过（本部分的完整检查，与自检、评分相同）。"
BLANK_HEAD = "✗ 还有空 ______ 没有填写"  # the first line of every cell that stops at an unfilled blank


class SkippedHung(LimitExceeded):
    """A grade cell not run because an answer it needs already ran past the time limit in this kernel."""


def stop_hung(message: str) -> None:
    __tracebackhide__ = True
    raise SkippedHung(message)


FULL_TRACEBACK_ENV = "MINIVLLM_TRACEBACK"  # "full": grade cells show IPython's usual traceback
_RED, _RESET = "\x1b[1;31m", "\x1b[0m"
MORE = "（完整 traceback：在新单元格运行 %tb，或设环境变量 {env}=full）"


def _grade_cells(lesson_id: str) -> dict[str, str]:
    """grade_id -> the visible source of each grade cell in the released notebook (what a student's copy and
    nbgrader's run both start with: nbgrader only appends the hidden tests). Raw JSON: it runs in the student's
    kernel (read_notebook)."""
    path = NOTEBOOKS / lesson_id / f"{lesson_id}.ipynb"
    if not path.is_file():
        return {}
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    src = {nbgrader_meta(c).get("grade_id"): cell_source(c).strip()
           for c in cells if nbgrader_meta(c).get("grade") and c["cell_type"] == "code"}
    return {k: v for k, v in src.items() if k and v}


def _first_false(test, frame) -> str:
    """For a failed `assert`, the operand that is false and the values in it, e.g. `trace 实际是 ['schedule']`.
    Only call-free expressions are evaluated (evaluating a call would run the student's code again)."""
    def value(node):
        if any(isinstance(n, (ast.Call, ast.NamedExpr, ast.Await, ast.Yield)) for n in ast.walk(node)):
            raise LookupError
        return eval(compile(ast.Expression(node), "<assert>", "eval"), frame.f_globals, frame.f_locals)

    parts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
    for node in parts:
        try:
            if value(node):
                continue
        except Exception:  # not evaluable here: name the operand, the first that may be false
            return f"不成立的是 `{ast.unparse(node)[:120]}`"
        shown = [n for n in ([node.left, *node.comparators] if isinstance(node, ast.Compare) else [node])
                 if not isinstance(n, (ast.Constant, ast.List, ast.Tuple, ast.Dict, ast.Set))]
        vals = []
        for n in shown:
            with contextlib.suppress(Exception):
                vals.append(f"{ast.unparse(n)[:60]} 实际是 {value(n)!r:.200}")
        return f"不成立的是 `{ast.unparse(node)[:120]}`" + (f"：{'；'.join(vals)}" if vals else "")
    return ""


def failure_lines(part: Part, etype, value, tb, diagnosis: str = "") -> list[str]:
    """A failed grade cell in three lines: the part (and the misconception it behaves like); what is wrong; the
    first divergence or where it happened."""
    frames = [(f, n) for f, n in traceback.walk_tb(tb) if _in_cell(f.f_code.co_filename)]
    cell_frame, cell_line = frames[0] if frames else (None, 0)
    cell_src = linecache.getlines(cell_frame.f_code.co_filename) if cell_frame else []
    stmt = cell_src[cell_line - 1].strip() if 0 < cell_line <= len(cell_src) else ""
    head = (f"{_RED}✗ {part.title}（{part.grade_id}，{part.points} 分）未通过{_RESET}　" + MORE.format(env=FULL_TRACEBACK_ENV)
            + (f"　{diagnosis}" if diagnosis else ""))
    if isinstance(value, SkippedHung):
        return [head, str(value), "本单元格没有运行：先修好超时的答案，重新运行它所在的单元格，再运行本单元格。"]
    cause = root_cause(value)
    if isinstance(cause, BlankNotFilled):
        return [f"{_RED}{BLANK_HEAD}{_RESET}：{part.title}（{part.grade_id}，{part.points} 分）还不能评分。"
                + MORE.format(env=FULL_TRACEBACK_ENV), blank_message(cause), f"评分单元格第 {cell_line} 行：{stmt[:200]}"]
    if cause is not None:
        return [head, limit_verdict(cause), f"评分单元格第 {cell_line} 行：{stmt[:200]}"]
    if isinstance(value, CheckFailed):
        msg = [x for x in str(value).splitlines() if x.strip()] or ["检查未通过"]
        return [head, msg[0][:400], one_line("；".join(msg[1:]), 400) if msg[1:] else f"评分单元格第 {cell_line} 行：{stmt[:200]}"]
    if etype is AssertionError and len(frames) == 1:  # a visible assert of the grade cell itself
        what = f"断言失败：{value}" if str(value) else f"可见断言不成立（评分单元格第 {cell_line} 行）：{stmt[:200]}"
        try:
            node = next(n for n in ast.walk(ast.parse("".join(cell_src)))
                        if isinstance(n, ast.Assert) and n.lineno <= cell_line <= (n.end_lineno or n.lineno))
            why = _first_false(node.test, cell_frame) or f"评分单元格第 {cell_line} 行"
        except Exception:
            why = f"评分单元格第 {cell_line} 行"
        return [head, what, why]
    if out_of_memory(value):
        return [head, memory_message(), f"评分单元格第 {cell_line} 行：{stmt[:200]}"]
    return [head, f"运行你的代码时出错：{student_error(value)}", f"评分单元格第 {cell_line} 行：{stmt[:200]}"]


def cell_diagnosis(lesson_id: str, part: Part, value: BaseException, namespace: dict) -> str:
    """The misconception line for a failed grade cell. A check's verdict is diagnosed as it is; a visible assert
    that failed first stopped the cell before the check ran, so the check runs once here for its verdict — not
    after a time or memory limit (the answer would hang or grow again) or an unfilled blank."""
    if root_cause(value) is not None:
        return ""
    r = PartResult(part, 0, str(value)) if isinstance(value, CheckFailed) else run_part(part, namespace)
    return _diagnosis(lesson_id, r, "")


CJK_FONTS = ("Noto Sans CJK SC", "Noto Sans SC", "Source Han Sans SC", "Source Han Sans CN", "WenQuanYi Zen Hei",
             "WenQuanYi Micro Hei", "Droid Sans Fallback", "SimHei", "Microsoft YaHei", "PingFang SC", "Heiti SC",
             "Hiragino Sans GB", "Arial Unicode MS")
NO_CJK_FONT = ("（图中的中文需要中文字体，本机没有：图照常画出，中文显示为方框。想看到中文：Debian/Ubuntu/Colab 运行 "
               "`!apt-get -qq install fonts-noto-cjk`，然后重启内核。）")


def use_cjk_font() -> str | None:
    """The figures' Chinese labels: the first installed CJK font goes right after matplotlib's first sans-serif
    font (Latin glyphs stay as they were; matplotlib takes each missing glyph from the next font in the list).
    Without one, say once how to get one; the figures still draw (missing glyphs as boxes, their warnings
    silenced by the setup cell). Returns the font used, or None."""
    try:
        import matplotlib
        from matplotlib import font_manager
    except ImportError:
        return None
    installed = {f.name for f in font_manager.fontManager.ttflist}
    found = [f for f in CJK_FONTS if f in installed]
    if not found:
        print(NO_CJK_FONT)
        return None
    sans = [f for f in matplotlib.rcParams["font.sans-serif"] if f not in found]
    matplotlib.rcParams["font.sans-serif"] = sans[:1] + found[:1] + sans[1:]
    matplotlib.rcParams["axes.unicode_minus"] = False  # CJK fonts often lack U+2212
    return found[0]


def quiet_progress_bars() -> None:
    """No "Loading weights: 100%" bar (transformers' tqdm.auto: a widget in a notebook, stderr elsewhere) in a
    check's output when it loads the HF model as its oracle: the checks and the report capture stdout and stderr,
    not a widget, and a grade cell must not write to stderr."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # read when huggingface_hub / transformers import
    if "transformers" in sys.modules:
        with contextlib.suppress(Exception):
            sys.modules["transformers"].utils.logging.disable_progress_bar()
    if "huggingface_hub" in sys.modules:
        with contextlib.suppress(Exception):
            sys.modules["huggingface_hub"].utils.disable_progress_bars()


def short_errors(lesson_id: str, shell=None) -> None:
    """Make every failing grade cell of this lesson show three lines (failure_lines) instead of a traceback,
    in JupyterLab, Colab and nbgrader's run (hence its feedback). Other cells keep IPython's traceback.
    The full traceback stays one step away: `%tb` in a new cell, or MINIVLLM_TRACEBACK=full.
    Called by each lesson's locked setup cell; does nothing outside IPython."""
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return
        shell = get_ipython()
    if shell is None:
        return
    quiet_progress_bars()
    if not os.environ.get("MINIVLLM_GRADING") and not getattr(use_cjk_font, "done", False):  # figures are not graded
        use_cjk_font.done = True
        use_cjk_font()
    lesson, cells = load_lesson(lesson_id), _grade_cells(lesson_id)

    def grade_part(raw_cell: str) -> Part | None:
        src = (raw_cell or "").strip()
        ids = [gid for gid, visible in cells.items() if src.startswith(visible)]
        gid = max(ids, key=lambda g: len(cells[g]), default=None)
        return next((p for p in lesson.parts if p.grade_id == gid), None)

    def part_of(tb) -> Part | None:
        frame = next((f for f, _ in traceback.walk_tb(tb) if _in_cell(f.f_code.co_filename)), None)
        return grade_part("".join(linecache.getlines(frame.f_code.co_filename)) if frame else "")

    state: dict = {}

    def pre_run_cell(info) -> None:
        """A grade cell runs under the cell time limit (its visible asserts call the answers directly) and, when
        an answer it needs already timed out, not at all (GuardHung puts the stop in front of the cell)."""
        part = grade_part(getattr(info, "raw_cell", ""))
        state.clear()
        if part is None:
            return
        state["part"] = part
        state["stuck"] = KERNEL_HUNG.stuck(part, shell.user_ns)
        state["full"] = complete_check_missing(part, getattr(info, "raw_cell", ""))
        if not state["stuck"]:
            state["alarm"] = start_alarm(cell_timeout())

    def complete_check_missing(part: Part, raw_cell: str) -> bool:
        """A student's copy of a grade cell holds only visible asserts: its part's complete check is appended
        (GuardHung), unless the cell holds the hidden tests (nbgrader's, the instructor's), calls the check itself,
        or runs under `grade` (the sandbox runs every complete check there)."""
        visible = cells.get(part.grade_id, "")
        hidden = len((raw_cell or "").strip()) > len(visible)
        calls = re.search(rf"\b{re.escape(part.check.__name__)}\(", visible) is not None
        return not (hidden or calls or os.environ.get("MINIVLLM_GRADING"))

    def post_run_cell(result) -> None:
        part, alarm = state.pop("part", None), state.pop("alarm", None)
        stop_alarm(alarm)
        state.clear()
        if part is None or result is None:
            return
        error = result.error_before_exec or result.error_in_exec
        if error is None:
            visible = cells.get(part.grade_id, "")
            hidden = len((result.info.raw_cell or "").strip()) > len(visible) if result.info else False
            if hidden:
                print(f"✓ {part.title}：通过（含隐藏检查）。")
            elif os.environ.get("MINIVLLM_GRADING"):  # no ✓: the visible asserts are not the part's result
                print(f"{part.title}：{PASSED_VISIBLE}")
            else:
                print(f"✓ {part.title}：{PASSED_FULL}")
            return
        cause = root_cause(error)
        if isinstance(cause, LimitExceeded) and not isinstance(error, SkippedHung):
            KERNEL_HUNG.note(part, shell.user_ns, PartResult(part, 0, str(cause)))

    class GuardHung(ast.NodeTransformer):
        def visit_Module(self, node):
            stuck, part = state.get("stuck"), state.get("part")
            if stuck and node.body:
                guard = ast.parse(f"__import__('autograder.common').common.stop_hung({stuck!r})").body[0]
                node.body.insert(0, ast.copy_location(guard, node.body[0]))
            elif state.get("full") and part is not None and node.body:
                check = ast.parse(f"__import__('autograder.common').common.full_check({lesson_id!r}, "
                                  f"{part.grade_id!r}, globals())").body[0]
                node.body.append(ast.copy_location(check, node.body[-1]))
            return node

    for event, fn in (("pre_run_cell", pre_run_cell), ("post_run_cell", post_run_cell)):
        for old in [f for f in shell.events.callbacks[event] if getattr(f, "__name__", "") == fn.__name__
                    and getattr(f, "__module__", "") == __name__]:
            shell.events.unregister(event, old)  # a re-run setup cell replaces, never stacks, the hooks
        shell.events.register(event, fn)
    shell.ast_transformers[:] = [t for t in shell.ast_transformers if type(t).__name__ != "GuardHung"] + [GuardHung()]

    def handler(sh, etype, value, tb, tb_offset=None):
        sys.last_type, sys.last_value, sys.last_traceback = etype, value, tb  # for %tb
        if sys.version_info >= (3, 12):
            sys.last_exc = value
        part = part_of(tb)
        blank = root_cause(value)
        blank = blank if isinstance(blank, BlankNotFilled) else None
        if os.environ.get(FULL_TRACEBACK_ENV) == "full" or (part is None and blank is None):
            sh.showtraceback((etype, value, tb), tb_offset=tb_offset)
            return None
        stb = (failure_lines(part, etype, value, tb, cell_diagnosis(lesson_id, part, value, sh.user_ns)) if part
               else [f"{_RED}{BLANK_HEAD}{_RESET}：这个单元格用到的答案还没填完。" + MORE.format(env=FULL_TRACEBACK_ENV),
                     blank_message(blank)])
        sh._showtraceback(etype, value, stb)
        return stb

    shell.set_custom_exc((Exception,), handler)


# ---------------------------------------------------------------------------- what several lessons' checks share
def make_llm(**kw):
    """An in-process LLM on DEFAULT_MODEL; logging below ERROR is off, for a grade cell's stderr scores 0 in nbgrader."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    logging.disable(logging.WARNING)
    from minivllm.entrypoints.llm import LLM
    return LLM(DEFAULT_MODEL, multiprocess=False, **kw)


def shutdown(llm) -> None:
    llm.llm_engine.engine_core.shutdown()


@contextlib.contextmanager
def quiet_stderr_fd():
    """torch's profiler and TP workers write to file descriptor 2 from C++ or other processes; a grade cell must not."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


CHI_P_MIN = 1e-3  # fixed seeds: the solutions' p-values are far above this


def chi_square_p_value(counts, probs) -> float:
    """Pearson's chi-square; p-value = regularized upper gamma Q(df/2, x/2) (no scipy). A count on a
    zero-probability token is infinitely unlikely."""
    import torch

    keep = probs > 0
    expected = probs[keep] * counts.sum()
    stat = float(((counts[keep] - expected) ** 2 / expected).sum()) + (float("inf") if counts[~keep].sum() else 0.0)
    df = max(int(keep.sum()) - 1, 1)
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))
