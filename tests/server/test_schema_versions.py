"""Schema versions on a real DIS (gRPC, real files): a database of version-1 locations restarted
with a version-2 YAML keeps its locations in version 1, healthy and readable, while new ones are
version 2; each stream goes to a location of its own version; and every listing says which
version a location is in."""

from __future__ import annotations

import json
import subprocess
import urllib.request

import grpc
import pytest

from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from disd.schema import TableSchema
from disd.storage import versionstore
from disd.storage.checkpoint import read_record
from support import BIN, by_label, running_dis, scrape, subprocess_env, wait_for

from .conftest import send_file
from .versions_support import (NARROWING_YAML, SAME_NUMBER_YAML, V1, V2, V2_YAML, V3, key, open_stream, schemas_dir,
                               write_version_log)

N_OLD = 40


def _published(srv, ip: str, n: int) -> None:
    wait_for(lambda: srv.engine.location(key(ip), create=False).published_rows == n, 10,
             what=f"{n} rows published in {ip}")


def _ingest(srv, ip: str, path, schema: TableSchema) -> dis_pb2.IngestResponse:
    s, _resume = open_stream(srv.port, ip, schema)
    try:
        return send_file(s, path, schema)
    finally:
        s.close()


def _refusal(srv, ip: str, path, schema: TableSchema) -> grpc.RpcError:
    s = None
    try:
        with pytest.raises(grpc.RpcError) as ei:
            s, _resume = open_stream(srv.port, ip, schema)
            send_file(s, path, schema)
    finally:
        if s is not None:
            s.close()
    return ei.value


@pytest.fixture
def v1_db(tmp_path):
    """A database whose ``old`` location holds ``N_OLD`` rows of version 1, written by a DIS that
    knew only version 1; the logs directory."""
    logs = tmp_path / "logs"
    logs.mkdir()
    db = tmp_path / "db"
    with running_dis(db, schemas=schemas_dir(tmp_path, "schemas-v1", None)) as srv:
        _ingest(srv, "old", write_version_log(logs, V1, "old", 0, N_OLD), V1)
        _published(srv, "old", N_OLD)
    return db, logs


def test_a_v1_database_under_a_v2_yaml(tmp_path, v1_db):
    db, logs = v1_db
    old_path = db / "Intraday" / "Market" / "Trade" / "old" / "2026-11-22" / "Trade"
    assert read_record(old_path).schema_version == 1
    with running_dis(db, schemas=schemas_dir(tmp_path, "schemas-v2", V2_YAML), http_port=0) as srv:
        # the database now holds both versions; the engine presents the newest with its history
        assert [v.version for v in versionstore.load(str(db), "Market", "Trade")] == [1, 2]
        table = srv.engine.schemas.get("Market", "Trade")
        assert table.version == 2 and list(table.versions) == [1, 2]
        old = srv.engine.location(key("old"), create=False)
        assert not old.in_error and old.schema_version == 1 and old.published_rows == N_OLD, old.error
        assert old.read_table().column_names == V1.column_names
        assert old.read_table().column("Size").to_pylist() == list(range(N_OLD))
        assert not (old_path / "Venue.dat").exists()

        # a version-2 log creates a version-2 location
        _ingest(srv, "new", write_version_log(logs, V2, "new", 0, 25), V2)
        _published(srv, "new", 25)
        new = srv.engine.location(key("new"), create=False)
        assert new.schema_version == 2 and new.read_table().column("Venue").to_pylist()[:2] == ["V0", "V1"]
        assert new.checkpoint() and read_record(new.path).schema_version == 2

        # a version-1 log still goes into the version-1 location
        _ingest(srv, "old", write_version_log(logs, V1, "old", N_OLD, 10, hhmmss="100000"), V1)
        _published(srv, "old", N_OLD + 10)
        assert old.checkpoint() and read_record(old_path).schema_version == 1

        # a version-2 log for the version-1 location is refused, and nothing is written
        e = _refusal(srv, "old", write_version_log(logs, V2, "old", 0, 5, hhmmss="110000"), V2)
        assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, e
        msg = e.details()
        assert str(key("old")) in msg and "schema version 1" in msg and "version 2" in msg, msg
        assert "set_suffix_internal_partition_with_log_format" in msg and "'old-2'" in msg, msg
        assert old.committed_rows == N_OLD + 10 and not (old_path / "Venue.dat").exists()

        # a stream opened as version 2 whose file header says version 1: refused at that file
        s, _resume = open_stream(srv.port, "new", V2)
        v1_file = write_version_log(logs, V1, "new", 0, 3, hhmmss="120000")
        with pytest.raises(grpc.RpcError) as ei:
            send_file(s, v1_file, V1)
        s.close()
        assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert ei.value.details().startswith(f"{v1_file.name}: location {key('new')} is written in schema version 2")
        assert new.committed_rows == 25

        # the listings say each location's version
        ch = grpc.insecure_channel(f"127.0.0.1:{srv.port}")
        stub = dis_pb2_grpc.TableDataStub(ch)
        info = {(t.namespace, t.table): t for t in stub.ListTables(dis_pb2.ListTablesRequest(), timeout=10).tables}
        trade = info[("Market", "Trade")]
        assert TableSchema.from_json(trade.schema_json).version == 2
        history = TableSchema.from_history_json(trade.versions_json)
        assert list(history.versions) == [1, 2] and history.at_version(1).fingerprint == V1.fingerprint
        locs = {loc.key.internal_partition: loc for loc in
                stub.ListLocations(dis_pb2.ListLocationsRequest(namespace="Market", table="Trade"), timeout=10).locations}
        assert (locs["old"].schema_version, locs["new"].schema_version) == (1, 2)
        assert "Venue.dat" not in {f.name for f in locs["old"].files}
        sub = stub.Subscribe(dis_pb2.SubscribeRequest(namespace="Market", table="Trade"), timeout=10)
        seen = {}
        for li in sub:
            seen[li.key.internal_partition] = li.schema_version
            if len(seen) == 2:
                break
        sub.cancel()
        assert seen == {"old": 1, "new": 2}
        st = {loc.key.internal_partition: loc for loc in
              stub.Status(dis_pb2.StatusRequest(namespace="Market"), timeout=10).locations}
        assert (st["old"].schema_version, st["new"].schema_version) == (1, 2)
        ch.close()
        versions = by_label(scrape(srv.metrics_port), "dis_location_schema_version")
        assert versions == {"Market/Trade/old/2026-11-22": 1, "Market/Trade/new/2026-11-22": 2}, versions

        base = f"http://127.0.0.1:{srv.http_port}"
        with urllib.request.urlopen(f"{base}/v1/tables", timeout=10) as r:
            tables = {(t["namespace"], t["table"]): t for t in json.load(r)["tables"]}
        assert list(TableSchema.from_history_json(tables[("Market", "Trade")]["versions_json"]).versions) == [1, 2]
        with urllib.request.urlopen(f"{base}/v1/locations?namespace=Market&table=Trade", timeout=10) as r:
            http_locs = {loc["internal_partition"]: loc for loc in json.load(r)["locations"]}
        assert (http_locs["old"]["schema_version"], http_locs["new"]["schema_version"]) == (1, 2)

        # dis status: a VERSION column, and schema_version in its JSON
        status = subprocess.run([str(BIN / "dis"), "status", "--address", f"127.0.0.1:{srv.port}", "--json"],
                                capture_output=True, text=True, timeout=60, env=subprocess_env())
        assert status.returncode == 0, status.stderr
        by_ip = {loc["internal_partition"]: loc for loc in json.loads(status.stdout)["locations"]}
        assert (by_ip["old"]["schema_version"], by_ip["new"]["schema_version"]) == (1, 2)
        text = subprocess.run([str(BIN / "dis"), "status", "--address", f"127.0.0.1:{srv.port}"],
                              capture_output=True, text=True, timeout=60, env=subprocess_env()).stdout
        header = next(line for line in text.splitlines() if line.startswith("LOCATION"))
        assert header.split()[:3] == ["LOCATION", "VERSION", "ROWS"], text
        row = next(line for line in text.splitlines() if line.startswith("Market.Trade/old/"))
        assert row.split()[1:3] == ["1", str(N_OLD + 10)], text

    # offline, every location verifies against its own version
    verify = subprocess.run([str(BIN / "dis"), "verify", "--db-root", str(db), "--schemas",
                             str(tmp_path / "schemas-v2"), "--json"],
                            capture_output=True, text=True, timeout=60, env=subprocess_env())
    assert verify.returncode == 0, verify.stdout + verify.stderr
    report = json.loads(verify.stdout)
    assert {loc["location"].split("/")[2]: loc["schema_version"] for loc in report["locations"]} == {"old": 1, "new": 2}
    assert report["bad_count"] == 0


def test_versions_the_dis_does_not_hold_are_refused_naming_what_to_do(tmp_path, v1_db):
    db, logs = v1_db
    with running_dis(db, schemas=schemas_dir(tmp_path, "schemas-v2", V2_YAML)) as srv:
        # newer than the declared version
        e = _refusal(srv, "ahead", write_version_log(logs, V3, "ahead", 0, 3), V3)
        assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "schema version 3 of Market.Trade in the log is newer than the version the DIS declares (2)" in e.details()
        assert "declare it in the table's schema file" in e.details()
        # version 1 under its number with other columns than the version 1 the database holds
        other = TableSchema.from_dict({"namespace": "Market", "table": "Trade",
                                       "columns": [*V1.canonical()["columns"][:3], {"name": "Size", "type": "long"}]})
        e = _refusal(srv, "odd", write_version_log(logs, other, "odd", 0, 3), other)
        assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "schema mismatch: the log's schema differs from table Market.Trade: changed type Size (table int, " \
               "log long)" in e.details(), e.details()
        assert "a changed schema needs a new version number" in e.details()
        assert not any(loc.key.internal_partition in ("ahead", "odd") for loc in srv.engine.locations())
        assert [v.version for v in versionstore.load(str(db), "Market", "Trade")] == [1, 2]


def test_an_older_version_first_seen_in_a_log_is_admitted(tmp_path):
    """A database that only ever knew version 2 receives a version-1 log: version 1 is an
    allowed ancestor (Venue added), so it is stored and the location is written in it; a
    version-1 log whose Size is a long (it would narrow to version 2's int) is refused."""
    logs = tmp_path / "logs"
    logs.mkdir()
    db = tmp_path / "db"
    with running_dis(db, schemas=schemas_dir(tmp_path, "schemas-v2", V2_YAML)) as srv:
        assert [v.version for v in versionstore.load(str(db), "Market", "Trade")] == [2]
        wide = TableSchema.from_dict({"namespace": "Market", "table": "Trade",
                                      "columns": [*V1.canonical()["columns"][:3], {"name": "Size", "type": "long"}]})
        e = _refusal(srv, "wide", write_version_log(logs, wide, "wide", 0, 3), wide)
        assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "version 1 of Market.Trade in the log cannot be admitted" in e.details(), e.details()
        assert "column 'Size'" in e.details(), e.details()
        assert [v.version for v in versionstore.load(str(db), "Market", "Trade")] == [2]

        _ingest(srv, "legacy", write_version_log(logs, V1, "legacy", 0, 12), V1)
        _published(srv, "legacy", 12)
        assert srv.engine.location(key("legacy"), create=False).schema_version == 1
        assert [v.version for v in versionstore.load(str(db), "Market", "Trade")] == [1, 2]
        assert list(srv.engine.schemas.get("Market", "Trade").versions) == [1, 2]
    # and after a restart, the location is still version 1
    with running_dis(db, schemas=tmp_path / "schemas-v2") as srv:
        loc = srv.engine.location(key("legacy"), create=False)
        assert not loc.in_error and loc.schema_version == 1 and loc.published_rows == 12


def _serve_exit(tmp_path, schemas) -> subprocess.CompletedProcess:
    from support import free_port, write_dis_config

    cfg = write_dis_config(tmp_path, free_port(), schemas=schemas)
    return subprocess.run([str(BIN / "dis"), "serve", "--config", str(cfg)], capture_output=True, text=True,
                          timeout=60, env=subprocess_env(), cwd=tmp_path)


def test_dis_serve_refuses_a_schema_change_the_rules_do_not_allow(tmp_path, v1_db):
    db, _logs = v1_db
    before = (db / "Intraday" / "Market" / "Trade" / "schema.versions").read_bytes()
    narrowing = _serve_exit(tmp_path, schemas_dir(tmp_path, "schemas-narrow", NARROWING_YAML))
    assert narrowing.returncode == 2, narrowing.stderr
    assert "Traceback" not in narrowing.stderr
    assert "Market.Trade version 1 -> 2: column 'Size'" in narrowing.stderr, narrowing.stderr
    assert "cannot become short" in narrowing.stderr
    same = _serve_exit(tmp_path, schemas_dir(tmp_path, "schemas-same", SAME_NUMBER_YAML))
    assert same.returncode == 2 and "Traceback" not in same.stderr, same.stderr
    assert "Market.Trade version 1 is stored with other columns (added Venue (string))" in same.stderr, same.stderr
    assert "version: 2" in same.stderr
    # nothing was recorded by the refused starts, and the database still opens as it was
    assert (db / "Intraday" / "Market" / "Trade" / "schema.versions").read_bytes() == before
    with running_dis(db, schemas=tmp_path / "schemas-v1") as srv:
        loc = srv.engine.location(key("old"), create=False)
        assert not loc.in_error and loc.published_rows == N_OLD


def test_dis_serve_refuses_a_damaged_record_of_versions(tmp_path, v1_db):
    db, _logs = v1_db
    record = db / "Intraday" / "Market" / "Trade" / "schema.versions"
    record.write_bytes(record.read_bytes().replace(b'"Size"', b'"Sizf"'))
    r = _serve_exit(tmp_path, tmp_path / "schemas-v1")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"{record}: schema versions record checksum mismatch" in r.stderr, r.stderr
