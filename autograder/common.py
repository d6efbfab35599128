"""What every lesson's checks share: the blank, the parts of a score, and running them on a notebook.

A lesson module (autograder/lessonNN.py) defines ``LESSON = Lesson(...)``; its grade cells call the
same check functions the self-check calls, so nbgrader and ``python -m autograder check`` agree.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import io
import json
import linecache
import logging
import re
import traceback
import unicodedata
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from autograder.limits import LimitExceeded, memory_message, time_limit

REPO = Path(__file__).resolve().parent.parent
SOLUTIONS = REPO / "solutions"
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

    def __repr__(self) -> str:
        return "______"


______ = _Blank()


class CheckFailed(AssertionError):
    """A check's verdict: what was expected, what came, and where. Never a stack trace from our plumbing."""


def expect(cond: bool, msg: str) -> None:
    __tracebackhide__ = True  # IPython and pytest leave our frames out of the student's traceback
    if not cond:
        raise CheckFailed(msg)


def student_error(e: BaseException) -> str:
    """One line for an exception the student's code raised: its type, message and the cell line it came from."""
    tb = traceback.extract_tb(e.__traceback__)
    where = next((f"（{f.filename.strip('<>')}，第 {f.lineno} 行：{(f.line or '').strip()}）" for f in reversed(tb)
                  if f.filename.startswith("<cell") or f.filename.startswith("<ipython-input")
                  or "/ipykernel_" in f.filename), "")
    text = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}{where}"


def out_of_memory(e: BaseException) -> bool:
    """MemoryError, or torch's allocator failing under the memory cap."""
    return isinstance(e, MemoryError) or (isinstance(e, RuntimeError) and (
        "can't allocate memory" in str(e) or "out of memory" in str(e).lower()))


def blank_message(e: BlankNotFilled) -> str:
    """The blank's message plus the line of the student's cell that still holds it."""
    where = student_error(e).split("）", 1)[0].partition("（")[2]
    return f"{e}（{where}）" if where else str(e)


def graded(check: Callable) -> Callable:
    """A part check as grade cells call it: bounded by the cell timeout, and failing with one short line.

    CheckFailed and unfilled blanks pass through; running out of time or memory, or any exception from the
    student's code, becomes a CheckFailed naming the part's function and the first line of the cause.
    """
    @functools.wraps(check)
    def run(*args, **kwargs):
        __tracebackhide__ = True
        try:
            with time_limit():
                return check(*args, **kwargs)
        except CheckFailed:
            raise
        except BlankNotFilled as e:
            raise CheckFailed(blank_message(e)) from None
        except LimitExceeded as e:
            raise CheckFailed(str(e)) from None
        except AssertionError as e:
            raise CheckFailed(f"断言失败：{e}" if str(e) else "断言失败") from None
        except Exception as e:
            if out_of_memory(e):
                raise CheckFailed(memory_message()) from None
            raise CheckFailed(f"运行你的代码时出错：{student_error(e)}") from None
    return run


def last_name(name) -> str:
    """What most source maps compare: 'self.block_pool.touch()' / '`vllm.v1.core.block_pool.BlockPool.touch`'
    -> 'touch' (call parentheses, quotes, spaces and the dotted path dropped, lower-cased)."""
    s = re.sub(r"\(.*\)", "", str(name)).strip().strip("`").strip('"').replace(" ", "")
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
class Lesson:
    """A lesson's graded parts and its pass mark; ``lesson_id`` matches solutions/<lesson_id>/."""

    lesson_id: str
    title: str
    parts: list[Part]
    pass_mark: int = 8
    total: int = field(init=False)

    def __post_init__(self) -> None:
        self.total = sum(p.points for p in self.parts)

    def part(self, grade_id: str) -> Part:
        return next(p for p in self.parts if p.grade_id == grade_id)


@dataclass
class PartResult:
    part: Part
    score: float | None  # None: manual, pending
    message: str = ""


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
            with time_limit():
                part.check(*(namespace[n] for n in part.needs))
    except CheckFailed as e:
        return PartResult(part, 0, str(e))
    except BlankNotFilled as e:
        return PartResult(part, 0, blank_message(e))
    except (LimitExceeded, AssertionError) as e:
        return PartResult(part, 0, f"断言失败：{e}" if type(e) is AssertionError else str(e))
    except Exception as e:  # the student's code raised: show its last frame, not ours
        return PartResult(part, 0, memory_message() if out_of_memory(e) else student_error(e))
    return PartResult(part, part.points, "通过")


def grade_namespace(lesson: Lesson, namespace: dict) -> list[PartResult]:
    return [PartResult(p, None, "待人工评分") if p.manual else run_part(p, namespace) for p in lesson.parts]


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
    nb = json.loads(Path(nb_path).read_text(encoding="utf-8"))
    ns: dict = {"__name__": "__student__", "______": ______}
    errors: list[str] = []
    logging_disabled = logging.root.manager.disable  # the setup cell silences logging: undo it after
    with warnings.catch_warnings():
        _exec_cells(nb, ns, errors)
    logging.disable(logging_disabled)
    return ns, errors


def _exec_cells(nb: dict, ns: dict, errors: list[str]) -> None:
    for i, cell in enumerate(nb["cells"]):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        setup = str(meta.get("grade_id", "")).endswith("_setup")
        if cell["cell_type"] != "code" or not (meta.get("solution") or setup):
            continue
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        try:
            exec_source(_to_python(src), ns, f"<cell {meta.get('grade_id', i)}>")
        except Exception as e:
            errors.append(f"单元格 {meta.get('grade_id', i)} 运行出错：{type(e).__name__}: {e}")


def exec_source(python: str, ns: dict, filename: str) -> None:
    """Run cell text in ns, output swallowed; @triton.jit reads its function's source through linecache, so the
    text is registered under `filename` first."""
    linecache.cache[filename] = (len(python), None, python.splitlines(keepends=True), filename)
    code = compile(python, filename, "exec")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        exec(code, ns)


def pad(text: str, width: int) -> str:
    """Left-justify counting CJK characters as two columns."""
    cols = sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)
    return text + " " * max(1, width - cols)


def format_report(lesson: Lesson, results: list[PartResult]) -> tuple[str, bool]:
    """A table of points per part out of the lesson's total, and the pass verdict at the pass mark."""
    lines = [f"{lesson.lesson_id} 自检：{lesson.title}", f"{pad('部分', 18)}{pad('得分', 6)}说明"]
    for r in results:
        score = "-" if r.score is None else f"{r.score:g}"
        lines.append(f"{pad(r.part.title, 18)}{pad(score + '/' + str(r.part.points), 6)}{r.message}")
    code = [r for r in results if not r.part.manual]
    got = sum(r.score for r in code)
    code_max = sum(r.part.points for r in code)
    pending = sum(r.part.points for r in results if r.score is None)
    best = got + pending
    lines.append(f"代码 {got:g}/{code_max}；人工评分 {pending} 分待评；通过线 {lesson.pass_mark}/{lesson.total}。")
    if best < lesson.pass_mark:
        lines.append(f"结论：未通过（即使人工部分满分，最多 {best:g}/{lesson.total}）。")
    else:
        need = lesson.pass_mark - got
        lines.append(f"结论：代码部分已达标；人工部分（Q1–Q3）至少还需 {need:g} 分才能通过。")
    return "\n".join(lines), all(r.score == r.part.points for r in code)


def report(lesson_id: str, namespace: dict) -> None:
    """Every code part of the lesson, one line each, without raising: the cell right after an exercise.
    Parts whose answers are not defined yet (a later exercise cell) say so instead of failing."""
    import os

    if os.environ.get("MINIVLLM_GRADING"):  # set by `grade` for nbgrader: the grade cells and sandbox do this work
        print("（评分时跳过逐项报告：成绩见各评分单元格）")
        return
    lesson = load_lesson(lesson_id)
    for part in lesson.parts:
        if part.manual:
            continue
        if any(n not in namespace for n in part.needs):
            print(f"·  {part.title}：后面的练习还没运行（需要 {', '.join(n for n in part.needs if n not in namespace)}）")
            continue
        r = run_part(part, namespace)
        print(f"{'✓' if r.score == part.points else '✗'}  {part.title}：{r.message}")


def self_check(lesson_id: str, namespace: dict | None = None, notebook: str | Path | None = None) -> bool:
    """Print the self-check table for a live namespace (inside the notebook: trusts the kernel) or a notebook
    file (the sandbox: only the answer definitions run, in a separate bounded process)."""
    lesson = load_lesson(lesson_id)
    if namespace is None:
        if not Path(notebook).is_file():
            raise SystemExit(f"no notebook at {notebook}")
        from autograder.sandbox import grade_file

        results, errors = grade_file(lesson_id, Path(notebook))
    else:
        results, errors = grade_namespace(lesson, namespace), []
    text, ok = format_report(lesson, results)
    print("\n".join(errors + [text]))
    return ok
