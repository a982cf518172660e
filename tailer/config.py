"""``dis-tailer``'s YAML configuration (``config/tailer.yaml``).

    dis: 127.0.0.1:22021            # or  routing: config/routing.yaml
    log_dirs: [var/logs]
    # tls: {ca: ..., cert: ..., key: ..., server_name: ...}   token_file: ...
    # poll_interval_ms: 200  max_in_flight_bytes: 8388608  chunk_bytes: 4194304
    # keepalive_ms: 2000  keepalive_timeout_ms: 3000  ack_timeout_ms: 60000   (a DIS that stopped answering)
    # csv_tables: [Market.Quote]  schemas: config/schemas  state_dir: var/tailer
    # retention: {mode: delete}   or   {mode: move, move_to: /archive/logs}   (interval_ms: 10000)
    # metrics_port: 9465  metrics_host: 127.0.0.1   (the Prometheus endpoint; none without a port)

Every error names the file and the key, and unknown keys are errors (see ``disd.config``).
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass, field, fields
from typing import Any

from disd.binlog.format import MAX_FRAME_PAYLOAD
from disd.config import ConfigError, ConfigReader, load_yaml, port_problem, read_token
from disd.names import InvalidNameError, NameKind, validate_name
from disd.routing import Routing, load_routing
from disd.rpc.channel import MIN_KEEPALIVE_MS
from disd.security import ClientSecurity
from disd.schema import SchemaError, SchemaRegistry, TableSchema

#: The shortest ``ack_timeout_ms``: a DIS answers a chunk in milliseconds, but a deadline shorter
#: than a flush's pause would break healthy streams.
MIN_ACK_TIMEOUT_MS = 1000

#: Largest chunk: a whole maximal frame fits, and the message stays under the channel's limit.
MAX_CHUNK_BYTES = MAX_FRAME_PAYLOAD


@dataclass
class RetentionConfig:
    """Log retention (``disd.tailer.retention``): what to do with a binary log once the DIS
    checkpoint covers every row in it."""

    mode: str  # "delete" | "move"
    move_to: str | None = None  # the archive directory of mode "move"
    interval_ms: int = 10000  # how often the DIS is asked for its checkpoints


#: the one value ``stream_runtime`` takes; the runtimes it once chose between are gone
STREAM_RUNTIME = "multiplexed"
#: the runtimes ``stream_runtime`` named before the event loop, for the message that says so
REMOVED_RUNTIMES = ("asyncio", "threads")


def _runtime_problem(v: str) -> str | None:
    """``stream_runtime`` takes ``multiplexed`` only: every location's stream runs on the
    tailer's event loop (docs/tailer.md, "The event loop")."""
    if v == STREAM_RUNTIME:
        return None
    what = f"the {v!r} runtime was removed" if v in REMOVED_RUNTIMES else f"no runtime {v!r}"
    return (f"{what}: every location's stream runs on the tailer's event loop, on one Multiplex call per DIS; "
            f"give 'multiplexed' or leave the key out")


@dataclass
class TailerConfig:
    routing: Routing
    log_dirs: list[str]
    security: ClientSecurity = field(default_factory=ClientSecurity)
    poll_interval_ms: int = 200
    max_in_flight_bytes: int = 8 << 20
    chunk_bytes: int = 4 << 20
    torn_tail_grace_ms: int = 2000
    retry_refused_ms: int = 30000
    max_backoff_ms: int = 5000
    #: HTTP/2 pings to each DIS after this long without a reply, the connection given up when one
    #: is not answered within ``keepalive_timeout_ms``: a DIS whose process stopped (frozen,
    #: SIGSTOP, its host gone) while its kernel keeps the connections open is left within the sum
    keepalive_ms: int = 2000
    keepalive_timeout_ms: int = 3000
    #: a stream whose open or chunks go unanswered this long, the DIS saying nothing meanwhile, is
    #: broken and reconnected (a DIS that answers pings but not the stream: stuck)
    ack_timeout_ms: int = 60000
    #: how the Ingest streams run: "multiplexed" only (every location's stream to a DIS on one
    #: ``Multiplex`` call, on the tailer's event loop); kept as a key so that a file naming it
    #: still loads, and one naming a removed runtime says so
    stream_runtime: str = STREAM_RUNTIME
    state_dir: str = "var/tailer"
    schemas: str | None = None
    #: "<Namespace>.<Table>" -> schema, for the tables fed by CSV files
    csv_tables: dict[str, TableSchema] = field(default_factory=dict)
    retention: RetentionConfig | None = None  # None: logs are kept
    metrics_port: int | None = None  # the Prometheus endpoint (disd.tailer.metrics); None: none
    metrics_host: str = "127.0.0.1"
    source: str = "<config>"


#: The keys of the file, checked before any value: a key a ``TailerConfig`` field holds as it is,
#: and those read into another field (``dis`` into ``routing``, ``tls`` and ``token_file`` into
#: ``security``).  Any other key is an error (``ConfigReader.finish`` catches the rest).
KEYS = frozenset({f.name for f in fields(TailerConfig)} - {"security", "source"} | {"dis", "tls", "token_file"})


def _positive(v: int) -> str | None:
    return None if v > 0 else "must be > 0"


def _at_least(least: int):  # noqa: ANN202 - a ConfigReader check
    return lambda v: None if v >= least else f"must be >= {least}"


def parse_tailer_config(data: Any, source: str = "<config>") -> TailerConfig:
    r = ConfigReader(source, data)
    r.refuse_unknown(KEYS)  # a misspelt key first, not the required key it leaves missing
    address = r.get("dis", str, None)
    routing_file = r.get("routing", str, None)
    if bool(address) == bool(routing_file):
        raise ConfigError(source, "dis", "give exactly one of 'dis: host:port' or 'routing: FILE'")
    if address:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(source, "dis", f"must be host:port, got {address!r}")
        routing = Routing.single(address)
    else:
        try:
            routing = load_routing(routing_file)
        except OSError as e:
            raise ConfigError(source, "routing", f"cannot read {routing_file}: {e.strerror}") from None
    dirs = r.get("log_dirs", list, None)
    if not dirs or not all(isinstance(d, str) and d for d in dirs):
        raise ConfigError(source, "log_dirs", "must be a non-empty list of directories")

    cfg = TailerConfig(routing=routing, log_dirs=list(dict.fromkeys(dirs)), source=source)
    cfg.poll_interval_ms = r.get("poll_interval_ms", int, cfg.poll_interval_ms, _positive)
    cfg.max_in_flight_bytes = r.get("max_in_flight_bytes", int, cfg.max_in_flight_bytes, _positive)
    cfg.chunk_bytes = r.get(
        "chunk_bytes", int, cfg.chunk_bytes,
        lambda v: _positive(v) or (f"must be <= {MAX_CHUNK_BYTES}" if v > MAX_CHUNK_BYTES else None),
    )
    if cfg.chunk_bytes > cfg.max_in_flight_bytes:
        raise ConfigError(source, "chunk_bytes", f"must be <= max_in_flight_bytes ({cfg.max_in_flight_bytes})")
    cfg.torn_tail_grace_ms = r.get("torn_tail_grace_ms", int, cfg.torn_tail_grace_ms, _positive)
    cfg.retry_refused_ms = r.get("retry_refused_ms", int, cfg.retry_refused_ms, _positive)
    cfg.max_backoff_ms = r.get("max_backoff_ms", int, cfg.max_backoff_ms, _positive)
    cfg.keepalive_ms = r.get("keepalive_ms", int, cfg.keepalive_ms, _at_least(MIN_KEEPALIVE_MS))
    cfg.keepalive_timeout_ms = r.get("keepalive_timeout_ms", int, cfg.keepalive_timeout_ms,
                                     _at_least(MIN_KEEPALIVE_MS))
    cfg.ack_timeout_ms = r.get("ack_timeout_ms", int, cfg.ack_timeout_ms, _at_least(MIN_ACK_TIMEOUT_MS))
    cfg.stream_runtime = r.get("stream_runtime", str, cfg.stream_runtime, _runtime_problem)
    cfg.state_dir = r.get("state_dir", str, cfg.state_dir, lambda v: None if v else "must not be empty")

    tls = r.sub("tls")
    ca = tls.get("ca", str, None)
    cert = tls.get("cert", str, None)
    key = tls.get("key", str, None)
    server_name = tls.get("server_name", str, None)
    tls.finish()
    if (cert or key) and not ca:
        raise ConfigError(source, "tls.ca", "required when a client certificate is given")
    if bool(cert) != bool(key):
        raise ConfigError(source, "tls.key" if cert else "tls.cert", "a client certificate needs both cert and key")
    for name, path in (("ca", ca), ("cert", cert), ("key", key)):
        if path and not pathlib.Path(path).is_file():
            raise ConfigError(source, f"tls.{name}", f"no such file: {path}")
    token_file = r.get("token_file", str, None)
    token = read_token(token_file, source) if token_file else None
    cfg.security = ClientSecurity(ca=ca, cert=cert, key=key, token=token, server_name=server_name)

    cfg.schemas = r.get("schemas", str, None)
    tables = r.get("csv_tables", list, [])
    for i, t in enumerate(tables):
        ns, dot, table = t.partition(".") if isinstance(t, str) else ("", "", "")
        try:
            if not dot:
                raise InvalidNameError(NameKind.TABLE, t, "must be <Namespace>.<Table>")
            validate_name(NameKind.NAMESPACE, ns)
            validate_name(NameKind.TABLE, table)
        except InvalidNameError as e:
            raise ConfigError(source, f"csv_tables[{i}]", str(e)) from None
    if tables:
        if not cfg.schemas:
            raise ConfigError(source, "schemas", "required with csv_tables (the CSV tables' schemas)")
        try:
            registry = SchemaRegistry.load_dir(cfg.schemas)
        except (SchemaError, OSError) as e:
            raise ConfigError(source, "schemas", str(e)) from None
        for i, t in enumerate(tables):
            ns, _, table = t.partition(".")
            schema = registry.get(ns, table)
            if schema is None:
                raise ConfigError(source, f"csv_tables[{i}]", f"no schema for {t} in {cfg.schemas}")
            cfg.csv_tables[t] = schema
    cfg.retention = _retention(r.sub("retention"), cfg.log_dirs)
    cfg.metrics_port = r.get("metrics_port", int, None, port_problem)
    host = r.get("metrics_host", str, None, lambda v: None if v.strip() else "must not be empty")
    if host is not None:
        if cfg.metrics_port is None:
            raise ConfigError(source, "metrics_host", "only with metrics_port")
        cfg.metrics_host = host
    r.finish()
    return cfg


def _retention(r: ConfigReader, log_dirs: list[str]) -> RetentionConfig | None:
    if not r.data:
        return None
    mode = r.get("mode", str, None, lambda v: None if v in ("delete", "move") else "must be 'delete' or 'move'")
    move_to = r.get("move_to", str, None, lambda v: None if v else "must not be empty")
    interval = r.get("interval_ms", int, 10000, _positive)
    r.finish()
    if mode is None:
        raise ConfigError(r.source, r.key("mode"), "missing: 'delete' or 'move'")
    if mode == "move" and not move_to:
        raise ConfigError(r.source, r.key("move_to"), "required with mode: move")
    if mode == "delete" and move_to:
        raise ConfigError(r.source, r.key("move_to"), "only with mode: move")
    if move_to and any(pathlib.Path(move_to).resolve() == pathlib.Path(d).resolve() for d in log_dirs):
        raise ConfigError(r.source, r.key("move_to"), "must not be one of log_dirs (moved logs would be sent again)")
    return RetentionConfig(mode, move_to, interval)


def load_tailer_config(path: str | pathlib.Path) -> TailerConfig:
    return parse_tailer_config(load_yaml(path), str(path))
