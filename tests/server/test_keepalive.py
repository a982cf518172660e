"""The product's gRPC servers (``disd.server.daemon.grpc_server``: a DIS, a proxy) accept keepalive
pings every ``MIN_KEEPALIVE_MS`` on calls that carry nothing: the tailers and proxies ping every
few seconds to notice a DIS that stopped answering (docs/tailer.md, "Connections";
docs/proxy.md, "Failure behaviour"), and a server that took those pings for abuse would end the
idle subscriptions and tailer calls it serves (GOAWAY ``too_many_pings``) every few seconds."""

from __future__ import annotations

import threading
import time

from disd.rpc.channel import MIN_KEEPALIVE_MS, keepalive_options, open_channel
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc

#: pings at the shortest interval, for this many seconds: past the three a server with a floor of
#: 5 s ends a connection after
IDLE_S = 8.0


def test_an_idle_subscription_pinged_at_the_shortest_interval_stays_open(dis):
    channel = open_channel(f"127.0.0.1:{dis.port}", None, keepalive_options(MIN_KEEPALIVE_MS, 3000))
    call = dis_pb2_grpc.TableDataStub(channel).SubscribeBatches(
        dis_pb2.SubscribeRequest(namespace="Market", table="Trade"))
    ended: list = []

    def read() -> None:
        try:
            for _ in call:
                pass
            ended.append("the DIS ended the stream")
        except Exception as e:  # noqa: BLE001 - reported by the test
            ended.append(e)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    try:
        time.sleep(IDLE_S)
        assert not ended, f"the idle subscription ended: {ended}"
    finally:
        call.cancel()
        t.join(5)
        channel.close()
