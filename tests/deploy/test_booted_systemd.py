"""The units under a real systemd: a Debian root booted by systemd-nspawn, systemd as PID 1, the
project installed from ``make dist``'s wheel by the README's own commands ("systemd on a host",
run as written), the units and sysusers file of config/systemd/ as shipped.

``dis serve``, ``dis-tailer`` and ``dis proxy`` start as the units say and report READY and
STATUS; the watchdog kills and restarts a stopped daemon; ``kill -9`` is restarted; ``systemctl
stop`` drains and checkpoints; ``systemd-analyze security`` rates each unit as the shipped
sandbox does today or better.  An application in the machine logs rows; a reader outside the
machine (this interpreter, in the machine's network namespace) reads them exactly."""

from __future__ import annotations

import json
import os
import re
import sys
import time

import pytest

from support import ROOT, wait_for

from .conftest import BUILD
from .nspawn import Machine

UNITS = ("dis.service", "dis-tailer.service", "dis-proxy.service")
#: `systemd-analyze security` of each unit in the booted machine, as shipped (0 best .. 10 worst):
#: a change to a unit may keep or lower these, never raise them
EXPOSURE = {"dis.service": 1.5, "dis-tailer.service": 1.5, "dis-proxy.service": 1.5}
#: the user each daemon runs as (the proxy's is a DynamicUser=)
USERS = {"dis.service": "dis", "dis-tailer.service": "dis-tailer"}
DIS, PROXY = "127.0.0.1:22021", "127.0.0.1:22051"  # config/systemd/dis.yaml, proxy.yaml
SCRIPTS = ROOT / "tests" / "deploy" / "scripts"


def readme_block(heading: str) -> str:
    """The first ``sh`` block after ``heading`` in README.md: the commands an operator copies."""
    text = (ROOT / "README.md").read_text()
    at = text.index(f"\n{heading}\n")
    m = re.compile(r"```sh\n(.*?)```", re.S).search(text, at)
    assert m, f"no sh block under {heading!r} in README.md"
    return m.group(1)


class Host:
    """The booted machine and the rows its application has logged so far."""

    def __init__(self, machine: Machine) -> None:
        self.m = machine
        self.logged = 0

    def log_rows(self, n: int) -> None:
        """The application (user ``app``, a member of dis-logs) logs the next ``n`` rows."""
        self.m.run(["runuser", "-u", "app", "--", "/opt/dis/.venv/bin/python", "/src/scripts/log_rows.py",
                    "/var/log/dis-binlogs", str(self.logged), str(n)], timeout=120)
        self.logged += n

    def read(self, address: str = DIS) -> dict:
        r = self.m.host_command([sys.executable, str(SCRIPTS / "read_rows.py"), address], timeout=60)
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    def expect_exactly_logged(self, address: str = DIS, timeout: float = 60) -> None:
        """Every logged row, once: rows 0 .. logged-1 (Size = row number)."""
        n = self.logged
        want = {"rows": n, "sum": n * (n - 1) // 2, "distinct": n, "min": 0, "max": n - 1}
        wait_for(lambda: self.read(address) == want, timeout, 0.5, f"the {n} logged rows, exactly, at {address}")

    def main_pid(self, unit: str) -> int:
        return int(self.m.show(unit, "MainPID")["MainPID"])

    def journal(self, unit: str) -> str:
        return self.m.run(["journalctl", "--no-pager", "-o", "cat", "-u", unit]).stdout

    def wait_restarted(self, unit: str, old_pid: int, timeout: float) -> dict[str, str]:
        def restarted():
            p = self.m.show(unit, "MainPID", "ActiveState", "SubState", "NRestarts")
            return p if p["ActiveState"] == "active" and p["SubState"] == "running" and \
                int(p["MainPID"]) not in (0, old_pid) else None
        return wait_for(restarted, timeout, 0.25, f"{unit} running again under a new main process")


#: why the machine did not boot, once it did not: pytest sets a module's fixture up again for each
#: test after it failed, and each boot waits up to its timeout
_NOT_BOOTED: list[str] = []


@pytest.fixture(scope="module")
def host(rootfs, wheelhouse):
    if _NOT_BOOTED:
        pytest.fail(f"the machine did not boot (the module's first test says why): {_NOT_BOOTED[0][:300]}")
    m = Machine(rootfs, f"dis-test-{os.getpid()}", BUILD / "nspawn-console.log",
                binds_ro={ROOT / "config": "/src/config", wheelhouse: "/src/dist", SCRIPTS: "/src/scripts"})
    try:
        try:
            m.boot()
        except AssertionError as e:
            _NOT_BOOTED.append(str(e))
            raise
        # The README's commands as written, on a host without an index (the machine has no network):
        # pip takes the wheel and its dependencies from dist/ (the wheelhouse), as the README says.
        r = m.run(["/bin/sh", "-exc", readme_block("### systemd on a host")], cwd="/src", timeout=600,
                  env={"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "/src/dist", "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
                  check=False)
        assert r.returncode == 0, f"the README's install failed:\n{r.stderr[-4000:]}"
        m.run(["useradd", "--system", "--groups", "dis-logs", "--no-create-home", "app"])  # an application
        yield Host(m)
    finally:
        m.poweroff()


def test_the_daemons_start_ready_with_status_as_their_users(host):
    for unit in UNITS:
        def started():
            p = host.m.show(unit, "ActiveState", "SubState", "Type", "StatusText", "MainPID", "WatchdogUSec")
            return p if p["ActiveState"] == "active" and p["StatusText"] else None
        p = wait_for(started, 60, 0.25, f"{unit} active with a STATUS=")
        # Type=notify: systemd reports a unit active only once its daemon sent READY=1
        assert p["Type"] == "notify" and p["SubState"] == "running", p
        assert p["WatchdogUSec"] == "30s", p
        assert host.m.run(["systemctl", "is-active", unit]).stdout.strip() == "active"
        want = "tailing /var/log/dis-binlogs" if unit == "dis-tailer.service" else "serving on 127.0.0.1:"
        assert p["StatusText"].startswith(want), p  # the daemon's own STATUS= line
        uid = int(host.m.run(["stat", "-c", "%u", f"/proc/{p['MainPID']}"]).stdout)
        if unit == "dis-proxy.service":  # DynamicUser=: a UID systemd allocates while the unit runs
            assert 61184 <= uid <= 65519, uid
        else:  # the dedicated user of the sysusers file
            assert uid == int(host.m.run(["id", "-u", USERS[unit]]).stdout), (unit, uid)
    assert host.m.run(["systemctl", "is-enabled", *UNITS]).stdout.split() == ["enabled"] * 3


def test_rows_logged_in_the_machine_are_read_outside_exactly(host):
    host.log_rows(20_000)
    host.expect_exactly_logged()
    host.expect_exactly_logged(PROXY)  # and through the proxy, whose upstream is the DIS


def test_systemd_analyze_security_keeps_each_unit_at_its_level(host):
    for unit in UNITS:
        out = host.m.run(["systemd-analyze", "security", "--no-pager", unit]).stdout
        m = re.search(rf"Overall exposure level for {re.escape(unit)}: ([0-9.]+)", out)
        assert m, out[-2000:]
        assert float(m.group(1)) <= EXPOSURE[unit], f"{unit}: {m.group(1)} > {EXPOSURE[unit]}\n{out}"


def test_kill_9_is_restarted(host):
    for unit in UNITS:
        old = host.main_pid(unit)
        restarts = int(host.m.show(unit, "NRestarts")["NRestarts"])
        host.m.sh(f"kill -9 {old}")  # the shell's kill: the machine has no procps
        p = host.wait_restarted(unit, old, 30)
        assert int(p["NRestarts"]) == restarts + 1, p
    assert "code=killed, status=9/KILL" in host.journal("dis.service")
    host.log_rows(5_000)
    host.expect_exactly_logged()  # recovered from the checkpoint, the rest resent by the tailer


def test_the_watchdog_kills_and_restarts_a_stopped_daemon(host):
    """SIGSTOP: the process lives but its main loop pings no more; after WatchdogSec (30 s, as
    shipped) systemd kills it (Result=watchdog) and, as the unit says, starts it again."""
    old = {unit: host.main_pid(unit) for unit in UNITS}
    host.m.sh("kill -STOP " + " ".join(map(str, old.values())))  # PIDs of the machine's PID namespace
    t0 = time.monotonic()
    for unit in UNITS:
        host.wait_restarted(unit, old[unit], 75)
        journal = host.journal(unit)
        assert "Watchdog timeout" in journal and "Failed with result 'watchdog'" in journal, journal[-2000:]
    assert time.monotonic() - t0 >= 25  # not before WatchdogSec
    host.log_rows(5_000)
    host.expect_exactly_logged()


def test_systemctl_stop_drains_and_checkpoints(host):
    """Rows logged before ``systemctl stop dis`` are all there after ``systemctl start dis`` with
    no tailer running: they come from the checkpoint the stop wrote, not from a resend."""
    host.log_rows(10_000)
    host.expect_exactly_logged()
    host.m.run(["systemctl", "stop", "dis-tailer"])
    t0 = time.monotonic()
    host.m.run(["systemctl", "stop", "dis"], timeout=150)
    stopped_in = time.monotonic() - t0
    p = host.m.show("dis.service", "ActiveState", "Result", "ExecMainCode", "ExecMainStatus")
    assert p["ActiveState"] == "inactive" and p["Result"] == "success" and p["ExecMainStatus"] == "0", p
    assert stopped_in < 60, stopped_in  # a drain, not TimeoutStopSec and a SIGKILL
    assert '"dis stopped"' in host.journal("dis.service")
    host.m.run(["systemctl", "start", "dis"], timeout=150)
    host.expect_exactly_logged(timeout=30)
    host.m.run(["systemctl", "start", "dis-tailer"])
    host.log_rows(1_000)
    host.expect_exactly_logged()
