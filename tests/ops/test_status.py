"""``dis status`` against a real DIS on loopback: tables, locations, ages, checkpoint, tailer, errors."""

from __future__ import annotations

import json

from disd.cli import main
from disd.rpc.channel import open_channel
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from disd.tailer import Tailer, parse_tailer_config
from support import append_rows, free_port, log_name, start_dis_server, wait_for

BAD = "Market/Trade/bad/2026-11-22"


def _status(capsys, port: int, *extra: str, exit_status: int = 0):
    capsys.readouterr()
    assert main(["status", "--address", f"127.0.0.1:{port}", *extra]) == exit_status
    return capsys.readouterr().out


def test_status_shows_rows_ages_checkpoint_tailer_and_errors(tmp_path, capsys):
    # a location whose table.size is garbage: the DIS opens it in error state
    bad = tmp_path / "db/Intraday/Market/Trade/bad/2026-11-22/Trade"
    bad.mkdir(parents=True)
    (bad / "table.size").write_bytes(b"not a checkpoint")
    srv = start_dis_server(tmp_path / "db", checkpoint_ms=100)
    logs = tmp_path / "logs"
    size = append_rows(logs / log_name("ip1"), 0, 9, frames=3)
    cfg = parse_tailer_config({"dis": f"127.0.0.1:{srv.port}", "log_dirs": [str(logs)], "poll_interval_ms": 50})
    try:
        with Tailer(cfg) as tailer:
            assert tailer.wait_idle(30)

            def checkpointed():
                # a location in error: exit status 1 (README, "Tools")
                rep = json.loads(_status(capsys, srv.port, "--json", exit_status=1))
                loc = next(listed for listed in rep["locations"] if listed["internal_partition"] == "ip1")
                return rep if loc["checkpointed_rows"] == 9 and loc["checkpoint"] else None

            rep = wait_for(checkpointed, 10, what="checkpoint of 9 rows")
            text = _status(capsys, srv.port, exit_status=1)
        locs = {f"{loc['namespace']}/{loc['table']}/{loc['internal_partition']}/{loc['column_partition']}": loc
                for loc in rep["locations"]}
        assert set(locs) == {"Market/Trade/ip1/2026-11-22", BAD}
        good = locs["Market/Trade/ip1/2026-11-22"]
        assert good["rows"] == 9 and good["error"] is None
        assert 0 <= good["last_flush_age_s"] < 5 and 0 <= good["checkpoint_age_s"] < 5
        # the checkpoint covers the whole log: its source record is the file's end
        assert good["checkpoint"] == {"file": log_name("ip1"), "offset": size, "skip_rows": 0}
        assert good["tailer"]["id"] == tailer.tailer_id and good["tailer"]["peer"].startswith("ipv4:127.0.0.1:")
        assert good["tailer"]["file"] == log_name("ip1") and good["tailer"]["offset"] == size
        assert locs[BAD]["tailer"] is None and locs[BAD]["checkpoint"] is None
        assert "table.size" in locs[BAD]["error"]
        assert rep["tables"] == [{"table": "Market.Trade", "locations": 2, "rows": 9, "tailers": 1, "errors": 1,
                                  "tailer_problems": 0}]
        assert rep["ok"] is False
        assert good["tailer_problem"] is None and locs[BAD]["tailer_problem"] is None
        inst = rep["instances"][0]
        assert inst["dis"] == f"127.0.0.1:{srv.port}" and inst["disk_total_bytes"] >= inst["disk_free_bytes"] > 0
        lines = text.splitlines()
        assert lines[0].startswith(f"DIS 127.0.0.1:{srv.port}  version ") and " free of " in lines[0]
        assert any(line.split() == ["Market.Trade", "2", "9", "1/2", "1"] for line in lines), text
        row = next(line for line in lines if line.startswith("Market.Trade/ip1/2026-11-22"))
        assert f"{log_name('ip1')}@{size}" in row and tailer.tailer_id in row
        row = next(line for line in lines if line.startswith("Market.Trade/bad/2026-11-22"))
        assert "table.size" in row
        # the tailer has gone: no tailer is reported any more
        rep = wait_for(lambda: (lambda r: r if all(loc["tailer"] is None for loc in r["locations"]) else None)(
            json.loads(_status(capsys, srv.port, "--json", exit_status=1))), 10, what="tailer gone")
        assert rep["tables"][0]["tailers"] == 0
    finally:
        srv.stop(0.5)


def test_status_filters(tmp_path):
    srv = start_dis_server(tmp_path / "db", checkpoint_ms=100)
    logs = tmp_path / "logs"
    for ip in ("ip1", "ip2"):
        append_rows(logs / log_name(ip), 0, 3)
    cfg = parse_tailer_config({"dis": f"127.0.0.1:{srv.port}", "log_dirs": [str(logs)], "poll_interval_ms": 50})
    ch = open_channel(f"127.0.0.1:{srv.port}")
    try:
        with Tailer(cfg) as tailer:
            assert tailer.wait_idle(30)
        stub = dis_pb2_grpc.TableDataStub(ch)

        def keys(**req):
            return sorted(loc.key.internal_partition for loc in stub.Status(dis_pb2.StatusRequest(**req)).locations)

        assert keys() == ["ip1", "ip2"]
        assert keys(namespace="Market", table="Trade", internal_partition="ip2", durable_checkpoint=True) == ["ip2"]
        assert keys(table="Quote") == []
    finally:
        ch.close()
        srv.stop(0.5)


def test_unreachable_dis(capsys):
    assert main(["status", "--address", f"127.0.0.1:{free_port()}"]) == 1
    assert "unreachable" in capsys.readouterr().err


def test_exit_status_0_when_every_location_is_ok(tmp_path, capsys):
    srv = start_dis_server(tmp_path / "db", checkpoint_ms=100)
    logs = tmp_path / "logs"
    append_rows(logs / log_name("ip1"), 0, 3)
    cfg = parse_tailer_config({"dis": f"127.0.0.1:{srv.port}", "log_dirs": [str(logs)], "poll_interval_ms": 50})
    try:
        with Tailer(cfg) as tailer:
            assert tailer.wait_idle(30)
        rep = json.loads(_status(capsys, srv.port, "--json"))
        assert rep["ok"] is True and rep["tables"][0]["errors"] == 0
    finally:
        srv.stop(0.5)


def test_an_unusable_routing_file_or_token_file_is_exit_status_2(tmp_path, capsys):
    bad = tmp_path / "routing.yaml"
    bad.write_text("instances: [")
    assert main(["status", "--routing", str(bad)]) == 2
    assert "routing.yaml" in capsys.readouterr().err
    assert main(["status", "--routing", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err
    assert main(["status", "--address", f"127.0.0.1:{free_port()}", "--token-file", str(tmp_path / "no-token")]) == 2
    assert "no-token" in capsys.readouterr().err
