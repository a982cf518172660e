"""Unit tests of the JVM reader's Java code, without Spark: ``jvm/src/test/java/disd/spark/``
is compiled against the jar once and run.  ``Probe`` takes cases on stdin and its answers must
equal the Python reader's for the same cases (planning, admission control) or the expected ones
(partition pruning, client keys); ``VectorTests`` checks the rules both readers implement
against the shared test vectors (tests/vectors/: routing, options, patterns, column files read
through a listing's projection), which tests/test_vectors.py checks the Python side against.
Needs a JDK (javac), as the jar does."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from disd.binlog import LocationKey
from disd.client import LocationSnapshot
from disd.spark.plan import Range, ReadSpec, plan_partitions
from disd.spark.source import admit

from support import ROOT


@pytest.fixture(scope="module")
def java(tmp_path_factory):
    """``java(main, *args, stdin=None)``: the last line of what ``disd.spark.<main>`` of the
    test sources prints (compiled once, against the jar and PySpark's jars)."""
    import pyspark

    from disd.spark import jvm

    javac, java_bin = shutil.which("javac"), shutil.which("java")
    if os.environ.get("JAVA_HOME"):
        javac = os.path.join(os.environ["JAVA_HOME"], "bin", "javac")
        java_bin = os.path.join(os.environ["JAVA_HOME"], "bin", "java")
    assert javac and java_bin, "a JDK 17 (javac) is needed: it builds the JVM reader"
    jar, why = jvm.jar_status()
    assert jar is not None, why
    out = tmp_path_factory.mktemp("jvm-tests")
    cp = f"{jar}{os.pathsep}{os.path.join(os.path.dirname(pyspark.__file__), 'jars', '*')}"
    sources = sorted(str(p) for p in (ROOT / "jvm" / "src" / "test" / "java").rglob("*.java"))
    subprocess.run([javac, "--release", "17", "-nowarn", "-cp", cp, "-d", str(out), *sources], check=True,
                   capture_output=True, timeout=300)
    # SPARK_LOCAL_IP: Spark's classes resolve the host name when first used, seconds without it
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}

    def run(main: str, *args: str, stdin: str | None = None) -> str:
        r = subprocess.run([java_bin, "-cp", f"{out}{os.pathsep}{cp}", f"disd.spark.{main}", *args], input=stdin,
                           capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        return r.stdout.strip().splitlines()[-1]

    return run


@pytest.fixture(scope="module")
def probe(java):
    return lambda request: json.loads(java("Probe", stdin=json.dumps(request)))


def test_java_reads_the_shared_vectors(java):
    """Routing, options, patterns, misspelt keys and column files read through a listing's
    projection: the JVM reader answers every case of tests/vectors/ as the vectors say."""
    got = json.loads(java("VectorTests", str(ROOT / "tests" / "vectors")))
    assert got["failures"] == [], "\n".join(got["failures"])
    cases = {name: len(json.loads((ROOT / "tests" / "vectors" / f"{name}.json").read_text(encoding="utf-8")))
             for name in ("routing", "options", "globs", "closest")}
    cases["columns"] = len(json.loads((ROOT / "tests" / "vectors" / "columns.json").read_text())["cases"])
    cases["projections"] = sum(len(c["projections"]) for c in json.loads(
        (ROOT / "tests" / "vectors" / "projections.json").read_text()).values())
    assert got["checked"] == cases


def python_plan(ranges, rpp: int, min_partitions: int) -> list:
    rs = []
    for key, a, b in ranges:
        ip, cp = key.split("/")
        snap = LocationSnapshot(LocationKey("M", "T", ip, cp), b, {}, 65536, "h:0")
        rs.append(Range(snap, a, b))
    parts = plan_partitions(rs, ReadSpec(None, None, 30.0, 65536), rpp, min_partitions)
    return [[[f"{s.internal_partition}/{s.column_partition}", s.start, s.stop] for s in p.slices] for p in parts]


def test_java_units_agree_with_the_python_reader(probe, tmp_path):
    rnd = random.Random(15)
    plans = [
        {"ranges": [["a/2026-11-22", 0, 30_000], ["b/2026-11-22", 0, 20_000], ["a/2026-11-23", 0, 7_000]],
         "rpp": rpp, "min": m} for rpp in (4096, 8000, 65536, 8 << 20) for m in (1, 2, 3, 8)
    ]
    for _ in range(40):
        ranges = []
        for i in range(rnd.randint(1, 7)):
            a = rnd.choice([0, rnd.randint(0, 500_000)])
            ranges.append([f"f{i}/2026-11-{20 + i % 5}", a, a + rnd.randint(0, 3_000_000)])
        plans.append({"ranges": ranges, "rpp": rnd.choice([1000, 65536, 100_000, 1 << 20, 8 << 20]),
                      "min": rnd.randint(1, 9)})
    admits = [
        {"start": {}, "available": {"a": 1000}, "max": 700, "min": None},
        {"start": {"a": 700}, "available": {"a": 1000, "b": 400}, "max": 700, "min": None},
        {"start": {"a": 100}, "available": {"a": 50}, "max": None, "min": None},  # never moves back
        {"start": {}, "available": {"a": 10, "b": 10}, "max": None, "min": 30},
        {"start": {}, "available": {"a": 10, "b": 30}, "max": None, "min": 30},
    ]
    for _ in range(40):
        keys = [f"k{i}" for i in range(rnd.randint(1, 6))]
        start = {k: rnd.randint(0, 1000) for k in keys if rnd.random() < 0.7}
        avail = {k: rnd.randint(0, 3000) for k in keys}
        admits.append({"start": start, "available": avail, "max": rnd.choice([None, 1, 7, 500, 10_000]),
                       "min": None})
    values = ["2026-11-21", "2026-11-22", "2026-11-23", "2030-01-01"]
    keys = {}
    if shutil.which("openssl"):  # client keys as openssl writes them: PKCS#8 (RSA, EC) and PKCS#1 RSA
        def ossl(*args: str) -> None:
            subprocess.run(["openssl", *args], cwd=tmp_path, check=True, capture_output=True)

        ossl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "rsa8.pem")
        ossl("rsa", "-in", "rsa8.pem", "-traditional", "-out", "rsa1.pem")
        ossl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "ec8.pem")
        (tmp_path / "cert-only.pem").write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
        keys = {"rsa8.pem": "RSA", "rsa1.pem": "RSA", "ec8.pem": "EC", "cert-only.pem": "error"}
    got = probe({"plan": plans, "admit": admits, "filters": values, "keys": [str(tmp_path / k) for k in keys]})
    assert [a.split(":")[0] for a in got["keys"]] == list(keys.values())

    for case, parts in zip(plans, got["plan"]):
        assert parts == python_plan(case["ranges"], case["rpp"], case["min"]), case
    for case, end in zip(admits, got["admit"]):
        limit = (ReadMaxRows(case["max"]) if case["max"] is not None
                 else ReadMinRows(case["min"]) if case["min"] is not None else ReadAllAvailable())
        assert end == admit(case["start"], case["available"], limit), case
    assert got["filters"] == [
        ["2026-11-23"], ["2026-11-23", "2030-01-01"], ["2026-11-23", "2030-01-01"], ["2026-11-21", "2026-11-22"],
        ["2026-11-21", "2026-11-23", "2030-01-01"], values, ["2026-11-21", "2026-11-22", "2026-11-23"], values,
        values, [],
    ]


def test_a_location_of_another_version_needs_the_listings_projection(probe):
    """The JVM reader reads a location in another schema version than the one it presents only
    through the projection the DIS's listing carries for it: without one (a DIS older than
    projections) planning fails, saying what to do, instead of guessing the columns."""
    cases = [{"version": 2, "presented": 2, "projection": False}, {"version": 0, "presented": 2, "projection": False},
             {"version": 1, "presented": 2, "projection": True}, {"version": 3, "presented": 2, "projection": True},
             {"version": 1, "presented": 2, "projection": False}]
    got = probe({"plan": [], "admit": [], "filters": [], "keys": [], "readable": cases})["readable"]
    assert got[:4] == ["ok"] * 4
    assert got[4] == ("dis source: Market.Trade location feed1/2026-11-22 is written in schema version 1, and the "
                      "listing of address 127.0.0.1:22021 says nothing of how it reads as version 2 (a DIS older "
                      "than this reader: upgrade it, or read with option reader 'python')")
