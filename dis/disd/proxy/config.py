"""proxy.yaml: ``dis proxy``'s configuration.

Two sections: ``proxy`` (what readers connect to: ports, the block cache, TLS and token, read as
the DIS reads its ``server`` section) and ``upstream`` (the DISes behind it: a routing file or
one address, and how the proxy authenticates to them, as any client of a DIS does).  Errors name
the file and the key (``disd.config.ConfigReader``); unknown keys are errors.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass, field
from typing import Any

from disd.blocks import DEFAULT_RETRY_S
from disd.config import ConfigError, ConfigReader, TlsConfig, load_yaml, port_problem, read_token
from disd.routing import Routing, load_routing, resolve
from disd.rpc.channel import MIN_KEEPALIVE_MS
from disd.security import ClientSecurity

DEFAULT_PORT = 22051
DEFAULT_CACHE_BYTES = 1 << 30


@dataclass
class UpstreamConfig:
    """The DISes behind the proxy and the proxy's credentials towards them."""

    routing: str | None = None
    address: str | None = None
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    token_file: str | None = None
    server_name: str | None = None
    retry_s: float = DEFAULT_RETRY_S
    timeout_s: float = 30.0
    #: a feed's connection to a DIS is pinged after this long without a reply, and given up when
    #: a ping goes unanswered for ``keepalive_timeout_s``: a DIS that stopped answering (frozen,
    #: its host gone) is left for another member within the sum
    keepalive_s: float = 2.0
    keepalive_timeout_s: float = 3.0


@dataclass
class ProxyConfig:
    name: str = "dis-proxy"
    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    #: the block endpoint for the JVM Spark reader; None: off.  Absent: ``port + 1``.
    http_port: int | None = DEFAULT_PORT + 1
    metrics_port: int | None = 9105
    #: where the Prometheus endpoint listens; None: ``host``
    metrics_host: str | None = None
    cache_bytes: int = DEFAULT_CACHE_BYTES
    tls: TlsConfig | None = None
    token_file: str | None = None
    max_workers: int = 1024
    idle_timeout_s: float = 600.0
    #: seconds a block-endpoint connection has to send a request's line and headers (TLS included)
    http_header_timeout_s: float = 5.0
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    source: str = "<defaults>"

    def token(self) -> str | None:
        """The bearer token readers must present (None: none asked)."""
        return read_token(self.token_file, self.source) if self.token_file else None

    def routing(self) -> Routing:
        """The upstream routing: the routing file, or the one DIS at ``upstream.address``."""
        if self.upstream.routing:
            # the DISes only (Routing.upstream): the file may list this proxy for the readers
            return load_routing(self.upstream.routing).upstream()
        return resolve(self.upstream.address)

    def security(self) -> ClientSecurity | None:
        """How the proxy authenticates to its DISes (None: plaintext, no token)."""
        u = self.upstream
        token = read_token(u.token_file, f"{self.source}: upstream") if u.token_file else None
        return ClientSecurity(u.ca, u.cert, u.key, token, u.server_name).client_security()


def _positive(v: float) -> str | None:
    return None if v > 0 else "must be > 0"


def _tls(r: ConfigReader) -> TlsConfig | None:
    if not r.data:
        return None
    cert, key, ca = r.get("cert", str, None), r.get("key", str, None), r.get("client_ca", str, None)
    r.finish()
    for name, value in (("cert", cert), ("key", key)):
        if not value:
            raise ConfigError(r.source, r.key(name), "missing (tls needs cert and key)")
    return TlsConfig(cert, key, ca)


def parse_proxy_config(data: Any, source: str = "<config>") -> ProxyConfig:
    r = ConfigReader(source, data)
    cfg = ProxyConfig(source=source)
    p = r.sub("proxy")
    cfg.name = p.get("name", str, cfg.name)
    cfg.host = p.get("host", str, cfg.host)
    cfg.port = p.get("port", int, cfg.port, port_problem)
    http_port = p.get("http_port", int, None, port_problem)
    if http_port is None:
        http_port = cfg.port + 1 if cfg.port else 0
        if http_port > 65535:
            raise ConfigError(source, "proxy.http_port", f"defaults to proxy.port + 1 ({http_port}): give one")
    cfg.http_port = http_port or None  # 0: off
    cfg.metrics_port = p.get("metrics_port", int, cfg.metrics_port, port_problem) or None  # 0: off
    cfg.metrics_host = p.get("metrics_host", str, None, lambda v: None if v.strip() else "must not be empty")
    cfg.cache_bytes = p.get("cache_bytes", int, cfg.cache_bytes, lambda v: None if v >= 0 else "must be >= 0")
    cfg.tls = _tls(p.sub("tls"))
    token_file = p.get("token_file", str, None)
    auth = p.sub("auth")
    auth_token = auth.get("token_file", str, None)
    auth.finish()
    if token_file and auth_token:
        raise ConfigError(source, "proxy.auth.token_file", "give the token file once (proxy.token_file)")
    cfg.token_file = token_file or auth_token
    cfg.max_workers = p.get("max_workers", int, cfg.max_workers, lambda v: None if v >= 4 else "must be >= 4")
    cfg.idle_timeout_s = float(p.get("idle_timeout_s", (int, float), cfg.idle_timeout_s, _positive))
    cfg.http_header_timeout_s = float(p.get("http_header_timeout_s", (int, float), cfg.http_header_timeout_s,
                                            _positive))
    p.finish()
    u = r.sub("upstream")
    up = UpstreamConfig()
    up.routing = u.get("routing", str, None)
    up.address = u.get("address", str, None)
    for name in ("ca", "cert", "key", "token_file", "server_name"):
        setattr(up, name, u.get(name, str, None))
    up.retry_s = float(u.get("retry_s", (int, float), up.retry_s, lambda v: None if v >= 0 else "must be >= 0"))
    up.timeout_s = float(u.get("timeout_s", (int, float), up.timeout_s, _positive))
    least = MIN_KEEPALIVE_MS / 1000
    for name in ("keepalive_s", "keepalive_timeout_s"):
        setattr(up, name, float(u.get(name, (int, float), getattr(up, name),
                                      lambda v: None if v >= least else f"must be >= {least:g}")))
    u.finish()
    r.finish()
    if up.routing and up.address:
        raise ConfigError(source, "upstream.address", "give either upstream.routing or upstream.address, not both")
    if not up.routing and not up.address:
        raise ConfigError(source, "upstream", "missing: upstream.routing (a routing file) or upstream.address")
    if up.address and ":" not in up.address:
        raise ConfigError(source, "upstream.address", "must be host:port")
    if bool(up.cert) != bool(up.key):
        raise ConfigError(source, "upstream.cert" if up.key else "upstream.key", "cert and key go together")
    cfg.upstream = up
    return cfg


def load_proxy_config(path: str | pathlib.Path) -> ProxyConfig:
    """Load proxy.yaml and check that its routing file and token files can be read now (a
    mistake is said at start, naming the key, not at the first reader)."""
    cfg = parse_proxy_config(load_yaml(path), str(path))
    cfg.routing()
    cfg.security()
    cfg.token()
    return cfg
