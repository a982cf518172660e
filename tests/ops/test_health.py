"""``dis health``: what the container's HEALTHCHECK runs, against a real DIS on loopback."""

from __future__ import annotations

import json

from disd.cli import main
from support import free_port, start_dis_server


def test_serving_dis_is_healthy(tmp_path, capsys):
    (tmp_path / "token").write_text("s3cret\n")
    srv = start_dis_server(tmp_path / "db", token_file=str(tmp_path / "token"))
    try:
        # the health service needs no token: a probe holds no secret
        assert main(["health", "--address", f"127.0.0.1:{srv.port}"]) == 0
        assert main(["health", "--address", f"127.0.0.1:{srv.port}", "--service", "disd.rpc.v1.Ingest",
                     "--json"]) == 0
        out = capsys.readouterr().out.splitlines()
        assert json.loads(out[-1]) == {"dis": f"127.0.0.1:{srv.port}", "service": "disd.rpc.v1.Ingest",
                                       "status": "SERVING", "ok": True}
        assert main(["health", "--address", f"127.0.0.1:{srv.port}", "--service", "no.such.Service"]) == 1
        assert "NOT_FOUND" in capsys.readouterr().err
        srv.health.enter_graceful_shutdown()  # what stop() does first
        assert main(["health", "--address", f"127.0.0.1:{srv.port}"]) == 1
        assert "NOT_SERVING" in capsys.readouterr().err
    finally:
        srv.stop(0.5)


def test_unreachable_dis_is_unhealthy(capsys):
    assert main(["health", "--address", f"127.0.0.1:{free_port()}", "--timeout", "1"]) == 1
    assert "UNAVAILABLE" in capsys.readouterr().err
