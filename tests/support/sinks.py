"""Spark streaming sinks the tests read back."""

from __future__ import annotations

import pathlib
import threading

import numpy as np


class SizeSink:
    """A ``foreachBatch`` sink keeping the Size column of every micro-batch (Market.Trade's
    Size is a row's number in the tests, so the sizes say which rows arrived and how often)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.parts: list[np.ndarray] = []

    def __call__(self, batch_df, batch_id) -> None:  # noqa: ARG002 - foreachBatch's signature
        t = batch_df.select("Size").toArrow()
        with self.lock:
            self.parts.append(np.asarray(t.column("Size")))

    def count(self) -> int:
        with self.lock:
            return sum(len(a) for a in self.parts)

    def sizes(self) -> np.ndarray:
        """Every size received, sorted (empty before the first batch)."""
        with self.lock:
            return np.sort(np.concatenate(self.parts)) if self.parts else np.zeros(0, np.int32)


def stream_sizes(df, checkpoint: pathlib.Path) -> np.ndarray:
    """Every size the streaming read ``df`` gives until it has read what there is
    (``availableNow``), sorted: one ``SizeSink`` run to its end."""
    sink = SizeSink()
    q = df.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint)).trigger(
        availableNow=True).start()
    try:
        q.awaitTermination(120)
    finally:
        q.stop()
    return sink.sizes()
