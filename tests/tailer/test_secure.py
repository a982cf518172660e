"""The tailer's streams through TLS, client certificates and a bearer token, against a real DIS
on loopback: the event loop's channels must present the credentials (the token as call metadata,
the certificates as channel credentials), or a secured DIS refuses every location."""

from __future__ import annotations

import shutil

import pytest

from disd.tailer import Tailer, parse_tailer_config
from server.test_security import make_pki
from support import TRADE, log_name, start_dis_server, trade_rows, write_log

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.mark.parametrize("tls", [True, False], ids=["tls+token", "token"])
def test_a_secured_dis_takes_the_tailers_rows(tmp_path, pki, tls):
    (tmp_path / "token").write_text(TOKEN + "\n")
    server = {"token_file": str(tmp_path / "token")}
    client = {"token_file": str(tmp_path / "token")}
    if tls:
        server["tls"] = {"cert": str(pki / "server.pem"), "key": str(pki / "server.key"),
                         "client_ca": str(pki / "ca.pem")}
        client["tls"] = {"ca": str(pki / "ca.pem"), "cert": str(pki / "client.pem"), "key": str(pki / "client.key"),
                         "server_name": "localhost"}
    srv = start_dis_server(tmp_path / "db", **server)
    try:
        logs = tmp_path / "logs"
        logs.mkdir()
        write_log(logs / log_name("sec"), TRADE, trade_rows(0, 20), [3] * 20)
        cfg = parse_tailer_config({"dis": f"127.0.0.1:{srv.port}", "log_dirs": [str(logs)],
                                   "state_dir": str(tmp_path / "state"),
                                   "max_backoff_ms": 200, **client}, "tailer.yaml")
        with Tailer(cfg) as t:
            assert t.wait_idle(20), t.status()
            st = next(iter(t.status().values()))
            assert st["committed_rows"] == 20 and st["error"] is None, st
    finally:
        srv.stop(0.5)
