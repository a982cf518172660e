"""``dis merge`` on a real local Spark session against in-process DIS instances: merged rows read
back equal by Spark, pyarrow and DuckDB; idempotent re-runs; new versions; the live rule; and
``source`` historical / all / column files."""

from __future__ import annotations

import datetime as dt
import json
import os
import pathlib
import time

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from disd import cli
from disd.binlog import LocationKey
from disd.client import connect
from disd.historical.index import file_crc32c, read_index
from disd.historical.layout import NamespaceRoot
from disd.historical.liveness import LivePartitionError
from disd.historical.merge import IntradaySource, MergeError, MergeRequest, MergeSettings, merge
from disd.historical.parquet import ParquetSettings
from support import SCHEMAS as SCHEMAS_DIR, trade_rows

from .helpers import D1, D2, LOCS, location_table, rows_of

pytestmark = pytest.mark.spark


def request(db, address, value, **kw) -> MergeRequest:
    return MergeRequest("Market", "Trade", value, str(db), IntradaySource(address=address), **kw)


def read(spark, db, source="historical", **opts):
    r = spark.read.format("dis").option("source", source).option("dbRoot", str(db)).option("table", "Market.Trade")
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


def intraday(address: str, values=None) -> pa.Table:
    with connect(address) as c:
        return c.read_table("Market", "Trade", partitions=values)


def tree(db: pathlib.Path) -> dict:
    """Every file under Systems/ with its inode and mtime: what a re-run must not change."""
    out = {}
    for dirpath, _, files in os.walk(db / "Systems"):
        for f in files:
            st = os.stat(os.path.join(dirpath, f))
            out[os.path.join(dirpath, f)] = (st.st_ino, st.st_mtime_ns, st.st_size)
    return out


def test_merged_rows_read_back_equal_by_spark_pyarrow_and_duckdb(spark, merge_dis, tmp_path):
    db = tmp_path / "db"
    settings = MergeSettings(("Sym", "Timestamp"), ParquetSettings(row_group_rows=8192))
    r1 = merge(spark, request(db, merge_dis.address, D1, settings=settings))
    r2 = merge(spark, request(db, merge_dis.address, D2, settings=settings))
    assert (r1.status, r1.rows, r1.source, r1.internal_partition) == ("merged", rows_of(D1), "dis", "0")
    assert (r2.status, r2.rows) == ("merged", rows_of(D2))
    assert pathlib.Path(r1.path) == db / "Systems" / "Market" / "Partitions" / "0" / D1 / "Trade"

    # Spark, through the dis source: the same rows as the DIS serves, nulls included
    df = read(spark, db)
    assert df.columns == ["Timestamp", "Sym", "Price", "Size", "Date"]
    got = df.orderBy("Size").toArrow()
    exp = intraday(merge_dis.address).sort_by("Size")
    assert got.num_rows == exp.num_rows == rows_of(D1) + rows_of(D2)
    for c in ("Size", "Sym", "Price", "Date"):
        assert got.column(c).to_pylist() == exp.column(c).to_pylist(), c
    assert got.column("Sym").null_count > 0
    assert (got.column("Timestamp").cast(pa.int64()).to_numpy()
            == exp.column("Timestamp").cast(pa.int64()).to_numpy() // 1000).all()

    # pyarrow alone, on each location's files: exact rows, in sort order, small row groups
    for value, r in ((D1, r1), (D2, r2)):
        t = location_table(pathlib.Path(r.path))
        want = exp.filter(pa.compute.equal(exp.column("Date"), value))
        assert sorted(t.column("Size").to_pylist()) == sorted(want.column("Size").to_pylist())
        keys = list(zip([s is not None for s in t.column("Sym").to_pylist()],
                        [s or "" for s in t.column("Sym").to_pylist()],
                        t.column("Timestamp").cast(pa.int64()).to_pylist()))
        assert keys == sorted(keys), "rows are not ordered by (Sym nulls first, Timestamp)"
        for f in pathlib.Path(r.path).glob("*.parquet"):
            md = pq.read_metadata(f)
            assert all(md.row_group(i).num_rows <= 8192 for i in range(md.num_row_groups))
        assert t.schema.field("Timestamp").type == pa.timestamp("us", tz="UTC")

    # DuckDB over the namespace's layout (through the location links)
    rows = duckdb.sql(
        "select regexp_extract(filename, '/([0-9-]{10})/Trade/', 1) as d, count(*), sum(Size), count(Sym) "
        f"from read_parquet('{db}/Systems/Market/Partitions/*/*/Trade/*.parquet', filename=true) "
        "group by d order by d").fetchall()
    want = [(v, rows_of(v), sum(s for s in exp.filter(pa.compute.equal(exp.column("Date"), v)).column("Size").to_pylist()),
             pa.compute.count(exp.filter(pa.compute.equal(exp.column("Date"), v)).column("Sym")).as_py())
            for v in (D1, D2)]
    assert rows == want

    # the index lists both locations with the files' real checksums
    idx = read_index(NamespaceRoot.system(db, "Market").index_path("Trade"))
    assert [(loc.value, loc.rows) for loc in idx.locations] == [(D1, rows_of(D1)), (D2, rows_of(D2))]
    for loc, r in zip(idx.locations, (r1, r2)):
        assert loc.version == r.version and loc.settings["sort_by"] == ["Sym", "Timestamp"]
        assert all(file_crc32c(pathlib.Path(r.path) / f.name) == f.crc32c for f in loc.files)
        assert loc.source["locations"] == {k.internal_partition: n for k, (_, n) in LOCS.items()
                                         if k.column_partition == loc.value}


def test_rerun_changes_nothing_whether_read_from_the_dis_or_its_column_files(spark, merge_dis):
    db = merge_dis.db_root  # historical next to the intraday column files, as on the DIS host
    r = merge(spark, request(db, merge_dis.address, D2))
    before = tree(db)
    again = merge(spark, request(db, merge_dis.address, D2))
    assert (again.status, again.version, again.rows) == ("unchanged", r.version, r.rows)
    files = MergeRequest("Market", "Trade", D2, str(db), IntradaySource(schemas=str(SCHEMAS_DIR)))
    with merge_dis.stopped():  # reading the column files takes the database lock the DIS holds
        with pytest.raises(LivePartitionError, match="checkpoint changed"):
            merge(spark, files)  # checkpointed a moment ago: counts as still being written
        same = merge(spark, MergeRequest("Market", "Trade", D2, str(db), IntradaySource(schemas=str(SCHEMAS_DIR)),
                                         quiet_s=0))
    assert (same.status, same.version, same.source) == ("unchanged", r.version, "files")
    assert tree(db) == before  # no file written, replaced or touched
    assert read(spark, db).count() == rows_of(D2)  # nothing doubled


def test_more_rows_make_a_new_version_and_readers_of_the_old_keep_it(spark, fresh_dis, tmp_path):
    key = LocationKey("Market", "Trade", "feed1", D1)
    fresh_dis.append(key, trade_rows(0, 1000))
    db = tmp_path / "db"
    r1 = merge(spark, request(db, fresh_dis.address, D1))
    held = open(pathlib.Path(r1.path) / "part-00000.parquet", "rb")
    first = pq.read_table(held).num_rows
    fresh_dis.append(key, trade_rows(1000, 500))
    r2 = merge(spark, request(db, fresh_dis.address, D1))
    assert (r2.status, r2.rows) == ("merged", 1500) and r2.version != r1.version
    assert pq.read_table(held).num_rows == first  # the open file is the old one, intact
    held.close()
    old_dir = pathlib.Path(r1.path).parent / r1.version
    assert sorted(p.name for p in old_dir.glob("*.parquet")) == [f"part-{i:05d}.parquet" for i in range(r1.files)]
    assert os.readlink(r2.path) == r2.version
    assert read(spark, db).count() == 1500
    assert [loc.version for loc in read_index(NamespaceRoot.system(db, "Market").index_path("Trade")).locations] == [r2.version]


def test_a_partition_still_being_written_is_refused_unless_forced(spark, fresh_dis, tmp_path, capsys):
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    fresh_dis.append(LocationKey("Market", "Trade", "feed1", today), trade_rows(0, 100))
    db = tmp_path / "db"
    with pytest.raises(LivePartitionError, match="is not before today"):
        merge(spark, request(db, fresh_dis.address, today))
    assert not (db / "Systems" / "Market" / "Partitions").exists()
    args = ["merge", "--namespace", "Market", "--table", "Trade", "--partition", today, "--db-root", str(db),
            "--address", fresh_dis.address, "--json"]
    assert cli.main(args) == 3
    assert "--force" in capsys.readouterr().err
    assert cli.main(args + ["--force", "--sort-by", "Size"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (out["status"], out["rows"], out["source"]) == ("merged", 100, "dis")
    assert cli.main(args[:-1] + ["--force", "--sort-by", "Nope"]) == 1
    assert "sort column 'Nope'" in capsys.readouterr().err
    with pytest.raises(MergeError, match="no intraday rows"):
        merge(spark, request(db, fresh_dis.address, "2026-01-01"))


def test_source_all_spans_historical_and_intraday(spark, fresh_dis, tmp_path):
    for key, (start, n) in LOCS.items():
        fresh_dis.append(key, trade_rows(start, n))
    db = tmp_path / "db"
    merge(spark, request(db, fresh_dis.address, D1))
    # rows arriving after the merge of D1 stay intraday-only: historical wins for a merged partition
    fresh_dis.append(LocationKey("Market", "Trade", "feed1", D1), trade_rows(100_000, 333))
    fresh_dis.append(LocationKey("Market", "Trade", "feed1", D2), trade_rows(200_000, 111))

    def counts(df):
        return {r["Date"]: r["count"] for r in df.groupBy("Date").count().collect()}

    all_rows = read(spark, db, "all", address=fresh_dis.address)
    assert counts(all_rows) == {D1: rows_of(D1), D2: rows_of(D2) + 111}
    assert counts(read(spark, db, "historical")) == {D1: rows_of(D1)}
    assert counts(read(spark, db, "all", address=fresh_dis.address).where(f"Date = '{D2}'")) == {D2: rows_of(D2) + 111}
    assert counts(read(spark, db, "all", address=fresh_dis.address, partitions=D1)) == {D1: rows_of(D1)}
    assert read(spark, db, "all", address=fresh_dis.address, columns="Date").count() == rows_of(D1) + rows_of(D2) + 111
    # without a DIS: the column files at their checkpoints (on the DIS host)
    files_all = read(spark, db, "all", dbRoot=str(fresh_dis.db_root), schemas=str(SCHEMAS_DIR))
    assert counts(files_all) == {D1: rows_of(D1) + 333, D2: rows_of(D2) + 111}  # no historical table there
    files = read(spark, fresh_dis.db_root, "intraday", schemas=str(SCHEMAS_DIR))
    assert counts(files) == {D1: rows_of(D1) + 333, D2: rows_of(D2) + 111}
    got = files.where(f"Date = '{D2}'").orderBy("Size").toArrow()
    exp = intraday(fresh_dis.address, [D2]).sort_by("Size")
    assert got.column("Size").to_pylist() == exp.column("Size").to_pylist()
    assert got.column("Sym").to_pylist() == exp.column("Sym").to_pylist()


def test_read_errors_name_the_cause(spark, tmp_path):
    cases = [
        (lambda: read(spark, tmp_path).count(), "no historical table Market.Trade"),
        (lambda: read(spark, tmp_path / "nope").count(), "no such directory"),
        (lambda: read(spark, tmp_path, "sideways").count(), "option 'source' must be one of"),
        (lambda: read(spark, tmp_path, "intraday").count(), "give option 'schemas'"),
        (lambda: read(spark, tmp_path, colums="Sym").count(), "unknown option 'colums'"),
    ]
    for run, words in cases:
        with pytest.raises(Exception) as e:
            run()
        assert "DisSourceError: dis source:" in str(e.value) and words in str(e.value), str(e.value)[:2000]


def test_dis_merge_refuses_before_spark_starts(fresh_dis, tmp_path, monkeypatch, capsys):
    import disd.merge_job

    def no_spark(master=None):
        raise AssertionError("Spark was started before the refusal")

    monkeypatch.setattr(disd.merge_job, "job_session", no_spark)
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    fresh_dis.append(LocationKey("Market", "Trade", "feed1", today), trade_rows(0, 100))
    base = ["merge", "--namespace", "Market", "--table", "Trade", "--db-root", str(tmp_path / "db"),
            "--address", fresh_dis.address]
    assert cli.main(base + ["--partition", today]) == 3  # live: refused
    assert "is not before today" in capsys.readouterr().err
    assert cli.main(base + ["--partition", "2026-01-01"]) == 1  # nothing to merge
    assert "no intraday rows" in capsys.readouterr().err


def test_a_past_date_whose_connected_tailer_is_idle_merges_without_force(spark, fresh_dis, tmp_path):
    from disd.logger import IntradayLoggerBuilder
    from disd.tailer import Tailer, parse_tailer_config

    logs = tmp_path / "logs"
    log = (IntradayLoggerBuilder(str(SCHEMAS_DIR / "Market.Trade.yaml")).set_log_dir(logs)
           .set_internal_partition("feed7").set_column_partition_value(D1).build())
    log.log_batch({"Sym": ["A"] * 500, "Size": list(range(500))})
    log.close()
    tailer = Tailer(parse_tailer_config({"dis": fresh_dis.address, "log_dirs": [str(logs)]})).start()
    try:
        assert tailer.wait_idle(30)
        key = LocationKey("Market", "Trade", "feed7", D1)

        def checkpointed() -> bool:
            loc = fresh_dis.server.engine.location(key, create=False)
            return loc is not None and loc.checkpointed_rows == 500

        deadline = time.monotonic() + 20
        while not checkpointed() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fresh_dis.server.sessions.get(key) is not None  # the tailer stays connected
        with pytest.raises(LivePartitionError, match="tailer .* is connected"):
            merge(spark, request(tmp_path / "db", fresh_dis.address, D1, quiet_s=3600))
        time.sleep(1.5)
        r = merge(spark, request(tmp_path / "db", fresh_dis.address, D1, quiet_s=1.0))
        assert (r.status, r.rows) == ("merged", 500)
    finally:
        tailer.stop()
