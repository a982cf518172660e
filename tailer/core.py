"""The tailer: finds binary logs, and streams each location's files to the DIS that owns it (to
every replica of its routing entry, when the entry names a replica set).

One scanner thread watches the log directories (inotify when the kernel offers it, else polling
every ``poll_interval_ms``) and keeps, per location, its files ordered by time stamp.  Each
location gets a ``LocationWorker`` thread (``disd.tailer.stream``) per replica of its entry, each
holding its own Ingest stream from that replica's resume point: a replica that is down or slow
holds back only its own workers, and catches up from the files on disk when it comes back.  The
streams themselves run on one event-loop thread (``open_session``): by default every stream to
one DIS is a numbered stream of one ``Multiplex`` call (``stream_runtime: multiplexed``;
``disd.tailer.muxsession``), so the DIS serves a tailer with one thread and many locations' writes
travel in one message; ``asyncio`` gives each stream a ``Stream`` call of its own on that loop
(``disd.tailer.aiosession``); either way a location costs one thread, its worker, instead of
three with the synchronous API (``stream_runtime: threads``: gRPC's request sender and an ack
reader per stream, on a shared synchronous ``channel``).
CSV files of ``csv_tables`` are transcoded into spool logs by one more thread
(``disd.tailer.csvfeed``); the spool directory is streamed like the log directories.  With
``retention`` configured, one more thread (``disd.tailer.retention``) deletes or moves the logs
the DIS checkpoint covers.  With ``metrics_port``, a Prometheus endpoint serves the tailer's own
series (``disd.tailer.metrics``).

Programmatic use (tests, ``dis demo``)::

    t = Tailer(parse_tailer_config({"dis": "127.0.0.1:22021", "log_dirs": ["var/logs"]})).start()
    t.wait_idle(30)      # every complete frame known so far is acknowledged by the DIS
    t.status()           # per location: file, sent_offset, acked_offset, state, ..., replicas
    t.replica_status()   # per replica: address, connected, bytes_behind, locations
    t.stop()
"""

from __future__ import annotations

import os
import socket
import threading
import time

import grpc
import structlog

from disd.binlog import LogFileName
from disd.names import LocationKey
from disd.rpc.channel import open_channel
from disd.tailer.config import TailerConfig
from disd.tailer.csvfeed import CsvTranscoder
from disd.tailer.retention import LogRetention
from disd.tailer.aiosession import AioIngestSession, StreamLoop
from disd.tailer.muxsession import Multiplexer, MuxIngestSession
from disd.tailer.session import IngestSession, StreamBroken
from disd.tailer.stream import LocationWorker
from disd.tailer.watch import DirectoryWatcher, LocationFiles, Scan, Skipped, scan_dirs

log = structlog.get_logger("disd.tailer")

#: One open Ingest stream, whichever ``stream_runtime`` runs it (the same methods either way).
Session = IngestSession | AioIngestSession | MuxIngestSession

#: With inotify, directories are still rescanned this often (events can be missed: NFS, overflow).
INOTIFY_RESCAN_S = 2.0
#: At most this many location workers of a tailer run at once; the others wait for a turn,
#: asleep.  A worker holds its turn while it reads and sends, never while it waits (for rows, an
#: ack, a resume point, a backoff).  Why: a tick that appends to thousands of locations woke
#: thousands of worker threads at once, all runnable, and the event-loop thread that writes
#: their chunks and reads their acks waited for the interpreter behind hundreds of them (a
#: tailer at 867 runnable threads, acks minutes late, at 10,000 locations; docs/benchmarks.md).
WORKER_TURNS = 16
#: With inotify, an idle worker looks again this often unless woken (a safety net under the
#: rescans' own, which wake the workers of files that changed).
INOTIFY_IDLE_POLL_S = 30.0
#: The shared channels' first reconnect delay after a DIS went away (milliseconds).
INITIAL_RECONNECT_MS = 100


class Tailer:
    def __init__(self, config: TailerConfig, *, use_inotify: bool = True) -> None:
        self.config = config
        self.tailer_id = f"{socket.gethostname()}:{os.getpid()}"
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._scan_lock = threading.Lock()
        self._files: dict[LocationKey, LocationFiles] = {}
        self._last_scan = Scan({}, {})
        # per location, its workers in the routing's replica order (one per replica)
        self._workers: dict[LocationKey, list[LocationWorker]] = {}
        self._reported: set[str] = set()
        self._scanner: threading.Thread | None = None
        self._channels: dict[str, grpc.Channel] = {}  # per DIS address: the one all its workers use
        self._streams: StreamLoop | None = None  # stream_runtime asyncio, multiplexed: the loop of every stream
        self._muxes: dict[str, Multiplexer] = {}  # multiplexed: per DIS address, its current call
        self._no_mux: set[str] = set()  # addresses whose DIS does not know Multiplex
        self._not_dis: set[str] = set()  # addresses found serving no Ingest at all (a proxy?)
        self._started = False
        self._metrics_server = None
        self.metrics_port: int | None = None  # the endpoint's port once started (metrics_port 0: any)
        self.watcher = DirectoryWatcher(use_inotify)
        self._idle_poll_s = config.poll_interval_ms / 1000  # until the first rescan (``_watch``)
        self.turns = threading.BoundedSemaphore(WORKER_TURNS)  # see WORKER_TURNS
        self.csv: CsvTranscoder | None = None
        self.dirs = list(config.log_dirs)
        self.retention: LogRetention | None = None
        if config.retention is not None:
            self.retention = LogRetention(self, config.retention, self._halt)
        if config.csv_tables:
            self.csv = CsvTranscoder(config.csv_tables, config.state_dir, config.torn_tail_grace_ms / 1000,
                                     config.poll_interval_ms / 1000, self._halt)
            self.csv.on_spool = self._spool_grew
            self.dirs.append(self.csv.spool_dir)

    def channel(self, address: str) -> grpc.Channel:
        """The channel every worker streaming to ``address`` uses (opened on first use, closed
        at ``stop``).  Its reconnect backoff starts at ``INITIAL_RECONNECT_MS`` and is capped at
        ``max_backoff_ms``, as a worker's own: a DIS that restarts is reconnected to as soon as
        a fresh channel per attempt would."""
        with self._lock:
            ch = self._channels.get(address)
            if ch is None:
                if self._halt.is_set():  # stop closed the channels: none is opened after it
                    raise StreamBroken("the tailer is stopping")
                ch = self._channels[address] = open_channel(address, self.config.security,
                                                            self._reconnect_options())
            return ch

    def _reconnect_options(self) -> tuple[tuple[str, object], ...]:
        cap = max(INITIAL_RECONNECT_MS, self.config.max_backoff_ms)
        return (("grpc.initial_reconnect_backoff_ms", INITIAL_RECONNECT_MS),
                ("grpc.min_reconnect_backoff_ms", INITIAL_RECONNECT_MS),
                ("grpc.max_reconnect_backoff_ms", cap))

    def open_session(self, address: str, on_ack) -> Session:  # noqa: ANN001 - LocationWorker._on_ack
        """A new Ingest stream to ``address`` for one worker, run as ``stream_runtime`` says: one of
        the streams of the tailer's ``Multiplex`` call to that DIS (``multiplexed``; a DIS that
        does not know the call gets a call per stream instead), a call of its own as a coroutine
        of the tailer's one event loop (``asyncio``: the worker is the location's only thread),
        or the synchronous API on the shared channel (``threads``: two more threads)."""
        runtime = self.config.stream_runtime
        if runtime == "threads":
            return IngestSession(self.channel(address), self.config.max_in_flight_bytes, self._halt, on_ack)
        with self._lock:
            if self._streams is None:
                if self._halt.is_set():
                    raise StreamBroken("the tailer is stopping")
                self._streams = StreamLoop(self.config.security, self._reconnect_options())
            streams = self._streams
            mux = None
            if runtime == "multiplexed" and address not in self._no_mux:
                mux = self._muxes.get(address)
                if mux is not None and mux.broken is not None:
                    if mux.unimplemented:
                        log.warning("the address takes no multiplexed streams (a DIS of an older release?): "
                                    "a call per location instead", dis=address)
                        self._no_mux.add(address)
                    mux = None
                    del self._muxes[address]
                if mux is None and address not in self._no_mux:
                    mux = self._muxes[address] = Multiplexer(streams, address)
        if mux is not None:
            return MuxIngestSession(mux, self.config.max_in_flight_bytes, self._halt, on_ack)
        return AioIngestSession(streams, address, self.config.max_in_flight_bytes, self._halt, on_ack)

    def not_a_dis(self, address: str) -> bool:
        """A worker found that ``address`` serves no Ingest service; True for the first worker to
        find it (since the address last served one), which says so at error level: one line per
        address, not one per location and retry."""
        with self._lock:
            first = address not in self._not_dis
            self._not_dis.add(address)
        return first

    def is_a_dis(self, address: str) -> None:
        """A stream to ``address`` got its resume point: if it was found to be no DIS before, it is
        one now (its next streams try ``Multiplex`` again)."""
        if address not in self._not_dis:  # the common case, without the lock
            return
        with self._lock:
            if address not in self._not_dis:
                return
            self._not_dis.discard(address)
            self._no_mux.discard(address)
        log.info("the address serves the Ingest service now", dis=address)

    # -- discovery ---------------------------------------------------------------------------

    def locations(self) -> list[LocationKey]:
        """The locations that have log files, as of the last scan."""
        with self._lock:
            return list(self._files)

    def workers(self) -> list[LocationWorker]:
        """Every worker: one per (location, replica)."""
        with self._lock:
            return [w for ws in self._workers.values() for w in ws]

    def locations_streamed(self) -> list[LocationKey]:
        """The locations that have workers (every location found since the start)."""
        with self._lock:
            return list(self._workers)

    def workers_of(self, key: LocationKey) -> list[LocationWorker]:
        """The workers of one location, one per replica, in the routing's order."""
        with self._lock:
            return list(self._workers.get(key, ()))

    # ``files_of``, ``last_scan`` and ``skipped_for`` take no lock: every worker calls them on
    # every loop, and with thousands of workers the tailer-wide lock they took was where hundreds
    # of threads waited (docs/benchmarks.md, "Many locations, 10,000").  A scan's results are
    # never changed once published: ``rescan`` replaces ``_files`` and ``_last_scan`` with new
    # objects, and reading an attribute is atomic, so a reader sees one scan or the next.

    def files_of(self, key: LocationKey) -> LocationFiles:
        return self._files.get(key) or LocationFiles(key)

    def last_scan(self) -> Scan:
        return self._last_scan

    def skipped_for(self, key: LocationKey) -> list[Skipped]:
        """The skipped files of the last scan whose names seem meant for ``key``."""
        return self._last_scan.skipped_by_location.get(key, [])

    def rescan(self, wake_all: bool = True) -> Scan:
        """List the directories now; start a worker for every new location.  Wakes every worker
        (``wake_all``), or only those whose location's files changed (a file added, removed, or
        of another size): the scan loop's periodic rescans do that.  Waking every worker at each
        rescan cost thousands of wake-ups a second for nothing at thousands of locations; the
        sizes are what finds an append whose inotify event was lost (a queue overflow, a file
        written from another host of a network filesystem)."""
        with self._scan_lock:
            self._watch()
            found = scan_dirs(self.dirs, self._reported, self.config.csv_tables)
            with self._lock:
                before = self._last_scan
                self._files = found.locations  # new objects, never changed after (see files_of)
                self._last_scan = found
                new = []
                if not self._halt.is_set():
                    for k in found.locations:
                        if k not in self._workers:
                            members = self.config.routing.replicas(k.namespace, k.table)
                            ws = [LocationWorker(self, k, r) for r in members] or [LocationWorker(self, k, None)]
                            self._workers[k] = ws
                            new.extend(ws)
                if wake_all:
                    workers = [w for ws in self._workers.values() for w in ws]
                else:
                    workers = [w for k in _changed(before, found) for w in self._workers.get(k, ())]
            for w in new:
                log.info("new location", location=str(w.key), files=len(found.locations[w.key].files),
                         replica=w.replica.name if w.replica else None, dis=w.replica.address if w.replica else None)
                w.start()
            for w in workers:
                w.wake.set()
            if self.csv is not None:
                self.csv.update(found.csv_files)
            return found

    def idle_poll_s(self) -> float:
        """How long a worker with nothing to send waits before looking again unless woken: the
        poll interval, or with inotify on every directory (whose events wake the location's
        workers, and whose safety-net rescans every ``INOTIFY_RESCAN_S`` wake those whose files
        changed) ``INOTIFY_IDLE_POLL_S``: ten thousand idle workers polling every 2 s took
        1.7 cores of the tailers (docs/benchmarks.md)."""
        return self._idle_poll_s

    def _watch(self) -> None:
        """Watch the directories there are (again: some may have been created since), and set
        the idle poll that follows: asked for by every worker at every wait, it is computed
        here, not under the watcher's lock by thousands of threads."""
        self.watcher.watch(self.dirs)
        poll = self.config.poll_interval_ms / 1000
        self._idle_poll_s = max(poll, INOTIFY_IDLE_POLL_S) if self.watcher.watches_all(self.dirs) else poll

    def _wake_names(self, names: set[str]) -> None:
        with self._lock:
            workers = self._workers
            for n in names:
                parsed = LogFileName.try_parse(n)
                for w in (workers.get(parsed.location, ()) if parsed else ()):
                    w.wake.set()
        if self.csv is not None and any(".csv." in n for n in names):
            self.csv.wake.set()

    def _spool_grew(self, name: str) -> None:
        parsed = LogFileName.try_parse(name)
        with self._lock:
            ws = list(self._workers.get(parsed.location, ())) if parsed else []
            lf = self._files.get(parsed.location) if parsed else None
            known = bool(ws) and lf is not None and any(f.name == name for f in lf.files)
        if known:
            for w in ws:
                w.wake.set()
        else:
            self.watcher.poke()

    def _scan_loop(self) -> None:
        poll = self.config.poll_interval_ms / 1000
        last = time.monotonic()
        while not self._halt.is_set():
            # with inotify on every directory, rescans are a safety net; else they find changes
            interval = max(poll, INOTIFY_RESCAN_S) if self.watcher.watches_all(self.dirs) else poll
            ev = self.watcher.wait(interval)
            if self._halt.is_set():
                break
            if ev.names:
                self._wake_names(ev.names)
            if ev.rescan or time.monotonic() - last >= interval:
                try:
                    self.rescan(wake_all=False)
                except Exception:  # noqa: BLE001 - keep watching
                    log.exception("directory scan failed")
                last = time.monotonic()

    # -- life cycle --------------------------------------------------------------------------

    def start(self) -> "Tailer":
        """Start watching and streaming.  OSError if the metrics endpoint cannot listen (nothing
        is started then)."""
        if self._started:
            return self
        if self.config.metrics_port is not None:
            self._serve_metrics()
        self._started = True
        for d in self.config.log_dirs:
            if not os.path.isdir(d):
                log.warning("log directory does not exist (yet); watching for it", dir=d)
        if self.csv is not None:
            self.csv.start()
        self.rescan()
        self._scanner = threading.Thread(target=self._scan_loop, name="tailer scan", daemon=True)
        self._scanner.start()
        if self.retention is not None:
            self.retention.start()
        log.info("tailer started", tailer_id=self.tailer_id, log_dirs=self.dirs, inotify=self.watcher.inotify,
                 metrics_port=self.metrics_port,
                 dis=self.config.routing.addresses, csv_tables=sorted(self.config.csv_tables) or None,
                 retention=self.config.retention.mode if self.config.retention else None)
        return self

    def _serve_metrics(self) -> None:
        from prometheus_client import start_http_server

        from disd.tailer.metrics import tailer_registry

        host, port = self.config.metrics_host, self.config.metrics_port
        try:
            srv, _thread = start_http_server(port, addr=host, registry=tailer_registry(self))
        except OSError as e:
            raise OSError(f"cannot serve metrics on {host}:{port}: {e.strerror or e}") from None
        self._metrics_server = srv
        self.metrics_port = srv.server_address[1]

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every thread; streams are cancelled (the DIS keeps what it acknowledged)."""
        if self._halt.is_set():
            return
        self._halt.set()
        self.watcher.close()
        workers = self.workers()
        for w in workers:
            w.stop()
        deadline = time.monotonic() + timeout
        for w in workers:
            w.join(max(0.1, deadline - time.monotonic()))
        if self._scanner is not None:
            self._scanner.join(max(0.1, deadline - time.monotonic()))
        if self.retention is not None and self.retention.is_alive():
            self.retention.join(max(0.1, deadline - time.monotonic()))
        if self.csv is not None:
            self.csv.stop()
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
            streams, self._streams = self._streams, None
            self._muxes.clear()
        for ch in channels:
            ch.close()
        if streams is not None:
            streams.close()
        self.watcher.release()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
            self._metrics_server = None
        stuck = [f"{w.key} -> {w.replica.name if w.replica else '-'}" for w in workers if w.is_alive()]
        if stuck:
            log.warning("location workers still busy at stop", locations=stuck)
        log.info("tailer stopped")

    def __enter__(self) -> "Tailer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- observation -------------------------------------------------------------------------

    def status(self) -> dict[str, dict]:
        """Per location (``ns/table/ip/cp``): state, file, sent_offset, acked_file, acked_offset,
        committed_rows, in_flight_bytes, dis, replica, error, problem (what the DIS is told is
        wrong on this side: a corrupt frame, files whose names do not parse; None when nothing),
        of the stream to the entry's first replica; and ``replicas``: the same per replica name,
        for every replica of the entry."""
        with self._lock:
            workers = [(str(k), list(ws)) for k, ws in self._workers.items()]
        out = {}
        for k, ws in sorted(workers):
            per = {(w.replica.name if w.replica else "-"): w.status() for w in ws}
            out[k] = dict(next(iter(per.values()))) | {"replicas": per}
        return out

    def replica_status(self) -> dict[str, dict]:
        """Per replica name (every DIS this tailer streams to): address, connected (see
        ``replica_connected``), bytes_behind (log bytes past its acknowledged positions, summed
        over its locations), locations (how many it is sent), states (workers by state)."""
        out: dict[str, dict] = {}
        for w in self.workers():
            if w.replica is None:
                continue
            r = out.setdefault(w.replica.name, {"address": w.replica.address, "bytes_behind": 0, "locations": 0,
                                                "states": {}, "_reach": []})
            r["bytes_behind"] += w.bytes_behind(self.files_of(w.key))
            r["locations"] += 1
            st = w.status()["state"]
            r["states"][st] = r["states"].get(st, 0) + 1
            r["_reach"].append(w.reachable)
        for r in out.values():
            r["connected"] = replica_connected(r.pop("_reach"))
        return out

    def csv_status(self) -> dict[str, dict]:
        """Per CSV file: spool_file, csv_offset, csv_size, rows, finished, error."""
        return self.csv.status() if self.csv is not None else {}

    def retention_status(self) -> dict | None:
        """passes, removed_files, removed_bytes, errors, last_error; None without ``retention``."""
        return self.retention.status() if self.retention is not None else None

    def idle(self, since: float | None = None) -> bool:
        """Every complete frame of every known log file is acknowledged by the DIS (and every
        complete CSV line transcoded, by a pass that started after ``since``)."""
        self.rescan()
        if self.csv is not None and not self.csv.quiet_since(since if since is not None else time.monotonic()):
            return False
        return all(w.idle() for w in self.workers())

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Block until ``idle()`` (True) or ``timeout`` seconds pass (False)."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        while True:
            if self.idle(since=t0):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


def replica_connected(reachable: list[bool | None]) -> bool:
    """A replica is connected when one of its workers has an open stream to it or got an answer
    from it at its last attempt; not connected when its workers' attempts fail and none has; a
    replica no worker has tried yet counts as connected (nothing is failing)."""
    if any(r is True for r in reachable):
        return True
    return not any(r is False for r in reachable)


def _changed(before: Scan, after: Scan) -> set[LocationKey]:
    """The locations whose files (names, sizes) or skipped files differ between two scans."""
    def listed(lf: LocationFiles | None) -> list[tuple[str, int]]:
        return [(f.name, f.size) for f in lf.files] if lf is not None else []

    def skipped(by: dict, k: LocationKey) -> list[str]:
        return [sk.path for sk in by.get(k, ())]

    changed = {k for k in before.locations.keys() | after.locations.keys()
               if listed(before.locations.get(k)) != listed(after.locations.get(k))}
    sb, sa = before.skipped_by_location, after.skipped_by_location
    changed |= {k for k in sb.keys() | sa.keys() if k is not None and skipped(sb, k) != skipped(sa, k)}
    return changed
