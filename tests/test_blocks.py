"""The block seam (``disd.blocks``): a DIS over gRPC and its column files serve the same bytes for
the same snapshots, and the column files refuse what they cannot serve."""

from __future__ import annotations

import dataclasses

import pytest

from disd.binlog import LocationKey
from disd.blocks import (
    BlockSource,
    ColumnFileError,
    GrpcBlocks,
    LocalColumnFiles,
    open_block_source,
    read_location,
)
from disd.client import connect, table_from_blocks
from support import loaded_dis

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
