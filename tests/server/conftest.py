"""Feeding a real DIS (the ``dis`` fixture of tests/conftest.py) by hand: log files sent frame by
frame on an Ingest stream driven one message at a time."""

from __future__ import annotations

import pathlib
import queue

import grpc

from disd.binlog import LocationKey, decode_header, scan_frames
from disd.rpc.keys import key_to_proto
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from support import log_name

KEY = LocationKey("Market", "Trade", "feed1", "2026-11-22")
FILE1 = log_name("feed1")
FILE2 = log_name("feed1", hhmmss="100000")


def key_msg(key=KEY):
    return key_to_proto(key)


class IngestStream:
    """A hand-driven Ingest stream: send messages one at a time, read replies."""

    def __init__(self, port: int, metadata=None) -> None:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = dis_pb2_grpc.IngestStub(self.channel)
        self._q: queue.Queue = queue.Queue()
        self.responses = self.stub.Stream(iter(self._q.get, None), metadata=metadata)

    def send(self, msg: dis_pb2.IngestRequest) -> None:
        self._q.put(msg)

    def open(self, key=KEY, fingerprint: str = "", tailer_id: str = "test"):
        self.send(dis_pb2.IngestRequest(open=dis_pb2.IngestOpen(location=key_msg(key), schema_fingerprint=fingerprint,
                                                                tailer_id=tailer_id)))
        return next(self.responses)

    def chunk(self, file_name: str, offset: int, data: bytes):
        self.send(dis_pb2.IngestRequest(chunk=dis_pb2.LogChunk(file_name=file_name, offset=offset, data=data)))
        return next(self.responses)

    def close(self) -> None:
        self._q.put(None)
        self.channel.close()


def frames_of(path, schema, start: int = 0) -> list[tuple[int, bytes]]:
    """(offset, bytes) of the header+first frame, then each further frame of a log file."""
    data = pathlib.Path(path).read_bytes()
    hdr = decode_header(data)
    run = scan_frames(data, 0, schema, start=hdr.size)
    out = []
    for i, (s, e) in enumerate(zip(run.starts, run.ends)):
        if i == 0 and start == 0:
            out.append((0, data[:e]))
        elif s >= start:
            out.append((s, data[s:e]))
    return out


def send_file(stream: IngestStream, path, schema, start: int = 0):
    last = None
    for off, data in frames_of(path, schema, start):
        last = stream.chunk(pathlib.Path(path).name, off, data)
    return last
