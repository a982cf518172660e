"""The tailer's own Prometheus endpoint (``metrics_port``): files watched and skipped by reason,
per location the bytes the DIS has not acknowledged, acknowledged bytes, corrupt frames, refusals;
each tailer in a process serves its own registry; a port in use is a clear error."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import grpc
import pytest

from disd.binlog import BinlogWriter
from disd.tailer import Tailer
from disd.tailer.metrics import SERIES
from support import TRADE, by_label, scrape, wait_for

from .fakedis import FakeDis
from .helpers import config, name, write

GARBAGE = b"\xde\xad\xbe\xef" * 25
BIN = os.path.join(os.path.dirname(sys.executable), "dis-tailer")


def loc(ip: str) -> str:
    return f"Market/Trade/{ip}/2026-11-22"


def test_the_endpoint_serves_every_series_with_its_values(tmp_path):
    dis = FakeDis(refuse={"ref": (grpc.StatusCode.FAILED_PRECONDITION, "schema mismatch")}).start()
    try:
        ok = write(tmp_path / name(), 5)
        with BinlogWriter(tmp_path / name(hour=10), TRADE):
            pass  # a newer file with a header and no frame yet: nothing to send, nothing behind
        ref_end = write(tmp_path / name(ip="ref"), 4)
        bad_end = write(tmp_path / name(ip="bad"), 3)
        with open(tmp_path / name(ip="bad"), "ab") as f:
            f.write(GARBAGE)
        write(tmp_path / name(hour=11).replace("System", "Sytem"), 1)
        write(tmp_path / (name(hour=12) + ".bak"), 1)
        (tmp_path / "notes.txt").write_text("x")
        with Tailer(config(dis.address, tmp_path, metrics_port=0)) as t:
            assert t.metrics_port

            def settled():
                s = scrape(t.metrics_port)
                done = (by_label(s, "dis_tailer_acked_bytes_total").get(loc("ip1")) == ok
                        and by_label(s, "dis_tailer_corrupt_frames_total").get(loc("bad")) == 1
                        and by_label(s, "dis_tailer_refusals_total").get(loc("ref"), 0) >= 1)
                return s if done else None

            s = wait_for(settled, 20, what="every location settled")
        for series in SERIES:
            assert series in s, series
        assert by_label(s, "dis_tailer_files_watched", "kind") == {"binlog": 4, "csv": 0}
        assert by_label(s, "dis_tailer_files_skipped", "reason") == {"namespace_kind": 1, "suffix": 1, "fields": 1}
        assert [x.value for x in s["dis_tailer_locations"]] == [3]
        header = (tmp_path / name(hour=10)).stat().st_size
        assert by_label(s, "dis_tailer_bytes_behind") == {loc("ip1"): 0, loc("bad"): len(GARBAGE),
                                                    loc("ref"): ref_end - header}
        assert by_label(s, "dis_tailer_acked_bytes_total") == {loc("ip1"): ok, loc("bad"): bad_end, loc("ref"): 0}
        assert by_label(s, "dis_tailer_corrupt_frames_total") == {loc("ip1"): 0, loc("bad"): 1, loc("ref"): 0}
        assert {x.labels["code"] for x in s["dis_tailer_refusals_total"]} == {"FAILED_PRECONDITION"}
        assert by_label(s, "dis_tailer_reconnects_total") == {loc("ip1"): 0, loc("bad"): 0, loc("ref"): 0}
        assert {x.labels["table"] for x in s["dis_tailer_bytes_behind"]} == {"Market.Trade"}
        assert "process_cpu_seconds_total" in s
    finally:
        dis.stop()


def test_two_tailers_in_one_process_serve_their_own_series(tmp_path):
    dis = FakeDis().start()
    try:
        (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
        write(tmp_path / "a" / name(ip="ipA"), 2)
        write(tmp_path / "b" / name(ip="ipB"), 3)
        with Tailer(config(dis.address, tmp_path / "a", metrics_port=0)) as a, \
                Tailer(config(dis.address, tmp_path / "b", metrics_port=0)) as b:
            assert a.wait_idle(20) and b.wait_idle(20)
            sa, sb = scrape(a.metrics_port), scrape(b.metrics_port)
        assert set(by_label(sa, "dis_tailer_bytes_behind")) == {loc("ipA")}
        assert set(by_label(sb, "dis_tailer_bytes_behind")) == {loc("ipB")}
        with pytest.raises(OSError):  # stopped: the endpoint is gone
            scrape(a.metrics_port)
    finally:
        dis.stop()


def test_a_metrics_port_in_use_is_a_clear_error(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            Tailer(config("127.0.0.1:1", tmp_path, metrics_port=port)).start()
        cfg = tmp_path / "tailer.yaml"
        cfg.write_text(f"dis: 127.0.0.1:1\nlog_dirs: [{tmp_path}]\nmetrics_port: {port}\n")
        r = subprocess.run([BIN, "--config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert f"dis-tailer: cannot serve metrics on 127.0.0.1:{port}" in r.stderr
