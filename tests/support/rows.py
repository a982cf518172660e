"""Market.Trade (and Market.Quote) rows with known values, and binary logs written from them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from disd.binlog import BinlogWriter, RowFlag, normalize_columns
from disd.binlog.format import encode_frame, encode_rows
from disd.schema import SchemaRegistry, TableSchema

from .paths import SCHEMAS

TRADE = SchemaRegistry.load_dir(SCHEMAS).get("Market", "Trade")
#: every column type, and two string columns (the multi-string heap path)
ALL_TYPES = TableSchema.from_dict({
    "namespace": "Test",
    "table": "AllTypes",
    "columns": [{"name": n, "type": n.lower()}
                for n in ["Bool", "Byte", "Short", "Int", "Long", "Float", "Double", "Char", "String", "Timestamp"]]
    + [{"name": "Other", "type": "string"}],
})
START_NS = 1_763_800_000_000_000_000
SYMS = ("AAPL", "MSFT", "IBM", "GOOG", "NVDA")


def trade_rows(start: int, n: int, *, nulls: bool = False, syms=SYMS) -> pa.Table:
    """Rows ``start`` .. ``start + n - 1`` of Market.Trade: row i has Size i, Price i/4, Sym
    ``syms[i % len(syms)]`` and Timestamp START_NS + i*1001 ns; with ``nulls``, every 7th row
    (i % 7 == 3) has a null Sym and Price."""
    idx = np.arange(start, start + n, dtype=np.int64)
    sym = pa.array(np.asarray(syms, dtype=object)[idx % len(syms)], pa.string())
    price = pa.array(idx * 0.25)
    if nulls:
        mask = pa.array(idx % 7 == 3)
        sym = pc.if_else(mask, pa.nulls(n, pa.string()), sym)
        price = pc.if_else(mask, pa.nulls(n, pa.float64()), price)
    return pa.table({
        "Timestamp": pa.array(START_NS + idx * 1001).cast(pa.timestamp("ns", tz="UTC")),
        "Sym": sym,
        "Price": price,
        "Size": pa.array(idx.astype(np.int32)),
    })


#: Market.Quote's Exchange (a char column): code units logged, and what each reads as everywhere
#: (docs/storage-format.md, "What a char reads as"): null, half a surrogate pair as U+FFFD, and
#: characters of one, two and three UTF-8 bytes.
CHAR_CODES = [ord("A"), 0xE9, 0x263A, 0xD800, None, ord("Z"), 0xDFFF, 0x7F, 0x80, 0x7FF, 0x800, 0xFFFD]
CHAR_STRINGS = ["A", "é", "☺", "\ufffd", None, "Z", "\ufffd", "\x7f", "\x80", "\u07ff", "\u0800", "\ufffd"]


def quote_rows() -> pa.Table:
    """Market.Quote rows, one per ``CHAR_CODES``: row i has Sym ``S<i>``, Bid i and Exchange
    ``CHAR_CODES[i]``."""
    n = len(CHAR_CODES)
    return pa.table({
        "Timestamp": pa.array(START_NS + np.arange(n, dtype=np.int64)).cast(pa.timestamp("ns", tz="UTC")),
        "Sym": pa.array([f"S{i}" for i in range(n)]),
        "Exchange": pa.array(CHAR_CODES, pa.uint16()),
        "Bid": pa.array(np.arange(n, dtype=np.float64)),
    })


def log_name(ip: str = "feed1", day: str = "2026-11-22", hhmmss: str = "090000") -> str:
    """A Market.Trade log file name (docs/binlog-format.md): a later ``hhmmss``, a later file."""
    return f"Market.Trade.System.{ip}.{day}.bin.{day}.{hhmmss}.000+0000"


def write_log(path, schema: TableSchema, columns, flags, single_frame: bool = False) -> int:
    """Append rows (a Table or a dict of columns) with their row flags; returns the file's size
    after them.  ``single_frame`` writes them as one frame even across transaction starts (as a
    foreign writer might)."""
    flags = np.asarray(flags, np.uint8)
    with BinlogWriter(path, schema) as w:
        if not single_frame:
            return w.write_rows(normalize_columns(schema, columns), flags)
        payload, n = encode_rows(schema, normalize_columns(schema, columns), flags)
        data = encode_frame(payload, n)
        w._file.write(data)  # noqa: SLF001 - a torn frame written past the writer
        return w.offset + len(data)


def append_rows(path, start: int, n: int, frames: int = 1) -> int:
    """Append Market.Trade rows ``start`` .. ``start + n - 1`` (``trade_rows``) to a log as single
    rows in ``frames`` frames; returns the new file size."""
    with BinlogWriter(path, TRADE) as w:
        for part in np.array_split(np.arange(start, start + n), frames):
            if len(part):
                cols = normalize_columns(TRADE, trade_rows(int(part[0]), len(part)))
                w.write_rows(cols, np.full(len(part), RowFlag.SINGLE_ROW, np.uint8))
        return w.offset


def bits(t: pa.Table) -> pa.Table:
    """``t`` with its floats as their bit patterns, so that equal tables compare equal (NaNs too)."""
    out = {}
    for name, col in zip(t.column_names, t.columns):
        arr = pa.concat_arrays(col.chunks) if col.num_chunks else pa.array([], col.type)
        if pa.types.is_floating(arr.type):
            arr = arr.view(pa.int64() if arr.type == pa.float64() else pa.int32())
        out[name] = arr
    return pa.table(out)
