"""The notebooks' Colab cell: one generated cell in all twelve lessons, pointing at the release; it keeps an
installed torch and triton exactly as they are (offline, from local wheels), says what to change when the clone
fails, and repairs on a re-run after pip failed.

A fresh venv sees this environment's packages through a .pth file (torch 2.13.0+cpu: older than the newest the
project allows, 2.14.1, which is in the local wheel folder) and gets triton 3.6.0 installed into it (older than
the `[triton]` extra's 3.8.0 pin). The cell, run as in Colab against a local git copy of the student release,
must leave both versions unchanged and the release's self-check must run.
"""
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from autograder.build import INSTALL_CELL, RELEASE_REPO, release_url
from autograder.common import NOTEBOOKS, REPO, discover_lessons
from autograder.release import release

WHEELS = [Path("/opt/pypi/files"), Path("/opt/pypi-more/files"), Path("/opt/wheels")]
OLD_TRITON = "triton-3.6.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"


def first_cell(path: Path) -> str:
    """The install cell: the first code cell, right under the lesson's title (the first thing a student reads)."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    assert cells[0]["cell_type"] == "markdown" and "".join(cells[0]["source"]).startswith("# 第"), path
    assert cells[1]["cell_type"] == "code", path
    return "".join(cells[1]["source"])


def markdown(path: Path) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
            if c["cell_type"] == "markdown"]


def test_every_notebook_has_the_one_generated_install_cell_and_a_colab_link():
    lessons = discover_lessons()
    assert lessons, "no lessons found under solutions/"
    cell = INSTALL_CELL.format(url=release_url())
    for lesson in lessons:
        for nb in (NOTEBOOKS / lesson / f"{lesson}.ipynb", REPO / "solutions" / lesson / f"{lesson}.ipynb"):
            assert first_cell(nb) == cell, nb
        link = (f"https://colab.research.google.com/github/{RELEASE_REPO}/blob/main/notebooks/{lesson}/{lesson}.ipynb")
        assert link in markdown(NOTEBOOKS / lesson / f"{lesson}.ipynb")[0]
    assert "MINIVLLM_REPO_URL" not in cell and "minivllm/minivllm.git" not in cell and " -q" not in cell
    assert f'"MINIVLLM_RELEASE_URL", "https://github.com/{RELEASE_REPO}.git"' in cell
    assert len(cell.splitlines()) <= 25  # a short cell: the install itself is autograder/colab.py in the release


def test_previous_and_next_links_follow_the_course_order():
    lessons = discover_lessons()
    titles = [next(x for x in markdown(NOTEBOOKS / le / f"{le}.ipynb")[0].splitlines() if x.startswith("# 第"))[2:]
              for le in lessons]
    assert [t.split("：")[0] for t in titles] == [f"第 {int(le[6:])} 课" for le in lessons]
    for i, lesson in enumerate(lessons):
        nav = [line for text in markdown(NOTEBOOKS / lesson / f"{lesson}.ipynb") for line in text.splitlines()
               if "上一课" in line or "下一课" in line]
        prev = [f"← 上一课：{titles[i - 1]}"] if i else []
        nxt = [f"下一课 →：{titles[i + 1]}"] if i + 1 < len(lessons) else ["本课程到此结束。"]
        assert nav == ["　｜　".join(prev + nxt)], (lesson, nav)


def run_cell(env: dict, home: Path, python: str = sys.executable, url: str = "/nonexistent/release",
             lesson: str = "lesson01", **extra) -> subprocess.CompletedProcess:
    env = dict(env, MINIVLLM_COLAB_INSTALL="1", MINIVLLM_RELEASE_URL=url, MINIVLLM_HOME=str(home), **extra)
    return subprocess.run([python, "-c", first_cell(NOTEBOOKS / lesson / f"{lesson}.ipynb")], env=env,
                          capture_output=True, text=True, timeout=600)


def test_a_failed_clone_names_the_url_and_the_setting(tmp_path):
    proc = run_cell(dict(os.environ), tmp_path / "home")
    assert proc.returncode != 0
    assert "[1/3] 克隆发行版 /nonexistent/release" in proc.stdout
    assert "克隆失败：无法从 /nonexistent/release 克隆" in proc.stderr
    assert "os.environ['MINIVLLM_RELEASE_URL']" in proc.stderr and "CalledProcessError" not in proc.stderr
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "notes.txt").write_text("x")
    proc = run_cell(dict(os.environ), tmp_path / "home")
    assert proc.returncode != 0 and "不是发行版的 git 克隆" in proc.stderr and "MINIVLLM_HOME" in proc.stderr


def version_of(python: Path, pkg: str) -> str:
    return subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version({pkg!r}))"],
                          capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_colab_cell_keeps_torch_and_triton(tmp_path):
    triton_wheel = next((d / OLD_TRITON for d in WHEELS if (d / OLD_TRITON).exists()), None)
    if triton_wheel is None or sys.version_info[:2] != (3, 11):
        pytest.skip("needs the local triton 3.6.0 cp311 wheel to build the venv offline")
    rel = tmp_path / "release"
    release(rel)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", str(rel)], check=True)
    subprocess.run([*git, "-C", str(rel), "add", "-A"], check=True)
    subprocess.run([*git, "-C", str(rel), "commit", "-qm", "release"], check=True)

    venv = tmp_path / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "course-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # after the venv's own
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(triton_wheel)], check=True)
    # The venv's bundled setuptools predates PEP 660 wheels: build with this environment's (offline, no isolation).
    subprocess.run([str(py), "-m", "pip", "uninstall", "-q", "-y", "setuptools"], check=True)
    before = {p: version_of(py, p) for p in ("torch", "triton")}
    assert before["triton"] == "3.6.0" and before["torch"].startswith("2.13"), before

    home = tmp_path / "home"
    links = [a for d in WHEELS if d.exists() for a in ("--find-links", str(d))]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PIP_NO_INPUT="1")
    pip_args = " ".join(["--no-index", "--no-build-isolation", *links])
    # A pip that fails after the clone: no "installed" marker, so the next run (another lesson's cell) repairs.
    failed = run_cell(env, home, str(py), str(rel), MINIVLLM_PIP_ARGS=pip_args + " --no-such-pip-option")
    assert failed.returncode != 0 and "pip 安装失败" in failed.stderr, failed.stdout + failed.stderr[-2000:]
    assert (home / ".git").is_dir() and not (home / ".minivllm-installed").exists()
    proc = run_cell(env, home, str(py), str(rel), lesson="lesson05", MINIVLLM_PIP_ARGS=pip_args)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "[1/3]" not in proc.stdout  # the clone is reused
    assert "[2/3] pip 安装" in proc.stdout and "Successfully installed minivllm" in proc.stdout  # progress shown
    assert "[3/3]" in proc.stdout and (home / ".minivllm-installed").exists()
    for lesson in discover_lessons():  # every lesson's cell now sees the finished install
        again = run_cell(env, home, str(py), str(rel), lesson=lesson)
        assert again.returncode == 0 and "minivllm 已安装在" in again.stdout, (lesson, again.stderr[-2000:])
    assert {p: version_of(py, p) for p in ("torch", "triton")} == before
    check = subprocess.run([str(py), "-m", "autograder", "check", "lesson01"],  # as the lesson prints it
                           cwd=home / "notebooks/lesson01", env=env,
                           capture_output=True, text=True, timeout=600)
    assert check.returncode == 1 and "代码 0/4" in check.stdout, check.stdout + check.stderr[-3000:]
    where = subprocess.run([str(py), "-c", "import autograder, minivllm; print(autograder.__file__, minivllm.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, env=env).stdout
    assert str(home) in where, where  # the release's packages, installed editable from the clone
