"""TLS (with client certificates) and bearer tokens on both sides of a proxy: readers to proxy
with the proxy's credentials, proxy to DIS with the DIS's; ``dis health`` and ``dis status``
against the proxy."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request

import pytest

from disd.binlog import LocationKey
from disd.client import DisClientError, connect
from disd.security import ClientSecurity
from server.test_security import make_pki
from support import BIN, Feeder, running_dis, subprocess_env, trade_rows

from .proxy_support import start_proxy, write_proxy_config

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
KEY = LocationKey("Market", "Trade", "feed0", "2026-11-22")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def secure(tmp_path, pki):
    """A DIS with mTLS and token ``dis-token``; a proxy with mTLS and token ``proxy-token`` in
    front of it, holding a client certificate and the DIS's token."""
    (tmp_path / "dis-token").write_text("dis-token\n")
    (tmp_path / "proxy-token").write_text("proxy-token\n")
    tls = {"cert": str(pki / "server.pem"), "key": str(pki / "server.key"), "client_ca": str(pki / "ca.pem")}
    with running_dis(tmp_path / "db", token_file=str(tmp_path / "dis-token"), tls=tls) as dis:
        Feeder(dis).append(KEY, trade_rows(0, 5000))
        upstream = {"address": f"127.0.0.1:{dis.port}", "ca": str(pki / "ca.pem"), "cert": str(pki / "client.pem"),
                    "key": str(pki / "client.key"), "token_file": str(tmp_path / "dis-token")}
        config, port = write_proxy_config(tmp_path, upstream, tls=tls, token_file=str(tmp_path / "proxy-token"))
        mtls = ClientSecurity(ca=str(pki / "ca.pem"), cert=str(pki / "client.pem"), key=str(pki / "client.key"))
        proxy = start_proxy(tmp_path, config, mtls)
        try:
            yield dis, port, mtls, tmp_path
        finally:
            proxy.terminate()


def test_readers_and_upstream_each_with_their_own_credentials(secure, pki):
    dis, port, mtls, tmp = secure
    reader = ClientSecurity(mtls.ca, mtls.cert, mtls.key, token="proxy-token")
    with connect(f"127.0.0.1:{port}", security=reader, retry_s=0) as c:
        assert [s.key for s in c.tables()] == ["Market.Quote", "Market.Trade"]
        assert c.read_table("Market", "Trade")["Size"].to_pylist() == list(range(5000))
    for bad, why in ((ClientSecurity(mtls.ca, mtls.cert, mtls.key, token="dis-token"), "invalid bearer token"),
                     (ClientSecurity(mtls.ca, mtls.cert, mtls.key), "missing bearer token")):
        with connect(f"127.0.0.1:{port}", security=bad, retry_s=0) as c, pytest.raises(DisClientError, match=why):
            c.tables()
    with connect(f"127.0.0.1:{port}", security=ClientSecurity(token="proxy-token"), retry_s=0) as c, \
            pytest.raises(DisClientError):
        c.tables()  # plaintext to a TLS proxy

    # The block endpoint: the same TLS and token.
    ctx = ssl.create_default_context(cafile=mtls.ca)
    ctx.load_cert_chain(mtls.cert, mtls.key)

    def get(token: str | None) -> dict:
        req = urllib.request.Request(f"https://127.0.0.1:{port + 1}/v1/locations?namespace=Market&table=Trade",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
        return json.loads(urllib.request.urlopen(req, context=ctx, timeout=30).read())

    assert get("proxy-token")["locations"][0]["rows"] == 5000
    with pytest.raises(urllib.error.HTTPError) as ei:
        get("dis-token")
    assert ei.value.code == 401


def test_dis_health_and_status_against_the_proxy(secure, pki):
    dis, port, mtls, tmp = secure
    flags = ["--address", f"127.0.0.1:{port}", "--ca", mtls.ca, "--cert", mtls.cert, "--key", mtls.key]

    def dis_cmd(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "dis"), *args], capture_output=True, text=True, timeout=60,
                              env=subprocess_env())

    health = dis_cmd("health", *flags, "--json")
    assert health.returncode == 0, health.stderr
    assert json.loads(health.stdout)["status"] == "SERVING"
    status = dis_cmd("status", *flags, "--token-file", str(tmp / "proxy-token"), "--json")
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert [(loc["table"], loc["internal_partition"], loc["rows"]) for loc in report["locations"]] == [("Trade", "feed0", 5000)]
    import disd

    assert report["instances"][0]["version"] == disd.__version__
    refused = dis_cmd("status", *flags, "--json")  # no token
    assert refused.returncode == 1 and "missing bearer token" in refused.stderr


def test_a_proxy_the_dis_refuses_says_so(tmp_path, pki, secure):
    dis, _, mtls, _ = secure
    (tmp_path / "wrong").write_text("not-the-dis-token\n")
    upstream = {"address": f"127.0.0.1:{dis.port}", "ca": str(pki / "ca.pem"), "cert": str(pki / "client.pem"),
                "key": str(pki / "client.key"), "token_file": str(tmp_path / "wrong"), "retry_s": 1}
    sub = tmp_path / "second"
    sub.mkdir()
    config, port = write_proxy_config(sub, upstream)
    proxy = start_proxy(sub, config)
    try:
        with connect(f"127.0.0.1:{port}", retry_s=0) as c, pytest.raises(DisClientError, match="refused the credentials"):
            c.tables()
    finally:
        proxy.terminate()
