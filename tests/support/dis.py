"""A DIS from keyword settings: the one config writer, a DisServer in this process, the config
file of a real ``dis serve`` process, and rows fed to an in-process DIS as the Ingest service
would."""

from __future__ import annotations

import contextlib
import pathlib

import numpy as np
import yaml

from disd.binlog import LocationKey, decode_frames, normalize_columns, scan_frames
from disd.binlog.format import encode_frame, encode_rows
from disd.config import parse_dis_config

from .paths import SCHEMAS
from .processes import free_port, free_port_pair
from .rows import trade_rows


def dis_settings(db_root, *, schemas=SCHEMAS, port: int | None = None, metrics_port: int = 0, flush_ms: int = 20,
                 checkpoint_ms: int = 500, storage: dict | None = None, **server) -> dict:
    """The configuration mapping (what ``dis.yaml`` holds) of a DIS of the tests: loopback, the
    repository's schemas, fast flush and checkpoint clocks.  Without ``port``, a free port whose
    next one is free too (the block endpoint's default, ``port + 1``); port 0 lets the kernel
    choose; ``server`` adds keys of the ``server`` section (token_file,
    tls, idle_timeout_s, max_workers, ...), ``storage`` the ``storage`` section."""
    data = {
        "db_root": str(db_root),
        "schemas": str(schemas),
        "server": {"host": "127.0.0.1", "port": free_port_pair() if port is None else port,
                   "metrics_port": metrics_port, **server},
        "import": {"default": {"flush_interval_ms": flush_ms, "checkpoint_interval_ms": checkpoint_ms}},
    }
    if storage:
        data["storage"] = storage
    return data


def dis_config(db_root, **settings):
    """The parsed DisConfig of ``dis_settings``."""
    return parse_dis_config(dis_settings(db_root, **settings), "<test>")


def start_dis_server(db_root, **settings):
    """A DisServer in this process, started (stop it with ``stop(0.5)``)."""
    from disd.server.daemon import DisServer

    srv = DisServer(dis_config(db_root, **settings))
    srv.start()
    return srv


@contextlib.contextmanager
def running_dis(db_root, **settings):
    """``start_dis_server`` for the ``with`` block, stopped after it."""
    srv = start_dis_server(db_root, **settings)
    try:
        yield srv
    finally:
        srv.stop(0.5)


def write_dis_config(tmp: pathlib.Path, port: int, metrics_port: int | None = None, **settings) -> pathlib.Path:
    """``tmp/dis.yaml`` for a real ``dis serve``: ``dis_settings`` over ``tmp/db`` (or
    ``db_root=``), serving on ``port`` and metrics on ``metrics_port`` (a free port if None)."""
    db_root = settings.pop("db_root", tmp / "db")
    data = dis_settings(db_root, port=port, metrics_port=metrics_port or free_port(), **settings)
    path = tmp / "dis.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


class Feeder:
    """Appends rows to locations of an in-process DIS (or anything with ``engine`` and
    ``schemas``) as the Ingest service would: encode binary log frames, scan and decode them,
    ingest the decoded rows, publish."""

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


def loaded_dis(db_root, locs, checkpoint: bool = False):
    """A started in-process DIS with ``locs`` ({key: (first Size, rows)}) published, every 7th
    row with null Sym and Price; with ``checkpoint``, each location checkpointed too."""
    srv = start_dis_server(db_root)
    feeder = Feeder(srv)
    for key, (start, n) in locs.items():
        feeder.append(key, trade_rows(start, n, nulls=True))
        if checkpoint:
            srv.engine.location(key).checkpoint()
    return srv
