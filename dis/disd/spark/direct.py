"""Reading column files straight from the DIS's database root, for tasks on the DIS host.

With ``.option("dbRoot", ...)`` the scan is still planned through the DIS (it names the
locations and their published sizes), but tasks read the planned byte ranges of the column files
with ``pread`` instead of asking the DIS for 64 KiB blocks over gRPC.  That is safe because of
the storage format's rule: the bytes of published rows never change once published
(docs/storage-format.md), so any byte below the planned size is the byte the DIS would have
sent.  It saves the transport entirely (in Python gRPC about as much CPU as the rest of the scan)
and is only possible where the files are visible: the DIS host, or a shared read-only mount.
"""

from __future__ import annotations

import os

from disd.spark.errors import DisSourceError


class DirectFiles:
    """Column files of a database root, opened on first use and closed by ``close``."""

    def __init__(self, db_root: str) -> None:
        self.db_root = db_root
        self._fds: dict[str, int] = {}

    def path(self, snap, name: str) -> str:  # noqa: ANN001 - disd.client.LocationSnapshot
        from disd.storage.engine import location_path

        if not name or os.path.basename(name) != name or name in (".", ".."):
            raise DisSourceError(f"{snap.key}: refusing column file name {name!r}")
        return os.path.join(location_path(self.db_root, snap.key), name)

    def read_range(self, snap, name: str, start: int, stop: int) -> bytes:  # noqa: ANN001
        """Bytes [start, stop) of a column file, at most its planned (published) size."""
        stop = min(stop, snap.files.get(name, 0))
        if stop <= start:
            return b""
        path = self.path(snap, name)
        fd = self._fds.get(path)
        if fd is None:
            try:
                fd = self._fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as e:
                raise DisSourceError(
                    f"option 'dbRoot': cannot open {path}: {e.strerror} (dbRoot must be the DIS's "
                    f"database root as seen from every executor)") from None
        data = os.pread(fd, stop - start, start)
        if len(data) != stop - start:
            # A file shorter than its published size: not this DIS's root, or the DIS recovered
            # to an earlier checkpoint after the scan was planned.
            raise DisSourceError(
                f"{snap.key}: {path} holds {start + len(data)} bytes, the DIS published {stop}; "
                f"is option 'dbRoot' the root of the DIS at {snap.address}?")
        return data

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
