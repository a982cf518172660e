"""What one location costs the DIS's own Python, in process: no gRPC, no other threads' turns.

The many-locations targets (``bench/load.py``) are bound by CPU per location across the
processes; this bench isolates the DIS's share that no serving change can remove: the ingest
path a stream's messages run (``disd.server.ingest.ServedStream``: open, then a chunk and its
ack; a caught-up chunk is flushed at once, as the tailer marks the last chunk of a location).

Phases over ``--locations`` new locations of Market.Trade (internal partitions x 5 dates, as
in ``bench/load.py``), on a started ``StorageEngine`` with ``max_open_files`` as that bench gives
the DIS (512 by default: 1,000 column files cycle through them, as they do there):

* *new*: the locations opened together, as a ``Multiplex`` request's opens are
  (``StorageEngine.open_many``: directories, first records and column files made in one batch,
  fsynced as in production), each one's stream opened, then every first chunk (the log's header
  and 10 rows) as one batch through the engine's chunk entry (``IngestService.ingest``, as the
  request's reader hands them over), ingested and flushed; then the streams stay open;
* *live*: ``--rounds`` rounds of one 1-row chunk per location, each flushed, a chunk at a time
  (``ServedStream.handle``, what a ``Stream`` call does per message);
* *live batch*: ``--rounds`` rounds of the same, every location's chunk of a round in one batch
  (what a ``Multiplex`` request carrying them does).

Each round starts at least 25 ms after the last, so caught-up chunks are flushed as they are
taken (a location flushed less than 25 ms ago waits for the flush clock's tick).

CPU is the process's user + system time over each phase (the engine's own threads included;
the new phase's user time is printed too: the system time of creating files varies several-fold
from run to run on a shared disk, the interpreter's work does not);
the logs are built and read before timing.  The ingest path logs as ``dis serve`` does (JSON
lines, here to a file).

Baselines, same run, same disk, the file-system work alone with plain ``os`` calls: for a new
location, laid out as the database is (``location_path``, the same names and record size), its
directories (each ``mkdir`` that creates one, then an fsync of its parent), a record written to
a temporary file, fsynced, renamed over ``table.size`` and the directory fsynced, and its five
column files created; made twice, in fresh directories made as the DIS's database is, right
before and right after the DIS's phases (``new_location_bare_before_ms``,
``new_location_bare_after_ms``; ``new_location_bare_ms`` their mean): the kernel's cost of
creating a file drifts with the disk's recent deletions, so one made at another moment is not
the same disk.  For a live write, the five column files' ``pwrite``s of the same sizes on open
descriptors.  ``ratio`` = the live write's CPU over its baseline's.

The last JSON line adds ``writes_per_core_s``: location writes one interpreter can make per
second at this path's cost, however cheap the serving around it (``bench/load.py``'s live
phase at 10,000 locations asks 10,000 a second of one DIS); ``live_batch_write_us`` (a live
write in a batch of every location's) and its ``batch_writes_per_core_s``;
``new_location_ms`` is per location of the batch opened together (``new_location_user_ms``: the
interpreter's part).

The work directory is made under ``BENCH_DIR`` (else the system's temporary directory), as
``bench/load.py``'s: on this machine's ext4 (no journal) the kernel's cost of creating a file
grows with the files deleted lately in the same block group, and a temporary directory every
test on the machine churns costs several times what a quiet directory tree does
(benchmarks-history.md, "new locations, the kernel's share").

    [BENCH_DIR=DIR] .venv/bin/python bench/location_path.py [--locations 200] [--rounds 10] [--max-open-files 512]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np

from _common import TRADE_SCHEMA, emit, trade_table
from disd.binlog import BinlogWriter, RowFlag, decode_header, normalize_columns, scan_frames
from disd.binlog.filename import LogFileName
from disd.logconfig import configure_logging
from disd.names import LocationKey
from disd.rpc.keys import key_to_proto
from disd.rpc.v1 import dis_pb2
from disd.schema import SchemaRegistry, load_schema
from disd.server.ingest import IngestService, ServedStream
from disd.server.ingestsessions import SessionRegistry
from disd.storage import StorageEngine, location_path
from disd.storage.columns import schema_file_names
from disd.storage.location import new_record
from disd.config import StorageConfig

DATES = ["2026-11-16", "2026-11-17", "2026-11-18", "2026-11-19", "2026-11-20"]
FIRST_ROWS = 10


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def user_s() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_utime


def write_logs(log_dir: str, keys: list[LocationKey], rounds: int) -> list[tuple[str, bytes, list[int]]]:
    """Each location's log file: the header and a 10-row frame, then one 1-row frame per round.
    Returns (file name, bytes, the end offset of the header and first frame, then of each round's
    frame)."""
    schema = load_schema(TRADE_SCHEMA)
    out = []
    for k in keys:
        name = f"Market.Trade.System.{k.internal_partition}.{k.column_partition}.bin.{k.column_partition}.000000.000+0000"
        path = os.path.join(log_dir, name)
        with BinlogWriter(path, schema) as w:
            for n in [FIRST_ROWS] + [1] * (2 * rounds):
                t = trade_table(n)
                w.write_rows(normalize_columns(schema, t), np.full(n, RowFlag.SINGLE_ROW, np.uint8))
        with open(path, "rb") as f:
            data = f.read()
        run = scan_frames(data, 0, schema, start=decode_header(data, name).size)
        assert len(run.ends) == 2 * rounds + 1 and LogFileName.parse(name).location == k, name
        out.append((name, data, list(run.ends)))
    return out


def chunk(name: str, data: bytes, start: int, end: int) -> dis_pb2.IngestRequest:
    return dis_pb2.IngestRequest(chunk=dis_pb2.LogChunk(file_name=name, offset=start, data=data[start:end],
                                                        caught_up=True))


def dis_path(work: str, keys: list[LocationKey], logs: list, rounds: int,
             max_open_files: int) -> tuple[float, float, list[float], list[float]]:
    """CPU seconds of the new phase (all, and user), and of each live round, a chunk at a time
    and in one batch."""
    schema = load_schema(TRADE_SCHEMA)
    engine = StorageEngine(os.path.join(work, "db"), SchemaRegistry([schema]), StorageConfig(max_open_files=max_open_files))
    engine.start()
    service = IngestService(engine, SessionRegistry(600.0), lambda namespace, table: True)
    opens = [dis_pb2.IngestRequest(open=dis_pb2.IngestOpen(location=key_to_proto(k), tailer_id="bench",
                                                            schema_fingerprint=decode_header(data, name).fingerprint))
             for k, (name, data, _) in zip(keys, logs)]
    firsts = [chunk(name, data, 0, ends[0]) for name, data, ends in logs]
    streams = []
    try:
        time.sleep(0.05)
        c0, u0 = cpu_s(), user_s()
        # a Multiplex request's opens: the new locations made together, then each stream opened
        engine.open_many([(k, version.version) for k, version in map(service.open_target, opens)])
        for o in opens:
            s = ServedStream(service, "bench", lambda code, details: None)
            s.open(o)
            streams.append(s)
        acks = service.ingest([(s, c.chunk) for s, c in zip(streams, firsts)])
        assert all(a is not None and a.ack.committed_rows == FIRST_ROWS for a in acks), acks[:3]
        wait_published(engine, len(keys) * FIRST_ROWS)
        new_s, new_user_s = cpu_s() - c0, user_s() - u0
        live, batched = [], []
        done = 1
        for r in range(rounds):
            reqs = [chunk(name, data, ends[done - 1], ends[done]) for name, data, ends in logs]
            time.sleep(0.03)  # past the 25 ms a location waits between caught-up flushes
            c0 = cpu_s()
            for s, c in zip(streams, reqs):
                s.handle(c)
            # a location published less than 25 ms ago publishes at its next flush tick instead
            # (few locations make quick rounds): that flush, on the engine's clock, counts too
            wait_published(engine, len(keys) * (FIRST_ROWS + done))
            live.append(cpu_s() - c0)
            done += 1
        for r in range(rounds):
            reqs = [chunk(name, data, ends[done - 1], ends[done]) for name, data, ends in logs]
            time.sleep(0.03)
            c0 = cpu_s()
            acks = service.ingest([(s, c.chunk) for s, c in zip(streams, reqs)])
            wait_published(engine, len(keys) * (FIRST_ROWS + done))
            batched.append(cpu_s() - c0)
            assert all(a is not None and a.ack.committed_rows == FIRST_ROWS + done for a in acks), acks[:3]
            done += 1
    finally:
        for s in streams:
            s.close()
        engine.close()
    return new_s, new_user_s, live, batched


def wait_published(engine: StorageEngine, rows: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (published := sum(loc.published_rows for loc in engine.locations())) != rows:
        if time.monotonic() > deadline:
            raise SystemExit(f"published {published} rows, expected {rows}")
        time.sleep(0.002)


def bare_new(root: str, keys: list[LocationKey], file_names: list[str], record: bytes) -> float:
    """CPU seconds of the file-system work of creating the locations, plain ``os`` calls, one by
    one, under ``root`` laid out as a database is (``location_path``: the same directories, the
    same record's size, the same column file names)."""
    c0 = cpu_s()
    for k in keys:
        path = location_path(root, k)
        missing = []
        p = path
        while not os.path.isdir(p):  # an internal partition's directory holds its five dates
            missing.append(p)
            p = os.path.dirname(p)
        for d in reversed(missing):
            os.mkdir(d)
            fd = os.open(os.path.dirname(d), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        tmp = os.path.join(path, "table.size.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, record)
        os.fsync(fd)
        os.close(fd)
        os.rename(tmp, os.path.join(path, "table.size"))
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        for name in file_names:
            fd = os.open(os.path.join(path, name), os.O_RDWR | os.O_CREAT, 0o644)
            os.fstat(fd)
            os.close(fd)
    return cpu_s() - c0


def bare_live(root: str, keys: list[LocationKey], file_names: list[str], rounds: int,
              sizes: list[int]) -> list[float]:
    """CPU seconds of each round's column writes (a ``pwrite`` a column file), plain ``os``
    calls on descriptors opened before timing."""
    fds = [[os.open(os.path.join(location_path(root, k), name), os.O_RDWR) for name in file_names] for k in keys]
    pieces = [b"\1" * n for n in sizes]
    out = []
    try:
        for r in range(rounds):
            c0 = cpu_s()
            for files in fds:
                for fd, piece in zip(files, pieces):
                    os.pwrite(fd, piece, r * len(piece))
            out.append(cpu_s() - c0)
    finally:
        for files in fds:
            for fd in files:
                os.close(fd)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--locations", type=int, default=200, help="internal partitions x 5 dates")
    ap.add_argument("--rounds", type=int, default=10, help="live rounds (a 1-row chunk per location each)")
    ap.add_argument("--max-open-files", type=int, default=512)
    args = ap.parse_args()
    if args.locations % len(DATES):
        raise SystemExit(f"--locations must be a multiple of {len(DATES)}")
    keys = [LocationKey("Market", "Trade", f"feed{i:03d}", d)
            for i in range(args.locations // len(DATES)) for d in DATES]
    schema = load_schema(TRADE_SCHEMA)
    file_names, record = schema_file_names(schema), new_record(schema).to_bytes()
    work = tempfile.mkdtemp(prefix="dis-locpath-", dir=os.environ.get("BENCH_DIR"))
    log_file = os.path.join(work, "dis.log")
    try:
        os.mkdir(os.path.join(work, "logs"))
        logs = write_logs(os.path.join(work, "logs"), keys, args.rounds)
        # the baseline's locations are made right before and right after the DIS's, each in a
        # fresh directory made as the DIS's database is: the kernel's cost of creating files
        # drifts with the disk's recent deletions (benchmarks-history.md, "recently deleted
        # inodes"), and a baseline taken only after would see a different disk
        bare_roots = [os.path.join(work, "bare-before"), os.path.join(work, "bare-after")]
        os.mkdir(bare_roots[0])
        base_before = bare_new(bare_roots[0], keys, file_names, record)
        with open(log_file, "w") as sink:
            stderr = os.dup(2)
            os.dup2(sink.fileno(), 2)  # the path's JSON log lines, as dis serve writes them
            try:
                configure_logging(json=True)
                new_s, new_user_s, live, batched = dis_path(work, keys, logs, args.rounds, args.max_open_files)
            finally:
                os.dup2(stderr, 2)
                os.close(stderr)
        os.mkdir(bare_roots[1])
        base_after = bare_new(bare_roots[1], keys, file_names, record)
        # Market.Trade's column files for one row: Timestamp 8, Sym's offset 8 and its bytes
        # (a few), Price 8, Size 4
        base_live = bare_live(bare_roots[1], keys, file_names, args.rounds, [8, 8, 4, 8, 4])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    n = len(keys)
    new_ms, new_user_ms = new_s * 1e3 / n, new_user_s * 1e3 / n
    before_ms, after_ms = base_before * 1e3 / n, base_after * 1e3 / n
    base_new_ms = (before_ms + after_ms) / 2
    live_us = statistics.median(live) * 1e6 / n
    batch_us = statistics.median(batched) * 1e6 / n
    base_live_us = statistics.median(base_live) * 1e6 / n
    per_core = 1e6 / live_us
    print(f"{n} locations, max_open_files {args.max_open_files}, {args.rounds} live rounds (medians)")
    print(f"new location ({n} opened together, open + 10-row chunk): {new_ms:.3f} ms CPU, of which user "
          f"{new_user_ms:.3f} ms; its file-system work alone, one by one, {base_new_ms:.3f} ms "
          f"(ratio {new_ms / base_new_ms:.2f})")
    print(f"live location write (1-row chunk, flushed): {live_us:.0f} us CPU "
          f"(rounds {min(live) * 1e6 / n:.0f}-{max(live) * 1e6 / n:.0f}); five pwrites alone {base_live_us:.1f} us "
          f"(ratio {live_us / base_live_us:.1f})")
    print(f"live location write in a batch of {n}: {batch_us:.1f} us CPU (rounds {min(batched) * 1e6 / n:.1f}-"
          f"{max(batched) * 1e6 / n:.1f})")
    print(f"one interpreter at this cost: at most {per_core:,.0f} location writes/s a chunk at a time, "
          f"{1e6 / batch_us:,.0f} in batches, however cheap the serving")
    emit("location_path", live_us, "us/location write", base_live_us, locations=n, rounds=args.rounds,
         max_open_files=args.max_open_files, live_write_us=live_us, live_write_bare_us=base_live_us,
         new_location_ms=new_ms, new_location_user_ms=new_user_ms, new_location_bare_ms=base_new_ms,
         new_location_bare_before_ms=before_ms, new_location_bare_after_ms=after_ms, writes_per_core_s=per_core,
         live_batch_write_us=batch_us, batch_writes_per_core_s=1e6 / batch_us)


if __name__ == "__main__":
    main()
