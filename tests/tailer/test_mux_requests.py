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
