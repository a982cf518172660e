"""Write the test vectors of this folder (README.md) from their cases and the Python rules.

    .venv/bin/python tests/vectors/generate.py

The cases are spelled out below; the expected answers are what the Python implementation gives
today.  Run this only when a rule changes on purpose, and review the diff: the vectors are the
contract both implementations are tested against (tests/test_vectors.py for Python,
``jvm/src/test/java/disd/spark/VectorTests.java`` through tests/spark/test_jvm_units.py for
Java), so a change to one side that the other does not follow fails the other's tests.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import pathlib
import shutil
import sys

import numpy as np
import pyarrow as pa
import yaml

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: support

from disd.config import ConfigError  # noqa: E402
from disd.names import LocationKey  # noqa: E402
from disd.routing import load_routing  # noqa: E402
from disd.schema import ColumnType, TableSchema  # noqa: E402
from disd.schemaversions import check_chain, projection  # noqa: E402
from disd.spark.errors import DisSourceError  # noqa: E402
from disd.spark.options import parse_options  # noqa: E402
from disd.storage.columns import encode_fixed, encode_string  # noqa: E402
from disd.storage.engine import location_path  # noqa: E402

#: Stands for the absolute path of a routing file in expected messages (each side puts its own).
PATH = "{path}"


def dump(path: pathlib.Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False, sort_keys=False) + "\n", encoding="utf-8")


# -- schema version chains: the projection a listing carries ------------------------------------
def chain(*versions: list[tuple]) -> list[dict]:
    """Canonical dicts of versions 1.. of table V.T, each a list of (name, type[, renamed_from])."""
    return [{"namespace": "V", "table": "T", "partition_column": "Date", "version": i + 1,
             "columns": [{"name": c[0], "type": c[1]} | ({"renamed_from": c[2]} if len(c) > 2 else {}) for c in cols]}
            for i, cols in enumerate(versions)]


CHAINS = {
    # tests/versioned_db.py's Test.Evolve: widen, rename and widen, drop, add
    "evolve": chain([("Id", "int"), ("Px", "float"), ("Sym", "string"), ("Gone", "string"), ("Qty", "int")],
                    [("Id", "long"), ("Sym", "string"), ("Price", "double", "Px"), ("Qty", "int"),
                     ("New", "string")]),
    # every widening
    "widenings": chain([("B1", "byte"), ("B2", "byte"), ("B3", "byte"), ("S1", "short"), ("S2", "short"),
                        ("I", "int"), ("F", "float")],
                       [("B1", "short"), ("B2", "int"), ("B3", "long"), ("S1", "int"), ("S2", "long"), ("I", "long"),
                        ("F", "double")]),
    # a swap of two names is two renames
    "swap": chain([("A", "int"), ("B", "string")], [("B", "int", "A"), ("A", "string", "B")]),
    # three versions: a rename into a name freed by a drop, a stale renamed_from kept, re-added name
    "three": chain([("X", "int"), ("Y", "string"), ("Z", "double")],
                   [("W", "int", "X"), ("X", "string", "Y"), ("Z", "double")],
                   [("W", "long"), ("X", "string", "Y"), ("Y", "char")]),
    # a column dropped and a new one of the same name added later: not the old column
    "readded": chain([("K", "int"), ("Old", "string")], [("K", "int")], [("K", "int"), ("Old", "long")]),
}


def projections() -> dict:
    out = {}
    for name, versions in CHAINS.items():
        newest = TableSchema.from_history_json(json.dumps(versions))
        check_chain(newest.versions.values())  # a vector of a change the rules refuse would test nothing
        cases = []
        for presented in newest.versions:
            schema = newest.at_version(presented).with_history(newest.versions.values())
            for stored in newest.versions:
                cases.append({"stored_version": stored, "presented_version": presented,
                              "columns": projection(schema, stored).listed()})
        out[name] = {"versions": versions, "projections": cases}
    return out


# -- column files: bytes in, values as readers get them out -------------------------------------
TYPES = TableSchema.from_dict({"namespace": "Vectors", "table": "Types", "partition_column": "Date", "columns": [
    {"name": "Flag", "type": "bool"}, {"name": "B", "type": "byte"}, {"name": "S", "type": "short"},
    {"name": "I", "type": "int"}, {"name": "L", "type": "long"}, {"name": "F", "type": "float"},
    {"name": "D", "type": "double"}, {"name": "C", "type": "char"}, {"name": "Str", "type": "string"},
    {"name": "Ts", "type": "timestamp"}]})
F32_MAX = float(np.finfo(np.float32).max)
TYPE_ROWS = {
    "Flag": [True, False, None, True, False, True, None, False, True, True, False, None],
    "B": [0, 1, None, -127, 127, -1, 5, None, 42, -42, 7, 8],
    "S": [0, -32767, 32767, None, 300, -300, 1, 2, None, 4, 5, 6],
    "I": [0, -(2**31) + 1, 2**31 - 1, 17, None, -17, 100_000, None, 3, 4, 5, 6],
    "L": [0, -(2**63) + 1, 2**63 - 1, None, 10**12, -(10**12), 1, 2, 3, None, 5, 6],
    "F": [0.0, -0.0, 1.5, None, F32_MAX, float(np.float32(-3e38)), float("inf"), float("-inf"), float("nan"),
          float(np.float32(0.1)), None, 2.25],
    "D": [0.0, -0.0, 0.1, None, 1e300, -1e300, float("inf"), float("-inf"), float("nan"), 2.5, None, -7.75],
    # UTF-16 code units: ASCII, Latin-1, the euro sign, a lone surrogate (read as U+FFFD), NUL
    "C": [ord("A"), 0xE9, 0x20AC, 0xD800, None, ord("z"), 0, 0xDFFF, ord("A"), None, 0xFFFE, ord("b")],
    "Str": ["", None, "abc", "€uro", "日本語", "😀 x", "a" * 300, "abc", None, "", "abc", "z"],
    # nanoseconds; a reader presenting microseconds truncates toward zero
    "Ts": [0, -1500, 1_763_800_000_123_456_789, None, 1, -1, 999, -999_999, 2**62, None, 1000, -1000],
}
EVOLVE_CHAIN = [{**v, "namespace": "Vectors", "table": "Evolve"} for v in CHAINS["evolve"]]
EVOLVE = {v["version"]: TableSchema.from_dict(v) for v in EVOLVE_CHAIN}
EVOLVE_NEWEST = TableSchema.from_history_json(json.dumps(EVOLVE_CHAIN))
EVOLVE_ROWS = {
    # version 1 rows: extremes of the old types next to their nulls
    ("v1", 1): {"Id": [1, None, 2**31 - 1, -(2**31) + 1, 5], "Px": [0.5, None, F32_MAX, -2.25, float(np.float32(0.1))],
                "Sym": ["a", None, "bb", "", "ccc"], "Gone": ["g0", "g1", None, "g3", "g4"],
                "Qty": [1, 2, None, 2**31 - 1, -5]},
    # version 2 rows whose values fit version 1's types
    ("v2", 2): {"Id": [7, None, 2**31 - 1, -(2**31)], "Sym": ["x", "y", None, "w"],
                "Price": [0.25, None, -1e30, float("inf")], "Qty": [3, None, 4, 5], "New": ["n0", None, "n2", "n3"]},
    # version 2 rows with an Id no int can hold
    ("v2big", 2): {"Id": [1, 2**40], "Sym": ["p", "q"], "Price": [1.0, 2.0], "Qty": [1, 2], "New": ["a", "b"]},
}
DAY = "2026-01-01"


def _arrow(col, values: list) -> pa.Array:  # disd.schema.Column
    t = col.type
    if t is ColumnType.CHAR:
        return pa.array(values, pa.uint16())
    if t is ColumnType.TIMESTAMP:
        return pa.array(values, pa.int64()).cast(t.arrow_type)
    return pa.array(values, t.arrow_type)


def column_bytes(schema: TableSchema, data: dict) -> dict[str, bytes]:
    """The column files of rows ``data`` written from row 0 (``disd.storage.columns``)."""
    out = {}
    for col in schema.columns:
        arr = _arrow(col, data[col.name])
        if col.type is ColumnType.STRING:
            ends, _lens, raw = encode_string(arr, 0)
            out[f"{col.name}.off"] = ends.astype("<u8").tobytes()
            out[f"{col.name}.dat"] = bytes(raw)
        else:
            out[f"{col.name}.dat"] = np.ascontiguousarray(encode_fixed(col, arr)).astype(
                col.type.numpy_dtype.newbyteorder("<")).tobytes()
    return out


def as_read(t: ColumnType | None, v: object) -> object:
    """A value as readers get it, in JSON: chars as one-character strings (a lone surrogate
    U+FFFD, the sentinel null), floats that JSON cannot hold as strings."""
    if v is None or t is None:
        return v
    if t is ColumnType.CHAR:
        return "\ufffd" if 0xD800 <= v <= 0xDFFF else chr(v)
    if t in (ColumnType.FLOAT, ColumnType.DOUBLE):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "Infinity" if v > 0 else "-Infinity"
        if v == 0 and math.copysign(1, v) < 0:
            return "-0.0"
    return v


def columns(root: pathlib.Path) -> dict:
    """The database root ``columns/`` and the reads of it, each with its expected values."""
    if root.exists():
        shutil.rmtree(root)
    locs = {LocationKey("Vectors", "Types", "p", DAY): (TYPES, TYPE_ROWS)}
    for (ip, v), data in EVOLVE_ROWS.items():
        locs[LocationKey("Vectors", "Evolve", ip, DAY)] = (EVOLVE[v], data)
    sizes = {}
    for key, (schema, data) in locs.items():
        d = pathlib.Path(location_path(str(root), key))
        d.mkdir(parents=True)
        files = column_bytes(schema, data)
        for name, b in files.items():
            (d / name).write_bytes(b)
        sizes[key] = ({n: len(b) for n, b in sorted(files.items())}, len(next(iter(data.values()))))

    def case(name: str, key: LocationKey, stored: TableSchema, newest: TableSchema, presented: int,
             cols: list[str] | None, start: int, stop: int, error: str | None = None) -> dict:
        schema = newest.at_version(presented).with_history(newest.versions.values())
        proj = projection(schema, stored.version, cols)
        files, rows = sizes[key]
        out = {"name": name, "location": [key.namespace, key.table, key.internal_partition, key.column_partition],
               "rows": rows, "files": files, "versions": [s.canonical() for s in newest.versions.values()],
               "stored_version": stored.version, "presented_version": presented,
               "projection": projection(schema, stored.version).listed(), "columns": cols, "start": start,
               "stop": stop}
        if error is not None:
            out["error"] = error
            return out
        data = locs[key][1]
        expect = {}
        for c, src in proj.sources.items():
            t = schema.column(c).type
            values = [None] * (stop - start) if src is None else data[src][start:stop]
            if src is not None and t is ColumnType.FLOAT and stored.column(src).type is ColumnType.DOUBLE:
                values = [None if x is None else float(np.float32(x)) for x in values]
            expect[c] = [as_read(t, x) for x in values]
        out["expect"] = expect
        return out

    types = TYPES.with_history([])
    n = len(TYPE_ROWS["I"])
    cases = [
        case("every type, every row", LocationKey("Vectors", "Types", "p", DAY), TYPES, types, 1, None, 0, n),
        case("every type, rows from the middle", LocationKey("Vectors", "Types", "p", DAY), TYPES, types, 1, None,
             3, 10),
        case("the last row, two columns in another order", LocationKey("Vectors", "Types", "p", DAY), TYPES, types,
             1, ["Str", "C"], n - 1, n),
        case("version 1 read as version 2: widened, renamed, added, dropped", LocationKey("Vectors", "Evolve", "v1", DAY),
             EVOLVE[1], EVOLVE_NEWEST, 2, None, 0, 5),
        case("version 1 read as version 2, some columns", LocationKey("Vectors", "Evolve", "v1", DAY), EVOLVE[1],
             EVOLVE_NEWEST, 2, ["New", "Price", "Qty"], 1, 4),
        case("version 2 read as version 1: narrowed back, renamed back, dropped since is null",
             LocationKey("Vectors", "Evolve", "v2", DAY), EVOLVE[2], EVOLVE_NEWEST, 1, None, 0, 4),
        case("version 2 read as version 1: a value the older type cannot hold", LocationKey("Vectors", "Evolve",
             "v2big", DAY), EVOLVE[2], EVOLVE_NEWEST, 1, ["Id"], 0, 2, error=str(2**40)),
    ]
    return {"cases": cases}


# -- routing files ------------------------------------------------------------------------------
R1 = {"name": "a1", "address": "127.0.0.1:22021"}
R2 = {"name": "a2", "address": "127.0.0.2:22021", "http_address": "127.0.0.2:9000"}
ROUTING = {
    "replicas": {"instances": [{"name": "market", "tables": ["Market.*"], "replicas": [R1, R2]},
                               {"address": "h:5", "http_address": "h:7"}]},
    "one-replica": {"instances": [{"replicas": [{"address": "h:1"}]}]},
    "proxies": {"instances": [
        {"name": "market", "tables": ["Market.*"], "address": "10.0.0.1:22021",
         "proxies": [{"name": "tdcp-1", "address": "10.0.1.1:22051"},
                     {"name": "tdcp-2", "address": "10.0.1.2:22051", "http_address": "10.0.1.2:9000"}]},
        {"name": "plain", "address": "10.0.0.4:22021", "tables": ["Plain.*", "M?rket.Q*"]},
        {"name": "rest", "tables": ["*"], "replicas": [{"name": "b1", "address": "10.0.0.2:22021"},
                                                       {"name": "b2", "address": "10.0.0.3:22021"}],
         "proxies": [{"address": "10.0.1.3:22051"}]}]},
    "address-and-replicas": {"instances": [{"address": "h:1", "replicas": [R1]}]},
    "no-replicas": {"instances": [{"replicas": []}]},
    "replicas-not-a-list": {"instances": [{"replicas": "h:1"}]},
    "http-on-a-set": {"instances": [{"replicas": [R1], "http_address": "h:2"}]},
    "same-replica-twice": {"instances": [{"replicas": [R1, {"address": "127.0.0.1:22021"}]}]},
    "replica-without-address": {"instances": [{"replicas": [R1, {"name": "x"}]}]},
    "replica-not-host-port": {"instances": [{"replicas": [R1, {"address": "nohost"}]}]},
    "bad-http-address": {"instances": [{"replicas": [{"address": "h:1", "http_address": "h"}]}]},
    "unknown-replica-key": {"instances": [{"replicas": [{"address": "h:1", "port": 5}]}]},
    "replica-not-a-mapping": {"instances": [{"replicas": ["h:1"]}]},
    "address-not-a-string": {"instances": [{"replicas": [{"address": 5}]}]},
    "empty-pattern": {"instances": [{"replicas": [R1], "tables": ["Market.*", ""]}]},
    "unknown-key": {"instances": [{"address": "h:1", "colour": "red"}]},
    "no-instances": {"instances": []},
    "misspelt-instances": {"instance": [{"address": "h:1"}]},
    "not-a-mapping": ["h:1"],
    "empty-proxies": {"instances": [{"address": "h:1", "proxies": []}]},
    "proxies-not-a-list": {"instances": [{"address": "h:1", "proxies": "p:1"}]},
    "proxy-without-address": {"instances": [{"address": "h:1", "proxies": [{"name": "x"}]}]},
    "proxy-not-host-port": {"instances": [{"address": "h:1", "proxies": [{"address": "nohost"}]}]},
    "same-proxy-twice": {"instances": [{"address": "h:1", "proxies": [{"address": "p:1"}, {"address": "p:1"}]}]},
    "proxy-at-the-dis": {"instances": [{"address": "h:1", "proxies": [{"address": "h:1"}]}]},
    "proxy-bad-http": {"instances": [{"address": "h:1", "proxies": [{"address": "p:1", "http_address": "p"}]}]},
    "unknown-proxy-key": {"instances": [{"address": "h:1", "proxies": [{"address": "p:1", "port": 5}]}]},
    "proxy-not-a-mapping": {"instances": [{"address": "h:1", "proxies": ["p:1"]}]},
    "proxy-at-a-replica": {"instances": [{"replicas": [{"address": "h:1"}, {"address": "h:2"}],
                                          "proxies": [{"address": "h:2"}]}]},
    "misspelt-address": {"instances": [{"adress": "h:1"}]},
    "misspelt-tables": {"instances": [{"address": "h:1", "table": ["A.*"]}]},
    "misspelt-replicas": {"instances": [{"replica": [{"address": "h:1"}]}]},
    "misspelt-http-address": {"instances": [{"replicas": [{"address": "h:1", "http_adress": "h:2"}]}]},
    "misspelt-proxies": {"instances": [{"address": "h:1", "proxy": [{"address": "p:1"}]}]},
    "two-unknown-keys": {"instances": [{"address": "h:1", "zeta": 1, "alpha": 2}]},
}
#: Tables whose owner each routing file is asked for.
OWNED = ["Market.Trade", "Market.Quote", "Plain.X", "Other.T", "A.B"]


def plus_one(address: str) -> str:
    host, port = address.rsplit(":", 1)
    return f"{host}:{int(port) + 1}"


def routing(folder: pathlib.Path) -> dict:
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir()
    out = {}
    for name, data in ROUTING.items():
        path = folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        try:
            r = load_routing(str(path))
        except ConfigError as e:
            out[path.name] = {"error": str(e).replace(str(path), PATH)}
            continue

        def listed(replicas) -> list:
            return [[x.name, x.address, x.http_address or plus_one(x.address)] for x in replicas]

        out[path.name] = {
            "instances": [{"name": i.name, "members": listed(i.members), "read_replicas": listed(i.read_replicas)}
                          for i in r.instances],
            "owners": {t: (None if r.owner(*t.split(".")) is None else r.owner(*t.split(".")).name) for t in OWNED}}
    return out


# -- options of the Spark source ----------------------------------------------------------------
BASE = {"address": "127.0.0.1:22021", "namespace": "Market", "table": "Trade"}
OPTIONS = [
    {}, {"namespace": "Market", "table": "Trade"}, {**BASE, "address": "nohost"}, {**BASE, "address": "h:x"},
    {"address": "h:1", "table": "Trade"}, {**BASE, "colums": "Sym"}, {**BASE, "columns": ","},
    {**BASE, "columns": "Sym,Sym"}, {**BASE, "columns": " Sym , Price "}, {**BASE, "partitions": " , "},
    {**BASE, "partitions": "2026-11-22,2026-11-23"}, {**BASE, "rowsPerPartition": "many"},
    {**BASE, "rowsPerPartition": "1_000"}, {**BASE, "rowsPerPartition": "0"}, {**BASE, "minPartitions": "3"},
    {**BASE, "batchRows": "700"}, {**BASE, "maxRowsPerTrigger": "0"}, {**BASE, "maxRowsPerTrigger": "10"},
    {**BASE, "timeout": "-1"}, {**BASE, "timeout": "soon"}, {**BASE, "timeout": "5s"},
    {**BASE, "retrySeconds": "0"}, {**BASE, "retrySeconds": "-1"}, {**BASE, "retrySeconds": "2.5s"},
    {**BASE, "startingOffsets": "middle"}, {**BASE, "startingOffsets": "LATEST"}, {**BASE, "cert": "/nope.pem"},
    {**BASE, "ca": "/nope.pem"}, {**BASE, "token": "a", "tokenFile": "/x"}, {**BASE, "tokenFile": "/nope/token"},
    {"routing": "/nope/routing.yaml", "namespace": "M", "table": "T"},
    {**BASE, "routing": "/nope/routing.yaml"}, {**BASE, "dbRoot": "/"}, {"address": "h:1", "path": "Trade"},
    {"address": "h:1", "path": "Market.Trade"}, {"address": "h:1", "namespace": "Market", "path": "Trade"},
    BASE, {**BASE, "table": "Market.Trade", "namespace": ""}, {**BASE, "source": "intraday"},
    {**BASE, "source": "nope"}, {**BASE, "schemas": "/x"}, {"ADDRESS": "h:2", "Namespace": "Market", "TABLE": "Trade"},
    {**BASE, "httpAddress": "nohost"}, {**BASE, "pushAggregates": "maybe"}, {**BASE, "reader": "python"},
]
#: Options only the JVM reader uses, which it alone checks (the Python reader accepts and ignores
#: them): the JVM reader's own answer, where it differs.
JVM_ERRORS = {
    json.dumps({**BASE, "httpAddress": "nohost"}): "dis source: option 'httpAddress' must be host:port, got 'nohost'",
    json.dumps({**BASE, "pushAggregates": "maybe"}): "dis source: option 'pushAggregates' must be true or false, "
                                                     "got 'maybe'",
}
#: What an accepted set of options must parse to, in both readers (their own defaults differ for
#: batchRows and minPartitions: those are compared only when given).
PARSED = ["namespace", "table", "address", "columns", "partitions", "rowsPerPartition", "timeout", "retrySeconds",
          "maxRowsPerTrigger", "startingOffsets"]


def options() -> list:
    out = []
    for case in OPTIONS:
        try:
            o = parse_options(case)
        except DisSourceError as e:
            out.append({"options": case, "error": str(e)})
            continue
        parsed = {"namespace": o.namespace, "table": o.table, "address": o.address,
                  "columns": None if o.columns is None else list(o.columns),
                  "partitions": None if o.partitions is None else sorted(o.partitions),
                  "rowsPerPartition": o.rows_per_partition, "timeout": o.timeout_s, "retrySeconds": o.retry_s,
                  "maxRowsPerTrigger": o.max_rows_per_trigger, "startingOffsets": o.starting_offsets}
        lower = {k.lower() for k in case}
        if "minpartitions" in lower:
            parsed["minPartitions"] = o.min_partitions
        if "batchrows" in lower:
            parsed["batchRows"] = o.batch_rows
        entry = {"options": case, "parsed": parsed}
        if json.dumps(case) in JVM_ERRORS:
            entry["jvm_error"] = JVM_ERRORS[json.dumps(case)]
        out.append(entry)
    return out


# -- shell patterns of routing entries ----------------------------------------------------------
GLOBS = [["Market.*", "Market.Trade"], ["Market.*", "Other.Trade"], ["*", "A.B"], ["M?rket.T[a-z]ade", "Market.Trade"],
         ["M[!a]rket.*", "Market.X"], ["M[!a]rket.*", "Mxrket.X"], ["Market.Trade", "Market.Trades"],
         ["*.Q*", "Market.Quote"], ["Market.T(r)ade", "Market.T(r)ade"], ["Market.T(r)ade", "Market.Trade"],
         ["a+b.$^", "a+b.$^"], ["a[b", "a[b"], ["[]]x", "]x"], ["[a-c]*", "b.T"], ["[a-c]*", "d.T"],
         ["x{1}", "x{1}"], ["x{1}", "x"], ["M\\a.*", "M\\a.T"], ["*", ""], ["?", ""], ["Market.[!T]*", "Market.Quote"]]


def globs() -> list:
    return [[p, name, fnmatch.fnmatchcase(name, p)] for p, name in GLOBS]


# -- the closest known key a misspelt one is taken for (disd.config.closest: difflib) ------------
KEYS = ["address", "http_address", "name", "proxies", "replicas", "tables"]
MISSPELT = ["adress", "addres", "adresss", "http_adress", "httpaddress", "http", "nmae", "names", "proxy", "proxys",
            "replica", "replicaset", "table", "tabels", "tbl", "zeta", "", "a", "ab", "sser", "sserdda", "ADDRESS",
            "replicas_", "_replicas", "tables2", "prox", "xeilorp", "p", "nam", "me", "ess", "http_addr",
            "http_address_", "res", "eplicas", "abcabcab", "aaaa", "instance", "instancess", "instnaces"]
KEY_SETS = [KEYS, ["instances"], ["address", "routing", "namespace", "table", "columns", "partitions"],
            ["aaab", "aaba", "abaa", "baaa"], ["abc", "acb", "bac", "bca", "cab", "cba"]]


def closest_cases() -> list:
    from disd.config import closest

    return [[name, known, closest(name, known)] for known in KEY_SETS for name in MISSPELT + known[:2]]


def main() -> None:
    os.umask(0o022)
    dump(HERE / "projections.json", projections())
    dump(HERE / "columns.json", columns(HERE / "columns"))
    dump(HERE / "routing.json", routing(HERE / "routing"))
    dump(HERE / "options.json", options())
    dump(HERE / "globs.json", globs())
    dump(HERE / "closest.json", closest_cases())


if __name__ == "__main__":
    main()
