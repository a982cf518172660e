"""The Python implementation against the shared test vectors (tests/vectors/README.md): the same
files the JVM reader's tests read (``VectorTests.java``, run by tests/spark/test_jvm_units.py),
so a rule changed on one side and not the other fails that other side's tests."""

from __future__ import annotations

import fnmatch
import json
import math
import struct

import pyarrow as pa
import pytest

from disd.blocks import LocalColumnFiles, LocationSnapshot, read_location
from disd.client import as_read
from disd.config import ConfigError
from disd.names import LocationKey
from disd.routing import load_routing
from disd.schema import ColumnType, TableSchema
from disd.schemaversions import projection
from disd.spark.errors import DisSourceError
from disd.spark.options import parse_options
from disd.storage.engine import location_path

from support import ROOT

VECTORS = ROOT / "tests" / "vectors"


def load(name: str):
    return json.loads((VECTORS / name).read_text(encoding="utf-8"))


def presented(versions: list[dict], version: int) -> TableSchema:
    newest = TableSchema.from_history_json(json.dumps(versions))
    return newest.at_version(version).with_history(newest.versions.values())


PROJECTIONS = load("projections.json")


@pytest.mark.parametrize("chain", sorted(PROJECTIONS))
def test_projections_are_the_listed_ones(chain):
    """What a listing carries for each stored version read as each presented one."""
    case = PROJECTIONS[chain]
    assert len(case["projections"]) == len(case["versions"]) ** 2
    for p in case["projections"]:
        schema = presented(case["versions"], p["presented_version"])
        assert projection(schema, p["stored_version"]).listed() == p["columns"], (chain, p["stored_version"],
                                                                                  p["presented_version"])


COLUMNS = load("columns.json")["cases"]


def _same(t: ColumnType, got: object, want: object) -> bool:
    """A value read equals the vector's (floats bit for bit; NaN, the infinities and -0.0 are
    spelled as strings in JSON; timestamps as nanoseconds)."""
    if want is None or got is None:
        return want is got
    if t in (ColumnType.FLOAT, ColumnType.DOUBLE):
        if want == "NaN":
            return isinstance(got, float) and math.isnan(got)
        w = {"Infinity": math.inf, "-Infinity": -math.inf, "-0.0": -0.0}.get(want, want)
        return struct.pack("<d", got) == struct.pack("<d", float(w))
    return type(got) is type(want) and got == want


@pytest.mark.parametrize("case", COLUMNS, ids=[c["name"] for c in COLUMNS])
def test_column_files_decode_to_the_vectors_values(case):
    """The fixture bytes (the column files of a location in its own version) read as the vector
    says, through the block seam's column-file source and the stored version's projection onto
    the presented one; the projection is the one the case carries (what a listing says)."""
    schema = presented(case["versions"], case["presented_version"])
    assert projection(schema, case["stored_version"]).listed() == case["projection"]
    key = LocationKey(*case["location"])
    snap = LocationSnapshot(key, case["rows"], case["files"], 65536, f"file:{VECTORS / 'columns'}",
                            case["stored_version"])
    with LocalColumnFiles(str(VECTORS / "columns")) as files:
        if "error" in case:
            with pytest.raises(Exception) as e:
                read_location(files, schema, snap, case["columns"], case["start"], case["stop"])
            assert case["error"] in str(e.value), str(e.value)
            return
        t = read_location(files, schema, snap, case["columns"], case["start"], case["stop"])
    t = as_read(schema, t)
    assert t.column_names == list(case["expect"])
    for name, want in case["expect"].items():
        col = t.column(name)
        kind = schema.column(name).type
        if kind is ColumnType.TIMESTAMP:
            col = col.cast(pa.int64())
        got = col.to_pylist()
        assert len(got) == len(want), name
        bad = [(i, g, w) for i, (g, w) in enumerate(zip(got, want)) if not _same(kind, g, w)]
        assert not bad, (name, bad)


def test_the_column_files_are_what_the_writer_encodes():
    """The fixtures are the bytes ``disd.storage.columns`` encodes for the generator's rows: an
    encoding change shows here, and then must be followed by every reader of the vectors."""
    from vectors import generate

    locs = {LocationKey("Vectors", "Types", "p", generate.DAY): (generate.TYPES, generate.TYPE_ROWS)}
    for (ip, v), data in generate.EVOLVE_ROWS.items():
        locs[LocationKey("Vectors", "Evolve", ip, generate.DAY)] = (generate.EVOLVE[v], data)
    for key, (schema, data) in locs.items():
        d = location_path(str(VECTORS / "columns"), key)
        for name, b in generate.column_bytes(schema, data).items():
            with open(f"{d}/{name}", "rb") as f:
                assert f.read() == b, (key, name)


ROUTING = load("routing.json")


@pytest.mark.parametrize("name", sorted(ROUTING))
def test_routing_files_parse_or_fail_as_the_vectors_say(name):
    path = str((VECTORS / "routing" / name).resolve())
    want = ROUTING[name]
    try:
        r = load_routing(path)
    except ConfigError as e:
        assert want.get("error", "").replace("{path}", path) == str(e)
        return
    assert "error" not in want, want

    def listed(replicas) -> list:
        out = []
        for x in replicas:
            host, port = x.address.rsplit(":", 1)
            out.append([x.name, x.address, x.http_address or f"{host}:{int(port) + 1}"])
        return out

    assert [{"name": i.name, "members": listed(i.members), "read_replicas": listed(i.read_replicas)}
            for i in r.instances] == want["instances"]
    for table, owner in want["owners"].items():
        inst = r.owner(*table.split("."))
        assert (None if inst is None else inst.name) == owner, table


OPTIONS = load("options.json")


@pytest.mark.parametrize("case", OPTIONS, ids=[json.dumps(c["options"])[:60] for c in OPTIONS])
def test_options_parse_or_fail_as_the_vectors_say(case):
    try:
        o = parse_options(case["options"])
    except DisSourceError as e:
        assert case.get("error") == str(e)
        return
    assert "error" not in case, case
    parsed = {"namespace": o.namespace, "table": o.table, "address": o.address,
              "columns": None if o.columns is None else list(o.columns),
              "partitions": None if o.partitions is None else sorted(o.partitions),
              "rowsPerPartition": o.rows_per_partition, "timeout": o.timeout_s, "retrySeconds": o.retry_s,
              "maxRowsPerTrigger": o.max_rows_per_trigger, "startingOffsets": o.starting_offsets,
              "minPartitions": o.min_partitions, "batchRows": o.batch_rows}
    assert {k: parsed[k] for k in case["parsed"]} == case["parsed"]


def test_routing_patterns_match_as_the_vectors_say():
    cases = load("globs.json")
    assert [fnmatch.fnmatchcase(name, pattern) for pattern, name, _ in cases] == [m for _, _, m in cases]


def test_misspelt_keys_are_taken_for_the_vectors_closest():
    from disd.config import closest

    cases = load("closest.json")
    assert [closest(name, known) for name, known, _ in cases] == [want for _, _, want in cases]
