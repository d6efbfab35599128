"""Every socket a `-tp 2` server listens on is bound to loopback (issue #31, Security), and a killed worker's
real exit (the signal) reaches the log.

The listening sockets of every process of the server (API server, EngineCore, both workers) are read from
/proc: each process's socket inodes (/proc/PID/fd) matched against /proc/net/tcp{,6} rows in LISTEN state.
Before the fix, rank 0's TCPStore listened on [::] (every interface).
"""
from __future__ import annotations

import ipaddress
import os
import signal
import socket
import time
from pathlib import Path

import httpx
import pytest
from test_api_server import API_KEY, NAME, free_port, launch_server, stop_server

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux /proc")


def process_tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except FileNotFoundError:
                pass
    return pids


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").glob("*"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _address(hex_addr: str) -> str:
    """/proc/net/tcp's address: 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hex_addr)
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(raw))


def listening_sockets(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket this process listens on."""
    inodes, found = _socket_inodes(pid), []
    for table in (f"/proc/{pid}/net/tcp", f"/proc/{pid}/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # TCP_LISTEN
                host, port = local.split(":")
                found.append((_address(host), int(port, 16)))
    return found


def test_proc_parsing_sees_a_wildcard_and_a_loopback_listener():
    """The helper itself: it reports what this process listens on, [::] included (so it can fail)."""
    with socket.socket(socket.AF_INET6) as any6, socket.socket() as lo:
        any6.bind(("::", 0))
        any6.listen()
        lo.bind(("127.0.0.1", 0))
        lo.listen()
        got = set(listening_sockets(os.getpid()))
        assert ("::", any6.getsockname()[1]) in got and ("127.0.0.1", lo.getsockname()[1]) in got


@pytest.mark.slow
def test_tp2_server_listens_only_on_loopback_and_logs_a_killed_workers_signal(tmp_path, tiny_model):
    model = tiny_model("llama")
    port = free_port()
    log = open(tmp_path / "server.log", "w+")
    proc = launch_server(model, port, log, "-tp", "2")
    try:
        url = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {API_KEY}"}
        r = httpx.post(f"{url}/v1/completions", headers=headers, timeout=60,
                       json={"model": NAME, "prompt": "ROMEO:", "max_tokens": 4})
        assert r.status_code == 200, r.text
        pids = process_tree(proc.pid)
        assert len(pids) >= 4, pids  # API server, EngineCore, two workers (plus any helper)
        listeners = {pid: listening_sockets(pid) for pid in pids}
        everything = [a for socks in listeners.values() for a in socks]
        assert ("127.0.0.1", port) in listeners[proc.pid]
        # rank 0's TCPStore, and gloo's pair listeners, are there too: the check looks at real sockets.
        assert sum(1 for socks in listeners.values() if socks) >= 3, listeners
        assert all(ipaddress.ip_address(a).is_loopback for a, _ in everything), listeners

        # Kill rank 1: the log says how it died (the signal), not "exit code None".
        core = next(p for p in pids if p != proc.pid and Path(f"/proc/{p}/task").exists()
                    and len(process_tree(p)) >= 3)
        workers = [p for p in process_tree(core) if p != core]
        os.kill(max(workers), signal.SIGKILL)
        r = httpx.post(f"{url}/v1/completions", headers=headers, timeout=60,
                       json={"model": NAME, "prompt": "ROMEO:", "max_tokens": 4})
        assert r.status_code in (500, 503), r.text
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        text = Path(log.name).read_text()
        assert "was killed by signal SIGKILL (exit code -9)" in text, text[-3000:]
        assert "exit code None" not in text
    finally:
        stop_server(proc)
        log.close()
