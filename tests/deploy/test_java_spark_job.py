"""Spark without Python: the Scala and Java jobs of docs/spark.md ("Spark jobs in Scala or
Java"), as they are written there, compiled against PySpark's jars and run by PySpark's own
``bin/spark-submit`` with nothing but ``--jars dis-spark.jar`` (taken from ``make dist``'s wheel).
Their batch count and sum are exact; the stream writes every row exactly once, across a ``kill
-9`` and restart of the DIS too (the Java job)."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pyspark
import pytest

from support import (ROOT, append_rows, free_port_pair, log_name, start_dis_process, start_tailer,
                     wait_for, write_dis_config, write_tailer_config)

SPARK_HOME = pathlib.Path(pyspark.__file__).parent


def docs_block(lang: str) -> str:
    blocks = re.findall(rf"```{lang}\n(.*?)```", (ROOT / "docs" / "spark.md").read_text(), re.S)
    found = [b for b in blocks if "class DisJob" in b or "object DisJob" in b]
    assert len(found) == 1, f"docs/spark.md: one {lang} block with DisJob, found {len(found)}"
    return found[0]


def committed(out: pathlib.Path) -> dict:
    """What the Parquet sink has committed: the files its ``_spark_metadata`` log adds (files of
    a micro-batch that never committed are not rows of the stream), summed up as the readers do."""
    files: set[str] = set()
    meta = out / "_spark_metadata"
    for f in sorted(meta.iterdir()) if meta.is_dir() else []:
        if f.name.startswith(".") or f.name.endswith(".tmp"):
            continue
        for line in f.read_text().splitlines()[1:]:  # line 1: the log's version
            entry = json.loads(line)
            if entry.get("action") == "add":
                files.add(entry["path"])
    sizes = [pq.read_table(p.removeprefix("file:"), columns=["Size"]).column("Size") for p in sorted(files)]
    sizes = [c for c in sizes if len(c)]
    if not sizes:
        return {"rows": 0}
    col = pa.chunked_array([ch for c in sizes for ch in c.chunks])
    return {"rows": len(col), "sum": pc.sum(col.cast("int64")).as_py(), "distinct": pc.count_distinct(col).as_py()}


def exactly(n: int) -> dict:
    return {"rows": n, "sum": n * (n - 1) // 2, "distinct": n} if n else {"rows": 0}


class Live:
    """A real ``dis serve`` with its tailer, and the rows logged so far (Size = row number)."""

    def __init__(self, tmp: pathlib.Path) -> None:
        self.tmp = tmp
        self.port = free_port_pair()
        self.cfg = write_dis_config(tmp, self.port)
        logs = tmp / "logs"
        logs.mkdir()
        self.log = logs / log_name()
        self.logs = logs
        self.logged = 0
        self.dis = self.tailer = None

    def start(self) -> "Live":
        self.log_rows(30_000, frames=3)
        self.dis = start_dis_process(self.tmp, self.cfg)
        self.tailer = start_tailer(self.tmp, write_tailer_config(self.tmp, self.port, self.logs, poll_interval_ms=50,
                                                                 max_backoff_ms=300))
        self.wait_published()
        return self

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log_rows(self, n: int, frames: int = 1) -> None:
        append_rows(self.log, self.logged, n, frames=frames)
        self.logged += n

    def wait_published(self) -> None:
        from disd.client import connect

        def published():
            with connect(self.address, retry_s=0) as c:
                return sum(loc.rows for loc in c.locations("Market", "Trade"))
        wait_for(lambda: published() == self.logged, 60, 0.2, f"{self.logged} rows published")

    def stop(self) -> None:
        if self.tailer is not None and self.tailer.alive():
            self.tailer.terminate()
        if self.dis is not None and self.dis.alive():
            self.dis.terminate()


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    srv = Live(tmp_path_factory.mktemp("live-dis"))
    try:
        yield srv.start()
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def jar(dist, tmp_path_factory) -> pathlib.Path:
    """dis-spark.jar, from the wheel: what a JVM job's operator has."""
    out = tmp_path_factory.mktemp("jar") / "dis-spark.jar"
    with zipfile.ZipFile(dist.wheel) as z:
        out.write_bytes(z.read("disd/spark/jars/dis-spark.jar"))
    return out


class Job:
    """``spark-submit`` of PySpark's own bin/, with only ``--jars dis-spark.jar``."""

    def __init__(self, tmp: pathlib.Path, jar: pathlib.Path, job: pathlib.Path, address: str) -> None:
        self.out, ckpt, self.log = tmp / "out", tmp / "checkpoint", tmp / "job.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "SPARK_"))}
        env["PATH"] = f"{pathlib.Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # find-spark-home's python
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [str(SPARK_HOME / "bin" / "spark-submit"), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
                 "--conf", "spark.sql.shuffle.partitions=2", "--jars", str(jar), "--class", "DisJob", str(job),
                 address, str(self.out), str(ckpt)],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def _alive(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError("the job exited:\n" + self.log.read_text()[-4000:])

    def batch(self) -> tuple[int, int]:
        def line():
            self._alive()
            m = re.search(r"^batch rows=(\d+) sum=(\d+)$", self.log.read_text(), re.M)
            return m and (int(m.group(1)), int(m.group(2)))
        return wait_for(line, 180, 0.5, "the job's batch line")

    def wait_streamed(self, n: int, timeout: float) -> None:
        def check():
            self._alive()
            return committed(self.out) == exactly(n)
        wait_for(check, timeout, 0.5, f"the stream's {n} rows, exactly")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def package(classes: pathlib.Path, job: pathlib.Path) -> pathlib.Path:
    with zipfile.ZipFile(job, "w") as z:
        for f in classes.rglob("*.class"):
            z.write(f, f.relative_to(classes).as_posix())
    return job


def test_the_scala_job_of_the_docs_reads_exactly_with_only_the_jar(live, jar, tmp_path):
    """Compiled by the Scala compiler among PySpark's own jars (spark-shell's): batch, and the
    stream's rows so far."""
    src = tmp_path / "DisJob.scala"
    src.write_text(docs_block("scala"))
    classes = tmp_path / "classes"
    classes.mkdir()
    r = subprocess.run(["java", "-cp", f"{SPARK_HOME / 'jars'}/*", "scala.tools.nsc.Main", "-usejavacp",
                        "-d", str(classes), str(src)], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    job = Job(tmp_path, jar, package(classes, tmp_path / "dis-job.jar"), live.address)
    try:
        n = live.logged
        assert job.batch() == (n, n * (n - 1) // 2)
        job.wait_streamed(n, 120)
    finally:
        job.stop()


def test_the_java_job_of_the_docs_reads_exactly_across_a_dis_restart(live, jar, tmp_path):
    javac = shutil.which("javac")
    assert javac, "javac (JDK 17) is needed to compile the job (.ci/run installs it)"
    src = tmp_path / "DisJob.java"
    src.write_text(docs_block("java"))
    classes = tmp_path / "classes"
    r = subprocess.run([javac, "--release", "17", "-nowarn", "-cp", f"{SPARK_HOME / 'jars'}/*", "-d", str(classes),
                        str(src)], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    job = Job(tmp_path, jar, package(classes, tmp_path / "dis-job.jar"), live.address)
    try:
        n = live.logged
        assert job.batch() == (n, n * (n - 1) // 2)
        job.wait_streamed(n, 120)
        # kill -9 and a restart of the DIS, rows logged while it is down and after
        live.dis.kill9()
        live.log_rows(5_000)
        time.sleep(2)  # a few micro-batches find the DIS away
        live.dis = start_dis_process(live.tmp, live.cfg)
        live.log_rows(5_000)
        job.wait_streamed(live.logged, 150)
        time.sleep(3)  # three more triggers: nothing more, nothing twice
        assert committed(job.out) == exactly(live.logged)
    finally:
        job.stop()
