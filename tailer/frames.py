"""Reading whole frames of a (possibly growing) binary log file.

A chunk sent to the DIS holds whole frames only: the file's first chunk starts at offset 0 and
carries the header, later chunks start at a frame boundary.  A chunk holds at most ``max_bytes``
unless a single frame is bigger, which then goes alone.  Bytes after the last complete frame
(a torn or still-growing tail) are never sent; the reader reports them so the caller waits.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from disd.binlog import CorruptLogError, LogHeader, decode_header, scan_frames
from disd.binlog.format import FRAME_HEADER_SIZE, MAX_FRAME_PAYLOAD, MAX_SCHEMA_JSON

_HEADER_PROBE = 64 << 10


@dataclass(frozen=True)
class Piece:
    """Whole frames ``data`` at ``offset`` (with the header when offset is 0), ending at ``end``.
    ``data`` is empty when no complete frame follows ``offset`` yet; ``tail`` is then the number
    of bytes after ``offset`` that do not (yet) make a complete frame (or header).

    ``data`` is a view of the bytes read when the read went past the last whole frame (a torn
    tail, or a frame that did not fit in ``max_bytes``), not a copy: the request's encoding copies
    the bytes anyway, and the copy here was a fifth of the tailer's CPU for cutting and encoding a
    burst (docs/benchmarks-history.md, "The tailer's CPU per burst").  ``bytes(data)`` where a
    ``bytes`` is needed (a protobuf field)."""

    data: bytes | memoryview
    offset: int
    end: int
    tail: int = 0
    #: ``end`` is the end of the file as it was read: nothing more to send from it for now
    at_end: bool = False
    #: the file's size when it was read (-1: not known)
    file_size: int = -1

    @property
    def complete(self) -> bool:
        """Nothing but whole frames up to ``end``: no torn tail pending."""
        return not self.data and self.tail == 0


class FrameReader:
    """One open log file; ``read(offset, max_bytes)`` returns the next whole frames."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self._header: LogHeader | None = None

    def size(self) -> int:
        return os.fstat(self._fd).st_size

    def header(self) -> LogHeader | None:
        """The file's header; None while it is incomplete.  CorruptLogError if it is bad."""
        if self._header is None:
            data = os.pread(self._fd, _HEADER_PROBE, 0)
            header = decode_header(data, self.path)
            if header is None and len(data) == _HEADER_PROBE:
                data = os.pread(self._fd, _HEADER_PROBE + MAX_SCHEMA_JSON, 0)
                header = decode_header(data, self.path)
            self._header = header
        return self._header

    def read(self, offset: int, max_bytes: int) -> Piece:
        header = self.header()
        size = self.size()
        if header is None:
            return Piece(b"", offset, offset, size - offset, file_size=size)
        start = header.size if offset == 0 else offset
        if start > size:
            # a file shorter than the resume point (replaced?): nothing to send from here
            return Piece(b"", offset, offset, 0, file_size=size)
        if start == size:
            return Piece(b"", offset, offset, 0, file_size=size)
        head = start - offset  # bytes of header leading the chunk
        want = min(max(max_bytes, head + FRAME_HEADER_SIZE), size - offset)
        data = os.pread(self._fd, want, offset)
        try:
            run = scan_frames(data, offset, header.schema, start=head, path=self.path)
        except CorruptLogError as e:
            if e.offset <= start:
                raise
            # whole good frames precede the corruption: they go first, the next read raises
            data = data[: e.offset - offset]
            run = scan_frames(data, offset, header.schema, start=head, path=self.path)
        if not run.starts and len(data) >= head + FRAME_HEADER_SIZE and len(data) < size - offset:
            # one frame bigger than max_bytes: it goes alone (whole, or not at all while torn)
            plen = struct.unpack_from("<I", data, head)[0]
            need = head + FRAME_HEADER_SIZE + plen
            if plen <= MAX_FRAME_PAYLOAD and need <= size - offset:
                data = os.pread(self._fd, need, offset)
                run = scan_frames(data, offset, header.schema, start=head, path=self.path, max_frames=1)
        if not run.starts:
            return Piece(b"", offset, offset, size - start, file_size=size)
        n = run.end_offset - offset
        return Piece(data if n == len(data) else memoryview(data)[:n], offset, run.end_offset, at_end=run.end_offset == size,
                     file_size=size)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "FrameReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_frames(path: str, offset: int, max_bytes: int) -> Piece:
    """Whole frames of ``path`` from ``offset``: see ``FrameReader.read``."""
    with FrameReader(path) as r:
        return r.read(offset, max_bytes)


def complete_end(path: str, offset: int = 0) -> int:
    """The offset just past the last complete frame of a file (the header's end when it has no
    frame; 0 while the header is incomplete)."""
    with FrameReader(path) as r:
        header = r.header()
        if header is None:
            return 0
        while True:
            piece = r.read(offset, 64 << 20)
            if not piece.data:
                return max(offset, header.size)
            offset = piece.end


def read_header(path: str) -> LogHeader | None:
    with FrameReader(path) as r:
        return r.header()


__all__ = ["CorruptLogError", "FrameReader", "Piece", "complete_end", "read_frames", "read_header"]
