"""The historical layout's parts without Spark: definitions, the index, durable publishing, the
still-being-written rule, the source identity and the discovery of every layout."""

from __future__ import annotations

import datetime as dt
import os
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from disd.historical.definitions import DefinitionError, TableDefinition, read_definition, write_definition
from disd.historical.discover import table_files
from disd.historical.durable import PublishError, stage_dir, sweep_staging
from disd.historical.index import (
    MANIFEST_NAME,
    MetadataIndexError,
    TableIndex,
    check_files,
    file_crc32c,
    read_index,
    read_manifest,
)
from disd.historical.intraday import IntradayLocation, SourceSnapshot, checkpointed_locations, snapshot_from_files
from disd.historical.layout import Layout, NamespaceRoot, NamespaceType
from disd.historical.liveness import LivePartitionError, check_not_live, live_reasons
from disd.historical.merge import MergeError, choose_partition
from disd.historical.publish import finalize, publish_location
from disd.schema import Column, ColumnType, TableSchema
from support import TRADE, trade_rows

from .helpers import D1, D2, LOCS, IntradayDb, fill, rows_of


def spark_like_output(staging: pathlib.Path, tables: list[pa.Table], row_group: int = 1000) -> None:
    """What Spark's committer leaves: part files with task ids and uuids, _SUCCESS, .crc files."""
    staging.mkdir(parents=True)
    for i, t in enumerate(tables):
        name = f"part-{i:05d}-7d3c0f7e-1b2a-4c4e-9a43-5a6b0c2d1e0f-c000.snappy.parquet"
        pq.write_table(t, staging / name, row_group_size=row_group)
        (staging / f".{name}.crc").write_bytes(b"crc")
    (staging / "_SUCCESS").write_bytes(b"")
    (staging / "_temporary").mkdir()


# -- definitions --------------------------------------------------------------------------------
def test_definition_round_trip_and_errors(tmp_path):
    ns = NamespaceRoot.system(tmp_path, "Market")
    d = TableDefinition.from_schema(TRADE, sort_by=("Sym", "Timestamp"))
    write_definition(ns, d)
    assert ns.definition_path("Trade") == tmp_path / "Systems" / "Market" / "Definitions" / "Trade.tbl"
    assert read_definition(ns, "Trade") == d
    assert d.table_schema().fingerprint == TRADE.fingerprint
    assert d.output_columns() == ("Timestamp", "Sym", "Price", "Size", "Date")
    assert read_definition(NamespaceRoot.user(tmp_path, "Market"), "Trade") is None

    ns.definition_path("Trade").write_text("{not json")
    with pytest.raises(DefinitionError, match="not JSON"):
        read_definition(ns, "Trade")
    ns.definition_path("Trade").write_text('{"format": "dis-table-definition", "version": 9}')
    with pytest.raises(DefinitionError, match="unsupported definition version 9"):
        read_definition(ns, "Trade")
    cols = (Column("A", ColumnType.INT),)
    with pytest.raises(DefinitionError, match="needs a partition column"):
        TableDefinition("N", "T", NamespaceType.SYSTEM, cols, None, Layout.NESTED)
    with pytest.raises(DefinitionError, match="has no partition column"):
        TableDefinition("N", "T", NamespaceType.USER, cols, "Date", Layout.SPLAYED)
    with pytest.raises(DefinitionError, match="sort column 'B'"):
        TableDefinition("N", "T", NamespaceType.SYSTEM, cols, "Date", Layout.NESTED, ("B",))
    with pytest.raises(DefinitionError, match="invalid"):
        TableDefinition("N", "../T", NamespaceType.SYSTEM, cols, "Date", Layout.NESTED)


# -- index and manifests ------------------------------------------------------------------------
def test_publish_then_index_round_trip_and_damage_is_detected(tmp_path):
    ns = NamespaceRoot.system(tmp_path, "Market")
    parent = ns.location_parent("0", D1)
    staging = stage_dir(parent, "Trade")
    spark_like_output(staging, [trade_rows(0, 2500), trade_rows(2500, 1500)])
    rec = publish_location(ns, "Trade", "Date", parent, staging, "0", D1, "id-1", {"kind": "test"}, {})
    loc = parent / "Trade"
    assert loc.is_symlink() and os.readlink(loc) == rec.version
    assert sorted(os.listdir(loc)) == [MANIFEST_NAME, "part-00000.parquet", "part-00001.parquet"]
    assert [f.rows for f in rec.files] == [2500, 1500] and rec.rows == 4000
    assert [pq.read_metadata(loc / f.name).num_row_groups for f in rec.files] == [3, 2]
    assert all(file_crc32c(loc / f.name) == f.crc32c for f in rec.files)
    assert read_manifest(loc) == rec
    assert check_files(loc, rec, checksums=True) is None
    idx = read_index(ns.index_path("Trade"))
    assert idx.locations == (rec,) and idx.find(D1) == [rec]

    raw = bytearray(ns.index_path("Trade").read_bytes())
    raw[raw.index(b'"rows":4000') + 8] ^= 1  # one byte of the JSON line
    with pytest.raises(MetadataIndexError, match="checksum mismatch"):
        TableIndex.from_bytes(bytes(raw), "t")
    with pytest.raises(MetadataIndexError, match="unsupported index version"):
        TableIndex.from_bytes(b"DISTLMI 2\n{}\ncrc32c 00000000\n", "t")
    with pytest.raises(MetadataIndexError, match="not a metadata index"):
        TableIndex.from_bytes(b"PAR1", "t")
    # a changed file is caught by size, a same-size change by its checksum
    f = loc / "part-00001.parquet"
    data = bytearray(f.read_bytes())
    data[100] ^= 0xFF
    f.write_bytes(bytes(data))
    assert check_files(loc, rec) is None and "CRC32C" in check_files(loc, rec, checksums=True)
    with open(f, "ab") as fh:
        fh.write(b"x")
    assert "bytes" in check_files(loc, rec)


def test_a_new_version_switches_the_link_and_leaves_open_files_alone(tmp_path):
    ns = NamespaceRoot.system(tmp_path, "Market")
    parent = ns.location_parent("0", D1)
    s1 = stage_dir(parent, "Trade")
    spark_like_output(s1, [trade_rows(0, 1000)])
    r1 = publish_location(ns, "Trade", "Date", parent, s1, "0", D1, "id-1", {}, {})
    held = open(parent / "Trade" / "part-00000.parquet", "rb")  # a reader holds the old file
    inode = os.fstat(held.fileno()).st_ino
    s2 = stage_dir(parent, "Trade")
    spark_like_output(s2, [trade_rows(0, 1500)])
    r2 = publish_location(ns, "Trade", "Date", parent, s2, "0", D1, "id-2", {}, {})
    assert r2.version != r1.version and os.readlink(parent / "Trade") == r2.version
    old = parent / r1.version / "part-00000.parquet"
    assert old.exists() and old.stat().st_ino == inode  # never replaced nor deleted
    assert pq.read_table(held).num_rows == 1000
    held.close()
    assert pq.read_table(parent / "Trade" / "part-00000.parquet").num_rows == 1500
    idx = read_index(ns.index_path("Trade"))
    assert [loc.version for loc in idx.locations] == [r2.version]  # one record per column partition


def test_finalize_keeps_writer_order_and_drops_markers(tmp_path):
    staging = tmp_path / ".T.tmp-x"
    spark_like_output(staging, [trade_rows(0, 10), trade_rows(10, 20), trade_rows(30, 5)])
    files = finalize(staging)
    assert sorted(os.listdir(staging)) == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    assert [f.rows for f in files] == [10, 20, 5]
    assert pq.read_table(staging / "part-00001.parquet").column("Size").to_pylist()[0] == 10


def test_something_not_written_by_dis_is_never_replaced(tmp_path):
    ns = NamespaceRoot.system(tmp_path, "Market")
    parent = ns.location_parent("0", D1)
    (parent / "Trade").mkdir(parents=True)  # a real directory: a copy made by another tool
    (parent / "Trade" / "table.parquet").write_bytes(b"theirs")
    staging = stage_dir(parent, "Trade")
    spark_like_output(staging, [trade_rows(0, 10)])
    with pytest.raises(PublishError, match="not a link written by dis"):
        publish_location(ns, "Trade", "Date", parent, staging, "0", D1, "id", {}, {})
    assert (parent / "Trade" / "table.parquet").read_bytes() == b"theirs"


def test_sweep_removes_only_what_a_killed_writer_left(tmp_path):
    parent = tmp_path / "p"
    parent.mkdir()
    for name in (".Trade.tmp-abc", ".Trade.v20261119T000000-1234abcd", "Trade2", ".Quote.tmp-abc"):
        (parent / name).mkdir()
    os.symlink(".Trade.v20261119T000000-1234abcd", parent / ".Trade.link-77")
    removed = sweep_staging(parent, "Trade")
    assert sorted(removed) == [".Trade.link-77", ".Trade.tmp-abc"]
    assert sorted(os.listdir(parent)) == [".Quote.tmp-abc", ".Trade.v20261119T000000-1234abcd", "Trade2"]


# -- still being written, identity --------------------------------------------------------------
def snap(value=D1, **loc) -> SourceSnapshot:
    return SourceSnapshot("Market", "Trade", value, TRADE, "dis", "h:1",
                          (IntradayLocation("feed1", 100, {"Size.dat": 400}, **loc),))


def test_still_being_written_rule():
    today = dt.date(2026, 11, 21)
    assert live_reasons(snap(), today) == []
    assert "not before today" in live_reasons(snap("2026-11-21"), today)[0]
    assert "not before today" in live_reasons(snap("2026-12-01"), today)[0]
    assert live_reasons(snap("not-a-date"), today) == []
    assert "tailer t-1 is connected" in live_reasons(snap(tailer="t-1"), today)[0]
    assert "7 published rows are not checkpointed" in live_reasons(snap(rows_past_checkpoint=7), today)[0]
    assert "12 column bytes past its checkpoint" in live_reasons(snap(bytes_past_checkpoint=12), today)[0]
    assert "checkpoint changed 5 s ago" in live_reasons(snap(checkpoint_age_s=5.0), today, quiet_s=60)[0]
    assert live_reasons(snap(checkpoint_age_s=5.0), today, quiet_s=1) == []
    with pytest.raises(LivePartitionError, match="--force"):
        check_not_live(snap(tailer="t-1"), today)


def test_identity_is_the_rows_not_where_they_were_read():
    a = snap()
    b = SourceSnapshot("Market", "Trade", D1, TRADE, "files", "/db", a.locations)
    assert a.identity({"sort_by": []}) == b.identity({"sort_by": []})
    assert a.identity({"sort_by": []}) != a.identity({"sort_by": ["Sym"]})
    more = SourceSnapshot("Market", "Trade", D1, TRADE, "dis", "h:1",
                          (IntradayLocation("feed1", 101, {"Size.dat": 404}),))
    assert more.identity({}) != a.identity({})


def test_column_files_are_taken_at_their_checkpoints(tmp_path):
    db = IntradayDb(tmp_path / "db")
    try:
        fill(db)
        locs = checkpointed_locations(str(tmp_path / "db"), TRADE)
        assert {(loc.key.internal_partition, loc.key.column_partition): loc.rows for loc in locs} == {
            (k.internal_partition, k.column_partition): n for k, (_, n) in LOCS.items()}
        assert all(loc.bytes_past_checkpoint == 0 and loc.checkpoint_age_s < 60 for loc in locs)
        key = next(iter(LOCS))
        db.append(key, trade_rows(100_000, 10), checkpoint=False)  # flushed, not checkpointed
        s = snapshot_from_files(str(tmp_path / "db"), TRADE, D1)
        assert s.rows == rows_of(D1)  # only the checkpointed rows
        feed1 = next(loc for loc in s.locations if loc.internal_partition == "feed1")
        assert feed1.bytes_past_checkpoint > 0
        assert any("past its checkpoint" in r for r in live_reasons(s, dt.date(2030, 1, 1), quiet_s=0))
    finally:
        db.close()


# -- internal partitions ------------------------------------------------------------------------
def test_choosing_the_internal_partition(tmp_path):
    ns = NamespaceRoot.system(tmp_path, "Market")
    assert choose_partition(ns, "Trade", D1, None) == "0"  # none yet: Partitions/0 is created
    assert os.readlink(ns.writable_dir / "0") == "../Partitions/0"
    (ns.partitions_dir / "1").mkdir()
    os.symlink("../Partitions/1", ns.writable_dir / "1")
    assert choose_partition(ns, "Trade", D1, "1") == "1"
    with pytest.raises(MergeError, match="no writable partition 'x'"):
        choose_partition(ns, "Trade", D1, "x")
    (ns.partitions_dir / "1" / D1 / "Trade").mkdir(parents=True)
    assert choose_partition(ns, "Trade", D1, None) == "1"  # where the partition already is
    with pytest.raises(MergeError, match="already in internal partition 1"):
        choose_partition(ns, "Trade", D1, "0")
    (ns.partitions_dir / "0" / D1 / "Trade").mkdir(parents=True)
    with pytest.raises(MergeError, match="several internal partitions"):
        choose_partition(ns, "Trade", D1, None)
    (ns.partitions_dir / "2" / D2 / "Trade").mkdir(parents=True)  # a read-only internal partition
    with pytest.raises(MergeError, match="not writable"):
        choose_partition(ns, "Trade", D2, None)


# -- discovery of every layout ------------------------------------------------------------------
def definition(layout: Layout, pc: str | None = "Date", extra=()) -> TableDefinition:
    cols = tuple(TRADE.columns) + tuple(extra)
    return TableDefinition("Market", "Trade", NamespaceType.SYSTEM, cols, pc, layout)


def test_discovery_of_extended_layouts(tmp_path):
    ns = NamespaceRoot.system(tmp_path, "Market")
    root = ns.extended_path("Trade")
    # key=value directories, two levels, one value escaped, a hidden directory ignored
    for date, venue, start in ((D1, "X", 0), (D1, "Y%2FZ", 100), (D2, "X", 200)):
        d = root / f"Date={date}" / f"Venue={venue}"
        d.mkdir(parents=True)
        pq.write_table(trade_rows(start, 100), d / "part-0.parquet", row_group_size=30)
    (root / ".staging").mkdir()
    pq.write_table(trade_rows(0, 5), root / ".staging" / "x.parquet")
    kv = definition(Layout.PARQUET_KV, extra=(Column("Venue", ColumnType.STRING),))
    files = table_files(ns, kv)
    assert [f.value_of("Date") for f in files] == [D1, D1, D2]
    assert [f.value_of("Venue") for f in files] == ["X", "Y/Z", "X"]
    assert files[0].row_groups == (30, 30, 30, 10)
    assert [f.value_of("Date") for f in table_files(ns, kv, lambda v: v == D2)] == [D2]
    hive = definition(Layout.COREPLUS_HIVE, extra=(Column("Venue", ColumnType.STRING),))
    assert len(table_files(ns, hive)) == 3
    with pytest.raises(DefinitionError, match="no 'Sym=<value>' directory"):
        table_files(ns, TableDefinition("Market", "Trade", NamespaceType.SYSTEM,
                                        (Column("Size", ColumnType.INT),), "Sym", Layout.PARQUET_KV))


def test_discovery_of_metadata_and_flat_layouts(tmp_path):
    ns = NamespaceRoot.system(tmp_path, "Market")
    root = ns.extended_path("Trade")
    collected = []
    for date, start in ((D1, 0), (D2, 500)):
        d = root / f"Date={date}"
        d.mkdir(parents=True)
        pq.write_table(trade_rows(start, 250), d / "data.parquet", row_group_size=100, metadata_collector=collected)
        collected[-1].set_file_path(f"Date={date}/data.parquet")
    pq.write_metadata(trade_rows(0, 1).schema, root / "_common_metadata")
    pq.write_metadata(trade_rows(0, 1).schema, root / "_metadata", metadata_collector=collected)
    files = table_files(ns, definition(Layout.PARQUET_METADATA))
    assert [(pathlib.Path(f.path).parent.name, f.row_groups, f.value_of("Date")) for f in files] == [
        (f"Date={D1}", (100, 100, 50), D1), (f"Date={D2}", (100, 100, 50), D2)]
    # _metadata naming a file outside the table's directory is refused
    bad = []
    pq.write_table(trade_rows(0, 3), tmp_path / "elsewhere.parquet", metadata_collector=bad)
    bad[-1].set_file_path("../../../../elsewhere.parquet")
    pq.write_metadata(trade_rows(0, 1).schema, root / "_metadata", metadata_collector=bad)
    with pytest.raises(DefinitionError, match="outside"):
        table_files(ns, definition(Layout.PARQUET_METADATA, pc=None))

    flat = NamespaceRoot.system(tmp_path, "Flat")
    froot = flat.extended_path("Trade")
    froot.mkdir(parents=True)
    for i in range(3):
        pq.write_table(trade_rows(i * 10, 10), froot / f"f{i}.parquet")
    (froot / "_SUCCESS").write_bytes(b"")
    d = TableDefinition("Flat", "Trade", NamespaceType.SYSTEM, TRADE.columns, None, Layout.PARQUET_FLAT)
    assert [pathlib.Path(f.path).name for f in table_files(flat, d)] == ["f0.parquet", "f1.parquet", "f2.parquet"]
    assert np.sum([f.rows for f in table_files(flat, d)]) == 30


def test_one_writer_per_table(tmp_path):
    """A second writer of the same table waits for the first (flock on separate descriptors)."""
    import threading

    from disd.historical.durable import TableLock

    ns = NamespaceRoot.system(tmp_path, "Market")
    got = threading.Event()
    with TableLock(ns.lock_path("Trade")):
        with TableLock(ns.lock_path("Quote")):  # another table: no wait
            pass

        def second() -> None:
            with TableLock(ns.lock_path("Trade")):
                got.set()

        t = threading.Thread(target=second)
        t.start()
        assert not got.wait(0.3)  # blocked while the first holds the lock
    assert got.wait(5)
    t.join()


# -- schema versions ----------------------------------------------------------------------------
def test_a_merge_moves_the_definition_on_to_a_newer_version(tmp_path):
    import dataclasses

    import versioned_db
    from disd.historical.merge import _definition, file_metadata

    ns = NamespaceRoot.system(str(tmp_path / "db"), "Test")
    v2 = versioned_db.V2.with_history([versioned_db.V1])
    old = TableDefinition.from_schema(versioned_db.V1, sort_by=("Px", "Gone", "Id"))
    write_definition(ns, old)
    snap = SourceSnapshot("Test", "Evolve", versioned_db.DAY2, v2, "files", "db", ())
    new = _definition(ns, snap, None)
    # the sort key follows the rename and loses the dropped column; renamed_from is kept
    assert (new.schema_version, new.sort_by) == (2, ("Price", "Id"))
    assert read_definition(ns, "Evolve") == new and read_definition(ns, "Evolve").columns[2].renamed_from == "Px"
    assert read_definition(ns, "Evolve").table_schema().version == 2
    meta = file_metadata(v2)
    assert meta["dis.schema_version"] == "2"
    assert sorted(TableSchema.from_history_json(meta["dis.schema_versions"]).versions) == [1, 2]
    # back to version 1 only: refused, naming both versions
    with pytest.raises(MergeError, match="is version 2 of Test.Evolve, newer than the intraday schema's version 1"):
        _definition(ns, dataclasses.replace(snap, schema=versioned_db.V1), None)
    # columns that are no version of the table: refused as before
    write_definition(ns, dataclasses.replace(old, columns=old.columns[:2], sort_by=()))
    with pytest.raises(MergeError, match="differs from its historical definition"):
        _definition(ns, snap, None)


def test_files_of_older_versions_are_projected_by_their_version_or_their_columns(tmp_path):
    import versioned_db
    from disd.spark.errors import DisSourceError
    from disd.spark.readparquet import file_sources

    v2 = versioned_db.V2.with_history([versioned_db.V1])
    v1_rows = versioned_db.rows(1, 0, 10)
    stamped, plain = tmp_path / "stamped.parquet", tmp_path / "plain.parquet"
    pq.write_table(v1_rows.replace_schema_metadata({"dis.schema_version": "1",
                                                    "dis.schema_versions": v2.at_version(1).history_json()}), stamped)
    pq.write_table(v1_rows, plain)
    want = ["Price", "New", "Id"]
    for f in (stamped, plain):
        assert file_sources(pq.ParquetFile(f), str(f), v2, want) == {"Price": "Px", "New": None, "Id": "Id"}
    # the table's own version, or columns every file has: read by name
    assert file_sources(pq.ParquetFile(plain), str(plain), v2, ["Sym", "Qty"]) == {"Sym": "Sym", "Qty": "Qty"}
    # a file that is no version of the table: the definition is the schema
    with pytest.raises(DisSourceError, match="has no column 'Price'"):
        file_sources(pq.ParquetFile(plain), str(plain), versioned_db.V2, want)
