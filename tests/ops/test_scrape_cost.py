"""A ``/metrics`` scrape of a DIS with thousands of locations: the same series as prometheus_client's
own rendering of the collector's figures, at a bounded CPU cost per location, without walking
the disk.

Why: Prometheus gives up on a scrape after ``scrape_timeout`` (10 s by default) and the DIS then
shows ``up == 0``.  At 10,000 locations a scrape rendered by prometheus_client took 0.9 s of CPU
on an idle machine and seconds under ingest load, and one that found a walk of the disk due
waited for it (seconds under ingest load).
"""

from __future__ import annotations

import gzip
import io
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from disd.binlog import LocationKey
from disd.config import parse_dis_config
from disd.server.daemon import DisServer
from disd.server.ingestsessions import Session
from support import Feeder, dis_settings, start_dis_server, trade_rows

pytestmark = pytest.mark.slow

TRADES, QUOTES = 1500, 500
#: the bound on a scrape's CPU per location; prometheus_client's rendering took 70-90 us
CPU_US_PER_LOCATION = 30.0
#: families whose values are ages, computed at the instant of each rendering
AGES = {"dis_flush_age_seconds", "dis_checkpoint_age_seconds"}
PER_LOCATION = {
    "dis_location_tailer_connected", "dis_location_tailer_problem", "dis_location_rows",
    "dis_location_checkpointed_rows", "dis_location_in_error", "dis_location_schema_version",
    "dis_flush_age_seconds", "dis_checkpoint_age_seconds", "dis_checkpoint_interval_seconds",
    "dis_lastby_keys", "dis_lastby_state_bytes", "dis_lastby_rows",
}
COMPARED = PER_LOCATION | {"dis_locations", "dis_partitions_in_error", "dis_connected_tailers"}
OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


def _never_ended(code, details) -> None:  # noqa: ANN001 - an EndStream no test stream needs
    pass


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """A DIS with 1,500 Market.Trade locations (a last-by state each, one in ten with rows, one
    in twenty checkpointed, one in error) and 500 Market.Quote ones (another checkpoint interval,
    no last-by), ingest streams open to some and problems reported by some.  Its checkpoint clock
    is an hour: the figures hold still between two renderings."""
    settings = dis_settings(tmp_path_factory.mktemp("scrape") / "db", checkpoint_ms=3_600_000)  # checkpoints: the test's
    settings["import"]["tables"] = {"Market.Trade": {"last_by": ["Sym"]},
                                    "Market.Quote": {"checkpoint_interval_ms": 7_250_000}}
    srv = DisServer(parse_dis_config(settings, "<test>"))
    srv.start()
    trades = [LocationKey("Market", "Trade", f"ip{i}", "2026-11-22") for i in range(TRADES)]
    quotes = [LocationKey("Market", "Quote", f"ip{i}", "2026-11-22") for i in range(QUOTES)]
    keys = trades + quotes
    for a in range(0, len(keys), 500):
        srv.engine.open_many([(k, None) for k in keys[a:a + 500]])
    feeder = Feeder(srv)
    for i, k in enumerate(trades[::10]):
        feeder.append(k, trade_rows(0, 3 + i % 7, nulls=True))
        if i % 2:
            srv.engine.location(k).checkpoint()
    srv.engine.location(trades[-1])._fail("an error the test put it in")  # noqa: SLF001 - no public way to fail a location
    for i, k in enumerate(keys[::37]):
        s = Session(k, f"tailer{i}", "ipv4:127.0.0.1:1", _never_ended)
        srv.sessions.add(s)
        if i % 3 == 0:
            srv.sessions.report(s, f"problem {i} with \"quotes\" and \\ backslash")
    yield srv
    srv.stop(0.5)


def reference_page(srv: DisServer) -> str:
    """What the collector rendered through prometheus_client's objects produced: the same
    figures, one ``GaugeMetricFamily`` sample per location and gauge, written by
    ``generate_latest``."""
    lbl = ["table", "location"]
    fams = {name: GaugeMetricFamily(name, "", labels=lbl) for name in sorted(PER_LOCATION)}
    sessions = srv.sessions.sessions()
    with_tailer = {s.key for s in sessions}
    problems = srv.sessions.problems()
    now = time.time()
    locations = srv.engine.locations()
    for loc in locations:
        labels = [loc.key.table_key, str(loc.key)]
        fams["dis_location_tailer_connected"].add_metric(labels, 1.0 if loc.key in with_tailer else 0.0)
        fams["dis_location_tailer_problem"].add_metric(labels, 1.0 if loc.key in problems else 0.0)
        fams["dis_location_rows"].add_metric(labels, loc.published_rows)
        fams["dis_location_checkpointed_rows"].add_metric(labels, loc.checkpointed_rows)
        fams["dis_location_in_error"].add_metric(labels, 1.0 if loc.in_error else 0.0)
        fams["dis_location_schema_version"].add_metric(labels, loc.schema_version)
        fa = srv.engine.flush_age(loc, now)
        if fa is not None:
            fams["dis_flush_age_seconds"].add_metric(labels, fa)
        if loc.last_checkpoint_time:
            fams["dis_checkpoint_age_seconds"].add_metric(labels, max(0.0, now - loc.last_checkpoint_time))
        fams["dis_checkpoint_interval_seconds"].add_metric(
            labels, srv.engine.import_config(loc.key.table_key).checkpoint_interval_ms / 1000.0)
        if loc.lastby is not None:
            s = loc.lastby.snapshot()
            fams["dis_lastby_keys"].add_metric(labels, len(s.table))
            fams["dis_lastby_state_bytes"].add_metric(labels, s.nbytes)
            fams["dis_lastby_rows"].add_metric(labels, s.rows)
    server = {"dis_locations": len(locations), "dis_partitions_in_error": sum(loc.in_error for loc in locations),
              "dis_connected_tailers": len(sessions)}
    for name, value in server.items():
        fams[name] = GaugeMetricFamily(name, "")
        fams[name].add_metric([], value)

    class Reference:
        def collect(self):  # noqa: ANN202
            return fams.values()

    reg = CollectorRegistry(auto_describe=False)
    reg.register(Reference())
    return generate_latest(reg).decode()


def meaning(families, with_help: bool = True) -> dict:
    """Each compared family's type (and help) and its samples' values by name and labels."""
    out = {}
    for fam in families:
        if fam.name in COMPARED:
            samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in fam.samples}
            out[fam.name] = (fam.type, fam.documentation if with_help else None, samples)
    return out


def assert_same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for name, (typ, _doc, samples) in want.items():
        assert got[name][0] == typ, name
        assert got[name][2].keys() == samples.keys(), name
        if name in AGES:  # rendered a moment apart
            assert all(abs(got[name][2][k] - v) < 5.0 for k, v in samples.items()), name
        else:
            assert got[name][2] == samples, name


def get(port: int, accept: str | None = None, query: str = "") -> str:
    headers = {"Accept-Encoding": "gzip"} | ({"Accept": accept} if accept else {})
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics{query}", headers=headers)
    with urllib.request.urlopen(req, timeout=30) as r:
        body = r.read()
        if r.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
    return body.decode()


def test_a_scrape_has_the_series_prometheus_client_renders_in_both_formats(many):
    want = meaning(parse_text(reference_page(many)), with_help=False)
    assert len(want["dis_location_rows"][2]) == TRADES + QUOTES
    assert len(want["dis_lastby_keys"][2]) == TRADES  # a family without a series for some locations
    assert sum(want["dis_location_in_error"][2].values()) == 1 and sum(want["dis_location_tailer_problem"][2].values()) > 1
    text = get(many.metrics_port)
    openmetrics = get(many.metrics_port, OPENMETRICS)
    assert openmetrics.endswith("# EOF\n") and openmetrics.count("# EOF") == 1
    for page, parse in ((text, parse_text), (openmetrics, parse_openmetrics)):
        got = meaning(parse(page))
        assert_same({k: (t, None, s) for k, (t, _d, s) in got.items()}, want)
        # each family's help is the collector's, the same in both formats
        assert got["dis_location_rows"][1] == "Published rows of the location"
        assert got["dis_flush_age_seconds"][1].startswith("Seconds the location's published rows have been behind")
    # a scrape's name[] filter keeps to the per-location families named
    only = {f.name for f in parse_text(get(many.metrics_port, query="?name[]=dis_location_rows&name[]=dis_lastby_keys"))}
    assert only & PER_LOCATION == {"dis_location_rows", "dis_lastby_keys"}


def test_a_scrape_costs_little_cpu_per_location(many):
    app = many._metrics_server.get_app()  # noqa: SLF001 - the endpoint's own application, run in this thread
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": "", "HTTP_ACCEPT": OPENMETRICS,
               "HTTP_ACCEPT_ENCODING": "gzip", "wsgi.input": io.BytesIO()}
    cpu = []
    for _ in range(3):
        c0 = time.thread_time()
        body = b"".join(app(environ, lambda status, headers, exc_info=None: None))
        cpu.append(time.thread_time() - c0)
        assert len(gzip.decompress(body)) > (TRADES + QUOTES) * 9 * 60
    per_location_us = min(cpu) / (TRADES + QUOTES) * 1e6
    assert per_location_us < CPU_US_PER_LOCATION, f"{per_location_us:.1f} us of CPU per location a scrape"


def test_a_scrape_never_waits_for_a_walk_of_the_disk(tmp_path, monkeypatch):
    """Finding new locations on disk walks every location's directory: under ingest load at
    10,000 locations that took seconds, which a scrape must not wait for (listings and status
    do the walk)."""
    srv = start_dis_server(tmp_path / "db")
    try:
        srv.engine.location(LocationKey("Market", "Trade", "ip", "2026-11-22"))
        walks = []

        def slow_walk():  # noqa: ANN202
            walks.append(time.monotonic())
            time.sleep(3.0)
            return []

        monkeypatch.setattr(srv.engine, "_scan", slow_walk)
        time.sleep(1.1)  # any walk before is at least SCAN_EVERY_S ago: the next is due
        t0 = time.monotonic()
        page = get(srv.metrics_port)
        took = time.monotonic() - t0
        assert 'dis_location_rows{location="Market/Trade/ip/2026-11-22",table="Market.Trade"} 0' in page
        assert walks == [] and took < 2.0
        assert len(srv.engine.locations()) == 1 and len(walks) == 1  # a listing still walks
    finally:
        srv.stop(0.5)


def test_a_restarted_dis_reports_the_locations_on_disk_without_a_listing(tmp_path):
    """A scrape reports the open locations only; a DIS that starts over a database still reports
    every location it holds within seconds, with no tailer, reader or listing touching them
    (its engine walks the disk on a thread of its own)."""
    from support import running_dis, scrape, wait_for
    from support.metrics import by_label

    keys = [LocationKey("Market", "Trade", f"ip{i}", "2026-11-22") for i in range(3)]
    with running_dis(tmp_path / "db") as srv:
        feeder = Feeder(srv)
        for i, k in enumerate(keys):
            feeder.append(k, trade_rows(0, 5 + i))
            srv.engine.location(k).checkpoint()
    with running_dis(tmp_path / "db") as srv:
        want = {f"{k.namespace}/{k.table}/{k.internal_partition}/{k.column_partition}": 5.0 + i
                for i, k in enumerate(keys)}
        got = wait_for(lambda: (lambda r: r if r == want else None)(
            by_label(scrape(srv.metrics_port), "dis_location_rows")), 10, 0.2, "every location on disk scraped")
        assert got == want
