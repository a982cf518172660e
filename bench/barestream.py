"""The bare stream: the limit of carrying a tailer's requests to a DIS over loopback gRPC.

A baseline must bound the product from above, so it does a subset of the product's work and
nothing the product does not:

* **the same bytes in the same messages**: the log files cut into pieces exactly as a tailer
  cuts them (``disd.tailer.frames.FrameReader``, ``chunk_bytes``), each piece one frame of a
  ``MuxRequest`` built by the tailer's own encoder (``encode_mux_request``: file name, offset,
  data, caught-up flag), all built before the clock starts (the tailer reads and encodes while
  it sends);
* **the same call and flow control**: one ``Ingest.Multiplex`` call (method path, channel
  options and message limits the tailer's), at most ``max_in_flight_bytes`` unacknowledged, as
  ``disd.tailer.protocol.StreamFlow.room`` allows;
* **a server that only receives and acks**: a separate process configured as ``dis serve``
  configures itself (``disd.allocator.DIS``, ``disd.server.daemon.grpc_server``'s options and
  pool), whose handler takes each request as the received bytes (no parse) and answers it with
  one pre-built ack; the sender runs in a process of its own with the tailer's allocator
  settings (``disd.allocator.TAILER``) on an asyncio channel, as the tailer does;
* **and, with ``write_dir``, writes them**: each call's received bytes appended to a new file
  of that directory with plain writes, one write a request, while a second thread receives the
  next requests; a request is acknowledged once written, so the call ends when every byte is in
  the file.  A DIS must write at least as many bytes (its column files hold more than the log's
  bytes), and it cannot publish a row before writing it, so this still bounds the pipeline
  from above; without it the bound leaves out the one cost that dominates a burst on a machine
  whose every new page-cache page is costly (on a virtual machine that hands freed memory back to
  its host, a write into new pages runs at a tenth of the speed of one into pages just freed).
  The files are kept until the sink ends, so no timed call writes into pages a previous one
  freed, as none of the DIS's writes does.

Timed from the first request written to the last ack read, best of ``repeat`` calls on one warm
channel (the first call connects and warms both processes' buffers, and is not counted).

    .venv/bin/python bench/barestream.py LOG_FILE... [--repeat 5] [--write-dir DIR]   # seconds per call
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import subprocess
import sys
import threading
import time

from disd.rpc.v1 import dis_pb2

#: the method a tailer's streams travel on
METHOD = "/disd.rpc.v1.Ingest/Multiplex"
#: what the sink answers to every request: one ack of stream 1
ACK = dis_pb2.MuxResponse(replies=[dis_pb2.MuxReply(stream=1, response=dis_pb2.IngestResponse(
    ack=dis_pb2.Ack(file_name="x", offset=1, committed_rows=1)))]).SerializeToString()


def requests_of(paths: list[str], chunk_bytes: int) -> list[bytes]:
    """The ``MuxRequest`` bytes a tailer sends for ``paths`` (in order), one piece a request."""
    from disd.rpc.ingestwire import ChunkOut, encode_mux_request
    from disd.tailer.frames import FrameReader

    out = []
    for path in paths:
        name = os.path.basename(path)
        with FrameReader(path) as reader:
            offset = 0
            while True:
                piece = reader.read(offset, chunk_bytes)
                if not piece.data:
                    break
                out.append(encode_mux_request([(1, ChunkOut(name, piece.offset, piece.data, piece.at_end))]))
                offset = piece.end
    return out


# -- the sink: a process that only receives and acks ------------------------------------------

def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def serve(write_dir: str | None = None) -> None:
    """Serve the sink on an ephemeral port, print it, run until stdin closes; with
    ``write_dir``, each call's requests appended to a new file there before their acks."""
    from disd.allocator import DIS, tune_malloc

    tune_malloc(DIS)  # before any thread, as dis serve does
    import grpc

    from disd.config import DisConfig
    from disd.server.daemon import grpc_server

    calls = iter(range(1 << 30))

    def multiplex(requests, context):  # noqa: ANN001, ANN202
        context.send_initial_metadata(())
        if write_dir is None:
            for _ in requests:
                yield ACK
            return
        received: queue.SimpleQueue = queue.SimpleQueue()

        def receive() -> None:  # the next requests arrive while this thread writes
            try:
                for r in requests:
                    received.put(r)
            except grpc.RpcError:  # the sender went away: the call is over
                pass
            received.put(None)

        threading.Thread(target=receive, daemon=True).start()
        fd = os.open(os.path.join(write_dir, f"call-{next(calls)}"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            while (r := received.get()) is not None:
                _write_all(fd, r)
                yield ACK
        finally:
            os.close(fd)

    handler = grpc.method_handlers_generic_handler("disd.rpc.v1.Ingest", {
        "Multiplex": grpc.stream_stream_rpc_method_handler(multiplex)})
    server = grpc_server(DisConfig().max_workers, None)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    sys.stdin.read()
    server.stop(0)


# -- the sender: a process with the tailer's settings ------------------------------------------

async def _one_call(channel, requests: list[bytes], max_in_flight: int) -> float:  # noqa: ANN001
    import grpc.aio

    call = channel.stream_stream(METHOD, request_serializer=None, response_deserializer=None)()
    await call.initial_metadata()
    sizes: list[int] = []
    inflight = 0
    room = asyncio.Event()
    room.set()
    done = asyncio.get_running_loop().create_future()
    acked = 0

    async def read() -> None:
        nonlocal inflight, acked
        while acked < len(requests):
            r = await call.read()
            if r is grpc.aio.EOF:
                raise SystemExit("the sink ended the call early")
            inflight -= sizes[acked]
            acked += 1
            room.set()
        done.set_result(None)

    t0 = time.perf_counter()
    reader = asyncio.ensure_future(read())
    for req in requests:
        n = len(req)
        while sizes[acked:] and inflight + n > max_in_flight:  # StreamFlow.room: one always fits
            room.clear()
            await room.wait()
        sizes.append(n)
        inflight += n
        await call.write(req)
    await done
    elapsed = time.perf_counter() - t0
    await reader
    await call.done_writing()
    return elapsed


async def _send(address: str, requests: list[bytes], max_in_flight: int, repeat: int) -> list[float]:
    import grpc.aio

    from disd.rpc.channel import CHANNEL_OPTIONS

    async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        await _one_call(channel, requests, max_in_flight)  # connects, warms the buffers
        return [await _one_call(channel, requests, max_in_flight) for _ in range(repeat)]


def send(address: str, paths: list[str], chunk_bytes: int, max_in_flight: int, repeat: int) -> None:
    from disd.allocator import TAILER, tune_malloc

    tune_malloc(TAILER)
    requests = requests_of(paths, chunk_bytes)
    times = asyncio.run(_send(address, requests, max_in_flight, repeat))
    print(json.dumps({"seconds": times, "requests": len(requests), "bytes": sum(map(len, requests))}), flush=True)


# -- both, from the bench ---------------------------------------------------------------------

def bare_stream_seconds(paths: list[str], chunk_bytes: int = 4 << 20, max_in_flight: int = 8 << 20,
                        repeat: int = 5, write_dir: str | None = None) -> dict:
    """Run a sink and a sender (two processes) over ``paths``; their JSON: ``seconds`` per timed
    call, ``requests``, ``bytes``.  ``write_dir``: the sink writes what it receives there."""
    me = os.path.abspath(__file__)
    writes = ["--write-dir", write_dir] if write_dir is not None else []
    sink = subprocess.Popen([sys.executable, me, "--serve", *writes], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        port = int(sink.stdout.readline())
        out = subprocess.run([sys.executable, me, "--to", f"127.0.0.1:{port}", "--chunk-bytes", str(chunk_bytes),
                              "--max-in-flight-bytes", str(max_in_flight), "--repeat", str(repeat), *paths],
                             check=True, capture_output=True, text=True, timeout=600).stdout
        return json.loads(out.strip().splitlines()[-1])
    finally:
        sink.stdin.close()
        sink.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="*")
    ap.add_argument("--serve", action="store_true", help="run the sink (internal)")
    ap.add_argument("--to", help="send to this sink (internal); without it, start a sink and send to it")
    ap.add_argument("--chunk-bytes", type=int, default=4 << 20)
    ap.add_argument("--max-in-flight-bytes", type=int, default=8 << 20)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--write-dir", help="the sink writes what it receives into new files here")
    args = ap.parse_args()
    if args.serve:
        serve(args.write_dir)
    elif args.to:
        send(args.to, args.paths, args.chunk_bytes, args.max_in_flight_bytes, args.repeat)
    else:
        r = bare_stream_seconds(args.paths, args.chunk_bytes, args.max_in_flight_bytes, args.repeat, args.write_dir)
        print(json.dumps(r))


if __name__ == "__main__":
    main()
