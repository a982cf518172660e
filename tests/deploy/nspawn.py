"""A booted container: ``systemd-nspawn --boot`` of the shared root, systemd as its PID 1.

The root stays as it is (``--volatile=overlay``: every change goes to a tmpfs that is gone when
the machine stops), the machine has a network of its own (``--private-network``: only its
loopback, so its daemons' fixed ports never meet the host's), and nothing is registered with a
systemd on the host (``--register=no --keep-unit``: the development and CI machines run none).
Commands run inside through ``nsenter`` into the namespaces of the machine's PID 1."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import time

#: the PATH of a root shell inside the machine
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Machine:
    def __init__(self, root: pathlib.Path, name: str, log: pathlib.Path,
                 binds_ro: dict[pathlib.Path, str] | None = None) -> None:
        self.root, self.name, self.log = root, name, log
        self.binds_ro = binds_ro or {}
        self.proc: subprocess.Popen | None = None
        self.leader = 0

    def boot(self, timeout: float = 120) -> "Machine":
        """Start the machine and wait until its systemd says the boot is over."""
        cmd = ["systemd-nspawn", "--quiet", "--boot", f"--directory={self.root}", f"--machine={self.name}",
               "--register=no", "--keep-unit", "--private-network", "--volatile=overlay", "--console=passive",
               *(f"--bind-ro={src}:{dst}" for src, dst in self.binds_ro.items())]
        self._out = open(self.log, "ab")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self.leader:
            if self.proc.poll() is not None:
                raise AssertionError(f"systemd-nspawn exited ({self.proc.returncode}):\n{self.log_text()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no PID 1 in the machine within {timeout} s:\n{self.log_text()}")
            self.leader = self._child_of(self.proc.pid)
            time.sleep(0.05)
        state = ""
        while time.monotonic() < deadline:  # `is-system-running --wait` needs the bus: poll instead
            state = self.sh("systemctl is-system-running", check=False).stdout.strip()
            if state in ("running", "degraded"):
                return self
            time.sleep(0.2)
        raise AssertionError(f"the machine's boot did not finish within {timeout} s (state {state!r}):\n"
                             + self.sh("systemctl --failed --no-pager; systemctl list-jobs --no-pager",
                                       check=False).stdout)

    @staticmethod
    def _child_of(pid: int) -> int:
        """The machine's PID 1 among ``pid``'s descendants: the process that is pid 1 in its own
        pid namespace (``NSpid``'s last field).  Not merely nspawn's first child: nspawn forks an
        outer child that forks PID 1 and exits, and a machine entered through that short-lived
        process (seen first on a busy machine) never answers."""
        todo = [pid]
        while todo:
            p = todo.pop()
            try:
                status = pathlib.Path(f"/proc/{p}/status").read_text()
                children = pathlib.Path(f"/proc/{p}/task/{p}/children").read_text().split()
            except OSError:
                continue
            nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
            if p != pid and len(nspid) > 1 and nspid[-1] == "1":
                return p
            todo.extend(int(c) for c in children)
        return 0

    def run(self, argv: list[str], check: bool = True, timeout: float = 300, env: dict[str, str] | None = None,
            cwd: str = "/", **kw) -> subprocess.CompletedProcess:
        """``argv`` inside the machine, as root, with a clean environment."""
        env_args = [f"{k}={v}" for k, v in {"PATH": PATH, "LANG": "C.UTF-8", **(env or {})}.items()]
        cmd = ["nsenter", f"--target={self.leader}", "--mount", "--uts", "--ipc", "--net", "--pid", "--cgroup",
               "--root", "--wd", "--", "/usr/bin/env", "-i", f"--chdir={cwd}", *env_args, *argv]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
        if check and r.returncode != 0:
            raise AssertionError(f"in the machine: {argv} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        return r

    def sh(self, script: str, **kw) -> subprocess.CompletedProcess:
        return self.run(["/bin/sh", "-ec", script], **kw)

    def show(self, unit: str, *props: str) -> dict[str, str]:
        """``systemctl show`` of ``unit``: the properties asked for."""
        out = self.run(["systemctl", "show", unit, *(f"--property={p}" for p in props)]).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def host_command(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        """A program of the host (its files, its Python) in the machine's network only: a client
        outside the machine that reaches the daemons on the machine's loopback."""
        return subprocess.run(["nsenter", f"--target={self.leader}", "--net", "--", *argv],
                              capture_output=True, text=True, **kw)

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def poweroff(self, timeout: float = 90) -> None:
        """Shut the machine down (SIGRTMIN+4 to its systemd: poweroff), killing it if it does not
        end in time.  Nothing stays behind: its mounts lived in its own mount namespace."""
        if self.proc is None:
            return
        if self.proc.poll() is None and self.leader:
            try:
                os.kill(self.leader, signal.SIGRTMIN + 4)
                self.proc.wait(timeout)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:  # PID 1 killed: the kernel ends every process of the machine
                os.kill(self.leader, signal.SIGKILL)
                self.proc.wait(30)
        self._out.close()
        self.proc = None
