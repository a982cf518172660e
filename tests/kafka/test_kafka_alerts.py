"""The Kafka alert rules: promtool checks them and runs their unit tests, and every alert has one.
(That every series they name is served by a DIS consuming Kafka is checked in
test_kafka_exactly_once.)"""

from __future__ import annotations

import re
import subprocess

import yaml

from support import ROOT

PROM = ROOT / "config" / "prometheus"
RULES = PROM / "dis-kafka-alerts.yml"


def rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def rule_series() -> set[str]:
    return {m for r in rules() for m in re.findall(r"\b(dis_[a-z0-9_]+)\b", r["expr"])}


def test_promtool_checks_and_tests_the_kafka_rules():
    import shutil

    import pytest

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    for args in (["check", "rules", "dis-kafka-alerts.yml"], ["test", "rules", "tests/dis-kafka-alerts.test.yml"],
                 ["check", "config", "prometheus.yml"]):
        r = subprocess.run([promtool, *args], cwd=PROM, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "SUCCESS" in r.stdout + r.stderr, r.stdout + r.stderr


def test_every_kafka_alert_has_a_unit_test():
    tested = {t["alertname"] for case in yaml.safe_load((PROM / "tests" / "dis-kafka-alerts.test.yml").read_text())["tests"]
              for t in case["alert_rule_test"] if t.get("exp_alerts")}
    assert {r["alert"] for r in rules()} == tested
    for r in rules():
        assert r["labels"]["severity"] in ("warning", "critical") and r["annotations"]["summary"]
