"""``dis verify --db-root DIR``: check every location on disk against its checkpoint, offline.

For each location: table.size is present and intact, written in a version of the table the
database holds (``schema.versions`` with the declared schema; the location is checked against its
own version's columns), every
column file exists and holds at least the checkpointed bytes, fixed-width files hold exactly
rows*width checkpointed bytes, and string offsets are monotonic, never point past their data
file and end at the data size.  Bytes
past the checkpoint are reported (they are truncated at the next start), not counted as damage.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from disd.names import InvalidNameError, LocationKey
from disd.schema import ColumnType, SchemaRegistry
from disd.storage import columns as colfmt
from disd.storage.checkpoint import CheckpointError, read_record
from disd.storage.engine import location_path, subdirs
from disd.schemaversions import declare
from disd.storage import versionstore
from disd.storage.versionstore import LocationVersionError, location_schema, with_stored_history


def verify_location(db_root: str, key: LocationKey, schemas: SchemaRegistry) -> dict[str, Any]:
    path = location_path(db_root, key)
    out: dict[str, Any] = {"location": str(key), "path": path, "ok": True, "problems": [], "notes": []}

    def bad(msg: str) -> None:
        out["ok"] = False
        out["problems"].append(msg)

    schema = schemas.get(key.namespace, key.table)
    if schema is None:
        bad(f"no schema for {key.table_key}")
        return out
    try:
        rec = read_record(path)
    except CheckpointError as e:
        bad(str(e))
        return out
    if rec is not None:
        try:
            schema = location_schema(schema, rec.schema_version, rec.fingerprint)
        except LocationVersionError as e:
            out["rows"] = rec.rows
            bad(str(e))
            return out
        out["schema_version"] = schema.version
    if rec is None:
        with_data = [n for c in schema.columns for n in colfmt.file_names(c)
                     if os.path.exists(os.path.join(path, n)) and os.path.getsize(os.path.join(path, n)) > 0]
        if with_data:
            bad(f"table.size is missing but column files hold data ({', '.join(with_data)})")
        else:
            out["notes"].append("no table.size and no data (a location interrupted while being created)")
        out["rows"] = 0
        return out
    out["rows"] = rec.rows
    out["source"] = {"file": rec.source.file_name, "offset": rec.source.offset, "skip_rows": rec.source.skip_rows}
    for c in schema.columns:
        for name in colfmt.file_names(c):
            fpath = os.path.join(path, name)
            want = rec.files.get(name)
            if want is None:
                bad(f"{name}: not in the checkpoint")
                continue
            try:
                size = os.path.getsize(fpath)
            except OSError:
                if want == 0:  # a power cut right after the location was made: the DIS makes it again
                    out["notes"].append(f"{name}: missing, checkpointed empty (made again at the next start)")
                    continue
                bad(f"{name}: missing")
                continue
            if size < want:
                bad(f"{name}: {size} bytes, checkpoint needs {want}")
            elif size > want:
                out["notes"].append(f"{name}: {size - want} bytes past the checkpoint (truncated at next start)")
        if c.type is ColumnType.STRING:
            off, dat = colfmt.file_names(c)
            if rec.files.get(off) != rec.rows * colfmt.OFFSET_WIDTH:
                bad(f"{off}: checkpoint size {rec.files.get(off)} is not rows*8 = {rec.rows * 8}")
            elif rec.rows and os.path.exists(os.path.join(path, off)) and os.path.getsize(os.path.join(path, off)) >= rec.files[off]:
                ends = np.fromfile(os.path.join(path, off), dtype="<u8", count=rec.rows) & colfmt.OFFSET_MASK
                data_size = os.path.getsize(os.path.join(path, dat)) if os.path.exists(os.path.join(path, dat)) else 0
                past = np.flatnonzero(ends > data_size)
                if past.size:
                    bad(f"{off}: offset of row {int(past[0])} ({int(ends[past[0]])}) points past {dat} "
                        f"({data_size} bytes); {past.size} rows do")
                if np.any(np.diff(ends.astype(np.int64)) < 0):
                    bad(f"{off}: offsets are not monotonic")
                if int(ends[-1]) != rec.files.get(dat):
                    bad(f"{off}: last offset {int(ends[-1])} != checkpointed data size {rec.files.get(dat)}")
        else:
            name = colfmt.file_names(c)[0]
            if rec.files.get(name) != rec.rows * c.type.width:
                bad(f"{name}: checkpoint size {rec.files.get(name)} is not rows*{c.type.width}")
    return out


def verify_db(db_root: str, schemas_dir: str) -> dict[str, Any]:
    """Every location of ``db_root`` checked against its own version of its table: the declared
    schemas carrying the versions the database stores (read only, as the DIS may be running)."""
    declared = SchemaRegistry.load_dir(schemas_dir)
    for s in declared:
        # A YAML the DIS would refuse at start (a disallowed change, a reused or lower version
        # number) is refused here first: SchemaError, naming the table, versions and column.
        declare(versionstore.load(db_root, s.namespace, s.table), s)
    schemas = SchemaRegistry(with_stored_history(db_root, s) for s in declared)  # VersionStoreError: damaged
    base = os.path.join(db_root, "Intraday")
    results = []
    if os.path.isdir(base):
        for ns in subdirs(base):
            for table in subdirs(os.path.join(base, ns)):
                for ip in subdirs(os.path.join(base, ns, table)):
                    for cp in subdirs(os.path.join(base, ns, table, ip)):
                        try:
                            key = LocationKey(ns, table, ip, cp)
                        except InvalidNameError as e:
                            results.append({"location": f"{ns}/{table}/{ip}/{cp}", "ok": False, "problems": [str(e)],
                                            "notes": []})
                            continue
                        results.append(verify_location(db_root, key, schemas))
    ok = sum(1 for r in results if r["ok"])
    return {"db_root": db_root, "locations": results, "ok_count": ok, "bad_count": len(results) - ok}

