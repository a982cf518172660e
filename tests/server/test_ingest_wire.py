"""The Ingest service's chunk reader (disd.rpc.ingestwire) against protobuf's own parser."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError

from disd.rpc.ingestwire import ChunkView, parse_ingest_request
from disd.rpc.v1 import dis_pb2

NAME = "Market.Trade.0.2026-11-24.bin.2026-11-24.080000.000"


def chunk_request(**fields) -> bytes:
    req = dis_pb2.IngestRequest()
    for k, v in fields.items():
        setattr(req.chunk, k, v)
    if not fields:
        req.chunk.SetInParent()
    return req.SerializeToString()


@pytest.mark.parametrize("fields", [
    {"file_name": NAME, "offset": 123_456, "data": b"\x01\x02" * 5000, "caught_up": True},
    {"file_name": NAME, "offset": 0, "data": b"x"},
    {"file_name": "Ns.T.é.2026-11-24.bin", "offset": (1 << 64) - 1, "data": b""},
    {"data": bytes(range(256)) * 300},
    {},
])
def test_a_chunk_is_read_as_protobuf_reads_it_without_copying(fields) -> None:
    raw = chunk_request(**fields)
    got = parse_ingest_request(raw)
    want = dis_pb2.IngestRequest.FromString(raw).chunk
    assert isinstance(got, ChunkView)
    assert (got.file_name, got.offset, bytes(got.data), got.caught_up) == \
        (want.file_name, want.offset, want.data, want.caught_up)
    assert got.data.obj is raw  # a view of the received message


def test_field_order_does_not_matter() -> None:
    inner = dis_pb2.LogChunk(data=b"abc").SerializeToString() + \
        dis_pb2.LogChunk(offset=7, file_name=NAME, caught_up=True).SerializeToString()
    raw = bytes([0x12, len(inner)]) + inner
    got = parse_ingest_request(raw)
    assert isinstance(got, ChunkView)
    assert (got.file_name, got.offset, bytes(got.data), got.caught_up) == (NAME, 7, b"abc", True)


def test_other_messages_go_to_protobuf() -> None:
    opened = dis_pb2.IngestRequest(open=dis_pb2.IngestOpen(tailer_id="h:1", schema_fingerprint="ab"))
    report = dis_pb2.IngestRequest(report=dis_pb2.TailerReport(problem="disk full"))
    for msg in (opened, report):
        got = parse_ingest_request(msg.SerializeToString())
        assert isinstance(got, dis_pb2.IngestRequest) and got == msg


def test_unknown_and_repeated_fields_go_to_protobuf() -> None:
    base = dis_pb2.LogChunk(file_name=NAME, offset=5, data=b"abc").SerializeToString()
    unknown = base + bytes([(9 << 3) | 0, 1])  # field 9, varint 1
    repeated = base + dis_pb2.LogChunk(offset=9).SerializeToString()  # the last offset wins
    for inner in (unknown, repeated):
        raw = bytes([0x12, len(inner)]) + inner
        got = parse_ingest_request(raw)
        assert isinstance(got, dis_pb2.IngestRequest)
        assert got == dis_pb2.IngestRequest.FromString(raw)
    assert parse_ingest_request(bytes([0x12, len(repeated)]) + repeated).chunk.offset == 9


@pytest.mark.parametrize("raw", [
    bytes([0x12, 50]) + b"short",                     # length past the end
    bytes([0x12, 4, 0x1A, 9, 1, 2]),                  # data's length past the chunk's end
    bytes([0x12, 3, 0x0A, 1, 0xFF]),                  # file_name not UTF-8
    bytes([0x12, 2, 0x10, 0x80]),                     # offset's varint cut off
])
def test_malformed_bytes_get_protobufs_error(raw: bytes) -> None:
    with pytest.raises(DecodeError):
        dis_pb2.IngestRequest.FromString(raw)
    with pytest.raises(DecodeError):
        parse_ingest_request(raw)


def test_a_mux_request_written_by_hand_is_protobufs_message_and_read_back_without_copying() -> None:
    from disd.rpc.ingestwire import END, ChunkOut, encode_mux_request, parse_mux_request

    opened = dis_pb2.IngestRequest(open=dis_pb2.IngestOpen(tailer_id="h:1", schema_fingerprint="ab"))
    data = bytes(range(256)) * 40
    frames = [(1, opened.SerializeToString()), (2, ChunkOut(NAME, 0, data, True)),
              (300, ChunkOut(NAME, (1 << 64) - 1, memoryview(data)[7:], False)), (1, None), (0, ChunkOut("", 0, b"", False))]
    raw = encode_mux_request(frames)
    want = dis_pb2.MuxRequest.FromString(raw)
    assert [(f.stream, f.WhichOneof("body")) for f in want.frames] == \
        [(1, "request"), (2, "request"), (300, "request"), (1, "end"), (0, "request")]
    assert want.frames[0].request == opened
    c = want.frames[2].request.chunk
    assert (c.file_name, c.offset, c.data, c.caught_up) == (NAME, (1 << 64) - 1, data[7:], False)
    got = parse_mux_request(raw)
    assert [n for n, _ in got] == [1, 2, 300, 1, 0]
    assert got[0][1] == opened and got[3][1] is END
    for (_, view), f in zip(got[1:3] + got[4:], [want.frames[1], want.frames[2], want.frames[4]]):
        assert isinstance(view, ChunkView) and view.data.obj is raw
        assert (view.file_name, view.offset, bytes(view.data), view.caught_up) == \
            (f.request.chunk.file_name, f.request.chunk.offset, f.request.chunk.data, f.request.chunk.caught_up)


def test_a_mux_request_it_does_not_walk_goes_to_protobuf() -> None:
    from disd.rpc.ingestwire import INVALID, parse_mux_request

    req = dis_pb2.MuxRequest()
    f = req.frames.add()
    f.stream = 5
    f.request.chunk.data = b"abc"
    req.frames.add(stream=6)  # neither a request nor an end
    raw = req.SerializeToString() + bytes([(9 << 3) | 0, 1])  # and an unknown field
    got = parse_mux_request(raw)
    assert got[0][0] == 5 and got[0][1].chunk.data == b"abc" and got[1] == (6, INVALID)
    with pytest.raises(DecodeError):
        parse_mux_request(bytes([0x0A, 50]) + b"short")
