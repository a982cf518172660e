"""Ingest requests read off the wire without copying a chunk's bytes.

A ``LogChunk`` carries up to 32 MiB of log.  Parsed the usual way, its bytes are copied twice
after gRPC hands the message over: protobuf's parser copies them into its message, and reading
``chunk.data`` copies them again into a new ``bytes``.  On the DIS each copy lands in freshly
mapped pages (``server.allocator`` keeps blocks of 4 MiB and more on mmap), and a profile of the
TSBS bench put the two copies at about an eighth of the DIS's busy time, as much as writing the
column files.

``parse_ingest_request`` is the Ingest service's request deserializer.  For the message that
matters (an ``IngestRequest`` whose body is a ``chunk``, fields as proto/disd/rpc/v1/dis.proto
numbers them) it walks the protobuf wire format itself and returns a ``ChunkView`` whose
``data`` is a memoryview of the received message: no copy.  Anything else (``open``,
``report``, a field this module does not know, a repeated field, malformed bytes) goes to the
generated parser, so the answer, and the error for bad bytes, are exactly protobuf's.
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


def _chunk(raw: bytes) -> ChunkView:
    end = len(raw)
    if end == 0 or raw[0] != _CHUNK_TAG:
        raise _NotAChunk
    size, pos = _varint(raw, 1, end)
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
