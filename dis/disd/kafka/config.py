"""``import.kafka`` of the DIS config: the cluster, and per source a topic, its table, the value
format and how message parts map to the table's columns (docs/kafka.md).

Everything is checked against the table's schema when ``dis serve`` starts, and every problem is
a ``ConfigError`` naming the key (``import.kafka.sources.trades.columns.Size: ...``): a mapping
that cannot fill its column must stop the start, not every message later.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from disd.config import ConfigError, ConfigReader, declared_column, declared_table
from disd.names import InvalidNameError, NameKind, validate_name
from disd.schema import ColumnType, SchemaRegistry, TableSchema

FORMATS = ("json", "binlog")
POLICIES = ("stop", "skip")
TIME_UNITS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
#: A message part a column can come from, besides ``value.<field>`` and ``header.<name>``.
PARTS = ("key", "timestamp", "partition", "offset")
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
#: fetch processes a source may have (each a Python process with two librdkafka clients)
MAX_FETCH_PROCESSES = 64
_INTEGER = {ColumnType.BYTE, ColumnType.SHORT, ColumnType.INT, ColumnType.LONG}


@dataclass(frozen=True)
class ColumnSource:
    """Where one table column's values come from: ``part`` is ``value``, ``header``, or one of
    PARTS; ``name`` the JSON field or header name; ``unit`` how a JSON number is a timestamp
    (``ns``, ``us``, ``ms``, ``s``; ``iso``: an ISO-8601 string)."""

    column: str
    part: str
    name: str = ""
    unit: str = "ns"


@dataclass(frozen=True)
class SourceConfig:
    name: str
    topic: str
    schema: TableSchema
    format: str = "json"
    columns: tuple[ColumnSource, ...] = ()
    partition_column: str | None = None  # the timestamp column whose UTC date is the column partition
    fixed_partition: str | None = None  # or this column partition for every row
    on_poison: str = "stop"
    batch_size: int = 10000
    start: str = "earliest"  # where a partition without a checkpointed offset starts: earliest|latest
    #: processes consuming the topic, partition p in process p % fetch_processes (docs/kafka.md);
    #: None: derived when the source starts, from its partitions and the cores (``disd.kafka.link``)
    fetch_processes: int | None = None

    def internal_partition(self, partition: int) -> str:
        """The location's internal partition for a Kafka partition of the topic: the topic with
        ``.`` as ``+`` (not a topic character, so no two topics collide), ``-``, the number."""
        return f"{self.topic.replace('.', '+')}-{partition}"


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap_servers: str
    group_id: str = "dis"
    properties: dict[str, str] = field(default_factory=dict)
    commit_interval_ms: int = 5000
    sources: tuple[SourceConfig, ...] = ()
    #: a fetch process that sends nothing, or no batch while its partitions lag, this long is
    #: killed and started again (``disd.kafka.watch``)
    stall_timeout_ms: int = 30_000

    def client_properties(self) -> dict[str, Any]:
        """librdkafka properties of a consumer: ours, then the passthrough (security etc.).
        ``properties`` may override ``fetch.queue.backoff.ms``, ``queued.min.messages`` and
        ``max.partition.fetch.bytes``.  Offsets are never committed automatically: the checkpoint is the only resume point.  A
        checkpointed offset the topic no longer holds (deleted by retention) is an error, never
        a silent jump (``auto.offset.reset: error``): the partition stops and says so."""
        return {"bootstrap.servers": self.bootstrap_servers, "group.id": self.group_id,
                # librdkafka postpones a partition's next fetch by this much whenever its local
                # queue is over queued.min.messages; its default (1000 ms) stalls a consumer
                # that takes batches of thousands, several times fewer messages a second
                "fetch.queue.backoff.ms": 10,
                # fetch ahead more than librdkafka's defaults (100000 messages queued, 1 MiB a partition
                # a fetch): a loop that works between batches then finds its next one waiting
                # more often (bounded by queued.max.messages.kbytes, 64 MiB by default)
                "queued.min.messages": 1_000_000, "max.partition.fetch.bytes": 8 << 20,
                **self.properties, "enable.auto.commit": False, "enable.auto.offset.store": False,
                "enable.partition.eof": False, "auto.offset.reset": "error"}


#: librdkafka properties the DIS sets itself: a passthrough of these is refused.
RESERVED = ("enable.auto.commit", "enable.auto.offset.store", "enable.partition.eof", "bootstrap.servers",
            "group.id", "auto.offset.reset")


def parse_kafka_config(data: Any, source: str, schemas: SchemaRegistry,
                       routed=lambda namespace, table: True,  # noqa: ANN001
                       schemas_dir: str | None = None) -> KafkaConfig | None:
    """``import.kafka`` (already YAML) checked against ``schemas`` (read from ``schemas_dir``, which
    errors name); None when absent."""
    if data is None:
        return None
    r = ConfigReader(source, data, "import.kafka.")
    servers = r.get("bootstrap_servers", str, None)
    if not servers:
        raise ConfigError(source, r.key("bootstrap_servers"), "required: host:port[,host:port...]")
    props = r.get("properties", dict, {})
    for k, v in props.items():
        if not isinstance(k, str) or not isinstance(v, (str, int, float, bool)):
            raise ConfigError(source, r.key(f"properties.{k}"), "must be a librdkafka property and a scalar value")
        if k in RESERVED:
            raise ConfigError(source, r.key(f"properties.{k}"), "is set by the DIS itself (docs/kafka.md)")
    cfg_props = {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in props.items()}
    group = r.get("group_id", str, "dis")
    commit = r.get("commit_interval_ms", int, 5000, lambda v: None if v >= 100 else "must be >= 100")
    stall = r.get("stall_timeout_ms", int, 30_000, lambda v: None if v >= 1000 else "must be >= 1000")
    srcs = r.sub("sources")
    if not srcs.data:
        raise ConfigError(source, "import.kafka.sources", "required: at least one source")
    sources, topics = [], set()
    for name in srcs.data:
        s = _source(srcs.sub(str(name)), str(name), schemas, routed, schemas_dir)
        if s.topic in topics:
            raise ConfigError(source, f"import.kafka.sources.{name}.topic", f"topic {s.topic} is consumed by another source")
        topics.add(s.topic)
        sources.append(s)
    srcs.finish()
    r.finish()
    return KafkaConfig(servers, group, cfg_props, commit, tuple(sources), stall)


def _source(r: ConfigReader, name: str, schemas: SchemaRegistry, routed,  # noqa: ANN001
            schemas_dir: str | None) -> SourceConfig:
    src = r.source
    try:
        validate_name(NameKind.COLUMN, name)
    except InvalidNameError as e:
        raise ConfigError(src, r.prefix.rstrip("."), f"a source name must be a name: {e}") from None
    topic = r.get("topic", str, None, lambda v: None if _TOPIC.match(v) else "not a Kafka topic name")
    if topic is None:
        raise ConfigError(src, r.key("topic"), "required")
    table_name = r.get("table", str, None)
    if table_name is None or table_name.count(".") != 1:
        raise ConfigError(src, r.key("table"), "required: <Namespace>.<Table>")
    schema = declared_table(schemas, table_name, src, r.key("table"), schemas_dir)
    if not routed(schema.namespace, schema.table):
        raise ConfigError(src, r.key("table"), f"{table_name} is not routed to this DIS (server.tables)")
    fmt = r.get("format", str, "json", lambda v: None if v in FORMATS else f"must be one of {', '.join(FORMATS)}")
    policy = r.get("on_poison", str, "stop", lambda v: None if v in POLICIES else "must be stop or skip")
    batch = r.get("batch_size", int, 10000, lambda v: None if 1 <= v <= 1_000_000 else "must be 1..1000000")
    start = r.get("start", str, "earliest", lambda v: None if v in ("earliest", "latest") else
                  "must be earliest or latest")
    procs = r.get("fetch_processes", int, None, lambda v: None if 1 <= v <= MAX_FETCH_PROCESSES else
                  f"must be an integer 1..{MAX_FETCH_PROCESSES}")
    columns = _columns(r, schema, fmt)
    part_col, fixed = _column_partition(r, schema)
    try:
        validate_name(NameKind.INTERNAL_PARTITION, f"{topic.replace('.', '+')}-2147483647")
    except InvalidNameError as e:
        raise ConfigError(src, r.key("topic"), f"too long for a location's internal partition: {e}") from None
    r.finish()
    return SourceConfig(name, topic, schema, fmt, columns, part_col, fixed, policy, batch, start, procs)


def _columns(r: ConfigReader, schema: TableSchema, fmt: str) -> tuple[ColumnSource, ...]:
    data = r.get("columns", dict, None)
    if fmt == "binlog":
        if data is not None:
            raise ConfigError(r.source, r.key("columns"), "a binlog value holds every column of the table: no mapping")
        return ()
    if data is None:  # every column from the value field of its name
        return tuple(ColumnSource(c.name, "value", c.name) for c in schema.columns)
    out = []
    for col, spec in data.items():
        key = r.key(f"columns.{col}")
        declared_column(schema, col, r.source, key)
        ctype = schema.column(col).type
        unit = None
        if isinstance(spec, dict):
            sr = ConfigReader(r.source, spec, key + ".")
            frm = sr.get("from", str, None)
            unit = sr.get("unit", str, None, lambda v: None if v in (*TIME_UNITS, "iso") else
                          f"must be one of {', '.join((*TIME_UNITS, 'iso'))}")
            sr.finish()
            if frm is None:
                raise ConfigError(r.source, key + ".from", "required")
            spec = frm
        if not isinstance(spec, str):
            raise ConfigError(r.source, key, "must be value.<field>, header.<name>, key, timestamp, partition or "
                              "offset, or {from: ..., unit: ...}")
        part, _, rest = spec.partition(".")
        if part in ("value", "header") and rest:
            cs = ColumnSource(col, part, rest)
        elif spec in PARTS:
            cs = ColumnSource(col, spec)
        else:
            raise ConfigError(r.source, key, f"{spec!r}: must be value.<field>, header.<name>, key, timestamp, "
                              "partition or offset")
        if unit is not None and ctype is not ColumnType.TIMESTAMP:
            raise ConfigError(r.source, key + ".unit", f"only for a timestamp column; {col} is {ctype.value}")
        if unit is not None and cs.part != "value":
            raise ConfigError(r.source, key + ".unit", "only for a value field")
        problem = _type_problem(cs, ctype)
        if problem:
            raise ConfigError(r.source, key, f"{spec}: {problem} ({col} is {ctype.value})")
        out.append(ColumnSource(col, cs.part, cs.name, unit or "ns"))
    return tuple(out)


def _type_problem(cs: ColumnSource, ctype: ColumnType) -> str | None:
    if cs.part in ("key", "header") and ctype is not ColumnType.STRING:
        return "a key or header maps to a string column"
    if cs.part == "timestamp" and ctype not in (ColumnType.TIMESTAMP, ColumnType.LONG):
        return "the message timestamp maps to a timestamp or long column"
    if cs.part in ("partition", "offset") and ctype not in _INTEGER - {ColumnType.BYTE, ColumnType.SHORT}:
        return "a partition or offset maps to an int or long column"
    return None


def _column_partition(r: ConfigReader, schema: TableSchema) -> tuple[str | None, str | None]:
    v = r.get("column_partition", (str, dict), None)
    key = r.key("column_partition")
    if v is None:
        raise ConfigError(r.source, key, "required: {column: <timestamp column>} (its UTC date) or a fixed name")
    if isinstance(v, str):
        try:
            validate_name(NameKind.COLUMN_PARTITION, v)
        except InvalidNameError as e:
            raise ConfigError(r.source, key, str(e)) from None
        return None, v
    sr = ConfigReader(r.source, v, key + ".")
    col = sr.get("column", str, None)
    sr.finish()
    if col is None:
        raise ConfigError(r.source, key + ".column", "required: a timestamp column of the table")
    declared_column(schema, col, r.source, key + ".column")
    if schema.column(col).type is not ColumnType.TIMESTAMP:
        raise ConfigError(r.source, key + ".column", f"{col} is {schema.column(col).type.value}, not a timestamp")
    return col, None
