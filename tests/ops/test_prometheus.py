"""The Prometheus set-up: rules and config checked by promtool, the alert rules' unit tests, every
series the rules and the Grafana dashboard name exists on a running DIS (and every series of the
tailer's rules on a running tailer), and a real Prometheus server scrapes a DIS and a
``dis-tailer`` process on loopback."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import subprocess
import urllib.parse
import urllib.request

import grpc
import numpy as np
import pytest
import yaml

from disd.binlog import RowFlag
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from disd.server.daemon import DisServer
from disd.tailer import Tailer, parse_tailer_config
from support import (ROOT, TRADE, Proc, append_rows, free_port, log_name, scrape, start_dis_server, start_tailer,
                     trade_rows, wait_for, write_tailer_config)

PROM = ROOT / "config" / "prometheus"
DASHBOARD = ROOT / "config" / "grafana" / "dis-dashboard.json"
METRIC = re.compile(r"\b(dis_[a-z0-9_]+|up)\b")


def _tool(name: str) -> str:
    """A Prometheus tool; CI installs Debian's `prometheus` package (.ci/run), so there a
    missing tool is a failure, elsewhere a skip."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed (.ci/run installs Debian's prometheus package)")
        pytest.skip(f"{name} is not installed (apt-get install prometheus)")
    return path


def _rules(file: str = "dis-alerts.yml") -> list[dict]:
    return [r for g in yaml.safe_load((PROM / file).read_text())["groups"] for r in g["rules"]]


def _dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def _names(exprs) -> set[str]:
    return {m for e in exprs for m in METRIC.findall(e)}


def test_promtool_checks_config_and_rules():
    promtool = _tool("promtool")
    for args in (["check", "config", "prometheus.yml"], ["check", "rules", "dis-alerts.yml"],
                 ["test", "rules", "tests/dis-alerts.test.yml"], ["check", "rules", "dis-tailer-alerts.yml"],
                 ["test", "rules", "tests/dis-tailer-alerts.test.yml"]):
        r = subprocess.run([promtool, *args], cwd=PROM, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"promtool {' '.join(args)}:\n{r.stdout}\n{r.stderr}"
        assert "SUCCESS" in r.stdout + r.stderr


def test_rules_cover_the_required_alerts():
    alerts = {r["alert"]: r for r in _rules()}
    assert {"DisPartitionInError", "DisCheckpointStale", "DisFileHandleFastCycling", "DisTailerDisconnected",
            "DisDiskNearlyFull"} <= set(alerts)
    assert "2 * dis_checkpoint_interval_seconds" in alerts["DisCheckpointStale"]["expr"]
    assert "dis_location_tailer_problem" in alerts["DisLocationTailerProblem"]["expr"]
    tailer = {r["alert"]: r for r in _rules("dis-tailer-alerts.yml")}
    assert {"DisTailerDown", "DisTailerStuck", "DisTailerSkippedFiles", "DisTailerCorruptLog", "DisTailerRefused",
            "DisTailerReconnecting"} <= set(tailer)
    assert not set(alerts) & set(tailer)
    for r in [*alerts.values(), *tailer.values()]:
        assert r["labels"]["severity"] in ("warning", "critical") and r["annotations"]["summary"]
    # every alert has a unit test
    for rules in ("dis-alerts.yml", "dis-tailer-alerts.yml"):
        tests = rules.replace(".yml", ".test.yml")
        tested = {t["alertname"] for case in yaml.safe_load((PROM / "tests" / tests).read_text())["tests"]
                  for t in case["alert_rule_test"] if t.get("exp_alerts")}
        assert {r["alert"] for r in _rules(rules)} - tested == set(), rules


def test_dashboard_is_well_formed():
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0
        if p["type"] != "row":
            assert p["targets"] and all(t["expr"] and t["refId"] for t in p["targets"]), p["title"]
            assert p["datasource"]["uid"] == "${datasource}"
    assert {v["name"] for v in dash["templating"]["list"]} == {"datasource", "instance"}


def _provoke_every_series(srv: DisServer, tmp_path) -> None:
    """Ingest rows, leave a transaction open when the stream ends (a rollback), refuse a stream
    (an unknown table), read blocks: every labelled counter then has a series."""
    from disd.binlog import BinlogWriter, normalize_columns
    from disd.client import connect

    logs = tmp_path / "logs"
    append_rows(logs / log_name("ip1"), 0, 10, frames=2)
    with BinlogWriter(logs / log_name("ip2"), TRADE) as w:  # a transaction that never ends
        w.write_rows(normalize_columns(TRADE, trade_rows(0, 3)),
                     np.array([RowFlag.START_TRANSACTION, RowFlag.NONE, RowFlag.NONE], np.uint8))
    cfg = parse_tailer_config({"dis": f"127.0.0.1:{srv.port}", "log_dirs": [str(logs)], "poll_interval_ms": 50})
    with Tailer(cfg) as t:
        assert t.wait_idle(30)
    ch = grpc.insecure_channel(f"127.0.0.1:{srv.port}")
    q: queue.Queue = queue.Queue()
    q.put(dis_pb2.IngestRequest(open=dis_pb2.IngestOpen(
        location=dis_pb2.LocationKey(namespace="Market", table="Nope", internal_partition="x", column_partition="y"))))
    q.put(None)
    with pytest.raises(grpc.RpcError) as e:
        list(dis_pb2_grpc.IngestStub(ch).Stream(iter(q.get, None), timeout=10))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    ch.close()
    with connect(f"127.0.0.1:{srv.port}") as c:
        wait_for(lambda: c.read_table("Market", "Trade").num_rows == 10, 10, what="10 rows readable")


def test_every_series_of_rules_and_dashboard_exists_on_a_running_dis(tmp_path):
    srv = start_dis_server(tmp_path / "db")
    try:
        _provoke_every_series(srv, tmp_path)
        scraped = set(scrape(srv.metrics_port))
    finally:
        srv.stop(0.5)
    wanted = _names([r["expr"] for r in _rules()] + _dashboard_exprs()) - {"up"}
    assert wanted, "no series found in the rules and the dashboard"
    missing = sorted(wanted - scraped)
    assert not missing, f"named by the alert rules or the dashboard, not served by the DIS: {missing}"


def _provoke_tailer_series(logs) -> int:
    """Logs that give every labelled tailer series a sample: rows, then garbage (a corrupt frame);
    a file whose name does not parse (a skipped file); a log of a table the DIS does not have (a
    refusal)."""
    size = append_rows(logs / log_name("ip1"), 0, 9, frames=3)
    with open(logs / log_name("ip1"), "ab") as f:
        f.write(b"\xde\xad\xbe\xef" * 25)
    append_rows(logs / log_name("ip1", hhmmss="100000").replace("System", "Sytem"), 9, 3)
    append_rows(logs / log_name("ip2").replace("Trade", "Nope"), 0, 3)
    return size


def test_every_series_of_the_tailer_rules_exists_on_a_running_tailer(tmp_path):
    srv = start_dis_server(tmp_path / "db")
    logs = tmp_path / "logs"
    logs.mkdir()
    _provoke_tailer_series(logs)
    cfg = parse_tailer_config({"dis": f"127.0.0.1:{srv.port}", "log_dirs": [str(logs)], "poll_interval_ms": 50,
                               "retry_refused_ms": 200, "metrics_port": 0})
    wanted = _names(r["expr"] for r in _rules("dis-tailer-alerts.yml")) - {"up"}
    assert wanted
    try:
        with Tailer(cfg) as t:
            scraped = wait_for(lambda: (lambda s: s if wanted <= set(s) else None)(scrape(t.metrics_port)), 20,
                               what="every series of the tailer's rules")
    finally:
        srv.stop(0.5)
    from disd.tailer.metrics import SERIES

    assert set(SERIES) <= set(scraped)


def _get(port: int, path: str, **params) -> dict:
    url = f"http://127.0.0.1:{port}{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
    body = json.loads(urllib.request.urlopen(url, timeout=5).read())
    assert body["status"] == "success", body
    return body["data"]


def test_a_real_prometheus_scrapes_a_running_dis(tmp_path):
    prometheus = _tool("prometheus")
    bad = tmp_path / "db/Intraday/Market/Trade/bad/2026-11-22/Trade"
    bad.mkdir(parents=True)
    (bad / "table.size").write_bytes(b"damaged")
    srv = start_dis_server(tmp_path / "db")
    prom_port = free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(PROM / "dis-alerts.yml")],
        "scrape_configs": [{"job_name": "dis", "static_configs": [{"targets": [f"127.0.0.1:{srv.metrics_port}"]}]}],
    }))
    proc = Proc([prometheus, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{prom_port}"], tmp_path / "prometheus.log").start()
    try:
        _provoke_every_series(srv, tmp_path)
        wanted = _names([r["expr"] for r in _rules()] + _dashboard_exprs())

        def all_series_scraped():
            have = set(_get(prom_port, "/api/v1/label/__name__/values"))
            return wanted <= have or None

        try:
            wait_for(all_series_scraped, 30, 0.5, "every series in Prometheus")
        except AssertionError:
            have = set(_get(prom_port, "/api/v1/label/__name__/values"))
            raise AssertionError(f"missing in Prometheus: {sorted(wanted - have)}\n"
                                 + proc.log_text()[-2000:]) from None
        target = _get(prom_port, "/api/v1/targets")["activeTargets"][0]
        assert target["health"] == "up" and target["labels"]["job"] == "dis"
        rules = [r for g in _get(prom_port, "/api/v1/rules")["groups"] for r in g["rules"]]
        assert {r["name"] for r in rules} == {r["alert"] for r in _rules()}
        assert all(r["health"] in ("ok", "unknown") for r in rules), rules
        for r in _rules():  # every alert expression evaluates
            _get(prom_port, "/api/v1/query", query=r["expr"])
        for e in _dashboard_exprs():
            _get(prom_port, "/api/v1/query", query=e.replace("$instance", ".*"))
        # the damaged location: the in-error alert's expression names it
        res = _get(prom_port, "/api/v1/query", query=next(r["expr"] for r in _rules()
                                                          if r["alert"] == "DisPartitionInError"))["result"]
        assert [x["metric"]["location"] for x in res] == ["Market/Trade/bad/2026-11-22"]
        rows = _get(prom_port, "/api/v1/query", query='dis_location_rows{location="Market/Trade/ip1/2026-11-22"}')
        wait_for(lambda: _get(prom_port, "/api/v1/query",
                              query='dis_location_rows{location="Market/Trade/ip1/2026-11-22"} == 10')["result"],
                 10, 0.5, "10 rows in Prometheus")
        assert rows["resultType"] == "vector"
    finally:
        proc.terminate()
        srv.stop(0.5)


def test_a_real_prometheus_scrapes_a_running_tailer(tmp_path):
    """``dis-tailer`` as users run it (a process, its config file with metrics_port) next to a DIS,
    both scraped by a real Prometheus with the shipped rules: every series the tailer's rules name
    arrives, every rule evaluates, the skipped file and the DIS's view of the tailer's problem are
    queryable."""
    prometheus = _tool("prometheus")
    srv = start_dis_server(tmp_path / "db")
    logs = tmp_path / "logs"
    logs.mkdir()
    _provoke_tailer_series(logs)
    tailer_metrics = free_port()
    tailer = start_tailer(tmp_path, write_tailer_config(tmp_path, srv.port, logs, poll_interval_ms=50,
                                                        retry_refused_ms=200, metrics_port=tailer_metrics))
    prom_port = free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(PROM / "dis-alerts.yml"), str(PROM / "dis-tailer-alerts.yml")],
        "scrape_configs": [
            {"job_name": "dis", "static_configs": [{"targets": [f"127.0.0.1:{srv.metrics_port}"]}]},
            {"job_name": "dis-tailer", "static_configs": [{"targets": [f"127.0.0.1:{tailer_metrics}"]}]},
        ],
    }))
    proc = Proc([prometheus, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{prom_port}"], tmp_path / "prometheus.log").start()
    try:
        tailer_rules = _rules("dis-tailer-alerts.yml")
        wanted = _names(r["expr"] for r in tailer_rules) | {"dis_location_tailer_problem"}
        try:
            wait_for(lambda: wanted <= set(_get(prom_port, "/api/v1/label/__name__/values")) or None, 60, 0.5,
                     "every series of the tailer's rules in Prometheus")
        except AssertionError:
            have = set(_get(prom_port, "/api/v1/label/__name__/values"))
            raise AssertionError(f"missing in Prometheus: {sorted(wanted - have)}\n" + proc.log_text()[-2000:]
                                 + tailer.log_text()[-2000:]) from None
        targets = _get(prom_port, "/api/v1/targets")["activeTargets"]
        assert {(t["labels"]["job"], t["health"]) for t in targets} == {("dis", "up"), ("dis-tailer", "up")}
        rules = [r for g in _get(prom_port, "/api/v1/rules")["groups"] for r in g["rules"]]
        assert {r["alert"] for r in tailer_rules} <= {r["name"] for r in rules}
        assert all(r["health"] in ("ok", "unknown") for r in rules), rules
        for r in tailer_rules:
            _get(prom_port, "/api/v1/query", query=r["expr"])
        skipped = _get(prom_port, "/api/v1/query", query="dis_tailer_files_skipped > 0")["result"]
        assert [x["metric"]["reason"] for x in skipped] == ["namespace_kind"]
        wait_for(lambda: _get(prom_port, "/api/v1/query", query="dis_location_tailer_problem == 1")["result"], 30, 0.5,
                 "the DIS's view of the tailer's problem in Prometheus")
        res = _get(prom_port, "/api/v1/query", query="dis_location_tailer_problem == 1")["result"]
        assert [x["metric"]["location"] for x in res] == ["Market/Trade/ip1/2026-11-22"]
    finally:
        proc.terminate()
        assert tailer.terminate() == 0
        srv.stop(0.5)
