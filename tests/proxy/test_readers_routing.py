"""Routing entries with ``proxies:``: what readers read through (``read_replicas``) and what
tailers and proxies keep using (``members``, ``upstream()``); errors naming the entry and key.
The JVM reader's Routing.java is held to the same answers by the shared test vectors
(tests/vectors/routing.json, whose cases include these)."""

from __future__ import annotations

import pytest

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
