"""The Colab install, after the notebook's first code cell has cloned the student release into HOME: pip-install
the release there without touching the torch and triton Colab ships, check the import, and mark HOME installed
(`.minivllm-installed`, written last, so a re-run after any failure repairs). Called by that cell
(autograder/build.py INSTALL_CELL); ships in the release.

Settings (environment): MINIVLLM_PIP_ARGS, extra pip arguments (tests: `--no-index --find-links ...`).
"""
from __future__ import annotations

import os
import subprocess
import sys

CJK_NOTE = ("图中的中文需要一个中文（CJK）字体；Colab 默认没有，图里的中文会显示为方框（其余一切照常）。"
            "想看到中文：运行 `!apt-get -qq install fonts-noto-cjk`，再重启运行时（Runtime → Restart session）。")


class InstallFailed(Exception):
    def _render_traceback_(self):  # IPython shows the message, not a traceback
        return str(self).splitlines()


def phase(title: str, cmd: list[str], show: tuple[str, ...], hint: str) -> None:
    """Run one phase, printing its title and the output lines that start with `show`; on failure raise with
    the last lines and `hint`."""
    print(title, flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    for line in proc.stdout:
        tail = (tail + [line.rstrip()])[-12:]
        if line.startswith(show):
            print("    " + line.rstrip()[:150], flush=True)
    if proc.wait():
        raise InstallFailed("\n".join([*tail, "", hint]))


def install(home: str) -> None:
    """pip install -e HOME with the installed torch and triton pinned as constraints (pip may add packages, never
    swap these), then an import check; nothing to do when HOME is already marked installed."""
    from importlib.metadata import PackageNotFoundError, version

    done = os.path.join(home, ".minivllm-installed")
    if os.path.exists(done):
        with open(done) as f:
            print(f"minivllm 已安装在 {home}（{f.read().strip()}）")
        return
    keep = []
    for pkg in ("torch", "triton"):
        try:
            keep.append(f"{pkg}=={version(pkg)}")
        except PackageNotFoundError:
            pass
    constraints = os.path.join(home, "keep-installed.txt")
    with open(constraints, "w") as f:
        f.write("\n".join(keep) + "\n")
    phase(f"[2/3] pip 安装 {home}（保留 {', '.join(keep) or '无'}；约 2 分钟）",
          [sys.executable, "-m", "pip", "install", "--progress-bar", "off", "-c", constraints, "-e", home,
           *os.environ.get("MINIVLLM_PIP_ARGS", "").split()],
          ("Collecting", "Installing", "Successfully", "ERROR"), "pip 安装失败（见上面几行）。修好原因后重跑本单元格：它会重新安装。")
    phase("[3/3] 检查 minivllm 与 autograder 能否导入", [sys.executable, "-c", "import minivllm, autograder.common"],
          ("Traceback", "ModuleNotFoundError", "ImportError"), "导入失败（见上面几行）：重跑本单元格会重新安装。")
    with open(done, "w") as f:
        f.write(" ".join(keep) + "\n")
    print(f"完成：minivllm 已安装在 {home}")
    if not cjk_font_installed():
        print(CJK_NOTE)


def cjk_font_installed() -> bool:
    """Whether fontconfig knows a font with Chinese glyphs (False where fc-list is missing)."""
    try:
        out = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return bool(out.strip())
