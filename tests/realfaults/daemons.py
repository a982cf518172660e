"""The real processes of these tests, driven only through their command lines and configs:
``dis serve`` (or a variant broken on purpose, ``realfaults.broken``), ``dis-tailer`` and the
loggers, and what a test asks a DIS through the public client (Status, rows)."""

from __future__ import annotations

import pathlib
import sys

import yaml

from disd.client import connect
from support import BIN, Proc, dis_healthy, wait_for


def dis_command(config: pathlib.Path, broken: str | None = None) -> list[str]:
    if broken is None:
        return [str(BIN / "dis"), "serve", "--config", str(config), "--json-logs"]
    return [sys.executable, "-m", "realfaults.broken", broken, "serve", "--config", str(config), "--json-logs"]


def start_dis(workdir: pathlib.Path, config: pathlib.Path, broken: str | None = None, env: dict | None = None,
              wrap: list[str] | None = None, timeout: float = 60) -> Proc:
    """``dis serve`` (``wrap`` before it: ``ip netns exec NS``, say) once its health answers."""
    from support import subprocess_env

    p = Proc([*(wrap or []), *dis_command(config, broken)], workdir / "dis.log",
             env={**subprocess_env(), **(env or {})}).start()
    port = yaml.safe_load(config.read_text())["server"]["port"]
    host = yaml.safe_load(config.read_text())["server"].get("host", "127.0.0.1")

    def healthy() -> bool:
        if not p.alive():
            raise AssertionError(f"dis serve exited ({p.p.returncode}):\n" + p.log_text()[-3000:])
        return dis_healthy(port) if host == "127.0.0.1" else _healthy_at(f"{host}:{port}")

    wait_for(healthy, timeout, 0.05, "DIS health")
    return p


def _healthy_at(address: str) -> bool:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from disd.rpc.channel import open_channel

    ch = open_channel(address)
    try:
        r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1)
        return r.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        ch.close()


def stop(*procs: Proc | None) -> None:
    """Kill what is still running (SIGKILL: the tests here never need a clean stop)."""
    for p in procs:
        if p is not None and p.alive():
            p.kill9()


def status(address: str) -> dict[str, object]:
    """Market.Trade's locations at ``address`` by internal partition (``LocationStatus``)."""
    with connect(address, retry_s=0, timeout_s=5) as c:
        return {loc.key.internal_partition: loc for loc in c.status().locations if loc.key.table == "Trade"}
