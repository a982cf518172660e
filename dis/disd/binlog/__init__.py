"""The binary log: the row-oriented, checksummed files applications write and the DIS ingests.

Public surface::

    read_file(path) -> LogContents   (.table, .flags, .end_offset)
    read_header(path) -> LogHeader   (.schema, .fingerprint; None while incomplete)
    RowFlag                          (NONE, START_TRANSACTION, END_TRANSACTION, SINGLE_ROW)
    BinlogWriter, LogFileName, LocationKey

The byte layout is specified in docs/binlog-format.md and implemented in ``format``.
"""

from disd.binlog.filename import InvalidLogFileName, LogFileName, NamespaceSet
from disd.binlog.format import (
    BinlogError,
    CorruptLogError,
    DecodedRows,
    FrameRun,
    LogHeader,
    RowFlag,
    SchemaMismatchError,
    decode_frames,
    decode_header,
    scan_frames,
)
from disd.binlog.io import BinlogWriter, LogContents, read_file, read_header
from disd.binlog.normalize import normalize_columns
from disd.names import LocationKey

__all__ = [
    "BinlogError",
    "BinlogWriter",
    "CorruptLogError",
    "DecodedRows",
    "FrameRun",
    "InvalidLogFileName",
    "LocationKey",
    "LogContents",
    "LogFileName",
    "LogHeader",
    "NamespaceSet",
    "RowFlag",
    "SchemaMismatchError",
    "decode_frames",
    "decode_header",
    "normalize_columns",
    "read_file",
    "read_header",
    "scan_frames",
]
