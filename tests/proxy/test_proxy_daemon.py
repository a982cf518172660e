"""``dis proxy`` as a daemon: its configuration's errors, the systemd notify protocol (READY=1,
watchdog pings, STATUS=, STOPPING=1 and exit 0 on SIGTERM) and its unit file."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from disd.config import ConfigError
from disd.proxy.config import load_proxy_config, parse_proxy_config
from ops.test_systemd import MAX_EXPOSURE, parse_unit
from support import BIN, ROOT, Proc, running_dis, subprocess_env
from support.notify import notify_socket, received, stop_notified, watchdog

from .proxy_support import health_ok, write_proxy_config


def test_defaults_and_the_example_file():
    cfg = parse_proxy_config({"upstream": {"address": "dis:22021"}}, "p.yaml")
    assert (cfg.host, cfg.port, cfg.http_port, cfg.metrics_port, cfg.cache_bytes) == (
        "0.0.0.0", 22051, 22052, 9105, 1 << 30)
    assert cfg.upstream.retry_s == 60 and cfg.routing().addresses == ["dis:22021"]
    # a DIS that stops answering is left within keepalive_s + keepalive_timeout_s
    assert (cfg.upstream.keepalive_s, cfg.upstream.keepalive_timeout_s) == (2.0, 3.0)
    off = parse_proxy_config({"proxy": {"http_port": 0, "metrics_port": 0}, "upstream": {"address": "d:1"}}, "p")
    assert off.http_port is None and off.metrics_port is None
    example = load_proxy_config(ROOT / "config" / "proxy.yaml")
    assert example.upstream.routing == "config/routing.yaml" and example.port == 22051


@pytest.mark.parametrize("data, key", [
    ({"proxy": {"port": 70000}, "upstream": {"address": "d:1"}}, "proxy.port"),
    ({"proxy": {"cache_byte": 1}, "upstream": {"address": "d:1"}}, "proxy.cache_byte"),
    ({"proxy": {"tls": {"cert": "c"}}, "upstream": {"address": "d:1"}}, "proxy.tls.key"),
    ({"upstream": {}}, "upstream"),
    ({"upstream": {"address": "d:1", "routing": "r.yaml"}}, "upstream.address"),
    ({"upstream": {"address": "nocolon"}}, "upstream.address"),
    ({"upstream": {"address": "d:1", "keepalive_s": 0.5}}, "upstream.keepalive_s"),
    ({"upstream": {"address": "d:1", "keepalive_timeout_s": "3s"}}, "upstream.keepalive_timeout_s"),
    ({"upstream": {"address": "d:1", "retry_s": -1}}, "upstream.retry_s"),
    ({"upstream": {"address": "d:1", "cert": "c.pem"}}, "upstream.key"),
])
def test_config_errors_name_the_key(data, key):
    with pytest.raises(ConfigError) as ei:
        parse_proxy_config(data, "proxy.yaml")
    assert ei.value.key == key and str(ei.value).startswith(f"proxy.yaml: {key}: ")


def test_cli_says_what_is_wrong_and_exits_2(tmp_path):
    bad = tmp_path / "proxy.yaml"
    bad.write_text(yaml.safe_dump({"upstream": {"routing": str(tmp_path / "missing.yaml")}}))
    r = subprocess.run([str(BIN / "dis"), "proxy", "--config", str(bad)], capture_output=True, text=True,
                       timeout=60, env=subprocess_env())
    assert r.returncode == 2 and "missing.yaml" in r.stderr and "Traceback" not in r.stderr


def test_notify_ready_watchdog_status_stopping(tmp_path):
    sock, addr = notify_socket(tmp_path)
    with running_dis(tmp_path / "db") as dis:
        config, port = write_proxy_config(tmp_path, {"address": f"127.0.0.1:{dis.port}"})
        env = {"NOTIFY_SOCKET": addr, "WATCHDOG_USEC": "200000"}
        p = Proc([str(BIN / "dis"), "proxy", "--config", str(config), "--json-logs"], tmp_path / "proxy.log",
                 env).start()
        try:
            first = received(sock)
            assert "READY=1" in first and any(f.startswith("STATUS=serving on 127.0.0.1:") for f in first)
            assert health_ok(port)  # READY=1 only once the port answers
            pings, statuses = watchdog(sock)
            assert pings >= 5, pings
            assert any("0 subscribers, 0/0 upstream subscriptions" in s for s in statuses), statuses
            stop_notified(sock, p)
        finally:
            if p.alive():
                p.kill9()
            sock.close()
    log = p.log_text()
    assert '"event": "dis proxy serving"' in log and '"event": "dis proxy stopped"' in log


def _analyze() -> str:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed")
    return tool


def _root(tmp_path):
    root = tmp_path / "root"
    (root / "etc/systemd/system").mkdir(parents=True)
    unit = ROOT / "config" / "systemd" / "dis-proxy.service"
    shutil.copy(unit, root / "etc/systemd/system/dis-proxy.service")
    exe = root / parse_unit(unit)["Service.ExecStart"][0].split()[0].lstrip("/")
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    return root


def test_unit_verifies_and_is_sandboxed(tmp_path):
    tool = _analyze()
    root = _root(tmp_path)
    r = subprocess.run([tool, "verify", f"--root={root}", "--man=no", "--recursive-errors=no",
                        "/etc/systemd/system/dis-proxy.service"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r.stdout + r.stderr
    r = subprocess.run([tool, "security", "--offline=true", f"--root={root}", "--no-pager", "dis-proxy.service"],
                       capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for dis-proxy\.service: ([0-9.]+)", r.stdout + r.stderr)
    assert m and float(m.group(1)) < MAX_EXPOSURE, r.stdout + r.stderr
    u = parse_unit(ROOT / "config" / "systemd" / "dis-proxy.service")
    assert u["Service.Type"] == ["notify"] and int(u["Service.WatchdogSec"][0]) > 0
    assert u["Service.ExecStart"][0].split()[1:4] == ["proxy", "--config", "/etc/dis/proxy.yaml"]
