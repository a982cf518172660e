"""Shared pieces of the hostile-input tests: valid log bytes to mutate, frames re-sealed with
correct checksums (so mutations reach the decoder instead of stopping at the CRC), a raw Ingest
call that always ends within a deadline, and a DIS running as a real subprocess whose memory and
descriptors can be measured."""

from __future__ import annotations

import pathlib
import queue
import struct
import threading
from dataclasses import dataclass, field

import grpc
import psutil

from disd.binlog import decode_header
from disd.binlog.format import FRAME_HEADER, FRAME_HEADER_SIZE, crc32c
from disd.rpc.channel import CHANNEL_OPTIONS
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from disd.schema import SchemaRegistry, TableSchema
from support import (SCHEMAS, Proc, dis_healthy, free_port, free_port_pair, log_name, start_dis_process, trade_rows, write_dis_config,
                     write_log)

#: Every status a refused ingest stream may end with; anything else (UNKNOWN: an exception
#: escaped the handler; DEADLINE_EXCEEDED: the DIS hung) is a defect.
CLEAR_REFUSALS = frozenset({
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.DATA_LOSS,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
})


def schemas() -> SchemaRegistry:
    return SchemaRegistry.load_dir(SCHEMAS)


def valid_log(tmp: pathlib.Path, schema: TableSchema, batches=((5, 3), (4, None))) -> bytes:
    """A small log: a header, then one frame per batch (``n`` rows; flag 3 = single rows,
    None = a whole transaction)."""
    p = tmp / log_name("fuzz")
    if p.exists():
        p.unlink()
    start = 0
    for n, flag in batches:
        flags = [flag] * n if flag is not None else [1] + [0] * (n - 2) + [2]
        write_log(p, schema, trade_rows(start, n), flags)
        start += n
    return p.read_bytes()


@dataclass
class Frame:
    offset: int
    row_count: int
    payload: bytearray


def split_frames(data: bytes) -> tuple[bytes, list[Frame]]:
    """(header bytes, frames) of a valid log."""
    hdr = decode_header(data)
    p = hdr.size
    frames = []
    while p < len(data):
        plen, rows, _pcrc, _hcrc = FRAME_HEADER.unpack_from(data, p)
        frames.append(Frame(p, rows, bytearray(data[p + FRAME_HEADER_SIZE: p + FRAME_HEADER_SIZE + plen])))
        p += FRAME_HEADER_SIZE + plen
    return bytes(data[: hdr.size]), frames


def seal(payload: bytes, row_count: int) -> bytes:
    """A frame with correct checksums around any payload and row count: what a hostile sender
    who knows the format would send."""
    head = struct.pack("<III", len(payload), row_count & 0xFFFFFFFF, crc32c(payload))
    return head + struct.pack("<I", crc32c(head)) + bytes(payload)


def key_msg(ip: str, cp: str = "2026-11-22", namespace: str = "Market", table: str = "Trade") -> dis_pb2.LocationKey:
    return dis_pb2.LocationKey(namespace=namespace, table=table, internal_partition=ip, column_partition=cp)


def open_msg(ip: str, fingerprint: str, cp: str = "2026-11-22", **kw) -> dis_pb2.IngestRequest:
    return dis_pb2.IngestRequest(open=dis_pb2.IngestOpen(location=key_msg(ip, cp, **kw), schema_fingerprint=fingerprint,
                                                         tailer_id="hostile"))


def chunk_msg(file_name: str, offset: int, data: bytes) -> dis_pb2.IngestRequest:
    return dis_pb2.IngestRequest(chunk=dis_pb2.LogChunk(file_name=file_name, offset=offset, data=data))


@dataclass
class StreamResult:
    responses: list = field(default_factory=list)
    code: grpc.StatusCode = grpc.StatusCode.OK
    details: str = ""


def run_stream(channel: grpc.Channel, messages, timeout: float = 20.0, metadata=None) -> StreamResult:
    """Send ``messages`` on one Ingest stream, half-close, and collect every answer until the
    stream ends.  The deadline turns a hang of the DIS into DEADLINE_EXCEEDED instead of a stuck
    test."""
    out = StreamResult()
    call = dis_pb2_grpc.IngestStub(channel).Stream(iter(list(messages)), timeout=timeout, metadata=metadata)
    try:
        for r in call:
            out.responses.append(r)
    except grpc.RpcError as e:
        out.code, out.details = e.code(), e.details() or ""
    return out


class HeldStream:
    """An Ingest stream driven one message at a time, kept open until ``close``."""

    def __init__(self, channel: grpc.Channel, timeout: float = 30.0) -> None:
        self._q: queue.Queue = queue.Queue()
        self.call = dis_pb2_grpc.IngestStub(channel).Stream(iter(self._q.get, None), timeout=timeout)

    def send(self, msg: dis_pb2.IngestRequest):
        self._q.put(msg)
        return next(self.call)

    def error(self, timeout: float = 15.0) -> grpc.RpcError:
        """Wait for the stream's end and return its status as the RpcError it raised."""
        box: list = []

        def drain() -> None:
            try:
                for _ in self.call:
                    pass
                box.append(None)
            except grpc.RpcError as e:
                box.append(e)

        t = threading.Thread(target=drain, daemon=True)
        t.start()
        t.join(timeout)
        if not box:
            self.call.cancel()
            raise AssertionError(f"the stream did not end within {timeout} s")
        if box[0] is None:
            raise AssertionError("the stream ended with OK")
        return box[0]

    def close(self) -> None:
        self._q.put(None)


def channel(port: int) -> grpc.Channel:
    return grpc.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS)


class DisProcess:
    """``dis serve`` as a subprocess: the thing whose survival, memory and descriptors the
    hostile tests measure."""

    def __init__(self, tmp: pathlib.Path, storage: dict | None = None, **server) -> None:
        self.tmp = tmp
        self.port, self.metrics_port = free_port_pair(), free_port()
        self.config = write_dis_config(tmp, self.port, self.metrics_port, storage=storage, **server)
        self.proc: Proc = start_dis_process(tmp, self.config)
        self.ps = psutil.Process(self.proc.p.pid)

    def rss(self) -> int:
        return self.ps.memory_info().rss

    def healthy(self) -> bool:
        return dis_healthy(self.port, timeout=5)

    def stop(self) -> None:
        if self.proc.alive():
            self.proc.terminate()
