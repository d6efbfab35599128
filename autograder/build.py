"""Build the course notebooks: solutions/lessonNN/lessonNN.py (jupytext percent) -> the solution .ipynb ->
notebooks/lessonNN/lessonNN.ipynb through `nbgrader generate_assignment`.

Output is deterministic: no outputs, execution counts, timestamps or machine paths; cell ids are stable
(the nbgrader grade_id, else the lesson id and the cell's index).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

from autograder.common import REPO, discover_lessons
from autograder.pin import VLLM_COMMIT, VLLM_VERSION

# Where the student release is published (`python -m autograder release DIR`, then push DIR there): the one
# setting behind every notebook's install cell and "Open in Colab" link. Rebuild after changing it.
RELEASE_REPO = os.environ.get("MINIVLLM_RELEASE_REPO", "minivllm/minivllm-release")
RELEASE_BRANCH = os.environ.get("MINIVLLM_RELEASE_BRANCH", "main")
COLAB_PLACEHOLDER = "# COLAB INSTALL CELL: autograder/build.py writes INSTALL_CELL here"  # every source's first cell
NAV_LINE = ("← 上一课", "下一课 →")  # the lines of a lesson source that build.py rewrites
RUBRIC_LAST_ROW = "| Q1～Q3 |"  # the grading table of every lesson ends with this row; GRADING_RUNS follows it
GRADING_RUNS = ("nbgrader 评分时只运行准备单元格、答案单元格、评分单元格和你自己添加的单元格；演示、图和“检查方法”"
                "单元格不运行（不计分，反馈里标着“评分时未运行”），所以答案不能依赖它们。")

INSTALL_CELL = """\
# Colab：安装本课程的学生发行版（不含答案）；本地（make lab）跳过安装。十二课相同，由 autograder/build.py 生成。
# 设置 MINIVLLM_RELEASE_URL：教师发布的发行版 git 地址。失败时按提示改好后重跑本单元格即可修复。
import os
import subprocess
import sys

if "google.colab" in sys.modules or os.environ.get("MINIVLLM_COLAB_INSTALL"):
    HOME = os.environ.get("MINIVLLM_HOME", "/content/minivllm")
    URL = os.environ.get("MINIVLLM_RELEASE_URL", "{url}")
    if not os.path.isdir(os.path.join(HOME, ".git")):
        if os.path.exists(HOME) and os.listdir(HOME):
            raise SystemExit(f"{{HOME}} 已存在但不是发行版的 git 克隆：删掉它，或把 MINIVLLM_HOME 设为别的文件夹。")
        print(f"[1/3] 克隆发行版 {{URL}} -> {{HOME}}", flush=True)
        if subprocess.run(["git", "clone", "--depth", "1", URL, HOME]).returncode:
            raise SystemExit(f"克隆失败：无法从 {{URL}} 克隆。请先运行 "
                             "os.environ['MINIVLLM_RELEASE_URL'] = '<教师发布的发行版 git 地址>'，再重跑本单元格。")
    if HOME not in sys.path:
        sys.path.insert(0, HOME)
    from autograder.colab import install  # pip 安装（保留 Colab 的 torch 与 triton）与导入检查

    install(HOME)
from autograder.vllm_source import notebook_setup  # noqa: E402

notebook_setup()  # vLLM {vllm} 源码：只获取一次并按官方 sha256 校验（make vllm-source），之后离线；评分时不运行""".replace("{vllm}", VLLM_VERSION)


def release_url(repo: str = RELEASE_REPO) -> str:
    return f"https://github.com/{repo}.git"


def colab_link(lesson_id: str, repo: str = RELEASE_REPO, branch: str = RELEASE_BRANCH) -> str:
    url = f"https://colab.research.google.com/github/{repo}/blob/{branch}/notebooks/{lesson_id}/{lesson_id}.ipynb"
    return f"[在 Colab 中打开本课]({url})（发行版：`{repo}`）"


PIN_PLACEHOLDERS = {"{{VLLM_VERSION}}": VLLM_VERSION, "{{VLLM_COMMIT}}": VLLM_COMMIT}


def expand_pin(text: str) -> str:
    """A lesson source's text with the pinned vLLM version and commit (autograder/pin.py) in its placeholders:
    the notebooks show the numbers, the sources name them once, here."""
    for placeholder, value in PIN_PLACEHOLDERS.items():
        text = text.replace(placeholder, value)
    return text


def generated_cells(nb: nbformat.NotebookNode, lesson_id: str, root: Path = REPO) -> nbformat.NotebookNode:
    """Fill what one source must not repeat in every lesson: the install cell (the source's first cell is the
    placeholder), the "Open in Colab" line under the title, the previous/next lesson line and, under the
    grading table, which cells autograde runs (autograder/preprocessors.py SkipUngradedCells)."""
    for cell in nb.cells:
        cell.source = expand_pin(cell.source)
    first = nb.cells[0]
    if first.cell_type != "code" or first.source.strip() != COLAB_PLACEHOLDER:
        raise SystemExit(f"{lesson_id}: the first cell must be the placeholder `{COLAB_PLACEHOLDER}`")
    first.source = INSTALL_CELL.format(url=release_url())
    title = next(c for c in nb.cells if c.cell_type == "markdown" and c.source.startswith("# "))
    head, _, rest = title.source.partition("\n")
    title.source = "\n".join([head, "", colab_link(lesson_id), rest]).rstrip("\n")
    nb.cells.remove(first)  # the title first; the install cell right under it
    nb.cells.insert(nb.cells.index(title) + 1, first)
    setup_guard(nb, lesson_id)
    manual_answer_cells(nb, lesson_id)
    nav = lesson_nav(lesson_id, root)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            lines = [nav if line.startswith(NAV_LINE) else line for line in cell.source.split("\n")]
            rubric = next((i for i, line in enumerate(lines) if line.startswith(RUBRIC_LAST_ROW)), None)
            if rubric is not None:
                lines[rubric + 1:rubric + 1] = ["", GRADING_RUNS]
            cell.source = "\n".join(lines)
    if sum(GRADING_RUNS in c.source for c in nb.cells if c.cell_type == "markdown") != 1:
        raise SystemExit(f"{lesson_id}: the grading table must end with one `{RUBRIC_LAST_ROW}` row")
    collapse_appendix(nb, lesson_id)
    return nb


def collapse_appendix(nb: nbformat.NotebookNode, lesson_id: str) -> None:
    """The optional appendix (autograder/stats.py APPENDIX_HEADING) starts collapsed in JupyterLab, so the core path
    is what a student scrolls through; it must come after the grading rules, and its sections must be `###` or
    deeper (a `##` heading inside it would end the collapsed section)."""
    from autograder.stats import APPENDIX_HEADING, appendix_start

    try:
        start = appendix_start(nb.cells)
    except ValueError as e:
        raise SystemExit(f"{lesson_id}: {e}") from None
    if start is None:
        return
    rules = next(i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and GRADING_RUNS in c.source)
    if start < rules:
        raise SystemExit(f"{lesson_id}: `{APPENDIX_HEADING}` must come after the grading rules")
    for cell in nb.cells[start:]:
        inner = [line for line in cell.source.split("\n") if re.match(r"#{1,2} ", line)]
        if cell.cell_type == "markdown" and inner[1 if cell is nb.cells[start] else 0:]:
            raise SystemExit(f"{lesson_id}: the appendix's sections must be `###` or deeper: {inner[-1]!r}")
    nb.cells[start].metadata[COLLAPSED] = True


SETUP_GUARD = 'assert "{alias}" in globals(), "先运行本课开头的准备单元格（{setup}，要无错运行完），再运行本单元格。"'


def setup_guard(nb: nbformat.NotebookNode, lesson_id: str) -> None:
    """Every code cell after the setup (grade, report, self-check and demo cells; not the answer cells) starts with
    one line that names the setup cell when it has not run: such a cell run first, e.g. after a kernel restart,
    would otherwise show `NameError: name 'report' is not defined` (nothing of the course is loaded yet to say
    better). The alias is the one the setup cell imports the lesson's checks as."""
    setup = next((c for c in nb.cells if c.cell_type == "code"
                  and str(c.metadata.get("nbgrader", {}).get("grade_id", "")).endswith("_setup")), None)
    found = re.search(rf"^from autograder import {lesson_id} as (\w+)", setup.source if setup else "", re.M)
    if found is None:
        raise SystemExit(f"{lesson_id}: the setup cell must import `from autograder import {lesson_id} as LNN`")
    guard = SETUP_GUARD.format(alias=found.group(1), setup=setup.metadata["nbgrader"]["grade_id"])
    after = nb.cells[nb.cells.index(setup) + 1:]
    for cell in after:  # grade cells, the report and self-check cells, demos: after a kernel restart, this line
        meta = cell.metadata.get("nbgrader", {})  # (answer cells stay as the student writes them)
        if cell.cell_type == "code" and not meta.get("solution") and cell.source.strip():
            cell.source = guard + "\n" + cell.source


def manual_answer_cells(nb: nbformat.NotebookNode, lesson_id: str) -> None:
    """Put each manual part's score on the student's answer. A source writes a question as nbgrader's task cell
    (with its points and mark scheme) followed by a plain `你的答案：` cell; formgrader would put the score box on
    the question, with the answer below it next to the following question's box. Here the answer becomes the
    manually graded answer cell (grade + solution, the part's grade_id and points) and the question a locked
    read-only cell that keeps the mark scheme (formgrader shows it; release and feedback clear it). As nbgrader
    does for every answer cell, an answer left as released scores 0 at autograde; one the student wrote stays
    pending until graded."""
    for cell, answer in zip(nb.cells, nb.cells[1:], strict=False):
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "markdown" or not meta.get("task"):
            continue
        if answer.cell_type != "markdown" or answer.metadata.get("nbgrader") or not answer.source.startswith("你的答案"):
            raise SystemExit(f"{lesson_id}: task cell {meta['grade_id']} must be followed by a plain `你的答案：` cell")
        gid, points = meta["grade_id"], meta["points"]
        cell.metadata["nbgrader"] = {"grade": False, "grade_id": f"{gid}_question", "locked": True,
                                     "schema_version": 3, "solution": False, "task": False}
        answer.metadata["nbgrader"] = {"grade": True, "grade_id": gid, "locked": False, "points": points,
                                       "schema_version": 3, "solution": True, "task": False}
        answer.source = (f"**{gid.rsplit('_', 1)[-1].upper()} 你的答案**（{points} 分，教师在这个单元格上打分）：\n\n"
                         "### BEGIN SOLUTION\n（参考答案与评分要点在上面题目单元格的评分规则里。）\n### END SOLUTION")


def lesson_title(lesson_id: str, root: Path = REPO) -> str:
    """'第 3 课：…' from the source's first markdown heading."""
    for line in (root / "solutions" / lesson_id / f"{lesson_id}.py").read_text(encoding="utf-8").splitlines():
        if line.startswith("# # "):
            return expand_pin(line[4:].strip())
    raise SystemExit(f"{lesson_id}: no `# # 第 N 课：…` title line")


def lesson_nav(lesson_id: str, root: Path = REPO) -> str:
    """The previous/next line at a lesson's end, from the course order (the first has no previous lesson,
    the last no next one)."""
    order = discover_lessons(root)
    i = order.index(lesson_id)
    links = ([f"← 上一课：{lesson_title(order[i - 1], root)}"] if i > 0 else []) + (
        [f"下一课 →：{lesson_title(order[i + 1], root)}"] if i + 1 < len(order) else ["本课程到此结束。"])
    return "　｜　".join(links)

KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
CONFIG = Path(__file__).resolve().parent / "nbgrader_config.py"
COLLAPSED = "jp-MarkdownHeadingCollapsed"  # JupyterLab's own key: the heading's section starts folded
_KEEP_CELL_META = ("nbgrader", "tags", "deletable", "editable", COLLAPSED)


def normalize(nb: nbformat.NotebookNode, lesson_id: str) -> nbformat.NotebookNode:
    """Strip everything a run or a machine adds; give every cell a stable id."""
    nb.nbformat, nb.nbformat_minor = 4, 5
    nb.metadata = nbformat.NotebookNode(kernelspec=dict(KERNELSPEC), language_info={"name": "python"})
    for i, cell in enumerate(nb.cells):
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        cell.id = grade_id or f"{lesson_id}-{i:03d}"
        cell.metadata = nbformat.NotebookNode({k: v for k, v in cell.metadata.items() if k in _KEEP_CELL_META})
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        cell.pop("attachments", None)
    return nb


def dumps(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb, version=4).rstrip("\n") + "\n"


def nbgrader_env(grading: bool) -> dict[str, str]:
    """The environment of an nbgrader command: this interpreter's bin/ first on PATH (nbgrader runs `alembic` and
    the kernel from PATH, and the venv may not be activated). While grading (a student's notebook runs in it) only
    the allow-list of isolation.run_env, plus MINIVLLM_GRADING=1, which keeps the per-part report cell quiet."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    if grading:
        from autograder.isolation import run_env

        return run_env(PATH=path, MINIVLLM_GRADING="1")
    return dict(os.environ, PATH=path)


def nbgrader(args: list[str], course: Path) -> subprocess.CompletedProcess:
    """Run one nbgrader command (not a student's notebook: `grade` starts autograde itself, isolated) in a course
    folder; raise with its log when it fails."""
    proc = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, capture_output=True, text=True,
                          env=nbgrader_env(grading=False))
    if proc.returncode != 0:
        raise RuntimeError(f"nbgrader {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def new_course(course: Path) -> Path:
    course.mkdir(parents=True, exist_ok=True)
    shutil.copy(CONFIG, course / "nbgrader_config.py")
    (course / "exchange").mkdir(exist_ok=True)
    return course


def solution_notebook(lesson_id: str, root: Path = REPO) -> nbformat.NotebookNode:
    import jupytext

    nb = jupytext.read(root / "solutions" / lesson_id / f"{lesson_id}.py", fmt="py:percent")
    return normalize(generated_cells(nb, lesson_id, root), lesson_id)


def release_notebook(lesson_id: str, solution: nbformat.NotebookNode) -> nbformat.NotebookNode:
    with tempfile.TemporaryDirectory(prefix="minivllm-build-") as tmp:
        course = new_course(Path(tmp))
        src = course / "source" / lesson_id
        src.mkdir(parents=True)
        (src / f"{lesson_id}.ipynb").write_text(dumps(solution), encoding="utf-8")
        nbgrader(["generate_assignment", lesson_id, "--force"], course)
        release = nbformat.read(course / "release" / lesson_id / f"{lesson_id}.ipynb", as_version=4)
    return normalize(release, lesson_id)


def build_files(root: Path = REPO, lessons: list[str] | None = None) -> dict[Path, str]:
    """Every generated file (path relative to root -> text)."""
    files = {}
    for lesson_id in lessons or discover_lessons(root):
        sol = solution_notebook(lesson_id, root)
        files[Path("solutions", lesson_id, f"{lesson_id}.ipynb")] = dumps(sol)
        files[Path("notebooks", lesson_id, f"{lesson_id}.ipynb")] = dumps(release_notebook(lesson_id, sol))
    return files


def build(root: Path = REPO, check: bool = False, lessons: list[str] | None = None) -> list[Path]:
    """Write the generated files, or with check=True only list the ones that differ from a fresh build."""
    stale = []
    for rel, text in build_files(root, lessons).items():
        path = root / rel
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            stale.append(rel)
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
    return stale
