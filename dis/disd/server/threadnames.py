"""The DIS's threads named at the OS level after their Python names.

Why: Python 3.11 leaves every thread it starts with the process's name, so per-thread CPU
(``/proc/<pid>/task/*/comm``, ``top -H``, ``perf``, ``bench/_burstcpu.py``) cannot say whether
the ingest, the flusher or a gRPC worker is the busy one.  ``threading.setprofile`` installs a
hook in every thread ``threading`` starts from then on; it runs once, at the thread's first call,
names the thread (``prctl(PR_SET_NAME)``, 15 bytes at most) and removes itself, so the thread
runs without a profiler afterwards.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from types import FrameType
from typing import Any

_PR_SET_NAME = 15
_libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols, libc's among them


def name_os_thread(name: str) -> None:
    """Name the calling thread at the OS level (cut to the kernel's 15 bytes); a failure leaves
    the name as it was (only diagnostics read it)."""
    _libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode("utf-8", "replace")[:15]), 0, 0, 0)


def _name_and_leave(frame: FrameType, event: str, arg: Any) -> None:  # noqa: ANN401 - sys.setprofile's signature
    sys.setprofile(None)
    name_os_thread(threading.current_thread().name)


def name_threads_from_now() -> None:
    """Every thread ``threading`` starts after this call gets its Python name at the OS level."""
    threading.setprofile(_name_and_leave)
