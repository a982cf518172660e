"""A same-run measure of the CPU the machine gives a bench: a process that only sleeps.

On a shared machine a bench's processes sometimes get no CPU for tens or hundreds of
milliseconds: other sessions' processes keep both cores busy, and Linux shares the CPU between
sessions (each an autogroup) before it shares it between their threads, so every process this
bench started waits while the group's share is used up (docs/benchmarks-history.md, "Visibility
under load").  A visibility time measured across such a wait says nothing about the product.

``SchedProbe`` starts a process in the bench's session that sleeps 1 ms at a time and notes each
wake-up that came ``min_ms`` or more late; a bench matches its slow events against those waits
(``overlapping``).  The process costs next to no CPU (a thousand wake-ups a second).
``runqueue_wait_s`` reads the same from the kernel for a bench's own processes: how long their
threads were woken and not run.

Run as a script it is the probe itself: it sleeps until its standard input closes, then prints
its late wake-ups as JSON, ``[[start, late_ms], ...]`` on the monotonic clock
(``time.perf_counter``, the same clock in every process on Linux).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

SLEEP_S = 0.001


@dataclass(frozen=True)
class Stall:
    start: float  # perf_counter() when the probe went to sleep
    late_ms: float  # how much later than asked it woke

    @property
    def end(self) -> float:
        return self.start + SLEEP_S + self.late_ms / 1000


@dataclass
class SchedProbe:
    """The probe process, from ``start`` to ``stop``; ``stop`` returns its stalls."""

    min_ms: float = 5.0
    _proc: subprocess.Popen | None = field(default=None, repr=False)

    def start(self) -> "SchedProbe":
        self._proc = subprocess.Popen([sys.executable, __file__, str(self.min_ms)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)
        return self

    @property
    def pid(self) -> int:
        assert self._proc is not None, "start() first"
        return self._proc.pid

    def stop(self) -> list[Stall]:
        assert self._proc is not None, "start() first"
        out, _ = self._proc.communicate(timeout=30)
        return [Stall(s, late) for s, late in json.loads(out or "[]")]


def runqueue_wait_s(pid: int) -> float:
    """Seconds the threads of process ``pid`` have spent woken but waiting for a CPU, summed over
    its live threads (the kernel's ``/proc/PID/task/TID/schedstat``, second field); 0 where the
    kernel does not keep it."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def overlapping(stalls: list[Stall], start: float, end: float, min_ms: float) -> bool:
    """Whether a stall of at least ``min_ms`` overlaps ``[start, end]``."""
    return any(s.late_ms >= min_ms and s.start < end and s.end > start for s in stalls)


def _probe(min_ms: float) -> None:
    closed = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.read()
        closed.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    stalls: list[list[float]] = []
    while not closed.is_set():
        t = time.perf_counter()
        time.sleep(SLEEP_S)
        late_ms = (time.perf_counter() - t - SLEEP_S) * 1000
        if late_ms >= min_ms:
            stalls.append([t, round(late_ms, 3)])
    sys.stdout.write(json.dumps(stalls))


if __name__ == "__main__":
    _probe(float(sys.argv[1]) if len(sys.argv) > 1 else 5.0)
