"""``disd.client`` reads through the proxies a routing entry lists, with no other change: its
catalogue, listing, reads and subscriptions go to the proxies (a DIS standing in for one, the
entry's own DIS unreachable), several proxies fail over as replicas do, and ``dis ls --routing``
does the same."""

from __future__ import annotations

import subprocess

import pytest

from disd.binlog import LocationKey
from disd.client import DisClientError, connect
from support import BIN, loaded_dis, subprocess_env

from .readers_support import dead_address, plain_routing, proxied_routing

LOCS = {
    LocationKey("Market", "Trade", "feed1", "2026-11-22"): (0, 3000),
    LocationKey("Market", "Trade", "feed2", "2026-11-22"): (3000, 2000),
    LocationKey("Market", "Trade", "feed1", "2026-11-23"): (5000, 1500),
}
TOTAL = 6500


@pytest.fixture(scope="module")
def dis(tmp_path_factory):
    srv = loaded_dis(tmp_path_factory.mktemp("proxied-dis") / "db", LOCS)
    yield f"127.0.0.1:{srv.port}"
    srv.stop(0.5)


def test_the_client_reads_through_the_entrys_proxy_not_its_dis(dis, tmp_path):
    routing = proxied_routing(tmp_path / "routing.yaml", dead_address(), [dis])
    with connect(dis, retry_s=0) as direct:
        want = direct.read_table("Market", "Trade").sort_by("Size")
    with connect(routing=str(routing), retry_s=0) as c:
        assert [s.key for s in c.tables()] == [s.key for s in direct.tables()]
        assert c.schema("Market", "Trade").column_names == ["Timestamp", "Sym", "Price", "Size"]
        snaps = c.locations("Market", "Trade")
        assert {s.key: s.rows for s in snaps} == {k: n for k, (_, n) in LOCS.items()}
        assert {s.address for s in snaps} == {dis}
        got = c.read_table("Market", "Trade").sort_by("Size")
        assert got.num_rows == TOTAL and got.equals(want)
        sub = c.subscribe("Market", "Trade")
        first = {next(sub).key for _ in LOCS}
        sub.close()
        assert first == set(LOCS)


def test_without_proxies_the_same_entry_is_read_from_its_dis(dis, tmp_path):
    """The control: the entry's DIS address is really unreachable, so the reads above went to the proxy."""
    with connect(routing=str(plain_routing(tmp_path / "routing.yaml", dead_address())), retry_s=0) as c:
        with pytest.raises(DisClientError, match="unreachable"):
            c.locations("Market", "Trade")


def test_several_proxies_fail_over_like_replicas(dis, tmp_path):
    down = dead_address()
    routing = proxied_routing(tmp_path / "routing.yaml", dead_address(), [down, dis])
    with connect(routing=str(routing), retry_s=0) as c:
        t = c.read_table("Market", "Trade", columns=["Size"])
        assert sorted(t.column("Size").to_pylist()) == list(range(TOTAL))
        assert c.replicas("Market", "Trade") == [down, dis]


def test_dis_ls_with_a_routing_lists_through_the_proxy(dis, tmp_path):
    routing = proxied_routing(tmp_path / "routing.yaml", dead_address(), [dis])
    r = subprocess.run([str(BIN / "dis"), "ls", "--routing", str(routing)], capture_output=True, text=True,
                       timeout=60, env=subprocess_env())
    assert r.returncode == 0, r.stderr
    assert "Market.Trade" in r.stdout and "feed2" in r.stdout, r.stdout
