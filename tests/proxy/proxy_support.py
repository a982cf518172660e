"""A real ``dis proxy`` process in front of real ``dis serve`` processes fed by a real tailer:
what the tests of tests/proxy share."""

from __future__ import annotations

import pathlib
import threading
import time

import grpc
import yaml

from disd.logger import IntradayLoggerBuilder
from disd.rpc.channel import open_channel
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from support import (BIN, ROOT, Proc, free_port, free_port_pair, scrape, start_dis_process, start_tailer, trade_rows,
                     wait_for, write_dis_config, write_tailer_config)


def write_proxy_config(tmp: pathlib.Path, upstream: dict, **proxy) -> tuple[pathlib.Path, int]:
    """``tmp/proxy.yaml`` on loopback (gRPC and block endpoint on a free port pair, metrics on a
    free port, a small cache) with ``upstream``; returns (path, gRPC port)."""
    port = free_port_pair()
    section = {"name": "tdcp-test", "host": "127.0.0.1", "port": port, "metrics_port": free_port(),
               "cache_bytes": 64 << 20, "max_workers": 700, **proxy}
    path = tmp / "proxy.yaml"
    path.write_text(yaml.safe_dump({"proxy": section, "upstream": {"retry_s": 30, **upstream}}))
    return path, port


def health_ok(port: int, security=None) -> bool:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    ch = open_channel(f"127.0.0.1:{port}", security)
    try:
        r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1)
        return r.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False
    finally:
        ch.close()


def start_proxy(tmp: pathlib.Path, config: pathlib.Path, security=None) -> Proc:
    """``dis proxy --config CONFIG --json-logs`` (output in ``tmp/proxy.log``), once healthy."""
    p = Proc([str(BIN / "dis"), "proxy", "--config", str(config), "--json-logs"], tmp / "proxy.log").start()
    port = yaml.safe_load(config.read_text())["proxy"]["port"]

    def healthy():
        if not p.alive():
            raise AssertionError("dis proxy exited:\n" + p.log_text()[-3000:])
        return health_ok(port, security)

    try:
        wait_for(healthy, 60, 0.1, "proxy health")
    except AssertionError:
        p.kill9() if p.alive() else None
        raise AssertionError("proxy did not become healthy:\n" + p.log_text()[-3000:]) from None
    return p


def metrics_port(config: pathlib.Path) -> int:
    return yaml.safe_load(config.read_text())["proxy"]["metrics_port"]


def dis_metrics_port(config: pathlib.Path) -> int:
    return yaml.safe_load(config.read_text())["server"]["metrics_port"]


class Dis:
    """A ``dis serve`` process under ``tmp/<name>`` with a tailer of ``logs`` (``last_by``: the
    key columns Market.Trade declares)."""

    def __init__(self, tmp: pathlib.Path, logs: pathlib.Path, name: str = "dis", last_by: tuple[str, ...] = (),
                 **settings) -> None:
        self.dir = tmp / name
        self.dir.mkdir(exist_ok=True)
        self.logs = logs
        self.port = free_port_pair()
        self.config = write_dis_config(self.dir, self.port, **settings)
        if last_by:  # import.tables.Market.Trade.last_by (docs/lastby.md)
            data = yaml.safe_load(self.config.read_text())
            data["import"].setdefault("tables", {})["Market.Trade"] = {"last_by": list(last_by)}
            self.config.write_text(yaml.safe_dump(data))
        self.proc: Proc | None = None
        self.tailer: Proc | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, tailer: bool = True) -> "Dis":
        self.proc = start_dis_process(self.dir, self.config)
        if tailer and (self.tailer is None or not self.tailer.alive()):
            self.tailer = start_tailer(self.dir, write_tailer_config(self.dir, self.port, self.logs,
                                                                     state_dir=str(self.dir / "state")))
        return self

    def metrics(self) -> dict:
        return scrape(dis_metrics_port(self.config))

    def stop(self) -> None:
        for p in (self.tailer, self.proc):
            if p is not None and p.alive():
                p.kill9()


def replica_set(tmp: pathlib.Path, logs: pathlib.Path, last_by: tuple[str, ...] = ()) -> tuple[list[Dis], pathlib.Path]:
    """Two replicas (``dis-a``, ``dis-b``, not started) of one instance serving every table, and
    the routing file that names them so."""
    replicas = [Dis(tmp, logs, name, last_by=last_by) for name in ("dis-a", "dis-b")]
    routing = tmp / "routing.yaml"
    routing.write_text(yaml.safe_dump({"instances": [{"name": "market", "tables": ["*"], "replicas": [
        {"name": r.dir.name, "address": r.address} for r in replicas]}]}))
    return replicas, routing


def logger(logs: pathlib.Path, ip: str = "feed0", day: str = "2026-11-22"):
    return (IntradayLoggerBuilder(str(ROOT / "config" / "schemas" / "Market.Trade.yaml")).set_process_name("feed")
            .set_log_dir(str(logs)).set_column_partition_value(day).set_internal_partition(ip).build())


def published_rows(address: str, security=None) -> int:
    """Rows of Market.Trade the server at ``address`` lists, over every location."""
    from disd.client import connect

    with connect(address, security=security, retry_s=0) as c:
        return sum(s.rows for s in c.locations("Market", "Trade"))


class Subscriber:
    """One reader's Subscribe stream (on its own thread): every (location, rows) it was given."""

    def __init__(self, channel: grpc.Channel, namespace: str = "Market", table: str = "Trade") -> None:
        self.seen: list[tuple[str, int]] = []
        self.error: Exception | None = None
        self.call = dis_pb2_grpc.TableDataStub(channel).Subscribe(
            dis_pb2.SubscribeRequest(namespace=namespace, table=table))
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for m in self.call:
                self.seen.append((m.key.internal_partition + "/" + m.key.column_partition, m.rows))
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                self.error = e

    def last(self, location: str) -> int:
        return max((r for loc, r in self.seen if loc == location), default=-1)

    def sizes(self, location: str) -> list[int]:
        return [r for loc, r in self.seen if loc == location]

    def cancel(self) -> None:
        self.call.cancel()


def log_rows(lg, start: int, n: int) -> None:
    lg.log_batch(trade_rows(start, n), atomic=True)
    lg.flush() if hasattr(lg, "flush") else None


def wait_rows(address: str, n: int, timeout: float = 60, security=None) -> None:
    wait_for(lambda: published_rows(address, security) >= n, timeout, 0.1, f"{n} rows at {address}")


def settle(seconds: float = 0.5) -> None:
    time.sleep(seconds)
