"""Last-by through a real ``dis proxy`` (docs/proxy.md, "Last-by"): ``LastBy`` and
``SubscribeLastBy`` answered as the DIS behind it answers them — the same states, the same
refusals — with one upstream ``SubscribeLastBy`` per table however many readers subscribe; a
reader whose routing entry lists the proxy, and Spark's ``view`` ``lastBy``, read it there."""

from __future__ import annotations

import grpc
import pytest

from disd.client import connect
from disd.config import parse_dis_config
from disd.names import LocationKey
from disd.rpc.channel import open_channel
from disd.rpc.keys import key_from_proto, key_to_proto
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from disd.server.daemon import DisServer
from disd.storage.lastby import from_ipc
from lastby.support_lastby import random_updates, with_last_by
from spark.conftest import spark_session  # noqa: F401 - the shared local session
from support import Feeder, dis_settings, sample, scrape, wait_for

from .lastby_support import LastBySubscriber
from .proxy_support import metrics_port, start_proxy, write_proxy_config
from .readers_support import dead_address, proxied_routing

A1 = LocationKey("Market", "Trade", "A", "2026-11-22")
B1 = LocationKey("Market", "Trade", "B", "2026-11-22")
A2 = LocationKey("Market", "Trade", "A", "2026-11-23")


class Stack:
    def __init__(self, srv, feeder, proxy, config, port, routing) -> None:
        self.srv, self.feeder, self.proxy, self.config, self.routing = srv, feeder, proxy, config, routing
        self.dis = f"127.0.0.1:{srv.port}"
        self.address = f"127.0.0.1:{port}"

    def metrics(self) -> dict:
        return scrape(metrics_port(self.config))


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """A DIS in this process (Market.Trade declares ``last_by: [Sym]``, Market.Quote none) with
    three locations over two days, and a real ``dis proxy`` in front of it."""
    tmp = tmp_path_factory.mktemp("proxy-lastby")
    srv = DisServer(parse_dis_config(with_last_by(dis_settings(tmp / "db")), "<test>"))
    srv.start()
    proxy = None
    try:
        feeder = Feeder(srv)
        feeder.append(A1, random_updates(0, 4000, 1500, seed=21))
        feeder.append(B1, random_updates(4000, 3000, 1200, seed=22))
        feeder.append(A2, random_updates(7000, 2000, 800, seed=23))
        config, port = write_proxy_config(tmp, {"address": f"127.0.0.1:{srv.port}", "retry_s": 5})
        proxy = start_proxy(tmp, config)
        # readers of this routing file go through the proxy; its own DIS address answers nothing
        routing = proxied_routing(tmp / "routing.yaml", dead_address(), [f"127.0.0.1:{port}"])
        yield Stack(srv, feeder, proxy, config, port, routing)
    finally:
        if proxy is not None and proxy.alive():
            proxy.terminate()
        srv.stop(0.5)


def _states(client, **kw) -> dict:
    return {key_from_proto(m.key): m for m in client.last_by_states("Market", "Trade", **kw)}


def _caught_up(stack: Stack, proxy) -> bool:
    """Whether the proxy's states cover every row the DIS's do."""
    want = {k: loc.lastby.snapshot().rows for k, loc in ((held.key, held) for held in stack.srv.engine.locations())
            if loc.lastby is not None}
    return {k: m.rows for k, m in _states(proxy).items()} == want


def test_last_by_through_the_proxy_equals_last_by_at_the_dis(stack):
    with connect(stack.dis, retry_s=0) as dis, connect(stack.address, retry_s=0) as proxy:
        view = proxy.last_by("Market", "Trade")
        assert view.num_rows == 1500 and view.equals(dis.last_by("Market", "Trade"))  # K0..K1499
        for day in ("2026-11-22", "2026-11-23"):
            assert proxy.last_by("Market", "Trade", partitions=[day]).equals(
                dis.last_by("Market", "Trade", partitions=[day]))
        theirs, ours = _states(dis), _states(proxy)
        assert set(ours) == set(theirs) == {A1, B1, A2}
        for k, m in ours.items():
            assert (m.rows, list(m.keys), m.schema_version, m.full) == (theirs[k].rows, ["Sym"],
                                                                       theirs[k].schema_version, True)
            assert from_ipc(m.arrow_ipc).equals(from_ipc(theirs[k].arrow_ipc)), k
        (one,) = proxy.last_by_states("Market", "Trade", location=B1)
        assert key_from_proto(one.key) == B1 and from_ipc(one.arrow_ipc).equals(from_ipc(theirs[B1].arrow_ipc))
        # new rows reach the proxy's states: the same answer again once it has them
        stack.feeder.append(A1, random_updates(9000, 600, 1500, seed=24))
        stack.feeder.append(A2, random_updates(9600, 400, 1000, seed=25))
        wait_for(lambda: _caught_up(stack, proxy), 30, 0.05, "the proxy's states at the DIS's rows")
        assert proxy.last_by("Market", "Trade").equals(dis.last_by("Market", "Trade"))
        assert proxy.last_by("Market", "Trade", location=A2).equals(dis.last_by("Market", "Trade", location=A2))


def _raw_states(address: str, request: dis_pb2.LastByRequest) -> dict:
    ch = open_channel(address)
    try:
        reply = dis_pb2_grpc.TableDataStub(ch).LastBy(request, timeout=30)
        return {key_from_proto(m.key): (m.rows, from_ipc(m.arrow_ipc)) for m in reply.locations}
    finally:
        ch.close()


def test_requests_naming_no_table_or_one_location_are_answered_as_the_dis_answers_them(stack):
    """No table (every table with last-by keys: Market.Quote, without, is left out), a
    namespace, and a subscription to one location."""
    with connect(stack.address, retry_s=0) as proxy:
        wait_for(lambda: _caught_up(stack, proxy), 30, 0.05, "the proxy's states at the DIS's rows")
    for request in (dis_pb2.LastByRequest(), dis_pb2.LastByRequest(namespace="Market")):
        theirs, ours = _raw_states(stack.dis, request), _raw_states(stack.address, request)
        assert set(ours) == set(theirs) == {A1, B1, A2}
        assert all(ours[k][0] == theirs[k][0] and ours[k][1].equals(theirs[k][1]) for k in ours)
    ch = open_channel(stack.address)
    try:
        call = dis_pb2_grpc.TableDataStub(ch).SubscribeLastBy(dis_pb2.LastByRequest(location=key_to_proto(B1)))
        first = next(call)
        assert key_from_proto(first.key) == B1 and first.full
        assert from_ipc(first.arrow_ipc).equals(stack.srv.engine.location(B1).lastby.snapshot().table)
        stack.feeder.append(A1, random_updates(30_000, 100, 1500, seed=26))  # not this location's
        stack.feeder.append(B1, random_updates(30_100, 100, 1200, seed=27))
        second = next(call)
        assert key_from_proto(second.key) == B1 and not second.full
        assert second.rows == stack.srv.engine.location(B1).lastby.snapshot().rows
        call.cancel()
    finally:
        ch.close()
    wait_for(lambda: sample(stack.metrics(), "dis_proxy_lastby_subscribers") == 0, 10, 0.1, "the stream closed")


def _refusal(address: str, call: str, request) -> tuple[grpc.StatusCode, str]:
    ch = open_channel(address)
    try:
        stub = getattr(dis_pb2_grpc.TableDataStub(ch), call)
        if call == "LastBy":
            stub(request, timeout=30)
        else:
            next(iter(stub(request, timeout=30)))
    except grpc.RpcError as e:
        return e.code(), e.details()
    finally:
        ch.close()
    raise AssertionError(f"{call} {request} was answered at {address}")


@pytest.mark.parametrize("call", ["LastBy", "SubscribeLastBy"])
def test_the_proxy_refuses_what_the_dis_refuses_with_its_words(stack, call):
    cases = [
        dis_pb2.LastByRequest(namespace="Market", table="Quote"),  # declares no last-by keys
        dis_pb2.LastByRequest(namespace="Nope", table="Nope"),  # unknown table
        dis_pb2.LastByRequest(location=key_to_proto(LocationKey("Market", "Trade", "Z", "2026-11-22"))),
    ]
    for request in cases:
        code, details = _refusal(stack.dis, call, request)
        assert code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND)
        got = _refusal(stack.address, call, request)
        assert got[0] == code and details in got[1], (request, got, details)


def test_many_subscribers_one_upstream_subscription_each_keeps_the_dis_state(stack):
    subs = [LastBySubscriber(stack.address) for _ in range(20)]
    try:
        def given(k: LocationKey) -> int:
            return stack.srv.engine.location(k).lastby.snapshot().rows

        def all_at_dis_rows() -> bool:
            return all(s.rows(k) == given(k) for s in subs for k in (A1, B1, A2))

        wait_for(all_at_dis_rows, 30, 0.05, "every subscriber has every location's state")
        m = stack.metrics()
        assert sample(m, "dis_proxy_lastby_subscribers") == 20
        assert {s.labels["table"]: s.value for s in m["dis_proxy_upstream_lastby_subscriptions"]} == {
            "Market.Trade": 1.0}
        for k in (A1, B1, A2):  # the DIS serves one SubscribeLastBy stream, not 20
            assert stack.srv.engine.location(k).lastby.subscribers == 1, k
        for i in range(3):
            stack.feeder.append(A1, random_updates(20_000 + i * 500, 300, 1500, seed=30 + i))
            stack.feeder.append(B1, random_updates(20_300 + i * 500, 200, 1200, seed=40 + i))
            wait_for(all_at_dis_rows, 30, 0.05, f"every subscriber has update {i}")
        for s in subs:
            assert s.error is None, s.error
            for k in (A1, B1, A2):
                state = stack.srv.engine.location(k).lastby.snapshot()
                assert s.state(k).equals(state.table), k
                sizes = s.sizes(k)
                assert all(a < b for a, b in zip(sizes, sizes[1:])), f"rows went back or came twice: {sizes}"
            firsts = {}
            for k, rows, full, _ in s.messages:
                firsts.setdefault(k, full)
            assert all(firsts.values()), "a subscription starts with each location's full state"
            # after the first, only the keys that changed: never more than a publish's rows
            assert any(not full for _, _, full, _ in s.messages)
    finally:
        for s in subs:
            s.close()
    wait_for(lambda: sample(stack.metrics(), "dis_proxy_lastby_subscribers") == 0, 10, 0.1, "streams closed")


def test_a_routing_entry_with_proxies_reads_last_by_through_them(stack):
    """The entry's DIS address answers nothing: the reader's states can only come from the proxy."""
    with connect(stack.dis, retry_s=0) as dis, connect(routing=str(stack.routing), retry_s=0) as reader:
        assert reader.replicas("Market", "Trade") == [stack.address]
        wait_for(lambda: _caught_up(stack, reader), 30, 0.05, "the proxy's states at the DIS's rows")
        assert reader.last_by("Market", "Trade").equals(dis.last_by("Market", "Trade"))


@pytest.mark.spark
def test_spark_last_by_view_through_the_proxy(spark_session, stack):  # noqa: F811
    """``.option("view", "lastBy")`` with a routing file whose entry lists the proxy (the DIS
    address answers nothing): the batch view is the DIS's."""
    with connect(stack.dis, retry_s=0) as dis:
        want = dis.last_by("Market", "Trade")
    df = (spark_session.read.format("dis").option("routing", str(stack.routing)).option("table", "Market.Trade")
          .option("retrySeconds", "0").option("view", "lastBy").load())
    got = df.toArrow()
    assert got.column_names == ["Timestamp", "Sym", "Price", "Size", "Date"]
    assert got.num_rows == want.num_rows

    def rows(t):  # (Date, Sym) is unique in a table's view
        return {(r["Date"], r["Sym"]): (r["Size"], r["Price"]) for r in
                t.select(["Date", "Sym", "Size", "Price"]).to_pylist()}

    assert rows(got) == rows(want)
