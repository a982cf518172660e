"""Replicas are byte-identical: for the same committed rows, every DIS writes the same column files.

A replica set works only if this holds (docs/replicas.md, "Determinism"): a reader that fails
over continues a byte range on another replica, and an operator rebuilds a lost replica by
copying another's files.  So three independent DISes take the same logs in very different ways
and their databases are compared file by file:

* ``steady``: in this process, fast flush and checkpoint clocks, small chunks, two streams cut
  in the middle of a transaction that spans frames (the DIS rolls it back on disconnect) and
  resumed from the resume point;
* ``lazy``: in this process, clocks so slow that only the shutdown checkpoints, large chunks;
* ``killed``: a real ``dis serve`` process, killed with SIGKILL several times while it ingests
  (with frequent checkpoints, so the kills land past and between them) and fed again from the
  resume point it gives after each restart.

Every column file must be identical byte for byte.  ``table.size`` must agree on everything
that describes the rows (count, file sizes, source record, fingerprint, schema version); its
``time`` and ``import_state`` (counters of what happened on that replica: restarts, rows rolled
back) are the replica's own history and may differ.
"""

from __future__ import annotations

import json
import pathlib
import queue
import random
import threading
import time

import grpc
import numpy as np

from disd.rpc.channel import open_channel
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from disd.tailer.frames import FrameReader
from support import (SCHEMAS, TRADE, free_port_pair, log_name, start_dis_process, start_dis_server, trade_rows,
                     wait_for, write_dis_config, write_log)
from disd.schema import SchemaRegistry

QUOTE = SchemaRegistry.load_dir(SCHEMAS).get("Market", "Quote")
DAY = "2026-11-22"
S, N, START, END = 3, 0, 1, 2  # row flags: single row, none (joins), start and end of a transaction


# -- the logs ----------------------------------------------------------------------------------
def _trade_batches(rng: random.Random, first: int) -> list[tuple[int, list[int]]]:
    """(first row, flags) of each frame of one Market.Trade log: single rows, transactions in
    one frame and across frames, abandoned transactions, an end without a start, frames that end
    inside a transaction begun after committed rows."""
    batches, row = [], first

    def add(flags):
        nonlocal row
        batches.append((row, flags))
        row += len(flags)

    for i in range(60):
        kind = i % 6
        n = rng.randint(1, 40)
        if kind == 0:
            add([S] * n)
        elif kind == 1:
            add([START] + [N] * n + [END])
        elif kind == 2:  # a transaction over three frames
            add([START] + [N] * n)
            add([N] * rng.randint(1, 30))
            add([N] * rng.randint(0, 30) + [END])
        elif kind == 3:  # abandoned by a single row, then by a new transaction
            add([START] + [N] * n)
            add([S, S])
            add([START, N, N])
            add([START, N, END])
        elif kind == 4:
            add([END])  # an end without a start commits that row alone
        else:
            add([N] * n)  # plain rows outside a transaction commit (lenient)
            # a frame whose last commit is inside it (a resume point with skip_rows, as from
            # a writer other than disd.logger), its transaction ending in the next frame
            add([S] * rng.randint(1, 5) + [START] + [N] * rng.randint(0, 9))
            add([N] * rng.randint(0, 9) + [END])
    return batches


def write_logs(log_dir: pathlib.Path, seed: int = 7) -> dict[tuple[str, str, str], list[pathlib.Path]]:
    """Logs of three locations (two Market.Trade, one Market.Quote), two files each; the last
    file of one location ends inside a transaction (its writer died), which no DIS commits."""
    rng = random.Random(seed)
    log_dir.mkdir(parents=True, exist_ok=True)
    out: dict[tuple[str, str, str], list[pathlib.Path]] = {}
    row = 0
    for ip in ("feed1", "feed2"):
        paths = []
        for hhmmss in ("090000", "100000"):
            p = log_dir / log_name(ip, DAY, hhmmss)
            for first, flags in _trade_batches(rng, row):
                write_log(p, TRADE, trade_rows(first, len(flags), nulls=True), flags)
                row = first + len(flags)
            paths.append(p)
        out[("Market", "Trade", ip)] = paths
    write_log(out[("Market", "Trade", "feed2")][-1], TRADE, trade_rows(row, 5), [START, N, N, N, N])
    quote = []
    for hhmmss in ("090000", "100000"):
        p = log_dir / f"Market.Quote.System.quotes.{DAY}.bin.{DAY}.{hhmmss}.000+0000"
        for first, flags in _trade_batches(rng, row):
            n = len(flags)
            idx = np.arange(first, first + n)
            cols = {"Timestamp": (1_763_800_000_000_000_000 + idx * 7).astype("datetime64[ns]"),
                    "Sym": [None if i % 5 == 2 else ("é" * (i % 4) + "Q") for i in idx],
                    "Exchange": [None if i % 11 == 4 else "NQA"[i % 3] for i in idx],
                    "Bid": [None if i % 9 == 1 else i * 0.5 for i in idx], "Ask": idx * 0.5 + 0.25,
                    "BidSize": (idx % 100).astype(np.int32), "AskSize": (idx % 77).astype(np.int32),
                    "Halted": [None if i % 13 == 6 else bool(i % 2) for i in idx]}
            write_log(p, QUOTE, {c.name: cols[c.name] for c in QUOTE.columns}, flags)
            row = first + n
        quote.append(p)
    out[("Market", "Quote", "quotes")] = quote
    return out


# -- feeding a DIS over its Ingest service -------------------------------------------------------
class Cut(Exception):
    """The feed was told to stop here (its stream is dropped, as by a vanished tailer)."""


def feed(port: int, loc: tuple[str, str, str], paths: list[pathlib.Path], schema, rng: random.Random,
         max_frames_bytes: tuple[int, int] = (200, 4000), pause_s: float = 0.0,
         cut_after_chunks: int | None = None) -> int:
    """Send a location's logs to the DIS on ``port`` as a tailer does: open, learn the resume
    point, send whole frames from there (the header first for every later file), one chunk in
    flight.  With ``cut_after_chunks`` the stream is cancelled after that many acknowledged
    chunks (raises Cut).  Returns the rows the DIS reports committed."""
    ns, table, ip = loc
    ch = open_channel(f"127.0.0.1:{port}")
    requests: queue.Queue = queue.Queue()
    call = dis_pb2_grpc.IngestStub(ch).Stream(iter(requests.get, None), timeout=60)
    try:
        requests.put(dis_pb2.IngestRequest(open=dis_pb2.IngestOpen(
            location=dis_pb2.LocationKey(namespace=ns, table=table, internal_partition=ip, column_partition=DAY),
            schema_fingerprint=schema.fingerprint, tailer_id="determinism")))
        answers = iter(call)
        resume = next(answers).resume
        names = [p.name for p in paths]
        if resume.file_name:
            first = names.index(resume.file_name)
            todo = [(paths[first], resume.offset)] + [(p, 0) for p in paths[first + 1:]]
        else:
            todo = [(p, 0) for p in paths]
        committed, sent = 0, 0
        for path, offset in todo:
            with FrameReader(str(path)) as r:
                while offset < r.size():
                    piece = r.read(offset, rng.randint(*max_frames_bytes))
                    assert piece.data, f"no whole frame at {path.name}:{offset}"
                    requests.put(dis_pb2.IngestRequest(chunk=dis_pb2.LogChunk(
                        file_name=path.name, offset=offset, data=bytes(piece.data))))
                    ack = next(answers).ack
                    assert (ack.file_name, ack.offset) == (path.name, piece.end), ack
                    committed, offset, sent = ack.committed_rows, piece.end, sent + 1
                    if cut_after_chunks is not None and sent >= cut_after_chunks:
                        call.cancel()
                        raise Cut()
                    if pause_s:
                        time.sleep(pause_s)
        return committed
    finally:
        requests.put(None)
        ch.close()


def feed_all(port: int, logs, rng: random.Random, **kw) -> None:
    schemas = {"Trade": TRADE, "Quote": QUOTE}
    for loc, paths in logs.items():
        feed(port, loc, paths, schemas[loc[1]], rng, **kw)


# -- comparing databases -------------------------------------------------------------------------
def location_dirs(db: pathlib.Path) -> dict[str, pathlib.Path]:
    return {str(p.parent.relative_to(db)): p.parent for p in sorted(db.glob("Intraday/*/*/*/*/*/table.size"))}


def record(path: pathlib.Path) -> dict:
    return json.loads(path.read_bytes().split(b"\n")[1])


def assert_identical(dbs: dict[str, pathlib.Path], expect_locations: int) -> None:
    """Every location of every database: the same column files, byte for byte, and table.size
    equal but for ``time`` and ``import_state``."""
    names = list(dbs)
    ref_name, ref_db = names[0], dbs[names[0]]
    ref = location_dirs(ref_db)
    assert len(ref) == expect_locations, sorted(ref)
    for name in names[1:]:
        other = location_dirs(dbs[name])
        assert sorted(other) == sorted(ref), f"{name} holds other locations than {ref_name}"
        for rel, d in ref.items():
            files = sorted(f.name for f in d.iterdir())
            assert sorted(f.name for f in other[rel].iterdir()) == files, f"{rel}: other files on {name}"
            for f in files:
                if f == "table.size":
                    continue
                a, b = (d / f).read_bytes(), (other[rel] / f).read_bytes()
                if a != b:
                    first = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
                    raise AssertionError(f"{rel}/{f}: {ref_name} has {len(a)} bytes, {name} {len(b)}; "
                                         f"first difference at byte {first}")
            ra, rb = record(d / "table.size"), record(other[rel] / "table.size")
            for k in ("time", "import_state"):
                ra.pop(k), rb.pop(k)
            assert ra == rb, f"{rel}/table.size differs between {ref_name} and {name}"


def committed_rows(db: pathlib.Path) -> dict[str, int]:
    return {rel: record(d / "table.size")["rows"] for rel, d in location_dirs(db).items()}


# -- the test ------------------------------------------------------------------------------------
def test_three_diss_fed_differently_write_identical_files(tmp_path):
    logs = write_logs(tmp_path / "logs")
    rng = random.Random(11)

    # steady: fast clocks, small chunks, two streams cut inside a transaction and resumed.
    steady = start_dis_server(tmp_path / "steady", port=0, flush_ms=5, checkpoint_ms=40)
    try:
        key = ("Market", "Trade", "feed1")
        for cut in (7, 23):  # chunk 7 and 23 (of ~200-byte chunks) fall inside transactions
            try:
                feed(steady.port, key, logs[key], TRADE, rng, max_frames_bytes=(100, 300), cut_after_chunks=cut)
            except Cut:
                pass
            loc = steady.engine.locations()[0]
            wait_for(lambda: not loc.txn_open and loc.written_rows == loc.committed_rows, 10,
                     what="the cut stream's transaction rolled back")
        assert loc.import_state["rows_rolled_back"] > 0, "the cuts should have rolled a transaction back"
        feed_all(steady.port, logs, rng, max_frames_bytes=(100, 2000))
    finally:
        steady.stop(0.5)

    # lazy: nothing but the shutdown checkpoint, large chunks.
    lazy = start_dis_server(tmp_path / "lazy", port=0, flush_ms=2000, checkpoint_ms=60000)
    try:
        feed_all(lazy.port, logs, rng, max_frames_bytes=(1 << 20, 1 << 20))
    finally:
        lazy.stop(0.5)

    # killed: a real process, SIGKILLed while it ingests, fed again from its resume point.
    work = tmp_path / "killed"
    work.mkdir()
    port = free_port_pair()
    cfg = write_dis_config(work, port, flush_ms=10, checkpoint_ms=60)
    kills = 0
    while True:
        proc = start_dis_process(work, cfg)
        if kills == 3:
            feed_all(port, logs, rng)
            assert proc.terminate() == 0
            break
        failure: list[BaseException] = []

        def feeding():
            try:
                feed_all(port, logs, rng, max_frames_bytes=(100, 400), pause_s=0.006)
            except grpc.RpcError as e:
                failure.append(e)

        th = threading.Thread(target=feeding, daemon=True)
        th.start()
        time.sleep(rng.uniform(0.3, 0.9))
        assert th.is_alive(), "the feed ended before the kill; give it more to do"
        proc.kill9()
        kills += 1
        th.join(20)
        assert failure and failure[0].code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), failure

    dbs = {"steady": tmp_path / "steady", "lazy": tmp_path / "lazy", "killed": work / "db"}
    rows = committed_rows(dbs["steady"])
    assert all(r > 500 for r in rows.values()), rows
    assert_identical(dbs, expect_locations=3)
