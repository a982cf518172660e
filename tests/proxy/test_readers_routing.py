"""Routing entries with ``proxies:``: what readers read through (``read_replicas``) and what
tailers and proxies keep using (``members``, ``upstream()``); errors naming the entry and key; the
JVM reader's Routing.java agreeing with ``disd.routing`` on both."""

from __future__ import annotations

import pytest
import yaml

from disd.config import ConfigError
from disd.routing import Replica, load_routing, parse_routing

PROXIED = {"instances": [
    {"name": "market", "tables": ["Market.*"], "address": "10.0.0.1:22021",
     "proxies": [{"name": "tdcp-1", "address": "10.0.1.1:22051"},
                 {"name": "tdcp-2", "address": "10.0.1.2:22051", "http_address": "10.0.1.2:9000"}]},
    {"name": "plain", "address": "10.0.0.4:22021", "tables": ["Plain.*"]},
    {"name": "rest", "tables": ["*"], "replicas": [{"name": "b1", "address": "10.0.0.2:22021"},
                                                   {"name": "b2", "address": "10.0.0.3:22021"}],
     "proxies": [{"address": "10.0.1.3:22051"}]},
]}


def test_readers_read_through_proxies_and_tailers_keep_the_dises():
    r = parse_routing(PROXIED, "routing.yaml")
    market, plain, rest = r.instances
    assert market.proxies == (Replica("tdcp-1", "10.0.1.1:22051"), Replica("tdcp-2", "10.0.1.2:22051", "10.0.1.2:9000"))
    assert r.read_replicas("Market", "Trade") == market.proxies == market.read_replicas
    assert [x.address for x in r.replicas("Market", "Trade")] == ["10.0.0.1:22021"]  # tailers: the DIS
    assert rest.proxies == (Replica("10.0.1.3:22051", "10.0.1.3:22051"),)  # name defaults to the address
    assert r.read_replicas("Other", "T") == rest.proxies
    assert [x.name for x in r.replicas("Other", "T")] == ["b1", "b2"]
    # An entry without proxies is read from its DISes, as before.
    assert plain.proxies == () and r.read_replicas("Plain", "X") == plain.members
    # Every DIS once, never a proxy: dis status --routing and the tailers' view.
    assert r.addresses == ["10.0.0.1:22021", "10.0.0.4:22021", "10.0.0.2:22021", "10.0.0.3:22021"]
    # A proxy reads the same file without the proxies: members only, never itself.
    up = r.upstream()
    assert all(i.proxies == () for i in up.instances)
    assert up.read_replicas("Market", "Trade") == r.replicas("Market", "Trade")
    assert up.read_replicas("Other", "T") == r.replicas("Other", "T")
    assert up.addresses == r.addresses


def test_no_owner_has_no_read_replicas():
    r = parse_routing({"instances": [{"address": "h:1", "tables": ["A.*"], "proxies": [{"address": "p:1"}]}]}, "f")
    assert r.read_replicas("B", "T") == ()
    assert [x.address for x in r.read_replicas("A", "T")] == ["p:1"]


BAD = [
    ({"proxies": []}, "instances[0].proxies", "must list at least one {address: host:port} (leave the key out for none)"),
    ({"proxies": "p:1"}, "instances[0].proxies", "must be list"),
    ({"proxies": [{"name": "x"}]}, "instances[0].proxies[0].address", "must be host:port"),
    ({"proxies": [{"address": "nohost"}]}, "instances[0].proxies[0].address", "must be host:port"),
    ({"proxies": [{"address": "p:1"}, {"address": "p:1"}]}, "instances[0].proxies[1].address",
     "p:1 is already a proxy of this entry"),
    ({"proxies": [{"address": "h:1"}]}, "instances[0].proxies[0].address", "h:1 is a DIS of this entry"),
    ({"proxies": [{"address": "p:1", "http_address": "p"}]}, "instances[0].proxies[0].http_address",
     "must be host:port"),
    ({"proxies": [{"address": "p:1", "port": 5}]}, "instances[0].proxies[0].port", "unknown key"),
    ({"proxies": ["p:1"]}, "instances[0].proxies[0]", "must be a mapping"),
]


@pytest.mark.parametrize("extra,key,problem", BAD, ids=[b[1] + ":" + b[2][:20] for b in BAD])
def test_a_bad_proxies_entry_is_an_error_naming_its_key(extra, key, problem):
    with pytest.raises(ConfigError) as e:
        parse_routing({"instances": [{"address": "h:1", **extra}]}, "routing.yaml")
    assert str(e.value).startswith(f"routing.yaml: {key}: "), str(e.value)
    assert problem in str(e.value)


def test_a_proxy_may_not_take_a_replicas_address():
    with pytest.raises(ConfigError, match=r"instances\[0\].proxies\[0\].address: h:2 is a DIS of this entry"):
        parse_routing({"instances": [{"replicas": [{"address": "h:1"}, {"address": "h:2"}],
                                      "proxies": [{"address": "h:2"}]}]}, "routing.yaml")


def test_the_example_routing_file_parses():
    from support import ROOT

    r = load_routing(ROOT / "config" / "routing-proxies.yaml")
    assert any(i.proxies for i in r.instances)
    for i in r.instances:
        assert not {p.address for p in i.proxies} & {m.address for m in i.members}


# -- the JVM reader's Routing.java ------------------------------------------------------------
def test_routing_java_reads_proxies_as_python_does(tmp_path):
    """Routing.java lists and reads an entry through its proxies (their block endpoints: each
    ``http_address`` or the address's port + 1), through its DISes when it has none, and fails on
    a bad ``proxies`` entry with ``disd.routing``'s message."""
    cases = [PROXIED] + [{"instances": [{"address": "h:1", **extra}]} for extra, _, _ in BAD] + [
        {"instances": [{"replicas": [{"address": "h:1"}, {"address": "h:2"}], "proxies": [{"address": "h:2"}]}]}]
    paths = []
    for i, data in enumerate(cases):
        p = (tmp_path / f"routing{i}.yaml").resolve()
        p.write_text(yaml.safe_dump(data))
        paths.append(str(p))
    got = _run_probe(tmp_path, {"plan": [], "admit": [], "options": [], "glob": [], "filters": [], "keys": [],
                                "readRouting": paths})["readRouting"]
    errors = 0
    for path, answer in zip(paths, got):
        try:
            routing = load_routing(path)
        except ConfigError as e:
            errors += 1
            assert answer == f"dis source: option 'routing': cannot use {path}: {e}", (path, answer)
            continue
        assert answer == [[i.name, [[r.name, r.address, r.http_address or _plus_one(r.address)]
                                    for r in i.read_replicas]] for i in routing.instances], (path, answer)
    assert errors == len(cases) - 1
    assert got[0][0][1][0] == ["tdcp-1", "10.0.1.1:22051", "10.0.1.1:22052"]


def _plus_one(address: str) -> str:
    host, port = address.rsplit(":", 1)
    return f"{host}:{int(port) + 1}"


def _run_probe(tmp_path, request: dict) -> dict:
    """Compile and run ``jvm/src/test/java/disd/spark/Probe.java`` against the jar (as
    tests/spark/test_jvm_units.py does)."""
    import json
    import os
    import shutil
    import subprocess

    import pyspark

    from disd.spark import jvm
    from support import ROOT

    javac, java = shutil.which("javac"), shutil.which("java")
    if os.environ.get("JAVA_HOME"):
        javac = os.path.join(os.environ["JAVA_HOME"], "bin", "javac")
        java = os.path.join(os.environ["JAVA_HOME"], "bin", "java")
    assert javac and java, "a JDK 17 (javac) is needed: it builds the JVM reader"
    jar, why = jvm.jar_status()
    assert jar is not None, why
    out = tmp_path / "probe"
    out.mkdir()
    cp = f"{jar}{os.pathsep}{os.path.join(os.path.dirname(pyspark.__file__), 'jars', '*')}"
    src = ROOT / "jvm" / "src" / "test" / "java" / "disd" / "spark" / "Probe.java"
    subprocess.run([javac, "--release", "17", "-nowarn", "-cp", cp, "-d", str(out), str(src)], check=True,
                   capture_output=True, timeout=300)
    r = subprocess.run([java, "-cp", f"{out}{os.pathsep}{cp}", "disd.spark.Probe"], input=json.dumps(request),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])
