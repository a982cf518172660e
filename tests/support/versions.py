"""Schema versions for the tests: a location written in one version of a table with the storage
engine, values of every column type, and the YAML of a table's version for the daemons."""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile

import numpy as np
import pyarrow as pa
import yaml

from disd.binlog import LocationKey, decode_frames, normalize_columns, scan_frames
from disd.binlog.format import encode_frame, encode_rows
from disd.schema import ColumnType, SchemaRegistry, TableSchema
from disd.storage import StorageEngine
from disd.storage.engine import location_path

STRINGS = ["AAPL", "", "żółć", "日本語", "x" * 70, "MSFT", "tab\tnew\nline", "emoji 🚀"]


def write_location(db_root, schema: TableSchema, key: LocationKey, rows: pa.Table) -> None:
    """Write ``rows`` into location ``key`` of ``db_root`` in ``schema``'s version, as the Ingest
    service would (log frames, scanned, decoded, ingested), then flush and checkpoint.

    The location is written by an engine of its own over a scratch root that knows only this
    version and then moved into ``db_root``: an engine opens every location it finds at start,
    and one knowing only a later version must not see (and judge) the earlier ones."""
    scratch = tempfile.mkdtemp(prefix=".version-", dir=pathlib.Path(db_root).parent)
    try:
        engine = StorageEngine(scratch, SchemaRegistry([schema]))
        try:
            loc = engine.location(key)
            cols = normalize_columns(schema, rows)
            n = rows.num_rows
            if n:
                payload, count = encode_rows(schema, cols, np.zeros(n, np.uint8))
                frame = encode_frame(payload, count)
                run = scan_frames(frame, 4096, schema)
                name = (f"{key.namespace}.{key.table}.System.{key.internal_partition}.{key.column_partition}"
                        f".bin.{key.column_partition}.090000.000+0000")
                loc.ingest(name, run, decode_frames(frame, 4096, run, schema))
            loc.flush()
            loc.checkpoint()
            assert loc.checkpointed_rows == n and not loc.in_error, (loc.checkpointed_rows, loc.error)
        finally:
            engine.close()
        src = pathlib.Path(location_path(scratch, key)).parent  # <ip>/<column partition>
        dst = pathlib.Path(location_path(os.fspath(db_root), key)).parent
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(src), str(dst))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def random_column(ctype: ColumnType, n: int, rng: np.random.Generator, null_fraction: float = 0.2) -> pa.Array:
    """``n`` values of ``ctype`` (never a column file's null sentinel), about ``null_fraction``
    of them null."""
    mask = rng.random(n) < null_fraction

    def ints(dtype):
        info = np.iinfo(dtype)
        return rng.integers(info.min + 1, info.max, n, dtype=dtype, endpoint=True)

    if ctype is ColumnType.BOOL:
        return pa.array(rng.random(n) < 0.5, mask=mask)
    if ctype in (ColumnType.BYTE, ColumnType.SHORT, ColumnType.INT, ColumnType.LONG):
        return pa.array(ints(ctype.numpy_dtype), ctype.arrow_type, mask=mask)
    if ctype is ColumnType.FLOAT:
        return pa.array((rng.standard_normal(n) * 1e6).astype(np.float32), mask=mask)
    if ctype is ColumnType.DOUBLE:
        return pa.array(rng.standard_normal(n) * 1e300, mask=mask)
    if ctype is ColumnType.CHAR:
        return pa.array(rng.integers(0, 0xFFFE, n, dtype=np.uint16, endpoint=True), mask=mask)
    if ctype is ColumnType.STRING:
        strs = np.array(STRINGS, dtype=object)
        return pa.array(strs[rng.integers(0, len(strs), n)].tolist(), pa.string(), mask=mask)
    if ctype is ColumnType.TIMESTAMP:
        return pa.array(rng.integers(-(2**62), 2**62, n, dtype=np.int64), mask=mask).cast(ctype.arrow_type)
    raise AssertionError(ctype)


def python_values(col) -> list:
    """A column's values as Python objects that compare exactly (timestamps as ns integers)."""
    if pa.types.is_timestamp(col.type):
        col = col.cast(pa.int64())
    return col.to_pylist()


def schema_yaml(namespace: str, table: str, version: int, columns) -> str:
    """The YAML of a table's schema file: ``columns`` are ``(name, type)`` or ``(name, type,
    renamed_from)``."""
    cols = []
    for c in columns:
        d = {"name": c[0], "type": c[1]}
        if len(c) > 2 and c[2]:
            d["renamed_from"] = c[2]
        cols.append(d)
    return yaml.safe_dump({"namespace": namespace, "table": table, "version": version, "columns": cols},
                          sort_keys=False)
