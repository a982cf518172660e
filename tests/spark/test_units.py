"""The pure parts of the Spark source, without a Spark session: options, types and batches,
partition pruning, partition planning, streaming offsets and admission control."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows
from pyspark.sql.types import LongType, StringType, StructField, StructType

from disd.binlog import LocationKey
from disd.blocks import LocationSnapshot
from disd.schema import TableSchema
from disd.security import ClientSecurity as Security
from disd.spark.arrow import projection, spark_schema, to_batch
from disd.values import char_strings
from disd.spark.errors import DisSourceError
from disd.spark.filters import PartitionFilter
from disd.spark.options import parse_options
from disd.spark.plan import Range, ReadSpec, plan_partitions, split_size
from disd.spark.source import admit, water_fill

ALL = TableSchema.from_dict({
    "namespace": "Test", "table": "AllTypes",
    "columns": [{"name": n, "type": n.lower()}
                for n in ["Bool", "Byte", "Short", "Int", "Long", "Float", "Double", "Char", "String", "Timestamp"]],
})
BASE = {"address": "127.0.0.1:22021", "namespace": "Market", "table": "Trade"}


# -- options ------------------------------------------------------------------------------------
def test_options_defaults_and_forms():
    o = parse_options(BASE)
    assert (o.namespace, o.table, o.address, o.routing) == ("Market", "Trade", "127.0.0.1:22021", None)
    assert o.columns is None and o.partitions is None and o.max_rows_per_trigger is None
    o = parse_options({"ADDRESS": "h:1", "Table": "Market.Trade", "Columns": " Sym , Price ",
                       "partitions": "2026-11-22,2026-11-23", "maxRowsPerTrigger": "1_000"})
    assert (o.namespace, o.table) == ("Market", "Trade")
    assert o.columns == ("Sym", "Price")
    assert o.partitions == {"2026-11-22", "2026-11-23"}
    assert o.max_rows_per_trigger == 1000
    assert parse_options({"address": "h:1", "path": "Market.Quote"}).table == "Quote"


@pytest.mark.parametrize("opts, words", [
    ({}, "'address'"),
    ({"namespace": "Market", "table": "Trade"}, "option 'address'"),
    ({**BASE, "routing": "/nope.yaml"}, "not both"),
    ({**BASE, "address": "nohost"}, "host:port"),
    ({"address": "h:1", "table": "Trade"}, "'namespace'"),
    ({**BASE, "colums": "Sym"}, "unknown option 'colums'"),
    ({**BASE, "columns": ","}, "'columns' is empty"),
    ({**BASE, "columns": "Sym,Sym"}, "twice"),
    ({**BASE, "rowsPerPartition": "many"}, "'rowsPerPartition' must be an integer"),
    ({**BASE, "maxRowsPerTrigger": "0"}, "at least 1"),
    ({**BASE, "timeout": "-1"}, "'timeout' must be positive"),
    ({**BASE, "startingOffsets": "middle"}, "'startingOffsets'"),
    ({**BASE, "cert": "/nope.pem"}, "option 'cert'"),
    ({"routing": "/nope/routing.yaml", "namespace": "M", "table": "T"}, "no such file"),
])
def test_bad_options_say_which_and_why(opts, words):
    with pytest.raises(DisSourceError, match="dis source") as e:
        parse_options(opts)
    assert words in str(e.value)


def test_token_file(tmp_path):
    p = tmp_path / "token"
    p.write_text("s3cret\n")
    o = parse_options({**BASE, "tokenFile": str(p)})
    assert o.security.token == "s3cret"
    assert o.security.client_security().token == "s3cret"
    assert Security().client_security() is None


# -- types and batches --------------------------------------------------------------------------
def test_spark_schema_matches_table_and_partition_column(trade_schema):
    s = spark_schema(trade_schema)
    assert [f.name for f in s] == ["Timestamp", "Sym", "Price", "Size", "Date"]
    assert s["Date"].dataType == StringType() and not s["Date"].nullable
    assert [f.name for f in spark_schema(trade_schema, ("price", "Date"))] == ["Price", "Date"]
    with pytest.raises(DisSourceError, match="no column 'Nope'"):
        spark_schema(trade_schema, ("Nope",))


def test_char_strings_is_utf8_of_each_code_unit():
    vals = [65, 0xE9, 0x20AC, 0xD800, None, 0x7F, 0x80, 0x7FF, 0x800]
    arr = pa.array(vals, pa.uint16())
    out = char_strings(arr)
    assert out.to_pylist() == ["A", "é", "€", "\ufffd", None, "\x7f", "\x80", "\u07ff", "\u0800"]
    assert char_strings(arr.slice(2, 3)).to_pylist() == ["€", "\ufffd", None]


def all_types_table(n: int) -> pa.Table:
    rng = np.random.default_rng(3)
    cols = {
        "Bool": pa.array(rng.integers(0, 2, n).astype(bool)),
        "Byte": pa.array(rng.integers(-100, 100, n).astype(np.int8)),
        "Short": pa.array(rng.integers(-1000, 1000, n).astype(np.int16)),
        "Int": pa.array(rng.integers(-10**6, 10**6, n).astype(np.int32)),
        "Long": pa.array(rng.integers(-10**12, 10**12, n)),
        "Float": pa.array(rng.random(n).astype(np.float32)),
        "Double": pa.array(rng.random(n)),
        "Char": pa.array(rng.integers(32, 0x3000, n).astype(np.uint16)),
        "String": pa.array([f"s{i}" for i in range(n)]),
        "Timestamp": pa.array(1_700_000_000_000_000_123 + np.arange(n) * 1001).cast(pa.timestamp("ns", tz="UTC")),
    }
    mask = pa.array(np.arange(n) % 5 == 2)
    cols = {k: pa.compute.if_else(mask, pa.nulls(n, v.type), v) for k, v in cols.items()}
    return pa.table(cols)


def test_batches_match_spark_arrow_schema_exactly():
    schema = spark_schema(ALL)
    proj = projection(ALL, schema)
    target = to_arrow_schema(schema, timezone="UTC")
    assert proj.arrow_schema() == target
    t = all_types_table(50)
    b = to_batch(proj, target, t, 50, "2026-11-22")
    assert b.schema.equals(target)  # what Spark checks, nullability included
    assert b.column("Date").to_pylist() == ["2026-11-22"] * 50
    assert b.column("Timestamp").type == pa.timestamp("us", tz="UTC")
    assert b.column("Timestamp")[0].value == 1_700_000_000_000_000  # ns truncated to us
    for name in ["Bool", "Byte", "Short", "Int", "Long", "Float", "Double", "String"]:
        assert b.column(name).to_pylist() == t.column(name).to_pylist(), name
    assert b.column("Char").to_pylist() == [None if c is None else chr(c) for c in t.column("Char").to_pylist()]
    assert b.column("Long").null_count == 10


def test_user_schema_subset_case_and_cast(trade_schema):
    user = StructType([StructField("date", StringType()), StructField("size", LongType()),
                       StructField("Sym", StringType())])
    proj = projection(trade_schema, user)
    assert proj.fetch == ["Size", "Sym"]
    target = to_arrow_schema(user, timezone="UTC")
    t = pa.table({"Size": pa.array([1, 2], pa.int32()), "Sym": pa.array(["a", None])})
    b = to_batch(proj, target, t, 2, "2026-11-22")
    assert b.schema.equals(target)
    assert b.to_pydict() == {"date": ["2026-11-22"] * 2, "size": [1, 2], "Sym": ["a", None]}
    with pytest.raises(DisSourceError, match="not a column"):
        projection(trade_schema, StructType([StructField("Nope", StringType())]))
    from pyspark.sql.types import ArrayType

    with pytest.raises(DisSourceError, match="cannot read it as"):
        projection(trade_schema, StructType([StructField("Price", ArrayType(StringType()))]))


def test_only_partition_column():
    proj = projection(ALL, StructType([StructField("Date", StringType(), False)]))
    assert proj.fetch == []
    target = proj.arrow_schema()
    b = to_batch(proj, target, None, 3, "x")
    assert b.num_rows == 3 and b.schema.equals(target)


# -- partition pruning --------------------------------------------------------------------------
DATES = ["2026-11-21", "2026-11-22", "2026-11-23", "2026-11-24"]


def test_the_partitions_option_selects_locations():
    assert PartitionFilter("Date").select(DATES) == DATES
    assert PartitionFilter("Date", frozenset(["2026-11-22", "1999-01-01"])).select(DATES) == ["2026-11-22"]
    assert PartitionFilter("Date", frozenset()).select(DATES) == []


# -- planning -----------------------------------------------------------------------------------
def snap(ip: str, cp: str, rows: int) -> LocationSnapshot:
    return LocationSnapshot(LocationKey("Market", "Trade", ip, cp), rows, {"Size.dat": rows * 4}, 65536, "h:1")


SPEC = ReadSpec(projection(ALL, spark_schema(ALL)), Security(), 30.0, 1 << 19)


def covered(parts) -> dict:
    out: dict = {}
    for p in parts:
        for s in p.slices:
            out.setdefault((s.internal_partition, s.column_partition), []).append((s.start, s.stop))
    return {k: sorted(v) for k, v in out.items()}


def test_large_locations_split_so_every_core_works():
    parts = plan_partitions([Range(snap("a", "d1", 10_000_000), 0, 10_000_000)], SPEC, 4 << 20, 2)
    assert len(parts) == 4 and len(parts) % 2 == 0
    ranges = covered(parts)[("a", "d1")]
    assert ranges[0][0] == 0 and ranges[-1][1] == 10_000_000
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))  # no gap, no overlap
    assert all(r[0] % 65536 == 0 for r in ranges)  # block-aligned splits
    assert min(p.rows for p in parts) >= 0.85 * max(p.rows for p in parts)  # balanced tasks


def test_small_locations_share_a_partition_and_nothing_is_lost():
    ranges = [Range(snap(f"f{i}", "d", 1000 + i), 0, 1000 + i) for i in range(10)]
    parts = plan_partitions(ranges, SPEC, 4 << 20, 2)
    assert len(parts) == 1
    assert sum(p.rows for p in parts) == sum(1000 + i for i in range(10))
    # forced splitting by a small rowsPerPartition
    parts = plan_partitions(ranges, SPEC, 2000, 2)
    assert len(parts) >= 5
    assert covered(parts) == covered(plan_partitions(ranges, SPEC, 10**9, 1)) or all(
        sum(b - a for a, b in v) == 1000 + int(k[0][1:]) for k, v in covered(parts).items())


def test_planning_from_offsets_and_pickling():
    ranges = [Range(snap("a", "d", 500), 200, 500), Range(snap("b", "d", 10), 10, 10)]
    parts = plan_partitions(ranges, SPEC, 100, 2)
    assert covered(parts) == {("a", "d"): [(200, 300), (300, 400), (400, 500)]}
    p = pickle.loads(pickle.dumps(parts[0]))
    assert p.slices == parts[0].slices and p.spec == SPEC
    assert plan_partitions([], SPEC, 100, 2) == []
    assert split_size(0, 100, 2)[1] == 0


# -- streaming admission ------------------------------------------------------------------------
def test_water_fill_shares_evenly():
    assert water_fill({"a": 100, "b": 5, "c": 100}, 65) == {"a": 30, "b": 5, "c": 30}
    assert water_fill({"a": 3}, 10) == {"a": 3}
    assert sum(water_fill({"a": 7, "b": 7, "c": 7}, 10).values()) == 10
    assert water_fill({"a": 0, "b": 9}, 1) == {"a": 0, "b": 1}


def test_admit_respects_limits_and_never_goes_back():
    start = {"x/d1": 10}
    avail = {"x/d1": 50, "y/d2": 100}
    assert admit(start, avail, ReadAllAvailable()) == {"x/d1": 50, "y/d2": 100}
    end = admit(start, avail, ReadMaxRows(30))
    assert end == {"x/d1": 25, "y/d2": 15}
    assert list(end) == sorted(end)
    assert admit(start, avail, ReadMinRows(1000)) == start
    # a location that (after a DIS restart) reports fewer rows never moves backwards
    assert admit({"x/d1": 60}, {"x/d1": 50}, ReadAllAvailable()) == {"x/d1": 60}
