"""``dis-tailer``: configuration errors, JSON logs, systemd notify, clean stop on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import yaml

from support import wait_for

from .fakedis import FakeDis
from .helpers import name, write

BIN = os.path.join(os.path.dirname(sys.executable), "dis-tailer")


def test_config_error_exits_2_naming_the_key(tmp_path):
    cfg = tmp_path / "tailer.yaml"
    cfg.write_text("dis: 127.0.0.1:1\nlog_dirs: [x]\nchunk_byte: 5\n")
    r = subprocess.run([BIN, "--config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert f"{cfg}: chunk_byte: unknown key" in r.stderr


def test_runs_notifies_systemd_and_stops_cleanly_on_sigterm(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    write(logs / name(), 5)
    dis = FakeDis().start()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    addr = f"@dis-tailer-test-{os.getpid()}"
    sock.bind("\0" + addr[1:])
    sock.settimeout(30)
    cfg = tmp_path / "tailer.yaml"
    cfg.write_text(yaml.safe_dump({"dis": dis.address, "log_dirs": [str(logs)], "poll_interval_ms": 50}))
    env = dict(os.environ, NOTIFY_SOCKET=addr)
    proc = subprocess.Popen([BIN, "--config", str(cfg)], stderr=subprocess.PIPE, env=env, text=True)
    try:
        msg = sock.recv(4096).decode()
        assert "READY=1" in msg.splitlines()
        wait_for(lambda: dis.log_of("ip1").offset == (logs / name()).stat().st_size, 30, what="streamed")
        proc.send_signal(signal.SIGTERM)
        assert "STOPPING=1" in sock.recv(4096).decode().splitlines()
        assert proc.wait(30) == 0
        lines = [json.loads(line) for line in proc.stderr.read().splitlines() if line.startswith("{")]
        events = [e["event"] for e in lines]
        assert "tailer started" in events and "ingest stream open" in events and events[-1] == "tailer stopped"
    finally:
        if proc.poll() is None:
            proc.kill()
        sock.close()
        dis.stop()


def test_the_watchdog_is_pinged_only_while_the_event_loop_answers(tmp_path):
    """``dis-tailer`` sends WATCHDOG=1 only when its event loop, where every location lives, runs
    a call within the watchdog interval (``Tailer.responsive``): a loop stuck in a call is a hung
    tailer, which systemd must restart, even though the main thread that pings is fine."""
    import time

    from disd.tailer import Tailer, parse_tailer_config

    t = Tailer(parse_tailer_config({"dis": "127.0.0.1:1", "log_dirs": [str(tmp_path)]}))
    assert not t.responsive(0.1)  # no loop before the start
    with t:
        assert t.responsive(5)
        t.loop.call_soon(time.sleep, 1.5)  # a call that blocks the loop
        assert not t.responsive(0.3)
        wait_for(lambda: t.responsive(0.5), 10, 0.1, "the loop answering again")
    assert not t.responsive(0.1)  # stopped
