"""Where a student's code runs while it is graded: a private, throw-away world (issue #34).

nbgrader's kernel and the sandbox's checks both run a submission's code. Each run goes through `wrap`, which
starts it under bubblewrap (`bwrap`, Debian's `bubblewrap` package):

- a new mount namespace that holds only the system (/usr, /etc, the interpreter and the venv), the grader's
  autograder/, minivllm/, notebooks/ and data/ (all read-only), and the run's own scratch folder (read-write,
  thrown away afterwards); /tmp and HOME are private. Nothing else of the host exists there: not the course
  folder or its gradebook, not the other submissions, not solutions/;
- new network, PID, IPC and UTS namespaces: no connection leaves the run's own loopback, no process of the
  grader can be seen or signalled, and the run dies with its parent;
- as root (a grading server, CI, a container): the run drops to an unprivileged uid of its own with `setpriv`
  (one of MINIVLLM_SANDBOX_UIDS, 60000-60063, held by a lock while the run lives, like isolate's box uids), so
  RLIMIT_NPROC bounds a fork bomb to its own run: the kernel counts processes per uid, and with one shared uid a
  student's fork bomb starved every run graded beside it (`grade -j N`, two test workers) — OpenBLAS, finding no
  thread to start while numpy imports, raises SIGINT in the victim. The scratch folder is a size-capped tmpfs;
  without root: bwrap in a user namespace (the instructor's uid; the process cap counts from what that uid
  already runs, the disk cap is a per-file RLIMIT_FSIZE).

Limits per run (beside autograder/limits.py's time and memory): MINIVLLM_PROCESS_LIMIT (256 processes),
MINIVLLM_DISK_LIMIT_MB (1024 MiB). MINIVLLM_ISOLATION=off turns isolation off; when bwrap is missing or cannot
create namespaces, `grade` says so once and grades without it. Either way `grader_digest` lets `grade` verify,
before the class and after every student, that no file of the grader, the engine or the release changed.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import pwd
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from autograder.limits import limit_memory
from autograder.pin import REPO  # noqa: E402

DEFAULT_SANDBOX_UIDS = "60000-60063"
UID_LOCKS = Path("/tmp/minivllm-sandbox-uids")  # fixed, not $TMPDIR: every grader on the host must meet here
_run_uids: dict[Path, int] = {}  # scratch folder -> the uid its run has; written by scratch_dir alone
GRADER_DIRS = ("autograder", "minivllm", "notebooks", "data")
SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/sys")
DEFAULT_PROCESS_LIMIT = 256
DEFAULT_DISK_LIMIT_MB = 1024


def process_limit() -> int:
    return int(os.environ.get("MINIVLLM_PROCESS_LIMIT", DEFAULT_PROCESS_LIMIT))


def disk_limit_mb() -> int:
    return int(os.environ.get("MINIVLLM_DISK_LIMIT_MB", DEFAULT_DISK_LIMIT_MB))


def sandbox_uids() -> range:
    """The uids runs take as root, one per live run (MINIVLLM_SANDBOX_UIDS, "first-last")."""
    first, _, last = os.environ.get("MINIVLLM_SANDBOX_UIDS", DEFAULT_SANDBOX_UIDS).partition("-")
    return range(int(first), int(last or first) + 1)


def _owners() -> dict[int, int]:
    """{pid: uid} of every process seen from here."""
    out = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            with contextlib.suppress(OSError):
                out[int(p.name)] = p.stat().st_uid
    return out


def processes_of(uids) -> set[int]:
    """pids owned by one of `uids` (a run's processes, seen from the host)."""
    uids = set(uids)
    return {pid for pid, uid in _owners().items() if uid in uids}


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


@contextlib.contextmanager
def _uid_lease(deadline_s: float = 60.0) -> Iterator[int]:
    """A uid no other run holds, no account names and no process runs as, until the block ends.

    The lease is an flock on UID_LOCKS/<uid>, so graders in other processes (a second `grade`, test workers)
    never share one; the lock's fd is close-on-exec, so a run cannot hold it. On leaving, whatever still runs as
    the uid (a run's processes die with its namespace; this is the backstop) is killed before it is free again."""
    UID_LOCKS.mkdir(mode=0o700, exist_ok=True)
    st = os.lstat(UID_LOCKS)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise RuntimeError(f"{UID_LOCKS} must be a folder of this user's that no one else can write (remove it)")
    candidates = [u for u in sandbox_uids() if not _has_account(u)]
    if not candidates:
        raise RuntimeError(f"MINIVLLM_SANDBOX_UIDS={os.environ.get('MINIVLLM_SANDBOX_UIDS')}: every uid has an account")
    end = time.monotonic() + deadline_s
    while True:
        running = set(_owners().values())
        for uid in (u for u in candidates if u not in running):
            fd = os.open(UID_LOCKS / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield uid
            finally:
                for _ in range(50):  # the uid is this run's alone: whatever still runs as it is the run's
                    left = processes_of([uid])
                    if not left:
                        break
                    for pid in left:
                        with contextlib.suppress(OSError):
                            os.kill(pid, signal.SIGKILL)
                    time.sleep(0.1)
                os.close(fd)
            return
        if time.monotonic() > end:
            raise RuntimeError(f"no free sandbox uid in {sandbox_uids()} after {deadline_s:g} s "
                               "(raise MINIVLLM_SANDBOX_UIDS' range for more concurrent runs)")
        time.sleep(0.2)


@dataclass(frozen=True)
class Mode:
    """How runs are isolated here: "root" (bwrap + setpriv to a run's own uid), "user" (bwrap in a user namespace) or
    "none"; `reason` says why when it is "none"."""

    kind: str
    reason: str = ""

    @property
    def isolated(self) -> bool:
        return self.kind != "none"

    def __str__(self) -> str:
        return f"bubblewrap, {self.kind}" if self.isolated else f"OFF — {self.reason}"


def _bwrap_base(kind: str) -> list[str]:
    base = ["bwrap", "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent",
            "--new-session", "--dev", "/dev", "--proc", "/proc"]
    if kind == "user":
        base[1:1] = ["--unshare-user", "--disable-userns"]
    else:
        base += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    return base


@functools.lru_cache(maxsize=1)
def mode() -> Mode:
    if os.environ.get("MINIVLLM_ISOLATION", "").lower() in ("0", "off", "no", "false"):
        return Mode("none", "MINIVLLM_ISOLATION=off")
    if shutil.which("bwrap") is None:
        return Mode("none", "bubblewrap (`bwrap`) is not installed (Debian/Ubuntu: apt-get install bubblewrap)")
    kind = "root" if os.geteuid() == 0 and shutil.which("setpriv") else "user"
    probe = subprocess.run([*_bwrap_base(kind), "--ro-bind", "/", "/", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return Mode("none", f"bwrap cannot create namespaces here: {probe.stderr.strip()[:200]}")
    return Mode(kind)


KEPT_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ")  # beside MINIVLLM_*: all a graded run is given


def run_env(**extra: str) -> dict[str, str]:
    """The environment of a run that executes a student's code: an allow-list of the grader's (KEPT_ENV and the
    course's own MINIVLLM_* settings) plus `extra`. Anything else the instructor's shell holds (a token, a
    password, a cloud key) would otherwise be one `os.environ` away from the student's output."""
    env = {k: v for k, v in os.environ.items() if k in KEPT_ENV or k.startswith("MINIVLLM_")}
    return env | extra


def limit_run() -> None:
    """preexec_fn of every isolated run: the memory cap, the process cap, the per-file disk cap."""
    limit_memory()
    nproc = process_limit() + (0 if mode().kind == "root" else len(processes_of([os.getuid()])))
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    fsize = disk_limit_mb() * 2**20
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))


def kill(proc: subprocess.Popen) -> None:
    """A run started in a session of its own, killed with every process of its group, then reaped."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def wrap(argv: list[str], scratch: Path, cwd: Path | None = None, binds: tuple[Path, ...] = ()) -> list[str]:
    """argv run inside the isolated world; `scratch` is its only writable folder (HOME is inside it), `binds`
    extra read-only paths. Without isolation argv comes back as is."""
    m = mode()
    if not m.isolated:
        return argv
    ro = [(d, d) for d in SYSTEM_DIRS if os.path.lexists(d)]
    prefix = os.path.realpath(sys.prefix)  # the venv, also where sys.executable names it (e.g. through a link)
    ro += sorted({(os.path.realpath(sys.base_prefix),) * 2, (prefix, prefix), (prefix, os.path.abspath(sys.prefix))})
    ro += [(str(REPO / n),) * 2 for n in GRADER_DIRS if (REPO / n).exists()] + [(str(p),) * 2 for p in binds]
    parents = sorted({str(a) for _, dest in ro + [("", str(scratch))] for a in Path(dest).parents} - {"/", "/tmp"})
    # /tmp first (binds may lie in it), world-writable with the sticky bit: the run's uid is not bwrap's (root)
    cmd = _bwrap_base(m.kind) + ["--perms", "1777", "--size", str(256 * 2**20), "--tmpfs", "/tmp"]
    for d in parents:  # mount points' parents readable by the sandbox's uid (bwrap makes them 0700)
        cmd += ["--perms", "0755", "--dir", d]
    for src, dest in ro:
        cmd += ["--ro-bind", src, dest]
    cmd += ["--bind", str(scratch), str(scratch),
            "--setenv", "HOME", str(scratch / "home"), "--setenv", "TMPDIR", "/tmp",
            "--setenv", "MPLCONFIGDIR", str(scratch / "home" / ".matplotlib")]
    cmd += ["--chdir", str(cwd or scratch)]
    if m.kind == "root":
        uid = run_uid(scratch)
        cmd += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", "--"]
    return cmd + list(argv)


@contextlib.contextmanager
def scratch_dir(prefix: str = "minivllm-run-") -> Iterator[Path]:
    """A private folder for one run, removed afterwards; as root a tmpfs capped at MINIVLLM_DISK_LIMIT_MB, owned
    by the uid this run alone has (`wrap` runs as it, `give` hands files to it; the uid is free again last)."""
    with contextlib.ExitStack() as stack:
        path = Path(tempfile.mkdtemp(prefix=prefix))
        stack.callback(shutil.rmtree, path, ignore_errors=True)
        if mode().kind == "root":
            uid = stack.enter_context(_uid_lease())
            if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={disk_limit_mb()}m,mode=0700", "tmpfs",
                               str(path)], capture_output=True).returncode == 0:
                stack.callback(subprocess.run, ["umount", "-l", str(path)], capture_output=True)
            os.chown(path, uid, uid)
            _run_uids[path] = uid
            stack.callback(_run_uids.pop, path)
        mpl = path / "home" / ".matplotlib"
        mpl.mkdir(parents=True)
        cache = Path(os.environ.get("MPLCONFIGDIR") or Path.home() / ".cache" / "matplotlib")
        for f in cache.glob("fontlist-*.json"):  # matplotlib's font list: no rebuild of it in every run
            shutil.copyfile(f, mpl / f.name)
        give(path)
        yield path


def run_uid(path: Path) -> int:
    """The uid of the run whose scratch folder holds `path`."""
    for folder in (path, *path.parents):
        if folder in _run_uids:
            return _run_uids[folder]
    raise KeyError(f"{path} is in no live scratch folder")


def give(path: Path) -> None:
    """Hand a file or folder the parent prepared in a scratch folder to the sandbox's uid."""
    if mode().kind != "root":
        return
    uid = run_uid(path)
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        os.chown(p, uid, uid, follow_symlinks=False)


def copy_out(src: Path, dest: Path, max_bytes: int = 64 * 2**20) -> bool:
    """Copy one file a run left (`src`) to `dest`, if it is a regular file (not a link) of at most max_bytes.
    One named file, never a folder: whatever else the run wrote beside it (a page, a script) stays behind."""
    if src.is_symlink() or not src.is_file() or src.stat().st_size > max_bytes:
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    return True


def grader_digest(root: Path = REPO) -> dict[str, str]:
    """sha256 of every file of the grader, the engine and the release (compiled caches aside)."""
    out = {}
    for name in ("autograder", "minivllm", "notebooks"):
        for p in sorted((root / name).rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def changed_files(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
