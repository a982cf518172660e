"""TLS, mutual TLS and the bearer token, on both services, with real certificates."""

from __future__ import annotations

import shutil
import subprocess

import grpc
import pytest

from disd.client import DisClientError, connect
from disd.rpc.channel import ClientSecurity, open_channel
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from support import running_dis

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


def _ossl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(d):
    """A CA, a server certificate for localhost/127.0.0.1, a client certificate, and a client
    certificate from an unrelated CA."""
    d.mkdir(exist_ok=True)
    (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for ca in ("ca", "evil"):
        _ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={ca}",
              "-keyout", f"{ca}.key", "-out", f"{ca}.pem", cwd=d)
    for name, ca, ext in (("server", "ca", True), ("client", "ca", False), ("intruder", "evil", False)):
        _ossl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
              "-out", f"{name}.csr", cwd=d)
        _ossl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
              "-days", "2", "-out", f"{name}.pem", *(["-extfile", "san.ext"] if ext else []), cwd=d)
    return d


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def secure_dis(tmp_path, pki):
    (tmp_path / "token").write_text("s3cret-token\n")
    with running_dis(tmp_path / "db", token_file=str(tmp_path / "token"),
                     tls={"cert": str(pki / "server.pem"), "key": str(pki / "server.key"),
                          "client_ca": str(pki / "ca.pem")}) as srv:
        yield srv


def _ingest_open(channel):
    stub = dis_pb2_grpc.IngestStub(channel)
    req = dis_pb2.IngestRequest(open=dis_pb2.IngestOpen(
        location=dis_pb2.LocationKey(namespace="Market", table="Trade", internal_partition="a", column_partition="b"),
        schema_fingerprint="x"))
    return next(stub.Stream(iter([req]), timeout=10))


def _list(channel):
    return dis_pb2_grpc.TableDataStub(channel).ListTables(dis_pb2.ListTablesRequest(), timeout=10)


def test_valid_credentials_are_accepted(secure_dis, pki):
    sec = ClientSecurity(ca=str(pki / "ca.pem"), cert=str(pki / "client.pem"), key=str(pki / "client.key"),
                         token="s3cret-token", server_name="localhost")
    with connect(f"127.0.0.1:{secure_dis.port}", security=sec) as c:
        assert [s.key for s in c.tables()] == ["Market.Quote", "Market.Trade"]
    ch = open_channel(f"127.0.0.1:{secure_dis.port}", sec)
    with pytest.raises(grpc.RpcError) as ei:  # authenticated: refused only for the bad fingerprint
        _ingest_open(ch)
    assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    ch.close()


@pytest.mark.parametrize("call", [_list, _ingest_open], ids=["tabledata", "ingest"])
@pytest.mark.parametrize(
    "case", ["no-token", "wrong-token", "no-client-cert", "wrong-client-cert", "plaintext"]
)
def test_bad_credentials_are_refused(secure_dis, pki, call, case):
    good = dict(ca=str(pki / "ca.pem"), cert=str(pki / "client.pem"), key=str(pki / "client.key"),
                token="s3cret-token", server_name="localhost")
    if case == "no-token":
        good["token"] = None
    elif case == "wrong-token":
        good["token"] = "guess"
    elif case == "no-client-cert":
        good["cert"] = good["key"] = None
    elif case == "wrong-client-cert":
        good["cert"], good["key"] = str(pki / "intruder.pem"), str(pki / "intruder.key")
    elif case == "plaintext":
        good = dict(token="s3cret-token")
    ch = open_channel(f"127.0.0.1:{secure_dis.port}", ClientSecurity(**good))
    with pytest.raises(grpc.RpcError) as ei:
        call(ch)
    expected = {grpc.StatusCode.UNAUTHENTICATED} if "token" in case else {grpc.StatusCode.UNAVAILABLE}
    assert ei.value.code() in expected, (case, ei.value.code(), ei.value.details())
    ch.close()


def test_client_reports_refusal_clearly(secure_dis, pki):
    sec = ClientSecurity(ca=str(pki / "ca.pem"), cert=str(pki / "client.pem"), key=str(pki / "client.key"),
                         token="nope", server_name="localhost")
    with connect(f"127.0.0.1:{secure_dis.port}", security=sec) as c:
        with pytest.raises(DisClientError, match="refused the credentials"):
            c.tables()


@pytest.mark.parametrize("case", ["wrong-client-cert", "no-client-cert"])
def test_a_refused_client_certificate_is_said_at_once(secure_dis, pki, case):
    """gRPC reports a DIS refusing the client's certificate as a closed socket, as if the DIS
    were going away; a reader must say so at once, not wait out a restart for a minute."""
    import time

    cert = {"wrong-client-cert": "intruder", "no-client-cert": None}[case]
    sec = ClientSecurity(ca=str(pki / "ca.pem"), cert=str(pki / f"{cert}.pem") if cert else None,
                         key=str(pki / f"{cert}.key") if cert else None, token="s3cret-token",
                         server_name="localhost")
    t0 = time.monotonic()
    with connect(f"127.0.0.1:{secure_dis.port}", security=sec, retry_s=60) as c:
        with pytest.raises(DisClientError, match="refused this client's TLS set-up") as ei:
            c.tables()
    assert time.monotonic() - t0 < 15, ei.value
    assert "certificate" in str(ei.value).lower()


def test_a_dis_that_is_down_is_still_waited_for_over_tls(pki):
    """The TLS probe does not turn an unreachable DIS into a refusal: the reader waits it out."""
    from support.processes import free_port

    sec = ClientSecurity(ca=str(pki / "ca.pem"), cert=str(pki / "client.pem"), key=str(pki / "client.key"),
                         server_name="localhost")
    with connect(f"127.0.0.1:{free_port()}", security=sec, retry_s=1) as c:
        with pytest.raises(DisClientError, match=r"unreachable.*tried for 1 s"):
            c.tables()
