"""Keep the daemon's resident memory tied to what it is using, not to its worst moment.

Ingest messages are up to 48 MiB and are decoded on many server threads at once.  glibc's
malloc serves large blocks with mmap, but after the first such block is freed it raises its
mmap threshold (up to 32 MiB) so later large blocks come from per-thread heap arenas, which keep
freed memory for reuse.  A burst of large chunks then leaves hundreds of MiB resident for good
(measured: 4 concurrent 30 MiB chunks, repeated, settle at about 530 MiB instead of 220 MiB;
tests/hostile/test_ingest_fuzz.py).  Pinning the threshold keeps blocks of 4 MiB and more on
mmap, returned to the system on free; the cost is a page-fault pass per large message, which
does not show in the pipeline benchmark.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_MMAP_THRESHOLD = -3  # glibc <malloc.h>
MMAP_THRESHOLD_BYTES = 4 << 20


def pin_mmap_threshold(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Set glibc's mmap threshold (which also stops its dynamic raising).  Returns False where
    there is no glibc ``mallopt`` (musl, macOS): nothing to tune there."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, threshold) == 1
