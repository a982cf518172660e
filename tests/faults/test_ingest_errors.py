"""Full disk and I/O errors as a tailer sees them: a real DIS on loopback over a FaultyDisk.

The Ingest service answers a location in error with a status that says what happened
(RESOURCE_EXHAUSTED for ENOSPC, UNAVAILABLE for EIO, the details naming the errno, the operation,
the file and the location), the Prometheus endpoint counts it, and once the disk heals the
location reopens by itself and a new stream resumes from the checkpoint to an exact table.  The
end-to-end test runs the real ``dis-tailer`` as a subprocess against the DIS.
"""

from __future__ import annotations

import errno
import time

import grpc
import pytest

from disd.client import connect
from disd.server.daemon import DisServer
from server.conftest import KEY, IngestStream, frames_of
from support import append_rows, log_name, running_dis, sample, scrape, start_tailer, wait_for, write_tailer_config

from .disk import FaultyDisk, engines_on

LOCATION = str(KEY)
LOG = log_name("feed1")


@pytest.fixture
def faulty_dis(tmp_path, monkeypatch):
    """A DisServer whose storage engine runs on a FaultyDisk (and retries reopening fast)."""
    disk = FaultyDisk(record=False)
    engines_on(monkeypatch, disk)
    with running_dis(tmp_path / "db", checkpoint_ms=200) as srv:
        yield srv, disk


def fingerprint(srv: DisServer) -> str:
    return srv.schemas.get("Market", "Trade").fingerprint


def send_until_refused(s: IngestStream, chunks) -> grpc.RpcError:
    for off, data in chunks:
        try:
            s.chunk(LOG, off, data)
        except grpc.RpcError as e:
            return e
        time.sleep(0.03)  # the flusher writes (and fails) every 20 ms
    raise AssertionError("the DIS accepted every chunk")


def sizes(port: int) -> list[int]:
    with connect(f"127.0.0.1:{port}") as c:
        return c.read_table("Market", "Trade", columns=["Size"]).column("Size").to_pylist()


@pytest.mark.parametrize("op,code,status", [
    ("pwrite", errno.ENOSPC, grpc.StatusCode.RESOURCE_EXHAUSTED),
    ("fsync", errno.EIO, grpc.StatusCode.UNAVAILABLE),
    ("rename", errno.ENOSPC, grpc.StatusCode.RESOURCE_EXHAUSTED),
])
def test_the_tailer_is_told_why_and_resumes_after_the_disk_heals(tmp_path, faulty_dis, op, code, status):
    srv, disk = faulty_dis
    name = errno.errorcode[code]
    path = tmp_path / LOG
    append_rows(path, 0, 3000, frames=30)
    chunks = frames_of(path, srv.schemas.get("Market", "Trade"))
    s = IngestStream(srv.port)
    assert s.open(fingerprint=fingerprint(srv)).resume.file_name == ""
    for off, data in chunks[:10]:
        s.chunk(LOG, off, data)
    loc = srv.engine.location(KEY, create=False)
    assert loc.checkpoint() or loc.checkpointed_rows == 1000

    disk.inject(op, code)
    err = send_until_refused(s, chunks[10:])
    s.close()
    assert err.code() == status, (err.code(), err.details())
    for part in (name, f"on {op}", LOCATION):
        assert part in err.details(), err.details()
    again = IngestStream(srv.port)  # a reconnect while the disk still refuses: refused at open
    with pytest.raises(grpc.RpcError) as ei:
        again.open(fingerprint=fingerprint(srv))
    again.close()
    assert ei.value.code() == status and name in ei.value.details()
    m = scrape(srv.metrics_port)
    assert sample(m, "dis_io_errors_total", op=op, errno=name) >= 1
    assert sample(m, "dis_location_in_error", location=LOCATION) == 1
    assert sample(m, "dis_partitions_in_error") >= 1

    disk.heal()
    wait_for(lambda: not loc.in_error, 10)
    m = scrape(srv.metrics_port)
    assert sample(m, "dis_location_in_error", location=LOCATION) == 0
    assert sample(m, "dis_location_recoveries_total", result="reopened") >= 1
    s = IngestStream(srv.port)
    rp = s.open(fingerprint=fingerprint(srv)).resume
    assert rp.file_name == LOG and rp.offset == loc.resume_point.offset
    for off, data in chunks:
        if off >= rp.offset:
            s.chunk(LOG, off, data)
    s.close()
    wait_for(lambda: len(sizes(srv.port)) == 3000, 10)
    assert sizes(srv.port) == list(range(3000))


def test_a_stream_from_before_a_reopen_cannot_skip_rows(tmp_path, faulty_dis):
    """The location fails and reopens between two chunks of one stream: the next chunk would
    continue past rows the reopen cut away.  The stream is ended (by the DIS when it notices the
    failure, or at the next chunk by the location's epoch), and the reconnect resends them."""
    srv, disk = faulty_dis
    path = tmp_path / LOG
    append_rows(path, 0, 600, frames=6)
    chunks = frames_of(path, srv.schemas.get("Market", "Trade"))
    s = IngestStream(srv.port)
    s.open(fingerprint=fingerprint(srv))
    s.chunk(LOG, *chunks[0])
    loc = srv.engine.location(KEY, create=False)
    loc.checkpoint()
    disk.inject("fsync", errno.EIO, times=1)  # the next checkpoint fails
    s.chunk(LOG, *chunks[1])  # acknowledged, not yet checkpointed
    wait_for(lambda: loc.epoch == 1 and not loc.in_error, 10)  # failed at a checkpoint, reopened
    assert loc.committed_rows == 100
    with pytest.raises(grpc.RpcError) as ei:
        s.chunk(LOG, *chunks[2])
    s.close()
    assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "EIO" in ei.value.details() or "reopened" in ei.value.details(), ei.value.details()
    s = IngestStream(srv.port)
    rp = s.open(fingerprint=fingerprint(srv)).resume
    assert rp.offset == chunks[1][0]  # rows 100..199 are sent again
    for off, data in chunks[1:]:
        s.chunk(LOG, off, data)
    s.close()
    wait_for(lambda: len(sizes(srv.port)) == 600, 10)
    assert sizes(srv.port) == list(range(600))


@pytest.mark.parametrize("op,code,status", [
    ("pwrite", errno.ENOSPC, "RESOURCE_EXHAUSTED"),
    ("fsync", errno.EIO, "UNAVAILABLE"),
])
def test_end_to_end_the_real_tailer_resumes_by_itself(tmp_path, faulty_dis, op, code, status):
    srv, disk = faulty_dis
    name = errno.errorcode[code]
    logs = tmp_path / "logs"
    logs.mkdir()
    path = logs / LOG
    cfg = write_tailer_config(tmp_path, srv.port, logs, poll_interval_ms=50, max_backoff_ms=300)
    tailer = start_tailer(tmp_path, cfg)
    try:
        append_rows(path, 0, 3000, frames=30)
        wait_for(lambda: len(sizes(srv.port)) == 3000, 30, what="the first rows visible")
        loc = srv.engine.location(KEY, create=False)

        disk.inject(op, code)
        append_rows(path, 3000, 3000, frames=30)  # then nothing more: the tailer goes idle
        wait_for(lambda: loc.in_error, 10, what=f"the location in error after {name}")
        wait_for(lambda: status in tailer.log_text() and name in tailer.log_text(), 10,
                 what=f"the tailer told {status} ({name})")
        time.sleep(0.5)
        assert loc.in_error and loc.reopens >= 1
        m = scrape(srv.metrics_port)
        assert sample(m, "dis_io_errors_total", op=op, errno=name) >= 1
        assert sample(m, "dis_location_in_error", location=LOCATION) == 1

        t0 = time.monotonic()
        disk.heal()
        wait_for(lambda: len(sizes(srv.port)) == 6000, 30, what="every row visible after the disk healed")
        print(f"{op} {name}: all 6000 rows visible {time.monotonic() - t0:.2f} s after the disk healed")
        assert sizes(srv.port) == list(range(6000))
        assert LOCATION in tailer.log_text()
        append_rows(path, 6000, 2000, frames=20)  # and the stream goes on
        wait_for(lambda: len(sizes(srv.port)) == 8000, 30, what="later rows visible")
        assert sizes(srv.port) == list(range(8000))
    finally:
        assert tailer.terminate() == 0, tailer.log_text()[-3000:]
