"""A tailer that has read to the end of a location's files says so on its last chunk
(``caught_up``), and the DIS publishes those rows before acknowledging them, rather than at its
next flush tick: with a one-minute flush interval, rows are still visible within seconds."""

from __future__ import annotations

import time


from disd.client import connect
from disd.tailer import Tailer, parse_tailer_config
from disd.tailer.frames import read_frames
from support import append_rows, log_name, running_dis, wait_for


def test_a_frame_read_to_the_end_of_its_file_is_at_end(tmp_path):
    path = tmp_path / log_name("ip1")
    append_rows(path, 0, 10, frames=2)
    whole = read_frames(str(path), 0, 1 << 20)
    assert whole.data and whole.at_end
    first = read_frames(str(path), 0, len(whole.data) - 1)  # room for the first frame only
    assert first.data and not first.at_end
    rest = read_frames(str(path), first.end, 1 << 20)
    assert rest.at_end and rest.end == whole.end


def test_rows_of_a_caught_up_tailer_are_published_without_waiting_for_the_flush_tick(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    with running_dis(tmp_path / "db", flush_ms=60_000, checkpoint_ms=60_000) as srv:
        cfg = parse_tailer_config({"dis": f"127.0.0.1:{srv.port}", "log_dirs": [str(logs)],
                                   "poll_interval_ms": 50})
        with Tailer(cfg), connect(f"127.0.0.1:{srv.port}") as c:
            def published() -> int:
                return sum(loc.rows for loc in c.locations("Market", "Trade"))

            append_rows(logs / log_name("ip1"), 0, 40)
            t0 = time.monotonic()
            wait_for(lambda: published() == 40, 20, what="the first rows published")
            append_rows(logs / log_name("ip1"), 40, 2)
            wait_for(lambda: published() == 42, 20, what="an append published")
            # far sooner than the one-minute flush tick
            assert time.monotonic() - t0 < 30
