"""Running the real daemons as subprocesses for end-to-end tests."""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
BIN = pathlib.Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred, timeout=30.0, interval=0.05, what="condition"):
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        try:
            last = pred()
        except Exception as e:  # noqa: BLE001 - retried until the deadline
            last = e
        if last and not isinstance(last, Exception):
            return last
        time.sleep(interval)
    raise AssertionError(f"{what} not met within {timeout}s (last: {last!r})")


class Proc:
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


def write_dis_config(tmp: pathlib.Path, port: int, metrics_port: int | None = None, **extra) -> pathlib.Path:
    cfg = {
        "db_root": str(tmp / "db"),
        "schemas": str(ROOT / "config" / "schemas"),
        "server": {"host": "127.0.0.1", "port": port, "metrics_port": metrics_port or free_port()},
        "import": {"default": {"flush_interval_ms": 50, "checkpoint_interval_ms": 300}},
    }
    for k, v in extra.items():
        cfg[k] = v
    path = tmp / "dis.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def write_tailer_config(tmp: pathlib.Path, port: int, log_dir: pathlib.Path, **extra) -> pathlib.Path:
    cfg = {"dis": f"127.0.0.1:{port}", "log_dirs": [str(log_dir)], "state_dir": str(tmp / "tailer-state")}
    cfg.update(extra)
    path = tmp / "tailer.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def start_dis(tmp: pathlib.Path, config: pathlib.Path) -> Proc:
    from disd.rpc.channel import open_channel
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    p = Proc([str(BIN / "dis"), "serve", "--config", str(config), "--json-logs"], tmp / "dis.log").start()
    port = yaml.safe_load(config.read_text())["server"]["port"]

    def healthy():
        if not p.alive():
            raise AssertionError("dis serve exited:\n" + p.log_text()[-3000:])
        ch = open_channel(f"127.0.0.1:{port}")
        try:
            r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1)
            return r.status == health_pb2.HealthCheckResponse.SERVING
        finally:
            ch.close()

    try:
        wait_for(healthy, 60, 0.1, "DIS health")
    except AssertionError:
        raise AssertionError("DIS did not become healthy:\n" + p.log_text()[-3000:]) from None
    return p


def start_tailer(tmp: pathlib.Path, config: pathlib.Path) -> Proc:
    return Proc([str(BIN / "dis-tailer"), "--config", str(config)], tmp / "tailer.log").start()


def scrape(port: int) -> dict[str, list]:
    """The samples of a /metrics endpoint on loopback by series name (counters keep their _total)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out
