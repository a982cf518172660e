"""The tailer: finds binary logs, and streams each location's files to the DIS that owns it (to
every replica of its routing entry, when the entry names a replica set).

Every location lives on one event loop (``disd.tailer.loop``), a ``LocationStream`` coroutine per
replica of its entry (``disd.tailer.location``), each holding its own Ingest stream from that
replica's resume point: a replica that is down or slow holds back only its own streams, and
catches up from the files on disk when it comes back.  The streams to one DIS are numbered streams
of one ``Multiplex`` call (``disd.tailer.muxcall``), so the DIS serves a tailer with one thread
and many locations' writes travel in one message; a DIS that predates ``Multiplex`` gets a
``Stream`` call per location on the same loop (``disd.tailer.single``).  A location costs the
tailer no thread.  inotify's events are read on the loop and wake the streams of the files they
name; one scanner thread lists the log directories (every 2 s with inotify, every
``poll_interval_ms`` without), hands each scan to the loop, which starts the streams of new
locations and wakes those whose files changed.
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

import asyncio
import os
import socket
import threading
import time
from wsgiref.simple_server import WSGIServer

import structlog

from disd.names import LocationKey
from disd.rpc.channel import keepalive_options
from disd.tailer.config import TailerConfig
from disd.tailer.csvfeed import CsvTranscoder
from disd.tailer.location import LocationStream
from disd.tailer.loop import EventLoop
from disd.tailer.muxcall import Multiplexer, MuxStream
from disd.tailer.protocol import OnAck, StreamBroken
from disd.tailer.retention import LogRetention
from disd.tailer.single import SingleStream
from disd.tailer.status import replica_connected
from disd.tailer.watch import DirectoryWatcher, LocationFiles, Scan, Skipped, log_name, scan_dirs

log = structlog.get_logger("disd.tailer")

#: With inotify, directories are still rescanned this often (events can be missed: NFS, overflow).
INOTIFY_RESCAN_S = 2.0
#: With inotify, an idle location looks again this often unless woken (a safety net under the
#: rescans' own, which wake the locations whose files changed).
INOTIFY_IDLE_POLL_S = 30.0
#: The channels' first reconnect delay after a DIS went away (milliseconds).
INITIAL_RECONNECT_MS = 100
#: How long ``stop`` waits for the location streams to end.
STOP_WAIT_S = 5.0

__all__ = ["Tailer", "replica_connected"]


class Tailer:
    def __init__(self, config: TailerConfig, *, use_inotify: bool = True) -> None:
        self.config = config
        self.tailer_id = f"{socket.gethostname()}:{os.getpid()}"
        self._halt = threading.Event()
        self.stopping = False
        self._lock = threading.Lock()  # ``_workers``, as other threads read it
        self._scan_lock = threading.Lock()
        self._files: dict[LocationKey, LocationFiles] = {}
        self._last_scan = Scan({}, {})
        # per location, its streams in the routing's replica order (one per replica); changed on
        # the loop only
        self._workers: dict[LocationKey, list[LocationStream]] = {}
        self._reported: set[str] = set()
        self._scanner: threading.Thread | None = None
        self.loop: EventLoop | None = None
        self._muxes: dict[str, Multiplexer] = {}  # per DIS address, its current call (on the loop)
        self._no_mux: set[str] = set()  # addresses whose DIS does not know Multiplex
        self._not_dis: set[str] = set()  # addresses found serving no Ingest at all (a proxy?)
        self._started = False
        self._metrics_server: WSGIServer | None = None
        self.metrics_port: int | None = None  # the endpoint's port once started (metrics_port 0: any)
        self.watcher = DirectoryWatcher(use_inotify)
        self._idle_poll_s = config.poll_interval_ms / 1000  # until the first rescan (``_watch``)
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

    def _channel_options(self) -> tuple[tuple[str, object], ...]:
        """The channels' reconnect backoff (capped at ``max_backoff_ms``) and keepalive pings
        (``keepalive_ms``, ``keepalive_timeout_ms``: a DIS that stopped is left within their sum)."""
        cfg = self.config
        cap = max(INITIAL_RECONNECT_MS, cfg.max_backoff_ms)
        return (("grpc.initial_reconnect_backoff_ms", INITIAL_RECONNECT_MS),
                ("grpc.min_reconnect_backoff_ms", INITIAL_RECONNECT_MS),
                ("grpc.max_reconnect_backoff_ms", cap),
                *keepalive_options(cfg.keepalive_ms, cfg.keepalive_timeout_ms))

    def open_stream(self, address: str, on_ack: OnAck, on_end) -> MuxStream | SingleStream:  # noqa: ANN001
        """(On the loop) A new Ingest stream to ``address`` for one location stream: one of the
        streams of the tailer's ``Multiplex`` call to that DIS, or, to a DIS that does not know
        that call, a ``Stream`` call of its own."""
        if self.stopping or self.loop is None:
            raise StreamBroken("the tailer is stopping")
        if address not in self._no_mux:
            mux = self._muxes.get(address)
            if mux is not None and mux.broken is not None:
                if mux.unimplemented:
                    log.warning("the address takes no multiplexed streams (a DIS of an older release?): "
                                "a call per location instead", dis=address)
                    self._no_mux.add(address)
                mux = None
                del self._muxes[address]
            if mux is None and address not in self._no_mux:
                mux = self._muxes[address] = Multiplexer(self.loop, address, self.config.ack_timeout_ms / 1000,
                                                         self.config.max_in_flight_bytes)
            if mux is not None:
                return MuxStream(mux, self.config.max_in_flight_bytes, on_ack, on_end)
        return SingleStream(self.loop, address, self.config.max_in_flight_bytes, on_ack, on_end,
                            self.config.ack_timeout_ms / 1000)

    def not_a_dis(self, address: str) -> bool:
        """A location stream found that ``address`` serves no Ingest service; True for the first worker to
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
        return list(self._files)

    def workers(self) -> list[LocationStream]:
        """Every location stream: one per (location, replica)."""
        with self._lock:
            return [w for ws in self._workers.values() for w in ws]

    def locations_streamed(self) -> list[LocationKey]:
        """The locations that have streams (every location found since the start)."""
        with self._lock:
            return list(self._workers)

    def workers_of(self, key: LocationKey) -> list[LocationStream]:
        """The streams of one location, one per replica, in the routing's order."""
        with self._lock:
            return list(self._workers.get(key, ()))

    # ``files_of``, ``last_scan`` and ``skipped_for`` take no lock: a scan's results are never
    # changed once published (``rescan`` replaces ``_files`` and ``_last_scan`` with new objects,
    # and reading an attribute is atomic), so a reader sees one scan or the next.

    def files_of(self, key: LocationKey) -> LocationFiles:
        return self._files.get(key) or LocationFiles(key)

    def last_scan(self) -> Scan:
        return self._last_scan

    def skipped_for(self, key: LocationKey) -> list[Skipped]:
        """The skipped files of the last scan whose names seem meant for ``key``."""
        return self._last_scan.skipped_by_location.get(key, _NONE)

    def rescan(self, wake_all: bool = True) -> Scan:
        """List the directories now (in the calling thread, never the loop's); the loop then starts
        the streams of every new location, and wakes every stream (``wake_all``) or only those whose
        files changed in a way they have not seen (a file added, removed, or longer than the
        stream last read it; or another set of skipped files): the scanner's periodic rescans do
        that.  Waking every stream at each rescan cost thousands of wake-ups a second for nothing
        at thousands of locations; the sizes are what finds an append whose inotify event was
        lost (a queue overflow, a file written from another host of a network filesystem).
        Returns once the loop has applied the scan."""
        with self._scan_lock:
            self._watch()
            found = scan_dirs(self.dirs, self._reported, self.config.csv_tables)
            before = self._last_scan
            self._files = found.locations  # new objects, never changed after (see files_of)
            self._last_scan = found
            changed = None if wake_all else _changed(before, found)
            loop = self.loop
            if loop is not None and not self.stopping:
                try:
                    loop.run_sync(lambda: self._apply(found, changed), timeout=60)
                except Exception:  # the loop stopped meanwhile (the tailer stopping)
                    if not self.stopping:
                        raise
            if self.csv is not None:
                self.csv.update(found.csv_files)
            return found

    def _apply(self, found: Scan, changed: tuple[set[LocationKey], set[LocationKey]] | None) -> None:
        """(On the loop) Start the streams of the scan's new locations; wake the others as
        ``rescan`` says."""
        if self.stopping:
            return
        new = []
        for k, lf in found.locations.items():
            if k not in self._workers:
                members = self.config.routing.replicas(k.namespace, k.table)
                ws = [LocationStream(self, k, r) for r in members] or [LocationStream(self, k, None)]
                with self._lock:
                    self._workers[k] = ws
                new.extend(ws)
        for w in new:
            log.info("new location", location=str(w.key), files=len(found.locations[w.key].files),
                     replica=w.replica.name if w.replica else None, dis=w.replica.address if w.replica else None)
            w.start()
        if changed is None:
            for ws in self._workers.values():
                for w in ws:
                    w.wake()
            return
        files_changed, skipped_changed = changed
        for k in files_changed:
            listed = found.locations.get(k)
            for w in self._workers.get(k, ()):
                if listed is None or w.needs_look(listed):
                    w.wake()
        for k in skipped_changed:
            for w in self._workers.get(k, ()):
                w.wake()

    def idle_poll_s(self) -> float:
        """How long a location with nothing to send waits before looking again unless woken: the
        poll interval, or with inotify on every directory (whose events wake the location's
        streams, and whose safety-net rescans every ``INOTIFY_RESCAN_S`` wake those whose files
        changed) ``INOTIFY_IDLE_POLL_S``."""
        return self._idle_poll_s

    def _watch(self) -> None:
        """Watch the directories there are (again: some may have been created since), and set
        the idle poll that follows."""
        self.watcher.watch(self.dirs)
        poll = self.config.poll_interval_ms / 1000
        self._idle_poll_s = max(poll, INOTIFY_IDLE_POLL_S) if self.watcher.watches_all(self.dirs) else poll

    def _on_inotify(self) -> None:
        """(On the loop) The inotify descriptor is readable: wake the streams of the files its
        events name; ask the scanner for a rescan on a structural change or lost events."""
        ev = self.watcher.read_events()
        if ev.names:
            self._wake_names(ev.names)
        if ev.rescan:
            self.watcher.poke()

    def _wake_names(self, names: set[str]) -> None:
        """(On the loop)"""
        workers = self._workers
        for n in names:
            parsed = log_name(n)
            if parsed is not None:
                for w in workers.get(parsed[0], ()):
                    w.wake()
        if self.csv is not None and any(".csv." in n for n in names):
            self.csv.wake.set()

    def _spool_grew(self, name: str) -> None:
        """(The CSV thread) A spool log grew: wake its location's streams, or rescan for a new one."""
        parsed = log_name(name)
        lf = self._files.get(parsed[0]) if parsed else None
        if lf is not None and any(f.name == name for f in lf.files) and self.loop is not None:
            self.loop.call_soon(self._wake_names, {name})
        else:
            self.watcher.poke()

    def _scan_loop(self) -> None:
        poll = self.config.poll_interval_ms / 1000
        while not self._halt.is_set():
            # with inotify on every directory, rescans are a safety net; else they find changes
            interval = max(poll, INOTIFY_RESCAN_S) if self.watcher.watches_all(self.dirs) else poll
            self.watcher.wait_poke(interval)
            if self._halt.is_set():
                break
            try:
                self.rescan(wake_all=False)
            except Exception:  # keep watching
                log.exception("directory scan failed")

    # -- life cycle --------------------------------------------------------------------------

    def start(self) -> "Tailer":
        """Start watching and streaming.  OSError if the metrics endpoint cannot listen (nothing
        is started then)."""
        if self._started:
            return self
        if self.config.metrics_port is not None:
            self._serve_metrics(self.config.metrics_host, self.config.metrics_port)
        self._started = True
        for d in self.config.log_dirs:
            if not os.path.isdir(d):
                log.warning("log directory does not exist (yet); watching for it", dir=d)
        loop = self.loop = EventLoop(self.config.security, self._channel_options())
        loop.run_sync(lambda: loop.connect(self.config.routing.addresses))
        if self.watcher.inotify:
            self.loop.run_sync(lambda: self.loop.loop.add_reader(self.watcher.fd, self._on_inotify))  # type: ignore[union-attr]
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

    def _serve_metrics(self, host: str, port: int) -> None:
        from prometheus_client import start_http_server

        from disd.tailer.metrics import tailer_registry

        try:
            srv, _thread = start_http_server(port, addr=host, registry=tailer_registry(self))
        except OSError as e:
            raise OSError(f"cannot serve metrics on {host}:{port}: {e.strerror or e}") from None
        self._metrics_server = srv
        self.metrics_port = srv.server_address[1]

    async def _shutdown(self) -> None:
        """(On the loop) End every location stream and call."""
        if self.watcher.fd >= 0:
            asyncio.get_running_loop().remove_reader(self.watcher.fd)
        workers = [w for ws in self._workers.values() for w in ws]
        for w in workers:
            w.cancel()
        tasks = [w._task for w in workers if w._task is not None and not w._task.done()]  # noqa: SLF001 - the workers' tasks, awaited by their owner
        if tasks:
            await asyncio.wait(tasks, timeout=STOP_WAIT_S)
        for mux in self._muxes.values():
            mux.cancel()
        self._muxes.clear()
        stuck = [f"{w.key} -> {w.replica.name if w.replica else '-'}" for w in workers if w.is_alive()]
        if stuck:
            log.warning("location streams still busy at stop", locations=stuck)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop streaming and every thread; streams are cancelled (the DIS keeps what it
        acknowledged)."""
        if self._halt.is_set():
            return
        self._halt.set()
        self.stopping = True
        self.watcher.close()
        deadline = time.monotonic() + timeout
        if self.loop is not None:
            try:
                self.loop.run(self._shutdown(), max(0.1, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - the loop is gone or stuck: stopping goes on
                log.warning("the tailer's event loop did not stop its streams in time")
        if self._scanner is not None:
            self._scanner.join(max(0.1, deadline - time.monotonic()))
        if self.retention is not None and self.retention.is_alive():
            self.retention.join(max(0.1, deadline - time.monotonic()))
        if self.csv is not None:
            self.csv.stop()
        if self.loop is not None:
            self.loop.stop(max(0.1, deadline - time.monotonic()))
        self.watcher.release()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
            self._metrics_server = None
        log.info("tailer stopped")

    def responsive(self, timeout: float) -> bool:
        """Whether the event loop, where every location lives, runs a call within ``timeout``
        seconds: what the systemd watchdog is pinged on (``dis-tailer``), so that a loop stuck in
        a call gets the process restarted, as a stuck main loop would."""
        if self.loop is None or not self.loop.thread.is_alive():
            return False
        try:
            return bool(self.loop.run_sync(lambda: True, timeout))
        except Exception:  # noqa: BLE001 - a timeout, or the loop gone
            return False

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
        over its locations), locations (how many it is sent), states (streams by state)."""
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


_NONE: list[Skipped] = []


def _changed(before: Scan, after: Scan) -> tuple[set[LocationKey], set[LocationKey]]:
    """The locations whose files (names, sizes) differ between two scans, and those whose skipped
    files do."""
    def listed(lf: LocationFiles | None) -> list[tuple[str, int]]:
        return [(f.name, f.size) for f in lf.files] if lf is not None else []

    def skipped(by: dict, k: LocationKey) -> list[str]:
        return [sk.path for sk in by.get(k, ())]

    changed = {k for k in before.locations.keys() | after.locations.keys()
               if listed(before.locations.get(k)) != listed(after.locations.get(k))}
    sb, sa = before.skipped_by_location, after.skipped_by_location
    return changed, {k for k in sb.keys() | sa.keys() if k is not None and skipped(sb, k) != skipped(sa, k)}
