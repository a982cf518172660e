"""``bench/_burstcpu.py``, the pipeline bench's CPU per burst and the ratio it allows: a real
process's threads counted from ``/proc``, and the ceiling bounded by the busiest thread."""

from __future__ import annotations

import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

from _burstcpu import BurstLimits, CpuWindow, ProcessCpu  # noqa: E402

SPIN = """
import sys, threading, time
def spin():
    sys.stdin.readline()
    end = time.thread_time() + 0.3
    while time.thread_time() < end:
        pass
    print("done", flush=True)
    sys.stdin.readline()  # alive until the window is read
threading.Thread(target=spin).start()
print("ready", flush=True)
"""


def test_a_window_counts_a_threads_cpu_and_names_the_busiest():
    p = subprocess.Popen([sys.executable, "-c", SPIN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        time.sleep(0.2)  # the interpreter's start-up is before the window
        window = CpuWindow({"child": p.pid})
        window.start()
        p.stdin.write("go\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "done"
        cpu = window.stop()["child"]
    finally:
        p.stdin.close()
        p.wait(10)
    assert 0.28 <= cpu.seconds < 0.6, cpu
    assert 0.28 <= cpu.busiest_thread_s <= cpu.seconds, cpu  # the spinner (3.11 names no thread)
    assert abs(sum(cpu.by_thread.values()) - cpu.seconds) < 1e-9 and cpu.lost_threads == 0


def proc(seconds: float, busiest: float) -> ProcessCpu:
    return ProcessCpu(seconds, {"t": busiest}, busiest, "t", 0)


def test_the_ceiling_is_the_cpu_over_the_cores_or_the_busiest_thread():
    spread = BurstLimits(burst_s=0.12, baseline_s=0.05, cores=2, processes={"dis": proc(0.14, 0.04), "tailer": proc(0.06, 0.03)})
    assert abs(spread.shortest_s - 0.10) < 1e-9  # 0.2 CPU s over 2 cores
    assert abs(spread.ratio_ceiling - 0.5) < 1e-9
    assert abs(spread.cpu_allowed(0.8) - 0.125) < 1e-9
    serial = BurstLimits(burst_s=0.12, baseline_s=0.05, cores=2, processes={"dis": proc(0.14, 0.11), "tailer": proc(0.06, 0.03)})
    assert abs(serial.shortest_s - 0.11) < 1e-9  # one thread ran 0.11 s: no burst is shorter
    assert serial.busiest == ("dis", "t", 0.11)
    figures = serial.figures()
    assert figures["dis_cpu_s_burst"] == 0.14 and figures["busiest_thread"] == "dis/t"
    assert abs(figures["ratio_cpu_ceiling"] - 0.05 / 0.11) < 1e-9


def test_a_run_at_another_runs_use_of_the_cores():
    off = BurstLimits(burst_s=0.1, baseline_s=0.1, cores=2, processes={"dis": proc(0.1, 0.05), "tailer": proc(0.04, 0.04)})
    on = BurstLimits(burst_s=0.2, baseline_s=0.1, cores=2, processes={"dis": proc(0.18, 0.06), "tailer": proc(0.04, 0.04)})
    assert abs(off.core_use - 0.7) < 1e-9 and abs(on.core_use - 0.55) < 1e-9
    assert abs(on.cpu_s_at_use(off.core_use) - 0.22 / 1.4) < 1e-9  # 0.157 s: shorter than its 0.2, longer than 0.11
    assert abs(off.burst_s / on.cpu_s_at_use(off.core_use) - 0.14 / 0.22) < 1e-9  # = the runs' CPU ratio
    assert abs(on.ratio_ceiling - 0.1 / 0.11) < 1e-9


def test_what_a_run_added_per_thread_pools_workers_together():
    from _burstcpu import thread_growth, thread_pool_name

    assert [thread_pool_name(n) for n in ("grpc_3", "dis-flusher", "block_http", "_7", "v_1a")] == \
        ["grpc", "dis-flusher", "block_http", "_7", "v_1a"]
    on = ProcessCpu(1.0, {"grpc_0": 0.1, "grpc_2": 0.5, "dis-flusher": 0.3, "dis": 0.1}, 0.5, "grpc_2", 0)
    off = ProcessCpu(0.6, {"grpc_1": 0.45, "dis-flusher": 0.05, "dis-reopener": 0.1}, 0.45, "grpc_1", 0)
    grown = thread_growth(on, off)
    assert [n for n, _ in grown] == ["dis-flusher", "grpc", "dis", "dis-reopener"]
    assert [round(s, 9) for _, s in grown] == [0.25, 0.15, 0.1, -0.1]


def test_tailers_merge_into_one_process_and_a_phase_shows_each_process_extra_per_location():
    from _burstcpu import PhaseCpu, merge

    burst = merge({"dis": ProcessCpu(0.40, {"dis": 0.40}, 0.05, "dis", 0, {"dis": 20}),
                   "tailer0": ProcessCpu(0.07, {"dis-tailer": 0.07}, 0.06, "dis-tailer", 0, {"dis-tailer": 2}),
                   "tailer1": ProcessCpu(0.09, {"dis-tailer": 0.09}, 0.08, "dis-tailer", 1, {"dis-tailer": 2})},
                  "tailers", "tailer")
    assert set(burst) == {"dis", "tailers"}
    assert abs(burst["tailers"].seconds - 0.16) < 1e-9 and burst["tailers"].lost_threads == 1
    assert burst["tailers"].busiest_thread == "tailer1/dis-tailer" and burst["tailers"].busiest_thread_s == 0.08
    assert burst["tailers"].by_thread == {"tailer0/dis-tailer": 0.07, "tailer1/dis-tailer": 0.09}
    baseline = merge({"dis": ProcessCpu(0.20, {"dis": 0.20}, 0.1, "dis", 0),
                      "tailer0": ProcessCpu(0.06, {"dis-tailer": 0.06}, 0.06, "dis-tailer", 0)}, "tailers", "tailer")
    phase = PhaseCpu(burst, baseline, locations=100)
    extra = phase.extra_ms_per_location()
    assert abs(extra["dis"] - 2.0) < 1e-9 and abs(extra["tailers"] - 1.0) < 1e-9
    figures = phase.figures()
    assert figures["extra_cpu_ms_per_location_by_process"] == {"dis": 2.0, "tailers": 1.0}
    assert figures["burst_busiest_thread_by_process"]["tailers"] == ["tailer1/dis-tailer", 0.08]
    lines = phase.lines()
    assert "dis 0.400 (dis 0.400 in 20" in lines[0] and "dis 2.000 ms, tailers 1.000 ms; all 3.000 ms" in lines[2]
