"""The systemd notify protocol from the service manager's side: a ``NOTIFY_SOCKET`` datagram
socket, and what a daemon (``dis serve``, ``dis proxy``) sends on it."""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import time

from .processes import Proc


def notify_socket(tmp: pathlib.Path, abstract: bool = False) -> tuple[socket.socket, str]:
    """A bound datagram socket (30 s timeout) and its ``NOTIFY_SOCKET`` address: a path under
    ``tmp``, or an abstract one (``@…``)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if abstract:
        addr = f"@dis-notify-test-{os.getpid()}-{time.monotonic_ns()}"
        sock.bind("\0" + addr[1:])
    else:
        addr = str(tmp / "notify.sock")
        sock.bind(addr)
    sock.settimeout(30)
    return sock, addr


def received(sock: socket.socket) -> list[str]:
    """The fields of the next message (``READY=1``, ``STATUS=…``, …)."""
    return sock.recv(4096).decode().splitlines()


def watchdog(sock: socket.socket, seconds: float = 1.5) -> tuple[int, list[str]]:
    """What the daemon sends for ``seconds``: its ``WATCHDOG=1`` pings counted, and its
    ``STATUS=`` fields."""
    pings, statuses = 0, []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for field in received(sock):
            pings += field == "WATCHDOG=1"
            if field.startswith("STATUS="):
                statuses.append(field)
    return pings, statuses


def stop_notified(sock: socket.socket, p: Proc) -> None:
    """SIGTERM to ``p`` as systemd stops it: it says ``STOPPING=1``, then exits 0."""
    p.p.send_signal(signal.SIGTERM)
    while "STOPPING=1" not in received(sock):
        pass
    assert p.p.wait(30) == 0
