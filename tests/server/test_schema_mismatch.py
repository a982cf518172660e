"""A log whose schema differs from its table's is refused with the table and the columns that
differ named, at ``open`` (from the tailer's ``schema_json``) and in a file header; the DIS's log
line names the location."""

from __future__ import annotations

import grpc
import pytest
import structlog

from disd.rpc.v1 import dis_pb2
from disd.schema import TableSchema
from support import TRADE, wait_for, write_log

from .conftest import FILE1, KEY, IngestStream, key_msg

#: Market.Trade with a Venue column more and Size a long instead of an int
TRADE2 = TableSchema.from_dict({
    "namespace": "Market", "table": "Trade",
    "columns": [{"name": c.name, "type": "long" if c.name == "Size" else c.type.value} for c in TRADE.columns]
    + [{"name": "Venue", "type": "string"}],
})
DIFF = "added Venue (string); changed type Size (table int, log long)"


def _open(dis, **open_fields):
    s = IngestStream(dis.port)
    s.send(dis_pb2.IngestRequest(open=dis_pb2.IngestOpen(location=key_msg(), tailer_id="host1:42", **open_fields)))
    try:
        with pytest.raises(grpc.RpcError) as ei:
            next(s.responses)
    finally:
        s.close()
    return ei.value


def test_open_with_another_schema_names_the_table_and_the_columns(dis):
    with structlog.testing.capture_logs() as logs:
        e = _open(dis, schema_fingerprint=TRADE2.fingerprint, schema_json=TRADE2.to_json())
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"differs from table Market.Trade: {DIFF};" in e.details(), e.details()
    assert TRADE2.fingerprint in e.details() and TRADE.fingerprint in e.details()
    refused = [x for x in logs if x["event"] == "ingest refused"]
    assert refused and refused[0]["location"] == str(KEY) and refused[0]["tailer"] == "host1:42", refused
    assert DIFF in refused[0]["details"]


def test_open_from_a_tailer_that_sends_no_columns_still_names_the_table(dis):
    e = _open(dis, schema_fingerprint=TRADE2.fingerprint)
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "differs from table Market.Trade (its columns were not sent)" in e.details(), e.details()


def test_a_file_header_with_another_schema_names_the_file_and_the_columns(dis, tmp_path):
    p = tmp_path / FILE1
    write_log(p, TRADE2, {"Size": [1, 2]}, [3, 3])
    s = IngestStream(dis.port)
    s.open(fingerprint=TRADE.fingerprint)
    with structlog.testing.capture_logs() as logs:
        with pytest.raises(grpc.RpcError) as ei:
            s.chunk(FILE1, 0, p.read_bytes())
    s.close()
    assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert ei.value.details().startswith(f"{FILE1}: schema mismatch: the log's schema differs from table "
                                         f"Market.Trade: {DIFF};"), ei.value.details()
    refused = [x for x in logs if x["event"] == "ingest refused"]
    assert refused and refused[0]["location"] == str(KEY), refused


def test_the_tailer_logs_the_refusal_with_the_columns_and_its_file(dis, tmp_path):
    from disd.tailer import Tailer, parse_tailer_config

    logs_dir = tmp_path / "logs"
    logs_dir.mkdir()
    write_log(logs_dir / FILE1, TRADE2, {"Size": [1, 2]}, [3, 3])
    cfg = parse_tailer_config({"dis": f"127.0.0.1:{dis.port}", "log_dirs": [str(logs_dir)], "poll_interval_ms": 50})
    with structlog.testing.capture_logs() as logs:
        with Tailer(cfg) as t:
            st = wait_for(lambda: (lambda s: s if s and s.get("state") == "refused" else None)(
                t.status().get(str(KEY))))
    assert st["error"].startswith("FAILED_PRECONDITION: schema mismatch") and DIFF in st["error"], st
    refused = [x for x in logs if x["event"] == "location refused by the DIS; retrying later"]
    assert refused and refused[0]["log_level"] == "warning" and refused[0]["location"] == str(KEY), refused
    assert refused[0]["file"] == FILE1 and DIFF in refused[0]["error"]
