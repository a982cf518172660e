"""Versions of Market.Trade for the schema-version tests: schema directories an operator would
write, logs of each version, and an Ingest ``open`` that carries the log header's schema as a
tailer sends it."""

from __future__ import annotations

import pathlib
import shutil

import numpy as np
import pyarrow as pa

from disd.binlog import LocationKey
from disd.rpc.v1 import dis_pb2
from disd.schema import TableSchema
from support import SCHEMAS, TRADE, log_name, trade_rows, write_log

from .conftest import IngestStream, key_msg

V1 = TRADE
#: version 2 adds a Venue column
V2 = TableSchema.from_dict({"namespace": "Market", "table": "Trade", "version": 2,
                            "columns": [*V1.canonical()["columns"], {"name": "Venue", "type": "string"}]})
#: version 3 is not declared anywhere: a logger ahead of the DIS
V3 = TableSchema.from_dict({"namespace": "Market", "table": "Trade", "version": 3,
                            "columns": [*V2.canonical()["columns"], {"name": "Side", "type": "char"}]})

V2_YAML = """namespace: Market
table: Trade
version: 2
columns:
  - {name: Timestamp, type: timestamp}
  - {name: Sym, type: string}
  - {name: Price, type: double}
  - {name: Size, type: int}
  - {name: Venue, type: string}
"""
#: version 2 with Size narrowed from int to short: a change the rules refuse
NARROWING_YAML = V2_YAML.replace("{name: Size, type: int}", "{name: Size, type: short}").replace(
    "  - {name: Venue, type: string}\n", "")
#: version 1 again, with other columns: a changed schema under a stored number
SAME_NUMBER_YAML = V2_YAML.replace("version: 2\n", "")


def schemas_dir(tmp: pathlib.Path, name: str, trade_yaml: str | None) -> pathlib.Path:
    """A schemas directory: the repository's, with Market.Trade replaced by ``trade_yaml``."""
    d = tmp / name
    if d.exists():
        shutil.rmtree(d)
    shutil.copytree(SCHEMAS, d)
    if trade_yaml is not None:
        (d / "Market.Trade.yaml").write_text(trade_yaml)
    return d


def rows(schema: TableSchema, start: int, n: int) -> pa.Table:
    """``trade_rows`` with the columns ``schema`` adds (Venue ``V<i>``, Side ``B``)."""
    t = trade_rows(start, n)
    names = schema.column_names
    if "Venue" in names:
        t = t.append_column("Venue", pa.array([f"V{i}" for i in range(start, start + n)]))
    if "Side" in names:
        t = t.append_column("Side", pa.array(np.full(n, ord("B"), np.uint16)))
    return t


def key(ip: str) -> LocationKey:
    return LocationKey("Market", "Trade", ip, "2026-11-22")


def write_version_log(directory: pathlib.Path, schema: TableSchema, ip: str, start: int, n: int,
                      hhmmss: str = "090000") -> pathlib.Path:
    """A log of ``schema``'s version for location ``ip``: rows ``start .. start+n-1``, single
    rows, in a few frames."""
    p = directory / log_name(ip, hhmmss=hhmmss)
    write_log(p, schema, rows(schema, start, n), np.full(n, 3, np.uint8))
    return p


def open_stream(port: int, ip: str, schema: TableSchema) -> tuple[IngestStream, dis_pb2.IngestResponse]:
    """An Ingest stream for location ``ip`` opened as a tailer opens it (fingerprint and the
    header's schema); the first reply (raises the refusal, if any)."""
    s = IngestStream(port)
    s.send(dis_pb2.IngestRequest(open=dis_pb2.IngestOpen(
        location=key_msg(key(ip)), schema_fingerprint=schema.fingerprint, tailer_id="test",
        schema_json=schema.to_json())))
    try:
        return s, next(s.responses)
    except BaseException:
        s.close()
        raise
