"""The compiled ingest path's CPU per row for one location's big chunks, in process.

What a DIS's reader does for each request of ``bench/pipeline.py``, without gRPC and the
tailer: Market.Trade rows in one log (frames of 65,536 rows), cut into chunks of about 3 MiB on
frame boundaries, each taken by ``ingestcore.ingest_batch`` (frame scan, CRC32C, row checks,
transaction plan, column bytes appended) and its due writes made by ``ingestcore.write_out``:
to ``/dev/null`` (the byte work alone, ``ns_per_row``) and to real files in ``BENCH_DIR``
(page-cache writes included, ``ns_per_row_with_files``), in the blocks a DIS writes
(``storage.block_size_bytes``' default, 64 KiB: a write of at most a block, as the block rule
makes them; smaller blocks mean more, smaller writes).  CPU time of this process (it has one
thread doing the work), best of ``BENCH_REPEAT``; the minor page faults of the best pass; malloc
tuned as ``dis serve`` tunes it (``disd.allocator.DIS``).
Baseline, same run: a numpy copy of the log's bytes (touching every byte once), per row.

Environment: BENCH_ROWS (default 4,000,000), BENCH_REPEAT (5), BENCH_DIR (the system temp dir).
Last line: one JSON object with ``ns_per_row``.
"""

from __future__ import annotations

import os
import resource
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np

from _common import TRADE_SCHEMA, emit, trade_table
from disd.allocator import DIS as DIS_MALLOC
from disd.allocator import tune_malloc
from disd.config import DEFAULT_BLOCK_SIZE_BYTES
from disd.binlog import BinlogWriter, RowFlag, decode_header, normalize_columns, scan_frames
from disd.schema import load_schema
from disd.storage import ingestcore
from disd.storage.writestate import new_write_state

N = int(os.environ.get("BENCH_ROWS", 4_000_000))
REPEAT = int(os.environ.get("BENCH_REPEAT", 5))
CHUNK = 3 << 20
NAME = "Market.Trade.System.bench.2026-11-22.bin.2026-11-22.000000.000+0000"


def chunks_of(data: bytes, schema, header: int) -> list[tuple[int, int]]:  # noqa: ANN001
    """(start, end) of chunks of at least CHUNK bytes, on frame boundaries."""
    out, start = [], 0
    for end in scan_frames(data, 0, schema, start=header).ends:
        if end - start >= CHUNK:
            out.append((start, int(end)))
            start = int(end)
    if start < len(data):
        out.append((start, len(data)))
    return out


def one_pass(schema, data: memoryview, chunks, header: int, to_files: str | None) -> tuple[int, int]:  # noqa: ANN001
    """CPU ns and minor faults of taking every chunk into a fresh location's write state."""
    state = new_write_state(schema, DEFAULT_BLOCK_SIZE_BYTES)  # the block size a DIS writes in
    if to_files is None:
        fds = tuple(os.open(os.devnull, os.O_WRONLY) for _ in range(state.nfiles))
    else:
        fds = tuple(os.open(os.path.join(to_files, f"c{i}"), os.O_WRONLY | os.O_CREAT) for i in range(state.nfiles))
    try:
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.process_time_ns()
        for i, (a, b) in enumerate(chunks):
            out = ingestcore.ingest_batch([(state, data[a:b], a, header if i == 0 else 0, NAME, False)])  # type: ignore[list-item]
            assert out[0][0] == ingestcore.OK, out
            ingestcore.write_out([(state, fds, i == len(chunks) - 1)])  # type: ignore[list-item]
        cpu = time.process_time_ns() - t0
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        assert state.committed_rows == N
        return cpu, faults
    finally:
        for fd in fds:
            os.close(fd)


def main() -> None:
    if ingestcore is None:
        sys.exit("disd.storage.ingestcore is not built")
    tune_malloc(DIS_MALLOC)  # the allocator as a DIS sets it (its mmap threshold decides page faults)
    schema = load_schema(TRADE_SCHEMA)
    work = tempfile.mkdtemp(prefix="dis-bench-", dir=os.environ.get("BENCH_DIR"))
    try:
        path = os.path.join(work, NAME)
        with BinlogWriter(path, schema) as w:
            w.write_rows(normalize_columns(schema, trade_table(N)), np.full(N, RowFlag.SINGLE_ROW, np.uint8))
        with open(path, "rb") as f:
            data = f.read()
        os.unlink(path)
        header = decode_header(data).size
        chunks = chunks_of(data, schema, header)
        view = memoryview(data)
        best = best_files = (1 << 62, 0)
        for _ in range(REPEAT):
            best = min(best, one_pass(schema, view, chunks, header, None))
            d = tempfile.mkdtemp(dir=work)
            best_files = min(best_files, one_pass(schema, view, chunks, header, d))
            shutil.rmtree(d)
        raw = np.frombuffer(data, np.uint8)
        copy = 1 << 62
        for _ in range(REPEAT):
            t0 = time.process_time_ns()
            raw.copy()
            copy = min(copy, time.process_time_ns() - t0)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ns, ns_files, ns_copy = best[0] / N, best_files[0] / N, copy / N
    print(f"rows={N} bytes={len(data)} in {len(chunks)} chunks of ~{CHUNK >> 20} MiB; CPU, best of {REPEAT}")
    print(f"ingest_batch + write_out to /dev/null: {ns:6.2f} ns/row  ({best[1]} minor faults)")
    print(f"ingest_batch + write_out to files:     {ns_files:6.2f} ns/row  ({best_files[1]} minor faults)")
    print(f"numpy copy of the log's bytes:         {ns_copy:6.2f} ns/row")
    emit("ingest_core", ns, "ns/row", ns_copy, ns_per_row=ns, ns_per_row_with_files=ns_files,
         minor_faults=best[1], rows=N, chunks=len(chunks))


if __name__ == "__main__":
    main()
