"""An LRU cache of column-file blocks, bounded in bytes.

The DIS caches only full blocks: bytes of published rows never change (docs/storage-format.md),
so a full block is valid forever, while the last, partial block of a file grows.  The proxy
(``disd.proxy.cache``) also keeps partial blocks, under a key that includes the published size
they were cut at.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Hashable


class BlockCache:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = capacity_bytes
        self._data: OrderedDict[Hashable, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def get(self, key: Hashable) -> bytes | None:
        with self._lock:
            v = self._data.get(key)
            if v is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return v

    def put(self, key: Hashable, value: bytes) -> None:
        if len(value) > self.capacity:
            return
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._bytes -= len(old)
            self._data[key] = value
            self._bytes += len(value)
            while self._bytes > self.capacity:
                _, ev = self._data.popitem(last=False)
                self._bytes -= len(ev)

    def __len__(self) -> int:
        return len(self._data)
