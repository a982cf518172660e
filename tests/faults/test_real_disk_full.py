"""A real full disk: the DIS's database on a 4 MiB tmpfs, filled for real, ENOSPC from the kernel.

No fault injection: the real FileSystem, the real ``dis-tailer`` as a subprocess.  The location
stops with RESOURCE_EXHAUSTED naming ENOSPC, ``dis_io_errors_total`` counts it, nothing
checkpointed is lost; space is freed and the location reopens and the tailer resumes by
themselves, to an exact table.

Mounting needs CAP_SYS_ADMIN (root; CI runs as root): without it the test is skipped, saying so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import time

import pytest

from disd.client import connect
from disd.storage.checkpoint import read_record
from server.conftest import KEY
from support import append_rows, log_name, sample, scrape, start_dis_server, start_tailer, wait_for, write_tailer_config

from .disk import engines_on

MNT_DETACH = 2
LOCATION = str(KEY)
ROWS = 20000  # about 640 KB of column data


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 4 MiB tmpfs mounted at a fresh directory, unmounted afterwards."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    libc = _libc()
    if libc.mount(b"tmpfs", str(mnt).encode(), b"tmpfs", 0, b"size=4m,mode=0755") != 0:
        e = ctypes.get_errno()
        if e in (errno.EPERM, errno.EACCES):
            pytest.skip(f"mounting a tmpfs is not permitted here ({errno.errorcode[e]}: needs root or "
                        "CAP_SYS_ADMIN; .ci/run runs as root)")
        raise OSError(e, f"mount -t tmpfs {mnt}: {os.strerror(e)}")
    try:
        yield mnt
    finally:
        libc.umount2(str(mnt).encode(), MNT_DETACH)


def free_bytes(path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def sizes(port: int) -> list[int]:
    with connect(f"127.0.0.1:{port}") as c:
        return c.read_table("Market", "Trade", columns=["Size"]).column("Size").to_pylist()


def enospc_errors(port: int) -> float:
    return sample(scrape(port), "dis_io_errors_total", errno="ENOSPC")


def test_a_really_full_disk_stops_the_location_then_ingestion_resumes_by_itself(tmp_path, small_tmpfs, monkeypatch):
    engines_on(monkeypatch, None, retry_initial_ms=100, retry_max_ms=500)
    db = small_tmpfs / "db"
    srv = start_dis_server(db, checkpoint_ms=100)
    logs = tmp_path / "logs"
    logs.mkdir()
    tailer = None
    try:
        filler = small_tmpfs / "filler"
        filler.write_bytes(b"\0" * (free_bytes(small_tmpfs) - 256 * 1024))  # leave 256 KiB
        before = enospc_errors(srv.metrics_port)
        tailer = start_tailer(tmp_path, write_tailer_config(tmp_path, srv.port, logs, poll_interval_ms=50,
                                                            max_backoff_ms=300))
        path = logs / log_name("feed1")
        append_rows(path, 0, 2000, frames=20)
        loc = wait_for(lambda: srv.engine.location(KEY, create=False), 30, what="the location")
        wait_for(lambda: loc.checkpointed_rows == 2000, 30, what="a first checkpoint")
        append_rows(path, 2000, ROWS - 2000, frames=180)
        wait_for(lambda: loc.in_error, 30, what="ENOSPC from the kernel")
        error = loc.error
        assert loc.error_errno == errno.ENOSPC and "ENOSPC" in error, error
        wait_for(lambda: "RESOURCE_EXHAUSTED" in tailer.log_text() and "ENOSPC" in tailer.log_text(), 10,
                 what="the tailer told RESOURCE_EXHAUSTED (ENOSPC)")
        assert LOCATION in tailer.log_text()
        assert enospc_errors(srv.metrics_port) > before
        # nothing checkpointed is lost: the record's rows read back exactly
        rec = read_record(loc.path)
        assert 2000 <= rec.rows < ROWS
        published = sizes(srv.port)
        assert published == list(range(len(published))) and len(published) >= rec.rows

        filler.unlink()  # space is back
        t0 = time.monotonic()
        wait_for(lambda: len(sizes(srv.port)) == ROWS, 60, what="every row visible once space is back")
        took = time.monotonic() - t0
        assert sizes(srv.port) == list(range(ROWS))
        assert not loc.in_error
        print(f"real ENOSPC on a 4 MiB tmpfs: {error!r}; checkpoint kept {rec.rows} rows; "
              f"all {ROWS} rows visible {took:.2f} s after space came back, {loc.reopens} reopen attempts")
    finally:
        if tailer is not None:
            tailer.terminate()
        srv.stop(0.5)
