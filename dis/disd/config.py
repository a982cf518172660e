"""Configuration: one dataclass per concept, with its defaults written once, and the YAML loader.

``StorageConfig`` and ``ImportConfig`` are the storage engine's own options (the engine takes
them as they are); ``DisConfig`` is ``dis serve``'s whole file and holds one of each.  The
tailer's and the routing file's loaders read their YAML with the same ``ConfigReader``.

Every error names the file and the key (``config/dis.yaml: storage.max_open_files: must be an
integer >= 16``), and unknown keys are errors too: a typo must not silently fall back to a default.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass, field
from typing import Any, Callable

import yaml

from disd.errors import DisError


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
        unknown = sorted(set(self.data) - self.used, key=str)
        if unknown:
            raise ConfigError(self.source, self.key(str(unknown[0])), "unknown key")


def _min(n: int) -> Callable[[Any], str | None]:
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
    routed_tables: list[str] | None = None  # patterns this DIS accepts ("Market.*"); None: all
    #: ``import.kafka`` as written: checked against the schemas by ``disd.kafka`` when the DIS starts
    import_kafka: dict | None = None
    source: str = "<defaults>"

    def token(self) -> str | None:
        if not self.token_file:
            return None
        return read_token(self.token_file, self.source)


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
