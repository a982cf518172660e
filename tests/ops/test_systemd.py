"""The systemd units: `systemd-analyze verify` and `security`, and their agreement with the
configuration files they start the daemons with (paths they may write, descriptor limits)."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess

import pytest

from disd.config import load_dis_config
from disd.storage.filehandles import max_open_files_for
from disd.tailer.config import load_tailer_config
from support import ROOT

SYSTEMD = ROOT / "config" / "systemd"
UNITS = ("dis.service", "dis-tailer.service")
#: systemd-analyze security's exposure scale is 0 (locked down) .. 10 (unprotected); < 2 is "OK"
MAX_EXPOSURE = 2.0


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed (.ci/run installs it)")
        pytest.skip(f"{name} is not installed")
    return path


def parse_unit(path: pathlib.Path) -> dict[str, list[str]]:
    """``Section.Key`` -> every value given, in order (keys such as ReadWritePaths repeat)."""
    out: dict[str, list[str]] = {}
    section = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return out


def _one(unit: dict, key: str) -> str:
    values = unit.get(f"Service.{key}")
    assert values, f"{key}= missing"
    return values[-1]


def _fake_root(tmp_path: pathlib.Path) -> pathlib.Path:
    """A file-system root holding the units and (stand-ins for) the programs they start, so
    `verify` checks the units themselves rather than this machine's /opt."""
    root = tmp_path / "root"
    (root / "etc/systemd/system").mkdir(parents=True)
    for u in UNITS:
        shutil.copy(SYSTEMD / u, root / "etc/systemd/system" / u)
        exe = parse_unit(SYSTEMD / u)["Service.ExecStart"][0].split()[0]
        p = root / exe.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("#!/bin/sh\n")
        p.chmod(0o755)
    return root


def test_systemd_analyze_verify(tmp_path):
    tool = _tool("systemd-analyze")
    root = _fake_root(tmp_path)
    r = subprocess.run([tool, "verify", f"--root={root}", "--man=no", "--recursive-errors=no",
                        *(f"/etc/systemd/system/{u}" for u in UNITS)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r.stdout + r.stderr


def test_verify_catches_a_broken_unit(tmp_path):
    """The check above can fail: a misspelt key is reported."""
    tool = _tool("systemd-analyze")
    root = _fake_root(tmp_path)
    unit = root / "etc/systemd/system/dis.service"
    unit.write_text(unit.read_text().replace("WatchdogSec=", "WatchdogSecs="))
    r = subprocess.run([tool, "verify", f"--root={root}", "--man=no", "--recursive-errors=no",
                        "/etc/systemd/system/dis.service"], capture_output=True, text=True, timeout=60)
    assert "Unknown key 'WatchdogSecs'" in r.stderr


@pytest.mark.parametrize("unit", UNITS)
def test_sandbox_exposure(tmp_path, unit):
    tool = _tool("systemd-analyze")
    root = _fake_root(tmp_path)
    r = subprocess.run([tool, "security", "--offline=true", f"--root={root}", "--no-pager", unit],
                       capture_output=True, text=True, timeout=60)
    m = re.search(rf"Overall exposure level for {re.escape(unit)}: ([0-9.]+)", r.stdout + r.stderr)
    assert m, r.stdout + r.stderr
    assert float(m.group(1)) < MAX_EXPOSURE, r.stdout


@pytest.mark.parametrize("unit", UNITS)
def test_units_are_notify_watchdog_restart_sandboxed(unit):
    u = parse_unit(SYSTEMD / unit)
    assert _one(u, "Type") == "notify" and _one(u, "NotifyAccess") == "main"
    assert int(_one(u, "WatchdogSec")) > 0
    assert _one(u, "Restart") in ("on-failure", "always")
    assert int(_one(u, "LimitNOFILE")) > 0
    assert _one(u, "ProtectSystem") == "strict" and _one(u, "NoNewPrivileges") == "yes"
    assert _one(u, "User") not in ("", "root") and _one(u, "CapabilityBoundingSet") == ""
    users = {line.split()[1] for line in (SYSTEMD / "dis.sysusers.conf").read_text().splitlines()
             if line.startswith("u ")}
    assert _one(u, "User") in users  # a dedicated user that the sysusers file creates


def _writable(unit: dict) -> list[pathlib.PurePath]:
    return [pathlib.PurePath(p) for v in unit["Service.ReadWritePaths"] for p in v.split()]


def _under(path: str, roots: list[pathlib.PurePath]) -> bool:
    p = pathlib.PurePath(path)
    return any(p == r or r in p.parents for r in roots)


def test_dis_unit_agrees_with_its_config():
    u = parse_unit(SYSTEMD / "dis.service")
    argv = _one(u, "ExecStart").split()
    assert argv[1:3] == ["serve", "--config"]
    assert argv[3] == "/etc/dis/dis.yaml"
    cfg = load_dis_config(SYSTEMD / "dis.yaml")  # the sample installed there validates
    assert _under(cfg.db_root, _writable(u)), (cfg.db_root, _writable(u))
    assert f"/var/lib/{_one(u, 'StateDirectory')}" in map(str, _writable(u))
    # every column-file descriptor the cache may hold, a socket per worker (and per block-endpoint
    # connection), and a margin; max_open_files left out is derived from the limit to keep this
    nofile = int(_one(u, "LimitNOFILE"))
    max_open = cfg.storage.max_open_files or max_open_files_for(nofile, cfg.max_workers)
    assert nofile >= max_open + 2 * cfg.max_workers + 256
    assert cfg.storage.max_open_files is None, "the shipped config leaves max_open_files to the descriptor limit"
    assert max_open_files_for(nofile, cfg.max_workers) == 3328  # what config/systemd/dis.yaml says
    assert cfg.metrics_port == 9464  # what config/prometheus/prometheus.yml scrapes


def test_tailer_unit_agrees_with_its_config():
    u = parse_unit(SYSTEMD / "dis-tailer.service")
    argv = _one(u, "ExecStart").split()
    assert argv[1:3] == ["--config", "/etc/dis/tailer.yaml"]
    cfg = load_tailer_config(SYSTEMD / "tailer.yaml")
    for d in [*cfg.log_dirs, cfg.state_dir]:  # retention deletes in the log directories
        assert _under(d, _writable(u)), (d, _writable(u))


def test_sysusers_file_is_valid(tmp_path):
    tool = _tool("systemd-sysusers")
    (tmp_path / "etc").mkdir()
    for f in ("passwd", "group"):
        (tmp_path / "etc" / f).write_text("")
    r = subprocess.run([tool, f"--root={tmp_path}", "--dry-run", str(SYSTEMD / "dis.sysusers.conf")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    assert "Creating user 'dis'" in out and "Creating user 'dis-tailer'" in out and "group 'dis-logs'" in out
