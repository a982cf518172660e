"""``dis serve`` under the systemd notify protocol, through a real NOTIFY_SOCKET datagram socket."""

from __future__ import annotations

import os
import socket
import time

import pytest

from disd.notify import Notifier, watchdog_interval_s
from support import BIN, Proc, dis_healthy, free_port_pair, write_dis_config
from support.notify import notify_socket, received, stop_notified, watchdog


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_ready_watchdog_status_stopping(tmp_path, abstract):
    sock, addr = notify_socket(tmp_path, abstract)
    port = free_port_pair()
    cfg = write_dis_config(tmp_path, port)
    env = {"NOTIFY_SOCKET": addr, "WATCHDOG_USEC": "200000"}  # ping every 0.1 s
    p = Proc([str(BIN / "dis"), "serve", "--config", str(cfg), "--json-logs"], tmp_path / "dis.log", env).start()
    try:
        first = received(sock)
        assert "READY=1" in first, first
        assert any(f.startswith("STATUS=serving on 127.0.0.1:") for f in first)
        # READY=1 comes once the port answers: systemd starts what comes after only then
        assert dis_healthy(port, timeout=2)
        pings, statuses = watchdog(sock)
        assert pings >= 5, pings
        assert any("0 locations, 0 in error, 0 tailers connected" in s for s in statuses), statuses
        stop_notified(sock, p)
    finally:
        if p.alive():
            p.kill9()
        sock.close()
    assert '"event": "dis stopped"' in p.log_text()


def test_no_watchdog_pings_for_another_pid(tmp_path):
    """WATCHDOG_PID names the process systemd watches; any other process must not ping."""
    sock, addr = notify_socket(tmp_path)
    port = free_port_pair()
    cfg = write_dis_config(tmp_path, port)
    env = {"NOTIFY_SOCKET": addr, "WATCHDOG_USEC": "100000", "WATCHDOG_PID": "1"}
    p = Proc([str(BIN / "dis"), "serve", "--config", str(cfg)], tmp_path / "dis.log", env).start()
    try:
        assert "READY=1" in received(sock)
        sock.settimeout(0.2)
        seen: list[str] = []
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            try:
                seen += received(sock)
            except TimeoutError:
                pass
        assert "WATCHDOG=1" not in seen
        p.p.send_signal(15)
        assert p.p.wait(30) == 0
    finally:
        if p.alive():
            p.kill9()
        sock.close()


def test_notifier_without_socket_is_a_no_op(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    n = Notifier()
    assert not n.enabled and n.ready("x") is False and n.watchdog() is False


def test_watchdog_interval_is_half_watchdog_usec(monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert watchdog_interval_s() == 15.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert watchdog_interval_s() is None


def test_failed_start_sends_no_ready_and_says_why(tmp_path):
    """systemd must see the start fail (exit 1, no READY=1), and the journal must say why."""
    import subprocess

    sock, addr = notify_socket(tmp_path)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    cfg = write_dis_config(tmp_path, taken.getsockname()[1])
    try:
        r = subprocess.run([str(BIN / "dis"), "serve", "--config", str(cfg)], capture_output=True, text=True,
                           env=dict(os.environ, NOTIFY_SOCKET=addr), timeout=60)
        assert r.returncode == 1
        assert f"cannot listen on 127.0.0.1:{taken.getsockname()[1]}" in r.stderr and "Traceback" not in r.stderr
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(4096)
    finally:
        taken.close()
        sock.close()
