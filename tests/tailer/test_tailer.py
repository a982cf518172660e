"""The tailer's parts: configuration, discovery, frame-aligned reading, backpressure, refusals."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import numpy as np
import pytest

from disd.binlog import BinlogWriter, normalize_columns
from disd.config import ConfigError
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from disd.schema import SchemaRegistry
from disd.tailer import Tailer, parse_tailer_config
from disd.tailer.core import complete_end, read_frames, scan_dirs

from e2e_helpers import ROOT

TRADE = SchemaRegistry.load_dir(ROOT / "config" / "schemas").get("Market", "Trade")
F1 = "Market.Trade.System.ip1.2026-11-22.bin.2026-11-22.090000.000+0000"
F2 = "Market.Trade.System.ip1.2026-11-22.bin.2026-11-22.100000.000+0000"


def write(path, n, start=0, flags=None):
    with BinlogWriter(path, TRADE) as w:
        return w.write_rows(normalize_columns(TRADE, {"Size": list(range(start, start + n))}),
                            np.full(n, 3, np.uint8) if flags is None else np.asarray(flags, np.uint8))


@pytest.mark.parametrize(
    "data,key",
    [
        ({"log_dirs": ["x"]}, "dis"),
        ({"dis": "a:1", "routing": "r.yaml", "log_dirs": ["x"]}, "dis"),
        ({"dis": "nohostport", "log_dirs": ["x"]}, "dis"),
        ({"dis": "a:1"}, "log_dirs"),
        ({"dis": "a:1", "log_dirs": ["x"], "chunk_bytes": 0}, "chunk_bytes"),
        ({"dis": "a:1", "log_dirs": ["x"], "typo": 1}, "typo"),
        ({"dis": "a:1", "log_dirs": ["x"], "tls": {"cert": "c.pem"}}, "tls.ca"),
    ],
)
def test_config_errors_name_the_key(data, key):
    with pytest.raises(ConfigError) as ei:
        parse_tailer_config(data, "tailer.yaml")
    assert f"tailer.yaml: {key}" in str(ei.value)


def test_discovery_groups_and_orders_files(tmp_path):
    write(tmp_path / F2, 1)
    write(tmp_path / F1, 1)
    (tmp_path / "notes.txt").write_text("not a log")
    (tmp_path / "Market.Trade.System.ip2.2026-11-22.bin.2026-11-22.080000.000+0000").write_bytes(b"")
    found = scan_dirs([str(tmp_path)], set())
    assert len(found) == 2
    ip1 = next(v for k, v in found.items() if k.internal_partition == "ip1")
    assert [f[1] for f in ip1.files] == [F1, F2]
    assert [f[1] for f in ip1.after(F1)] == [F2]


def test_read_frames_is_frame_aligned_and_waits_on_a_torn_tail(tmp_path):
    p = tmp_path / F1
    end1 = write(p, 10)
    end2 = write(p, 10, 10)
    full = p.read_bytes()
    p.write_bytes(full[: end2 - 5])  # a writer mid-frame
    piece = read_frames(str(p), 0, TRADE, 1 << 20)
    assert piece.offset == 0 and piece.end == end1 and piece.data == full[:end1]
    assert read_frames(str(p), end1, TRADE, 1 << 20).data == b""
    assert complete_end(str(p), TRADE) == end1
    p.write_bytes(full)  # the frame completes
    piece = read_frames(str(p), end1, TRADE, 1 << 20)
    assert (piece.offset, piece.end) == (end1, end2)
    # a chunk limit smaller than a frame still returns that whole frame, alone
    piece = read_frames(str(p), end1, TRADE, 8)
    assert piece.end == end2


class RecordingIngest(dis_pb2_grpc.IngestServicer):
    """An Ingest service that acknowledges slowly and records the most unacknowledged bytes."""

    def __init__(self, ack_delay: float, refuse: set[str] = frozenset()) -> None:
        self.ack_delay = ack_delay
        self.refuse = refuse
        self.max_unacked = 0
        self.chunks: dict[str, list] = {}
        self.lock = threading.Lock()

    def Stream(self, request_iterator, context):  # noqa: N802
        first = next(request_iterator)
        ip = first.open.location.internal_partition
        if ip in self.refuse:
            context.abort(grpc.StatusCode.NOT_FOUND, "unknown table")
        yield dis_pb2.IngestResponse(resume=dis_pb2.ResumePoint())
        pending: list[int] = []
        unacked = 0
        got = self.chunks.setdefault(ip, [])
        for req in request_iterator:
            c = req.chunk
            got.append((c.file_name, c.offset, len(c.data)))
            unacked += len(c.data)
            with self.lock:
                self.max_unacked = max(self.max_unacked, unacked)
            time.sleep(self.ack_delay)
            unacked -= len(c.data)
            yield dis_pb2.IngestResponse(ack=dis_pb2.Ack(file_name=c.file_name, offset=c.offset + len(c.data)))
        del pending


def serve(servicer):
    s = grpc.server(futures.ThreadPoolExecutor(8))
    dis_pb2_grpc.add_IngestServicer_to_server(servicer, s)
    port = s.add_insecure_port("127.0.0.1:0")
    s.start()
    return s, port


def test_backpressure_bounds_unacknowledged_bytes_and_refusals_do_not_stop_others(tmp_path):
    p = tmp_path / F1
    for i in range(40):
        write(p, 2000, i * 2000)
    write(tmp_path / "Market.Trade.System.bad.2026-11-22.bin.2026-11-22.090000.000+0000", 5)
    svc = RecordingIngest(ack_delay=0.01, refuse={"bad"})
    server, port = serve(svc)
    cfg = parse_tailer_config({"dis": f"127.0.0.1:{port}", "log_dirs": [str(tmp_path)],
                               "chunk_bytes": 60_000, "max_in_flight_bytes": 150_000, "retry_refused_ms": 60_000})
    t = Tailer(cfg).start()
    try:
        deadline = time.monotonic() + 60
        size = p.stat().st_size
        while time.monotonic() < deadline:
            chunks = svc.chunks.get("ip1", [])
            if chunks and chunks[-1][1] + chunks[-1][2] == size:
                break
            time.sleep(0.05)
        chunks = svc.chunks["ip1"]
        assert chunks[-1][1] + chunks[-1][2] == size
        # contiguous, frame-aligned chunks from offset 0, each within the chunk limit
        off = 0
        for name, o, n in chunks:
            assert (name, o) == (F1, off)
            off += n
        assert max(n for _, _, n in chunks) <= 60_000 + 60_000
        assert svc.max_unacked <= 150_000 + 60_000, svc.max_unacked
        st = t.status()
        bad = next(v for k, v in st.items() if "/bad/" in k)
        assert bad["state"] == "refused" and "NOT_FOUND" in bad["error"]
    finally:
        t.stop()
        server.stop(0)


def test_reconnects_with_backoff_after_the_server_restarts(tmp_path):
    p = tmp_path / F1
    write(p, 100)
    svc = RecordingIngest(ack_delay=0)
    server, port = serve(svc)
    cfg = parse_tailer_config({"dis": f"127.0.0.1:{port}", "log_dirs": [str(tmp_path)], "max_backoff_ms": 200})
    t = Tailer(cfg).start()
    try:
        deadline = time.monotonic() + 20
        while not svc.chunks.get("ip1") and time.monotonic() < deadline:
            time.sleep(0.02)
        server.stop(0)
        time.sleep(0.5)
        svc2 = RecordingIngest(ack_delay=0)
        s2 = grpc.server(futures.ThreadPoolExecutor(4))
        dis_pb2_grpc.add_IngestServicer_to_server(svc2, s2)
        assert s2.add_insecure_port(f"127.0.0.1:{port}") == port
        s2.start()
        while not svc2.chunks.get("ip1") and time.monotonic() < deadline + 10:
            time.sleep(0.02)
        # the new server answered "resume from the start", so the tailer resends from offset 0
        assert svc2.chunks["ip1"][0][1] == 0
        s2.stop(0)
    finally:
        t.stop()
