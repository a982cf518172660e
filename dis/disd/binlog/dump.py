"""``dis binlog dump``: a binary log for a person (a table) or a machine (``--json``).

The table view shows each value on one line, at most ``MAX_WIDTH`` characters (longer values
end in an ellipsis; control characters are escaped); ``--json`` gives every value whole.  A
char prints as its character.  Both show the schema version the file is written in (the header
schema's ``version``; 1 for a file written before versions) next to the format version.
A file with a corrupt frame prints its header and the rows
before that frame, then the error (exit status 1).  The output stops quietly when its reader
goes away (``| head``).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, TextIO

import pyarrow as pa

from disd.binlog.format import BinlogError, RowFlag
from disd.binlog.io import LogContents, read_file
from disd.schema import ColumnType

#: Characters a value takes at most in the table view.
MAX_WIDTH = 40
ELLIPSIS = "\u2026"
_ESCAPES = {**{i: f"\\x{i:02x}" for i in [*range(32), 0x7F]}, 9: "\\t", 10: "\\n", 13: "\\r"}


def dump(path: str, as_json: bool = False, limit: int | None = None) -> int:
    """Print the log at ``path`` to stdout (errors to stderr); the exit status."""
    try:
        contents = read_file(path, intact_only=True)
    except (OSError, BinlogError) as e:
        print(f"dis binlog dump: {e}", file=sys.stderr)
        return 1
    try:
        (_print_json if as_json else _print_table)(sys.stdout, path, contents, limit)
        sys.stdout.flush()
    except BrokenPipeError:
        _discard_stdout()
    if contents.corrupt is not None:
        print(f"dis binlog dump: {contents.corrupt}", file=sys.stderr)
        return 1
    return 0


def _discard_stdout() -> None:
    """The reader is gone: send what is still buffered, and anything later, nowhere, so that the
    interpreter's last flush does not fail too."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError):
        pass


def _char(code: int) -> str:
    """A char as the table shows it: its character, or the escape of half a surrogate pair."""
    return f"\\u{code:04x}" if 0xD800 <= code <= 0xDFFF else chr(code)


def _column_values(contents: LogContents, table: pa.Table, char: Callable[[int], str]) -> list[list[Any]]:
    out = []
    for c in contents.schema.columns:
        values = table.column(c.name).to_pylist()
        out.append([None if v is None else char(v) for v in values] if c.type is ColumnType.CHAR else values)
    return out


def _print_json(out: TextIO, path: str, contents: LogContents, limit: int | None) -> None:
    header, corrupt = contents.header, contents.corrupt
    meta = {
        "file": path,
        "version": header.version,
        "fingerprint": header.fingerprint,
        "schema_version": header.schema.version,
        "schema": header.schema.canonical(),
        "rows": contents.table.num_rows,
        "frames": len(contents.frame_ends),
        "end_offset": contents.end_offset,
        "torn_tail": contents.torn,
        "corrupt": None if corrupt is None else {"offset": corrupt.offset, "problem": corrupt.problem},
    }
    out.write(json.dumps(meta) + "\n")
    table = contents.table if limit is None else contents.table.slice(0, limit)
    names = table.column_names
    columns = _column_values(contents, table, chr)
    # a char may be half of a surrogate pair: written as its JSON escape
    chars = any(c.type is ColumnType.CHAR for c in contents.schema.columns)
    for i, flag in enumerate(contents.flags[: table.num_rows].tolist()):
        row: dict[str, Any] = {"flag": RowFlag(flag).name}
        for c, values in zip(names, columns):
            v = values[i]
            row[c] = v.isoformat() if hasattr(v, "isoformat") else v
        line = json.dumps(row, ensure_ascii=False)
        if chars:
            line = line.encode("utf-8", "backslashreplace").decode("utf-8")
        out.write(line + "\n")


def _cell(v: Any) -> str:
    if v is None:
        return "null"
    s = str(v)[: MAX_WIDTH + 1].translate(_ESCAPES)
    return s if len(s) <= MAX_WIDTH else s[: MAX_WIDTH - 1] + ELLIPSIS


def _print_table(out: TextIO, path: str, contents: LogContents, limit: int | None) -> None:
    header, corrupt = contents.header, contents.corrupt
    s = header.schema
    n = contents.table.num_rows
    out.write(f"file:        {path}\n")
    out.write(f"table:       {s.key}   schema version {s.version}   format v{header.version}   "
              f"fingerprint {header.fingerprint}\n")
    cols = ", ".join(f"{c.name}:{c.type.value}" + (f" (renamed from {c.renamed_from})" if c.renamed_from else "")
                     for c in s.columns)
    out.write(f"columns:     {cols}\n")
    if corrupt is None:
        out.write(f"rows:        {n} in {len(contents.frame_ends)} frames\n")
    else:
        out.write(f"rows:        {n} in {len(contents.frame_ends)} intact frames, then a corrupt frame at "
                  f"byte {corrupt.offset} (nothing after it is read)\n")
    tail = "  (torn tail after it: incomplete frame)" if contents.torn else ""
    out.write(f"end offset:  {contents.end_offset}{tail}\n")
    table = contents.table if limit is None else contents.table.slice(0, limit)
    if not table.num_rows:
        return
    heads = ["flag", *table.column_names]
    cells = [[RowFlag(f).name for f in contents.flags[: table.num_rows].tolist()]]
    cells += [[_cell(v) for v in values] for values in _column_values(contents, table, _char)]
    widths = [max(len(h), *(len(x) for x in col)) for h, col in zip(heads, cells)]
    widths[-1] = 0  # the last column is not padded
    out.write("\n" + "  ".join(h.ljust(w) for h, w in zip(heads, widths)) + "\n")
    for i in range(table.num_rows):
        out.write("  ".join(col[i].ljust(w) for col, w in zip(cells, widths)) + "\n")
