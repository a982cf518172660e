"""A database whose table ``Test.Evolve`` has locations in two schema versions, written by the
storage engine itself (as a DIS of each version would have), and the versions record beside them.

Version 1 -> 2: ``Id`` widens int -> long, ``Px`` (float) is renamed ``Price`` and widens to
double, ``Gone`` is dropped, ``New`` is added; ``Sym`` and ``Qty`` are kept.  Every 5th row has
nulls in every column."""

from __future__ import annotations

import pathlib
import types

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import yaml

from disd.binlog import LocationKey
from disd.schema import SchemaRegistry, TableSchema
from disd.storage import StorageEngine
from disd.storage.versionstore import VersionStore
from support import Feeder

V1_DICT = {"namespace": "Test", "table": "Evolve", "version": 1, "columns": [
    {"name": "Id", "type": "int"}, {"name": "Px", "type": "float"}, {"name": "Sym", "type": "string"},
    {"name": "Gone", "type": "string"}, {"name": "Qty", "type": "int"}]}
V1 = TableSchema.from_dict(V1_DICT, "v1")
V2_DICT = {"namespace": "Test", "table": "Evolve", "version": 2, "columns": [
    {"name": "Id", "type": "long"}, {"name": "Sym", "type": "string"},
    {"name": "Price", "type": "double", "renamed_from": "Px"}, {"name": "Qty", "type": "int"},
    {"name": "New", "type": "string"}]}
V2 = TableSchema.from_dict(V2_DICT, "v2")
DAY1, DAY2 = "2026-11-19", "2026-11-20"
#: (version, first Id, rows) per location: day 1 in version 1 (two feeds), day 2 in both (the
#: version 2 logs in their own internal partition, as the logger's version suffix puts them).
LOCS = {
    LocationKey("Test", "Evolve", "feed1", DAY1): (1, 0, 70_000),
    LocationKey("Test", "Evolve", "feed2", DAY1): (1, 70_000, 3_000),
    LocationKey("Test", "Evolve", "feed1", DAY2): (1, 73_000, 5_000),
    LocationKey("Test", "Evolve", "feed1-2", DAY2): (2, 78_000, 2_000),
}
V2_LOC = LocationKey("Test", "Evolve", "feed1-2", DAY2)


def null_mask(idx: np.ndarray) -> pa.Array:
    return pa.array(idx % 5 == 2)


def rows(version: int, start: int, n: int) -> pa.Table:
    """Rows ``start`` .. ``start + n - 1`` in ``version``: Id i, Px/Price i/4, Sym ``s<i%7>``,
    Qty i % 1000, Gone ``g<i>``, New ``n<i>``; nulls in every column where i % 5 == 2."""
    idx = np.arange(start, start + n, dtype=np.int64)
    mask = null_mask(idx)

    def nulled(arr: pa.Array) -> pa.Array:
        return pc.if_else(mask, pa.nulls(n, arr.type), arr)

    sym = nulled(pa.array([f"s{i % 7}" for i in idx], pa.string()))
    qty = nulled(pa.array((idx % 1000).astype(np.int32)))
    if version == 1:
        return pa.table({"Id": nulled(pa.array(idx.astype(np.int32))),
                         "Px": nulled(pa.array((idx * 0.25).astype(np.float32))),
                         "Sym": sym, "Gone": nulled(pa.array([f"g{i}" for i in idx], pa.string())), "Qty": qty})
    return pa.table({"Id": nulled(pa.array(idx)), "Sym": sym, "Price": nulled(pa.array(idx * 0.25)), "Qty": qty,
                     "New": nulled(pa.array([f"n{i}" for i in idx], pa.string()))})


def expected(key: LocationKey | None = None, columns=None, day: str | None = None) -> pa.Table:
    """The rows of one location (or of all, or of one day, in LOCS order) as version 2 presents
    them."""
    parts = []
    for k, (version, start, n) in LOCS.items():
        if (key is not None and k != key) or (day is not None and k.column_partition != day):
            continue
        t = rows(version, start, n)
        if version == 1:
            t = pa.table({"Id": t["Id"].cast(pa.int64()), "Sym": t["Sym"], "Price": t["Px"].cast(pa.float64()),
                          "Qty": t["Qty"], "New": pa.nulls(n, pa.string())})
        parts.append(t)
    out = pa.concat_tables(parts).combine_chunks()
    return out.select(list(columns)) if columns is not None else out


def write_schema_dir(directory: pathlib.Path, schema_dict: dict) -> pathlib.Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "Test.Evolve.yaml").write_text(yaml.safe_dump(schema_dict))
    return directory


def build(db_root: pathlib.Path, versions=(1, 2)) -> pathlib.Path:
    """Write every location of LOCS in ``versions``, checkpointed, and the table's versions
    record (as a DIS declaring version 1, then version 2, leaves it)."""
    store = VersionStore(str(db_root))
    for version, schema in ((1, V1), (2, V2)):
        if version not in versions:
            continue
        store.declare(schema)
        registry = SchemaRegistry([schema])
        engine = StorageEngine(str(db_root), registry)
        feeder = Feeder(types.SimpleNamespace(engine=engine, schemas=registry))
        try:
            for key, (v, start, n) in LOCS.items():
                if v == version:
                    feeder.append(key, rows(v, start, n))
                    engine.location(key).checkpoint()
        finally:
            engine.close()
    return db_root
