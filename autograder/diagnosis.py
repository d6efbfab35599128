"""Misconception diagnosis: which known wrong answer (a lesson's mutant) a failing part behaves like.

A part's behaviour signature is a salted hash of its failure verdict (the CheckFailed message, which states the
compared values or the first divergence) with run-dependent text dropped. Each lesson's table
(autograder/lessonNN/diagnosis.json, built by `python -m autograder diagnose --build`) maps
grade_id -> {signature -> [hint id]} and hint id -> hint text. It holds no mutant code, no `why` and no signature
of a right answer (a right answer never fails). Hint ids are salted hashes of mutant names, so only the
instructor (who has mutants.py) can name the mutant behind one.
"""
from __future__ import annotations

import functools
import hashlib
import json
import re
import secrets
from pathlib import Path

from autograder.common import REPO

PREFIX = "可能的误解："
NOT_AN_ANSWER = ("还有空 ______ 没有填写", "还没有填写", "笔记本里没有定义")  # unfilled blanks, cells not run
_NORMALIZE = [
    (re.compile(r"\x1b\[[0-9;]*m"), ""),                                    # ANSI colours
    (re.compile(r"^(运行你的代码时出错：)+"), ""),                             # graded() prefix; run_part has none
    (re.compile(r"（单元格 [^）]*?，第 \d+ 行："), "（单元格："),                # cell label and line differ by runner
    (re.compile(r"0x[0-9a-fA-F]+"), "0x_"),                                  # object addresses
    (re.compile(r"(?:/[\w.+-]+){2,}"), "<path>"),                            # temp dirs, install paths
    (re.compile(r"\d+(?:\.\d+)?\s*(?:ms|s|秒)(?![A-Za-z_])"), "<t>"),          # durations
    (re.compile(r"-?\d{10,}"), "<n>"),                                       # hash() values (seeded per process)
    (re.compile(r"worker rank \d+ raised"), "worker rank _ raised"),          # which TP rank fails first is a race
]


def path(lesson_id: str) -> Path:
    return REPO / "autograder" / lesson_id / "diagnosis.json"


def normalize(message: str) -> str:
    text = str(message).strip()
    for pattern, repl in _NORMALIZE:
        text = pattern.sub(repl, text)
    return " ".join(text.split())


def signature(salt: str, grade_id: str, message: str) -> str:
    """16 hex digits of sha256(salt, grade_id, normalized verdict): stable across runs, per lesson salted."""
    return hashlib.sha256(f"{salt}\0{grade_id}\0{normalize(message)}".encode()).hexdigest()[:16]


def hint_id(salt: str, mutant_name: str) -> str:
    return "m" + hashlib.sha256(f"{salt}\0mutant\0{mutant_name}".encode()).hexdigest()[:10]


@functools.cache
def table(lesson_id: str) -> dict:
    """The committed table: {"salt", "parts": {grade_id: {signature: [hint id]}}, "hints": {hint id: text}}."""
    p = path(lesson_id)
    return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else {"salt": "", "parts": {}, "hints": {}}


def applies(message: str) -> bool:
    return not any(s in str(message) for s in NOT_AN_ANSWER)


def lookup(lesson_id: str, grade_id: str, message: str) -> list[str]:
    """Hint ids whose mutant fails this part with this very verdict (empty: not a known mistake)."""
    t = table(lesson_id)
    return list(t["parts"].get(grade_id, {}).get(signature(t["salt"], grade_id, message), []))


def diagnose(lesson_id: str, grade_id: str, message: str) -> str:
    """The student's line for a failed part: the known misconception it behaves like; "" when it behaves like
    none (a student learns nothing from "not a known mistake": the verdict itself says what is wrong) or the part
    has no answer yet (a blank unfilled, a cell not run)."""
    if not applies(message):
        return ""
    hints = table(lesson_id)["hints"]
    texts = list(dict.fromkeys(hints[h] for h in lookup(lesson_id, grade_id, message) if h in hints))
    return PREFIX + " / ".join(texts[:2]) if texts else ""


# ---------------------------------------------------------------------------- instructor side
def hint_text(lesson_id: str, mutant) -> str:
    """The mutant's hint, or the generic one naming only its cell's first failing part's topic."""
    if mutant.hint:
        return mutant.hint
    from autograder.common import load_lesson

    lesson = load_lesson(lesson_id)
    title = next((p.title for p in lesson.parts if p.grade_id in mutant.fails), lesson.title)
    return f"这一部分（{title}）的行为与一种已知的错误答案相同：对照讲义重新检查这一步的逻辑。"


def hints(lesson_id: str, salt: str) -> dict[str, str]:
    from autograder.mutation import mutants

    return {hint_id(salt, name): hint_text(lesson_id, m) for name, m in sorted(mutants(lesson_id).items())}


def mutant_names(lesson_id: str, ids: list[str]) -> list[str]:
    """Instructor only: the mutants behind hint ids."""
    from autograder.mutation import mutants

    salt = table(lesson_id)["salt"]
    by_id = {hint_id(salt, n): n for n in mutants(lesson_id)}
    return [by_id.get(i, i) for i in ids]


# Verdicts that are no misconception, by a phrase of their message: the grade CSV and its chart name their kind
# rather than lumping them into "unknown" with the mistakes no mutant explains.
NOT_A_MISTAKE = (("超时", "limit: time"), ("内存超限", "limit: memory"), ("评分进程异常退出", "limit: process died"),
                 ("评分时不允许", "refused answer"), ("修改了评分器或引擎", "refused answer"),
                 ("提交的笔记本无法读取", "not graded: unreadable notebook"), ("评分这份提交时出错", "not graded: worker error"))


def label(lesson_id: str, grade_id: str, message: str) -> str:
    """The grade CSV's diagnosis column: the mutant names, a NOT_A_MISTAKE kind, 'unknown', or '' (passed / no
    answer)."""
    if not message or not applies(message):
        return ""
    kind = next((k for phrase, k in NOT_A_MISTAKE if phrase in message), None)
    if kind:
        return kind
    ids = lookup(lesson_id, grade_id, message)
    return "+".join(mutant_names(lesson_id, ids)) if ids else "unknown"


def failing_messages(lesson_id: str, nb: dict) -> dict[str, str]:
    """grade_id -> verdict of each failed code part of a notebook, graded in-process (as tests/test_mutants.py)."""
    import tempfile

    from autograder.common import grade_namespace, load_lesson, student_namespace

    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / f"{lesson_id}.ipynb"
        p.write_text(json.dumps(nb, ensure_ascii=False), encoding="utf-8")
        ns, _ = student_namespace(p)
        results = grade_namespace(load_lesson(lesson_id), ns)
    return {r.part.grade_id: r.message for r in results if not r.part.manual and r.score < r.part.points}


def build(lesson_id: str, only_hints: bool = False) -> Path:
    """Grade every mutant of the lesson and write its table; `only_hints` keeps the signatures, renews texts."""
    from autograder.mutation import mutant_notebook, mutants

    old = table(lesson_id)
    salt = old["salt"] or secrets.token_hex(8)
    parts: dict[str, dict[str, list[str]]] = old["parts"] if only_hints else {}
    if not only_hints:
        for name in sorted(mutants(lesson_id)):
            for gid, msg in failing_messages(lesson_id, mutant_notebook(lesson_id, name)).items():
                if applies(msg):
                    ids = parts.setdefault(gid, {}).setdefault(signature(salt, gid, msg), [])
                    ids.append(hint_id(salt, name))
    out = {"salt": salt, "parts": {g: dict(sorted(s.items())) for g, s in sorted(parts.items())},
           "hints": hints(lesson_id, salt)}
    path(lesson_id).write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    table.cache_clear()
    return path(lesson_id)
