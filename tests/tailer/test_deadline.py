"""The answer deadline (``ack_timeout_ms``, docs/tailer.md "Connections"): a DIS whose gRPC core
answers (keepalive pings included) while its ingest answers nothing is left after the deadline,
counted as down, and streamed to again once it answers, losing and repeating nothing; and the
keepalive pings themselves end nothing while a DIS answers.  (A DIS that stops altogether,
SIGSTOP, is left by the keepalive pings sooner: tests/replicas/test_frozen_replica.py.)"""

from __future__ import annotations

import time
from concurrent import futures

import grpc

from disd.rpc.channel import MIN_KEEPALIVE_MS
from disd.rpc.v1 import dis_pb2_grpc
from disd.tailer import Tailer
from support import running_dis, wait_for

from .fakedis import FakeDis
from .helpers import config, name, write
from .test_streaming import rows_received

ACK_TIMEOUT_MS = 1500


class SilentDis(dis_pb2_grpc.IngestServicer):
    """A DIS that takes a ``Multiplex`` call and every request on it, and answers none: its
    process and gRPC core run (they answer keepalive pings), its ingest is stuck."""

    def __init__(self) -> None:
        self.calls = 0

    def Multiplex(self, request_iterator, context):  # noqa: N802
        self.calls += 1
        context.send_initial_metadata(())
        for _ in request_iterator:
            pass
        return
        yield  # a response stream that never answers


def _serve(servicer) -> tuple[grpc.Server, str]:  # noqa: ANN001
    server = grpc.server(futures.ThreadPoolExecutor(8))
    dis_pb2_grpc.add_IngestServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def test_a_dis_that_answers_nothing_is_left_after_the_ack_timeout(tmp_path):
    write(tmp_path / name(), 5)
    server, address = _serve(SilentDis())
    try:
        t0 = time.monotonic()
        with Tailer(config(address, tmp_path, ack_timeout_ms=ACK_TIMEOUT_MS)) as t:
            status = lambda: t.status()["Market/Trade/ip1/2026-11-22"]  # noqa: E731
            wait_for(lambda: "answered nothing" in (status()["error"] or ""), 10, 0.02,
                     "the stream given up for the silent DIS")
            took = time.monotonic() - t0
            assert took >= ACK_TIMEOUT_MS / 1000, f"given up after {took:.2f} s, before the deadline"
            assert took <= ACK_TIMEOUT_MS / 1000 + 2.0, f"given up only after {took:.2f} s"
            assert status()["state"] in ("reconnecting", "connecting")
            assert t.replica_status()[address]["connected"] is False
            # and again on the next call: the deadline is each call's
            n = t.workers()[0].reconnects
            wait_for(lambda: t.workers()[0].reconnects > n, 10, 0.05, "another attempt given up")
    finally:
        server.stop(0).wait(5)


def test_stalled_acks_break_the_stream_and_it_resumes_without_loss_or_repeat(tmp_path):
    dis = FakeDis().start()  # no Multiplex: the location's stream is a Stream call of its own
    path = tmp_path / name()
    write(path, 5, 0)
    try:
        with Tailer(config(dis.address, tmp_path, ack_timeout_ms=ACK_TIMEOUT_MS)) as t:
            assert t.wait_idle(20)
            dis.stalled.set()
            write(path, 5, 5)  # received by the DIS, never acknowledged while stalled
            wait_for(lambda: "answered nothing" in (t.status()["Market/Trade/ip1/2026-11-22"]["error"] or ""),
                     ACK_TIMEOUT_MS / 1000 + 5, 0.02, "the stream with a chunk unacknowledged given up")
            assert t.replica_status()[dis.address]["connected"] is False
            dis.stalled.clear()
            write(path, 5, 10)
            assert t.wait_idle(20)
            assert t.replica_status()[dis.address]["connected"] is True
            assert rows_received(dis.log_of("ip1")) == list(range(15))
            assert not dis.errors
    finally:
        dis.stop()


def test_an_idle_call_pinged_at_the_shortest_interval_stays_open(tmp_path):
    """A real DIS takes the tailer's pings on a call with nothing to send (every row
    acknowledged): no reconnect, the replica connected throughout."""
    logs = tmp_path / "logs"
    logs.mkdir()
    write(logs / name(), 5)
    with running_dis(tmp_path / "db") as srv:
        address = f"127.0.0.1:{srv.port}"
        with Tailer(config(address, logs, keepalive_ms=MIN_KEEPALIVE_MS)) as t:
            assert t.wait_idle(20)
            time.sleep(8.0)  # pings every second: past the three a 5 s floor ends a connection after
            assert t.workers()[0].reconnects == 0, t.status()
            assert t.replica_status()[address]["connected"] is True
