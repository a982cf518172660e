"""One DIS per database root: a second ``dis serve`` (or an offline writer) on the same root is
refused at once, naming the root and the holder, and the lock dies with its process (kill -9)."""

from __future__ import annotations

import os
import socket
import subprocess
import time

import pytest

from disd.historical.merge import IntradaySource, MergeError, MergeRequest, merge
from disd.storage.dblock import DatabaseLockedError, lock_database, read_holder
from support import BIN, ROOT, free_port, start_dis_process, write_dis_config


def test_a_second_lock_on_one_root_is_refused_naming_the_holder(tmp_path):
    root = str(tmp_path / "db")
    with lock_database(root, "dis serve") as held:
        assert held.held
        with pytest.raises(DatabaseLockedError) as e:
            lock_database(root, "dis merge")  # a second open file description: flock refuses it
        msg = str(e.value)
        assert root in msg and f"pid {os.getpid()}" in msg and socket.gethostname() in msg
        assert "dis serve" in msg and held.holder.since in msg
    with lock_database(root, "dis merge"):  # released: the next one takes it
        assert read_holder(root).what == "dis merge"


def test_a_second_dis_serve_on_one_root_exits_at_once_and_kill_9_frees_the_root(tmp_path):
    first = start_dis_process(tmp_path, write_dis_config(tmp_path, free_port()))
    try:
        other = tmp_path / "other"
        other.mkdir()
        write_dis_config(other, free_port(), db_root=tmp_path / "db")  # the same database root
        t0 = time.monotonic()
        r = subprocess.run([str(BIN / "dis"), "serve", "--config", str(other / "dis.yaml")],
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert r.returncode != 0
        assert time.monotonic() - t0 < 20  # refused at once, not after waiting for the lock
        assert str(tmp_path / "db") in r.stderr and f"pid {first.p.pid}" in r.stderr, r.stderr
        assert socket.gethostname() in r.stderr and "Traceback" not in r.stderr
        first.kill9()  # the kernel drops the flock with the process
        second = start_dis_process(other, other / "dis.yaml")
        assert read_holder(str(tmp_path / "db")).pid == second.p.pid
        assert second.terminate() == 0
    finally:
        if first.alive():
            first.kill9()


def test_merge_from_column_files_is_refused_while_a_dis_owns_the_root(tmp_path):
    dis = start_dis_process(tmp_path, write_dis_config(tmp_path, free_port()))
    try:
        req = MergeRequest("Market", "Trade", "2026-11-21", str(tmp_path / "db"),
                           IntradaySource(schemas=str(ROOT / "config" / "schemas")), quiet_s=0)
        with pytest.raises(MergeError, match=f"in use by dis serve \\(pid {dis.p.pid}"):
            merge(None, req)  # refused before any Spark work
    finally:
        dis.kill9()
