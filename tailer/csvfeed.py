"""CSV-fed tables: CSV files transcoded to binary log "spool" files, which stream like any log.

A CSV file is named like a binary log with ``.csv.`` in place of ``.bin.``
(``Market.Quote.System.feed1.2026-11-22.csv.2026-11-22.090000.000+0000``) and belongs to a table
listed in ``csv_tables``.  Its first line is the header (column names of the table's schema, in
any order; missing columns are null).  Complete lines are parsed with ``pyarrow.csv`` and appended
as ``SingleRow`` rows to ``<state_dir>/spool/<the .bin. name>`` with ``BinlogWriter``, at most
65,536 rows per step, so every step is exactly one frame.  The spool directory is one of the
directories the tailer streams from.

Restart safety (against the tailer being killed at any point): per CSV file, a state file
``<state_dir>/csv/<csv name>.json`` records how many CSV bytes are transcoded and where the spool
ends.  Before a frame is written the state records the step's CSV end as *pending*; after the frame
it records the new positions.  On restart ``BinlogWriter`` cuts a torn frame off the spool; if
the spool then ends past the recorded position the pending step was written and is adopted,
otherwise it is redone.  Either way every CSV line lands in the spool exactly once.

Values: empty fields are null (strings: the empty string); ``bool`` takes true/false/1/0;
``char`` one character; ``timestamp`` an integer of nanoseconds since the epoch or an ISO-8601
time (with a zone offset, or UTC when it has none).  Quoted fields may not contain line breaks.
A line that does not parse stops that CSV file (logged, shown by ``Tailer.csv_status()``).
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import structlog

from disd.binlog import BinlogWriter, LogFileName, RowFlag, normalize_columns
from disd.binlog.io import MAX_ROWS_PER_FRAME
from disd.errors import DisError
from disd.schema import ColumnType, TableSchema

log = structlog.get_logger("disd.tailer.csv")

STEP_BYTES = 4 << 20

_READ_TYPES = {
    ColumnType.BOOL: pa.bool_(),
    ColumnType.BYTE: pa.int8(),
    ColumnType.SHORT: pa.int16(),
    ColumnType.INT: pa.int32(),
    ColumnType.LONG: pa.int64(),
    ColumnType.FLOAT: pa.float32(),
    ColumnType.DOUBLE: pa.float64(),
    ColumnType.CHAR: pa.string(),
    ColumnType.STRING: pa.string(),
    ColumnType.TIMESTAMP: pa.string(),
}


class CsvError(DisError, ValueError):
    pass


def parse_header(line: bytes, schema: TableSchema) -> list[str]:
    try:
        names = pacsv.read_csv(io.BytesIO(line), read_options=pacsv.ReadOptions(use_threads=False)).column_names
    except pa.ArrowInvalid as e:
        raise CsvError(f"header row unreadable: {e}") from None
    known = set(schema.column_names)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise CsvError(f"header names a column {unknown[0]!r} that {schema.key} does not have")
    if len(set(names)) != len(names):
        raise CsvError("header names a column twice")
    return names


def _timestamps(arr: pa.Array) -> pa.Array:
    """Strings -> timestamp[ns, UTC]: integer nanoseconds or ISO-8601 (UTC when zone-less)."""
    arr = pc.if_else(pc.equal(arr, ""), pa.scalar(None, pa.string()), arr)
    valid = arr.drop_null()
    if len(valid) == 0:
        return pa.nulls(len(arr), pa.timestamp("ns", tz="UTC"))
    if pc.all(pc.match_substring_regex(valid, r"^-?\d+$")).as_py():
        return arr.cast(pa.int64()).view(pa.timestamp("ns", tz="UTC"))
    for target in (pa.timestamp("ns", tz="UTC"), pa.timestamp("ns")):
        try:
            out = arr.cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
        return out if target.tz else out.cast(pa.int64()).view(pa.timestamp("ns", tz="UTC"))
    values: list[int | None] = []
    for v in arr.to_pylist():  # mixed forms: one value at a time
        if v is None:
            values.append(None)
            continue
        try:
            values.append(int(v) if v.lstrip("-").isdigit() else _one_timestamp(v))
        except (pa.ArrowInvalid, ValueError):
            raise CsvError(f"{v!r} is not a timestamp (ns since the epoch or ISO-8601)") from None
    return pa.array(values, pa.int64()).view(pa.timestamp("ns", tz="UTC"))


def _one_timestamp(v: str) -> int:
    a = pa.array([v])
    try:
        return a.cast(pa.timestamp("ns", tz="UTC")).cast(pa.int64())[0].as_py()
    except pa.ArrowInvalid:
        return a.cast(pa.timestamp("ns")).cast(pa.int64())[0].as_py()


def _chars(arr: pa.Array) -> pa.Array:
    out: list[int | None] = []
    for v in arr.to_pylist():
        if not v:
            out.append(None)
        elif len(v) == 1 and ord(v) < 0x10000:
            out.append(ord(v))
        else:
            raise CsvError(f"{v!r} is not a single character")
    return pa.array(out, pa.uint16())


def parse_lines(header_line: bytes, body: bytes, names: list[str], schema: TableSchema) -> pa.Table:
    """Parse complete CSV lines (``body``) under ``header_line`` into columns of ``schema``."""
    types = {n: _READ_TYPES[schema.column(n).type] for n in names}
    try:
        table = pacsv.read_csv(
            io.BytesIO(header_line + body),
            read_options=pacsv.ReadOptions(use_threads=False, block_size=max(1 << 20, len(body) + len(header_line) + 1)),
            parse_options=pacsv.ParseOptions(newlines_in_values=False),
            convert_options=pacsv.ConvertOptions(column_types=types, null_values=[""], strings_can_be_null=False,
                                                 include_columns=names),
        )
    except pa.ArrowInvalid as e:
        raise CsvError(str(e)) from None
    cols = {}
    for n in names:
        arr = table.column(n).combine_chunks()
        t = schema.column(n).type
        if t is ColumnType.TIMESTAMP:
            arr = _timestamps(arr)
        elif t is ColumnType.CHAR:
            arr = _chars(arr)
        cols[n] = arr
    return pa.table(cols) if cols else pa.table({})


@dataclass
class CsvState:
    csv_offset: int = 0  # CSV bytes transcoded (header included)
    bin_offset: int = 0  # spool size after them
    rows: int = 0
    pending_csv_offset: int | None = None  # a step being written: its CSV end
    pending_rows: int = 0


@dataclass
class CsvFile:
    path: str
    csv_name: str
    name: LogFileName  # of its spool file
    schema: TableSchema
    state: CsvState | None = None
    writer: BinlogWriter | None = None
    header_line: bytes | None = None
    columns: list[str] = field(default_factory=list)
    finished: bool = False
    error: str | None = None
    tail_since: float | None = None
    tail_sig: tuple = ()

    @property
    def spool_name(self) -> str:
        return self.name.format()


class CsvTranscoder:
    """Transcodes the CSV files the scanner finds; one thread, files of a location in order."""

    def __init__(self, tables: dict[str, TableSchema], state_dir: str, grace_s: float, poll_s: float,
                 halt: threading.Event) -> None:
        self.tables = tables
        self.spool_dir = str(pathlib.Path(state_dir) / "spool")
        self.state_dir = pathlib.Path(state_dir) / "csv"
        self.grace_s = grace_s
        self.poll_s = poll_s
        self.halt = halt
        self.wake = threading.Event()
        self._files: dict[str, CsvFile] = {}
        self._lock = threading.Lock()
        self._quiet_since: float | None = None  # start of the last pass that found nothing to do
        self._thread: threading.Thread | None = None
        self.on_spool: Callable[[str], None] = lambda name: None  # called after a spool file grows

    def start(self) -> None:
        os.makedirs(self.spool_dir, exist_ok=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="tailer csv", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.wake.set()
        if self._thread is not None:
            self._thread.join(10)
        with self._lock:
            for f in self._files.values():
                if f.writer is not None:
                    f.writer.close()
                    f.writer = None

    def update(self, found: dict[str, tuple[LogFileName, str]]) -> None:
        """The CSV files of the latest directory scan (path -> (spool name, csv name))."""
        with self._lock:
            for path, (name, csv_name) in found.items():
                if path not in self._files:
                    schema = self.tables[name.location.table_key]
                    self._files[path] = CsvFile(path, csv_name, name, schema)
        self.wake.set()

    def status(self) -> dict[str, dict]:
        with self._lock:
            files = list(self._files.values())
        out = {}
        for f in files:
            st = f.state or CsvState()
            try:
                size = os.path.getsize(f.path)
            except OSError:
                size = None
            out[f.path] = {"spool_file": f.spool_name, "csv_offset": st.csv_offset, "csv_size": size,
                           "rows": st.rows, "finished": f.finished, "error": f.error}
        return out

    def quiet_since(self, t: float) -> bool:
        """A pass that started at or after monotonic time ``t`` found no complete CSV line left
        to transcode (files stopped on an error excepted)."""
        q = self._quiet_since
        if q is None or q < t:
            self.wake.set()
            return False
        return True

    # -- the loop ----------------------------------------------------------------------------

    def _run(self) -> None:
        while not self.halt.is_set():
            self.wake.clear()
            started = time.monotonic()
            try:
                worked = self.pass_once()
            except Exception:  # keep the thread alive
                log.exception("CSV transcoder failed; retrying")
                self._quiet_since = None
                self.halt.wait(self.poll_s)
                continue
            if worked:
                self._quiet_since = None
                continue
            self._quiet_since = started
            self.wake.wait(self.poll_s)

    def pass_once(self) -> bool:
        """One step over every location's current CSV file; True if anything was transcoded."""
        with self._lock:
            files = [f for f in self._files.values() if not f.finished]
        by_location: dict = {}
        for f in files:
            by_location.setdefault(f.name.location, []).append(f)
        worked = False
        for group in by_location.values():
            group.sort(key=lambda f: (f.name.sort_key, f.spool_name))
            for i, f in enumerate(group):
                if self.halt.is_set():
                    return worked
                if f.error is not None:
                    break  # the location stops at a bad CSV file
                newer = i + 1 < len(group)
                try:
                    n = self._step(f, newer)
                except CsvError as e:
                    f.error = str(e)
                    log.error("CSV file stopped: bad content", file=f.path, error=str(e),
                              csv_offset=f.state.csv_offset if f.state else 0)
                    break
                except OSError as e:
                    log.warning("CSV file unreadable; retrying", file=f.path, error=str(e))
                    break
                if n:
                    worked = True
                    break  # one step per location per pass: locations share the thread fairly
                if not f.finished:
                    break  # this file is still being written: newer ones wait
        return worked

    # -- one file ----------------------------------------------------------------------------

    def _state_path(self, f: CsvFile) -> pathlib.Path:
        return self.state_dir / f"{f.csv_name}.json"

    def _save(self, f: CsvFile) -> None:
        p = self._state_path(f)
        tmp = p.with_name("." + p.name + ".tmp")
        tmp.write_text(json.dumps(vars(f.state)))
        os.replace(tmp, p)

    def _open(self, f: CsvFile) -> None:
        """Load the state and open the spool writer, reconciling a step cut by a crash."""
        p = self._state_path(f)
        spool = os.path.join(self.spool_dir, f.spool_name)
        state = CsvState(**json.loads(p.read_text())) if p.exists() else None
        if state is None and os.path.exists(spool) and os.path.getsize(spool) > 0:
            raise CsvError(f"spool file {spool} exists without its state {p}: remove both to transcode again")
        f.writer = BinlogWriter(spool, f.schema)
        end = f.writer.offset
        if state is None:
            state = CsvState(0, end, 0)
        elif end > state.bin_offset and state.pending_csv_offset is not None:
            state.csv_offset, state.bin_offset = state.pending_csv_offset, end
            state.rows += state.pending_rows
        elif end != state.bin_offset:
            f.writer.close()
            f.writer = None
            raise CsvError(f"spool file {spool} ends at {end}, its state says {state.bin_offset}")
        state.pending_csv_offset, state.pending_rows = None, 0
        f.state = state
        self._save(f)

    def _step(self, f: CsvFile, newer: bool) -> int:
        """Transcode the next complete lines of ``f``; the number of rows written."""
        if f.writer is None:
            self._open(f)
        st, writer = f.state, f.writer
        assert st is not None and writer is not None  # both set by ``_open``
        with open(f.path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if f.header_line is None:
                first = fh.read(1 << 20)
                nl = first.find(b"\n")
                if nl < 0:
                    if newer and self._tail_settled(f, size) and first.strip():
                        raise CsvError("the header row never ended")
                    return 0
                f.header_line = first[: nl + 1]
                f.columns = parse_header(f.header_line, f.schema)
                if st.csv_offset < len(f.header_line):
                    st.csv_offset = len(f.header_line)
                    self._save(f)
            if st.csv_offset >= size:
                return self._maybe_finish(f, newer, size, b"")
            fh.seek(st.csv_offset)
            data = fh.read(STEP_BYTES)
        body = _complete_lines(data)
        if not body:
            if len(data) < STEP_BYTES and newer and self._tail_settled(f, size) and data.strip():
                body = data + b"\n"  # the last line of a finished file lacks its line break
                consumed = len(data)
            else:
                return self._maybe_finish(f, newer, size, data)
        else:
            consumed = len(body)
        f.tail_since = None
        table = parse_lines(f.header_line, body, f.columns, f.schema)
        n = table.num_rows
        if n:
            st.pending_csv_offset, st.pending_rows = st.csv_offset + consumed, n
            self._save(f)
            end = writer.write_rows(normalize_columns(f.schema, table), np.full(n, RowFlag.SINGLE_ROW, np.uint8))
            st.bin_offset = end
            st.rows += n
        st.csv_offset += consumed
        st.pending_csv_offset, st.pending_rows = None, 0
        self._save(f)
        if n:
            self.on_spool(f.spool_name)
        return max(n, 1)  # blank lines consumed count as progress too

    def _maybe_finish(self, f: CsvFile, newer: bool, size: int, rest: bytes) -> int:
        if newer and not rest.strip() and (self._tail_settled(f, size) or not rest):
            f.finished = True
            if f.writer is not None:
                f.writer.close()
                f.writer = None
            log.info("CSV file done", file=f.path, rows=f.state.rows if f.state else 0)
        return 0

    def _tail_settled(self, f: CsvFile, size: int) -> bool:
        """The file has not changed for the grace period (its writer moved to a newer file)."""
        try:
            sig = (size, os.stat(f.path).st_mtime_ns)
        except OSError:
            return True
        now = time.monotonic()
        if f.tail_sig != sig or f.tail_since is None:
            f.tail_sig, f.tail_since = sig, now
            return False
        return now - f.tail_since >= self.grace_s


def _complete_lines(data: bytes) -> bytes:
    """The leading complete lines of ``data``, at most MAX_ROWS_PER_FRAME of them."""
    end = data.rfind(b"\n")
    if end < 0:
        return b""
    body = data[: end + 1]
    nl = np.flatnonzero(np.frombuffer(body, np.uint8) == 10)
    if len(nl) > MAX_ROWS_PER_FRAME:
        body = body[: int(nl[MAX_ROWS_PER_FRAME - 1]) + 1]
    return body
