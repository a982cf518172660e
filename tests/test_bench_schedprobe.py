"""``bench/_schedprobe.py``, the latency bench's same-run measure of the CPU the machine gives it:
a probe process stopped for a while (SIGSTOP, as a process the scheduler does not run) reports
that wait; a process kept off the CPU by busy ones has runqueue wait; ``overlapping`` matches
a slow batch to a stall."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

from _schedprobe import SchedProbe, Stall, overlapping, runqueue_wait_s  # noqa: E402


def test_a_probe_held_off_the_cpu_reports_the_wait():
    probe = SchedProbe(min_ms=5.0).start()
    time.sleep(1.0)  # the interpreter up and sleeping
    os.kill(probe.pid, signal.SIGSTOP)
    held = time.perf_counter()
    time.sleep(0.2)
    os.kill(probe.pid, signal.SIGCONT)
    time.sleep(0.1)
    stalls = probe.stop()
    ours = [s for s in stalls if s.start <= held + 0.01 and s.end >= held + 0.19]
    assert ours, stalls
    assert max(s.late_ms for s in ours) >= 180


def test_overlapping_matches_a_window_to_a_long_enough_stall():
    stalls = [Stall(10.0, 20.0), Stall(20.0, 4.0)]  # 10.000-10.021 and 20.000-20.005
    assert overlapping(stalls, 10.010, 10.100, min_ms=10)
    assert not overlapping(stalls, 10.010, 10.100, min_ms=30)  # the stall is shorter than asked
    assert not overlapping(stalls, 10.030, 10.100, min_ms=10)  # after it ended
    assert not overlapping(stalls, 19.990, 20.010, min_ms=10)  # only a short one there


def test_runqueue_wait_counts_a_thread_kept_waiting_for_a_cpu():
    cpus = os.sched_getaffinity(0)
    one = {min(cpus)}
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        for h in hogs:
            os.sched_setaffinity(h.pid, one)
        os.sched_setaffinity(0, one)
        before = runqueue_wait_s(os.getpid())
        end = time.perf_counter() + 0.5
        while time.perf_counter() < end:  # runnable all along, sharing one CPU with the two hogs
            pass
        waited = runqueue_wait_s(os.getpid()) - before
    finally:
        os.sched_setaffinity(0, cpus)
        for h in hogs:
            h.kill()
            h.wait()
    assert waited >= 0.2  # two hogs on its CPU: it waits about two thirds of the time, runs a third
