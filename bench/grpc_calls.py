"""What a call costs a gRPC Python server, with the synchronous API (the DIS's) and with asyncio.

Why: the load bench's floor (docs/benchmarks-history.md, "the floor") puts most of a new location's
cost in the DIS's threads handing messages to one another, and a ``grpc.aio`` server, which runs
every call on one event loop instead of a pool thread per call, looks like the remedy.  This
measures that remedy before anyone builds it: a bare server of either kind, in its own process,
answers

- ``Read``: a unary-stream call answered with one 1 KiB message (the shape of ``ReadRanges``),
  2,000 calls from 4 client threads;
- ``Bidi``: request/reply pairs on one bidirectional stream, one at a time (the shape of a
  ``Multiplex`` request and its reply), 2,000 pairs;

and the server process's CPU (``/proc/<pid>/stat``) per call and per pair is the figure.  Each
kind runs ``--rounds`` times, interleaved, and the lowest figure of each is kept (the least
disturbed on a shared machine).

    .venv/bin/python bench/grpc_calls.py

Last JSON line: ``value`` the asyncio server's CPU per ``Read`` call (µs), ``baseline`` the
synchronous server's, ``ratio`` the first over the second (below 1: asyncio is cheaper), and
``sync_bidi_us``, ``aio_bidi_us`` per request/reply pair.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import queue
import subprocess
import sys
import threading
from concurrent import futures

import grpc

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
from _common import emit
from e2e_helpers import free_port

SERVICE = "bench.Calls"
PAYLOAD = b"x" * 1024


def _same(b: bytes) -> bytes:
    return b


def _handlers(asynchronous: bool) -> grpc.GenericRpcHandler:
    if asynchronous:
        async def read(request, context):  # noqa: ANN001, ANN202
            yield PAYLOAD

        async def bidi(requests, context):  # noqa: ANN001, ANN202
            async for r in requests:
                yield r
    else:
        def read(request, context):  # noqa: ANN001, ANN202
            yield PAYLOAD

        def bidi(requests, context):  # noqa: ANN001, ANN202
            yield from requests
    return grpc.method_handlers_generic_handler(SERVICE, {
        "Read": grpc.unary_stream_rpc_method_handler(read, _same, _same),
        "Bidi": grpc.stream_stream_rpc_method_handler(bidi, _same, _same)})


def serve(kind: str, port: int) -> None:
    """The server process: prints ``ready`` once it listens, then serves until killed."""
    if kind == "sync":
        server = grpc.server(futures.ThreadPoolExecutor(64))
        server.add_generic_rpc_handlers((_handlers(False),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        print("ready", flush=True)
        server.wait_for_termination()
        return

    async def main() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((_handlers(True),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print("ready", flush=True)
        await server.wait_for_termination()

    asyncio.run(main())


def cpu_seconds(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(kind: str, calls: int, threads: int) -> tuple[float, float]:
    """(server CPU µs per Read call, per Bidi request/reply pair) for one server of ``kind``."""
    port = free_port()
    p = subprocess.Popen([sys.executable, __file__, "--serve", kind, "--port", str(port)],
                         stdout=subprocess.PIPE, text=True)
    try:
        if p.stdout.readline().strip() != "ready":
            raise SystemExit(f"the {kind} server did not start")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            read = channel.unary_stream(f"/{SERVICE}/Read", _same, _same)
            bidi = channel.stream_stream(f"/{SERVICE}/Bidi", _same, _same)
            for _ in range(50):  # connection, first calls, the server's threads
                list(read(b"q"))
            per_thread = calls // threads

            def reader() -> None:
                for _ in range(per_thread):
                    list(read(b"q"))

            c0 = cpu_seconds(p.pid)
            workers = [threading.Thread(target=reader) for _ in range(threads)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            read_us = 1e6 * (cpu_seconds(p.pid) - c0) / (per_thread * threads)

            requests: queue.SimpleQueue = queue.SimpleQueue()

            def feed():  # noqa: ANN202
                while (r := requests.get()) is not None:
                    yield r

            replies = bidi(feed())
            requests.put(b"r" * 64)
            next(replies)
            c0 = cpu_seconds(p.pid)
            for _ in range(calls):
                requests.put(b"r" * 64)
                next(replies)
            bidi_us = 1e6 * (cpu_seconds(p.pid) - c0) / calls
            requests.put(None)
            for _ in replies:
                pass
        return read_us, bidi_us
    finally:
        p.kill()
        p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--serve", choices=["sync", "aio"], help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return
    best = {"sync": [float("inf")] * 2, "aio": [float("inf")] * 2}
    for _ in range(args.rounds):
        for kind in ("sync", "aio"):
            read_us, bidi_us = measure(kind, args.calls, args.threads)
            print(f"{kind:5s} server: {read_us:6.0f} µs CPU per unary-stream call ({args.calls} from "
                  f"{args.threads} threads), {bidi_us:5.0f} µs per bidi request/reply pair ({args.calls})")
            best[kind] = [min(best[kind][0], read_us), min(best[kind][1], bidi_us)]
    (s_read, s_bidi), (a_read, a_bidi) = best["sync"], best["aio"]
    print(f"lowest of {args.rounds}: unary-stream call sync {s_read:.0f} µs, asyncio {a_read:.0f} µs "
          f"(ratio {a_read / s_read:.2f}); bidi pair sync {s_bidi:.0f} µs, asyncio {a_bidi:.0f} µs "
          f"(ratio {a_bidi / s_bidi:.2f})")
    emit("grpc_calls", a_read, "us/call (server CPU)", s_read, sync_bidi_us=s_bidi, aio_bidi_us=a_bidi,
         calls=args.calls, threads=args.threads, rounds=args.rounds)


if __name__ == "__main__":
    main()
