"""libFuzzer (atheris) harness for the binary-log decoder; run by test_atheris_fuzz.py.

Coverage-guided: atheris instruments ``disd.binlog`` so libFuzzer keeps the inputs that reach new
branches of the header, frame and row-record checks.  The first input byte picks the schema and
whether the frame checksums are recomputed (so mutations get past the CRCs).  Any exception other
than ``CorruptLogError``, or decoded rows that break the decoder's contract, is a crash: libFuzzer
writes the input under ``-artifact_prefix`` and exits non-zero.

    python tests/hostile/atheris_binlog.py -runs=20000 -max_total_time=5 CORPUS_DIR
"""

from __future__ import annotations

import struct
import sys

import atheris

with atheris.instrument_imports(include=["disd.binlog"]):
    from disd.binlog import CorruptLogError, decode_frames, decode_header, scan_frames
    from disd.binlog.format import FRAME_HEADER_SIZE, crc32c, encode_header

from disd.schema import SchemaRegistry, TableSchema

_REG = SchemaRegistry.load_dir(__import__("pathlib").Path(__file__).resolve().parents[2] / "config" / "schemas")
SCHEMAS: list[TableSchema] = [_REG.get("Market", "Trade"), _REG.get("Market", "Quote")]


def reseal(body: bytes) -> bytes:
    """Recompute every frame's checksums, walking the frames by their (fuzzed) lengths."""
    out = bytearray(body)
    p = 0
    while len(out) - p >= FRAME_HEADER_SIZE:
        plen, rows = struct.unpack_from("<II", out, p)
        end = min(len(out), p + FRAME_HEADER_SIZE + plen)
        struct.pack_into("<I", out, p + 8, crc32c(bytes(out[p + FRAME_HEADER_SIZE:end])))
        struct.pack_into("<I", out, p + 12, crc32c(bytes(out[p:p + 12])))
        p = end
    return bytes(out)


def one_input(data: bytes) -> None:
    if not data:
        return
    mode = data[0]
    schema = SCHEMAS[mode & 1]
    body = data[1:]
    if mode & 2:  # a header of the right schema, the fuzzed bytes as frames
        header = encode_header(schema)
        buf = header + (reseal(body) if mode & 4 else body)
    else:
        buf = body
    try:
        hdr = decode_header(buf)
        if hdr is None:
            return
        run = scan_frames(buf, 0, schema, start=hdr.size)
        if not (hdr.size <= run.end_offset <= len(buf)):
            raise AssertionError("frame run ends outside the buffer")
        if not run.starts:
            return
        rows = decode_frames(buf, 0, run, schema)
    except CorruptLogError:
        return
    if rows.num_rows != run.rows or any(len(c) != rows.num_rows for c in rows.columns):
        raise AssertionError("decoded columns disagree with the frames' row counts")
    for c in rows.columns:
        c.validate(full=True)


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
