"""Whole frames only: chunk limits, the header at offset 0, a torn or growing tail, corruption."""

from __future__ import annotations

import pytest

from disd.binlog import CorruptLogError, decode_header
from disd.tailer.frames import FrameReader, complete_end, read_frames

from .helpers import name, write


def frames_of(path):
    """(start, end) of each frame of a log written by write()."""
    data = path.read_bytes()
    from disd.binlog import scan_frames

    h = decode_header(data)
    run = scan_frames(data, 0, h.schema, start=h.size)
    return h.size, list(zip(run.starts, run.ends))


def test_chunks_hold_whole_frames_within_the_limit(tmp_path):
    p = tmp_path / name()
    for i in range(20):
        write(p, 10, i * 10)
    hsize, frames = frames_of(p)
    full = p.read_bytes()
    fsize = frames[0][1] - frames[0][0]
    limit = hsize + 3 * fsize + 5  # room for the header and 3 frames at offset 0, 3 frames later
    chunks = []
    with FrameReader(str(p)) as r:
        off = 0
        while True:
            piece = r.read(off, limit)
            if not piece.data:
                assert piece.complete
                break
            assert piece.offset == off and len(piece.data) <= limit
            assert piece.data == full[off:piece.end]
            chunks.append((off, piece.end))
            off = piece.end
    assert off == len(full)
    ends = {e for _, e in frames}
    assert all(e in ends for _, e in chunks)  # every chunk ends on a frame boundary
    assert chunks[0] == (0, frames[2][1])  # the first chunk carries the header
    assert chunks[1] == (frames[2][1], frames[5][1])


def test_a_frame_bigger_than_the_limit_goes_alone(tmp_path):
    p = tmp_path / name()
    write(p, 1)
    end2 = write(p, 5000, 1)
    write(p, 1, 5001)
    hsize, frames = frames_of(p)
    piece = read_frames(str(p), frames[1][0], 100)
    assert (piece.offset, piece.end) == frames[1] and piece.end == end2
    piece = read_frames(str(p), 0, 10)  # even the header and the first frame exceed the limit
    assert (piece.offset, piece.end) == (0, frames[0][1])


def test_a_torn_tail_waits_and_completes(tmp_path):
    p = tmp_path / name()
    end1 = write(p, 10)
    end2 = write(p, 10, 10)
    full = p.read_bytes()
    for cut in (end1 + 3, end1 + 16, end2 - 1):  # inside the frame header, just after it, in the payload
        p.write_bytes(full[:cut])
        piece = read_frames(str(p), 0, 1 << 20)
        assert (piece.offset, piece.end) == (0, end1)
        piece = read_frames(str(p), end1, 1 << 20)
        assert not piece.data and not piece.complete and piece.tail == cut - end1
        assert complete_end(str(p)) == end1
    p.write_bytes(full[:end1] + bytes(40))  # preallocated zeros are a torn tail too
    assert not read_frames(str(p), end1, 1 << 20).complete
    p.write_bytes(full)  # the writer finishes the frame
    piece = read_frames(str(p), end1, 1 << 20)
    assert (piece.offset, piece.end) == (end1, end2)
    assert read_frames(str(p), end2, 1 << 20).complete


def test_header_only_and_incomplete_header(tmp_path):
    p = tmp_path / name()
    hsize = write(p, 0)
    assert p.stat().st_size == hsize
    piece = read_frames(str(p), 0, 1 << 20)
    assert not piece.data and piece.complete  # nothing to send, nothing pending
    assert complete_end(str(p)) == hsize
    full = p.read_bytes()
    p.write_bytes(full[:10])
    piece = read_frames(str(p), 0, 1 << 20)
    assert not piece.data and not piece.complete
    assert complete_end(str(p)) == 0
    p.write_bytes(b"")
    assert not read_frames(str(p), 0, 1 << 20).data


def test_resume_offset_positions_mid_file(tmp_path):
    p = tmp_path / name()
    end1 = write(p, 10)
    end2 = write(p, 10, 10)
    piece = read_frames(str(p), end1, 1 << 20)
    assert (piece.offset, piece.end) == (end1, end2) and piece.data == p.read_bytes()[end1:]
    # a resume offset past the end (a file replaced by a shorter one): nothing, nothing pending
    assert read_frames(str(p), end2 + 100, 1 << 20).complete


def test_corruption_raises_with_the_offset(tmp_path):
    p = tmp_path / name()
    end1 = write(p, 10)
    write(p, 10, 10)
    data = bytearray(p.read_bytes())
    data[end1 + 20] ^= 0xFF  # inside the second frame's payload
    p.write_bytes(bytes(data))
    piece = read_frames(str(p), 0, end1)  # the first frame is still fine
    assert piece.end == end1
    with pytest.raises(CorruptLogError) as ei:
        read_frames(str(p), end1, 1 << 20)
    assert ei.value.offset == end1
    p.write_bytes(b"NOTALOG!" + bytes(100))
    with pytest.raises(CorruptLogError):
        read_frames(str(p), 0, 1 << 20)


def test_a_cut_read_hands_its_frames_as_a_view_that_both_requests_carry(tmp_path):
    """A read that goes past the last whole frame hands the frames as a view of what it read (no
    copy of a chunk: docs/benchmarks-history.md, "The tailer's CPU per burst"); the ``Multiplex``
    request and the ``Stream`` request built from it carry exactly those frames."""
    from disd.rpc.ingestwire import ChunkOut, encode_mux_request, parse_mux_request
    from disd.tailer.single import chunk_request

    p = tmp_path / name()
    for i in range(4):
        write(p, 10, i * 10)
    hsize, frames = frames_of(p)
    full = p.read_bytes()
    piece = read_frames(str(p), frames[0][1], frames[2][1] - frames[0][1] + 7)  # 2 frames and a bit
    assert (piece.offset, piece.end) == (frames[0][1], frames[2][1])
    assert isinstance(piece.data, memoryview)  # cut from the read, not copied
    want = full[piece.offset:piece.end]
    req = chunk_request(p.name, piece)
    assert (req.chunk.offset, req.chunk.data) == (piece.offset, want)
    [(number, chunk)] = parse_mux_request(encode_mux_request([(3, ChunkOut(p.name, piece.offset, piece.data, False))]))
    assert number == 3 and (chunk.offset, bytes(chunk.data)) == (piece.offset, want)
