"""A recorded disk: a FUSE file system holding one file, ``disk.img``, whose every write and
fsync is appended to a log, so that the block device built on it (a loop device with ext4) can be
rebuilt as of a power cut at any flush.

The loop driver writes a block device's writes to its backing file in the order it completes
them and turns every flush (``REQ_PREFLUSH``; ``REQ_FUA``, which the loop device does not claim,
arrives as a write and a flush) into an fsync of the backing file: what the disk is promised to
hold after flush ``k`` is exactly the start image plus every write logged before it.  A test adds
marks (what it learnt from the DIS, e.g. a checkpoint's rows) through the control file ``ctl``;
they are logged between the writes, where they happened.

Run as a process: ``python -m realfaults.blockrec MOUNTPOINT IMAGE LOG`` serves ``IMAGE`` (a file
on a real disk) at ``MOUNTPOINT/disk.img`` until unmounted.  One thread serves every request, so
the log's order is the order the kernel's requests were answered in.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import stat
import struct
import sys
import time
from dataclasses import dataclass
from typing import Iterator

IMAGE_NAME = "disk.img"
CTL_NAME = "ctl"
#: kind (W write, F flush, M mark), offset, payload length
HEADER = struct.Struct("<cQI")


@dataclass(frozen=True)
class Entry:
    kind: str  # "W", "F" or "M"
    offset: int  # W: the byte offset in the image; F, M: 0
    pos: int  # W: where its bytes are in the log file; M: -1
    length: int
    note: dict | None = None  # M: the mark


def read_log(path: pathlib.Path) -> list[Entry]:
    """The entries of a log, its writes' bytes left in the file (``apply`` reads them)."""
    out: list[Entry] = []
    with open(path, "rb") as f:
        data = f.read()
    i = 0
    while i + HEADER.size <= len(data):
        kind, off, n = HEADER.unpack_from(data, i)
        i += HEADER.size
        if i + n > len(data):
            break  # a torn tail: the recorder was killed mid-record
        k = kind.decode()
        note = json.loads(data[i:i + n]) if k == "M" else None
        out.append(Entry(k, off, i if k == "W" else -1, n, note))
        i += n
    return out


def apply(log_path: pathlib.Path, entries: list[Entry], image: pathlib.Path) -> None:
    """Write ``entries``' writes, in order, into ``image``."""
    with open(log_path, "rb") as log, open(image, "r+b") as img:
        for e in entries:
            if e.kind == "W":
                log.seek(e.pos)
                os.pwrite(img.fileno(), log.read(e.length), e.offset)


def flush_points(entries: list[Entry]) -> list[int]:
    """The index of every flush in ``entries``."""
    return [i for i, e in enumerate(entries) if e.kind == "F"]


def marks_before(entries: list[Entry], end: int) -> Iterator[dict]:
    for e in entries[:end]:
        if e.kind == "M":
            yield e.note


def _serve(mountpoint: str, image: str, log_path: str) -> None:
    from fuse import FUSE, FuseOSError, Operations

    class Recorder(Operations):
        def __init__(self) -> None:
            self.fd = os.open(image, os.O_RDWR)
            self.log = open(log_path, "ab", buffering=1 << 20)
            self.now = time.time()

        def _record(self, kind: bytes, offset: int, payload: bytes) -> None:
            self.log.write(HEADER.pack(kind, offset, len(payload)))
            self.log.write(payload)

        def getattr(self, path, fh=None):  # noqa: ARG002 - fusepy calls each operation with its whole signature
            base = {"st_uid": 0, "st_gid": 0, "st_atime": self.now, "st_mtime": self.now, "st_ctime": self.now}
            if path == "/":
                return {**base, "st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2}
            if path == "/" + IMAGE_NAME:
                return {**base, "st_mode": stat.S_IFREG | 0o600, "st_nlink": 1, "st_size": os.fstat(self.fd).st_size}
            if path == "/" + CTL_NAME:
                return {**base, "st_mode": stat.S_IFREG | 0o600, "st_nlink": 1, "st_size": 0}
            raise FuseOSError(errno.ENOENT)

        def readdir(self, path, fh):  # noqa: ARG002 - fusepy calls each operation with its whole signature
            return [".", "..", IMAGE_NAME, CTL_NAME]

        def open(self, path, flags):  # noqa: ARG002 - fusepy calls each operation with its whole signature
            if path not in ("/" + IMAGE_NAME, "/" + CTL_NAME):
                raise FuseOSError(errno.ENOENT)
            return 0

        def truncate(self, path, length, fh=None):  # noqa: ARG002 - fusepy calls each operation with its whole signature
            if path != "/" + CTL_NAME:
                raise FuseOSError(errno.EPERM)

        def read(self, path, size, offset, fh):  # noqa: ARG002 - fusepy calls each operation with its whole signature
            if path != "/" + IMAGE_NAME:
                return b""
            return os.pread(self.fd, size, offset)

        def write(self, path, data, offset, fh):  # noqa: ARG002 - fusepy calls each operation with its whole signature
            if path == "/" + CTL_NAME:
                for line in bytes(data).decode().splitlines():
                    if line.strip():
                        self._record(b"M", 0, json.dumps(json.loads(line), sort_keys=True).encode())
                self.log.flush()
                return len(data)
            os.pwrite(self.fd, data, offset)
            self._record(b"W", offset, bytes(data))
            return len(data)

        def fsync(self, path, datasync, fh):  # noqa: ARG002 - fusepy calls each operation with its whole signature
            if path == "/" + IMAGE_NAME:
                self._record(b"F", 0, b"")
                self.log.flush()
            return 0

        def flush(self, path, fh):  # noqa: ARG002 - fusepy calls each operation with its whole signature
            return 0

        def release(self, path, fh):  # noqa: ARG002 - fusepy calls each operation with its whole signature
            return 0

        def statfs(self, path):  # noqa: ARG002 - fusepy calls each operation with its whole signature
            return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": 1, "f_bfree": 0, "f_bavail": 0, "f_namemax": 255}

        def destroy(self, path):  # noqa: ARG002 - fusepy calls each operation with its whole signature
            self.log.flush()
            self.log.close()
            os.close(self.fd)

    FUSE(Recorder(), mountpoint, foreground=True, nothreads=True, allow_other=True, direct_io=True,
         big_writes=True, max_write=131072, fsname="dis-blockrec")


if __name__ == "__main__":
    _serve(*sys.argv[1:4])
