"""A client that opens an ingest stream, sends a log (its last rows an unfinished transaction),
reports the acknowledgement and then hangs until it is killed: test_clients.py kills it with
SIGKILL, so the DIS sees the connection drop exactly as when a tailer's host dies.

    python vanishing_client.py PORT LOG_PATH FINGERPRINT
"""

from __future__ import annotations

import pathlib
import queue
import sys
import time

import grpc

from disd.binlog import LogFileName
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc


def main() -> None:
    port, path, fingerprint = int(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
    key = LogFileName.parse(path.name).location
    q: queue.Queue = queue.Queue()
    ch = grpc.insecure_channel(f"127.0.0.1:{port}")
    responses = dis_pb2_grpc.IngestStub(ch).Stream(iter(q.get, None))
    q.put(dis_pb2.IngestRequest(open=dis_pb2.IngestOpen(
        location=dis_pb2.LocationKey(namespace=key.namespace, table=key.table,
                                     internal_partition=key.internal_partition,
                                     column_partition=key.column_partition),
        schema_fingerprint=fingerprint, tailer_id="vanishing")))
    next(responses)
    q.put(dis_pb2.IngestRequest(chunk=dis_pb2.LogChunk(file_name=path.name, offset=0, data=path.read_bytes())))
    ack = next(responses).ack
    print(f"acked {ack.committed_rows} {ack.offset}", flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
