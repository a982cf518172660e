"""Unit tests of the JVM reader's Java code, without Spark: ``jvm/src/test/java/disd/spark/Probe``
is compiled against the jar and run with cases on stdin; its answers must equal the Python
reader's for the same cases (planning, admission control, option errors) or the expected ones
(partition pruning, routing patterns).  Needs a JDK (javac), as the jar does."""

from __future__ import annotations

import fnmatch
import json
import os
import random
import shutil
import subprocess

import pytest
import yaml
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from disd.binlog import LocationKey
from disd.client import LocationSnapshot
from disd.spark.errors import DisSourceError
from disd.spark.options import parse_options
from disd.spark.plan import Range, ReadSpec, plan_partitions
from disd.spark.source import admit

from support import ROOT


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    import pyspark

    from disd.spark import jvm

    javac, java = shutil.which("javac"), shutil.which("java")
    if os.environ.get("JAVA_HOME"):
        javac = os.path.join(os.environ["JAVA_HOME"], "bin", "javac")
        java = os.path.join(os.environ["JAVA_HOME"], "bin", "java")
    assert javac and java, "a JDK 17 (javac) is needed: it builds the JVM reader"
    jar, why = jvm.jar_status()
    assert jar is not None, why
    out = tmp_path_factory.mktemp("probe")
    cp = f"{jar}{os.pathsep}{os.path.join(os.path.dirname(pyspark.__file__), 'jars', '*')}"
    src = ROOT / "jvm" / "src" / "test" / "java" / "disd" / "spark" / "Probe.java"
    subprocess.run([javac, "--release", "17", "-nowarn", "-cp", cp, "-d", str(out), str(src)], check=True,
                   capture_output=True, timeout=300)

    def run(request: dict) -> dict:
        r = subprocess.run([java, "-cp", f"{out}{os.pathsep}{cp}", "disd.spark.Probe"], input=json.dumps(request),
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    return run


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
    base = {"address": "127.0.0.1:22021", "namespace": "Market", "table": "Trade"}
    options = [
        {}, {"namespace": "Market", "table": "Trade"}, {**base, "address": "nohost"},
        {"address": "h:1", "table": "Trade"}, {**base, "colums": "Sym"}, {**base, "columns": ","},
        {**base, "columns": "Sym,Sym"}, {**base, "partitions": " , "}, {**base, "rowsPerPartition": "many"},
        {**base, "maxRowsPerTrigger": "0"}, {**base, "timeout": "-1"}, {**base, "timeout": "soon"},
        {**base, "startingOffsets": "middle"}, {**base, "cert": "/nope.pem"}, {**base, "ca": "/nope.pem"},
        {**base, "token": "a", "tokenFile": "/x"}, {"routing": "/nope/routing.yaml", "namespace": "M", "table": "T"},
        {**base, "dbRoot": "/"}, {"address": "h:1", "path": "Trade"}, base, {**base, "table": "Market.Trade"},
        {**base, "source": "intraday"}, {**base, "source": "nope"}, {**base, "schemas": "/x"},
    ]
    globs = [["Market.*", "Market.Trade"], ["Market.*", "Other.Trade"], ["*", "A.B"], ["M?rket.T[a-z]ade", "Market.Trade"],
             ["M[!a]rket.*", "Market.X"], ["Market.Trade", "Market.Trades"], ["*.Q*", "Market.Quote"]]
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
    got = probe({"plan": plans, "admit": admits, "options": options, "glob": globs, "filters": values,
                 "keys": [str(tmp_path / k) for k in keys]})
    assert [a.split(":")[0] for a in got["keys"]] == list(keys.values())

    for case, parts in zip(plans, got["plan"]):
        assert parts == python_plan(case["ranges"], case["rpp"], case["min"]), case
    for case, end in zip(admits, got["admit"]):
        limit = (ReadMaxRows(case["max"]) if case["max"] is not None
                 else ReadMinRows(case["min"]) if case["min"] is not None else ReadAllAvailable())
        assert end == admit(case["start"], case["available"], limit), case
    for case, message in zip(options, got["options"]):
        try:
            parse_options(case)
            expected = "ok"
        except DisSourceError as e:
            expected = str(e)
        assert message == expected, case
    assert got["glob"] == [fnmatch.fnmatchcase(name, pat) for pat, name in globs]
    assert got["filters"] == [
        ["2026-11-23"], ["2026-11-23", "2030-01-01"], ["2026-11-23", "2030-01-01"], ["2026-11-21", "2026-11-22"],
        ["2026-11-21", "2026-11-23", "2030-01-01"], values, ["2026-11-21", "2026-11-22", "2026-11-23"], values,
        values, [],
    ]


def _random_chain(rnd: random.Random, n_versions: int) -> list:
    """Canonical dicts of a table's versions 1..n: each step renames (a swap too, a rename into a
    freed name, a stale ``renamed_from`` kept), adds, drops or widens columns at random."""
    widen = {"byte": ["short", "int", "long"], "short": ["int", "long"], "int": ["long"], "float": ["double"]}
    types = ["bool", "byte", "short", "int", "long", "float", "double", "char", "string", "timestamp"]
    cols = [{"name": f"C{i}", "type": rnd.choice(types)} for i in range(rnd.randint(1, 6))]
    fresh = iter(range(100, 10_000))
    out = [{"namespace": "M", "table": "T", "partition_column": "Date", "version": 1, "columns": cols}]
    for v in range(2, n_versions + 1):
        prev = [c["name"] for c in cols]
        new = []
        for c in cols:
            c = {"name": c["name"], "type": c["type"]} | (
                {"renamed_from": c["renamed_from"]} if "renamed_from" in c and rnd.random() < 0.3 else {})
            r = rnd.random()
            if r < 0.15 and len(cols) > 1:
                continue  # dropped
            if r < 0.35:
                c["renamed_from"], c["name"] = c["name"], rnd.choice([f"N{next(fresh)}", f"C{rnd.randint(0, 8)}"])
            if rnd.random() < 0.3 and c["type"] in widen:
                c["type"] = rnd.choice(widen[c["type"]])
            new.append(c)
        if len(new) >= 2 and rnd.random() < 0.2:  # a swap of two names: two renames
            a, b = rnd.sample(range(len(new)), 2)
            if new[a]["name"] in prev and new[b]["name"] in prev:
                new[a]["name"], new[b]["name"] = new[b]["name"], new[a]["name"]
                new[a]["renamed_from"], new[b]["renamed_from"] = new[b]["name"], new[a]["name"]
        for _ in range(rnd.randint(0, 2)):
            new.insert(rnd.randint(0, len(new)), {"name": rnd.choice([f"A{next(fresh)}", rnd.choice(prev)]),
                                                  "type": rnd.choice(types)})
        names = [c["name"] for c in new]
        if len(set(names)) != len(names):
            continue
        cols = new
        out.append({"namespace": "M", "table": "T", "partition_column": "Date", "version": v, "columns": cols})
    return out


def test_schema_versions_compose_as_the_python_rules(probe):
    """The JVM reader's SchemaVersions (origins of every newest column in every version, the
    columns' fingerprint a pre-versions table.size is matched by, and, for a query fixed in any
    version, the column of every other version each of its columns is read from: origins in an
    older one, the column it became in a newer one) equals disd.schemaversions / disd.schema /
    disd.blocks.version_projection on random valid chains of renames, swaps, adds, drops and
    widenings."""
    from disd.blocks import version_projection
    from disd.schema import SchemaError, TableSchema
    from disd.schemaversions import check_chain, origins

    rnd = random.Random(14)
    cases, newest = [], []
    while len(cases) < 150:
        chain = _random_chain(rnd, rnd.randint(1, 5))
        try:
            schemas = [TableSchema.from_dict(d) for d in chain]
            check_chain(schemas)
        except SchemaError:
            continue
        n = TableSchema.from_history_json(json.dumps(chain))
        cases.append(n.history_json())
        newest.append(n)
    renamed = sum(1 for n in newest for v in n.versions if v != n.version and origins(n, v) != {
        c: c if c in n.at_version(v).column_names else None for c in n.column_names})
    assert renamed > 30, "the random chains must exercise renames, adds and drops"
    odd = TableSchema.from_dict({"namespace": "M", "table": "T", "columns": [{"name": "a-b+c_1", "type": "int"}]})
    cases.append(odd.history_json())
    newest.append(odd)
    got = probe({"plan": [], "admit": [], "options": [], "glob": [], "filters": [], "keys": [], "versions": cases})
    for n, answer in zip(newest, got["versions"]):
        assert "error" not in answer, (n.history_json(), answer)
        for v, s in n.versions.items():
            assert answer[str(v)]["origins"] == origins(n, v), (n.history_json(), v)
            assert answer[str(v)]["fingerprint"] == s.fingerprint, (n.history_json(), v)
            query = s.with_history(n.versions.values())
            for w in n.versions:
                assert answer[str(v)]["sources"][str(w)] == version_projection(query, w).sources, (
                    n.history_json(), v, w)
    backward = sum(1 for n in newest for v in n.versions for w in n.versions if w > v and any(
        src not in (None, c) for c, src in version_projection(n.at_version(v).with_history(n.versions.values()), w)
        .sources.items()))
    assert backward > 30, "the random chains must exercise columns renamed after a query's version"


def test_dbroot_versions_come_from_the_column_files(probe, tmp_path):
    """With option dbRoot the reader takes the table's versions from ``schema.versions`` (a DIS
    that sends no history) and a location's version from its ``table.size``: ``schema_version``,
    else the newest version whose fingerprint the record holds; damage and unknown fingerprints
    are errors that name the file."""
    import dataclasses

    from disd.schema import TableSchema
    from disd.storage import checkpoint, versionstore

    v1 = TableSchema.from_dict({"namespace": "M", "table": "T", "version": 1,
                                "columns": [{"name": "A", "type": "int"}, {"name": "B", "type": "string"}]})
    v2 = TableSchema.from_dict({"namespace": "M", "table": "T", "version": 2,
                                "columns": [{"name": "A", "type": "long"}, {"name": "C", "type": "string",
                                                                          "renamed_from": "B"}]})
    # version 3 has version 2's columns (a renamed_from cleared): the same fingerprint
    v3 = TableSchema.from_dict({"namespace": "M", "table": "T", "version": 3,
                                "columns": [{"name": "A", "type": "long"}, {"name": "C", "type": "string"}]})
    root = tmp_path / "db"
    (root / "Intraday").mkdir(parents=True)
    base = checkpoint.CheckpointRecord(1, {}, checkpoint.SourcePosition(None, 0, 0), v1.fingerprint, {})
    records = {
        "said": dataclasses.replace(base, fingerprint=v2.fingerprint, schema_version=1),
        "fp1": base,
        "fp3": dataclasses.replace(base, fingerprint=v3.fingerprint),
        "unknown": dataclasses.replace(base, fingerprint="00" * 16),
    }
    for ip, rec in records.items():
        d = root / "Intraday" / "M" / "T" / ip / "2026-11-20" / "T"
        d.mkdir(parents=True)
        checkpoint.write_record(d, rec)
    damaged = root / "Intraday" / "M" / "T" / "damaged" / "2026-11-20" / "T"
    damaged.mkdir(parents=True)
    (damaged / "table.size").write_bytes(base.to_bytes().replace(b'"rows":1', b'"rows":2'))
    locs = [[ip, "2026-11-20"] for ip in [*records, "damaged", "absent"]]
    case = {"dbRoot": str(root), "schema_json": v3.to_json(), "locations": locs}
    before = probe({"plan": [], "admit": [], "options": [], "glob": [], "filters": [], "keys": [], "stored": [case]})
    versionstore.save(str(root), [v1, v2, v3])
    after = probe({"plan": [], "admit": [], "options": [], "glob": [], "filters": [], "keys": [], "stored": [case]})

    assert before["stored"][0]["versions"] == [3]
    assert after["stored"][0]["versions"] == [1, 2, 3]
    got = after["stored"][0]["locations"]
    assert got[:3] == [1, 1, 3]
    assert got[3].startswith("error: ") and "00000000" in got[3] and "which no known version" in got[3], got[3]
    assert got[4].startswith("error: ") and "damaged/2026-11-20/T/table.size" in got[4] and "checksum" in got[4]
    assert got[5] == 0
    assert before["stored"][0]["locations"][1].startswith("error: ")  # version 1 unknown without the record


def test_routing_replica_sets_parse_and_fail_as_in_python(probe, tmp_path):
    """Routing.java reads the ``replicas:`` form as ``disd.routing`` does: the same members (each
    block endpoint its ``http_address`` or the address's port + 1) and, for a malformed entry, the
    same message naming the entry and key."""
    from disd.config import ConfigError
    from disd.routing import load_routing

    r1 = {"name": "a1", "address": "127.0.0.1:22021"}
    r2 = {"name": "a2", "address": "127.0.0.2:22021", "http_address": "127.0.0.2:9000"}
    cases = [
        {"instances": [{"name": "market", "tables": ["Market.*"], "replicas": [r1, r2]},
                       {"address": "h:5", "http_address": "h:7"}]},
        {"instances": [{"replicas": [{"address": "h:1"}]}]},
        {"instances": [{"address": "h:1", "replicas": [r1]}]},
        {"instances": [{"replicas": []}]},
        {"instances": [{"replicas": "h:1"}]},
        {"instances": [{"replicas": [r1], "http_address": "h:2"}]},
        {"instances": [{"replicas": [r1, {"address": "127.0.0.1:22021"}]}]},
        {"instances": [{"replicas": [r1, {"name": "x"}]}]},
        {"instances": [{"replicas": [r1, {"address": "nohost"}]}]},
        {"instances": [{"replicas": [{"address": "h:1", "http_address": "h"}]}]},
        {"instances": [{"replicas": [{"address": "h:1", "port": 5}]}]},
        {"instances": [{"replicas": ["h:1"]}]},
        {"instances": [{"replicas": [{"address": 5}]}]},
        {"instances": [{"replicas": [r1], "tables": ["Market.*", ""]}]},
        {"instances": [{"address": "h:1", "colour": "red"}]},
        {"instances": []},
        {"instance": [{"address": "h:1"}]},
        ["h:1"],
    ]
    paths = []
    for i, data in enumerate(cases):
        p = (tmp_path / f"routing{i}.yaml").resolve()
        p.write_text(yaml.safe_dump(data))
        paths.append(str(p))
    got = probe({"plan": [], "admit": [], "options": [], "glob": [], "filters": [], "keys": [], "routing": paths})
    errors = 0
    for path, answer in zip(paths, got["routing"]):
        try:
            routing = load_routing(path)
        except ConfigError as e:
            errors += 1
            assert answer == f"dis source: option 'routing': cannot use {path}: {e}", (path, answer)
            continue
        assert answer == [[i.name, [[r.name, r.address, r.http_address or
                                     f"{r.address.rsplit(':', 1)[0]}:{int(r.address.rsplit(':', 1)[1]) + 1}"]
                                    for r in i.members]] for i in routing.instances], (path, answer)
    assert errors == len(cases) - 2
