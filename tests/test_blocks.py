"""The block seam (``disd.blocks``): a DIS over gRPC and its column files serve the same bytes for
the same snapshots, and the column files refuse what they cannot serve."""

from __future__ import annotations

import dataclasses
import os
import shutil

import pyarrow as pa
import pytest

import versioned_db
from disd.binlog import LocationKey
from disd.blocks import (
    BlockSource,
    BlockSourceError,
    ColumnFileError,
    GrpcBlocks,
    LocalColumnFiles,
    open_block_source,
    read_location,
    version_projection,
)
from disd.client import connect, table_from_blocks
from disd.storage.checkpoint import read_record, write_record
from disd.storage.columns import read_rows
from disd.storage.engine import location_path
from disd.storage.versionstore import VersionStore, table_dir
from support import loaded_dis, running_dis

LOCS = {
    LocationKey("Market", "Trade", "feed1", "2026-11-22"): (0, 70_000),
    LocationKey("Market", "Trade", "feed2", "2026-11-22"): (70_000, 3_000),
    LocationKey("Market", "Trade", "feed1", "2026-11-23"): (73_000, 5_000),
}


@pytest.fixture(scope="module")
def dis(tmp_path_factory):
    srv = loaded_dis(tmp_path_factory.mktemp("blocks") / "db", LOCS, checkpoint=True)
    yield srv
    srv.stop(0.5)


def test_the_choice_is_made_in_one_place(dis):
    files: BlockSource = open_block_source(db_root=dis.config.db_root)
    grpc: BlockSource = open_block_source(address=f"127.0.0.1:{dis.port}")
    try:
        assert isinstance(files, LocalColumnFiles) and isinstance(grpc, GrpcBlocks)
    finally:
        files.close()
        grpc.close()


def test_both_sources_serve_the_same_bytes_and_rows(dis):
    schema = dis.schemas.get("Market", "Trade")
    files = open_block_source(db_root=dis.config.db_root, tables=[schema])
    try:
        with connect(f"127.0.0.1:{dis.port}") as client:
            published = client.locations("Market", "Trade")
            assert len(published) == len(LOCS)
            for snap in published:  # the DIS's snapshots, read from the files at their published sizes
                for name, size in snap.files.items():
                    for a, b in [(0, size), (size // 3, size // 2 + 1), (size - 5, size + 100)]:
                        assert files.read_range(snap, name, a, b) == client.read_range(snap, name, a, b)
                assert read_location(files, schema, snap, ["Size", "Sym"], 10, 2_000).equals(
                    client.read_location(snap, ["Size", "Sym"], 10, 2_000))
            # listed from the files themselves (at their checkpoints, here the published rows)
            listed = files.locations("Market", "Trade")
            assert [(s.key, s.rows, s.files) for s in listed] == [(s.key, s.rows, s.files) for s in published]
            assert table_from_blocks(files, schema).equals(client.read_table("Market", "Trade"))
            day = table_from_blocks(files, schema, ["Size", "Date"], ["2026-11-23"])
            assert day.equals(client.read_table("Market", "Trade", ["Size", "Date"], ["2026-11-23"]))
            assert day.column("Size").to_pylist() == list(range(73_000, 78_000))
    finally:
        files.close()


def test_column_files_refuse_what_they_cannot_serve(dis, tmp_path):
    schema = dis.schemas.get("Market", "Trade")
    with LocalColumnFiles(dis.config.db_root, [schema], origin="option 'dbRoot'") as files:
        snap = files.locations("Market", "Trade")[0]
        name, size = sorted(snap.files.items())[0]
        longer = dataclasses.replace(snap, files={**snap.files, name: size + 10})
        with pytest.raises(ColumnFileError, match=f"holds {size} bytes.*is option 'dbRoot' the root"):
            files.read_range(longer, name, size - 4, size + 10)
        with pytest.raises(ColumnFileError, match="refusing column file name"):
            files.read_range(dataclasses.replace(snap, files={"../x": 10}), "../x", 0, 10)
        assert files.read_range(snap, "Nope.dat", 0, 10) == b""  # not in the snapshot: nothing to read
        with pytest.raises(ColumnFileError, match="no schema for Market.Quote"):
            files.locations("Market", "Quote")
    with LocalColumnFiles(str(tmp_path), [schema], origin="option 'dbRoot'") as elsewhere:
        assert elsewhere.locations("Market", "Trade") == []
        with pytest.raises(ColumnFileError, match="option 'dbRoot': cannot open"):
            elsewhere.read_range(snap, name, 0, 10)


# -- schema versions: locations written in two versions, read in the newest --------------------
@pytest.fixture(scope="module")
def evolved(tmp_path_factory):
    """A database root with Test.Evolve locations in versions 1 and 2 (tests/versioned_db.py)."""
    return versioned_db.build(tmp_path_factory.mktemp("versions") / "db")


def test_each_location_is_decoded_in_its_version_and_presented_in_the_newest(evolved):
    db = str(evolved)
    old_loc = LocationKey("Test", "Evolve", "feed1", versioned_db.DAY1)
    # the files of a location carry the names of its own version
    assert os.path.exists(os.path.join(location_path(db, old_loc), "Px.dat"))
    assert not os.path.exists(os.path.join(location_path(db, old_loc), "Price.dat"))
    with LocalColumnFiles(db, [versioned_db.V2]) as files:
        snaps = files.locations("Test", "Evolve")
        assert {s.key: s.schema_version for s in snaps} == {k: v for k, (v, _, _) in versioned_db.LOCS.items()}
        # the YAML of the newest version alone: the older ones come from the database's record
        schema = files.schema(versioned_db.V2)
        assert sorted(schema.versions) == [1, 2]
        got = table_from_blocks(files, versioned_db.V2)
        want = versioned_db.expected()
        assert got.drop_columns(["Date"]).equals(want)
        assert got.column("Date").to_pylist()[:1] == [versioned_db.DAY1]
        # widened, renamed and added columns keep their nulls; the dropped one is gone
        assert got.schema.names == ["Id", "Sym", "Price", "Qty", "New", "Date"]
        assert got.schema.field("Id").type == pa.int64() and got.schema.field("Price").type == pa.float64()
        first = got.slice(0, 5).to_pydict()
        assert first["Id"] == [0, 1, None, 3, 4] and first["Price"] == [0.0, 0.25, None, 0.75, 1.0]
        assert first["New"] == [None] * 5 and first["Qty"] == [0, 1, None, 3, 4]
        # a row range of an old location, some columns in another order
        snap = next(s for s in snaps if s.key == old_loc)
        part = read_location(files, schema, snap, ["New", "Price", "Id"], 65_530, 65_545)
        assert part.equals(versioned_db.expected(old_loc, ["New", "Price", "Id"]).slice(65_530, 15))
        # only the columns the presented ones come from are decoded (Gone is never read)
        proj = version_projection(schema, 1, ["Price", "New"])
        assert proj.stored_columns == ["Px"]


def test_a_location_in_the_newest_version_reads_as_before(evolved):
    with LocalColumnFiles(str(evolved), [versioned_db.V2]) as files:
        schema = files.schema(versioned_db.V2)
        snap = next(s for s in files.locations("Test", "Evolve") if s.schema_version == 2)
        assert read_location(files, schema, snap).equals(
            read_rows(versioned_db.V2, None, 0, snap.rows, lambda n, a, b: files.read_range(snap, n, a, b)))
        # a snapshot that says no version (an older DIS) is the newest version
        assert read_location(files, schema, dataclasses.replace(snap, schema_version=0)).equals(
            read_location(files, schema, snap))


def test_an_older_reader_sees_newer_locations_in_its_own_version(evolved):
    """A reader that started with version 1 (a streaming query) and learns version 2: the newer
    rows are projected back onto version 1's columns (renamed back, dropped ones null)."""
    with LocalColumnFiles(str(evolved), [versioned_db.V2]) as files:
        newest = files.schema(versioned_db.V2)
        v1 = newest.at_version(1).with_history(newest.versions.values())
        snap = next(s for s in files.locations("Test", "Evolve") if s.schema_version == 2)
        t = read_location(files, v1, snap, None, 0, 10)
        assert t.schema == versioned_db.V1.arrow_schema()
        d = t.to_pydict()
        assert d["Px"][:3] == [78_000 * 0.25, 78_001 * 0.25, None] and d["Id"][:3] == [78_000, 78_001, None]
        assert d["Gone"] == [None] * 10 and d["Sym"][0] == "s" + str(78_000 % 7)


def test_versions_a_reader_cannot_place_are_refused_by_name(evolved, tmp_path):
    with LocalColumnFiles(str(evolved), [versioned_db.V2]) as files:
        snap = next(s for s in files.locations("Test", "Evolve") if s.schema_version == 1)
    # a reader holding only version 2 (no history) cannot decode a version 1 location
    with LocalColumnFiles(str(evolved), [versioned_db.V2]) as files:
        with pytest.raises(BlockSourceError, match=r"location Test/Evolve/feed\w+/2026-11-\d+ is written in schema "
                                                   r"version 1 of Test.Evolve, which this reader does not know "
                                                   r"\(it knows versions 2\)"):
            read_location(files, versioned_db.V2, snap)
    # a copy of the database without its versions record: the old location matches no version
    copy = tmp_path / "db"
    shutil.copytree(evolved, copy)
    os.unlink(os.path.join(table_dir(str(copy), "Test", "Evolve"), "schema.versions"))
    with LocalColumnFiles(str(copy), [versioned_db.V2]) as files:
        with pytest.raises(ColumnFileError, match=r"location Test/Evolve/feed1/2026-11-19 was written in schema "
                                                  r"version 1 of Test.Evolve, which the database's versions do not "
                                                  r"hold \(known: 2\)"):
            files.locations("Test", "Evolve")
    # a checkpoint naming its version: that version, whose fingerprint it must carry
    loc = location_path(str(copy), LocationKey("Test", "Evolve", "feed1", versioned_db.DAY1))
    shutil.rmtree(os.path.join(table_dir(str(copy), "Test", "Evolve"), "feed1", versioned_db.DAY2))
    shutil.rmtree(os.path.join(table_dir(str(copy), "Test", "Evolve"), "feed1-2"))
    shutil.rmtree(os.path.join(table_dir(str(copy), "Test", "Evolve"), "feed2"))
    rec = read_record(loc)
    write_record(loc, dataclasses.replace(rec, schema_version=3))
    with LocalColumnFiles(str(copy), [versioned_db.V2.with_history([versioned_db.V1])]) as files:
        with pytest.raises(ColumnFileError, match="schema version 3 of Test.Evolve, which the database's versions "
                                                  r"do not hold \(known: 1, 2\)"):
            files.locations("Test", "Evolve")
    write_record(loc, dataclasses.replace(rec, schema_version=1))
    VersionStore(str(copy)).declare(versioned_db.V1)
    with LocalColumnFiles(str(copy), [versioned_db.V2]) as files:
        assert [s.schema_version for s in files.locations("Test", "Evolve")] == [1]
        assert files.schema(versioned_db.V2).version == 2


def test_client_reads_a_mixed_version_table_from_a_dis(evolved, tmp_path):
    """The DIS started with version 2's YAML over locations of both versions lists the table with
    its versions and each location with its version; the client presents version 2."""
    copy = tmp_path / "db"
    shutil.copytree(evolved, copy)
    schemas = versioned_db.write_schema_dir(tmp_path / "schemas", versioned_db.V2_DICT)
    with running_dis(copy, schemas=schemas) as srv, connect(f"127.0.0.1:{srv.port}") as client:
        schema = client.schema("Test", "Evolve")
        assert schema.version == 2 and sorted(schema.versions) == [1, 2]
        assert [t.key for t in client.tables()] == ["Test.Evolve"]
        snaps = client.locations("Test", "Evolve")
        assert {s.key: s.schema_version for s in snaps} == {k: v for k, (v, _, _) in versioned_db.LOCS.items()}
        got = client.read_table("Test", "Evolve")
        assert got.drop_columns(["Date"]).equals(versioned_db.expected())
        old = next(s for s in snaps if s.schema_version == 1)
        assert client.read_location(old, ["Price"], 0, 4).column("Price").to_pylist() == [0.0, 0.25, None, 0.75]


# -- the package ------------------------------------------------------------------------------
def test_every_name_imported_from_the_seam_is_its_public_name():
    """``from disd.blocks import X`` anywhere in the repository names one of ``disd.blocks.__all__``
    (what the package's modules export through it), and every one of those is there."""
    import ast
    import pathlib

    import disd.blocks

    root = pathlib.Path(__file__).resolve().parent.parent
    imported = set()
    for path in [p for d in ("dis", "tailer", "tests", "bench", "examples") for p in (root / d).rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "disd.blocks":
                imported.update(a.name for a in node.names)
    assert {"GrpcBlocks", "LocalColumnFiles", "read_location", "replica_order"} <= imported
    assert imported - set(disd.blocks.__all__) == set()
    assert [n for n in disd.blocks.__all__ if not hasattr(disd.blocks, n)] == []
