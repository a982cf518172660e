"""The operator commands against a real DIS: dis demo, ls, status, verify, serve's shutdown."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

from support import BIN, ROOT, free_port, free_port_pair, start_dis_process, wait_for, write_dis_config

pytestmark = pytest.mark.slow


def run(*args, timeout=120):
    return subprocess.run([str(BIN / "dis"), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_demo_runs_the_live_pipeline(tmp_path):
    r = run("demo", "--workdir", str(tmp_path / "demo"), "--rows", "2000")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "equal to what was logged: True" in r.stdout


def test_ls_status_verify_and_clean_shutdown(tmp_path):
    from disd.logger import IntradayLoggerBuilder

    port = free_port_pair()
    cfg = write_dis_config(tmp_path, port)
    dis = start_dis_process(tmp_path, cfg)
    try:
        # feed it through the ingest service directly, as a tailer would
        from disd.tailer import Tailer, parse_tailer_config

        logs = tmp_path / "logs"
        log = (IntradayLoggerBuilder(str(ROOT / "config/schemas/Market.Trade.yaml")).set_log_dir(logs)
               .set_internal_partition("ip1").set_column_partition_value("2026-11-22").build())
        log.log_batch({"Sym": ["A", "B", "C"], "Size": [1, 2, 3]})
        log.close()
        t = Tailer(parse_tailer_config({"dis": f"127.0.0.1:{port}", "log_dirs": [str(logs)]})).start()
        try:
            assert t.wait_idle(30)
        finally:
            t.stop()
        addr = ["--address", f"127.0.0.1:{port}"]
        r = wait_for(lambda: (lambda r: r if '"rows": 3' in r.stdout else None)(run("ls", *addr, "--json")), 10)
        data = json.loads(r.stdout)
        assert [(loc["internal_partition"], loc["rows"], loc["schema_version"]) for loc in data["locations"]] == [
            ("ip1", 3, 1)]
        r = run("ls", *addr)
        assert "Market.Trade" in r.stdout and "ip1/2026-11-22  rows=3" in r.stdout and "version=1" in r.stdout
        r = run("status", *addr, "--json")
        st = json.loads(r.stdout)
        assert st["locations"][0]["rows"] == 3 and st["locations"][0]["error"] is None
        assert st["locations"][0]["schema_version"] == 1
        r = run("status", *addr)
        assert "Market.Trade/ip1/2026-11-22" in r.stdout
        assert any(line.split()[:3] == ["LOCATION", "VERSION", "ROWS"] for line in r.stdout.splitlines()), r.stdout
    finally:
        assert dis.terminate() == 0, dis.log_text()[-2000:]
    assert '"event": "dis stopped"' in dis.log_text()
    # SIGTERM checkpointed everything: the offline verifier agrees
    r = run("verify", "--db-root", str(tmp_path / "db"), "--schemas", str(ROOT / "config/schemas"), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["bad_count"] == 0 and rep["locations"][0]["rows"] == 3
    # damage a column file: verify reports it and exits non-zero
    size_dat = next((tmp_path / "db").rglob("Size.dat"))
    size_dat.write_bytes(b"\0")
    r = run("verify", "--db-root", str(tmp_path / "db"), "--schemas", str(ROOT / "config/schemas"))
    assert r.returncode == 1 and "Size.dat" in r.stdout and "BAD" in r.stdout


def test_unreachable_dis_is_a_clear_error():
    r = run("ls", "--address", f"127.0.0.1:{free_port()}")
    assert r.returncode == 1 and "unreachable" in r.stderr and "Traceback" not in r.stderr


def test_bad_config_names_the_key(tmp_path):
    p = tmp_path / "dis.yaml"
    p.write_text("server: {port: http}\n")
    r = run("serve", "--config", str(p))
    assert r.returncode == 2 and "server.port" in r.stderr


def test_verify_takes_what_it_needs_from_the_config_and_refuses_what_is_missing(tmp_path):
    cfg = write_dis_config(tmp_path, free_port())
    elsewhere = tmp_path / "elsewhere"  # outside the repository: no config/ relative to the cwd
    elsewhere.mkdir()

    def verify(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "dis"), "verify", *args], capture_output=True, text=True, cwd=elsewhere,
                              timeout=60)

    missing = verify("--db-root", str(tmp_path / "nonexistent"), "--schemas", str(ROOT / "config/schemas"))
    assert missing.returncode == 2 and "nonexistent does not exist" in missing.stderr
    r = verify("--db-root", str(tmp_path))
    assert r.returncode == 2 and "--schemas" in r.stderr and "--config" in r.stderr
    for r in (missing, r):
        assert "Traceback" not in r.stderr
    bad_cfg = tmp_path / "bad.yaml"
    bad_cfg.write_text("storage: {max_open_files: many}\n")
    r = verify("--config", str(bad_cfg))
    assert r.returncode == 2 and "storage.max_open_files" in r.stderr and "Traceback" not in r.stderr

    dis = start_dis_process(tmp_path, cfg)
    try:
        from disd.logger import IntradayLoggerBuilder
        from disd.tailer import Tailer, parse_tailer_config

        logs = tmp_path / "logs"
        log = (IntradayLoggerBuilder(str(ROOT / "config/schemas/Market.Trade.yaml")).set_log_dir(logs)
               .set_internal_partition("ip1").set_column_partition_value("2026-11-22").build())
        log.log_batch({"Sym": ["AAA", "BB", "C", "DDDD"], "Size": [1, 2, 3, 4]})
        log.close()
        port = yaml.safe_load(cfg.read_text())["server"]["port"]
        with Tailer(parse_tailer_config({"dis": f"127.0.0.1:{port}", "log_dirs": [str(logs)]})) as t:
            assert t.wait_idle(30)
    finally:
        assert dis.terminate() == 0
    r = verify("--config", str(cfg), "--json")  # db_root and schemas from the DIS's own config
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["ok_count"] == 1
    # a string offset pointing past its data file (bytes damaged in place)
    off = next((tmp_path / "db").rglob("Sym.off"))
    raw = bytearray(off.read_bytes())
    raw[8:16] = (10**6).to_bytes(8, "little")
    off.write_bytes(bytes(raw))
    r = verify("--config", str(cfg))
    assert r.returncode == 1 and "offset of row 1" in r.stdout and "points past Sym.dat" in r.stdout


def test_demo_needs_nothing_but_the_project(tmp_path):
    """``make run`` installs the project without its extras: the demo must not need pandas."""
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "pandas.py").write_text("raise ImportError('pandas is not installed (make run)')\n")
    env = dict(os.environ, PYTHONPATH=str(blocker))
    r = subprocess.run([str(BIN / "dis"), "demo", "--workdir", str(tmp_path / "demo"), "--rows", "2000"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "equal to what was logged: True" in r.stdout and "Traceback" not in r.stderr
