"""The real daemons as subprocesses: ``dis serve`` and ``dis-tailer``."""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys

import yaml

from .paths import BIN, ROOT, TESTS
from .waiting import wait_for


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = map(int, pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


_ISSUED: set[int] = set()


def free_port_pair() -> int:
    """A free port whose next port is free too, for a server's port and (for a DIS) its block
    endpoint at the default ``port + 1``.

    Chosen below the kernel's ephemeral range: a port the kernel hands out (``bind(0)``, and
    every outgoing connection's local port) can be taken by another socket between the choice
    and the server's bind, which failed test runs; ports below that range are only taken by
    servers that ask for them.  Ports already handed out by this process (and their neighbours)
    are never handed out again."""
    import random

    lo, _ = _ephemeral_range()
    first = max(1024, lo - 12000)
    for _ in range(500):
        port = random.randrange(first, lo - 2)
        if {port - 1, port, port + 1, port + 2} & _ISSUED:
            continue
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        _ISSUED.update((port, port + 1))
        return port
    raise RuntimeError("no two consecutive free ports below the ephemeral range")


def free_port() -> int:
    """A free port for any server of a test (a DIS, a metrics endpoint, Prometheus): one of a
    free pair, so a DIS's block endpoint at ``port + 1`` is free too."""
    return free_port_pair()


def subprocess_env() -> dict:
    """Environment for child processes: the same ``disd`` as this process, the tests on the path,
    this Python for Spark's workers."""
    import disd

    src = str(pathlib.Path(disd.__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([src, str(TESTS), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    return env


class Proc:
    """A daemon started in the repository's directory, its output in a log file."""

    def __init__(self, args, log_path: pathlib.Path, env=None) -> None:
        self.args = args
        self.log_path = log_path
        self.env = env
        self.p: subprocess.Popen | None = None

    def start(self) -> "Proc":
        self._log = open(self.log_path, "ab")
        env = dict(os.environ, **(self.env or {}))
        self.p = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        return self

    def kill9(self) -> None:
        self.p.send_signal(signal.SIGKILL)
        self.p.wait(10)
        self._log.close()

    def terminate(self, timeout=30) -> int:
        self.p.send_signal(signal.SIGTERM)
        try:
            rc = self.p.wait(timeout)
        finally:
            self._log.close()
        return rc

    def alive(self) -> bool:
        return self.p is not None and self.p.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def dis_healthy(port: int, timeout: float = 1.0) -> bool:
    """Whether the DIS on loopback ``port`` answers its health check with SERVING."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from disd.rpc.channel import open_channel

    ch = open_channel(f"127.0.0.1:{port}")
    try:
        r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        return r.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        ch.close()


def start_dis_process(tmp: pathlib.Path, config: pathlib.Path) -> Proc:
    """``dis serve --config CONFIG --json-logs`` (output in ``tmp/dis.log``), once its health
    service answers SERVING."""
    p = Proc([str(BIN / "dis"), "serve", "--config", str(config), "--json-logs"], tmp / "dis.log").start()
    port = yaml.safe_load(config.read_text())["server"]["port"]

    def healthy():
        if not p.alive():
            raise AssertionError("dis serve exited:\n" + p.log_text()[-3000:])
        return dis_healthy(port)

    try:
        wait_for(healthy, 60, 0.1, "DIS health")
    except AssertionError:
        raise AssertionError("DIS did not become healthy:\n" + p.log_text()[-3000:]) from None
    return p


def write_tailer_config(tmp: pathlib.Path, port: int, log_dir: pathlib.Path, **extra) -> pathlib.Path:
    """``tmp/tailer.yaml``: a tailer of ``log_dir`` sending to the DIS on ``port``."""
    cfg = {"dis": f"127.0.0.1:{port}", "log_dirs": [str(log_dir)], "state_dir": str(tmp / "tailer-state")}
    cfg.update(extra)
    path = tmp / "tailer.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def start_tailer(tmp: pathlib.Path, config: pathlib.Path) -> Proc:
    return Proc([str(BIN / "dis-tailer"), "--config", str(config)], tmp / "tailer.log").start()
