"""The tailer's CPU per burst: the pipeline's 4 M Market.Trade rows (119.5 MB of log) hard-linked
into the directory of a running ``dis-tailer``, a fresh ``dis serve`` ingesting them (as
``bench/pipeline.py``'s bursts).  Counted from the processes' threads' run time
(``/proc/<pid>/task/*/schedstat``, nanoseconds) from the files' arrival until every row is
published and 0.2 s after (the last acks); best of ``BENCH_REPEAT`` (3) bursts, each with a DIS
and a tailer of its own.  Printed per thread of the tailer.

Same-run baseline, in this process: the CPU of reading the same files in ``chunk_bytes`` pieces
with plain ``pread`` (``read_cpu_s``: what any tailer pays to read the bytes), and of the
tailer's own cutting and encoding of them (``FrameReader`` + ``encode_mux_request``,
``cut_encode_cpu_s``), best of 5 each.  Last line: one JSON object (``emit``): ``value`` the
tailer's CPU seconds, ``baseline`` the plain reads', and ``tailer_cpu_s``, ``dis_cpu_s``,
``cut_encode_cpu_s``, ``read_cpu_s``.
"""

from __future__ import annotations

import os
import pathlib
import resource
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from _burstcpu import CpuWindow
from _common import Published, emit, log_trade_rows, time_arrival, wait_serving, warm_memory
from disd.rpc.ingestwire import ChunkOut, encode_mux_request
from disd.tailer.frames import FrameReader
from e2e_helpers import free_port, start_dis, start_tailer, write_dis_config, write_tailer_config

N = int(os.environ.get("BENCH_ROWS", 4_000_000))
REPEAT = int(os.environ.get("BENCH_REPEAT", 3))
WARM_MIB = int(os.environ.get("BENCH_WARM_MIB", 1024))
CHUNK = 4 << 20  # the tailer's default chunk_bytes


def burst(run_dir: pathlib.Path, logs: str) -> tuple[float, float, dict[str, float]]:
    run_dir.mkdir()
    port = free_port()
    dis = start_dis(run_dir, write_dis_config(run_dir, port, **{"import": {
        "default": {"flush_interval_ms": 100, "checkpoint_interval_ms": 30000}}}))
    watched = run_dir / "logs"
    watched.mkdir()
    metrics = free_port()
    tailer = start_tailer(run_dir, write_tailer_config(run_dir, port, watched, metrics_port=metrics))
    try:
        wait_serving(metrics, tailer)
        time.sleep(0.3)
        pub = Published(port)
        warm_memory(WARM_MIB)
        window = CpuWindow({"tailer": tailer.p.pid, "dis": dis.p.pid})
        window.start()
        try:
            time_arrival(logs, watched, lambda: pub.total()[0] >= N)
            time.sleep(0.2)
            used = window.stop()
        finally:
            pub.close()
    finally:
        for p in (tailer, dis):
            p.terminate()
    return used["tailer"].seconds, used["dis"].seconds, used["tailer"].by_thread


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def in_process(files: list[str]) -> tuple[float, float]:
    """Best CPU seconds of plain reads of ``files``, and of the tailer's cutting and encoding."""
    def plain() -> None:
        for path in files:
            fd = os.open(path, os.O_RDONLY)
            try:
                off = 0
                while data := os.pread(fd, CHUNK, off):
                    off += len(data)
            finally:
                os.close(fd)

    def cut_encode() -> None:
        for path in files:
            name = os.path.basename(path)
            with FrameReader(path) as r:
                off = 0
                while (piece := r.read(off, CHUNK)).data:
                    encode_mux_request([(1, ChunkOut(name, piece.offset, piece.data, piece.at_end))])
                    off = piece.end

    best = [9e9, 9e9]
    for _ in range(5):
        for i, fn in enumerate((plain, cut_encode)):
            c = cpu()
            fn()
            best[i] = min(best[i], cpu() - c)
    return best[0], best[1]


def main() -> None:
    work = tempfile.mkdtemp(dir=os.environ.get("BENCH_DIR"))
    try:
        logs = os.path.join(work, "logs")
        log_trade_rows(logs, N)
        files = [os.path.join(logs, f) for f in sorted(os.listdir(logs)) if not f.startswith(".")]
        log_bytes = sum(os.path.getsize(f) for f in files)
        print(f"{N:,} rows, {log_bytes / 1e6:.1f} MB of log")
        read_s, cut_s = in_process(files)
        print(f"in process: plain reads {read_s:.4f} s CPU, FrameReader + encode_mux_request {cut_s:.4f} s CPU")
        tailer_best = dis_best = 9e9
        for k in range(REPEAT):
            t, d, per = burst(pathlib.Path(work) / f"run{k}", logs)
            threads = ", ".join(f"{name} {s:.3f}" for name, s in sorted(per.items(), key=lambda kv: -kv[1]) if s >= 0.001)
            print(f"burst {k}: dis-tailer {t:.3f} s CPU ({threads}); dis serve {d:.3f} s CPU")
            tailer_best, dis_best = min(tailer_best, t), min(dis_best, d)
        emit("tailer_cpu", tailer_best, "s", read_s, tailer_cpu_s=tailer_best, dis_cpu_s=dis_best,
             cut_encode_cpu_s=cut_s, read_cpu_s=read_s)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
