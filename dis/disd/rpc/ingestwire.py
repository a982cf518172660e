"""Ingest requests read off the wire without copying a chunk's bytes.

A ``LogChunk`` carries up to 32 MiB of log.  Parsed the usual way, its bytes are copied twice
after gRPC hands the message over: protobuf's parser copies them into its message, and reading
``chunk.data`` copies them again into a new ``bytes``.  On the DIS each copy lands in freshly
mapped pages (``disd.allocator`` keeps blocks of 4 MiB and more on mmap), so the two copies
cost the DIS about as much as writing the column files.

``parse_ingest_request`` is the Ingest service's request deserializer.  For the message that
matters (an ``IngestRequest`` whose body is a ``chunk``, fields as proto/disd/rpc/v1/dis.proto
numbers them) it walks the protobuf wire format itself and returns a ``ChunkView`` whose
``data`` is a memoryview of the received message: no copy.  Anything else (``open``,
``report``, a field this module does not know, a repeated field, malformed bytes) goes to the
generated parser, so the answer, and the error for bad bytes, are exactly protobuf's.

The ``Multiplex`` call's requests (``MuxRequest``: numbered frames, each an ``IngestRequest`` or
a stream's end) are read the same way by ``parse_mux_request``, each frame's chunk a view of the
message; and a tailer writes them with ``encode_mux_request``, which puts a chunk's bytes into
the message once instead of copying them through two nested messages.
"""

from __future__ import annotations

from dataclasses import dataclass

from disd.rpc.v1 import dis_pb2

# wire types (protobuf encoding): VARINT, LEN
_VARINT, _LEN = 0, 2
# IngestRequest.chunk = 2; LogChunk.file_name = 1, offset = 2, data = 3, caught_up = 4
_CHUNK_TAG = (2 << 3) | _LEN
_FILE_NAME, _OFFSET, _DATA, _CAUGHT_UP = 1, 2, 3, 4
_WIRE_OF = {_FILE_NAME: _LEN, _OFFSET: _VARINT, _DATA: _LEN, _CAUGHT_UP: _VARINT}


@dataclass(frozen=True, slots=True)
class ChunkView:
    """An ``IngestRequest`` whose body is a ``LogChunk``, its ``data`` a view of the received
    message (which it keeps alive).  Field meanings are ``LogChunk``'s."""

    file_name: str
    offset: int
    data: memoryview
    caught_up: bool


class _NotAChunk(Exception):
    """The message is not one this module reads: the generated parser takes it."""


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it (at most 10 bytes, as protobuf's)."""
    value = shift = 0
    for i in range(pos, min(pos + 10, end)):
        b = buf[i]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i + 1
        shift += 7
    raise _NotAChunk


def _chunk(raw: bytes, start: int = 0, end: int | None = None) -> ChunkView:
    """The ``IngestRequest`` in ``raw[start:end]`` as a ``ChunkView`` (its data a view of
    ``raw``); ``_NotAChunk`` when it is anything else."""
    end = len(raw) if end is None else end
    if end <= start or raw[start] != _CHUNK_TAG:
        raise _NotAChunk
    size, pos = _varint(raw, start + 1, end)
    if pos + size != end:  # more top-level fields after the chunk (or a short message)
        raise _NotAChunk
    fields: dict[int, int | tuple[int, int]] = {}
    while pos < end:
        key, pos = _varint(raw, pos, end)
        number, wire = key >> 3, key & 7
        if _WIRE_OF.get(number) != wire or number in fields:
            raise _NotAChunk
        if wire == _VARINT:
            fields[number], pos = _varint(raw, pos, end)
        else:
            length, pos = _varint(raw, pos, end)
            if pos + length > end:
                raise _NotAChunk
            fields[number] = (pos, pos + length)
            pos += length
    name_at = fields.get(_FILE_NAME, (0, 0))
    data_at = fields.get(_DATA, (0, 0))
    assert isinstance(name_at, tuple) and isinstance(data_at, tuple)
    try:
        file_name = raw[name_at[0]:name_at[1]].decode("utf-8")
    except UnicodeDecodeError:
        raise _NotAChunk from None
    offset = fields.get(_OFFSET, 0)
    caught_up = fields.get(_CAUGHT_UP, 0)
    assert isinstance(offset, int) and isinstance(caught_up, int)
    return ChunkView(file_name, offset & 0xFFFF_FFFF_FFFF_FFFF, memoryview(raw)[data_at[0]:data_at[1]],
                     caught_up != 0)


def parse_ingest_request(raw: bytes) -> ChunkView | dis_pb2.IngestRequest:
    """A chunk as a ``ChunkView``; every other message as protobuf's ``IngestRequest``."""
    try:
        return _chunk(raw)
    except _NotAChunk:
        return dis_pb2.IngestRequest.FromString(raw)


# MuxRequest.frames = 1; MuxFrame.stream = 1, request = 2, end = 3
_FRAMES_TAG = (1 << 3) | _LEN
_STREAM_TAG, _REQUEST_TAG, _END_TAG = (1 << 3) | _VARINT, (2 << 3) | _LEN, (3 << 3) | _VARINT
#: the body of a frame that ends its stream (``MuxFrame.end``)
END = "end"
#: the body of a frame with neither a request nor an end
INVALID = "invalid"

MuxBody = ChunkView | dis_pb2.IngestRequest | str


def _mux_frames(raw: bytes) -> list[tuple[int, MuxBody]]:
    frames: list[tuple[int, MuxBody]] = []
    end = len(raw)
    pos = 0
    while pos < end:
        if raw[pos] != _FRAMES_TAG:
            raise _NotAChunk
        size, pos = _varint(raw, pos + 1, end)
        f_end = pos + size
        if f_end > end:
            raise _NotAChunk
        body: MuxBody = INVALID
        number, seen = 0, set()
        while pos < f_end:
            tag = raw[pos]
            if tag in seen:
                raise _NotAChunk
            seen.add(tag)
            if tag == _STREAM_TAG:
                number, pos = _varint(raw, pos + 1, f_end)
            elif tag == _END_TAG:
                flag, pos = _varint(raw, pos + 1, f_end)
                body = END if flag else INVALID
            elif tag == _REQUEST_TAG:
                length, pos = _varint(raw, pos + 1, f_end)
                if pos + length > f_end or _END_TAG in seen:
                    raise _NotAChunk
                try:
                    body = _chunk(raw, pos, pos + length)
                except _NotAChunk:
                    body = dis_pb2.IngestRequest.FromString(raw[pos:pos + length])
                pos += length
            else:
                raise _NotAChunk
        if pos != f_end:
            raise _NotAChunk
        frames.append((number & 0xFFFF_FFFF, body))
    return frames


def parse_mux_request(raw: bytes) -> list[tuple[int, MuxBody]]:
    """A ``MuxRequest`` as its frames in order: (stream number, body), the body a
    ``ChunkView``, another ``IngestRequest``, ``END`` or ``INVALID``.  Anything this module
    does not walk itself goes to protobuf's parser (and its errors)."""
    try:
        return _mux_frames(raw)
    except _NotAChunk:
        pass
    frames: list[tuple[int, MuxBody]] = []
    for f in dis_pb2.MuxRequest.FromString(raw).frames:
        which = f.WhichOneof("body")
        body: MuxBody = f.request if which == "request" else (END if which == "end" and f.end else INVALID)
        frames.append((f.stream, body))
    return frames


def _put_varint(out: list[bytes], value: int) -> None:
    b = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            b.append(byte | 0x80)
        else:
            b.append(byte)
            out.append(bytes(b))
            return


def _len_field(out: list[bytes], tag: int, payload_len: int) -> None:
    out.append(bytes((tag,)))
    _put_varint(out, payload_len)


def _varint_len(value: int) -> int:
    n = 1
    while value >= 0x80:
        value >>= 7
        n += 1
    return n


@dataclass(frozen=True, slots=True)
class ChunkOut:
    """A chunk to write in a ``MuxRequest`` (``LogChunk``'s fields; ``data`` is not copied
    before the message is joined)."""

    file_name: str
    offset: int
    data: bytes | memoryview
    caught_up: bool


def encode_mux_request(frames: list[tuple[int, ChunkOut | bytes | None]]) -> bytes:
    """A ``MuxRequest``'s bytes: each frame (stream number, body), the body a ``ChunkOut``, an
    ``IngestRequest``'s serialized bytes, or None for the stream's end.  Protobuf's parser reads
    the result as the message (tested); building it by hand joins each chunk's data once."""
    out: list[bytes] = []
    for number, body in frames:
        head: list[bytes] = [bytes((_STREAM_TAG,))]
        _put_varint(head, number)
        if body is None:
            head.append(bytes((_END_TAG, 1)))
            tail: list = []
        elif isinstance(body, ChunkOut):
            name = body.file_name.encode("utf-8")
            inner: list[bytes] = []
            _len_field(inner, (_FILE_NAME << 3) | _LEN, len(name))
            inner.append(name)
            if body.offset:
                inner.append(bytes(((_OFFSET << 3) | _VARINT,)))
                _put_varint(inner, body.offset)
            _len_field(inner, (_DATA << 3) | _LEN, len(body.data))
            trailer = bytes(((_CAUGHT_UP << 3) | _VARINT, 1)) if body.caught_up else b""
            chunk_len = sum(map(len, inner)) + len(body.data) + len(trailer)
            request_head: list[bytes] = [bytes((_CHUNK_TAG,))]
            _put_varint(request_head, chunk_len)
            request_len = sum(map(len, request_head)) + chunk_len
            _len_field(head, _REQUEST_TAG, request_len)
            head.extend(request_head)
            head.extend(inner)
            tail = [body.data, trailer]
        else:
            _len_field(head, _REQUEST_TAG, len(body))
            tail = [body]
        frame_len = sum(map(len, head)) + sum(map(len, tail))
        _len_field(out, _FRAMES_TAG, frame_len)
        out.extend(head)
        out.extend(tail)
    return b"".join(out)
