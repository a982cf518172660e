"""A merge killed (SIGKILL) at every step of its publishing leaves no partial output a reader can
see, and a re-run completes with exactly the rows, nothing doubled.

The child (kill_child.py) is a real process running ``disd.historical.merge``; it kills itself
at one named step: after taking the lock, in the middle of writing the staging files, after the
write, after renaming the parts, after fsync, after the rename to a version, after the link
switch, after the index.  What a reader sees is checked with the reader's own discovery
(``disd.historical.discover``) and pyarrow.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from disd.historical.definitions import DefinitionError, find_definition
from disd.historical.discover import table_files
from disd.historical.index import read_index, read_manifest
from disd.historical.layout import NamespaceRoot
from support import subprocess_env

from .helpers import D1, LOCS, IntradayDb, fill, rows_of

CHILD = pathlib.Path(__file__).with_name("kill_child.py")
STEPS = ["locked", "writing", "written", "finalized", "sealed", "renamed", "linked", "indexed"]
EXPECTED_STATUS = {"renamed": "relinked", "linked": "unchanged", "indexed": "unchanged"}


def run_child(db: pathlib.Path, step: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHILD), str(db), D1, step], capture_output=True, text=True,
                          env=subprocess_env(), timeout=120)


def visible_sizes(db: pathlib.Path) -> list[int]:
    """The Size column of every row a historical reader sees (empty: no table yet)."""
    try:
        ns, defn = find_definition(str(db), "Market", "Trade")
    except DefinitionError:
        return []
    files = table_files(ns, defn)
    if not files:
        return []
    return pa.concat_tables([pq.read_table(f.path, columns=["Size"]) for f in files]).column("Size").to_pylist()


@pytest.fixture(scope="module")
def intraday(tmp_path_factory):
    db = tmp_path_factory.mktemp("kill") / "db"
    idb = IntradayDb(db)
    fill(idb)
    idb.close()
    return db


def test_killed_at_every_step_no_partial_output_and_rerun_is_exact(intraday):
    expected = sorted(s for k, (a, n) in LOCS.items() if k.column_partition == D1 for s in range(a, a + n))
    assert len(expected) == rows_of(D1)
    for step in STEPS:
        shutil.rmtree(intraday / "Systems", ignore_errors=True)
        killed = run_child(intraday, step)
        assert killed.returncode == -signal.SIGKILL, (step, killed.returncode, killed.stderr[-2000:])
        seen = sorted(visible_sizes(intraday))
        assert seen in ([], expected), f"killed after {step!r}: a reader sees {len(seen)} rows"
        assert (seen == expected) == (step in ("linked", "indexed")), step

        done = run_child(intraday, "none")
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.split() == ["RESULT", EXPECTED_STATUS.get(step, "merged"), str(len(expected))], step
        assert sorted(visible_sizes(intraday)) == expected, step
        ns = NamespaceRoot.system(intraday, "Market")
        parent = ns.location_parent("0", D1)
        leftovers = [n for n in os.listdir(parent) if ".tmp-" in n or ".link-" in n]
        assert leftovers == [], (step, leftovers)
        linked = read_manifest(parent / "Trade")
        assert read_index(ns.index_path("Trade")).locations == (linked,), step

    again = run_child(intraday, "none")
    assert again.stdout.split() == ["RESULT", "unchanged", str(len(expected))]
    assert sorted(visible_sizes(intraday)) == expected
