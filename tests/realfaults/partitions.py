"""The partition test's cluster: a tailer, two replicas, a proxy and readers, each on its own
network host (``netns``), all real processes driven by their configs; what it watched while
faults came and went (``Watch``), and the figures it reports (``Timeline``)."""

from __future__ import annotations

import pathlib
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field

import numpy as np
import yaml

from disd.client import connect
from support import BIN, Proc, subprocess_env, wait_for, write_dis_config
from prometheus_client.parser import text_string_to_metric_families

from .daemons import start_dis, stop
from .netns import Network

DIS_PORT, PROXY_PORT, METRICS_PORT = 22021, 22051, 9105
HOSTS = ["tailer", "r1", "r2", "proxy", "readers"]
BASES = {"a": 0, "b": 10_000_000}  # Size of each location's first row: Spark sees no location


@dataclass
class Cluster:
    tmp: pathlib.Path
    net: Network
    logs: pathlib.Path
    proxy_break: str | None = None
    procs: dict[str, Proc] = field(default_factory=dict)

    def address(self, host: str) -> str:
        return f"{self.net[host].ip}:{PROXY_PORT if host == 'proxy' else DIS_PORT}"

    def start(self) -> None:
        routing = self.tmp / "routing.yaml"
        routing.write_text(yaml.safe_dump({"instances": [{
            "name": "market", "tables": ["Market.*"],
            "replicas": [{"name": r, "address": self.address(r)} for r in ("r1", "r2")],
            "proxies": [{"name": "tdcp", "address": self.address("proxy")}]}]}))
        self.routing = routing
        for r in ("r1", "r2"):
            d = self.tmp / r
            d.mkdir()
            cfg = write_dis_config(d, DIS_PORT, METRICS_PORT, db_root=d / "db", host=self.net[r].ip, flush_ms=50,
                                   checkpoint_ms=500)
            self.procs[r] = start_dis(d, cfg, wrap=self.net[r].wrap())
        t = self.tmp / "tailer"
        t.mkdir()
        tcfg = t / "tailer.yaml"
        tcfg.write_text(yaml.safe_dump({"routing": str(routing), "log_dirs": [str(self.logs)],
                                        "state_dir": str(t / "state"), "poll_interval_ms": 20,
                                        "max_backoff_ms": 500, "metrics_port": METRICS_PORT,
                                        "metrics_host": self.net["tailer"].ip}))
        self.procs["tailer"] = Proc([*self.net["tailer"].wrap(), str(BIN / "dis-tailer"), "--config", str(tcfg)],
                                    t / "tailer.log", env=subprocess_env()).start()
        p = self.tmp / "proxy"
        p.mkdir()
        pcfg = p / "proxy.yaml"
        pcfg.write_text(yaml.safe_dump({"proxy": {"name": "tdcp", "host": self.net["proxy"].ip, "port": PROXY_PORT,
                                                  "metrics_port": METRICS_PORT, "cache_bytes": 64 << 20,
                                                  "max_workers": 64},
                                        "upstream": {"routing": str(routing), "retry_s": 3600}}))
        cmd = ([str(BIN / "dis"), "proxy"] if self.proxy_break is None else
               [sys.executable, "-m", "realfaults.broken", self.proxy_break, "proxy"])
        self.procs["proxy"] = Proc([*self.net["proxy"].wrap(), *cmd, "--config", str(pcfg), "--json-logs"],
                                   p / "proxy.log", env=subprocess_env()).start()
        wait_for(lambda: _serving(self.address("proxy")), 60, 0.1, "the proxy's health")

    def start_readers(self, spark: bool) -> None:
        r = self.tmp / "readers"
        r.mkdir()
        self.seen = r / "seen.txt"
        self.spark_out = r / "spark"
        self.spark_out.mkdir()
        py = sys.executable
        self.procs["subscriber"] = Proc([*self.net["readers"].wrap(), py, "-m", "realfaults.readers", "subscribe",
                                         self.address("proxy"), str(self.seen)], r / "subscriber.log",
                                        env=subprocess_env()).start()
        if spark:
            routing = r / "routing.yaml"
            routing.write_text(self.routing.read_text())
            self.procs["spark"] = Proc([*self.net["readers"].wrap(), py, "-m", "realfaults.readers", "spark",
                                        str(routing), str(r / "ckpt"), str(self.spark_out)], r / "spark.log",
                                       env={**subprocess_env(), "SPARK_LOCAL_IP": "127.0.0.1"}).start()

    def stop(self) -> None:
        stop(*self.procs.values())

    def pid(self, name: str) -> int:
        return self.procs[name].p.pid

    def rows(self, host: str) -> dict[str, int]:
        with connect(self.address(host), retry_s=0, timeout_s=2) as c:
            return {s.key.internal_partition: s.rows for s in c.locations("Market", "Trade")}

    def sizes(self, host: str, ip: str) -> np.ndarray:
        with connect(self.address(host), retry_s=10) as c:
            snap = next(s for s in c.locations("Market", "Trade") if s.key.internal_partition == ip)
            return np.asarray(c.read_location(snap, ["Size"]).column("Size"), np.int64)

    def tailer_metrics(self) -> dict[str, dict[str, float]]:
        text = urllib.request.urlopen(f"http://{self.net['tailer'].ip}:{METRICS_PORT}/metrics", timeout=2).read()
        out: dict[str, dict[str, float]] = {}
        for fam in text_string_to_metric_families(text.decode()):
            for s in fam.samples:
                if s.name.startswith("dis_tailer_replica_") or s.name == "dis_tailer_reconnects_total":
                    label = s.labels.get("replica", "")
                    out.setdefault(s.name, {})[label] = out.get(s.name, {}).get(label, 0) + s.value
        return out


def _serving(address: str) -> bool:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from disd.rpc.channel import open_channel

    ch = open_channel(address)
    try:
        return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1
    except Exception:  # noqa: BLE001
        return False
    finally:
        ch.close()


class Watch:
    """Threads that sample, every 100 ms, each replica's rows and the tailer's metrics the alert
    rules use (``dis_tailer_replica_connected``, ``..._bytes_behind``, ``dis_tailer_reconnects_total``)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.samples: list[tuple[float, str, object]] = []
        self._stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(what,), daemon=True)
                        for what in ("r1", "r2", "metrics")]
        for t in self.threads:
            t.start()

    def _loop(self, what: str) -> None:
        while not self._stop.is_set():
            try:
                value = self.cluster.tailer_metrics() if what == "metrics" else self.cluster.rows(what)
                self.samples.append((time.time(), what, value))
            except Exception:  # noqa: BLE001 - unreachable meanwhile
                pass
            self._stop.wait(0.1)

    def close(self) -> None:
        self._stop.set()
        for t in self.threads:
            t.join(5)

    def series(self, what: str, since: float = 0, until: float = float("inf")) -> list[tuple[float, object]]:
        return [(t, v) for t, w, v in self.samples if w == what and since <= t <= until]


@dataclass
class Phase:
    name: str
    start: float
    healed: float


def visible_at(seen: list[tuple[float, str, str, int]], ip: str, rows: int, kind: str = "sub") -> float | None:
    """When a reader first saw location ``ip`` at ``rows`` rows or more."""
    for t, k, loc, n in seen:
        if k == kind and loc == ip and n >= rows:
            return t
    return None


def read_seen(path: pathlib.Path) -> list[tuple[float, str, str, int]]:
    out = []
    for line in path.read_text().splitlines():
        t, kind, ip, rows = line.split()
        out.append((float(t), kind, ip, int(rows)))
    return out
