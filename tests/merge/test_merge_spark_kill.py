"""``dis merge`` killed (SIGKILL, the whole process group: Python driver, JVM, Python workers) at
a random point of its Spark job leaves nothing a reader sees; the same merge then run through
``spark-submit examples/merge_job.py`` completes with exactly the intraday rows.

The steps after the Spark job are killed one by one in test_merge_kill.py (fast, no Spark)."""

from __future__ import annotations

import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from disd.binlog import LocationKey
from support import ROOT, SCHEMAS as SCHEMAS_DIR, subprocess_env, trade_rows

from .helpers import IntradayDb
from .test_merge_kill import visible_sizes

pytestmark = [pytest.mark.spark, pytest.mark.slow]
DATE = "2026-11-18"
SIZES = {"feed1": (0, 80_000), "feed2": (80_000, 40_000)}


def merge_args(db: pathlib.Path) -> list[str]:
    return ["--namespace", "Market", "--table", "Trade", "--partition", DATE, "--db-root", str(db),
            "--schemas", str(SCHEMAS_DIR), "--quiet-seconds", "0", "--sort-by", "Sym,Timestamp", "--json"]


def test_merge_killed_mid_job_then_spark_submit_completes(tmp_path):
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Java is not installed: the Spark tests need Java 17")
    db = tmp_path / "db"
    idb = IntradayDb(db)
    for ip, (start, n) in SIZES.items():
        idb.append(LocationKey("Market", "Trade", ip, DATE), trade_rows(start, n, nulls=True))
    idb.close()
    expected = list(range(sum(n for _, n in SIZES.values())))
    env = subprocess_env()
    staging_parent = db / "Systems" / "Market" / "Partitions" / "0" / DATE

    log = open(tmp_path / "killed.log", "w")
    p = subprocess.Popen([sys.executable, "-m", "disd.cli", "merge", *merge_args(db), "--master", "local[2]"],
                         stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while p.poll() is None and time.monotonic() < deadline:
            if staging_parent.is_dir() and any(".tmp-" in n for n in os.listdir(staging_parent)):
                break  # Spark is writing the staging directory
            time.sleep(0.05)
        time.sleep(random.uniform(0.0, 0.3))
        assert p.poll() is None, "the merge ended before it could be killed: " + (tmp_path / "killed.log").read_text()[-2000:]
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(30)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(30)
        log.close()
    assert p.returncode == -signal.SIGKILL
    assert visible_sizes(db) == []  # killed mid-job: nothing a reader sees

    submit = shutil.which("spark-submit", path=os.path.dirname(sys.executable)) or "spark-submit"
    done = subprocess.run([submit, "--master", "local[2]", "--conf", "spark.ui.enabled=false",
                           str(ROOT / "examples" / "merge_job.py"), *merge_args(db)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["status"], result["rows"], result["source"]) == ("merged", len(expected), "files")
    assert sorted(visible_sizes(db)) == expected
    assert [n for n in os.listdir(staging_parent) if ".tmp-" in n] == []  # the killed job's staging is gone
