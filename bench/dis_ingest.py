"""What a live location write costs a real ``dis serve``, the DIS alone: gRPC included.

A real ``dis serve`` (subprocess) and, in this process, a client that plays the tailers of
``--locations`` locations of Market.Trade (internal partitions x 5 dates, as ``bench/load.py``):
it sends ``Multiplex`` requests built before timing (pre-encoded frames: no log files, no
tailer), so the DIS's CPU (``psutil``, every thread) is what is measured and the client's own
work is not in it.  Phases:

* *new*: every location's stream opened, ``--opens-per-request`` opens a request (the DIS makes
  a request's new locations together: ``StorageEngine.open_many``), then each location's first
  chunk (the log's header and 10 rows, caught up), ``--frames-per-request`` chunks a request;
  ``new_location_ms`` is the DIS's CPU per location over both;
* *live*: ``--rounds`` rounds of a 1-row chunk to every location (caught up: each is flushed as
  it is taken), ``--frames-per-request`` a request, every ack of a round awaited before the next
  (at least 30 ms later, past the 25 ms a location waits between caught-up flushes);
  ``dis_cpu_us_per_write`` is the DIS's CPU per location write.

How many chunks a request carries is what a tailer's event loop puts in one: every frame queued
since its last write (at 10,000 locations writing once a second, a tailer writing every 10 ms
sends some 25 a request per DIS).  The DIS's descriptors are its defaults (``max_open_files``
from its descriptor limit) unless ``--max-open-files`` is given: beyond about 3,800 locations
(19,232 descriptors here for five column files a location) its writes reopen files.

Baseline, same run: a bare gRPC server in its own process (Python, the DIS's thread pool and
message limits) answering the same requests with one empty response each, the serving floor
of a request without any ingest: ``baseline`` is its CPU per location write.

    .venv/bin/python bench/dis_ingest.py [--locations 2000] [--rounds 10] [--frames-per-request 50]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import grpc
import numpy as np
import psutil
import yaml

from _common import TRADE_SCHEMA, emit, trade_table, wait_serving
from disd.binlog import RowFlag, normalize_columns
from disd.binlog.format import encode_frame, encode_header, encode_rows
from disd.names import LocationKey
from disd.rpc.channel import MAX_MESSAGE_BYTES
from disd.rpc.ingestwire import ChunkOut, encode_mux_request
from disd.rpc.keys import key_to_proto
from disd.rpc.v1 import dis_pb2
from disd.schema import load_schema
from e2e_helpers import start_dis
from support import Proc, free_port

DATES = ["2026-11-16", "2026-11-17", "2026-11-18", "2026-11-19", "2026-11-20"]
FIRST_ROWS = 10
METHOD = "/disd.rpc.v1.Ingest/Multiplex"
OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES), ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]

BARE_SERVER = """
import sys, time
from concurrent import futures
import grpc
EMPTY = b""
def handler(requests, context):
    context.send_initial_metadata(())
    for _ in requests:
        yield EMPTY
opts = [("grpc.max_send_message_length", 48 << 20), ("grpc.max_receive_message_length", 48 << 20)]
server = grpc.server(futures.ThreadPoolExecutor(max_workers=256), options=opts)
h = grpc.stream_stream_rpc_method_handler(handler, request_deserializer=lambda b: b, response_serializer=lambda b: b)
server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("disd.rpc.v1.Ingest", {"Multiplex": h}),))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
print(port, flush=True)
server.wait_for_termination()
"""


class Logs:
    """Every location's log, in memory: the same bytes for each (a header, a 10-row frame, then a
    1-row frame a round), under each location's own file name."""

    def __init__(self, rounds: int) -> None:
        schema = load_schema(TRADE_SCHEMA)
        self.fingerprint = schema.fingerprint
        frames = []
        for n in [FIRST_ROWS] + [1] * rounds:
            payload, rows = encode_rows(schema, normalize_columns(schema, trade_table(n)),
                                        np.full(n, RowFlag.SINGLE_ROW, np.uint8))
            frames.append(encode_frame(payload, rows))
        self.first = encode_header(schema) + frames[0]
        self.live = frames[1:]

    @staticmethod
    def name(k: LocationKey) -> str:
        return f"Market.Trade.System.{k.internal_partition}.{k.column_partition}.bin.{k.column_partition}.000000.000+0000"

    def offset(self, r: int) -> int:
        """Where round ``r``'s frame starts."""
        return len(self.first) + sum(len(f) for f in self.live[:r])


def requests(frames: list[tuple[int, object]], per: int) -> list[tuple[bytes, int]]:
    """The frames in requests of ``per``: (request bytes, frames in it)."""
    return [(encode_mux_request(frames[i:i + per]), len(frames[i:i + per])) for i in range(0, len(frames), per)]


class Caller:
    """One ``Multiplex`` call: requests written from a queue, replies counted as they come."""

    def __init__(self, port: int, bare: bool) -> None:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=OPTIONS)
        call = self.channel.stream_stream(
            METHOD, request_serializer=lambda b: b,
            response_deserializer=(lambda b: b) if bare else dis_pb2.MuxResponse.FromString)
        self.out: queue.SimpleQueue = queue.SimpleQueue()
        self.bare = bare
        self.replies = 0
        self.ends: list[str] = []
        self.cond = threading.Condition()
        self.responses = call(iter(self.out.get, None))
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        try:
            for resp in self.responses:
                with self.cond:
                    if self.bare:
                        self.replies += 1
                    else:
                        self.replies += len(resp.replies)
                        self.ends += [f"stream {r.stream}: {r.end.code} {r.end.details}" for r in resp.replies
                                      if r.WhichOneof("body") == "end"]
                    self.cond.notify_all()
        except grpc.RpcError as e:
            with self.cond:
                self.ends.append(f"call ended: {e.code()} {e.details()}")
                self.cond.notify_all()

    def send(self, batch: list[tuple[bytes, int]], timeout_s: float = 600.0) -> None:
        """Write every request, then wait for their replies (a reply a frame; a response a request
        from the bare server)."""
        with self.cond:
            want = self.replies + (len(batch) if self.bare else sum(n for _, n in batch))
        for raw, _ in batch:
            self.out.put(raw)
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while self.replies < want and not self.ends:
                if not self.cond.wait(max(0.0, deadline - time.monotonic())):
                    raise SystemExit(f"{want - self.replies} replies missing after {timeout_s:.0f} s")
            if self.ends:
                raise SystemExit(f"a stream ended: {self.ends[:3]}")

    def close(self) -> None:
        self.out.put(None)
        self.channel.close()


def start_server(work: pathlib.Path, args: argparse.Namespace) -> tuple[Proc, int]:
    port, mport = free_port(), free_port()
    storage = {} if args.max_open_files is None else {"max_open_files": args.max_open_files}
    cfg = {
        "db_root": str(work / "db"),
        "schemas": str(pathlib.Path(TRADE_SCHEMA).parent),
        "server": {"host": "127.0.0.1", "port": port, "metrics_port": mport, "idle_timeout_s": 3600},
        "storage": storage,
        "import": {"default": {"flush_interval_ms": 100, "checkpoint_interval_ms": 30000}},
    }
    path = work / "dis.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = start_dis(work, path)
    wait_serving(mport, proc)
    return proc, port


def cpu_s(pid: int) -> float:
    """The process's CPU seconds (every thread, those ended too; 10 ms ticks)."""
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def cpu_ns_threads(pid: int) -> int:
    """The CPU nanoseconds of the process's threads alive now (``schedstat``: exact, where the
    process's own total counts in 10 ms ticks): a phase's short rounds, on threads that last."""
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError):
            pass
    return total


def run_dis(work: pathlib.Path, keys: list[LocationKey], logs: Logs, args: argparse.Namespace) -> dict:
    opens = [(i + 1, dis_pb2.IngestRequest(open=dis_pb2.IngestOpen(
        location=key_to_proto(k), tailer_id="bench", schema_fingerprint=logs.fingerprint)).SerializeToString())
        for i, k in enumerate(keys)]
    firsts = [(i + 1, ChunkOut(logs.name(k), 0, logs.first, True)) for i, k in enumerate(keys)]
    rounds = [requests([(i + 1, ChunkOut(logs.name(k), logs.offset(r), logs.live[r], True))
                        for i, k in enumerate(keys)], args.frames_per_request) for r in range(args.rounds)]
    open_reqs = requests(opens, args.opens_per_request)
    first_reqs = requests(firsts, args.frames_per_request)
    proc, port = start_server(work, args)
    try:
        pid = proc.p.pid
        caller = Caller(port, bare=False)
        caller.send([])
        time.sleep(0.5)
        c0, w0 = cpu_s(pid), time.perf_counter()
        caller.send(open_reqs)
        caller.send(first_reqs)
        new_cpu, new_wall = cpu_s(pid) - c0, time.perf_counter() - w0
        live_cpu, live_wall = [], []
        for batch in rounds:
            time.sleep(0.03)
            c0, w0 = cpu_ns_threads(pid), time.perf_counter()
            caller.send(batch)
            live_cpu.append((cpu_ns_threads(pid) - c0) / 1e9)
            live_wall.append(time.perf_counter() - w0)
        threads = psutil.Process(pid).num_threads()
        fds = psutil.Process(pid).num_fds()
        caller.close()
    finally:
        proc.terminate(120)
    return {"new_cpu": new_cpu, "new_wall": new_wall, "live_cpu": live_cpu, "live_wall": live_wall,
            "threads": threads, "fds": fds}


def run_bare(keys: list[LocationKey], logs: Logs, args: argparse.Namespace) -> list[float]:
    rounds = [requests([(i + 1, ChunkOut(logs.name(k), logs.offset(r), logs.live[r], True))
                        for i, k in enumerate(keys)], args.frames_per_request) for r in range(args.rounds)]
    p = subprocess.Popen([sys.executable, "-c", BARE_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(p.stdout.readline())
        caller = Caller(port, bare=True)
        out = []
        caller.send([])
        for batch in rounds:
            time.sleep(0.03)
            c0 = cpu_ns_threads(p.pid)
            caller.send(batch)
            out.append((cpu_ns_threads(p.pid) - c0) / 1e9)
        caller.close()
    finally:
        p.terminate()
        p.wait(30)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--locations", type=int, default=2000, help="internal partitions x 5 dates")
    ap.add_argument("--rounds", type=int, default=10, help="live rounds (a 1-row chunk per location each)")
    ap.add_argument("--frames-per-request", type=int, default=50, help="chunks a Multiplex request carries")
    ap.add_argument("--opens-per-request", type=int, default=200, help="opens a Multiplex request carries")
    ap.add_argument("--max-open-files", type=int, default=None, help="default: the DIS's (from its descriptor limit)")
    args = ap.parse_args()
    if args.locations % len(DATES) or args.locations < len(DATES):
        raise SystemExit(f"--locations must be a positive multiple of {len(DATES)}")
    if args.rounds < 1 or args.frames_per_request < 1 or args.opens_per_request < 1:
        raise SystemExit("--rounds, --frames-per-request and --opens-per-request must be at least 1")
    keys = [LocationKey("Market", "Trade", f"feed{i:05d}", d) for i in range(args.locations // len(DATES)) for d in DATES]
    logs = Logs(args.rounds)
    work = pathlib.Path(tempfile.mkdtemp(prefix="dis-ingest-"))
    try:
        got = run_dis(work, keys, logs, args)
        bare = run_bare(keys, logs, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    n = len(keys)
    per_write = [c * 1e6 / n for c in got["live_cpu"]]
    dis_us = float(np.median(per_write))
    bare_us = float(np.median([c * 1e6 / n for c in bare]))
    new_ms = got["new_cpu"] * 1e3 / n
    writes_s = n / float(np.median(got["live_wall"]))
    load = os.getloadavg()[0]
    print(f"{n} locations, {args.frames_per_request} chunks a request, {args.rounds} live rounds (medians); "
          f"load average {load:.2f}")
    print(f"new location (open + 10-row chunk, {args.opens_per_request} opens a request): {new_ms:.3f} ms of DIS CPU "
          f"({got['new_wall']:.2f} s for all)")
    print(f"live location write (1-row chunk, caught up): {dis_us:.1f} us of DIS CPU (rounds "
          f"{min(per_write):.1f}-{max(per_write):.1f}); a round of {n} writes in {np.median(got['live_wall']):.2f} s "
          f"({writes_s:,.0f} writes/s)")
    print(f"the same requests to a bare gRPC server: {bare_us:.1f} us of its CPU per location write "
          f"(ratio {dis_us / bare_us:.1f}); DIS threads {got['threads']}, descriptors {got['fds']}")
    emit("dis_ingest", dis_us, "us/location write", bare_us, locations=n, rounds=args.rounds,
         frames_per_request=args.frames_per_request, dis_cpu_us_per_write=dis_us, new_location_ms=new_ms,
         live_writes_per_s=writes_s, bare_grpc_us_per_write=bare_us, dis_threads=got["threads"],
         dis_fds=got["fds"], load_average=round(load, 2))


if __name__ == "__main__":
    main()
