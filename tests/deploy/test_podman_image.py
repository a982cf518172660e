"""docker/Dockerfile, built by podman and run: both targets, from a base imported from the shared
Debian root (the Dockerfile's default base's Python, 3.11; no registry is reachable).

The runtime image runs as docker/compose.yaml lays it out (the services ``dis`` and ``tailer``
on a network of their own, where the tailer finds the DIS by its service name; the database, the
logs and the tailer's state on named volumes): ``dis health`` and the image's HEALTHCHECK say
SERVING, rows an application container logs reach the DIS through the tailer container, survive
a ``kill -9`` and a start on the volume, and SIGTERM stops the DIS cleanly.  The spark image
reads the live table with ``format("dis")`` through the JVM reader."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest
import yaml

from support import ROOT, wait_for

from .rootfs import PYTHON, SUITE

SCRIPTS = ROOT / "tests" / "deploy" / "scripts"
COMPOSE = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())


class Project:
    """The compose project's services as podman containers (prefixed by the project's name, so
    runs side by side never meet), and what its application has logged."""

    def __init__(self, podman, name: str) -> None:
        self.podman, self.name = podman, name
        self.network = name
        self.logged = 0
        self.started: list[str] = []

    def volume(self, short: str) -> str:
        return f"{self.name}_{short}"

    def container(self, service: str) -> str:
        return f"{self.name}-{service}"

    def up(self, service: str) -> str:
        """``podman run`` of a compose service: its image, entrypoint, command, named volumes,
        ulimits, stop signal and restart policy, on the project's network under its name."""
        svc = COMPOSE["services"][service]
        args = ["run", "--detach", "--name", self.container(service), "--network", self.network,
                "--network-alias", service]
        for v in svc.get("volumes", []):
            src, dst = v.split(":")[:2]
            assert not src.startswith((".", "/")), f"{service}: only named volumes are run here ({v})"
            args += ["--volume", f"{self.volume(src)}:{dst}"]
        limits = {kind: f"{limit['soft']}:{limit['hard']}" for kind, limit in (svc.get("ulimits") or {}).items()}
        for kind, value in self.podman.ulimits.items():  # one --ulimit drops podman's defaults of the others
            limits.setdefault(kind, f"{value}:{value}")
        args += [f"--ulimit={kind}={value}" for kind, value in limits.items()]
        if "stop_signal" in svc:
            args += ["--stop-signal", svc["stop_signal"]]
        if "restart" in svc:
            args += ["--restart", svc["restart"]]
        if "entrypoint" in svc:
            args += ["--entrypoint", json.dumps(svc["entrypoint"])]
        self.podman(*args, f"localhost/{svc['image']}", *svc.get("command", []))
        self.started.append(self.container(service))
        return self.container(service)

    def log_rows(self, image: str, n: int) -> None:
        """An application container (the runtime image, its user) logs the next ``n`` rows into
        the logs volume the tailer reads."""
        self.podman("run", "--rm", "--network", "none", "--volume", f"{self.volume('binlogs')}:/var/log/dis-binlogs",
                    "--volume", f"{SCRIPTS}:/scripts:ro", "--entrypoint", "python", image,
                    "/scripts/log_rows.py", "/var/log/dis-binlogs", str(self.logged), str(n), timeout=120)
        self.logged += n

    def read(self, image: str) -> dict:
        r = self.podman("run", "--rm", "--network", self.network, "--volume", f"{SCRIPTS}:/scripts:ro",
                        "--entrypoint", "python", image, "/scripts/read_rows.py", "dis:22021", timeout=120)
        return json.loads(r.stdout.strip().splitlines()[-1])

    def expect_exactly_logged(self, image: str, timeout: float = 90) -> None:
        n = self.logged
        want = {"rows": n, "sum": n * (n - 1) // 2, "distinct": n, "min": 0, "max": n - 1}
        wait_for(lambda: self.read(image) == want, timeout, 1.0, f"the {n} logged rows, exactly, in the DIS container")

    def state(self, container: str) -> dict:
        return json.loads(self.podman("inspect", "--type", "container", container).stdout)[0]["State"]

    def down(self) -> None:
        for c in reversed(self.started):
            self.podman("rm", "--force", "--time", "10", c, check=False)
        for v in ("dis-db", "binlogs", "tailer-state"):
            self.podman("volume", "rm", "--force", self.volume(v), check=False)
        self.podman("network", "rm", "--force", self.network, check=False)


@pytest.fixture(scope="module")
def project(images):
    p = Project(images.podman, f"dis-deploy-{os.getpid()}")
    p.podman("network", "create", p.network)
    try:
        yield p
    finally:
        p.down()


def healthy(project, container: str) -> bool:
    return project.podman("healthcheck", "run", container, check=False).returncode == 0


def test_the_base_has_the_python_of_the_dockerfile_s_default_base(images):
    """The stand-in base imported from the shared root has the Python of python:3.11-slim-bookworm
    where that image has it (``python`` and ``pip`` in /usr/local/bin), so the Dockerfile is built
    as it would be from the default."""
    default = re.search(r"^ARG PYTHON_IMAGE=python:(\d+\.\d+)-slim-(\w+)$",
                        (ROOT / "docker" / "Dockerfile").read_text(), re.M)
    assert default and (default.group(1), default.group(2)) == (PYTHON, SUITE)
    r = images.podman("run", "--rm", "--network", "none", images.base, "sh", "-c",
                      "command -v python; command -v pip; python --version")
    python, pip, word, version = r.stdout.split()
    assert (python, pip, word) == ("/usr/local/bin/python", "/usr/local/bin/pip", "Python"), r.stdout
    assert version.startswith(PYTHON + "."), r.stdout


def test_the_runtime_image_serves_health(images, project):
    dis = project.up("dis")
    wait_for(lambda: healthy(project, dis), 90, 0.5, "the image's HEALTHCHECK (dis health) in the dis container")
    r = project.podman("exec", dis, "dis", "health", "--address", "127.0.0.1:22021")
    assert "SERVING" in r.stdout + r.stderr
    user = project.podman("exec", dis, "id", "-u").stdout.strip()
    assert user == "10001"  # not root
    nofile = project.podman("exec", dis, "sh", "-c", "ulimit -n").stdout.strip()
    assert nofile == str(COMPOSE["services"]["dis"]["ulimits"]["nofile"]["soft"])


def test_a_tailer_container_brings_logged_rows_to_the_dis(images, project):
    project.up("tailer")  # compose: once dis is healthy (the test above)
    project.log_rows(images.runtime, 20_000)
    project.expect_exactly_logged(images.runtime)


def test_rows_survive_a_kill_and_a_restart_on_the_volume(images, project):
    """``kill -9`` of the DIS process (as the OOM killer would: not a stop the user asked for),
    then compose.yaml's restart policy (unless-stopped) starts the container again on its volume."""
    assert COMPOSE["services"]["dis"]["restart"] == "unless-stopped"
    dis = project.container("dis")
    before = project.state(dis)
    os.kill(before["Pid"], signal.SIGKILL)  # the container's PID 1, seen from the host
    wait_for(lambda: (s := project.state(dis))["Running"] and s["StartedAt"] != before["StartedAt"],
             60, 0.5, "the dis container started again by its restart policy")
    wait_for(lambda: healthy(project, dis), 90, 0.5, "dis healthy after the restart")
    project.expect_exactly_logged(images.runtime)  # recovered from its volume; the tailer resends the rest
    project.log_rows(images.runtime, 5_000)
    project.expect_exactly_logged(images.runtime)


def test_the_spark_image_reads_the_live_table_with_the_jvm_reader(images, project):
    r = project.podman("run", "--rm", "--network", project.network, "--volume", f"{SCRIPTS}:/scripts:ro",
                       "--entrypoint", "python", images.spark, "/scripts/spark_read.py", "dis:22021", timeout=300)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    n = project.logged
    assert out == {"reader": "jvm", "table_class": "disd.spark.DisTable", "rows": n, "sum": n * (n - 1) // 2}, out


def test_sigterm_stops_the_dis_cleanly_with_every_row_checkpointed(images, project):
    """``podman stop`` (compose's stop signal, SIGTERM, within its grace period): exit 0, no
    SIGKILL.  Started again with the tailer stopped, the DIS has every row: from the checkpoint
    the stop wrote, not from a resend."""
    dis, tailer = project.container("dis"), project.container("tailer")
    project.podman("stop", "--time", "30", tailer, timeout=60)
    grace = int(str(COMPOSE["services"]["dis"]["stop_grace_period"]).rstrip("m")) * 60
    t0 = time.monotonic()
    project.podman("stop", "--time", str(grace), dis, timeout=grace + 30)
    took = time.monotonic() - t0
    state = project.state(dis)
    assert state["ExitCode"] == 0 and not state["Running"], state  # not 137: no SIGKILL was needed
    assert took < 60, took
    r = project.podman("logs", dis)
    logs = r.stdout + r.stderr  # the daemon's JSON lines are on its stderr
    assert '"shutting down"' in logs and '"signal": "SIGTERM"' in logs and '"dis stopped"' in logs, logs[-2000:]
    project.podman("start", dis)
    wait_for(lambda: healthy(project, dis), 90, 0.5, "dis healthy after the start")
    project.expect_exactly_logged(images.runtime, timeout=30)
