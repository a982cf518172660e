"""Schema versions end to end with the real daemons (docs/schema-versions.md; README "Change a
table's schema"): loggers -> binary logs -> dis-tailer -> dis serve -> the client, Spark batch and
Spark streaming.

A table's YAML changes while an old-version logger keeps writing; the DIS is restarted to declare
the new version (and killed with -9 in the middle of ingesting both versions); a new-version
logger with ``set_suffix_internal_partition_with_log_format(True)`` writes its own internal
partition (``feed-<version>``) beside the old logger's plain ``feed``; streaming queries read
throughout.  At the end every logged row of every version is read exactly once, presented in the
newest version: added columns null in older rows, dropped columns absent, renamed columns under
their new name, widened values equal.  The expected rows are computed here from the row numbers
alone (every value is a function of ``Seq`` and the version that logged it).

A narrowing change is refused by ``dis serve`` (exit status 2) and by the logger builder, with a
message naming the table, both versions and the column, and nothing already stored is harmed.
"""

from __future__ import annotations

import subprocess
from collections import Counter
import threading
import time

import numpy as np
import pyarrow as pa
import pytest

from disd.client import connect
from disd.errors import DisError
from disd.logger import IntradayLoggerBuilder
from support import (BIN, ROOT, Proc, dis_healthy, free_port_pair, start_dis_process, start_tailer, subprocess_env, wait_for,
                     write_dis_config, write_tailer_config)
from support.versions import schema_yaml

pytestmark = [pytest.mark.slow, pytest.mark.spark]

NS, TABLE = "Test", "Evolving"
KEY = f"{NS}.{TABLE}"
DAY = "2026-11-22"
SYMS = np.array(["AAPL", "MSFT", "IBM", "GOOG", "NVDA"], dtype=object)
#: the first Seq each version's logger writes (the row's identity across versions)
BASE = {1: 0, 2: 1_000_000, 3: 2_000_000}
READERS = ("jvm", "python")


# -- rows: every value a function of (Seq, version that logged it) ----------------------------------
def value(column: str, seq: int):
    """The value logged in ``column`` for row ``seq`` (None: null)."""
    if column == "Seq":
        return seq
    if column in ("Sym", "Symbol"):
        return None if seq % 7 == 3 else str(SYMS[seq % len(SYMS)])
    if column == "Price":
        return None if seq % 11 == 5 else seq * 0.25
    if column == "Qty":
        return seq % 100_000 - 50_000
    if column == "Note":
        return None if seq % 5 == 1 else f"n{seq}"
    if column == "Venue":
        return f"V{seq % 3}"
    raise AssertionError(column)


def logged_rows(columns: list[tuple], start: int, n: int) -> pa.Table:
    """Rows ``start`` .. ``start + n - 1`` of a logger of the version with ``columns``."""
    seqs = range(start, start + n)
    return pa.table({c[0]: [value(c[0], s) for s in seqs] for c in columns})


class Writer(threading.Thread):
    """Logs batches of numbered rows (atomic transactions) until stopped; ``committed`` holds the
    Seq of every row logged."""

    def __init__(self, logger, columns, base: int, batch: int = 30, pause_s: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.logger, self.columns, self.next, self.batch, self.pause_s = logger, columns, base, batch, pause_s
        self.committed: list[int] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.logger.log_batch(logged_rows(self.columns, self.next, self.batch), atomic=True)
                self.committed.extend(range(self.next, self.next + self.batch))
                self.next += self.batch
                time.sleep(self.pause_s)
        except BaseException as e:  # noqa: BLE001
            self.error = e

    def finish(self) -> None:
        self.stop.set()
        self.join(60)
        assert not self.is_alive(), "writer did not stop"
        self.logger.close()
        assert self.error is None, self.error


class RowSink:
    """A ``foreachBatch`` sink that keeps every micro-batch as Arrow."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.parts: list[pa.Table] = []

    def __call__(self, batch_df, batch_id) -> None:  # noqa: ARG002 - foreachBatch's signature
        t = batch_df.toArrow()
        with self.lock:
            self.parts.append(t)

    def count(self) -> int:
        with self.lock:
            return sum(t.num_rows for t in self.parts)

    def table(self) -> pa.Table:
        with self.lock:
            return pa.concat_tables(self.parts, promote_options="default")


# -- the pipeline ---------------------------------------------------------------------------------
class Pipeline:
    """A DIS (``dis serve``) over a schemas directory of its own holding the table's YAML, a
    tailer of one log directory, and the YAML of each version kept apart for the loggers."""

    def __init__(self, tmp, versions: dict[int, list[tuple]]) -> None:
        self.tmp = tmp
        self.versions = versions
        self.schemas = tmp / "schemas"
        self.schemas.mkdir()
        self.logs = tmp / "logs"
        self.logs.mkdir()
        self.port = free_port_pair()
        self.address = f"127.0.0.1:{self.port}"
        self.config = write_dis_config(tmp, self.port, schemas=self.schemas)
        self.dis: Proc | None = None
        self.tailer: Proc | None = None

    def yaml_of(self, version: int):
        """The table's YAML file of ``version`` (in a directory of its own: a logger reads it)."""
        d = self.tmp / f"yaml-v{version}"
        d.mkdir(exist_ok=True)
        path = d / f"{KEY}.yaml"
        path.write_text(schema_yaml(NS, TABLE, version, self.versions[version]))
        return path

    def declare(self, version: int) -> None:
        """The operator's edit: the table's YAML in the DIS's schemas directory says ``version``."""
        (self.schemas / f"{KEY}.yaml").write_text(self.yaml_of(version).read_text())

    def start(self, version: int) -> None:
        self.declare(version)
        self.dis = start_dis_process(self.tmp, self.config)
        self.tailer = start_tailer(self.tmp, write_tailer_config(self.tmp, self.port, self.logs))

    def restart_dis(self, kill9: bool = False) -> None:
        if kill9:
            self.dis.kill9()
            time.sleep(0.3)
        else:
            rc = self.dis.terminate()
            assert rc == 0, self.dis.log_text()[-3000:]
        self.dis = start_dis_process(self.tmp, self.config)

    def logger(self, version: int, suffix: bool):
        b = (IntradayLoggerBuilder(str(self.yaml_of(version))).set_process_name(f"app-v{version}")
             .set_log_dir(str(self.logs)).set_namespace_set("System").set_column_partition_value(DAY)
             .set_internal_partition("feed"))
        if suffix:
            b = b.set_suffix_internal_partition_with_log_format(True)
        return b.build()

    def visible_rows(self) -> int:
        with connect(self.address) as c:
            return sum(s.rows for s in c.locations(NS, TABLE))

    def stop(self) -> None:
        for p in (self.tailer, self.dis):
            if p is not None and p.alive():
                p.terminate()


def stream(spark, address: str, reader: str, checkpoint, sink: RowSink, available_now: bool = False):
    df = (spark.readStream.format("dis").option("reader", reader).option("address", address)
          .option("table", KEY).option("maxRowsPerTrigger", "1500").load())
    w = df.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
    w = w.trigger(availableNow=True) if available_now else w.trigger(processingTime="300 milliseconds")
    return w.start()


def renamed_from(col: tuple) -> str | None:
    return col[2] if len(col) > 2 else None


def name_in(versions: dict[int, list[tuple]], name: str, at: int, to: int) -> str | None:
    """The name in version ``to`` of the column called ``name`` in version ``at`` (None: it does
    not exist there), one step at a time: going back, a column comes from its ``renamed_from``
    when the older version has it, else from its own name; going forward, the column that says
    it was renamed from it, else the one of the same name unless that one was renamed from
    another."""
    order = sorted(versions)
    i, j = order.index(at), order.index(to)
    while i != j and name is not None:
        cur, nxt = versions[order[i]], versions[order[i + (1 if j > i else -1)]]
        nxt_names = [c[0] for c in nxt]
        if j < i:  # back: cur is newer
            col = next(c for c in cur if c[0] == name)
            if renamed_from(col) and renamed_from(col) in nxt_names:
                name = renamed_from(col)
            elif name not in nxt_names:
                name = None
        else:  # forward: nxt is newer
            cur_names = [c[0] for c in cur]
            into = [c[0] for c in nxt if renamed_from(c) == name]
            if into:
                name = into[0]
            elif name not in nxt_names or renamed_from(next(c for c in nxt if c[0] == name)) in cur_names:
                name = None
        i += 1 if j > i else -1
    return name


def expected_table(versions: dict[int, list[tuple]], logged: dict[int, list[int]], presented: int) -> list[dict]:
    """Every logged row (``logged``: version -> Seq numbers) as version ``presented`` shows it,
    sorted by Seq: each column takes the value the row was logged with under that column's name
    in the row's version, null when the column does not exist there; the partition column is the
    day.  Computed from the row numbers and the version files alone."""
    rows = []
    for v, seqs in logged.items():
        names = {c[0]: name_in(versions, c[0], presented, v) for c in versions[presented]}
        for s in seqs:
            rows.append({c: (None if n is None else value(n, s)) for c, n in names.items()} | {"Date": DAY})
    return sorted(rows, key=lambda r: r["Seq"])


def wait_rows(q, sink: RowSink, total: int, what: str) -> None:
    """Until ``sink`` holds ``total`` rows; at once with the query's exception if it failed."""
    deadline = time.monotonic() + 90
    while sink.count() < total:
        if q.exception() is not None or not q.isActive:
            raise AssertionError(f"{what} stopped after {sink.count()} of {total} rows: {q.exception()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: {sink.count()} of {total} rows within 90 s")
        time.sleep(0.2)


def as_rows(t: pa.Table, columns: list[str]) -> list[dict]:
    data = {c: t.column(c).to_pylist() for c in columns}
    return sorted(({c: data[c][i] for c in columns} for i in range(t.num_rows)), key=lambda r: r["Seq"])


def check_exactly(what: str, got: list[dict], want: list[dict]) -> None:
    seqs = [r["Seq"] for r in got]
    assert len(seqs) == len(set(seqs)), f"{what}: {len(seqs) - len(set(seqs))} rows read twice"
    missing = sorted({r["Seq"] for r in want} - set(seqs))
    assert not missing, f"{what}: {len(missing)} rows never read, e.g. Seq {missing[:5]}"
    assert len(got) == len(want), f"{what}: {len(got)} rows, {len(want)} logged"
    bad = [(g, w) for g, w in zip(got, want) if g != w]
    assert not bad, f"{what}: {len(bad)} rows differ, first: read {bad[0][0]}, expected {bad[0][1]}"


def check_filters(df, reader: str, want: list[dict], columns: list[str]) -> None:
    """Filters Spark may push down to the source, on every newest column (an added one is null in
    older locations, a renamed one has another name there): the rows counted are the rows
    expected, for IS NULL, IS NOT NULL and equality with the most common value."""
    from pyspark.sql import functions as F

    for c in columns:
        values = [r[c] for r in want]
        nulls = sum(v is None for v in values)
        assert df.filter(F.col(c).isNull()).count() == nulls, (reader, c, "IS NULL")
        assert df.filter(F.col(c).isNotNull()).select(c).count() == len(values) - nulls, (reader, c, "IS NOT NULL")
        counts = Counter(v for v in values if v is not None)
        if counts:
            common, n = counts.most_common(1)[0]
            assert df.filter(F.col(c) == F.lit(common)).count() == n, (reader, c, common)
    assert df.filter(F.col("Date") == DAY).count() == len(want), (reader, "Date")


def check_everything(pipe: Pipeline, spark, sinks, queries, logged: dict[int, list[int]], locations: dict[str, int],
                     tmp) -> None:
    """Every reader reads every logged row exactly once in the newest version."""
    versions = pipe.versions
    newest_v = max(versions)
    newest = versions[newest_v]
    names = [c[0] for c in newest] + ["Date"]
    want = expected_table(versions, logged, newest_v)
    total = len(want)
    wait_for(lambda: pipe.visible_rows() == total, 90, 0.2, f"{total} rows visible")

    with connect(pipe.address) as c:
        schema = c.schema(NS, TABLE)
        assert schema.version == newest_v and list(schema.versions) == sorted(versions)
        assert [x.name for x in schema.columns] == [x[0] for x in newest]
        snaps = c.locations(NS, TABLE)
        assert {s.key.internal_partition: s.schema_version for s in snaps} == locations
        t = c.read_table(NS, TABLE)
    assert t.column_names == names
    check_exactly("client read_table", as_rows(t, names), want)

    for reader in READERS:
        df = spark.read.format("dis").option("reader", reader).option("address", pipe.address).option(
            "table", KEY).load()
        assert df.columns == names, (reader, df.columns)
        check_exactly(f"Spark batch ({reader})", as_rows(df.toArrow(), names), want)
        check_filters(df, reader, want, [c[0] for c in newest])

    # The queries that ran across every change keep the schema of the version they started in
    # (docs/spark.md): each row once, projected onto that version's columns.
    failures = []
    first = expected_table(versions, logged, min(versions))
    first_names = [c[0] for c in versions[min(versions)]] + ["Date"]
    for (reader, sink), q in zip(sinks.items(), queries):
        what = f"stream across the change ({reader})"
        try:
            wait_rows(q, sink, total, what)
            time.sleep(1.0)  # a duplicate would arrive now
            assert q.isActive and q.exception() is None, (reader, q.exception())
            got = sink.table()
            assert got.column_names == first_names, (what, got.column_names)
            check_exactly(what, as_rows(got, first_names), first)
        except AssertionError as e:
            failures.append(str(e))
        finally:
            q.stop()

    # A query started now reads the newest version, columns and rows, exactly.
    for reader in READERS:
        what = f"stream started after the change ({reader})"
        try:
            sink = RowSink()
            q = stream(spark, pipe.address, reader, tmp / f"ckpt-late-{reader}", sink, available_now=True)
            q.awaitTermination(120)
            assert q.exception() is None, (what, q.exception())
            got = sink.table()
            assert got.column_names == names, (what, got.column_names)
            check_exactly(what, as_rows(got, names), want)
        except AssertionError as e:
            failures.append(str(e))
    assert not failures, "\n".join(failures)


def run_change(spark, tmp, versions: dict[int, list[tuple]]) -> None:
    """Version 1 is declared and logged; then each later version is declared (YAML edited, DIS
    restarted) and logged by a logger of its own with the version suffix, while every earlier
    logger keeps writing; the DIS is killed with -9 while all of them write.  Streaming queries
    (both readers) run from before the first change to the end."""
    pipe = Pipeline(tmp, versions)
    writers: dict[int, Writer] = {}
    queries = []
    sinks = {r: RowSink() for r in READERS}
    try:
        pipe.start(1)
        for reader, sink in sinks.items():
            queries.append(stream(spark, pipe.address, reader, tmp / f"ckpt-{reader}", sink))
        wait_for(lambda: all(q.lastProgress is not None or "Waiting" in q.status["message"] for q in queries),
                 90, 0.2, "both streams running")
        writers[1] = Writer(pipe.logger(1, suffix=False), versions[1], BASE[1])
        writers[1].start()
        wait_for(lambda: all(s.count() > 0 for s in sinks.values()), 90, 0.2, "both streams reading version 1")
        for v in sorted(versions)[1:]:
            pipe.declare(v)
            pipe.restart_dis()
            writers[v] = Writer(pipe.logger(v, suffix=True), versions[v], BASE[v])
            writers[v].start()
            time.sleep(1.0)
        before = pipe.visible_rows()
        pipe.restart_dis(kill9=True)  # in the middle of ingesting every version at once
        wait_for(lambda: pipe.visible_rows() > before, 60, 0.2, "ingestion going on after kill -9")
        time.sleep(1.0)
        for w in writers.values():
            w.finish()
        assert all(len(w.committed) > 0 for w in writers.values())
        locations = {"feed": 1} | {f"feed-{v}": v for v in sorted(versions)[1:]}
        check_everything(pipe, spark, sinks, queries, {v: w.committed for v, w in writers.items()}, locations, tmp)
        assert pipe.tailer.alive(), pipe.tailer.log_text()[-3000:]
    finally:
        for w in writers.values():
            w.stop.set()
        for q in queries:
            try:
                q.stop()
            except Exception:  # noqa: BLE001 - already stopped or failed: reported above
                pass
        pipe.stop()


V1 = [("Seq", "long"), ("Sym", "string"), ("Price", "double"), ("Qty", "int"), ("Note", "string")]


def test_added_column_old_and_new_loggers_kill9_and_streaming(jvm_spark, tmp_path):
    """Version 2 appends Venue: version 1 rows read it as null."""
    run_change(jvm_spark, tmp_path, {1: V1, 2: V1 + [("Venue", "string")]})


def test_rename_and_drop_across_three_versions(jvm_spark, tmp_path):
    """Version 2 appends Venue; version 3 renames Sym to Symbol (``renamed_from``), drops Note
    and widens Qty from int to long.  Version 1 rows read Symbol from Sym, Venue null, no Note."""
    v2 = V1 + [("Venue", "string")]
    v3 = [("Seq", "long"), ("Symbol", "string", "Sym"), ("Price", "double"), ("Qty", "long"), ("Venue", "string")]
    run_change(jvm_spark, tmp_path, {1: V1, 2: v2, 3: v3})


def test_narrowing_is_refused_by_the_dis_and_the_logger(tmp_path):
    """long -> int: ``dis serve`` exits 2 naming the table, both versions and the column; the
    logger builder refuses it against the log directory; the stored rows are untouched."""
    wide = [("Seq", "long"), ("Sym", "string"), ("Qty", "long")]
    narrow = [("Seq", "long"), ("Sym", "string"), ("Qty", "int")]
    pipe = Pipeline(tmp_path, {1: wide, 2: narrow})
    try:
        pipe.start(1)
        log = pipe.logger(1, suffix=False)
        log.log_batch(logged_rows(wide, 0, 500), atomic=True)
        log.close()
        wait_for(lambda: pipe.visible_rows() == 500, 60, 0.2, "500 rows visible")
        assert pipe.dis.terminate() == 0
        pipe.tailer.terminate()

        def names_everything(text: str) -> None:
            assert KEY in text and "Qty" in text, text[-3000:]
            assert "version 1" in text and "2" in text.split("version 1", 1)[1], text[-3000:]
            assert "Traceback" not in text, text[-3000:]

        pipe.declare(2)
        p = subprocess.Popen([str(BIN / "dis"), "serve", "--config", str(pipe.config)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=ROOT, env=subprocess_env())
        try:
            wait_for(lambda: p.poll() is not None or dis_healthy(pipe.port), 60, 0.1, "dis serve to exit")
        finally:
            serving = p.poll() is None
            if serving:
                p.kill()
            out, err = p.communicate(timeout=30)
        assert not serving, "dis serve started with a narrowing change:\n" + err[-3000:]
        assert p.returncode == 2, (p.returncode, out[-2000:], err[-2000:])
        names_everything(err)
        assert "narrow" in err, err

        with pytest.raises(DisError) as e:
            pipe.logger(2, suffix=True)
        names_everything(str(e.value))
        with pytest.raises(DisError):
            pipe.logger(2, suffix=False)

        # Nothing was harmed: the DIS starts with the declared version 1 and serves every row.
        pipe.declare(1)
        pipe.dis = start_dis_process(tmp_path, pipe.config)
        with connect(pipe.address) as c:
            assert c.schema(NS, TABLE).version == 1
            t = c.read_table(NS, TABLE)
        assert sorted(t.column("Seq").to_pylist()) == list(range(500))
        assert sorted(t.column("Qty").to_pylist()) == sorted(value("Qty", s) for s in range(500))
    finally:
        pipe.stop()
