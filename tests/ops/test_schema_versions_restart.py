"""Schema versions with real ``dis serve`` and ``dis-tailer`` processes: a database of version-1
locations restarted with a version-2 YAML, fed logs of both versions at once, killed with
``kill -9`` mid-ingest and restarted: each location recovers in its own version and ends with
every row once."""

from __future__ import annotations

import subprocess
import threading
import time

import grpc
import numpy as np
import pytest

from disd.binlog import BinlogWriter, normalize_columns
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from disd.schema import SchemaRegistry
from disd.storage import StorageEngine
from server.versions_support import V1, V2, V2_YAML, rows, schemas_dir
from support import (BIN, free_port, free_port_pair, log_name, start_dis_process, start_tailer, subprocess_env,
                     wait_for, write_dis_config, write_tailer_config)

pytestmark = pytest.mark.slow

FIRST = 50  # rows of the version-1 location before the restart with version 2
FRAMES, PER_FRAME = 150, 100


def _status(port: int) -> dict[str, dis_pb2.LocationStatus]:
    ch = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        reply = dis_pb2_grpc.TableDataStub(ch).Status(dis_pb2.StatusRequest(namespace="Market"), timeout=5)
    except grpc.RpcError:
        return {}
    finally:
        ch.close()
    return {loc.key.internal_partition: loc for loc in reply.locations}


def _rows(port: int, ip: str) -> int:
    st = _status(port).get(ip)
    return st.rows if st is not None else -1


def _writer(path, schema, start: int, done: threading.Event) -> None:
    """Append ``FRAMES`` frames of ``PER_FRAME`` single rows, a few ms apart, as a logger would."""
    with BinlogWriter(path, schema) as w:
        for i in range(FRAMES):
            a = start + i * PER_FRAME
            w.write_rows(normalize_columns(schema, rows(schema, a, PER_FRAME)), np.full(PER_FRAME, 3, np.uint8))
            time.sleep(0.01)
    done.set()


def test_kill9_mid_ingest_of_two_versions_recovers_each_location_in_its_version(tmp_path):
    port, metrics_port = free_port_pair(), free_port()  # port + 1: the block endpoint
    logs = tmp_path / "logs"
    logs.mkdir()
    db = tmp_path / "db"
    v1_dir = schemas_dir(tmp_path, "schemas-v1", None)
    v2_dir = schemas_dir(tmp_path, "schemas-v2", V2_YAML)
    tcfg = write_tailer_config(tmp_path, port, logs, poll_interval_ms=50, max_backoff_ms=300)
    with BinlogWriter(logs / log_name("old"), V1) as w:
        w.write_rows(normalize_columns(V1, rows(V1, 0, FIRST)), np.full(FIRST, 3, np.uint8))

    cfg = write_dis_config(tmp_path, port, metrics_port, db_root=db, schemas=v1_dir, checkpoint_ms=100)
    dis = start_dis_process(tmp_path, cfg)
    tailer = start_tailer(tmp_path, tcfg)
    try:
        wait_for(lambda: _rows(port, "old") == FIRST, 30, what="the version-1 rows")
        assert _status(port)["old"].schema_version == 1
        assert dis.terminate() == 0, dis.log_text()[-3000:]

        # second life: version 2 declared; both versions stream in at once
        cfg = write_dis_config(tmp_path, port, metrics_port, db_root=db, schemas=v2_dir, checkpoint_ms=100)
        dis = start_dis_process(tmp_path, cfg)
        assert _status(port)["old"].schema_version == 1
        done_old, done_new = threading.Event(), threading.Event()
        writers = [
            threading.Thread(target=_writer, args=(logs / log_name("old", hhmmss="100000"), V1, FIRST, done_old)),
            threading.Thread(target=_writer, args=(logs / log_name("new"), V2, 0, done_new)),
        ]
        for t in writers:
            t.start()
        total = FRAMES * PER_FRAME
        wait_for(lambda: _rows(port, "old") > FIRST + 10 * PER_FRAME and _rows(port, "new") > 10 * PER_FRAME,
                 30, what="both versions ingesting")
        assert not done_old.is_set() and not done_new.is_set(), "the writers finished before the kill"
        dis.kill9()
        time.sleep(0.3)
        dis = start_dis_process(tmp_path, cfg)
        st = _status(port)
        assert (st["old"].schema_version, st["new"].schema_version) == (1, 2)
        assert not st["old"].error and not st["new"].error
        for t in writers:
            t.join(60)
        wait_for(lambda: _rows(port, "old") == FIRST + total and _rows(port, "new") == total, 60,
                 what="every row of both versions after the kill")
        st = _status(port)
        assert (st["old"].schema_version, st["new"].schema_version) == (1, 2)
    finally:
        if tailer.alive():
            assert tailer.terminate() == 0, tailer.log_text()[-3000:]
        if dis.alive():
            assert dis.terminate() == 0, dis.log_text()[-3000:]

    # offline: each location holds every row once, in its own version's columns
    eng = StorageEngine(str(db), SchemaRegistry.load_dir(v2_dir))
    try:
        old = next(loc for loc in eng.locations() if loc.key.internal_partition == "old")
        new = next(loc for loc in eng.locations() if loc.key.internal_partition == "new")
        assert (old.schema_version, new.schema_version) == (1, 2)
        t_old, t_new = old.read_table(), new.read_table()
        assert t_old.column_names == V1.column_names and t_new.column_names == V2.column_names
        assert np.array_equal(t_old.column("Size").to_numpy(), np.arange(FIRST + total))
        assert np.array_equal(t_new.column("Size").to_numpy(), np.arange(total))
        assert t_new.column("Venue").to_pylist()[-1] == f"V{total - 1}"
    finally:
        eng.close()
    verify = subprocess.run([str(BIN / "dis"), "verify", "--db-root", str(db), "--schemas", str(v2_dir)],
                            capture_output=True, text=True, timeout=60, env=subprocess_env())
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "2 ok, 0 bad" in verify.stdout
