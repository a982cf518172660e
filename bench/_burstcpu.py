"""The CPU a burst's processes use, and the ratio that CPU allows on this machine's cores.

Counted per thread from ``/proc/<pid>/task/<tid>/schedstat`` (run time in nanoseconds; the
``utime``/``stime`` of ``/proc/<pid>/stat`` count 10 ms ticks, a tenth of a 0.1 s burst).  A
thread that ends inside the window takes its run time with it; ``lost_threads`` counts them so a
reader knows the figure is then a little low (which only raises the ceiling below: it stays an
upper bound).

Why a ceiling: a burst cannot end sooner than its processes' CPU spread perfectly over every
usable core, nor sooner than its busiest thread's run time (a thread runs on one core at a
time).  So ``baseline_s / max(cpu_s / cores, busiest_thread_s)`` bounds the ratio from above at
the CPU the burst used; a ratio near it says the burst was bound by CPU, and only less CPU per
burst can raise it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field


def task_cpu(pid: int) -> dict[int, tuple[str, int]]:
    """Run time so far of each thread of ``pid``: thread id -> (name, nanoseconds)."""
    out: dict[int, tuple[str, int]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended between the listing and the read
        out[int(tid)] = (comm, ns)
    return out


@dataclass
class ProcessCpu:
    """One process's CPU over a window: seconds in all, and per thread name (threads of one name
    summed), the busiest single thread, and how many threads ended inside the window."""

    seconds: float
    by_thread: dict[str, float]
    busiest_thread_s: float
    busiest_thread: str
    lost_threads: int
    #: per thread name, how many threads of that name ran inside the window (an interpreter
    #: names its threads after the process, so one name may be many threads)
    ran: dict[str, int] = field(default_factory=dict)

    @staticmethod
    def between(before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]]) -> "ProcessCpu":
        per_tid = {tid: (name, (ns - before[tid][1] if tid in before else ns) / 1e9) for tid, (name, ns) in after.items()}
        by_name: dict[str, float] = {}
        ran: dict[str, int] = {}
        for name, s in per_tid.values():
            by_name[name] = by_name.get(name, 0.0) + s
            ran[name] = ran.get(name, 0) + (s > 0)
        busiest = max(per_tid.values(), key=lambda v: v[1], default=("", 0.0))
        return ProcessCpu(seconds=sum(s for _, s in per_tid.values()), by_thread=by_name,
                          busiest_thread_s=busiest[1], busiest_thread=busiest[0],
                          lost_threads=sum(1 for tid in before if tid not in after), ran=ran)


class CpuWindow:
    """The run time of the threads of ``pids`` (name -> pid) between ``start()`` and ``stop()``."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self._before: dict[str, dict[int, tuple[str, int]]] = {}

    def start(self) -> None:
        self._before = {name: task_cpu(pid) for name, pid in self.pids.items()}

    def stop(self) -> dict[str, ProcessCpu]:
        return {name: ProcessCpu.between(self._before[name], task_cpu(pid)) for name, pid in self.pids.items()}


@dataclass
class BurstLimits:
    """A burst's wall time and its processes' CPU, against the baseline's wall time on ``cores``."""

    burst_s: float
    baseline_s: float
    cores: int
    processes: dict[str, ProcessCpu] = field(default_factory=dict)

    @property
    def cpu_s(self) -> float:
        return sum(p.seconds for p in self.processes.values())

    @property
    def busiest(self) -> tuple[str, str, float]:
        """(process, thread name, seconds) of the thread that ran longest."""
        name, p = max(self.processes.items(), key=lambda kv: kv[1].busiest_thread_s)
        return name, p.busiest_thread, p.busiest_thread_s

    @property
    def shortest_s(self) -> float:
        """The shortest burst this CPU allows: spread over every core, and no shorter than its
        busiest thread."""
        return max(self.cpu_s / self.cores, self.busiest[2])

    @property
    def ratio_ceiling(self) -> float:
        return self.baseline_s / self.shortest_s if self.shortest_s > 0 else math.inf

    @property
    def core_use(self) -> float:
        """The share of the cores' time the burst kept busy (its CPU over cores x its wall time):
        how near its processes came to the ceiling's perfect spread."""
        return self.cpu_s / (self.cores * self.burst_s) if self.burst_s > 0 else 0.0

    def cpu_s_at_use(self, use: float) -> float:
        """The shortest this burst could be at its CPU, keeping the cores only ``use`` busy (as
        another run did): ``cpu_s / (cores x use)``; the ratio of that run's wall time to this
        is the ratio the CPU allows when neither run spreads better than the other."""
        return self.cpu_s / (self.cores * use) if use > 0 else math.inf

    def cpu_allowed(self, ratio: float) -> float:
        """The most CPU seconds a burst may use, all processes together, to reach ``ratio``."""
        return self.cores * self.baseline_s / ratio

    def line(self) -> str:
        proc, thread, busiest_s = self.busiest
        per = ", ".join(f"{name} {p.seconds:.3f}" for name, p in self.processes.items())
        lost = sum(p.lost_threads for p in self.processes.values())
        return (f"limits on {self.cores} cores: the burst ({self.burst_s:.3f} s) used {self.cpu_s:.3f} CPU s ({per}; "
                f"busiest thread {proc}/{thread} {busiest_s:.3f} s{f'; {lost} threads ended inside' if lost else ''}), "
                f"so it cannot end in less than {self.shortest_s:.3f} s and the ratio cannot exceed "
                f"{self.ratio_ceiling:.2f} (bare stream {self.baseline_s:.3f} s); 0.8 needs the burst to use at most "
                f"{self.cpu_allowed(0.8):.3f} CPU s, no thread more than {self.baseline_s / 0.8:.3f} s")

    def threads_line(self, top: int = 4) -> str:
        parts = []
        for name, p in self.processes.items():
            busiest = sorted(p.by_thread.items(), key=lambda kv: -kv[1])[:top]
            parts.append(f"{name}: " + ", ".join(f"{t} {s:.3f}" for t, s in busiest))
        return "  threads (CPU s): " + "; ".join(parts)

    def figures(self) -> dict:
        """The JSON line's keys."""
        proc, thread, busiest_s = self.busiest
        out: dict = {f"{name}_cpu_s_burst": p.seconds for name, p in self.processes.items()}
        out.update({"cpu_s_burst": self.cpu_s, "cores": self.cores, "busiest_thread": f"{proc}/{thread}",
                    "busiest_thread_cpu_s": busiest_s, "burst_s_cpu_floor": self.shortest_s,
                    "ratio_cpu_ceiling": None if math.isinf(self.ratio_ceiling) else self.ratio_ceiling,
                    "cpu_s_at_0_8": self.cpu_allowed(0.8)})
        return out


def thread_pool_name(name: str) -> str:
    """A thread's name without a pool's ``_<n>`` (``grpc_3`` -> ``grpc``): which worker of a pool
    takes a stream changes from run to run, the pool's CPU does not."""
    stem, sep, n = name.rpartition("_")
    return stem if sep and stem and n.isdigit() else name


def thread_growth(more: ProcessCpu, less: ProcessCpu) -> list[tuple[str, float]]:
    """CPU seconds each thread (pools' workers together) used in ``more`` beyond ``less`` (what
    one run's extra work cost each thread of a process), most first."""
    def pooled(p: ProcessCpu) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, s in p.by_thread.items():
            out[thread_pool_name(name)] = out.get(thread_pool_name(name), 0.0) + s
        return out

    a, b = pooled(more), pooled(less)
    return sorted(((name, a.get(name, 0.0) - b.get(name, 0.0)) for name in a.keys() | b.keys()), key=lambda kv: -kv[1])


def merge(processes: dict[str, ProcessCpu], group: str, prefix: str) -> dict[str, ProcessCpu]:
    """``processes`` with those whose name starts with ``prefix`` summed into one named ``group``
    (the burst's four tailers against the baseline's one); their threads keep their process's
    name so the busiest stays traceable (``tailer2/MainThread``)."""
    merged: dict[str, ProcessCpu] = {}
    parts = {n: p for n, p in processes.items() if n.startswith(prefix)}
    for name, p in processes.items():
        if name not in parts:
            merged[name] = p
    if parts:
        by_thread = {f"{n}/{t}": s for n, p in parts.items() for t, s in p.by_thread.items()}
        ran = {f"{n}/{t}": k for n, p in parts.items() for t, k in p.ran.items()}
        top = max(parts.items(), key=lambda kv: kv[1].busiest_thread_s)
        merged[group] = ProcessCpu(seconds=sum(p.seconds for p in parts.values()), by_thread=by_thread,
                                   busiest_thread_s=top[1].busiest_thread_s,
                                   busiest_thread=f"{top[0]}/{top[1].busiest_thread}",
                                   lost_threads=sum(p.lost_threads for p in parts.values()), ran=ran)
    return merged


@dataclass
class PhaseCpu:
    """Two phases' CPU per process and per thread: a burst of ``locations`` locations against a
    baseline that took the same rows into one location.  The difference per location and
    process is what a location adds, and where: the DIS, the tailers or the bench's own threads
    (the follower's reads, the subscription counting rows)."""

    burst: dict[str, ProcessCpu]
    baseline: dict[str, ProcessCpu]
    locations: int

    def extra_ms_per_location(self) -> dict[str, float]:
        zero = ProcessCpu(0.0, {}, 0.0, "", 0)
        return {n: 1000 * (p.seconds - self.baseline.get(n, zero).seconds) / self.locations
                for n, p in self.burst.items()}

    @staticmethod
    def _phase_line(label: str, phase: dict[str, ProcessCpu], top: int) -> str:
        parts = []
        for name, p in phase.items():
            threads = sorted(p.by_thread.items(), key=lambda kv: -kv[1])[:top]
            parts.append(f"{name} {p.seconds:.3f} (" + ", ".join(f"{t} {s:.3f} in {p.ran.get(t, 0)}" for t, s in threads)
                         + f"; busiest {p.busiest_thread} {p.busiest_thread_s:.3f}"
                         + (f"; {p.lost_threads} threads ended inside" if p.lost_threads else "") + ")")
        return f"CPU s by process and thread name (in N threads), {label}: " + "; ".join(parts)

    def lines(self, top: int = 3) -> list[str]:
        extra = self.extra_ms_per_location()
        return [self._phase_line("burst", self.burst, top), self._phase_line("baseline", self.baseline, top),
                f"burst - baseline CPU per location ({self.locations}): "
                + ", ".join(f"{n} {ms:.3f} ms" for n, ms in extra.items())
                + f"; all {sum(extra.values()):.3f} ms"]

    def figures(self, top: int = 5) -> dict:
        """The JSON line's keys: per process, the burst's and baseline's seconds, the busiest thread
        and the extra per location; and each phase's busiest threads."""
        def threads(phase: dict[str, ProcessCpu]) -> dict[str, dict[str, float]]:
            return {n: {t: round(s, 4) for t, s in sorted(p.by_thread.items(), key=lambda kv: -kv[1])[:top]}
                    for n, p in phase.items()}

        return {"burst_cpu_s_by_process": {n: round(p.seconds, 4) for n, p in self.burst.items()},
                "baseline_cpu_s_by_process": {n: round(p.seconds, 4) for n, p in self.baseline.items()},
                "burst_busiest_thread_by_process": {n: [p.busiest_thread, round(p.busiest_thread_s, 4)]
                                                    for n, p in self.burst.items()},
                "baseline_busiest_thread_by_process": {n: [p.busiest_thread, round(p.busiest_thread_s, 4)]
                                                       for n, p in self.baseline.items()},
                "extra_cpu_ms_per_location_by_process": {n: round(v, 4)
                                                         for n, v in self.extra_ms_per_location().items()},
                "burst_threads_cpu_s": threads(self.burst), "baseline_threads_cpu_s": threads(self.baseline)}
