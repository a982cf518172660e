"""The Ingest and TableData services on a real loopback gRPC server over real files."""

from __future__ import annotations

import urllib.request

import grpc
import pytest

from disd.client import DisClientError, connect
from disd.rpc.v1 import dis_pb2
from support import TRADE, running_dis, trade_rows, wait_for, write_log

from .conftest import FILE1, FILE2, KEY, IngestStream, send_file


@pytest.fixture
def trade():
    return TRADE


def test_ingest_then_read_back(dis, tmp_path, trade):
    p1, p2 = tmp_path / FILE1, tmp_path / FILE2
    write_log(p1, trade, trade_rows(0, 100), [3] * 100)
    write_log(p2, trade, trade_rows(100, 50), [1] + [0] * 48 + [2])
    s = IngestStream(dis.port)
    resume = s.open(fingerprint=trade.fingerprint)
    assert resume.WhichOneof("body") == "resume" and resume.resume.file_name == ""
    ack = send_file(s, p1, trade)
    assert ack.ack.file_name == FILE1 and ack.ack.committed_rows == 100
    ack = send_file(s, p2, trade)
    assert ack.ack.committed_rows == 150
    s.close()
    with connect(f"127.0.0.1:{dis.port}") as c:
        wait_for(lambda: sum(loc.rows for loc in c.locations("Market", "Trade")) == 150)
        t = c.read_table("Market", "Trade")
    assert t.column("Size").to_pylist() == list(range(150))
    assert set(t.column("Date").to_pylist()) == {"2026-11-22"}
    # a new stream resumes after what was ingested
    s = IngestStream(dis.port)
    r = s.open(fingerprint=trade.fingerprint)
    assert (r.resume.file_name, r.resume.offset) == (FILE2, p2.stat().st_size)
    s.close()


def _refused(stream_fn):
    with pytest.raises(grpc.RpcError) as ei:
        stream_fn()
    return ei.value.code(), ei.value.details()


@pytest.mark.parametrize(
    "key,fp,code",
    [
        (dict(namespace="Market", table="Nope"), "x", grpc.StatusCode.NOT_FOUND),
        (dict(namespace="..", table="Trade"), "x", grpc.StatusCode.INVALID_ARGUMENT),
        (dict(namespace="Market", table="Trade", internal_partition="a/b"), "x", grpc.StatusCode.INVALID_ARGUMENT),
        (dict(namespace="Market", table="Trade", internal_partition="a\x00b"), "x", grpc.StatusCode.INVALID_ARGUMENT),
        (dict(namespace="Market", table="Trade", internal_partition="x" * 300), "x", grpc.StatusCode.INVALID_ARGUMENT),
        (dict(namespace="Market", table="Trade"), "deadbeef", grpc.StatusCode.FAILED_PRECONDITION),
    ],
)
def test_open_refusals(dis, trade, key, fp, code):
    from disd.binlog import LocationKey

    class K:  # LocationKey without validation, to send bad names
        pass

    k = K()
    k.namespace, k.table = key["namespace"], key["table"]
    k.internal_partition = key.get("internal_partition", "ip")
    k.column_partition = "2026-11-22"
    s = IngestStream(dis.port)
    got_code, details = _refused(lambda: s.open(key=k, fingerprint=trade.fingerprint if fp == "x" else fp))
    assert got_code == code, details
    assert details
    s.close()
    assert LocationKey  # names validated in one place


def test_corrupt_frame_is_data_loss_and_loses_nothing(dis, tmp_path, trade):
    p1 = tmp_path / FILE1
    off = write_log(p1, trade, trade_rows(0, 10), [3] * 10)
    write_log(p1, trade, trade_rows(10, 10), [3] * 10)
    data = bytearray(p1.read_bytes())
    s = IngestStream(dis.port)
    s.open(fingerprint=trade.fingerprint)
    ack = s.chunk(FILE1, 0, bytes(data[:off]))
    assert ack.ack.committed_rows == 10
    bad = bytearray(data[off:])
    bad[30] ^= 0xFF
    code, details = _refused(lambda: s.chunk(FILE1, off, bytes(bad)))
    assert code == grpc.StatusCode.DATA_LOSS and "checksum" in details
    s.close()
    with connect(f"127.0.0.1:{dis.port}") as c:
        wait_for(lambda: sum(loc.rows for loc in c.locations("Market", "Trade")) == 10)
        assert c.read_table("Market", "Trade").column("Size").to_pylist() == list(range(10))


def test_partial_frame_and_offset_gap_are_refused(dis, tmp_path, trade):
    p1 = tmp_path / FILE1
    off = write_log(p1, trade, trade_rows(0, 10), [3] * 10)
    data = p1.read_bytes()
    s = IngestStream(dis.port)
    s.open(fingerprint=trade.fingerprint)
    code, details = _refused(lambda: s.chunk(FILE1, 0, data[: off - 3]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "frame boundary" in details
    s.close()
    s = IngestStream(dis.port)
    s.open(fingerprint=trade.fingerprint)
    code, details = _refused(lambda: s.chunk(FILE1, 5, data[5:]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "offset 0" in details
    s.close()


def test_client_gone_mid_transaction_rolls_back(dis, tmp_path, trade):
    p1 = tmp_path / FILE1
    write_log(p1, trade, trade_rows(0, 5), [3] * 5)
    off = p1.stat().st_size
    write_log(p1, trade, trade_rows(5, 5), [1, 0, 0, 0, 0])  # transaction without its End
    s = IngestStream(dis.port)
    s.open(fingerprint=trade.fingerprint)
    ack = send_file(s, p1, trade)
    assert ack.ack.committed_rows == 5
    s.close()  # vanishes mid-transaction
    s = IngestStream(dis.port)
    r = s.open(fingerprint=trade.fingerprint)
    assert (r.resume.file_name, r.resume.offset) == (FILE1, off)
    # the writer comes back and finishes the transaction properly
    write_log(p1, trade, trade_rows(10, 1), [2])
    ack = send_file(s, p1, trade, start=off)
    # the unfinished transaction's rows were rolled back: its Start is resent and now ends
    assert ack.ack.committed_rows == 11
    s.close()
    with connect(f"127.0.0.1:{dis.port}") as c:
        wait_for(lambda: sum(loc.rows for loc in c.locations("Market", "Trade")) == 11)
        assert c.read_table("Market", "Trade").column("Size").to_pylist() == list(range(11))


def test_read_block_bounds_and_errors(dis, tmp_path, trade):
    p1 = tmp_path / FILE1
    write_log(p1, trade, trade_rows(0, 1000), [3] * 1000)
    s = IngestStream(dis.port)
    s.open(fingerprint=trade.fingerprint)
    send_file(s, p1, trade)
    s.close()
    with connect(f"127.0.0.1:{dis.port}") as c:
        snap = wait_for(lambda: [loc for loc in c.locations("Market", "Trade") if loc.rows == 1000])[0]
        stub = c.stub(snap.address)
        from disd.rpc.keys import key_to_proto as key_msg

        name, size = sorted(snap.files.items())[0]
        r = stub.ReadBlock(dis_pb2.ReadBlockRequest(location=key_msg(KEY), file=name, block_index=0))
        assert len(r.data) == min(size, 65536) and r.file_size == size
        r = stub.ReadBlock(dis_pb2.ReadBlockRequest(location=key_msg(KEY), file=name, block_index=10**6))
        assert r.data == b""
        with pytest.raises(grpc.RpcError) as ei:
            stub.ReadBlock(dis_pb2.ReadBlockRequest(location=key_msg(KEY), file="../../etc/passwd", block_index=0))
        assert ei.value.code() == grpc.StatusCode.NOT_FOUND
        bad = dis_pb2.LocationKey(namespace="..", table="Trade", internal_partition="x", column_partition="y")
        with pytest.raises(grpc.RpcError) as ei:
            stub.ReadBlock(dis_pb2.ReadBlockRequest(location=bad, file=name, block_index=0))
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(DisClientError, match="unknown table"):
            c.read_table("Market", "Nope")


def test_health_reflection_and_metrics(dis):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    ch = grpc.insecure_channel(f"127.0.0.1:{dis.port}")
    h = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""))
    assert h.status == health_pb2.HealthCheckResponse.SERVING
    h = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="disd.rpc.v1.Ingest"))
    assert h.status == health_pb2.HealthCheckResponse.SERVING
    resp = reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    names = {s.name for r in resp for s in r.list_services_response.service}
    assert {"disd.rpc.v1.Ingest", "disd.rpc.v1.TableData", "grpc.health.v1.Health"} <= names
    ch.close()
    text = urllib.request.urlopen(f"http://127.0.0.1:{dis.metrics_port}/metrics", timeout=5).read().decode()
    for name in ["dis_connected_tailers", "dis_block_reads_total", "dis_write_size_bytes", "dis_partitions_in_error"]:
        assert name in text, name


def test_idle_stream_is_closed(tmp_path, trade):
    with running_dis(tmp_path / "db", idle_timeout_s=0.5) as srv:
        s = IngestStream(srv.port)
        s.open(fingerprint=trade.fingerprint)
        with pytest.raises(grpc.RpcError) as ei:
            next(s.responses)  # send nothing: the DIS ends the stream
        assert ei.value.code() == grpc.StatusCode.CANCELLED
        s.close()


def test_a_caught_up_chunk_is_published_at_once_and_others_wait_for_the_tick(tmp_path, trade):
    """With a one-minute flush interval, rows of a chunk marked ``caught_up`` are visible as its
    ack arrives; rows of an unmarked chunk are not (they wait for the tick)."""
    p1, p2 = tmp_path / FILE1, tmp_path / FILE2
    write_log(p1, trade, trade_rows(0, 100), [3] * 100)
    write_log(p2, trade, trade_rows(100, 50), [3] * 50)
    with running_dis(tmp_path / "db", flush_ms=60_000, checkpoint_ms=60_000) as srv:
        s = IngestStream(srv.port)
        s.open(fingerprint=trade.fingerprint)
        data = p1.read_bytes()
        s.send(dis_pb2.IngestRequest(chunk=dis_pb2.LogChunk(file_name=FILE1, offset=0, data=data)))
        assert next(s.responses).ack.committed_rows == 100
        with connect(f"127.0.0.1:{srv.port}") as c:
            assert sum(loc.rows for loc in c.locations("Market", "Trade")) == 0  # waits for the tick
            s.send(dis_pb2.IngestRequest(chunk=dis_pb2.LogChunk(file_name=FILE2, offset=0, data=p2.read_bytes(),
                                                                caught_up=True)))
            assert next(s.responses).ack.committed_rows == 150
            assert sum(loc.rows for loc in c.locations("Market", "Trade")) == 150
            assert c.read_table("Market", "Trade").column("Size").to_pylist() == list(range(150))
        s.close()
