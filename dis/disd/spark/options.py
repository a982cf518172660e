"""The options of ``spark.read.format("dis")`` and ``spark.readStream.format("dis")``: one parser.

Parsed once, validated with messages that name the option, and kept in a small picklable value
(``SourceOptions``) that travels with the reader and every input partition.  Option names are
case-insensitive, as in Spark.

Option ``source`` and the presence of a DIS (``address``/``routing``) decide which reader serves a
read, and so which options apply:

* a DIS read (``source`` ``intraday`` with ``address`` or ``routing``; ``dbRoot`` then makes the
  tasks read the column files directly) — ``disd.spark.source``;
* a read from the database root (``source`` ``historical`` or ``all``, or ``intraday`` with
  ``dbRoot`` and no DIS) — ``disd.spark.ondisk``; in ``all`` mode with a DIS, that DIS's options
  are validated as for a DIS read and serve the intraday rows.
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass
from typing import Mapping, TypedDict, overload

from disd.blocks import DEFAULT_RETRY_S
from disd.security import ClientSecurity
from disd.spark.errors import DisSourceError

#: Rows per input partition before a location is split (a scan uses at least ``minPartitions``).
DEFAULT_ROWS_PER_PARTITION = 8 << 20
#: Rows per Arrow RecordBatch handed to Spark: a multiple of 65536 keeps every fixed-width
#: column's chunks on 64 KiB block boundaries.
DEFAULT_BATCH_ROWS = 1 << 19

SOURCES = ("intraday", "historical", "all")
#: Options of reads from the database root only.
STORAGE_ONLY = {"source", "schemas"}

KNOWN = {
    "address", "routing", "namespace", "table", "path", "columns", "partitions",
    "rowsperpartition", "minpartitions", "batchrows", "timeout", "retryseconds",
    "ca", "cert", "key", "token", "tokenfile", "servername",
    "maxrowspertrigger", "startingoffsets", "dbroot",
    "source",  # intraday (a DIS, or column files), historical or all
    "view",  # rows (default) or lastBy (disd.spark.lastbyview)
    "reader", "httpaddress",  # the JVM reader's (disd.spark.jvm): accepted here, where they change nothing
    "pushaggregates",  # the JVM reader's aggregate pushdown: accepted here, where it changes nothing
}


@dataclass(frozen=True)
class SourceOptions:
    namespace: str
    table: str
    address: str | None = None
    routing: str | None = None
    columns: tuple[str, ...] | None = None
    partitions: frozenset[str] | None = None
    rows_per_partition: int = DEFAULT_ROWS_PER_PARTITION
    min_partitions: int = 2
    batch_rows: int = DEFAULT_BATCH_ROWS
    timeout_s: float = 30.0
    #: how long planning, streaming offsets and task reads ride out an unreachable DIS (a restart)
    retry_s: float = DEFAULT_RETRY_S
    security: ClientSecurity = ClientSecurity()  # certificate paths: readable where the tasks run
    max_rows_per_trigger: int | None = None
    starting_offsets: str = "earliest"
    db_root: str | None = None  # a DIS read: its tasks read the column files here; else the root read
    source: str = "intraday"
    schemas: str | None = None  # the DIS's schemas directory, for column files read without a DIS
    view: str = "rows"  # or "lastby": the table's last-by view (docs/lastby.md)

    @property
    def has_dis(self) -> bool:
        """A DIS serves the intraday rows (always for a DIS read; in ``all`` mode when given)."""
        return bool(self.address or self.routing)

    @property
    def from_storage(self) -> bool:
        """The read starts from the database root (``disd.spark.ondisk``), not from a DIS."""
        return self.source != "intraday" or not self.has_dis

    @property
    def where(self) -> str:
        return f"routing {self.routing}" if self.routing else f"address {self.address}"

    def routing_value(self):  # noqa: ANN201
        """The routing of this source: one address, or the routing file loaded now."""
        from disd.config import ConfigError
        from disd.routing import Routing, load_routing

        if self.routing:
            try:
                return load_routing(self.routing)
            except (ConfigError, OSError, ValueError) as e:
                raise DisSourceError(f"option 'routing': cannot use {self.routing}: {e}") from None
        if self.address is None:
            raise DisSourceError("option 'address' or 'routing' is required to read from a DIS")
        return Routing.single(self.address)


@overload
def _int(opts: Mapping[str, str], name: str, default: int, minimum: int = 1) -> int: ...
@overload
def _int(opts: Mapping[str, str], name: str, default: None, minimum: int = 1) -> int | None: ...
def _int(opts: Mapping[str, str], name: str, default: int | None, minimum: int = 1) -> int | None:
    raw = opts.get(name.lower())
    if raw is None or str(raw).strip() == "":
        return default
    try:
        v = int(str(raw).strip().replace("_", ""))
    except ValueError:
        raise DisSourceError(f"option '{name}' must be an integer, got {raw!r}") from None
    if v < minimum:
        raise DisSourceError(f"option '{name}' must be at least {minimum}, got {v}")
    return v


def _list(raw: str | None) -> list[str] | None:
    if raw is None:
        return None
    items = [x.strip() for x in str(raw).split(",")]
    return [x for x in items if x]


def _columns_and_partitions(opts: Mapping[str, str], unique: bool
                            ) -> tuple[tuple[str, ...] | None, frozenset[str] | None]:
    """Options 'columns' (each named once when ``unique``) and 'partitions'."""
    columns = _list(opts.get("columns"))
    if columns is not None:
        if not columns:
            raise DisSourceError("option 'columns' is empty; list column names separated by commas")
        dup = sorted({c for c in columns if columns.count(c) > 1}) if unique else []
        if dup:
            raise DisSourceError(f"option 'columns' names {dup[0]!r} twice")
    partitions = _list(opts.get("partitions"))
    if partitions is not None and not partitions:
        raise DisSourceError("option 'partitions' is empty; list partition values (e.g. dates) separated by commas")
    return (tuple(columns) if columns is not None else None,
            frozenset(partitions) if partitions is not None else None)


class _Sizes(TypedDict):
    rows_per_partition: int
    min_partitions: int
    batch_rows: int


class _ViaDis(TypedDict, total=False):
    """The options of the DIS of a read from the database root (source ``all``)."""

    address: str | None
    routing: str | None
    security: ClientSecurity
    timeout_s: float
    max_rows_per_trigger: int | None
    starting_offsets: str


def _sizes(opts: Mapping[str, str]) -> _Sizes:
    """How a scan is cut: options 'batchRows', 'rowsPerPartition', 'minPartitions'."""
    batch_rows = _int(opts, "batchRows", DEFAULT_BATCH_ROWS)
    return {"rows_per_partition": _int(opts, "rowsPerPartition", DEFAULT_ROWS_PER_PARTITION),
            "min_partitions": _int(opts, "minPartitions", os.cpu_count() or 2), "batch_rows": batch_rows}


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Validate the options Spark passed (``DataSource.options``), whichever reader they ask for
    (the module docstring says how that is decided)."""
    opts = {str(k).lower(): v for k, v in dict(options).items()}
    source = str(opts.get("source") or "intraday").strip().lower()
    if source not in SOURCES:
        raise DisSourceError(f"option 'source' must be one of {', '.join(SOURCES)}; got {opts.get('source')!r}")
    has_dis = bool((opts.get("address") or "").strip() or (opts.get("routing") or "").strip())
    has_root = bool((opts.get("dbroot") or "").strip())
    if source == "intraday" and (has_dis or not has_root):
        # The DIS serves it (with dbRoot, its tasks read the column files directly); without
        # either, _parse_dis says that 'address' is missing.
        if (opts.get("schemas") or "").strip():
            raise DisSourceError("option 'schemas' is for reading column files without a DIS; "
                                 "the DIS at 'address'/'routing' knows the schema")
        return _parse_dis(opts)
    return _parse_storage(opts, source)


def _parse_dis(opts: Mapping[str, str]) -> SourceOptions:
    unknown = sorted(set(opts) - KNOWN)
    if unknown:
        raise DisSourceError(
            f"unknown option {unknown[0]!r}; the options are: address, routing, namespace, table, columns, "
            "partitions, rowsPerPartition, minPartitions, batchRows, timeout, retrySeconds, ca, cert, key, token, tokenFile, "
            "serverName, maxRowsPerTrigger, startingOffsets, dbRoot, source, view, reader, httpAddress, "
            "pushAggregates")
    reader = str(opts.get("reader") or "jvm").strip().lower()
    if reader not in ("jvm", "python"):
        raise DisSourceError(f"option 'reader' must be 'jvm' or 'python', got {opts.get('reader')!r}")
    address = (opts.get("address") or "").strip() or None
    routing = (opts.get("routing") or "").strip() or None
    if address and routing:
        raise DisSourceError("give either option 'address' (host:port) or option 'routing' (a routing YAML file), not both")
    if not address and not routing:
        raise DisSourceError("option 'address' (host:port of a DIS) or option 'routing' (a routing YAML file) is required")
    if address and (":" not in address or not address.rsplit(":", 1)[1].isdigit()):
        raise DisSourceError(f"option 'address' must be host:port, got {address!r}")
    if routing and not pathlib.Path(routing).is_file():
        raise DisSourceError(f"option 'routing': no such file {routing!r}")

    namespace = (opts.get("namespace") or "").strip()
    table = (opts.get("table") or "").strip()
    path = (opts.get("path") or "").strip()
    if path and not table:
        # spark.read.format("dis").load("Market.Trade")
        if "." not in path:
            raise DisSourceError(f"load({path!r}): give the table as '<Namespace>.<Table>'")
        namespace, table = path.split(".", 1) if not namespace else (namespace, path)
    elif table and not namespace and "." in table:
        namespace, table = table.split(".", 1)
    if not namespace or not table:
        raise DisSourceError("options 'namespace' and 'table' are required (or table '<Namespace>.<Table>')")

    columns, partitions = _columns_and_partitions(opts, unique=True)

    timeout_raw = opts.get("timeout")
    timeout_s = 30.0
    if timeout_raw is not None and str(timeout_raw).strip():
        try:
            timeout_s = float(str(timeout_raw).strip().rstrip("s"))
        except ValueError:
            raise DisSourceError(f"option 'timeout' must be seconds, got {timeout_raw!r}") from None
        if timeout_s <= 0:
            raise DisSourceError(f"option 'timeout' must be positive, got {timeout_raw!r}")
    retry_raw = opts.get("retryseconds")
    retry_s = DEFAULT_RETRY_S
    if retry_raw is not None and str(retry_raw).strip():
        try:
            retry_s = float(str(retry_raw).strip().rstrip("s"))
        except ValueError:
            raise DisSourceError(f"option 'retrySeconds' must be seconds, got {retry_raw!r}") from None
        if retry_s < 0:
            raise DisSourceError(f"option 'retrySeconds' must be 0 or more, got {retry_raw!r}")

    token = opts.get("token") or None
    token_file = opts.get("tokenfile") or None
    if token and token_file:
        raise DisSourceError("give either option 'token' or option 'tokenFile', not both")
    if token_file:
        try:
            token = pathlib.Path(token_file).read_text().strip()
        except OSError as e:
            raise DisSourceError(f"option 'tokenFile': cannot read {token_file!r}: {e.strerror}") from None
    for name in ("ca", "cert", "key"):
        p = opts.get(name)
        if p and not pathlib.Path(p).is_file():
            raise DisSourceError(f"option '{name}': no such file {p!r}")
    if (opts.get("cert") is None) != (opts.get("key") is None):
        raise DisSourceError("options 'cert' and 'key' go together (a client certificate and its key)")
    if opts.get("cert") and not opts.get("ca"):
        raise DisSourceError("option 'cert' needs option 'ca' (TLS)")
    security = ClientSecurity(opts.get("ca") or None, opts.get("cert") or None, opts.get("key") or None, token,
                              opts.get("servername") or None)

    starting = str(opts.get("startingoffsets") or "earliest").strip().lower()
    if starting not in ("earliest", "latest"):
        raise DisSourceError(f"option 'startingOffsets' must be 'earliest' or 'latest', got {opts.get('startingoffsets')!r}")

    db_root = (opts.get("dbroot") or "").strip() or None
    if db_root is not None:
        if not pathlib.Path(db_root, "Intraday").is_dir():
            raise DisSourceError(f"option 'dbRoot': {db_root!r} is not a DIS database root (no Intraday/ in it)")
        db_root = str(pathlib.Path(db_root).resolve())
    view = _view(opts)

    return SourceOptions(
        namespace=namespace,
        table=table,
        address=address,
        routing=str(pathlib.Path(routing).resolve()) if routing else None,
        columns=columns,
        partitions=partitions,
        **_sizes(opts),
        timeout_s=timeout_s,
        retry_s=retry_s,
        security=security,
        max_rows_per_trigger=_int(opts, "maxRowsPerTrigger", None),
        starting_offsets=starting,
        db_root=db_root,
        view=view,
    )


def _view(opts: Mapping[str, str]) -> str:
    view = str(opts.get("view") or "rows").strip().lower()
    if view not in ("rows", "lastby"):
        raise DisSourceError(f"option 'view' must be 'rows' or 'lastBy', got {opts.get('view')!r}")
    if view == "lastby" and (opts.get("dbroot") or "").strip():
        raise DisSourceError("option 'view' 'lastBy' reads the DIS's state: drop option 'dbRoot'")
    return view


def _parse_storage(opts: Mapping[str, str], source: str) -> SourceOptions:
    unknown = sorted(set(opts) - KNOWN - STORAGE_ONLY)
    if unknown:
        raise DisSourceError(f"unknown option {unknown[0]!r}; with 'source' historical or all, or dbRoot without a "
                             "DIS, the options are: source, dbRoot, schemas, namespace, table, columns, partitions, "
                             "rowsPerPartition, minPartitions, batchRows, and for the DIS of 'all': address or "
                             "routing, timeout, ca, cert, key, token, tokenFile, serverName")
    if str(opts.get("view") or "rows").strip().lower() != "rows":
        raise DisSourceError("option 'view' 'lastBy' reads a DIS's last-by state (give 'address' or 'routing', source "
                             "intraday); for a merged historical partition use disd.storage.lastby.parquet_last_by")
    db_root = (opts.get("dbroot") or "").strip()
    if not db_root:
        what = "the historical tables" if source != "intraday" else "the column files (no 'address' or 'routing' given)"
        raise DisSourceError(f"option 'dbRoot' (the database root holding {what}) is required")
    if not os.path.isdir(db_root):
        raise DisSourceError(f"option 'dbRoot': no such directory {db_root!r}")
    dis = None
    has_dis = (opts.get("address") or "").strip() or (opts.get("routing") or "").strip()
    if source == "all" and has_dis:
        # Intraday rows of 'all' come over gRPC: dbRoot here names the historical root, which
        # need not be that DIS's own root, so it is not used for direct column-file reads.
        dis = _parse_dis({k: v for k, v in opts.items() if k not in STORAGE_ONLY and k != "dbroot"})
    schemas = (opts.get("schemas") or "").strip() or None
    if schemas and not os.path.isdir(schemas):
        raise DisSourceError(f"option 'schemas': no such directory {schemas!r}")
    namespace = (opts.get("namespace") or "").strip()
    table = (opts.get("table") or "").strip()
    path = (opts.get("path") or "").strip()
    if path and not table:
        table = path
    if table and not namespace and "." in table:
        namespace, table = table.split(".", 1)
    if not namespace or not table:
        raise DisSourceError("options 'namespace' and 'table' are required (or table '<Namespace>.<Table>')")
    columns, partitions = _columns_and_partitions(opts, unique=False)
    via_dis: _ViaDis = {}
    if dis is not None:
        via_dis = {"address": dis.address, "routing": dis.routing, "security": dis.security,
                   "timeout_s": dis.timeout_s, "max_rows_per_trigger": dis.max_rows_per_trigger,
                   "starting_offsets": dis.starting_offsets}
    return SourceOptions(
        source=source, db_root=str(os.path.abspath(db_root)), namespace=namespace, table=table, schemas=schemas,
        columns=columns, partitions=partitions, **_sizes(opts), **via_dis,
    )
