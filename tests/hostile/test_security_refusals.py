"""With TLS, client certificates and a token configured, every RPC of both services refuses a
caller without credentials, with a wrong token or with a certificate from another CA -- and a
refused caller learns nothing and changes nothing.  Real certificates (openssl), a real DIS on
loopback, and the real ``dis-tailer`` with a wrong token.

tests/server/test_security.py covers ListTables and the Ingest open for the same cases; this
file covers every other RPC, the token-only and TLS-only set-ups, and the tailer.
"""

from __future__ import annotations

import pathlib
import shutil
import time

import grpc
import pytest

from disd.rpc.channel import ClientSecurity, open_channel
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from server.test_security import make_pki
from support import (TRADE, log_name, start_dis_server, start_tailer, trade_rows, wait_for, write_log,
                     write_tailer_config)

from .helpers import chunk_msg, key_msg, open_msg, run_stream

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def start(tmp_path, tls: dict | None, token: bool):
    server = {}
    if token:
        (tmp_path / "token").write_text(TOKEN + "\n")
        server["token_file"] = str(tmp_path / "token")
    if tls:
        server["tls"] = tls
    return start_dis_server(tmp_path / "db", **server)


def good(pki) -> dict:
    return dict(ca=str(pki / "ca.pem"), cert=str(pki / "client.pem"), key=str(pki / "client.key"), token=TOKEN,
                server_name="localhost")


@pytest.fixture
def secure_dis(tmp_path, pki):
    """TLS + client certificates + token, holding one location with 10 published rows."""
    srv = start(tmp_path, {"cert": str(pki / "server.pem"), "key": str(pki / "server.key"),
                           "client_ca": str(pki / "ca.pem")}, token=True)
    p = tmp_path / log_name("sec")
    write_log(p, TRADE, trade_rows(0, 10), [3] * 10)
    ch = open_channel(f"127.0.0.1:{srv.port}", ClientSecurity(**good(pki)))
    r = run_stream(ch, [open_msg("sec", TRADE.fingerprint), chunk_msg(p.name, 0, p.read_bytes())])
    assert r.code == grpc.StatusCode.OK and r.responses[-1].ack.committed_rows == 10, r
    end = time.monotonic() + 10
    while time.monotonic() < end and not any(loc.published_rows == 10 for loc in srv.engine.locations()):
        time.sleep(0.02)
    ch.close()
    yield srv
    srv.stop(0.5)


LOC = key_msg("sec")


def _list_locations(ch):
    return dis_pb2_grpc.TableDataStub(ch).ListLocations(dis_pb2.ListLocationsRequest(), timeout=10)


def _subscribe(ch):
    return next(iter(dis_pb2_grpc.TableDataStub(ch).Subscribe(dis_pb2.SubscribeRequest(), timeout=10)))


def _subscribe_batches(ch):
    return next(iter(dis_pb2_grpc.TableDataStub(ch).SubscribeBatches(dis_pb2.SubscribeRequest(), timeout=10)))


def _read_block(ch):
    return dis_pb2_grpc.TableDataStub(ch).ReadBlock(
        dis_pb2.ReadBlockRequest(location=LOC, file="Size.dat", block_index=0), timeout=10)


def _read_blocks(ch):
    return list(dis_pb2_grpc.TableDataStub(ch).ReadBlocks(
        dis_pb2.ReadBlocksRequest(location=LOC, file="Size.dat", first_block=0, block_count=4), timeout=10))


def _read_ranges(ch):
    return list(dis_pb2_grpc.TableDataStub(ch).ReadRanges(dis_pb2.ReadRangesRequest(
        location=LOC, ranges=[dis_pb2.BlockRange(file="Size.dat", first_block=0, block_count=4)]), timeout=10))


def _status(ch):
    return dis_pb2_grpc.TableDataStub(ch).Status(dis_pb2.StatusRequest(), timeout=10)


def _list_tables(ch):
    return dis_pb2_grpc.TableDataStub(ch).ListTables(dis_pb2.ListTablesRequest(), timeout=10)


def _ingest_chunks(ch):
    """A complete, valid ingest of a new location: open and a chunk."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = pathlib.Path(d) / log_name("intruder")
        write_log(p, TRADE, trade_rows(0, 5), [3] * 5)
        r = run_stream(ch, [open_msg("intruder", TRADE.fingerprint), chunk_msg(p.name, 0, p.read_bytes())])
    if r.code != grpc.StatusCode.OK:
        raise _Refused(r.code, r.details)
    return r


class _Refused(grpc.RpcError):
    def __init__(self, code, details) -> None:
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


CALLS = {"ListTables": _list_tables, "ListLocations": _list_locations, "Subscribe": _subscribe,
         "SubscribeBatches": _subscribe_batches,
         "ReadBlock": _read_block, "ReadBlocks": _read_blocks,
         "ReadRanges": _read_ranges, "Status": _status, "Ingest": _ingest_chunks}


def _credentials(pki, case: str) -> ClientSecurity:
    c = good(pki)
    if case == "no-credentials":
        return ClientSecurity()  # plaintext, no certificate, no token
    if case == "no-token":
        c["token"] = None
    elif case == "wrong-token":
        c["token"] = "guess"
    elif case == "token-of-another-length":
        c["token"] = TOKEN + "x"
    elif case == "no-client-certificate":
        c["cert"] = c["key"] = None
    elif case == "wrong-client-certificate":
        c["cert"], c["key"] = str(pki / "intruder.pem"), str(pki / "intruder.key")
    elif case == "untrusted-server":  # the client trusts another CA: it must refuse the DIS
        c["ca"] = str(pki / "evil.pem")
    return ClientSecurity(**c)


EXPECTED = {
    "no-credentials": grpc.StatusCode.UNAVAILABLE,  # no TLS handshake at all
    "no-token": grpc.StatusCode.UNAUTHENTICATED,
    "wrong-token": grpc.StatusCode.UNAUTHENTICATED,
    "token-of-another-length": grpc.StatusCode.UNAUTHENTICATED,
    "no-client-certificate": grpc.StatusCode.UNAVAILABLE,  # the handshake fails
    "wrong-client-certificate": grpc.StatusCode.UNAVAILABLE,
    "untrusted-server": grpc.StatusCode.UNAVAILABLE,
}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_every_rpc_refuses_bad_credentials_and_changes_nothing(secure_dis, pki, case):
    ch = open_channel(f"127.0.0.1:{secure_dis.port}", _credentials(pki, case))
    try:
        for name, call in CALLS.items():
            with pytest.raises(grpc.RpcError) as ei:
                call(ch)
            assert ei.value.code() == EXPECTED[case], (case, name, ei.value.code(), ei.value.details())
            if EXPECTED[case] == grpc.StatusCode.UNAUTHENTICATED:
                assert "bearer token" in ei.value.details(), (case, name, ei.value.details())
    finally:
        ch.close()
    assert [loc.key.internal_partition for loc in secure_dis.engine.locations()] == ["sec"]
    assert not [p for p in pathlib.Path(secure_dis.engine.db_root).rglob("*") if "intruder" in str(p)]


def test_the_same_calls_succeed_with_good_credentials(secure_dis, pki):
    """The refusals above are about credentials, not about the calls."""
    ch = open_channel(f"127.0.0.1:{secure_dis.port}", ClientSecurity(**good(pki)))
    try:
        assert _list_locations(ch).locations[0].rows == 10
        assert _subscribe(ch).rows == 10
        assert len(_read_block(ch).data) == 40
        assert _read_blocks(ch)
        assert _read_ranges(ch)
        assert _status(ch).locations
        assert _ingest_chunks(ch).responses[-1].ack.committed_rows == 5
    finally:
        ch.close()


@pytest.mark.parametrize("setup", ["token-only", "tls-and-token"])
def test_token_is_enforced_without_client_certificates(tmp_path, pki, setup):
    """Token over plaintext (a trusted network) and over server-only TLS: a missing or wrong
    token is refused on both services."""
    tls = None if setup == "token-only" else {"cert": str(pki / "server.pem"), "key": str(pki / "server.key")}
    srv = start(tmp_path, tls, token=True)
    try:
        base = {} if tls is None else {"ca": str(pki / "ca.pem"), "server_name": "localhost"}
        for token, code in [(None, grpc.StatusCode.UNAUTHENTICATED), ("nope", grpc.StatusCode.UNAUTHENTICATED),
                            (TOKEN, None)]:
            ch = open_channel(f"127.0.0.1:{srv.port}", ClientSecurity(token=token, **base))
            for name in ("ListTables", "Status", "Ingest"):
                if code is None:
                    CALLS[name](ch)
                    continue
                with pytest.raises(grpc.RpcError) as ei:
                    CALLS[name](ch)
                assert ei.value.code() == code, (setup, token, name, ei.value.details())
            ch.close()
    finally:
        srv.stop(0.5)


def test_health_stays_open_but_tells_nothing_about_tables(secure_dis, pki):
    """Probes need no secrets; the answer is SERVING and nothing else."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    c = good(pki)
    c["token"] = None
    ch = open_channel(f"127.0.0.1:{secure_dis.port}", ClientSecurity(**c))
    r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert r.status == health_pb2.HealthCheckResponse.SERVING
    assert r.ListFields() == [(health_pb2.HealthCheckResponse.DESCRIPTOR.fields_by_name["status"], r.status)]
    ch.close()


def test_tailer_with_a_wrong_token_ingests_nothing(tmp_path, pki):
    """The real dis-tailer, TLS with a client certificate but the wrong token: refused, the
    DIS holds no location, and the tailer keeps running (it retries; it does not crash)."""
    srv = start(tmp_path, {"cert": str(pki / "server.pem"), "key": str(pki / "server.key"),
                           "client_ca": str(pki / "ca.pem")}, token=True)
    logs = tmp_path / "logs"
    logs.mkdir()
    write_log(logs / log_name("tail"), TRADE, trade_rows(0, 20), [3] * 20)
    (tmp_path / "bad-token").write_text("guess\n")
    cfg = write_tailer_config(
        tmp_path, srv.port, logs, token_file=str(tmp_path / "bad-token"), poll_interval_ms=50,
        tls={"ca": str(pki / "ca.pem"), "cert": str(pki / "client.pem"), "key": str(pki / "client.key"),
             "server_name": "localhost"})
    tailer = start_tailer(tmp_path, cfg)
    try:
        wait_for(lambda: "UNAUTHENTICATED" in tailer.log_text(), 20, what="the tailer refused")
        assert "UNAUTHENTICATED" in tailer.log_text(), tailer.log_text()[-2000:]
        assert tailer.alive()
        assert srv.engine.locations() == []
    finally:
        tailer.terminate()
        srv.stop(0.5)
