"""Configuration files of the daemon (``dis serve``) and the tailer, loaded and validated here.

Every error names the file and the key (``config/dis.yaml: storage.max_open_files: must be an
integer >= 16``), and unknown keys are errors too: a typo must not silently fall back to a default.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass, field
from typing import Any, Callable

import yaml


class ConfigError(ValueError):
    def __init__(self, source: str, key: str, problem: str) -> None:
        super().__init__(f"{source}: {key}: {problem}")
        self.source, self.key, self.problem = source, key, problem


class Reader:
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

    def sub(self, name: str) -> "Reader":
        self.used.add(name)
        return Reader(self.source, self.data.get(name), f"{self.prefix}{name}.")

    def finish(self) -> None:
        unknown = sorted(set(self.data) - self.used, key=str)
        if unknown:
            raise ConfigError(self.source, self.key(str(unknown[0])), "unknown key")


def _min(n: int) -> Callable[[Any], str | None]:
    return lambda v: None if v >= n else f"must be >= {n}"


def _port(v: int) -> str | None:
    return None if 0 <= v <= 65535 else "must be a port number 0..65535"


@dataclass
class TlsConfig:
    cert: str
    key: str
    client_ca: str | None = None  # set: clients must present a certificate signed by it (mTLS)


@dataclass
class ImportSettings:
    flush_interval_ms: int = 100
    checkpoint_interval_ms: int = 30000


@dataclass
class DisConfig:
    db_root: str = "var/db"
    schemas: str = "config/schemas"
    host: str = "127.0.0.1"
    port: int = 22021
    metrics_port: int | None = 9464
    tls: TlsConfig | None = None
    token_file: str | None = None
    block_size_bytes: int = 65536
    max_open_files: int = 512
    block_cache_bytes: int = 256 << 20
    io_retry_initial_ms: int = 1000  # a location in error after an I/O error is reopened after this,
    io_retry_max_ms: int = 60000     # then after twice as long each time, up to this
    import_default: ImportSettings = field(default_factory=ImportSettings)
    import_tables: dict[str, ImportSettings] = field(default_factory=dict)
    max_workers: int = 256
    idle_timeout_s: float = 600.0
    routed_tables: list[str] | None = None  # patterns this DIS accepts ("Market.*"); None: all
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


def _import_settings(r: Reader, base: ImportSettings) -> ImportSettings:
    s = ImportSettings(
        flush_interval_ms=r.get("flush_interval_ms", int, base.flush_interval_ms, _min(1)),
        checkpoint_interval_ms=r.get("checkpoint_interval_ms", int, base.checkpoint_interval_ms, _min(1)),
    )
    r.finish()
    return s


def _tls(r: Reader) -> TlsConfig | None:
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
    r = Reader(source, data)
    cfg = DisConfig(source=source)
    cfg.db_root = r.get("db_root", str, cfg.db_root)
    cfg.schemas = r.get("schemas", str, cfg.schemas)
    srv = r.sub("server")
    cfg.host = srv.get("host", str, cfg.host)
    cfg.port = srv.get("port", int, cfg.port, _port)
    cfg.metrics_port = srv.get("metrics_port", int, cfg.metrics_port, _port)
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
    cfg.block_size_bytes = st.get(
        "block_size_bytes", int, cfg.block_size_bytes,
        lambda v: None if v >= 4096 and v & (v - 1) == 0 else "must be a power of two >= 4096",
    )
    cfg.max_open_files = st.get("max_open_files", int, cfg.max_open_files, _min(16))
    cfg.block_cache_bytes = st.get("block_cache_bytes", int, cfg.block_cache_bytes, _min(0))
    cfg.io_retry_initial_ms = st.get("io_retry_initial_ms", int, cfg.io_retry_initial_ms, _min(1))
    cfg.io_retry_max_ms = st.get(
        "io_retry_max_ms", int, cfg.io_retry_max_ms,
        lambda v: None if v >= cfg.io_retry_initial_ms else "must be at least storage.io_retry_initial_ms",
    )
    st.finish()
    imp = r.sub("import")
    cfg.import_default = _import_settings(imp.sub("default"), ImportSettings())
    tables = imp.sub("tables")
    for name in tables.data:
        if not isinstance(name, str) or name.count(".") != 1:
            raise ConfigError(source, f"import.tables.{name}", "must be <Namespace>.<Table>")
        cfg.import_tables[name] = _import_settings(tables.sub(name), cfg.import_default)
    tables.finish()
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
