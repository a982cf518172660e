"""``dis-tailer``'s YAML configuration.

    dis: 127.0.0.1:22021            # or  routing: config/routing.yaml
    log_dirs: [var/logs]
    # tls: {ca: ..., cert: ..., key: ..., server_name: ...}   token_file: ...
    # poll_interval_ms: 200  max_in_flight_bytes: 8388608  chunk_bytes: 4194304
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass, field
from typing import Any

from disd.config import ConfigError, _Reader, load_yaml, read_token
from disd.routing import Routing, load_routing
from disd.rpc.channel import ClientSecurity


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
    state_dir: str = "var/tailer"
    source: str = "<config>"


def parse_tailer_config(data: Any, source: str = "<config>") -> TailerConfig:
    r = _Reader(source, data)
    address = r.get("dis", str, None)
    routing_file = r.get("routing", str, None)
    if bool(address) == bool(routing_file):
        raise ConfigError(source, "dis", "give exactly one of 'dis: host:port' or 'routing: FILE'")
    if address:
        if ":" not in address:
            raise ConfigError(source, "dis", "must be host:port")
        routing = Routing.single(address)
    else:
        routing = load_routing(routing_file)
    dirs = r.get("log_dirs", list, None)
    if not dirs or not all(isinstance(d, str) and d for d in dirs):
        raise ConfigError(source, "log_dirs", "must be a non-empty list of directories")

    def positive(v: int) -> str | None:
        return None if v > 0 else "must be > 0"

    cfg = TailerConfig(routing=routing, log_dirs=list(dirs), source=source)
    cfg.poll_interval_ms = r.get("poll_interval_ms", int, cfg.poll_interval_ms, positive)
    cfg.max_in_flight_bytes = r.get("max_in_flight_bytes", int, cfg.max_in_flight_bytes, positive)
    cfg.chunk_bytes = r.get("chunk_bytes", int, cfg.chunk_bytes, positive)
    cfg.torn_tail_grace_ms = r.get("torn_tail_grace_ms", int, cfg.torn_tail_grace_ms, positive)
    cfg.retry_refused_ms = r.get("retry_refused_ms", int, cfg.retry_refused_ms, positive)
    cfg.max_backoff_ms = r.get("max_backoff_ms", int, cfg.max_backoff_ms, positive)
    cfg.state_dir = r.get("state_dir", str, cfg.state_dir)
    tls = r.sub("tls")
    ca = tls.get("ca", str, None)
    cert = tls.get("cert", str, None)
    key = tls.get("key", str, None)
    server_name = tls.get("server_name", str, None)
    tls.finish()
    if (cert or key) and not ca:
        raise ConfigError(source, "tls.ca", "required when a client certificate is given")
    token_file = r.get("token_file", str, None)
    token = read_token(token_file, source) if token_file else None
    cfg.security = ClientSecurity(ca=ca, cert=cert, key=key, token=token, server_name=server_name)
    r.finish()
    return cfg


def load_tailer_config(path: str | pathlib.Path) -> TailerConfig:
    return parse_tailer_config(load_yaml(path), str(path))
