"""A daemon serving every interface says at start what it exposes: a bearer token without TLS
travels in clear text, and the Prometheus endpoint (which asks for neither TLS nor a token)
follows ``host`` unless ``metrics_host`` is given.  ``dis serve`` and ``dis proxy``, as real
processes, and the rule itself."""

from __future__ import annotations

import json

import pytest
import yaml

from support import BIN, Proc, free_port, free_port_pair, running_dis, start_dis_process, wait_for, write_dis_config


def _warnings(log_text: str) -> list[dict]:
    out = []
    for line in log_text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("level") == "warning" and rec.get("event") == "exposed on the network":
            out.append(rec)
    return out


def _risks(log_text: str) -> str:
    return "\n".join(w["risk"] for w in _warnings(log_text))


def test_dis_serve_on_every_interface_with_a_token_and_no_tls_warns_of_the_token_and_the_metrics(tmp_path):
    (tmp_path / "token").write_text("s3cret\n")
    port, metrics = free_port_pair(), free_port()
    cfg = write_dis_config(tmp_path, port, metrics, host="0.0.0.0", token_file=str(tmp_path / "token"))
    dis = start_dis_process(tmp_path, cfg)
    try:
        wait_for(lambda: '"dis serving"' in dis.log_text(), 30)
    finally:
        assert dis.terminate() == 0
    risks = _risks(dis.log_text())
    assert "server.token_file is set but server.tls is not" in risks and "clear text" in risks, dis.log_text()
    assert f"Prometheus endpoint (server.metrics_port {metrics}) listens on 0.0.0.0" in risks, risks
    assert "server.metrics_host" in risks  # the remedy is named

    # the same on loopback: nothing to warn of
    loopback = tmp_path / "loopback"
    loopback.mkdir()
    cfg = write_dis_config(loopback, free_port_pair(), free_port(), token_file=str(tmp_path / "token"))
    dis = start_dis_process(loopback, cfg)
    assert dis.terminate() == 0
    assert "dis serving" in dis.log_text() and "exposed on the network" not in dis.log_text()


def test_dis_proxy_on_every_interface_with_a_token_and_no_tls_warns_alike(tmp_path):
    (tmp_path / "token").write_text("s3cret\n")
    with running_dis(tmp_path / "db") as dis:
        port, metrics = free_port_pair(), free_port()
        path = tmp_path / "proxy.yaml"
        path.write_text(yaml.safe_dump({
            "proxy": {"host": "0.0.0.0", "port": port, "metrics_port": metrics, "token_file": str(tmp_path / "token")},
            "upstream": {"address": f"127.0.0.1:{dis.port}"}}))
        p = Proc([str(BIN / "dis"), "proxy", "--config", str(path), "--json-logs"], tmp_path / "proxy.log").start()
        try:
            wait_for(lambda: '"dis proxy serving"' in p.log_text() or not p.alive(), 60)
        finally:
            assert p.terminate() == 0, p.log_text()[-3000:]
    risks = _risks(p.log_text())
    assert "proxy.token_file is set but proxy.tls is not" in risks and "clear text" in risks, p.log_text()
    assert f"Prometheus endpoint (proxy.metrics_port {metrics}) listens on 0.0.0.0" in risks, risks


@pytest.mark.parametrize("host, tls, token, metrics_host, expected", [
    ("0.0.0.0", False, True, None, ["clear text", "Prometheus endpoint"]),
    ("::", False, True, None, ["clear text", "Prometheus endpoint"]),
    ("10.0.0.5", False, True, None, ["clear text", "Prometheus endpoint"]),
    ("0.0.0.0", True, True, None, ["Prometheus endpoint"]),
    ("0.0.0.0", False, True, "127.0.0.1", ["clear text"]),
    ("0.0.0.0", True, True, "0.0.0.0", []),  # served to the network on purpose
    ("0.0.0.0", False, False, "0.0.0.0", []),  # no token to leak (the README says to add one)
    ("127.0.0.1", False, True, None, []),
    ("::1", False, True, None, []),
    ("localhost", False, True, None, []),
])
def test_the_rule(host, tls, token, metrics_host, expected):
    from disd.server.daemon import network_exposure

    risks = network_exposure("server", host, tls=tls, token=token, metrics_port=9464, metrics_host=metrics_host)
    assert len(risks) == len(expected) and all(w in r for w, r in zip(expected, risks)), risks
    assert network_exposure("server", host, tls=tls, token=token, metrics_port=None, metrics_host=None) == [
        r for r in risks if "Prometheus" not in r]
