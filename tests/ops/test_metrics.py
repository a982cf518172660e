"""The Prometheus endpoint of real DIS servers: per-server series, several servers in one process."""

from __future__ import annotations

import socket

import pytest

from disd.binlog import LocationKey
from disd.server.daemon import DisServer
from disd.server.metrics import SERVER_SERIES
from disd.tailer import Tailer, parse_tailer_config
from support import append_rows, by_label, dis_config, log_name, running_dis, scrape, start_dis_server, wait_for


def _feed(srv: DisServer, logs, ip: str, rows: int) -> None:
    append_rows(logs / log_name(ip), 0, rows, frames=3)
    cfg = parse_tailer_config({"dis": f"127.0.0.1:{srv.port}", "log_dirs": [str(logs)], "poll_interval_ms": 50})
    with Tailer(cfg) as t:
        assert t.wait_idle(30)
    key = LocationKey("Market", "Trade", ip, "2026-11-22")
    wait_for(lambda: srv.engine.location(key, create=False).published_rows == rows, 10, what="rows published")


def test_two_servers_in_one_process_each_serve_their_own_series(tmp_path):
    # the second used to fail to start: both registered the same gauges in the default registry
    with running_dis(tmp_path / "a" / "db") as a, running_dis(tmp_path / "b" / "db") as b:
        _feed(a, tmp_path / "logs-a", "ipA", 7)
        _feed(b, tmp_path / "logs-b", "ipB", 5)
        sa, sb = scrape(a.metrics_port), scrape(b.metrics_port)
    assert by_label(sa, "dis_location_rows") == {"Market/Trade/ipA/2026-11-22": 7}
    assert by_label(sb, "dis_location_rows") == {"Market/Trade/ipB/2026-11-22": 5}
    for s in (sa, sb):
        for name in SERVER_SERIES:
            assert name in s, name
        # process-wide counters are served by both endpoints
        assert "dis_rows_ingested_total" in s and "process_cpu_seconds_total" in s
        # the tailers have gone: the location reports no tailer, the server none connected
        assert [x.value for x in s["dis_location_tailer_connected"]] == [0.0]
        assert [x.value for x in s["dis_connected_tailers"]] == [0.0]
        assert [x.value for x in s["dis_location_in_error"]] == [0.0]
        assert s["dis_db_disk_total_bytes"][0].value >= s["dis_db_disk_free_bytes"][0].value > 0
    # stopped servers leave nothing behind: a third one in the same process starts and serves
    with running_dis(tmp_path / "a" / "db") as c:
        sc = scrape(c.metrics_port)
        assert by_label(sc, "dis_location_rows") == {"Market/Trade/ipA/2026-11-22": 7}
        assert by_label(sc, "dis_location_checkpointed_rows") == {"Market/Trade/ipA/2026-11-22": 7}


def test_state_gauges_are_per_server(tmp_path):
    """dis_locations, dis_partitions_in_error, dis_open_file_handles, dis_block_cache_bytes and
    dis_subscribers describe one server: two in one process each report their own."""
    with running_dis(tmp_path / "a" / "db") as a, running_dis(tmp_path / "b" / "db") as b:
        _feed(a, tmp_path / "logs-a1", "ipA1", 7)
        _feed(a, tmp_path / "logs-a2", "ipA2", 3)
        _feed(b, tmp_path / "logs-b", "ipB", 5)
        sa, sb = scrape(a.metrics_port), scrape(b.metrics_port)
        handles_a, handles_b = a.engine.file_handles.open_count, b.engine.file_handles.open_count
    assert (sa["dis_locations"][0].value, sb["dis_locations"][0].value) == (2, 1)
    assert (sa["dis_open_file_handles"][0].value, sb["dis_open_file_handles"][0].value) == (handles_a, handles_b)
    assert handles_a > handles_b > 0
    for s in (sa, sb):
        assert s["dis_partitions_in_error"][0].value == 0 and s["dis_subscribers"][0].value == 0
        assert s["dis_block_cache_bytes"][0].value == 0


def test_connected_tailer_is_reported_per_location(tmp_path):
    srv = start_dis_server(tmp_path / "db")
    logs = tmp_path / "logs"
    append_rows(logs / log_name("ip1"), 0, 4)
    append_rows(logs / log_name("ip2"), 0, 6)
    cfg = parse_tailer_config({"dis": f"127.0.0.1:{srv.port}", "log_dirs": [str(logs)], "poll_interval_ms": 50})
    try:
        with Tailer(cfg) as t:
            assert t.wait_idle(30)
            # acknowledged rows are published by the next flush (20 ms)
            s = wait_for(lambda: (lambda s: s if sorted(by_label(s, "dis_location_rows").values()) == [4, 6]
                                  else None)(scrape(srv.metrics_port)), 10, what="rows published")
            assert by_label(s, "dis_location_tailer_connected") == {
                "Market/Trade/ip1/2026-11-22": 1.0, "Market/Trade/ip2/2026-11-22": 1.0}
            assert [x.value for x in s["dis_connected_tailers"]] == [2.0]
            ages = by_label(s, "dis_flush_age_seconds")
            assert set(ages) == {"Market/Trade/ip1/2026-11-22", "Market/Trade/ip2/2026-11-22"}
            assert all(0 <= v < 5 for v in ages.values())
        wait_for(lambda: set(by_label(scrape(srv.metrics_port), "dis_location_tailer_connected").values())
                 == {0.0}, 10, what="tailers gone")
    finally:
        srv.stop(0.5)


def test_metrics_port_in_use_is_a_clear_error_and_leaves_nothing_running(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        srv = DisServer(dis_config(tmp_path / "db", metrics_port=taken.getsockname()[1]))
        with pytest.raises(OSError, match="cannot serve metrics on 127.0.0.1"):
            srv.start()
        assert srv.server is None and srv.engine is None  # stopped: the gRPC port is free again
    finally:
        taken.close()
