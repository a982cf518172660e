"""Resource starvation (docs/reliability.md, "Real faults"): ``dis serve`` in a cgroup (v1) whose
memory limit is just above the DIS's memory bound (docs/reliability.md, "The memory bound of the
DIS": its idle size, measured here, plus locations x column files x a block, the block cache,
locations x the tailer's in-flight bytes, cores x 3 x a chunk) and whose CPU quota is 20 % of one
core, while the real tailer streams a backlog of logged rows and the applications keep logging.
The DIS slows down but is never killed, answers its health checks, puts no location in error,
and loses or duplicates no row; once the limits are lifted it catches up.

The test of the test: with a limit below what the DIS needs (``limit_mib``), the same checks fail
(the kernel's OOM killer ends it)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from support import free_port, free_port_pair, start_tailer, wait_for, write_dis_config, write_tailer_config

from .cgroups import group
from .daemons import start_dis, status, stop
from .powercut import final_problems
from .privileges import cgroup_problem, require, require_breaks
from .workload import Loggers, schemas_dirs

MIB = 1 << 20
CACHE, IN_FLIGHT, CHUNK, BLOCK = 8 * MIB, 1 * MIB, 256 * 1024, 65536
LOCATIONS, COLUMN_FILES, CORES = 2, 5, os.cpu_count() or 2
BACKLOG_TXNS = int(os.environ.get("DIS_REALFAULTS_STARVE_TXNS") or 300)  # per location, before the DIS starts


@pytest.fixture(autouse=True)
def _kernel_features():
    require(cgroup_problem("memory", "cpu"))


def bound(idle: int) -> int:
    return idle + LOCATIONS * COLUMN_FILES * BLOCK + CACHE + LOCATIONS * IN_FLIGHT + CORES * 3 * CHUNK


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def starve(tmp_path, limit_mib: int | None = None):  # noqa: ANN001, ANN201
    """(problems, figures)."""
    v1, _ = schemas_dirs(tmp_path)
    logs, work = tmp_path / "logs", tmp_path / "work"
    logs.mkdir()
    work.mkdir()
    loggers = Loggers(logs, {1: v1 / "Market.Trade.yaml"})
    for ip in ("a", "b"):
        loggers.add(ip)
    for _ in range(BACKLOG_TXNS):  # a backlog: the tailer streams it as fast as the DIS takes it
        for f in loggers.feeds.values():
            f.log_transaction()
    port, metrics = free_port_pair(), free_port()
    address = f"127.0.0.1:{port}"
    cfg = write_dis_config(work, port, metrics, db_root=work / "db", schemas=v1, flush_ms=50, checkpoint_ms=500,
                           storage={"block_cache_bytes": CACHE, "block_size_bytes": BLOCK})
    problems: list[str] = []
    figures: dict = {}
    dis = tailer = None
    with group("memory", "cpu") as g:
        enter = f'echo $$ > {g.dirs["memory"]}/cgroup.procs && echo $$ > {g.dirs["cpu"]}/cgroup.procs && exec "$@"'
        try:
            dis = start_dis(work, cfg, wrap=["sh", "-c", enter, "sh"])
            time.sleep(1)
            idle = rss(dis.p.pid)
            limit = limit_mib * MIB if limit_mib else bound(idle) + 16 * MIB
            g.set("memory", "memory.limit_in_bytes", limit)
            g.set("cpu", "cpu.cfs_period_us", 100_000)
            g.set("cpu", "cpu.cfs_quota_us", 20_000)
            figures.update(idle_mib=round(idle / MIB), bound_mib=round(bound(idle) / MIB), limit_mib=round(limit / MIB))
            peak = [idle]
            health_worst = [0.0]
            stop_sampling = threading.Event()

            def sample() -> None:
                while not stop_sampling.is_set():
                    try:
                        peak[0] = max(peak[0], rss(dis.p.pid))
                        t0 = time.monotonic()
                        status(address)
                        health_worst[0] = max(health_worst[0], time.monotonic() - t0)
                    except Exception:  # noqa: BLE001 - gone, or slow: the checks below say
                        pass
                    stop_sampling.wait(0.2)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            t0 = time.monotonic()
            tailer = start_tailer(work, write_tailer_config(work, port, logs, poll_interval_ms=20, max_backoff_ms=500,
                                                            max_in_flight_bytes=IN_FLIGHT, chunk_bytes=CHUNK))
            starved_for = 12.0
            while time.monotonic() - t0 < starved_for and dis.alive():
                for f in loggers.feeds.values():
                    f.log_transaction()
                time.sleep(0.1)
            try:
                starved_rows = sum(l.rows for l in status(address).values())
            except Exception as e:  # noqa: BLE001
                starved_rows = -1
                problems.append(f"the starved DIS does not answer Status: {e}")
            figures["starved_rows_per_s"] = round(starved_rows / starved_for)
            oom = g.get("memory", "memory.oom_control")
            if not dis.alive() or "oom_kill 0" not in oom:
                problems.append(f"the DIS was killed under its memory limit ({oom.split()}; alive: {dis.alive()})")
            figures["peak_rss_mib"] = round(peak[0] / MIB)
            figures["slowest_status_s"] = round(health_worst[0], 2)
            if peak[0] > limit:
                problems.append(f"resident {peak[0] / MIB:.0f} MiB, over the limit")
            # the limits lift
            g.set("cpu", "cpu.cfs_quota_us", -1)
            g.set("memory", "memory.limit_in_bytes", -1)
            t1 = time.monotonic()
            want = loggers.logged()
            if dis.alive():
                try:
                    wait_for(lambda: all(status(address)[ip].rows == n for ip, n in want.items()), 120, 0.1,
                             "every row once the limits lifted")
                    figures["caught_up_after_lift_s"] = round(time.monotonic() - t1, 1)
                    figures["after_lift_rows_per_s"] = round((sum(want.values()) - max(starved_rows, 0))
                                                             / max(time.monotonic() - t1, 0.001))
                except AssertionError as e:
                    problems.append(str(e))
                problems += final_problems(address, want, {})
                errors = {ip: l.error for ip, l in status(address).items() if l.error}
                if errors:
                    problems.append(f"locations in error: {errors}")
            stop_sampling.set()
            sampler.join(5)
            figures["logged"] = want
            text = dis.log_text()
            if "Traceback" in text:
                problems.append("the DIS logged a traceback: " + text[text.index("Traceback"):][:800])
        finally:
            stop(tailer, dis)
            loggers.close()
    return problems, figures


def test_a_starved_dis_slows_down_loses_nothing_and_recovers(tmp_path):
    problems, figures = starve(tmp_path)
    print(figures)
    assert not problems, "\n".join(problems)
    assert figures["after_lift_rows_per_s"] > figures["starved_rows_per_s"], "lifting the limits did not speed it up"


def test_the_checks_catch_a_dis_its_limit_does_not_fit(tmp_path):
    """A memory limit under what the DIS needs at start: killed by the OOM killer, and said so."""
    require_breaks()
    problems, figures = starve(tmp_path, limit_mib=40)
    print(figures, *problems, sep="\n")
    assert any("killed" in p for p in problems), problems
