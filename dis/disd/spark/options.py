"""The options of ``spark.read.format("dis")`` and ``spark.readStream.format("dis")``.

Parsed once, validated with messages that name the option, and kept in a small picklable value
(``SourceOptions``) that travels with the reader and every input partition.  Option names are
case-insensitive, as in Spark.
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass
from typing import Mapping

from disd.spark.errors import DisSourceError

#: Rows per input partition before a location is split (a scan uses at least ``minPartitions``).
DEFAULT_ROWS_PER_PARTITION = 8 << 20
#: Rows per Arrow RecordBatch handed to Spark: a multiple of 65536 keeps every fixed-width
#: column's chunks on 64 KiB block boundaries.
DEFAULT_BATCH_ROWS = 1 << 19
#: Split points are multiples of this many rows (block-aligned for every fixed-width column).
SPLIT_ALIGN_ROWS = 1 << 16

KNOWN = {
    "address", "routing", "namespace", "table", "path", "columns", "partitions",
    "rowsperpartition", "minpartitions", "batchrows", "timeout",
    "ca", "cert", "key", "token", "tokenfile", "servername",
    "maxrowspertrigger", "startingoffsets", "dbroot",
    "source",  # intraday (this reader), historical or all: disd.spark.ondisk
    "reader", "httpaddress",  # the JVM reader's (disd.spark.jvm): accepted here, where they change nothing
}


@dataclass(frozen=True)
class Security:
    """What ``disd.rpc.channel.ClientSecurity`` needs, as plain values (certificate *paths*:
    they must be readable where the tasks run)."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    token: str | None = None
    server_name: str | None = None

    def client_security(self):  # noqa: ANN201
        from disd.rpc.channel import ClientSecurity

        if not any((self.ca, self.cert, self.key, self.token, self.server_name)):
            return None
        return ClientSecurity(self.ca, self.cert, self.key, self.token, self.server_name)


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
    security: Security = Security()
    max_rows_per_trigger: int | None = None
    starting_offsets: str = "earliest"
    db_root: str | None = None

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
        return Routing.single(self.address)


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


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Validate the options Spark passed (``DataSource.options``)."""
    opts = {str(k).lower(): v for k, v in dict(options).items()}
    unknown = sorted(set(opts) - KNOWN)
    if unknown:
        raise DisSourceError(
            f"unknown option {unknown[0]!r}; the options are: address, routing, namespace, table, columns, "
            "partitions, rowsPerPartition, minPartitions, batchRows, timeout, ca, cert, key, token, tokenFile, "
            "serverName, maxRowsPerTrigger, startingOffsets, dbRoot, source, reader, httpAddress")
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

    columns = _list(opts.get("columns"))
    if columns is not None:
        if not columns:
            raise DisSourceError("option 'columns' is empty; list column names separated by commas")
        dup = sorted({c for c in columns if columns.count(c) > 1})
        if dup:
            raise DisSourceError(f"option 'columns' names {dup[0]!r} twice")
    partitions = _list(opts.get("partitions"))
    if partitions is not None and not partitions:
        raise DisSourceError("option 'partitions' is empty; list partition values (e.g. dates) separated by commas")

    timeout_raw = opts.get("timeout")
    timeout_s = 30.0
    if timeout_raw is not None and str(timeout_raw).strip():
        try:
            timeout_s = float(str(timeout_raw).strip().rstrip("s"))
        except ValueError:
            raise DisSourceError(f"option 'timeout' must be seconds, got {timeout_raw!r}") from None
        if timeout_s <= 0:
            raise DisSourceError(f"option 'timeout' must be positive, got {timeout_raw!r}")

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
    security = Security(opts.get("ca") or None, opts.get("cert") or None, opts.get("key") or None, token,
                        opts.get("servername") or None)

    starting = str(opts.get("startingoffsets") or "earliest").strip().lower()
    if starting not in ("earliest", "latest"):
        raise DisSourceError(f"option 'startingOffsets' must be 'earliest' or 'latest', got {opts.get('startingoffsets')!r}")

    db_root = (opts.get("dbroot") or "").strip() or None
    if db_root is not None:
        if not pathlib.Path(db_root, "Intraday").is_dir():
            raise DisSourceError(f"option 'dbRoot': {db_root!r} is not a DIS database root (no Intraday/ in it)")
        db_root = str(pathlib.Path(db_root).resolve())

    batch_rows = _int(opts, "batchRows", DEFAULT_BATCH_ROWS)
    return SourceOptions(
        namespace=namespace,
        table=table,
        address=address,
        routing=str(pathlib.Path(routing).resolve()) if routing else None,
        columns=tuple(columns) if columns is not None else None,
        partitions=frozenset(partitions) if partitions is not None else None,
        rows_per_partition=_int(opts, "rowsPerPartition", DEFAULT_ROWS_PER_PARTITION),
        min_partitions=_int(opts, "minPartitions", os.cpu_count() or 2),
        batch_rows=batch_rows,
        timeout_s=timeout_s,
        security=security,
        max_rows_per_trigger=_int(opts, "maxRowsPerTrigger", None),
        starting_offsets=starting,
        db_root=db_root,
    )
