"""The process of the descriptor-budget test: new locations opened in batches from several
threads at once (as several tailers' ``Multiplex`` calls open theirs), their string rows ingested
through the compiled path, while readers check every published snapshot through
``Location.read_range``, all under a descriptor limit (RLIMIT_NOFILE) only a little above
``storage.max_open_files``.  Prints one JSON line: locations in error (and why), bad reads, the
factory's peak, the most descriptors the process held.  The batches reach the building of their
new locations' records together (``batches_meet``), as a burst's requests from several tailers
do, so they decide what descriptors to keep at the same moment.

    python descriptors_child.py DB_ROOT NOFILE MAX_OPEN_FILES THREADS LOCATIONS_PER_THREAD
"""

import json
import os
import re
import resource
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401 - imported before the limit is reached (imports open files)

from disd.binlog import LocationKey, normalize_columns
from disd.binlog.format import encode_frame, encode_header, encode_rows
from disd.storage import StorageConfig, StorageEngine
from disd.storage import columns as colfmt
from disd.storage.ingest import LocationIngest, ingest_chunks

from storage.util import SCHEMAS, TRADE

ROWS_FIRST, ROWS_MORE, ROUNDS = 20, 7, 3


@dataclass
class Chunk:
    file_name: str
    offset: int
    data: bytes
    caught_up: bool


def sym(j: int, i: int) -> str:
    """Row i of location j's Sym: a length of its own, so offsets of one file never fit another's data."""
    return f"L{j}r{i}" + "x" * ((i * 7 + j) % 29)


def frame(j: int, a: int, n: int) -> bytes:
    idx = np.arange(a, a + n)
    cols = normalize_columns(TRADE, {
        "Timestamp": pa.array(idx * 1001 + 1_763_800_000_000_000_000).cast(pa.timestamp("ns", tz="UTC")),
        "Sym": pa.array([sym(j, i) for i in idx]), "Price": pa.array(idx * 0.25),
        "Size": pa.array((j * 1000 + idx).astype(np.int32))})
    payload, k = encode_rows(TRADE, cols, np.zeros(n, np.uint8))
    return encode_frame(payload, k)


def batches_meet(threads: int) -> None:
    """Each thread's first new record (``StorageEngine.open_many`` builds a batch's records
    before it makes the locations) waits until every thread has reached its own."""
    from disd.storage import engine

    gate = threading.Barrier(threads, timeout=10)
    seen = threading.local()
    original = engine.new_record

    def new_record(schema):  # noqa: ANN001, ANN202
        if not getattr(seen, "met", False):
            seen.met = True
            try:
                gate.wait()
            except threading.BrokenBarrierError:
                pass
        return original(schema)

    engine.new_record = new_record


def check(eng: StorageEngine, j: int, key: LocationKey) -> str | None:
    """What is wrong with location j's published rows as ``read_range`` serves them, if anything."""
    loc = eng.location(key, create=False)
    rows, sizes = loc.snapshot()
    if rows == 0:
        return None
    files = {f: loc.read_range(f, 0, s) for f, s in sizes.items()}
    try:
        t = colfmt.decode_table(loc.schema, files, rows)
        if t.column("Size").to_pylist() != [j * 1000 + i for i in range(rows)]:
            return f"{key} at {rows} rows: Size holds other values"
        if t.column("Sym").to_pylist() != [sym(j, i) for i in range(rows)]:
            return f"{key} at {rows} rows: Sym holds other values"
    except Exception as e:  # noqa: BLE001 - reported: bytes that are not the column's
        return f"{key} at {rows} rows: {e!r}"
    return None


def main() -> None:
    db_root, nofile, max_open, threads, per = sys.argv[1], *map(int, sys.argv[2:6])
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    batches_meet(threads)
    eng = StorageEngine(db_root, SCHEMAS, StorageConfig(max_open_files=max_open))
    eng.start()
    keys = [LocationKey("Market", "Trade", f"ip{j}", "2026-11-22") for j in range(threads * per)]
    bad: list[str] = []
    most_fds = [0]
    done = threading.Event()
    start = threading.Barrier(threads)

    def writer(t: int) -> None:
        mine = range(t * per, (t + 1) * per)
        start.wait()
        eng.open_many([(keys[j], None) for j in mine])  # one tailer's request: its new locations
        streams, offsets, items = {}, {}, []
        for j in mine:
            loc = eng.location(keys[j])
            rp, epoch = loc.resume()
            streams[j] = LocationIngest(loc, TRADE, rp, epoch)
            name = f"Market.Trade.System.ip{j}.2026-11-22.bin.2026-11-22.090000.000+0000"
            data = encode_header(TRADE) + frame(j, 0, ROWS_FIRST)
            items.append((streams[j], Chunk(name, 0, data, True), None))
            offsets[j] = (name, len(data), ROWS_FIRST)
        ingest_chunks(items)
        for _ in range(ROUNDS):
            items = []
            for j in mine:
                name, at, rows = offsets[j]
                data = frame(j, rows, ROWS_MORE)
                items.append((streams[j], Chunk(name, at, data, True), None))
                offsets[j] = (name, at + len(data), rows + ROWS_MORE)
            ingest_chunks(items)

    def reader(me: int) -> None:
        k = me
        while not done.is_set():
            k = (k + 7) % len(keys)
            try:
                problem = check(eng, k, keys[k])
            except LookupError:
                continue  # not opened yet
            except Exception as e:  # noqa: BLE001 - reported
                problem = f"{keys[k]}: {e!r}"
            if problem:
                bad.append(problem)

    def count_fds() -> None:
        while not done.is_set():
            try:
                most_fds[0] = max(most_fds[0], len(os.listdir("/proc/self/fd")))
            except OSError:  # EMFILE: every descriptor the limit allows is taken
                most_fds[0] = nofile
            time.sleep(0.002)

    ws = [threading.Thread(target=writer, args=(t,)) for t in range(threads)]
    others = [threading.Thread(target=reader, args=(i,)) for i in range(2)] + [threading.Thread(target=count_fds)]
    for t in ws + others:
        t.start()
    for t in ws:
        t.join()
    done.set()
    for t in others:
        t.join()
    errors: dict[str, int] = {}
    for j, key in enumerate(keys):
        loc = eng.location(key)
        if loc.in_error:
            why = re.sub(r"/\S+", "<path>", loc.error or "")
            errors[why] = errors.get(why, 0) + 1
            continue
        loc.flush()
        problem = check(eng, j, key)
        if problem is None and loc.published_rows != ROWS_FIRST + ROUNDS * ROWS_MORE:
            problem = f"{key}: {loc.published_rows} rows published"
        if problem:
            bad.append(problem)
    print("RESULT", json.dumps({"errors": errors, "bad": bad[:5], "bad_count": len(bad), "peak": eng.file_handles.peak_open,
                      "most_fds": most_fds[0]}), flush=True)
    eng.close()


if __name__ == "__main__":
    main()
