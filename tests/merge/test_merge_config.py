"""``dis merge --config dis.yaml`` reads through the DIS that configuration serves: its
``server.host``/``server.port`` and its token, not 127.0.0.1:22021 (which, on a DIS serving
elsewhere, was tried for a minute and then reported unreachable)."""

from __future__ import annotations

import argparse
import json
import subprocess

import pytest
import yaml

from disd.historical.merge import MergeError
from disd.merge_job import add_arguments, request_from_args
from support import BIN, SCHEMAS, free_port_pair, start_dis_process, subprocess_env, write_dis_config

from .helpers import D1


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(["--namespace", "Market", "--table", "Trade", "--partition", D1, *argv])


def _config(tmp_path, server: dict) -> str:
    path = tmp_path / "dis.yaml"
    path.write_text(yaml.safe_dump({"db_root": str(tmp_path / "db"), "schemas": str(SCHEMAS), "server": server}))
    return str(path)


def test_the_dis_address_and_token_come_from_the_config(tmp_path):
    (tmp_path / "token").write_text("s3cret\n")
    cfg = _config(tmp_path, {"host": "0.0.0.0", "port": 23456, "token_file": str(tmp_path / "token")})
    src = request_from_args(_args("--config", cfg)).source
    # a DIS listening on every interface is reached on loopback (dis merge --config runs on its host)
    assert (src.address, src.security.token) == ("127.0.0.1:23456", "s3cret")
    assert request_from_args(_args("--config", _config(tmp_path, {"host": "10.1.2.3", "port": 23457}))
                             ).source.address == "10.1.2.3:23457"
    # the flags still win over the configuration
    (tmp_path / "other").write_text("other\n")
    src = request_from_args(_args("--config", cfg, "--address", "dis-b:1", "--token-file", str(tmp_path / "other"))
                            ).source
    assert (src.address, src.security.token) == ("dis-b:1", "other")


def test_a_config_serving_tls_needs_the_ca_to_trust(tmp_path):
    cfg = _config(tmp_path, {"port": 23456, "tls": {"cert": "/etc/dis/server.pem", "key": "/etc/dis/server.key"}})
    with pytest.raises(MergeError, match=r"server\.tls.*give --ca"):
        request_from_args(_args("--config", cfg))
    src = request_from_args(_args("--config", cfg, "--ca", "/etc/dis/ca.pem")).source
    assert (src.address, src.security.ca) == ("127.0.0.1:23456", "/etc/dis/ca.pem")
    mtls = _config(tmp_path, {"port": 23456, "tls": {"cert": "s.pem", "key": "s.key", "client_ca": "ca.pem"}})
    with pytest.raises(MergeError, match=r"server\.tls\.client_ca.*give --cert and --key"):
        request_from_args(_args("--config", mtls, "--ca", "/etc/dis/ca.pem"))


@pytest.mark.spark
def test_dis_merge_with_the_config_of_a_dis_on_another_port_and_a_token(tmp_path):
    """The real commands: ``dis serve`` on a port that is not 22021 with a token, rows sent by a
    tailer, then ``dis merge --config`` of that DIS (no --address, no --token-file) merges them."""
    from disd.logger import IntradayLoggerBuilder
    from disd.tailer import Tailer, parse_tailer_config

    (tmp_path / "token").write_text("s3cret\n")
    port = free_port_pair()
    assert port != 22021
    cfg = write_dis_config(tmp_path, port, token_file=str(tmp_path / "token"))
    dis = start_dis_process(tmp_path, cfg)
    try:
        logs = tmp_path / "logs"
        log = (IntradayLoggerBuilder(str(SCHEMAS / "Market.Trade.yaml")).set_log_dir(logs)
               .set_internal_partition("feed1").set_column_partition_value(D1).build())
        log.log_batch({"Sym": ["A", "B", "C"] * 100, "Size": list(range(300))})
        log.close()
        with Tailer(parse_tailer_config({"dis": f"127.0.0.1:{port}", "log_dirs": [str(logs)],
                                         "token_file": str(tmp_path / "token")})) as t:
            assert t.wait_idle(30)
        elsewhere = tmp_path / "elsewhere"  # no config/dis.yaml relative to the working directory
        elsewhere.mkdir()
        r = subprocess.run([str(BIN / "dis"), "merge", "--config", str(cfg), "--namespace", "Market", "--table",
                            "Trade", "--partition", D1, "--force", "--master", "local[1]", "--json"],
                           capture_output=True, text=True, timeout=600, cwd=elsewhere, env=subprocess_env())
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
        result = json.loads(r.stdout.strip().splitlines()[-1])
        assert (result["status"], result["rows"], result["source"]) == ("merged", 300, "dis"), result
        assert result["path"].startswith(str(tmp_path / "db"))
    finally:
        assert dis.terminate() == 0
