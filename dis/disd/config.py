"""Configuration: one dataclass per concept, with its defaults written once, and the YAML loader.

``StorageConfig`` and ``ImportConfig`` are the storage engine's own options (the engine takes
them as they are); ``DisConfig`` is ``dis serve``'s whole file and holds one of each.  The
tailer's and the routing file's loaders read their YAML with the same ``ConfigReader``.

Every error names the file and the key (``config/dis.yaml: storage.max_open_files: must be an
integer >= 16``), and unknown keys are errors too: a typo must not silently fall back to a default.
So are the tables and columns a file names that no schema declares (``declared_table``,
``declared_column``: the one check of a name against the schemas, with the closest name offered).
"""

from __future__ import annotations

import difflib
import fnmatch
import pathlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable

import yaml

from disd.errors import DisError

if TYPE_CHECKING:
    from disd.schema import SchemaRegistry, TableSchema


#: Bytes per block of a column file: the unit of the storage engine's buffers and of block reads.
DEFAULT_BLOCK_SIZE_BYTES = 65536


class ConfigError(DisError, ValueError):
    def __init__(self, source: str, key: str, problem: str) -> None:
        super().__init__(f"{source}: {key}: {problem}")
        self.source, self.key, self.problem = source, key, problem


class ConfigReader:
    """Walks a parsed YAML mapping, recording which keys were used."""

    def __init__(self, source: str, data: Any, prefix: str = "") -> None:
        self.source = source
        self.prefix = prefix
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(source, prefix.rstrip(".") or "<top>", "must be a mapping")
        self.data = data
        self.used: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def get(self, name: str, kind: type | tuple[type, ...], default: Any, check: Callable[[Any], str | None] | None = None) -> Any:
        self.used.add(name)
        if name not in self.data or self.data[name] is None:
            return default
        v = self.data[name]
        if kind is int and isinstance(v, bool) or not isinstance(v, kind):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise ConfigError(self.source, self.key(name), f"must be {names}, got {v!r}")
        if check is not None:
            problem = check(v)
            if problem:
                raise ConfigError(self.source, self.key(name), problem)
        return v

    def sub(self, name: str) -> "ConfigReader":
        self.used.add(name)
        return ConfigReader(self.source, self.data.get(name), f"{self.prefix}{name}.")

    def finish(self) -> None:
        """Refuse a key no ``get`` or ``sub`` asked for (the last step of reading a section)."""
        self.refuse_unknown(self.used)

    def refuse_unknown(self, known: Iterable[str]) -> None:
        """Refuse a key that is not one of ``known``, offering the closest known key.  A section
        with required keys calls it first, with every key it knows: ``log_dir:`` is then reported
        as the misspelling it is, not as the ``log_dirs`` it leaves missing."""
        known = sorted(set(known), key=str)
        unknown = sorted(set(self.data) - set(known), key=str)
        if unknown:
            name = str(unknown[0])
            close = closest(name, known)
            hint = f"did you mean {close}?" if close else f"known keys: {', '.join(known)}"
            raise ConfigError(self.source, self.key(name), f"unknown key ({hint})")


def closest(name: str, known: Iterable[str]) -> str | None:
    """The one of ``known`` that ``name`` most likely misspells, if any is close (difflib)."""
    match = difflib.get_close_matches(name, [str(k) for k in known], n=1, cutoff=0.6)
    return match[0] if match else None


def declared_table(schemas: "SchemaRegistry", name: str, source: str, key: str,
                   schemas_dir: str | None = None) -> "TableSchema":
    """The schema of ``name`` (``<Namespace>.<Table>``), which the configuration ``source`` names
    at ``key``; a ``ConfigError`` naming the key, the closest declared table and the schemas
    there are when no schema declares it: a setting for a table that does not exist would be
    silently ignored."""
    namespace, _, table = name.partition(".")
    schema = schemas.get(namespace, table)
    if schema is None:
        tables = [s.key for s in schemas]
        close = closest(name, tables)
        where = f"schemas in {schemas_dir}" if schemas_dir else "schemas"
        raise ConfigError(source, key, f"no schema declares table {name}" + (f"; did you mean {close}?" if close else "")
                          + (f" ({where}: {', '.join(tables)})" if tables else f" (no {where})"))
    return schema


def declared_column(schema: "TableSchema", column: Any, source: str, key: str) -> str:
    """``column``, when the table declares it; else a ``ConfigError`` naming the key, the closest
    column and the table's columns."""
    if not isinstance(column, str) or column not in schema.column_names:
        close = closest(str(column), schema.column_names)
        raise ConfigError(source, key, f"{schema.key} has no column {column!r}"
                          + (f"; did you mean {close}?" if close else "")
                          + f" (columns: {', '.join(schema.column_names)})")
    return column


def _min(n: float) -> Callable[[Any], str | None]:
    return lambda v: None if v >= n else f"must be >= {n}"


def _column_names(v: list) -> str | None:
    return None if v and all(isinstance(c, str) and c for c in v) else "must be a non-empty list of column names"


def port_problem(v: int) -> str | None:
    """None for a port number 0..65535 (0: any free port), else the problem."""
    return None if 0 <= v <= 65535 else "must be a port number 0..65535"


@dataclass
class TlsConfig:
    cert: str
    key: str
    client_ca: str | None = None  # set: clients must present a certificate signed by it (mTLS)


@dataclass
class ImportConfig:
    """How often a table's locations publish (visibility) and checkpoint (durability)."""

    flush_interval_ms: int = 100
    checkpoint_interval_ms: int = 30000
    #: the key columns of the table's last-by state (docs/lastby.md); empty: none kept
    last_by: tuple[str, ...] = ()
    #: keys a location's last-by state may hold; more stop the location (memory stays bounded)
    lastby_max_keys: int = 1_000_000


@dataclass
class StorageConfig:
    """The storage engine's options (the ``storage`` section of ``dis.yaml``)."""

    block_size_bytes: int = DEFAULT_BLOCK_SIZE_BYTES
    #: column-file descriptors kept open; None: from the descriptor limit when the engine starts
    #: (``storage.filehandles.default_max_open_files``)
    max_open_files: int | None = None
    #: reopen a location in error after an I/O error after this long, then doubling up to the max
    io_retry_initial_ms: int = 1000
    io_retry_max_ms: int = 60000


@dataclass
class DisConfig:
    db_root: str = "var/db"
    schemas: str = "config/schemas"
    host: str = "127.0.0.1"
    port: int = 22021
    metrics_port: int | None = 9464
    #: where the Prometheus endpoint listens; None: ``host`` (the endpoint asks for no TLS or token)
    metrics_host: str | None = None
    #: the block endpoint of the JVM Spark reader (disd.server.blockhttp); None: off.  Absent from
    #: the file it is ``port + 1`` (any free port when ``port`` is 0).
    http_port: int | None = 22022
    tls: TlsConfig | None = None
    token_file: str | None = None
    storage: StorageConfig = field(default_factory=StorageConfig)
    block_cache_bytes: int = 256 << 20
    import_default: ImportConfig = field(default_factory=ImportConfig)
    import_tables: dict[str, ImportConfig] = field(default_factory=dict)
    max_workers: int = 256
    idle_timeout_s: float = 600.0
    #: seconds a block-endpoint connection has to send a request's line and headers (TLS included)
    http_header_timeout_s: float = 5.0
    routed_tables: list[str] | None = None  # patterns this DIS accepts ("Market.*"); None: all
    #: ``import.kafka`` as written: checked against the schemas by ``disd.kafka`` when the DIS starts
    import_kafka: dict | None = None
    source: str = "<defaults>"

    def token(self) -> str | None:
        if not self.token_file:
            return None
        return read_token(self.token_file, self.source)

    def routes(self, namespace: str, table: str) -> bool:
        """Whether this DIS takes the table (``server.tables``; all when absent)."""
        pats = self.routed_tables
        return pats is None or any(fnmatch.fnmatchcase(f"{namespace}.{table}", p) for p in pats)


def read_token(path: str, source: str) -> str:
    try:
        tok = pathlib.Path(path).read_text().strip()
    except OSError as e:
        raise ConfigError(source, "token_file", f"cannot read {path}: {e.strerror}") from None
    if not tok:
        raise ConfigError(source, "token_file", f"{path} is empty")
    return tok


def _import_config(r: ConfigReader, base: ImportConfig) -> ImportConfig:
    s = ImportConfig(
        flush_interval_ms=r.get("flush_interval_ms", int, base.flush_interval_ms, _min(1)),
        checkpoint_interval_ms=r.get("checkpoint_interval_ms", int, base.checkpoint_interval_ms, _min(1)),
        last_by=tuple(r.get("last_by", list, [], _column_names)),
        lastby_max_keys=r.get("lastby_max_keys", int, base.lastby_max_keys, _min(1)),
    )
    r.finish()
    return s


def _tls(r: ConfigReader) -> TlsConfig | None:
    if not r.data:
        return None
    cert = r.get("cert", str, None)
    key = r.get("key", str, None)
    ca = r.get("client_ca", str, None)
    r.finish()
    for name, value in (("cert", cert), ("key", key)):
        if not value:
            raise ConfigError(r.source, r.key(name), "missing (tls needs cert and key)")
    return TlsConfig(cert, key, ca)


def parse_dis_config(data: Any, source: str = "<config>", base_dir: pathlib.Path | None = None) -> DisConfig:
    r = ConfigReader(source, data)
    cfg = DisConfig(source=source)
    cfg.db_root = r.get("db_root", str, cfg.db_root)
    cfg.schemas = r.get("schemas", str, cfg.schemas)
    srv = r.sub("server")
    cfg.host = srv.get("host", str, cfg.host)
    cfg.port = srv.get("port", int, cfg.port, port_problem)
    cfg.metrics_port = srv.get("metrics_port", int, cfg.metrics_port, port_problem)
    cfg.metrics_host = srv.get("metrics_host", str, None, lambda v: None if v.strip() else "must not be empty")
    http_port = srv.get("http_port", (int, bool), None)
    if http_port is True or (http_port is not None and http_port is not False and port_problem(http_port)):
        raise ConfigError(source, "server.http_port", "must be a port number 0..65535, or false (off)")
    if http_port is None:
        http_port = cfg.port + 1 if cfg.port else 0
        if http_port > 65535:
            raise ConfigError(source, "server.http_port", f"defaults to server.port + 1 ({http_port}): give one")
    cfg.http_port = None if http_port is False else http_port
    cfg.tls = _tls(srv.sub("tls"))
    cfg.token_file = srv.get("token_file", str, None)
    cfg.max_workers = srv.get("max_workers", int, cfg.max_workers, _min(4))
    cfg.idle_timeout_s = float(srv.get("idle_timeout_s", (int, float), cfg.idle_timeout_s, _min(0.1)))
    cfg.http_header_timeout_s = float(srv.get("http_header_timeout_s", (int, float), cfg.http_header_timeout_s,
                                              _min(0.1)))
    routed = srv.get("tables", list, None)
    if routed is not None and not all(isinstance(x, str) for x in routed):
        raise ConfigError(source, "server.tables", "must be a list of <Namespace>.<Table> patterns")
    cfg.routed_tables = routed
    srv.finish()
    st = r.sub("storage")
    d = StorageConfig()
    retry_initial = st.get("io_retry_initial_ms", int, d.io_retry_initial_ms, _min(1))
    cfg.storage = StorageConfig(
        block_size_bytes=st.get(
            "block_size_bytes", int, d.block_size_bytes,
            lambda v: None if v >= 4096 and v & (v - 1) == 0 else "must be a power of two >= 4096"),
        max_open_files=st.get("max_open_files", int, d.max_open_files, _min(16)),
        io_retry_initial_ms=retry_initial,
        io_retry_max_ms=st.get(
            "io_retry_max_ms", int, d.io_retry_max_ms,
            lambda v: None if v >= retry_initial else "must be at least storage.io_retry_initial_ms"),
    )
    cfg.block_cache_bytes = st.get("block_cache_bytes", int, cfg.block_cache_bytes, _min(0))
    st.finish()
    imp = r.sub("import")
    cfg.import_default = _import_config(imp.sub("default"), ImportConfig())
    if cfg.import_default.last_by:
        raise ConfigError(source, "import.default.last_by", "last-by keys are declared per table (import.tables.<Ns>.<Table>.last_by)")
    tables = imp.sub("tables")
    for name in tables.data:
        if not isinstance(name, str) or name.count(".") != 1:
            raise ConfigError(source, f"import.tables.{name}", "must be <Namespace>.<Table>")
        cfg.import_tables[name] = _import_config(tables.sub(name), cfg.import_default)
    tables.finish()
    cfg.import_kafka = imp.get("kafka", dict, None)
    imp.finish()
    r.finish()
    if base_dir is not None:
        for attr in ("db_root", "schemas", "token_file"):
            v = getattr(cfg, attr)
            if v and not pathlib.Path(v).is_absolute():
                setattr(cfg, attr, str(base_dir / v))
        if cfg.tls:
            for attr in ("cert", "key", "client_ca"):
                v = getattr(cfg.tls, attr)
                if v and not pathlib.Path(v).is_absolute():
                    setattr(cfg.tls, attr, str(base_dir / v))
    return cfg


def check_import_tables(cfg: DisConfig, schemas: "SchemaRegistry") -> None:
    """Every table of ``import.tables`` is declared by a schema, and every ``last_by`` column by
    its table, once: a typo stops the start naming the key, instead of a setting silently
    ignored or every location of the table in error later."""
    for name, settings in cfg.import_tables.items():
        key = f"import.tables.{name}"
        schema = declared_table(schemas, name, cfg.source, key, cfg.schemas)
        for i, column in enumerate(settings.last_by):
            declared_column(schema, column, cfg.source, f"{key}.last_by[{i}]")
            if column in settings.last_by[:i]:
                raise ConfigError(cfg.source, f"{key}.last_by[{i}]", f"names column {column} twice")


def load_yaml(path: str | pathlib.Path) -> Any:
    p = pathlib.Path(path)
    try:
        return yaml.safe_load(p.read_text())
    except OSError as e:
        raise ConfigError(str(p), "<file>", f"cannot read: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(str(p), "<yaml>", f"not valid YAML: {e}") from None


def load_dis_config(path: str | pathlib.Path) -> DisConfig:
    """Load ``dis serve``'s YAML.  Relative paths in it are taken relative to the working
    directory (as systemd's WorkingDirectory= and `make run` expect)."""
    return parse_dis_config(load_yaml(path), str(path))
