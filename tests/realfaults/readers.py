"""The readers of the partition test, run on their own network host (``ip netns exec``) as
processes: ``python -m realfaults.readers subscribe PROXY OUT`` writes every size the proxy at ``PROXY``
gives a raw Subscribe stream and a ListLocations poll;
``python -m realfaults.readers spark ROUTING CHECKPOINT OUT`` runs one Spark streaming query
through the proxies and writes each micro-batch's Size column to ``OUT/batch-<id>.npy`` (a batch
run again overwrites its file: what the query delivered exactly once is the union), and
``OUT/started`` once the query runs."""

from __future__ import annotations

import os
import pathlib
import sys
import time


def subscribe(address: str, out: str) -> None:
    """One raw ``Subscribe`` stream and a ``ListLocations`` poll, both of the proxy at ``address``
    (what any reader of the gRPC contract sees, with none of ``disd.client``'s own guards): lines
    ``time sub|list location rows``; each reconnects when its call fails."""
    import threading

    import grpc

    from disd.rpc.channel import open_channel
    from disd.rpc.v1 import dis_pb2, dis_pb2_grpc

    f = open(out, "a", buffering=1)
    lock = threading.Lock()

    def emit(kind: str, m) -> None:
        with lock:
            f.write(f"{time.time():.4f} {kind} {m.key.internal_partition} {m.rows}\n")

    def follow() -> None:
        while True:
            ch = open_channel(address)
            try:
                for m in dis_pb2_grpc.TableDataStub(ch).Subscribe(dis_pb2.SubscribeRequest(namespace="Market",
                                                                                           table="Trade")):
                    emit("sub", m)
            except grpc.RpcError:
                time.sleep(0.2)
            finally:
                ch.close()

    threading.Thread(target=follow, daemon=True).start()
    ch = open_channel(address)
    stub = dis_pb2_grpc.TableDataStub(ch)
    while True:
        try:
            for m in stub.ListLocations(dis_pb2.ListLocationsRequest(namespace="Market", table="Trade"),
                                        timeout=5).locations:
                emit("list", m)
        except grpc.RpcError:
            pass
        time.sleep(0.1)


def spark(routing: str, checkpoint: str, out: str) -> None:
    import numpy as np

    import disd.spark

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    s = disd.spark.session("local[2]", app_name="dis-realfaults", conf={
        "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2", "spark.driver.memory": "1g",
        "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
    s.sparkContext.setLogLevel("ERROR")
    outdir = pathlib.Path(out)

    def sink(df, batch_id):
        sizes = np.asarray(df.select("Size").toArrow().column("Size"), np.int64)
        tmp = outdir / f".batch-{batch_id}.npy"
        np.save(tmp, sizes)
        os.replace(tmp, outdir / f"batch-{batch_id}.npy")

    df = (s.readStream.format("dis").option("routing", routing).option("table", "Market.Trade")
          .option("retrySeconds", "3600").load())
    q = df.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint).trigger(
        processingTime="500 milliseconds").start()
    (outdir / "started").write_text("1")
    q.awaitTermination()


if __name__ == "__main__":
    {"subscribe": subscribe, "spark": spark}[sys.argv[1]](*sys.argv[2:])
