"""Two real ``dis serve`` processes as one replica set, each fed the same binary logs by a tailer
of its own: what the reader tests of tests/replicas share.  Each replica lives under
``tmp/<name>/`` (its dis.yaml, database, logs of the daemons, tailer state)."""

from __future__ import annotations

import pathlib
from dataclasses import dataclass, field

import yaml

from disd.logger import IntradayLoggerBuilder
from support import ROOT, Proc, free_port_pair, start_dis_process, start_tailer, trade_rows, write_dis_config, \
    write_tailer_config

DAYS = ("2026-11-22", "2026-11-23")


@dataclass
class Replica:
    name: str
    port: int
    dir: pathlib.Path
    config: pathlib.Path
    proc: Proc | None = None
    tailer: Proc | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass
class ReplicaSet:
    tmp: pathlib.Path
    logs: pathlib.Path
    replicas: list[Replica] = field(default_factory=list)
    routing: pathlib.Path | None = None

    def by_address(self, address: str) -> Replica:
        return next(r for r in self.replicas if r.address == address)

    def stop(self) -> None:
        for r in self.replicas:
            for p in (r.tailer, r.proc):
                if p is not None and p.alive():
                    p.kill9()


def replica_set(tmp: pathlib.Path, names=("dis-a", "dis-b"), tailers: bool = True) -> ReplicaSet:
    """DIS processes ``names`` (started, healthy) as one routing entry taking every table (the
    routing file is ``tmp/routing.yaml``), each with a tailer process of ``tmp/logs``."""
    logs = tmp / "logs"
    logs.mkdir(exist_ok=True)
    rs = ReplicaSet(tmp, logs)
    for name in names:
        d = tmp / name
        d.mkdir()
        port = free_port_pair()
        r = Replica(name, port, d, write_dis_config(d, port))
        rs.replicas.append(r)
    rs.routing = tmp / "routing.yaml"
    rs.routing.write_text(yaml.safe_dump({"instances": [{"name": "market", "tables": ["*"], "replicas": [
        {"name": r.name, "address": r.address} for r in rs.replicas]}]}))
    try:
        for r in rs.replicas:
            r.proc = start_dis_process(r.dir, r.config)
            if tailers:
                r.tailer = start_tailer(r.dir, write_tailer_config(r.dir, r.port, logs, state_dir=str(r.dir / "state")))
    except BaseException:
        rs.stop()
        raise
    return rs


def logger(logs: pathlib.Path, ip: str, day: str):
    return (IntradayLoggerBuilder(str(ROOT / "config" / "schemas" / "Market.Trade.yaml")).set_process_name("feed")
            .set_log_dir(str(logs)).set_column_partition_value(day).set_internal_partition(ip).build())


def write_logs(logs: pathlib.Path, locations: int, rows: int) -> int:
    """``locations`` Market.Trade locations (feed0.. over DAYS) of ``rows`` rows each, Size
    numbering every row once (0 .. total-1); returns the total."""
    n = 0
    for i in range(locations):
        lg = logger(logs, f"feed{i // len(DAYS)}", DAYS[i % len(DAYS)])
        lg.log_batch(trade_rows(n, rows), atomic=True)
        lg.close()
        n += rows
    return n


def published(address: str) -> int:
    """Rows the DIS at ``address`` has published, over every location."""
    from disd.client import connect

    with connect(address, retry_s=0) as c:
        return sum(s.rows for s in c.locations())
