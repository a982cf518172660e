"""The proxy's block cache: shared by every reader, bounded in bytes, never stale.

A block is named by what fixes its bytes: (location, file, index) for a full block (``index *
block_size + block_size <= size``: bytes below a published size never change), and (location,
file, index, size) for the last, partial block of a file at the published ``size`` it was read at
(a larger size is another block).  So any node can keep blocks without asking whether they are
still valid: a repeatable read of the same snapshot gets the same bytes from any of them.

Misses are read upstream in ranges (the rest of the reader's request, up to ``FETCH_BLOCKS``),
and a block that one reader is already fetching is waited for by the others rather than read
again: N readers scanning a table cost the DIS each block about once.
"""

from __future__ import annotations

import threading
from typing import Hashable

from disd.blocks import LocationSnapshot
from disd.proxy import metrics
from disd.proxy.upstream import Upstream
from disd.server.blockcache import BlockCache

#: Blocks per upstream read of a miss (4 MiB of 64 KiB blocks): the read-ahead of one request.
FETCH_BLOCKS = 64


class CachedBlocks:
    """Blocks of the proxy's published snapshots: from the cache, else upstream (once)."""

    def __init__(self, upstream: Upstream, cache: BlockCache) -> None:
        self.upstream = upstream
        self.cache = cache
        self._inflight: dict[Hashable, threading.Event] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _name(snap: LocationSnapshot, file: str, index: int, size: int) -> Hashable:
        bs = snap.block_size
        if index * bs + bs <= size:
            return (snap.key, file, index)
        return (snap.key, file, index, size)

    def _cached(self, snap: LocationSnapshot, file: str, index: int, size: int) -> bytes | None:
        bs = snap.block_size
        data = self.cache.get((snap.key, file, index))  # a full block serves any size's prefix
        if data is not None:
            return data[: max(0, size - index * bs)]
        if index * bs + bs <= size:
            return None
        return self.cache.get((snap.key, file, index, size))

    def blocks(self, snap: LocationSnapshot, file: str, first: int, last: int) -> list[bytes]:
        """Blocks ``first`` .. ``last`` of ``file`` cut at its size in ``snap`` (none past it),
        each as the DIS's ReadBlock returns it."""
        size = snap.files.get(file, 0)
        bs = snap.block_size
        last = min(last, -(-size // bs) - 1)
        if last < first:
            return []
        out: dict[int, bytes] = {}
        missing = []
        for i in range(first, last + 1):
            data = self._cached(snap, file, i, size)
            if data is None:
                missing.append(i)
            else:
                out[i] = data
        fetched: set[int] = set()
        if missing:
            mine, theirs = [], []
            with self._lock:
                for i in missing:
                    name = self._name(snap, file, i, size)
                    ev = self._inflight.get(name)
                    if ev is None:
                        self._inflight[name] = threading.Event()
                        mine.append(i)
                    else:
                        theirs.append((i, ev))
            try:
                for run in _runs(mine):
                    out.update(self._fetch(snap, file, run[0], run[-1], size))
                    fetched.update(run)
            finally:
                with self._lock:
                    for i in mine:
                        ev = self._inflight.pop(self._name(snap, file, i, size), None)
                        if ev is not None:
                            ev.set()
            for i, ev in theirs:
                ev.wait(self.upstream.retry_s + self.upstream.timeout_s)
                data = self._cached(snap, file, i, size)
                if data is None:  # its reader failed, or the block was evicted already
                    data = self._fetch(snap, file, i, i, size)[i]
                    fetched.add(i)
                out[i] = data
        # A hit is a block served without reading it upstream for this request: found in the
        # cache, or brought in by another reader's read that this one waited for.
        saved = [out[i] for i in out if i not in fetched]
        metrics.CACHE_MISSES.inc(len(fetched))
        metrics.CACHE_HITS.inc(len(saved))
        metrics.BYTES_SAVED.inc(sum(map(len, saved)))
        return [out[i] for i in range(first, last + 1)]

    def _fetch(self, snap: LocationSnapshot, file: str, first: int, last: int, size: int) -> dict[int, bytes]:
        """Blocks first..last read upstream in one range and cached."""
        bs = snap.block_size
        start, stop = first * bs, min(size, (last + 1) * bs)
        data = self.upstream.read_range(snap, file, start, stop)
        metrics.UPSTREAM_READS.inc()
        metrics.UPSTREAM_BYTES.inc(len(data))
        out = {}
        for i in range(first, last + 1):
            block = data[(i - first) * bs : (i - first + 1) * bs]
            self.cache.put(self._name(snap, file, i, size), block)
            out[i] = block
        return out


def _runs(indices: list[int]) -> list[list[int]]:
    """Consecutive runs of sorted ``indices``, each at most FETCH_BLOCKS long."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and runs[-1][-1] == i - 1 and len(runs[-1]) < FETCH_BLOCKS:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs
