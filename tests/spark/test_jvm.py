"""The JVM reader and what it stands on: the DIS's block endpoint (with TLS, client certificates
and the token), the jar's build, which reader ``format("dis")`` is, pruning per query, reads while
rows are being ingested, and streaming across a DIS restart."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zipfile

import pytest
from pyspark.sql import functions as F

from disd.binlog import LocationKey

from .conftest import TOTAL
from support import ROOT, Feeder, dis_config, trade_rows
from support import start_dis_server as start_dis

K1 = LocationKey("Market", "Trade", "feed1", "2026-11-22")


def http_get(port: int, path: str, token: str | None = None, context: ssl.SSLContext | None = None,
             host: str = "127.0.0.1") -> tuple[int, bytes]:
    req = urllib.request.Request(f"{'https' if context else 'http'}://{host}:{port}{path}")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def read_path(key: LocationKey, file: str, start: int, stop: int) -> str:
    return (f"/v1/read?namespace={key.namespace}&table={key.table}&internal_partition={key.internal_partition}"
            f"&column_partition={key.column_partition}&file={file}&start={start}&stop={stop}")


# -- the block endpoint ---------------------------------------------------------------------------
def test_block_endpoint_lists_and_serves_published_bytes_only(tmp_path):
    # an hour's flush interval: only Feeder's own flushes publish, so rows appended unpublished
    # stay so while they are read past (with the tests' 20 ms the flush clock could win the race)
    srv = start_dis(tmp_path / "db", flush_ms=3_600_000)
    try:
        assert srv.http_port == srv.port + 1  # the default, where the JVM reader looks
        Feeder(srv).append(K1, trade_rows(0, 1000, nulls=True))
        status, body = http_get(srv.http_port, "/v1/tables")
        assert status == 200
        tables = {f"{t['namespace']}.{t['table']}": t for t in json.loads(body)["tables"]}
        assert json.loads(tables["Market.Trade"]["schema_json"])["partition_column"] == "Date"
        status, body = http_get(srv.http_port, "/v1/locations?namespace=Market&table=Trade")
        listing = json.loads(body)
        assert status == 200 and listing["block_size"] == 65536
        (loc,) = listing["locations"]
        assert (loc["internal_partition"], loc["column_partition"], loc["rows"]) == ("feed1", "2026-11-22", 1000)
        assert loc["files"]["Size.dat"] == 4000 and loc["files"]["Sym.off"] == 8000
        on_disk = (pathlib.Path(srv.config.db_root) / "Intraday/Market/Trade/feed1/2026-11-22/Trade/Size.dat").read_bytes()
        status, body = http_get(srv.http_port, read_path(K1, "Size.dat", 100, 3000))
        assert status == 200 and body == on_disk[100:3000]
        # never past the published size (a scan planned at a size reads exactly those rows)
        Feeder(srv).append(K1, trade_rows(1000, 10), publish=False)
        status, body = http_get(srv.http_port, read_path(K1, "Size.dat", 0, 4004))
        assert status == 416 and "4000 published" in json.loads(body)["error"]
        for path, code, words in [
            (read_path(K1, "Nope.dat", 0, 1), 404, "no column file"),
            (read_path(LocationKey("Market", "Trade", "feed9", "2026-11-22"), "Size.dat", 0, 1), 404, "no location"),
            (read_path(K1, "Size.dat", 5, 1), 400, "bad range"),
            ("/v1/read?namespace=Market&table=Trade&internal_partition=..&column_partition=x&file=a&start=0&stop=1",
             400, ""),
            ("/v1/nothing", 404, "no such endpoint"),
        ]:
            status, body = http_get(srv.http_port, path)
            assert status == code and words in json.loads(body)["error"], (path, status, body)
    finally:
        srv.stop(0.5)


def test_block_endpoint_can_be_turned_off(tmp_path):
    srv = start_dis(tmp_path / "db", http_port=False)
    try:
        assert srv.http_port is None
    finally:
        srv.stop(0.5)


def test_http_port_config():
    from disd.config import ConfigError, parse_dis_config

    assert parse_dis_config({"server": {"port": 22021}}).http_port == 22022
    assert parse_dis_config({"server": {"port": 0}}).http_port == 0
    assert parse_dis_config({"server": {"http_port": 9000}}).http_port == 9000
    assert parse_dis_config({"server": {"http_port": False}}).http_port is None
    for bad in (True, 70000, "x"):
        with pytest.raises(ConfigError) as e:
            parse_dis_config({"server": {"http_port": bad}}, "dis.yaml")
        assert "server.http_port" in str(e.value)


# -- TLS, client certificates and the token -------------------------------------------------------
@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    from server.test_security import make_pki

    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def secure_dis(tmp_path, pki):
    (tmp_path / "token").write_text("s3cret-token\n")
    srv = start_dis(tmp_path / "db", token_file=str(tmp_path / "token"),
                    tls={"cert": str(pki / "server.pem"), "key": str(pki / "server.key"),
                         "client_ca": str(pki / "ca.pem")})
    Feeder(srv).append(K1, trade_rows(0, 5000, nulls=True))
    yield srv
    srv.stop(0.5)


def client_context(pki, cert: str | None = "client") -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    if cert:
        ctx.load_cert_chain(str(pki / f"{cert}.pem"), str(pki / f"{cert}.key"))
    return ctx


def test_block_endpoint_has_the_grpc_services_tls_and_token(secure_dis, pki):
    port = secure_dis.http_port
    assert http_get(port, "/v1/tables", "s3cret-token", client_context(pki), "localhost")[0] == 200
    status, body = http_get(port, "/v1/tables", None, client_context(pki), "localhost")
    assert status == 401 and json.loads(body)["error"] == "missing bearer token"
    status, body = http_get(port, "/v1/tables", "wrong", client_context(pki), "localhost")
    assert status == 401 and json.loads(body)["error"] == "invalid bearer token"
    for ctx in (client_context(pki, None), client_context(pki, "intruder")):  # no or a foreign certificate
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            http_get(port, "/v1/tables", "s3cret-token", ctx, "localhost")
    with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP to a TLS port
        http_get(port, "/v1/tables", "s3cret-token")


@pytest.mark.spark
def test_jvm_reader_with_tls_client_certificate_and_token(spark, secure_dis, pki, dis_reader):
    def read(**opts):
        r = (spark.read.format("dis").option("address", f"127.0.0.1:{secure_dis.port}").option("table", "Market.Trade")
             .option("ca", str(pki / "ca.pem")))
        for k, v in opts.items():
            r = r.option(k, v)
        return r.load()

    good = {"cert": str(pki / "client.pem"), "key": str(pki / "client.key"), "token": "s3cret-token"}
    df = read(**good)
    assert df.count() == 5000
    assert df.agg(F.sum("Size")).collect()[0][0] == 5000 * 4999 // 2
    assert read(serverName="localhost", **good).where("Sym IS NULL").count() == sum(
        1 for i in range(5000) if i % 7 == 3)
    with pytest.raises(Exception) as e:
        read(**{**good, "token": "wrong"}).count()
    assert "refused the credentials" in str(e.value), str(e.value)[:2000]
    with pytest.raises(Exception) as e:
        read(**{**good, "cert": str(pki / "intruder.pem"), "key": str(pki / "intruder.key")}).count()
    assert "DisSourceError: dis source:" in str(e.value), str(e.value)[:2000]


# -- which reader ---------------------------------------------------------------------------------
def plan_text(df) -> str:
    return df._jdf.queryExecution().executedPlan().toString()  # noqa: SLF001 - the plan has no Python API


@pytest.mark.spark
def test_jvm_reader_waits_out_a_full_block_endpoint(spark_session, tmp_path):
    """Every connection of the block endpoint busy serving: it answers 503 at once, and the JVM
    reader asks again with its backoff, within option retrySeconds, until a connection frees;
    then it reads every row.  With retrySeconds 0 it fails at once, saying why."""
    from hostile.test_block_endpoint import hold_serving

    n = 1_000_000
    srv = start_dis(tmp_path / "db", max_workers=4, flush_ms=3_600_000)
    held = []
    try:
        Feeder(srv).append(K1, trade_rows(0, n))
        held = hold_serving(srv.http_port, 4)
        status, body = http_get(srv.http_port, "/v1/tables")
        assert status == 503 and "connections of the block endpoint are serving requests" in json.loads(body)["error"]
        base = spark_session.read.format("dis").option("address", f"127.0.0.1:{srv.port}").option("table", "Market.Trade")
        with pytest.raises(Exception) as e:
            base.option("retrySeconds", "0").load()
        assert "HTTP 503" in str(e.value) and "server.max_workers" in str(e.value)

        got: dict = {}

        def read() -> None:
            try:
                got["sum"] = base.option("retrySeconds", "30").load().agg(F.sum("Size")).collect()[0][0]
            except Exception as ex:  # noqa: BLE001 - reported below
                got["error"] = ex
            got["at"] = time.monotonic()

        reader = threading.Thread(target=read)
        reader.start()
        time.sleep(3)
        assert reader.is_alive() and http_get(srv.http_port, "/v1/tables")[0] == 503  # still waiting, still full
        freed = time.monotonic()
        for s in held:
            s.close()
        reader.join(60)
        assert "error" not in got, got.get("error")
        assert got["sum"] == n * (n - 1) // 2 and got["at"] > freed
    finally:
        for s in held:
            s.close()
        srv.stop(0.5)


@pytest.mark.spark
def test_format_dis_is_the_jvm_reader_and_python_is_a_choice(spark, trade_address, dis_reader):
    base = spark.read.format("dis").option("address", trade_address).option("table", "Market.Trade")
    if dis_reader == "jvm":
        df = base.load()
        assert "ColumnarToRow" in plan_text(df) and "BatchScan dis Market.Trade" in plan_text(df)
        py = base.option("reader", "python").load()
        assert "PythonScan" in plan_text(py) or "MapInBatch" in plan_text(py) or "Python" in plan_text(py)
        assert py.count() == df.count() == TOTAL
    else:  # the session setting spark.dis.reader=python
        assert "BatchScan dis Market.Trade" not in plan_text(base.load())
        assert base.option("reader", "jvm").load().count() == TOTAL
    with pytest.raises(Exception) as e:
        base.option("reader", "scala").load()
    assert "option 'reader' must be 'jvm' or 'python'" in str(e.value)


@pytest.mark.spark
def test_both_readers_plan_the_same_tasks(spark_session, trade_address):
    spark = spark_session
    for rpp in ("4096", "8000", "30000", "1000000"):
        counts = {}
        for reader in ("jvm", "python"):
            df = (spark.read.format("dis").option("address", trade_address).option("table", "Market.Trade")
                  .option("reader", reader).option("rowsPerPartition", rpp).option("minPartitions", "3").load())
            counts[reader] = df.rdd.getNumPartitions()
        assert counts["jvm"] == counts["python"], (rpp, counts)


@pytest.mark.spark
def test_a_cast_the_jvm_reader_does_not_do_is_read_by_the_python_source(spark_session, trade_address):
    spark = spark_session
    r = spark.read.format("dis").option("address", trade_address).option("table", "Market.Trade")
    widened = r.schema("Size long, Price double, Date string").load()  # an exact widening: the JVM reader
    assert "BatchScan dis Market.Trade" in plan_text(widened)
    assert widened.agg(F.sum("Size")).collect()[0][0] == TOTAL * (TOTAL - 1) // 2
    as_text = r.schema("Size string, Date string").load()  # Arrow casts it: the Python source
    assert "BatchScan dis Market.Trade" not in plan_text(as_text)
    assert sorted(int(x.Size) for x in as_text.where("Date = '2026-11-23'").collect()) == list(range(50_000, TOTAL))


@pytest.mark.spark
def test_jvm_reader_reads_only_what_a_query_needs(spark_session, trade_dis, trade_address):
    spark = spark_session
    from prometheus_client import REGISTRY

    def blocks(fn) -> float:
        before = REGISTRY.get_sample_value("dis_block_reads_total") or 0
        fn()
        return REGISTRY.get_sample_value("dis_block_reads_total") - before

    df = spark.read.format("dis").option("address", trade_address).option("table", "Market.Trade").load()
    everything = blocks(lambda: df.agg(F.sum("Size"), F.count("Sym")).collect())
    one_day = blocks(lambda: df.where("Date = '2026-11-23'").agg(F.sum("Size"), F.count("Sym")).collect())
    one_column = blocks(lambda: df.agg(F.sum("Size")).collect())
    assert 0 < one_day < everything / 3  # 7,000 of 57,000 rows: the other locations are never read
    assert 0 < one_column < everything / 2  # Size alone
    assert blocks(lambda: df.count()) == 0  # the listing's row counts are enough
    assert df.where("Date = '2026-11-23'").count() == 7_000 and df.count() == TOTAL


@pytest.mark.spark
def test_strings_many_distinct_long_and_null_read_equal_from_both_readers(spark_session, fresh_dis):
    """Few distinct strings go to Spark dictionary-encoded, many (or long ones) plain: a slice
    that starts with few and then has many switches over mid-way; the values are the same."""
    import numpy as np
    import pyarrow as pa

    srv, feeder = fresh_dis
    n = 90_000
    idx = np.arange(n)
    syms = np.where(idx < 20_000, np.array(["AAPL", "MSFT", "ÄÖÜ", ""])[idx % 4],
                    np.char.add("S", idx.astype(str)))
    syms = syms.astype(object)
    syms[50_000] = "L" * 300  # longer than a dictionary takes
    t = trade_rows(0, n)
    sym = pa.compute.if_else(pa.array(idx % 11 == 5), pa.nulls(n, pa.string()), pa.array(syms, pa.string()))
    feeder.append(K1, t.set_column(1, "Sym", sym))
    r = (spark_session.read.format("dis").option("address", f"127.0.0.1:{srv.port}").option("table", "Market.Trade")
         .option("batchRows", "8192"))
    jvm_rows = r.load().select("Size", "Sym").orderBy("Size").collect()
    py_rows = r.option("reader", "python").load().select("Size", "Sym").orderBy("Size").collect()
    assert jvm_rows == py_rows
    assert [x.Sym for x in jvm_rows] == sym.to_pylist()
    grouped = {x.Sym: x["count"] for x in r.load().where("Size < 20000").groupBy("Sym").count().collect()}
    expected: dict = {}
    for v in sym.to_pylist()[:20_000]:
        expected[v] = expected.get(v, 0) + 1
    assert grouped == expected and len(expected) == 5


# -- live reads, restarts -------------------------------------------------------------------------
@pytest.mark.spark
def test_reads_while_rows_are_ingested_see_whole_published_batches(spark, fresh_dis):
    srv, feeder = fresh_dis
    address = f"127.0.0.1:{srv.port}"
    step = 3000
    stop = threading.Event()
    errors: list[BaseException] = []

    def ingest() -> None:
        # Paced and open-ended (until the reads are done), so the rows keep arriving during every
        # read however long the first query takes to plan: an unpaced feeder can finish before it.
        try:
            n = 0
            while not stop.is_set():
                feeder.append(K1, trade_rows(n, step))
                n += step
                time.sleep(0.05)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=ingest, daemon=True)
    t.start()
    seen = []
    try:
        for _ in range(8):
            df = spark.read.format("dis").option("address", address).option("table", "Market.Trade").load()
            n, total, nulls = df.agg(F.count("*"), F.sum("Size"), F.count("Sym")).collect()[0]
            assert n % step == 0 and n == nulls  # whole published appends, every value there
            assert total == (n * (n - 1) // 2 if n else None)  # exactly rows 0..n-1, no torn bytes
            seen.append(n)
    finally:
        stop.set()
        t.join(60)
    assert not errors, errors
    assert seen == sorted(seen) and seen[-1] > seen[0]


@pytest.mark.spark
@pytest.mark.slow
def test_a_running_stream_rides_through_a_dis_restart(spark_session, tmp_path):
    """A JVM streaming query keeps running while its DIS stops and starts again on the same root
    and ports: while the DIS is unreachable the reader retries for up to 'timeout' seconds, and
    every row arrives exactly once."""
    from disd.server.daemon import DisServer

    spark = spark_session
    db = tmp_path / "db"
    port = dis_config(db).port

    def start() -> DisServer:
        srv = DisServer(dis_config(db, port=port))
        srv.start()
        return srv

    def append(srv: DisServer, start_row: int, n: int) -> None:
        feeder = Feeder(srv)
        feeder.offsets[K1] = srv.engine.location(K1).resume_point.offset or 4096
        feeder.append(K1, trade_rows(start_row, n))

    received: list[int] = []
    lock = threading.Lock()

    def sink(batch_df, batch_id) -> None:
        got = [r.Size for r in batch_df.select("Size").collect()]
        with lock:
            received.extend(got)

    srv = start()
    q = None
    try:
        append(srv, 0, 3000)
        q = (spark.readStream.format("dis").option("address", f"127.0.0.1:{port}").option("table", "Market.Trade")
             .option("maxRowsPerTrigger", "1000").option("timeout", "30").load()
             .writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(processingTime="200 milliseconds").start())

        def count() -> int:
            with lock:
                return len(received)

        from support import wait_for

        wait_for(lambda: count() >= 3000, 120, 0.2, "the first rows")
        srv.stop(0.5)  # flushes and checkpoints: no published row is lost
        srv = None
        import time

        time.sleep(1.5)  # triggers fire while the DIS is down
        srv = start()
        append(srv, 3000, 2500)
        wait_for(lambda: count() >= 5500, 120, 0.2, "the rows ingested after the restart")
        time.sleep(1.0)  # a duplicate would arrive now
        assert q.exception() is None, q.exception()
        with lock:
            assert sorted(received) == list(range(5500))
    finally:
        if q is not None:
            q.stop()
        if srv is not None:
            srv.stop(0.5)


# -- the jar ----------------------------------------------------------------------------------------
def build_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("dis_jvm_build", ROOT / "jvm" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_jar_is_built_from_the_sources_for_this_pyspark():
    import pyspark

    from disd.spark import jvm

    jar, why = jvm.jar_status()
    assert jar is not None, why
    stamp = jvm.stamp()
    assert stamp["pyspark"] == pyspark.__version__ and stamp["release"] == "17"
    assert stamp["sources"] == build_module().sources_digest()
    with zipfile.ZipFile(jar) as z:
        names = set(z.namelist())
        assert "disd/spark/DisSource.class" in names
        assert z.read("META-INF/services/org.apache.spark.sql.sources.DataSourceRegister").decode().strip() == \
            "disd.spark.DisSource"


def test_build_without_a_jdk_fails_clearly_when_required(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(pathlib.Path(sys.executable).parent)  # python, no javac
    out = tmp_path / "x.jar"
    r = subprocess.run([sys.executable, str(ROOT / "jvm" / "build.py"), "--require", "--out", str(out)],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "javac was not found" in r.stderr and "openjdk-17-jdk-headless" in r.stderr
    r = subprocess.run([sys.executable, str(ROOT / "jvm" / "build.py"), "--out", str(out)],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Python reader" in r.stdout and not out.exists()


def test_without_the_jar_the_python_source_says_once_why(monkeypatch, tmp_path, caplog):
    from disd.spark import jvm

    monkeypatch.setattr(jvm, "JAR", tmp_path / "dis-spark.jar")
    monkeypatch.setattr(jvm, "_told", set())
    jar, why = jvm.jar_status()
    assert jar is None and "make jar" in why
    with caplog.at_level("WARNING", logger="disd.spark.jvm"):
        assert jvm.session_conf({"a": "b"}) == {"a": "b"}
        jvm.session_conf({})
    said = [r.getMessage() for r in caplog.records if "Python reader" in r.getMessage()]
    assert len(said) == 1 and "make jar" in said[0]
    monkeypatch.setattr(jvm, "JAR", pathlib.Path(jvm.__file__).parent / "jars" / "dis-spark.jar")
    conf = jvm.session_conf({"spark.jars": "/x/other.jar"})
    assert conf["spark.jars"].split(",") == ["/x/other.jar", str(jvm.JAR)]
