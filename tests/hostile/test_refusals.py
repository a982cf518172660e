"""Each kind of hostile or broken request, one named test each, against a real DIS on loopback:
the request is refused with a precise status and a message, nothing is created on disk for it, and
the DIS goes on serving."""

from __future__ import annotations

import os
import pathlib

import grpc
import pytest

from disd.rpc.channel import MAX_MESSAGE_BYTES
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from support import TRADE, log_name, trade_rows, write_log

from .helpers import channel, chunk_msg, open_msg, run_stream, schemas, split_frames

QUOTE = schemas().get("Market", "Quote")
BAD_NAMES = {
    "dotdot": "..",
    "dotdot-inside": "a..b",
    "slash": "a/b",
    "absolute": "/etc",
    "backslash": "a\\b",
    "nul": "a\x00b",
    "too-long": "x" * 129,
    "empty": "",
}


@pytest.fixture
def ch(dis):
    c = channel(dis.port)
    yield c
    c.close()


def tree(root: pathlib.Path) -> set[str]:
    return {os.path.relpath(os.path.join(d, n), root) for d, ds, fs in os.walk(root) for n in ds + fs}


def assert_still_serving(ch: grpc.Channel) -> None:
    """The DIS answers a valid ingest and a listing after the refusal."""
    r = run_stream(ch, [open_msg("after", TRADE.fingerprint)], timeout=10)
    assert r.code == grpc.StatusCode.OK and r.responses[0].WhichOneof("body") == "resume", r
    dis_pb2_grpc.TableDataStub(ch).ListTables(dis_pb2.ListTablesRequest(), timeout=10)


@pytest.mark.parametrize("field", ["namespace", "table", "internal_partition", "column_partition"])
@pytest.mark.parametrize("bad", sorted(BAD_NAMES), ids=sorted(BAD_NAMES))
def test_bad_names_in_ingest_open_are_invalid_argument_and_touch_no_disk(dis, ch, tmp_path, field, bad):
    key = dict(namespace="Market", table="Trade", internal_partition="ok", column_partition="2026-11-22")
    key[field] = BAD_NAMES[bad]
    before = tree(tmp_path)
    req = dis_pb2.IngestRequest(open=dis_pb2.IngestOpen(location=dis_pb2.LocationKey(**key),
                                                        schema_fingerprint=TRADE.fingerprint))
    r = run_stream(ch, [req], timeout=10)
    assert r.code == grpc.StatusCode.INVALID_ARGUMENT, r
    assert "invalid" in r.details and field.replace("_", " ") in r.details, r.details
    assert tree(tmp_path) == before
    assert_still_serving(ch)


@pytest.mark.parametrize("bad", ["dotdot", "slash", "nul", "too-long"])
def test_bad_names_in_chunk_file_names_are_invalid_argument(dis, ch, tmp_path, bad):
    p = tmp_path / log_name("names")
    write_log(p, TRADE, trade_rows(0, 3), [3] * 3)
    name = p.name.replace("names", BAD_NAMES[bad], 1)
    r = run_stream(ch, [open_msg("names", TRADE.fingerprint), chunk_msg(name, 0, p.read_bytes())], timeout=10)
    assert r.code == grpc.StatusCode.INVALID_ARGUMENT, r
    assert "not a binary log file name" in r.details or "invalid" in r.details, r.details
    assert_still_serving(ch)


def test_chunk_of_another_location_is_invalid_argument(dis, ch, tmp_path):
    p = tmp_path / log_name("other")
    write_log(p, TRADE, trade_rows(0, 3), [3] * 3)
    r = run_stream(ch, [open_msg("mine", TRADE.fingerprint), chunk_msg(p.name, 0, p.read_bytes())], timeout=10)
    assert r.code == grpc.StatusCode.INVALID_ARGUMENT and "is not of location" in r.details, r


@pytest.mark.parametrize("first", ["nothing", "chunk", "empty-message"])
def test_a_stream_not_starting_with_open_is_invalid_argument(dis, ch, first):
    msgs = {"nothing": [], "chunk": [chunk_msg(log_name("x"), 0, b"DISBLOG\x00")],
            "empty-message": [dis_pb2.IngestRequest()]}[first]
    r = run_stream(ch, msgs, timeout=10)
    assert r.code == grpc.StatusCode.INVALID_ARGUMENT and "first message" in r.details, r


def test_bad_names_in_reads_are_refused_and_never_reach_the_disk(dis, ch, tmp_path):
    td = dis_pb2_grpc.TableDataStub(ch)
    for bad in BAD_NAMES.values():
        loc = dis_pb2.LocationKey(namespace="Market", table="Trade", internal_partition=bad,
                                  column_partition="2026-11-22")
        with pytest.raises(grpc.RpcError) as ei:
            td.ReadBlock(dis_pb2.ReadBlockRequest(location=loc, file="Size.dat", block_index=0), timeout=10)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (bad, ei.value.details())
        with pytest.raises(grpc.RpcError) as ei:
            list(td.ReadBlocks(dis_pb2.ReadBlocksRequest(location=loc, file="Size.dat", first_block=0, block_count=4),
                               timeout=10))
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (bad, ei.value.details())
        with pytest.raises(grpc.RpcError) as ei:
            list(td.ReadRanges(dis_pb2.ReadRangesRequest(location=loc, ranges=[
                dis_pb2.BlockRange(file="Size.dat", first_block=0, block_count=4)]), timeout=10))
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (bad, ei.value.details())
        # listing filters are compared, never used as paths: a hostile filter matches nothing
        assert not td.ListLocations(dis_pb2.ListLocationsRequest(namespace=bad, table=bad), timeout=10).locations


def test_file_names_in_reads_cannot_escape_the_location(dis, ch, tmp_path):
    p = tmp_path / log_name("files")
    write_log(p, TRADE, trade_rows(0, 10), [3] * 10)
    r = run_stream(ch, [open_msg("files", TRADE.fingerprint), chunk_msg(p.name, 0, p.read_bytes())], timeout=10)
    assert r.code == grpc.StatusCode.OK and r.responses[-1].ack.committed_rows == 10
    (tmp_path / "secret").write_text("secret")
    loc = dis_pb2.LocationKey(namespace="Market", table="Trade", internal_partition="files",
                              column_partition="2026-11-22")
    td = dis_pb2_grpc.TableDataStub(ch)
    for name in ["../table.size", "table.size", "../../../../../../secret", str(tmp_path / "secret"),
                 "Size.dat\x00", "Size.dat/..", "", "x" * 5000]:
        with pytest.raises(grpc.RpcError) as ei:
            td.ReadBlock(dis_pb2.ReadBlockRequest(location=loc, file=name, block_index=0), timeout=10)
        assert ei.value.code() == grpc.StatusCode.NOT_FOUND and "no column file" in ei.value.details(), name
        got = []
        with pytest.raises(grpc.RpcError) as ei:  # a bad name anywhere in the ranges: no part is sent
            for m in td.ReadRanges(dis_pb2.ReadRangesRequest(location=loc, ranges=[
                    dis_pb2.BlockRange(file="Size.dat", first_block=0, block_count=1),
                    dis_pb2.BlockRange(file=name, first_block=0, block_count=1)]), timeout=10):
                got.append(m)
        assert ei.value.code() == grpc.StatusCode.NOT_FOUND and "no column file" in ei.value.details(), name
        assert got == [], name


def test_unknown_table_is_not_found_on_ingest_and_reads(dis, ch):
    r = run_stream(ch, [open_msg("ip", TRADE.fingerprint, table="Nope")], timeout=10)
    assert r.code == grpc.StatusCode.NOT_FOUND and "unknown table Market.Nope" in r.details, r
    loc = dis_pb2.LocationKey(namespace="Market", table="Nope", internal_partition="ip", column_partition="d")
    with pytest.raises(grpc.RpcError) as ei:
        dis_pb2_grpc.TableDataStub(ch).ReadBlock(dis_pb2.ReadBlockRequest(location=loc, file="x", block_index=0),
                                                 timeout=10)
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND and "unknown table" in ei.value.details()
    assert not any(loc.key.table == "Nope" for loc in dis.engine.locations())


def test_unknown_location_of_a_known_table_is_not_found_on_reads_and_not_created(dis, ch, tmp_path):
    loc = dis_pb2.LocationKey(namespace="Market", table="Trade", internal_partition="ghost",
                              column_partition="2026-11-22")
    with pytest.raises(grpc.RpcError) as ei:
        dis_pb2_grpc.TableDataStub(ch).ReadBlock(dis_pb2.ReadBlockRequest(location=loc, file="Size.dat",
                                                                          block_index=0), timeout=10)
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND
    assert not any("ghost" in p for p in tree(tmp_path))


def test_schema_fingerprint_mismatch_in_open_is_failed_precondition(dis, ch):
    r = run_stream(ch, [open_msg("fp", QUOTE.fingerprint)], timeout=10)
    assert r.code == grpc.StatusCode.FAILED_PRECONDITION and "schema mismatch" in r.details, r
    assert QUOTE.fingerprint in r.details and TRADE.fingerprint in r.details


def test_schema_fingerprint_mismatch_in_a_file_header_is_failed_precondition(dis, ch, tmp_path):
    """The stream claims the right schema but the file was written for another one."""
    from disd.binlog import BinlogWriter, normalize_columns

    p = tmp_path / log_name("hdr")
    with BinlogWriter(p, QUOTE) as w:
        import numpy as np

        w.write_rows(normalize_columns(QUOTE, {"Sym": ["A"], "Bid": [1.0]}), np.array([3], np.uint8))
    r = run_stream(ch, [open_msg("hdr", TRADE.fingerprint), chunk_msg(p.name, 0, p.read_bytes())], timeout=10)
    assert r.code == grpc.StatusCode.FAILED_PRECONDITION and "schema mismatch" in r.details, r
    assert_still_serving(ch)


def test_message_over_the_size_limit_is_resource_exhausted_and_the_location_carries_on(dis, tmp_path):
    """A chunk larger than the 48 MiB message limit is refused by gRPC before the DIS buffers it
    whole; the location then ingests normally from a well-behaved stream."""
    big = grpc.insecure_channel(f"127.0.0.1:{dis.port}",
                                options=[("grpc.max_send_message_length", MAX_MESSAGE_BYTES * 2)])
    p = tmp_path / log_name("big")
    write_log(p, TRADE, trade_rows(0, 3), [3] * 3)
    huge = p.read_bytes() + b"\x00" * (MAX_MESSAGE_BYTES + 1024)
    r = run_stream(big, [open_msg("big", TRADE.fingerprint), chunk_msg(p.name, 0, huge)], timeout=30)
    big.close()
    assert r.code == grpc.StatusCode.RESOURCE_EXHAUSTED, r
    assert str(MAX_MESSAGE_BYTES) in r.details or "larger than max" in r.details, r.details
    ch = channel(dis.port)
    data = p.read_bytes()
    r = run_stream(ch, [open_msg("big", TRADE.fingerprint), chunk_msg(p.name, 0, data)], timeout=10)
    assert r.code == grpc.StatusCode.OK and r.responses[-1].ack.committed_rows == 3, r
    ch.close()


def test_frame_declaring_more_than_the_frame_limit_is_data_loss(dis, ch, tmp_path):
    """Under the message limit but a frame header claiming a 1 GiB payload: corruption, refused
    without waiting for (or allocating) the claimed bytes."""
    import struct

    from disd.binlog.format import crc32c

    p = tmp_path / log_name("claim")
    write_log(p, TRADE, trade_rows(0, 3), [3] * 3)
    header, frames = split_frames(p.read_bytes())
    head = struct.pack("<III", 1 << 30, 1, 0)
    bogus = head + struct.pack("<I", crc32c(head)) + b"\x01" * 1000
    r = run_stream(ch, [open_msg("claim", TRADE.fingerprint), chunk_msg(p.name, 0, header + bogus)], timeout=10)
    assert r.code == grpc.StatusCode.DATA_LOSS and "exceeds the maximum" in r.details, r
