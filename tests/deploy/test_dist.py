"""``make dist``: an sdist, and a wheel that carries the JVM reader's jar and the C modules, so a
host with a Java runtime but no JDK and no C compiler gets both by installing it.

The wheel goes into a fresh virtual environment with ``javac`` and every C compiler hidden from
``PATH``; there ``make run``'s demo gives its result, ``dis serve`` runs with the C modules
loaded, and ``format("dis")`` reads through the JVM reader.  The jar's manifest names the Spark
and Scala it was compiled against (``disd.spark`` refusing another Spark:
tests/spark/test_jar_spark_version.py)."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

from support import (ROOT, append_rows, dis_healthy, free_port_pair, log_name, wait_for, write_dis_config,
                     write_tailer_config)
from support.sparkjars import pyspark_versions

SCRIPTS = ROOT / "tests" / "deploy" / "scripts"
#: what a host without a JDK or a C compiler lacks: javac and any C compiler driver
COMPILERS = re.compile(r"(javac|cc|c\+\+|gcc|g\+\+|cpp|clang|clang\+\+|tcc)(-[0-9.]+)?|[\w.]+-linux-gnu-.*")


def manifest_of(jar_bytes: bytes) -> dict[str, str]:
    import io

    with zipfile.ZipFile(io.BytesIO(jar_bytes)) as z:
        text = z.read("META-INF/MANIFEST.MF").decode()
    return dict(line.split(": ", 1) for line in text.replace("\r\n", "\n").split("\n") if ": " in line)


def test_make_dist_builds_an_sdist_and_a_wheel_with_the_jar_and_the_c_modules(dist):
    with zipfile.ZipFile(dist.wheel) as z:
        names = set(z.namelist())
        jar = z.read("disd/spark/jars/dis-spark.jar")
    for module in ("storage/newlocation", "storage/batchwrite", "storage/lastbyindex", "binlog/rowencode",
                   "kafka/rdbatch"):
        assert any(re.fullmatch(rf"disd/{module}\.cpython-311-.*\.so", n) for n in names), module
    assert "disd/rpc/v1/dis_pb2.py" in names and "disd/tailer/cli.py" in names
    # the jar was compiled against this environment's PySpark: its manifest says which Spark and Scala
    built = manifest_of(jar)
    assert {k: built.get(k) for k in ("Spark-Version", "Scala-Version", "Scala-Binary-Version")} == pyspark_versions()
    with tarfile.open(dist.sdist) as t:
        files = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert {"jvm/build.py", "jvm/src/main/java/disd/spark/DisSource.java", "proto/disd/rpc/v1/dis.proto",
            "dis/disd/storage/newlocation.c", "setup.py", "pyproject.toml"} <= files
    built_files = [f for f in files if f.endswith((".so", ".jar")) or "_pb2" in f]
    assert not built_files, built_files  # built from the sources, never shipped prebuilt


def path_without_compilers(tmp: pathlib.Path) -> str:
    """A PATH with every program of this one but javac and the C compilers (symbolic links in one
    directory): a host with a Java runtime and no JDK, no compiler."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    for d in os.environ["PATH"].split(os.pathsep):
        p = pathlib.Path(d)
        if not p.is_dir():
            continue
        for exe in p.iterdir():
            if COMPILERS.fullmatch(exe.name) or (bin_dir / exe.name).exists() or not os.access(exe, os.X_OK):
                continue
            (bin_dir / exe.name).symlink_to(exe)
    return str(bin_dir)


@pytest.fixture(scope="module")
def venv(dist, tmp_path_factory):
    """A fresh virtual environment with ``make dist``'s wheel and its spark extra, installed where
    no javac and no C compiler can be found."""
    tmp = tmp_path_factory.mktemp("wheel-venv")
    path = path_without_compilers(tmp)
    for tool in ("javac", "gcc", "cc", "x86_64-linux-gnu-gcc"):
        assert shutil.which(tool, path=path) is None, tool
    assert shutil.which("java", path=path), "a Java runtime is needed (java on the PATH)"
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "PYTHONPATH", "CC", "CXX")
           and not k.startswith(("PYSPARK", "SPARK_"))}
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{path}"
    r = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", f"{dist.wheel}[spark]"],
                       capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return venv, env, tmp


def test_the_wheel_without_compilers_has_the_c_modules_and_the_jar(venv):
    venv, env, _ = venv
    code = ("import json, disd; from disd.storage import fsio, lastbykeys; from disd.spark import jvm; "
            "from disd.kafka import batchread; "
            "from disd.binlog import format as binlog_format; "
            "print(json.dumps({'disd': disd.__file__, 'newlocation': fsio.newlocation is not None, "
            "'batchwrite': fsio.batchwrite is not None, 'lastbyindex': lastbykeys.lastbyindex is not None, "
            "'rowencode': binlog_format.rowencode is not None, 'rdbatch': batchread.rdbatch is not None, "
            "'jar': str(jvm.jar_status()[0]), 'why': jvm.jar_status()[1]}))")
    r = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=120,
                       env=env, cwd=venv)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert pathlib.Path(out["disd"]).is_relative_to(venv), out  # the installed wheel, not this checkout
    assert out["newlocation"] and out["batchwrite"] and out["lastbyindex"] and out["rowencode"] and out["rdbatch"], out
    assert out["jar"] != "None" and pathlib.Path(out["jar"]).is_relative_to(venv), out


def test_make_run_s_demo_from_the_wheel(venv):
    venv, env, tmp = venv
    r = subprocess.run([str(venv / "bin" / "dis"), "demo", "--workdir", str(tmp / "demo")], capture_output=True,
                       text=True, timeout=300, env=env, cwd=tmp)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert re.search(r"logged 10000 rows; .* read back 10000 rows, equal to what was logged: True", r.stdout), r.stdout


def test_dis_serve_with_the_c_modules_and_format_dis_through_the_jvm_reader(venv):
    venv, env, tmp = venv
    port = free_port_pair()
    cfg = write_dis_config(tmp, port)
    logs = tmp / "logs"
    logs.mkdir()
    append_rows(logs / log_name(), 0, 20_000, frames=2)
    with open(tmp / "dis.log", "ab") as dis_log, open(tmp / "tailer.log", "ab") as tailer_log:
        dis = subprocess.Popen([str(venv / "bin" / "dis"), "serve", "--config", str(cfg), "--json-logs"],
                               stdout=dis_log, stderr=subprocess.STDOUT, env=env, cwd=tmp)
        tailer = subprocess.Popen([str(venv / "bin" / "dis-tailer"), "--config",
                                   str(write_tailer_config(tmp, port, logs, poll_interval_ms=50))],
                                  stdout=tailer_log, stderr=subprocess.STDOUT, env=env, cwd=tmp)
    try:
        wait_for(lambda: dis_healthy(port), 60, 0.2, "dis serve (the wheel's) healthy")
        # the serving process has the wheel's C modules loaded
        maps = pathlib.Path(f"/proc/{dis.pid}/maps").read_text()
        for module in ("newlocation", "batchwrite", "lastbyindex"):
            assert re.search(rf"{re.escape(str(venv))}/lib/python3\.11/site-packages/disd/storage/{module}\..*\.so",
                             maps), module
        r = subprocess.run([str(venv / "bin" / "python"), str(SCRIPTS / "spark_read.py"), f"127.0.0.1:{port}"],
                           capture_output=True, text=True, timeout=300, env=env, cwd=tmp)
        assert r.returncode == 0, r.stderr[-4000:]
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out == {"reader": "jvm", "table_class": "disd.spark.DisTable", "rows": 20_000,
                       "sum": 20_000 * 19_999 // 2}, out
    finally:
        for p in (tailer, dis):
            p.terminate()
            p.wait(60)
