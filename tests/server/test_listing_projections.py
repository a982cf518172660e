"""A listing resolves the schema version rules for its readers: gRPC ``ListLocations`` and the
block endpoint's ``/v1/locations``, of a DIS and of a ``dis proxy`` in front of it, carry for
each listed version its projection onto the presented version (the newest, or the one asked) —
exactly the shared vectors' (tests/vectors/projections.json), which the JVM reader applies
instead of deriving them.  A version the table does not have, or one without a table, is refused
by name."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import grpc
import pytest
import yaml

from disd.rpc.channel import open_channel
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from support import ROOT, start_dis_server

import versioned_db

VECTORS = json.loads((ROOT / "tests" / "vectors" / "projections.json").read_text(encoding="utf-8"))["evolve"]
NS, TABLE = "Test", "Evolve"


def vector(stored: int, presented: int) -> dict:
    """The shared vectors' projection of Test.Evolve (versioned_db's chain) as a listing has it."""
    assert [v["columns"] for v in VECTORS["versions"]] == [versioned_db.V1.canonical()["columns"],
                                                           versioned_db.V2.canonical()["columns"]]
    p = next(p for p in VECTORS["projections"]
             if (p["stored_version"], p["presented_version"]) == (stored, presented))
    return {"namespace": NS, "table": TABLE, **p}


def from_messages(found) -> list[dict]:
    return [{"namespace": p.namespace, "table": p.table, "stored_version": p.stored_version,
             "presented_version": p.presented_version,
             "columns": [{"name": c.name, "type": c.type, "stored": c.stored or None,
                          "stored_type": c.stored_type or None} for c in p.columns]} for p in found]


def by_version(found: list[dict]) -> dict[int, dict]:
    assert len({p["stored_version"] for p in found}) == len(found), "one projection per listed version"
    return {p["stored_version"]: p for p in found}


@pytest.fixture(scope="module")
def dis(tmp_path_factory):
    """A DIS over versioned_db's database (locations in versions 1 and 2) with version 2's YAML."""
    tmp = tmp_path_factory.mktemp("listing")
    db = versioned_db.build(tmp / "db")
    schemas = versioned_db.write_schema_dir(tmp / "schemas", versioned_db.V2_DICT)
    srv = start_dis_server(db, schemas=schemas)
    yield srv
    srv.stop(0.5)


def grpc_listing(port: int, **request) -> dis_pb2.ListLocationsResponse:
    ch = open_channel(f"127.0.0.1:{port}")
    try:
        return dis_pb2_grpc.TableDataStub(ch).ListLocations(dis_pb2.ListLocationsRequest(**request), timeout=10)
    finally:
        ch.close()


def http_listing(port: int, query: str) -> dict:
    return json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/locations?{query}", timeout=10))


def http_refusal(port: int, query: str) -> tuple[int, str]:
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/locations?{query}", timeout=10)
    return e.value.code, json.loads(e.value.read())["error"]


def check_listings(port: int, http_port: int) -> None:
    """What a DIS (or a proxy of it) at ``port`` / ``http_port`` lists for Test.Evolve."""
    r = grpc_listing(port, namespace=NS, table=TABLE)
    assert sorted(m.schema_version for m in r.locations) == [1, 1, 1, 2]
    assert by_version(from_messages(r.projections)) == {1: vector(1, 2), 2: vector(2, 2)}
    # a reader that presents version 1 (a streaming query that started before version 2)
    r = grpc_listing(port, namespace=NS, table=TABLE, version=1)
    assert by_version(from_messages(r.projections)) == {1: vector(1, 1), 2: vector(2, 1)}

    j = http_listing(http_port, f"namespace={NS}&table={TABLE}")
    assert sorted(x["schema_version"] for x in j["locations"]) == [1, 1, 1, 2]
    assert by_version(j["projections"]) == {1: vector(1, 2), 2: vector(2, 2)}
    j = http_listing(http_port, f"namespace={NS}&table={TABLE}&version=1")
    assert by_version(j["projections"]) == {1: vector(1, 1), 2: vector(2, 1)}
    # every table at once: each presented in its newest version
    j = http_listing(http_port, "")
    assert by_version([p for p in j["projections"] if p["table"] == TABLE]) == {1: vector(1, 2), 2: vector(2, 2)}

    assert http_refusal(http_port, f"namespace={NS}&table={TABLE}&version=7") == (
        404, "Test.Evolve has no schema version 7 here (versions 1, 2)")
    assert http_refusal(http_port, "version=1") == (
        400, "version 1: a listing presents a schema version of one table; give its namespace and table")
    assert http_refusal(http_port, f"namespace={NS}&table={TABLE}&version=two") == (
        400, "version must be a schema version number, got 'two'")
    with pytest.raises(grpc.RpcError) as e:
        grpc_listing(port, namespace=NS, table=TABLE, version=7)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert e.value.details() == "Test.Evolve has no schema version 7 here (versions 1, 2)"
    with pytest.raises(grpc.RpcError) as e:
        grpc_listing(port, version=2)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_dis_listing_carries_each_versions_projection(dis):
    check_listings(dis.port, dis.http_port)


def test_a_proxy_listing_carries_the_same_projections(dis, tmp_path):
    """``dis proxy`` resolves them from the versions its DIS lists (ListTables), by the same rules."""
    from proxy.proxy_support import start_proxy, write_proxy_config

    config, port = write_proxy_config(tmp_path, {"address": f"127.0.0.1:{dis.port}"})
    http_port = yaml.safe_load(config.read_text())["proxy"].get("http_port") or port + 1
    proxy = start_proxy(tmp_path, config)
    try:
        check_listings(port, http_port)
    finally:
        proxy.kill9()


def test_a_proxy_lists_the_versions_of_a_dis_restarted_with_a_newer_one(tmp_path):
    """A proxy reuses its DIS's tables for a few seconds; a location of a version they predate
    (the DIS restarted with a newer YAML) makes it list them again at once, so its listing still
    carries every listed version's projection, presented in the new newest version."""
    from proxy.proxy_support import start_proxy, write_proxy_config
    from support import Feeder, wait_for

    db = versioned_db.build(tmp_path / "db", versions=(1,))
    s1 = versioned_db.write_schema_dir(tmp_path / "schemas-v1", versioned_db.V1_DICT)
    s2 = versioned_db.write_schema_dir(tmp_path / "schemas-v2", versioned_db.V2_DICT)
    srv = start_dis_server(db, schemas=s1)
    port = srv.port
    config, proxy_port = write_proxy_config(tmp_path, {"address": f"127.0.0.1:{port}"})
    proxy = start_proxy(tmp_path, config)
    try:
        j = http_listing(proxy_port + 1, f"namespace={NS}&table={TABLE}")
        assert [p["stored_version"] for p in j["projections"]] == [1]
        assert j["projections"][0]["presented_version"] == 1
        srv.stop(0.5)
        srv = start_dis_server(db, schemas=s2, port=port)
        Feeder(srv).append(versioned_db.V2_LOC, versioned_db.rows(2, 78_000, 2_000))

        def listed_v2() -> dict | None:
            got = http_listing(proxy_port + 1, f"namespace={NS}&table={TABLE}")
            return got if any(x["schema_version"] == 2 for x in got["locations"]) else None

        j = wait_for(listed_v2, 30, 0.05, "the proxy to list the version 2 location")
        assert by_version(j["projections"]) == {1: vector(1, 2), 2: vector(2, 2)}
        r = grpc_listing(proxy_port, namespace=NS, table=TABLE, version=1)
        assert by_version(from_messages(r.projections)) == {1: vector(1, 1), 2: vector(2, 1)}
    finally:
        proxy.kill9()
        srv.stop(0.5)
