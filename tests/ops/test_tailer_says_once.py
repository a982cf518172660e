"""What a tailer cannot fix, it says once and retries slowly, with ``dis serve``, ``dis proxy`` and
``dis-tailer`` processes: a tailer pointed at a proxy (which serves readers, not Ingest) says at
error, once, that the address is not a DIS, shows it in its status and metrics, retries every
``retry_refused_ms`` and streams once a DIS takes the address over; a location the DIS holds in
error is retried with a backoff that grows to ``retry_refused_ms``, said at warning once on each
side."""

from __future__ import annotations

import json
import time

import pytest

from disd.tailer import Tailer, parse_tailer_config
from proxy.proxy_support import start_proxy, write_proxy_config
from support import (append_rows, by_label, free_port, log_name, sample, scrape, start_dis_process, start_tailer,
                     wait_for, write_dis_config, write_tailer_config)

pytestmark = pytest.mark.slow

LOC = "Market/Trade/ip1/2026-11-22"
OWN = "Market/Trade/ip3/2026-11-22"


def events(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_a_tailer_pointed_at_a_proxy_says_once_that_it_is_no_dis_and_streams_once_a_dis_is_there(tmp_path):
    dis_port = free_port()
    dis = start_dis_process(tmp_path, write_dis_config(tmp_path, dis_port))
    proxy_cfg, proxy_port = write_proxy_config(tmp_path, {"address": f"127.0.0.1:{dis_port}"})
    proxy = start_proxy(tmp_path, proxy_cfg)
    logs = tmp_path / "logs"
    logs.mkdir()
    append_rows(logs / log_name("ip1"), 0, 9, frames=3)
    append_rows(logs / log_name("ip2"), 0, 5)
    address = f"127.0.0.1:{proxy_port}"
    tailer_metrics = free_port()
    tailer = start_tailer(tmp_path, write_tailer_config(tmp_path, proxy_port, logs, retry_refused_ms=3000,
                                                        max_backoff_ms=200, metrics_port=tailer_metrics))
    # the same, in this process, for its status() (a location of its own)
    own = tmp_path / "own-logs"
    own.mkdir()
    append_rows(own / log_name("ip3"), 0, 9, frames=3)
    inproc = Tailer(parse_tailer_config({"dis": address, "log_dirs": [str(own)], "retry_refused_ms": 3000,
                                         "max_backoff_ms": 200}, "tailer.yaml")).start()
    later = None
    try:
        time.sleep(8)  # two locations, two retry periods and more
        st = inproc.status()[OWN]
        assert st["state"] == "refused", st
        assert st["error"].startswith(f"{address} is not a DIS: it does not serve the Ingest service"), st
        assert "dis proxy" in st["error"] and st["problem"] == st["error"], st
        said = [e for e in events(tailer.log_text()) if e["level"] in ("warning", "error")]
        errors = [e for e in said if e["level"] == "error"]
        assert len(errors) == 1 and errors[0]["dis"] == address and "not a DIS" in errors[0]["event"], said
        # at most the one line that Multiplex is not served, and none per retry
        assert len(said) <= 2, said
        s = scrape(tailer_metrics)
        attempts = sample(s, "dis_tailer_refusals_total", code="UNIMPLEMENTED")
        assert 2 <= attempts <= 8, attempts  # 2 locations, every 3 s, for 8 s
        assert sample(s, "dis_tailer_replica_connected", address=address) == 0

        # a DIS takes the address over: the tailer streams to it within the retry period
        assert proxy.terminate() == 0
        later_dir = tmp_path / "later"
        later_dir.mkdir()
        later = start_dis_process(later_dir, write_dis_config(later_dir, proxy_port))
        wait_for(lambda: inproc.status()[OWN]["state"] in ("following", "streaming") and inproc.status()[OWN][
            "committed_rows"] == 9, 15, 0.2, "the rows streamed to the DIS now at the address")
        assert inproc.status()[OWN]["problem"] is None
        wait_for(lambda: sample(scrape(tailer_metrics), "dis_tailer_acked_bytes_total") > 0, 15, 0.2,
                 "the tailer process streaming too")
    finally:
        inproc.stop()
        assert tailer.terminate() == 0
        if proxy.alive():
            proxy.terminate()
        if later is not None:
            later.terminate()
        dis.terminate()


def test_a_location_in_error_is_retried_with_a_growing_backoff_and_said_once_on_each_side(tmp_path):
    # a location whose table.size is garbage: the DIS opens it in error, and refuses its streams
    bad = tmp_path / "db/Intraday/Market/Trade/ip1/2026-11-22/Trade"
    bad.mkdir(parents=True)
    (bad / "table.size").write_bytes(b"not a checkpoint")
    port, dis_metrics = free_port(), free_port()
    dis = start_dis_process(tmp_path, write_dis_config(tmp_path, port, dis_metrics))
    logs = tmp_path / "logs"
    logs.mkdir()
    append_rows(logs / log_name("ip1"), 0, 9, frames=3)
    append_rows(logs / log_name("ip2"), 0, 5)  # another location goes on
    tailer = start_tailer(tmp_path, write_tailer_config(tmp_path, port, logs, retry_refused_ms=6000,
                                                        max_backoff_ms=200))
    try:
        t0 = time.monotonic()
        wait_for(lambda: by_label(scrape(dis_metrics), "dis_location_rows").get("Market/Trade/ip2/2026-11-22") == 5,
                 30, 0.2, "the other location's rows")
        time.sleep(max(0.0, 14 - (time.monotonic() - t0)))
        # with a backoff capped at max_backoff_ms (0.2 s) this would be about 70 attempts
        attempts = sample(scrape(dis_metrics), "dis_ingest_rejections_total", code="UNAVAILABLE")
        assert 3 <= attempts <= 10, attempts
        dis_said = [e for e in events(dis.log_text()) if e["event"].startswith("ingest refused")]
        assert [e["level"] for e in dis_said] == ["warning"], dis_said
        assert dis_said[0]["location"] == LOC and " is in error: " in dis_said[0]["details"]
        tailer_said = [e for e in events(tailer.log_text()) if e.get("location") == LOC and e["level"] != "debug"
                       and e["event"] != "new location"]
        assert [e["level"] for e in tailer_said][:1] == ["warning"], tailer_said
        assert {e["level"] for e in tailer_said[1:]} <= {"info"}, tailer_said
        assert "is in error" in tailer_said[0]["error"]
    finally:
        tailer_rc = tailer.terminate()
        dis_rc = dis.terminate()
    assert tailer_rc == 0 and dis_rc == 0
