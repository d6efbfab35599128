"""A new lesson's folders, made from lesson 1 as the worked example to replace (instructor side): its source in
the seed's section order, its package (declaration, checks, demo, mutants, vllm_view.py) with lesson 1's vLLM recording, every id renamed.
The copy builds, releases and grades as lesson 1 does, so `verify` passes before the first edit; then replace the
exercise, the checks, the mutants and the prose, running `verify` as you go."""
from __future__ import annotations

import json
import lzma
import re
from pathlib import Path

from autograder.common import LESSON_RE, REPO, discover_lessons

TEMPLATE = "lesson01"


def new_lesson(lesson_id: str, title: str, root: Path = REPO) -> list[Path]:
    if not LESSON_RE.match(lesson_id):
        raise SystemExit(f"unknown lesson id {lesson_id!r}: expected lessonNN, e.g. lesson13")
    if lesson_id in discover_lessons(root) or (root / "autograder" / lesson_id).exists():
        raise SystemExit(f"{lesson_id} exists already")
    n, t = int(lesson_id[-2:]), int(TEMPLATE[-2:])
    old_title = re.search(r'title="([^"]+)"', (root / "autograder" / TEMPLATE / "checks.py").read_text()).group(1)

    def renamed(text: str) -> str:
        text = text.replace(TEMPLATE, lesson_id).replace(f"l{t:02d}_", f"l{n:02d}_").replace(f"L{t:02d}", f"L{n:02d}")
        return text.replace(f"第 {t} 课", f"第 {n} 课").replace(f"Lesson {t} ", f"Lesson {n} ").replace(old_title, title)

    pairs = [(root / "solutions" / TEMPLATE / f"{TEMPLATE}.py", root / "solutions" / lesson_id / f"{lesson_id}.py")]
    pairs += [(p, root / "autograder" / lesson_id / p.name) for p in sorted((root / "autograder" / TEMPLATE).glob("*.py"))]
    written = []
    recording = root / "data" / "vllm_views" / f"{TEMPLATE}.json.xz"  # the view's recorded answers, until re-recorded
    if recording.is_file():
        rec = json.loads(lzma.decompress(recording.read_bytes()))
        rec["header"]["name"] = lesson_id
        dest = recording.with_name(f"{lesson_id}.json.xz")
        dest.write_bytes(lzma.compress(json.dumps(rec, ensure_ascii=False).encode()))
        written.append(dest.relative_to(root))
    for src, dest in pairs:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(renamed(src.read_text(encoding="utf-8")), encoding="utf-8")
        written.append(dest.relative_to(root))
    return written
