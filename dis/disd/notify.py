"""The systemd notify protocol (sd_notify): READY=1, WATCHDOG=1, STOPPING=1, STATUS=...

A datagram to the AF_UNIX socket named by ``NOTIFY_SOCKET`` (a leading ``@`` means the abstract
namespace).  Without ``NOTIFY_SOCKET`` every call is a no-op, so code can notify unconditionally.

Why the daemons use it (``Type=notify`` in config/systemd/): systemd then starts the units that
come after ``dis.service`` only once the DIS answers on its port (READY=1 is sent after the gRPC
server and health service are up), and ``WatchdogSec=`` restarts a daemon whose main loop stops
pinging (a hang, not only a crash).  The pings come from the daemon's main loop itself, never from
a helper thread that would go on pinging while the loop is stuck.
"""

from __future__ import annotations

import os
import socket
import threading


class Notifier:
    def __init__(self, address: str | None = None) -> None:
        addr = address if address is not None else os.environ.get("NOTIFY_SOCKET")
        self._addr: str | None = None
        if addr:
            self._addr = "\0" + addr[1:] if addr.startswith("@") else addr
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self._addr is not None

    def notify(self, *fields: str) -> bool:
        if self._addr is None:
            return False
        msg = "\n".join(fields).encode()
        with self._lock, socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            try:
                s.sendto(msg, self._addr)
            except OSError:
                return False
        return True

    def ready(self, status: str | None = None) -> bool:
        return self.notify("READY=1", *([f"STATUS={status}"] if status else []))

    def stopping(self) -> bool:
        return self.notify("STOPPING=1")

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def status(self, text: str) -> bool:
        return self.notify(f"STATUS={text}")


def watchdog_interval_s() -> float | None:
    """Half of systemd's WatchdogSec (``WATCHDOG_USEC``), the recommended ping interval."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return max(int(usec) / 2e6, 0.05)
    except ValueError:
        return None
