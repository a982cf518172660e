"""``dis verify``: offline checks of every location against its checkpoint."""

from __future__ import annotations

import os

from disd.storage import StorageEngine
from disd.storage.checkpoint import FILE_NAME
from disd.storage.verify import verify_db
from support import ROOT, trade_rows, write_log

from .util import KEY, LOG, SCHEMAS, TRADE, ingest_file


def test_verify_reports_good_and_damaged_locations(tmp_path):
    db = tmp_path / "db"
    eng = StorageEngine(str(db), SCHEMAS)
    write_log(tmp_path / LOG, TRADE, trade_rows(0, 100), [3] * 100)
    loc = eng.location(KEY)
    ingest_file(loc, tmp_path / LOG)
    eng.close()
    schemas = str(ROOT / "config" / "schemas")
    res = verify_db(str(db), schemas)
    assert res["ok_count"] == 1 and res["bad_count"] == 0 and res["locations"][0]["rows"] == 100
    os.truncate(loc.path / "Sym.dat", 10)
    res = verify_db(str(db), schemas)
    assert res["bad_count"] == 1 and "Sym.dat" in res["locations"][0]["problems"][0]
    os.unlink(loc.path / FILE_NAME)
    res = verify_db(str(db), schemas)
    assert res["bad_count"] == 1 and "table.size is missing" in res["locations"][0]["problems"][0]


def test_verify_checks_each_location_in_its_own_version(tmp_path):
    """A database with a version-1 and a version-2 location (Venue added) verifies clean against
    the version-2 schemas; a table.size naming a version the database does not hold is bad."""
    import dataclasses
    import shutil

    import pyarrow as pa

    from disd.binlog import LocationKey
    from disd.schema import SchemaRegistry, TableSchema
    from disd.storage.checkpoint import read_record, write_record

    db = tmp_path / "db"
    write_log(tmp_path / LOG, TRADE, trade_rows(0, 30), [3] * 30)
    eng = StorageEngine(str(db), SCHEMAS)
    ingest_file(eng.location(KEY), tmp_path / LOG)
    eng.close()
    v2 = TableSchema.from_dict({"namespace": "Market", "table": "Trade", "version": 2,
                                "columns": [*TRADE.canonical()["columns"], {"name": "Venue", "type": "string"}]})
    key2 = LocationKey("Market", "Trade", "ip2", "2026-11-22")
    log2 = tmp_path / LOG.replace(".ip1.", ".ip2.")
    t = trade_rows(0, 20)
    write_log(log2, v2, t.append_column("Venue", pa.array(["X"] * 20)), [3] * 20)
    eng = StorageEngine(str(db), SchemaRegistry([v2, SCHEMAS.get("Market", "Quote")]))
    ingest_file(eng.location(key2, version=2), log2, v2)
    loc1_path = eng.location(KEY).path
    eng.close()
    schemas = tmp_path / "schemas"
    shutil.copytree(ROOT / "config" / "schemas", schemas)
    (schemas / "Market.Trade.yaml").write_text(
        "namespace: Market\ntable: Trade\nversion: 2\ncolumns:\n"
        + "".join(f"  - {{name: {c.name}, type: {c.type.value}}}\n" for c in v2.columns))
    res = verify_db(str(db), str(schemas))
    assert res["bad_count"] == 0, res
    assert {r["location"].split("/")[2]: (r["schema_version"], r["rows"]) for r in res["locations"]} == {
        "ip1": (1, 30), "ip2": (2, 20)}
    rec = read_record(loc1_path)
    write_record(loc1_path, dataclasses.replace(rec, schema_version=5))
    res = verify_db(str(db), str(schemas))
    bad = [r for r in res["locations"] if not r["ok"]]
    assert len(bad) == 1 and "schema version 5 of Market.Trade" in bad[0]["problems"][0], res


def test_verify_refuses_a_schema_change_the_dis_would_refuse(tmp_path):
    """`dis verify` checks an edited YAML against the versions the database holds before any DIS
    runs it: a narrowing is refused with status 2, naming the table, the versions and the column."""
    import shutil
    import subprocess
    import sys

    db = tmp_path / "db"
    StorageEngine(str(db), SCHEMAS).close()  # the DIS's start stores version 1 of every table
    schemas = tmp_path / "schemas"
    shutil.copytree(ROOT / "config" / "schemas", schemas)
    cols = TRADE.canonical()["columns"]
    narrowed = [c if c["type"] not in ("double", "long") else {**c, "type": "float" if c["type"] == "double" else "int"}
                for c in cols]
    changed = next(a["name"] for a, b in zip(cols, narrowed) if a != b)
    (schemas / "Market.Trade.yaml").write_text(
        "namespace: Market\ntable: Trade\nversion: 2\ncolumns:\n"
        + "".join(f"  - {{name: {c['name']}, type: {c['type']}}}\n" for c in narrowed))
    r = subprocess.run([sys.executable, "-m", "disd.cli", "verify", "--db-root", str(db), "--schemas", str(schemas)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r
    assert "Market.Trade version 1 -> 2" in r.stderr and repr(changed) in r.stderr and "Traceback" not in r.stderr


def test_a_new_location_whose_empty_column_files_a_power_cut_lost_is_not_damage(tmp_path):
    """A new location's first record (no rows, every column file at 0 bytes) is durable before
    its column files are created, and nothing syncs their directory entries until the first
    checkpoint with rows: a power cut in between leaves the record and no column files (seen on
    ext4 under a real power cut: tests/realfaults).  The DIS opens such a location as empty;
    ``dis verify`` and the readers of the column files (``LocalColumnFiles``, Spark's ``dbRoot``)
    must too, and go on to the table's other locations."""
    from disd.binlog import LocationKey
    from disd.blocks import LocalColumnFiles, read_location

    db = tmp_path / "db"
    write_log(tmp_path / LOG, TRADE, trade_rows(0, 100), [3] * 100)
    eng = StorageEngine(str(db), SCHEMAS)
    ingest_file(eng.location(KEY), tmp_path / LOG)
    fresh = eng.location(LocationKey("Market", "Trade", "new", "2026-11-22"))
    eng.close()
    for name in os.listdir(fresh.path):
        if name != FILE_NAME:
            os.unlink(fresh.path / name)  # what the power cut kept: the record alone
    schemas = str(ROOT / "config" / "schemas")
    res = verify_db(str(db), schemas)
    assert res["bad_count"] == 0 and res["ok_count"] == 2, res
    src = LocalColumnFiles(str(db), [TRADE])
    snaps = src.locations("Market", "Trade")
    assert [s.key.internal_partition for s in snaps] == [KEY.internal_partition]
    assert read_location(src, TRADE, snaps[0], ["Size"]).column("Size").to_pylist() == list(range(100))
    src.close()
    eng = StorageEngine(str(db), SCHEMAS)  # the DIS: the location opens empty, its files made again
    loc = eng.location(fresh.key)
    assert not loc.in_error and loc.committed_rows == 0 and (fresh.path / "Size.dat").exists()
    eng.close()
    verify = verify_db(str(db), schemas)
    assert verify["bad_count"] == 0 and verify["ok_count"] == 2
