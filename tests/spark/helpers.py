"""An in-process DIS over a temporary database, fed through the real binary log format."""

from __future__ import annotations

import pathlib

import numpy as np
import pyarrow as pa

from disd.binlog import LocationKey, decode_frames, normalize_columns, scan_frames
from disd.binlog.format import encode_frame, encode_rows
from disd.config import parse_dis_config

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "config" / "schemas"
START_NS = 1_763_800_000_000_000_000
SYMS = np.array(["AAPL", "MSFT", "IBM", "GOOG", "NVDA"])


def free_port_pair() -> int:
    """A free port whose next port is free too: the DIS's gRPC port, and its block endpoint at the
    default ``port + 1`` (where the JVM reader looks for it)."""
    import socket

    for _ in range(100):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            if port >= 65535:
                continue
            try:
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError("no two consecutive free ports")


def dis_config(db_root, schemas=SCHEMAS, **server):
    return parse_dis_config(
        {
            "db_root": str(db_root),
            "schemas": str(schemas),
            "server": {"host": "127.0.0.1", "port": free_port_pair(), "metrics_port": 0, **server},
            "import": {"default": {"flush_interval_ms": 20, "checkpoint_interval_ms": 1000}},
        },
        "<spark test>",
    )


def start_dis(db_root, schemas=SCHEMAS, **server):
    from disd.server.daemon import DisServer

    srv = DisServer(dis_config(db_root, schemas, **server))
    srv.start()
    return srv


def loaded_dis(db_root, locs, checkpoint: bool = False):
    """A DIS with ``locs`` ({key: (first Size, rows)}) published, every 7th row with null Sym and
    Price; with ``checkpoint``, each location checkpointed too."""
    srv = start_dis(db_root)
    feeder = Feeder(srv)
    for key, (start, n) in locs.items():
        feeder.append(key, trade_rows(start, n, nulls=True))
        if checkpoint:
            srv.engine.location(key).checkpoint()
    return srv


def trade_rows(start: int, n: int, nulls: bool = False) -> pa.Table:
    """Numbered Market.Trade rows: row i has Size i, Price i/4, Timestamp START_NS + i*1001 ns."""
    idx = np.arange(start, start + n, dtype=np.int64)
    sym = pa.array(SYMS[idx % len(SYMS)])
    price = pa.array(idx * 0.25)
    if nulls:
        mask = pa.array(idx % 7 == 3)
        sym = pa.compute.if_else(mask, pa.nulls(n, pa.string()), sym)
        price = pa.compute.if_else(mask, pa.nulls(n, pa.float64()), price)
    return pa.table({
        "Timestamp": pa.array(START_NS + idx * 1001).cast(pa.timestamp("ns", tz="UTC")),
        "Sym": sym,
        "Price": price,
        "Size": pa.array(idx.astype(np.int32)),
    })


class Feeder:
    """Appends rows to locations as the Ingest service would: encode binary log frames, scan and
    decode them, ingest the decoded rows, publish."""

    def __init__(self, server) -> None:
        self.server = server
        self.offsets: dict[LocationKey, int] = {}

    def log_name(self, key: LocationKey) -> str:
        return (f"{key.namespace}.{key.table}.System.{key.internal_partition}.{key.column_partition}"
                f".bin.{key.column_partition}.090000.000+0000")

    def append(self, key: LocationKey, data, publish: bool = True) -> None:
        schema = self.server.schemas.get(key.namespace, key.table)
        cols = normalize_columns(schema, data)
        n = len(cols[0])
        loc = self.server.engine.location(key)
        name = self.log_name(key)
        for a in range(0, n, 65536):
            b = min(n, a + 65536)
            payload, rows = encode_rows(schema, [c.slice(a, b - a) for c in cols], np.zeros(b - a, np.uint8))
            frame = encode_frame(payload, rows)
            base = self.offsets.get(key, 4096)
            run = scan_frames(frame, base, schema)
            loc.ingest(name, run, decode_frames(frame, base, run, schema))
            self.offsets[key] = base + len(frame)
        if publish:
            loc.flush()
