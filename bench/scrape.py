"""Scrape: the cost of one ``/metrics`` scrape of a DIS with many locations, idle and while
threads ingest into those locations.

An in-process ``DisServer`` opens ``--locations`` Market.Trade locations (``open_many``, in
batches), each given a few rows.  Then, idle and again while ``--ingest-threads`` threads
append rows to the locations round-robin (publishing every third append, as a flush would),
``--scrapes`` scrapes are timed two ways: the endpoint's WSGI application called in this thread
with a Prometheus server's request headers (OpenMetrics, gzip), which gives the scrape's own CPU
(``time.thread_time``) and wall time; and a real HTTP GET of ``/metrics`` with the same headers
(wall time only, what Prometheus's ``scrape_timeout`` bounds).  The median of each is reported.

Baseline, same run and same figures: prometheus_client's own ``make_wsgi_app`` serving the
server's registry plus the per-location families as its ``GaugeMetricFamily`` objects (built
from the collector's columns), its CPU per scrape measured the same way (idle).

Why: every location adds about ten series to the page, and Prometheus gives up on a scrape
after ``scrape_timeout`` (10 s by default); a DIS whose scrape takes longer shows ``up == 0``
when it is busiest.

Output: human lines, then one JSON line (``bench/_common.emit``): ``value`` the median CPU
seconds of a scrape (idle), ``baseline`` prometheus_client's, and ``locations``, ``idle_cpu_s``, ``idle_wall_s``,
``idle_http_s``, ``load_cpu_s``, ``load_wall_s``, ``load_http_s``, ``cpu_us_per_location``
(idle), ``page_bytes``, ``loadavg``.

    .venv/bin/python bench/scrape.py [--locations 10000] [--ingest-threads 3] [--scrapes 5]
"""

from __future__ import annotations

import argparse
import io
import os
import pathlib
import statistics
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))

from _common import emit  # noqa: E402
from support import Feeder, start_dis_server, trade_rows  # noqa: E402

from prometheus_client import CollectorRegistry, make_wsgi_app  # noqa: E402
from prometheus_client.core import GaugeMetricFamily  # noqa: E402

from disd.binlog import LocationKey  # noqa: E402
from disd.server.metrics import ServerCollector, server_registry  # noqa: E402

#: what a Prometheus server sends (its default scrape_protocols, and gzip)
PROMETHEUS_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
              "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
}


def build(db_root: pathlib.Path, n: int):  # noqa: ANN201
    """A started in-process DIS with ``n`` locations, each holding 3 published rows."""
    srv = start_dis_server(db_root)
    keys = [LocationKey("Market", "Trade", f"ip{i}", "2026-11-22") for i in range(n)]
    for a in range(0, n, 500):
        srv.engine.open_many([(k, None) for k in keys[a:a + 500]])
    feeder = Feeder(srv)
    rows = trade_rows(0, 3, nulls=True)
    for k in keys:
        feeder.append(k, rows)
    return srv, keys, feeder


def render_once(app) -> tuple[float, float, int]:  # noqa: ANN001
    """CPU and wall seconds of the endpoint's application answering one Prometheus request in
    this thread, and the (compressed) page's bytes."""
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": "",
               "HTTP_ACCEPT": PROMETHEUS_HEADERS["Accept"], "HTTP_ACCEPT_ENCODING": "gzip",
               "wsgi.input": io.BytesIO(), "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "0",
               "wsgi.url_scheme": "http"}
    c0, w0 = time.thread_time(), time.perf_counter()
    body = b"".join(app(environ, lambda status, headers, exc_info=None: None))
    return time.thread_time() - c0, time.perf_counter() - w0, len(body)


def http_once(port: int) -> tuple[float, int]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=PROMETHEUS_HEADERS)
    w0 = time.perf_counter()
    body = urllib.request.urlopen(req, timeout=60).read()
    return time.perf_counter() - w0, len(body)


class AsPrometheusClientObjects:
    """The per-location families of ``collector`` as prometheus_client's metric objects."""

    def __init__(self, collector: ServerCollector) -> None:
        self.collector = collector

    def collect(self):  # noqa: ANN201
        locations = self.collector.engine.open_locations()
        series = self.collector.series(locations)
        for col in self.collector.columns(locations, series, time.time()):
            fam = GaugeMetricFamily(col.name, col.help, labels=["table", "location"])
            for s, v in zip(series, col.values):
                if v is not None:
                    fam.add_metric([s.table, s.location], v)
            yield fam


def baseline_cpu(srv, scrapes: int) -> float:  # noqa: ANN001
    """Median CPU seconds of prometheus_client's own endpoint serving the same figures."""
    collector = ServerCollector(srv.engine, srv.sessions, str(srv.config.db_root), srv.tabledata)
    registry = server_registry(collector)
    everything = CollectorRegistry(auto_describe=False)
    everything.register(registry)
    everything.register(AsPrometheusClientObjects(collector))
    app = make_wsgi_app(everything)
    return statistics.median(render_once(app)[0] for _ in range(scrapes))


def measure(srv, scrapes: int) -> dict:  # noqa: ANN001
    app = srv._metrics_server.get_app()  # noqa: SLF001 - the endpoint's own application, run in this thread
    cpu, wall, http = [], [], []
    size = 0
    for _ in range(scrapes):
        c, w, _size = render_once(app)
        cpu.append(c)
        wall.append(w)
        h, size = http_once(srv.metrics_port)
        http.append(h)
    return {"cpu_s": statistics.median(cpu), "wall_s": statistics.median(wall), "http_s": statistics.median(http),
            "http_max_s": max(http), "page_bytes": size}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--locations", type=int, default=10_000)
    ap.add_argument("--ingest-threads", type=int, default=3)
    ap.add_argument("--scrapes", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dis-scrape-") as tmp:
        t0 = time.perf_counter()
        srv, keys, feeder = build(pathlib.Path(tmp) / "db", args.locations)
        print(f"{args.locations} locations made in {time.perf_counter() - t0:.1f} s", flush=True)
        try:
            idle = measure(srv, args.scrapes)
            base = baseline_cpu(srv, args.scrapes)
            print(f"baseline, prometheus_client's endpoint over the same figures: cpu {base:.3f} s", flush=True)
            print(f"idle:  cpu {idle['cpu_s']:.3f} s, wall {idle['wall_s']:.3f} s, HTTP {idle['http_s']:.3f} s "
                  f"(max {idle['http_max_s']:.3f} s), {idle['page_bytes']} bytes gzipped", flush=True)
            stop = threading.Event()
            appended = [0] * args.ingest_threads

            def ingest(j: int) -> None:
                rows = trade_rows(0, 5, nulls=True)
                mine = keys[j::args.ingest_threads]
                i = 0
                while not stop.is_set():
                    feeder.append(mine[i % len(mine)], rows, publish=i % 3 == 0)
                    i += 1
                appended[j] = i

            threads = [threading.Thread(target=ingest, args=(j,), daemon=True) for j in range(args.ingest_threads)]
            for t in threads:
                t.start()
            time.sleep(1.0)
            load = measure(srv, args.scrapes)
            loadavg = os.getloadavg()[0]
            stop.set()
            for t in threads:
                t.join()
            print(f"under ingestion ({args.ingest_threads} threads, {sum(appended)} appends): cpu {load['cpu_s']:.3f} s, "
                  f"wall {load['wall_s']:.3f} s, HTTP {load['http_s']:.3f} s (max {load['http_max_s']:.3f} s), "
                  f"load average {loadavg:.2f}", flush=True)
        finally:
            srv.stop(0.5)
    emit("scrape", idle["cpu_s"], "s", base, locations=args.locations, idle_cpu_s=idle["cpu_s"],
         idle_wall_s=idle["wall_s"], idle_http_s=idle["http_s"], load_cpu_s=load["cpu_s"], load_wall_s=load["wall_s"],
         load_http_s=load["http_s"], cpu_us_per_location=idle["cpu_s"] / args.locations * 1e6,
         page_bytes=idle["page_bytes"], loadavg=loadavg)


if __name__ == "__main__":
    main()
