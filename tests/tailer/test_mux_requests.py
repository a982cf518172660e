"""How the tailer cuts a location's stream into ``Multiplex`` requests, seen by a real DIS: a
request carries at most half of a stream's window, so a stream whose window is full has a
request on its way while the DIS takes the other (``disd.tailer.muxcall.request_limit``)."""

from __future__ import annotations

from disd.client import connect
from disd.rpc.ingestwire import ChunkView, parse_mux_request
from disd.server import ingestmux
from disd.tailer import Tailer, parse_tailer_config
from support import append_rows, log_name, running_dis, wait_for


def test_a_request_carries_at_most_half_a_streams_window(tmp_path, monkeypatch):
    requests: list[int] = []  # the chunk bytes of each request the DIS received

    def parse(raw: bytes):
        frames = parse_mux_request(raw)
        requests.append(sum(len(body.data) for _, body in frames if type(body) is ChunkView))
        return frames

    monkeypatch.setattr(ingestmux, "parse_mux_request", parse)
    logs = tmp_path / "logs"
    logs.mkdir()
    size = append_rows(logs / log_name("ip1"), 0, 30_000, frames=100)  # the whole log there at the start
    window = 128 << 10
    with running_dis(tmp_path / "db") as srv:
        cfg = parse_tailer_config({"dis": f"127.0.0.1:{srv.port}", "log_dirs": [str(logs)], "poll_interval_ms": 50,
                                   "chunk_bytes": window // 2, "max_in_flight_bytes": window}, "tailer.yaml")
        with Tailer(cfg), connect(f"127.0.0.1:{srv.port}") as c:
            wait_for(lambda: sum(loc.rows for loc in c.locations("Market", "Trade")) == 30_000, 30,
                     what="every row published")
    assert sum(requests) == size
    assert max(requests) <= window // 2, sorted(requests)[-5:]


def test_a_large_chunk_is_written_before_the_next_one_is_read(tmp_path, monkeypatch):
    """A location that has a backlog reads its next piece only after its writer has taken the
    piece before: the request goes out while the next piece is read, not after (at a burst's
    start, a stream's first request waited for its whole window to be read)."""
    from disd.tailer import frames, muxcall

    events: list[tuple[str, int]] = []  # ("read", offset) and ("write", chunk bytes), in order
    read = frames.FrameReader.read

    def recorded_read(self, offset: int, max_bytes: int):  # noqa: ANN001, ANN202
        piece = read(self, offset, max_bytes)
        if piece.data:
            events.append(("read", offset))
        return piece

    encode = muxcall.encode_mux_request

    def recorded_encode(batch):  # noqa: ANN001, ANN202
        n = sum(len(body.data) for _, body in batch if hasattr(body, "data"))
        if n:
            events.append(("write", n))
        return encode(batch)

    monkeypatch.setattr(frames.FrameReader, "read", recorded_read)
    monkeypatch.setattr(muxcall, "encode_mux_request", recorded_encode)
    logs = tmp_path / "logs"
    logs.mkdir()
    append_rows(logs / log_name("ip1"), 0, 200_000, frames=200)  # about 6 MB, the whole log there at the start
    chunk = 1 << 20
    with running_dis(tmp_path / "db") as srv:
        cfg = parse_tailer_config({"dis": f"127.0.0.1:{srv.port}", "log_dirs": [str(logs)], "poll_interval_ms": 50,
                                   "chunk_bytes": chunk, "max_in_flight_bytes": 4 * chunk}, "tailer.yaml")
        with Tailer(cfg), connect(f"127.0.0.1:{srv.port}") as c:
            wait_for(lambda: sum(loc.rows for loc in c.locations("Market", "Trade")) == 200_000, 30,
                     what="every row published")
    reads = [i for i, (what, _) in enumerate(events) if what == "read"]
    writes = [i for i, (what, _) in enumerate(events) if what == "write"]
    assert len(reads) >= 4, events
    assert writes[0] < reads[1], events  # the first chunk went out before the second was read


def test_the_tailer_connects_to_its_dis_before_any_location_appears(tmp_path):
    """A tailer connects to every DIS of its routing when it starts, not when its first location
    appears: a burst into a running tailer does not wait for the connection (nor for the process's
    first channel, which sets up gRPC's event engine) before its first request."""
    import psutil

    logs = tmp_path / "logs"
    logs.mkdir()  # empty: no location to stream
    with running_dis(tmp_path / "db") as srv:
        cfg = parse_tailer_config({"dis": f"127.0.0.1:{srv.port}", "log_dirs": [str(logs)]}, "tailer.yaml")
        with Tailer(cfg) as tailer:
            def connected() -> bool:
                return any(c.raddr and c.raddr.port == srv.port and c.status == psutil.CONN_ESTABLISHED
                           for c in psutil.Process().net_connections("tcp"))

            wait_for(connected, 10, what="a connection from the tailer to its DIS")
            assert not tailer.workers()  # no location yet


def test_a_tailer_whose_certificate_cannot_be_read_yet_still_starts(tmp_path):
    """Connecting at start must not turn a certificate file that cannot be read (yet) into a
    tailer that does not start: its streams report and retry it, as they did before."""
    logs = tmp_path / "logs"
    logs.mkdir()
    ca = tmp_path / "ca.pem"
    ca.write_text("")
    cfg = parse_tailer_config({"dis": "127.0.0.1:1", "log_dirs": [str(logs)], "tls": {"ca": str(ca)}}, "tailer.yaml")
    ca.unlink()  # gone between the configuration's check and the start (being replaced)
    with Tailer(cfg) as tailer:
        assert tailer.responsive(5)
