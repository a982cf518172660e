"""``dis proxy``: the proxy's life cycle, as ``dis serve``'s (``disd.server.daemon``).

Start: read the upstream routing, start the gRPC server (TableData, health, reflection; TLS and
token as configured), the block endpoint and the Prometheus endpoint, then READY=1.  Feeds are
started by the first reader that names a table.  Stop (SIGTERM/SIGINT): STOPPING=1, health
NOT_SERVING, stop accepting and end the streams within the grace period, close the upstream
subscriptions, exit 0.  The proxy holds nothing durable: a restart only empties its cache.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING
from wsgiref.simple_server import WSGIServer

import grpc
import structlog
from grpc_health.v1 import health

from disd.proxy.cache import CachedBlocks
from disd.proxy.config import ProxyConfig
from disd.proxy.metrics import ProxyCollector
from disd.proxy.service import ProxyBlockBackend, ProxyTableData
from disd.proxy.upstream import Upstream
from disd.rpc.channel import keepalive_options
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from disd.server.blockcache import BlockCache
from disd.server.daemon import (
    enable_health_and_reflection,
    grpc_server,
    listen,
    run_until_signalled,
    serve_metrics,
    set_serving,
    stop_front,
    stop_metrics,
    warn_of_exposure,
)

if TYPE_CHECKING:
    from disd.server.blockhttp import BlockHttpServer

log = structlog.get_logger(__name__)

SERVICE_NAMES = (dis_pb2.DESCRIPTOR.services_by_name["TableData"].full_name,)


class ProxyServer:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.started = time.time()
        self.health = health.HealthServicer()
        self.server: grpc.Server | None = None
        self.upstream: Upstream | None = None
        self.cache: BlockCache | None = None
        self.service: ProxyTableData | None = None
        self.port: int | None = None
        self.http_port: int | None = None
        self.metrics_port: int | None = None
        self._http_server: BlockHttpServer | None = None
        self._metrics_server: WSGIServer | None = None

    def start(self) -> int:
        try:
            return self._start()
        except BaseException:
            self.stop(0)
            raise

    def _start(self) -> int:
        cfg = self.config
        u = cfg.upstream
        self.upstream = Upstream(cfg.routing(), cfg.security(), u.retry_s, u.timeout_s,
                                 feed_options=keepalive_options(round(u.keepalive_s * 1000),
                                                                round(u.keepalive_timeout_s * 1000)))
        self.cache = BlockCache(cfg.cache_bytes)
        blocks = CachedBlocks(self.upstream, self.cache)
        self.service = ProxyTableData(self.upstream, blocks, self.started)
        token = cfg.token()
        self.server = grpc_server(cfg.max_workers, token)
        dis_pb2_grpc.add_TableDataServicer_to_server(self.service, self.server)
        enable_health_and_reflection(self.server, self.health, SERVICE_NAMES)
        self.port = listen(self.server, cfg.host, cfg.port, cfg.tls)
        self.server.start()
        if cfg.http_port is not None:
            from disd.server.blockhttp import start_block_http

            self._http_server = start_block_http(cfg.host, cfg.http_port, ProxyBlockBackend(self.upstream, blocks),
                                                 cfg.tls, token, cfg.max_workers, cfg.idle_timeout_s,
                                                 key="proxy.http_port", header_timeout_s=cfg.http_header_timeout_s)
            self.http_port = self._http_server.server_address[1]
        if cfg.metrics_port is not None:
            self._metrics_server = serve_metrics(cfg.metrics_host or cfg.host, cfg.metrics_port, ProxyCollector(self))
            self.metrics_port = self._metrics_server.server_address[1]
        set_serving(self.health, SERVICE_NAMES)
        warn_of_exposure("proxy", cfg.host, self.port, cfg.tls is not None, token is not None, self.metrics_port,
                         cfg.metrics_host)
        log.info("dis proxy serving", name=cfg.name, address=f"{cfg.host}:{self.port}", http_port=self.http_port,
                 metrics_port=self.metrics_port, upstream=self.upstream.routing.addresses,
                 cache_bytes=cfg.cache_bytes, tls=bool(cfg.tls), token=bool(token))
        return self.port

    def status_line(self) -> str:
        """One line for systemd's STATUS=: readers, upstream subscriptions, cache."""
        if self.upstream is None or self.service is None or self.cache is None:
            return "stopped"
        subs = self.upstream.subscriptions()
        return (f"serving on {self.config.host}:{self.port}; {self.service.subscribers} subscribers, "
                f"{sum(subs.values())}/{len(subs)} upstream subscriptions, cache {self.cache.size_bytes >> 20} MiB")

    def stop(self, grace_s: float = 5.0) -> None:
        stop_front(self._http_server, self.server, self.health, grace_s)
        self._http_server = self.server = None
        if self.upstream is not None:
            self.upstream.close()
        stop_metrics(self._metrics_server)
        self._metrics_server = None
        log.info("dis proxy stopped", name=self.config.name)


def serve(config: ProxyConfig) -> int:
    """Run until SIGTERM/SIGINT; returns the exit code."""

    def start() -> tuple[ProxyServer, str]:
        server = ProxyServer(config)
        server.start()
        return server, f"serving on {config.host}:{server.port}"

    return run_until_signalled(start)
