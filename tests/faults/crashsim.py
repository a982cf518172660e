"""Power loss, simulated: replay a FaultyDisk trace and keep only what the fsync barriers promise.

The model, per file (an inode, whatever names it has):

* its *durable* content is its content at its last successful fsync;
* every write since is split at 4 KiB page boundaries of the file, and each piece independently
  reached the disk or not (``CrashPolicy.keep``): so later writes may be lost, torn at any 4 KiB
  boundary, or land while earlier ones did not (reordered);
* its size changes since (extending writes, truncates) persisted up to a point chosen at random
  (``CrashPolicy.sizes``): a size is only promised by an fsync.  Bytes inside the size that no
  persisted write covers read as the durable content, or zeros past the durable end (a hole);
* a failed fsync (``fsync_failed``) loses the pages it could not write *for good*: the kernel
  marks them clean, so a later fsync that succeeds does not write them.  Only a new write of the
  page (or a truncate through it) dirties it again.

Per directory: its *durable* entries are those at its last fsync; the entry changes since
(create, rename, unlink, mkdir) persisted as a prefix of their order, of random length
(``CrashPolicy.dirs``): file systems journal a directory's metadata in order, but promise
nothing before the directory's fsync.  A directory's content counts only if its own entry in its
parent survived.

``DiskModel.apply`` replays operations; ``crash`` draws one possible post-crash state (an
``Image``: names to bytes, or to nested Images for directories); ``materialize`` writes an Image
as real files for a fresh engine to recover.
"""

from __future__ import annotations

import os
import pathlib
import random
from dataclasses import dataclass, field
from typing import Iterator, Union

from .disk import Op

PAGE = 4096

Image = dict[str, Union[bytes, "Image"]]


@dataclass(frozen=True)
class CrashPolicy:
    """How much of what was not fsynced reached the disk.

    keep: the chance of each 4 KiB piece of each unsynced write.
    sizes / dirs: "random" (a random point in the order), "none" (nothing since the last
    fsync), or "all" (everything)."""

    keep: float = 0.5
    sizes: str = "random"
    dirs: str = "random"

    def cut(self, rng: random.Random, kind: str, n: int) -> int:
        mode = self.sizes if kind == "sizes" else self.dirs
        if mode == "all":
            return n
        if mode == "none":
            return 0
        return rng.randint(0, n)


@dataclass(eq=False)
class FileNode:
    durable: bytearray = field(default_factory=bytearray)
    current: bytearray = field(default_factory=bytearray)
    pending: list[tuple] = field(default_factory=list)  # ("w", offset, bytes) | ("t", size)
    stale: set[int] = field(default_factory=set)  # pages a failed fsync lost for good

    def write(self, offset: int, data: bytes) -> None:
        end = offset + len(data)
        if len(self.current) < end:
            self.current.extend(bytes(end - len(self.current)))
        self.current[offset:end] = data
        self.pending.append(("w", offset, data))
        if self.stale and data:
            self.stale -= set(range(offset // PAGE, (end - 1) // PAGE + 1))

    def truncate(self, size: int) -> None:
        if size < len(self.current):
            del self.current[size:]
        else:
            self.current.extend(bytes(size - len(self.current)))
        self.pending.append(("t", size))
        self.stale = {p for p in self.stale if p < size // PAGE}

    def sync(self) -> None:
        new = bytearray(self.current)
        for p in self.stale:  # never written back: the disk keeps what it had
            lo = p * PAGE
            if lo >= len(new):
                continue
            hi = min(lo + PAGE, len(new))
            old = bytes(self.durable[lo:hi])
            new[lo:hi] = old + bytes(hi - lo - len(old))
        self.durable = new
        self.pending = []

    def sync_failed(self) -> None:
        for op in self.pending:
            if op[0] == "w" and op[2]:
                self.stale |= set(range(op[1] // PAGE, (op[1] + len(op[2]) - 1) // PAGE + 1))
        self.pending = []

    def crash(self, policy: CrashPolicy, rng: random.Random) -> bytes:
        data = bytearray(self.durable)
        size = len(data)
        j = policy.cut(rng, "sizes", len(self.pending))
        for i, op in enumerate(self.pending):
            if op[0] == "t":
                if i < j:
                    size = op[1]
                    if size < len(data):
                        del data[size:]
                continue
            _, offset, payload = op
            end = offset + len(payload)
            p = offset
            while p < end:
                q = min(end, (p // PAGE + 1) * PAGE)
                if rng.random() < policy.keep:
                    if len(data) < q:
                        data.extend(bytes(q - len(data)))
                    data[p:q] = payload[p - offset:q - offset]
                p = q
            if i < j:
                size = max(size, end)
        if len(data) > size:
            del data[size:]
        else:
            data.extend(bytes(size - len(data)))
        return bytes(data)


Node = Union[FileNode, "DirNode"]


@dataclass(eq=False)
class DirNode:
    durable: dict[str, Node] = field(default_factory=dict)
    current: dict[str, Node] = field(default_factory=dict)
    pending: list[tuple] = field(default_factory=list)  # ("link", name, node) | ("unlink", name) | ("rename", a, b)

    def change(self, op: tuple) -> None:
        _apply_entry(self.current, op)
        self.pending.append(op)

    def sync(self) -> None:
        self.durable = dict(self.current)
        self.pending = []


def _apply_entry(entries: dict[str, Node], op: tuple) -> None:
    if op[0] == "link":
        entries[op[1]] = op[2]
    elif op[0] == "unlink":
        entries.pop(op[1], None)
    else:
        node = entries.pop(op[1], None)
        if node is not None:
            entries[op[2]] = node


class DiskModel:
    """The disk as the trace left it, durable part and page cache both, under ``root`` (a
    directory that existed, durably and empty, before the trace began)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.abspath(root)
        self.top = DirNode()
        self.fds: dict[int, FileNode] = {}

    def _parts(self, path: str) -> list[str]:
        rel = os.path.relpath(os.path.abspath(path), self.root)
        if rel == ".":
            return []
        if rel.startswith(".."):
            raise ValueError(f"{path} is outside the modelled root {self.root}")
        return rel.split(os.sep)

    def _dir(self, parts: list[str]) -> DirNode:
        d: Node = self.top
        for name in parts:
            assert isinstance(d, DirNode)
            d = d.current[name]
        assert isinstance(d, DirNode), parts
        return d

    def _parent(self, path: str) -> tuple[DirNode, str]:
        parts = self._parts(path)
        return self._dir(parts[:-1]), parts[-1]

    def apply(self, op: Op) -> None:
        k = op.kind
        if k == "open":
            d, name = self._parent(op.path)
            node = d.current.get(name)
            if node is None:
                if not op.flags & os.O_CREAT:
                    raise AssertionError(f"{op.path} was opened but the model never saw it made")
                node = FileNode()
                d.change(("link", name, node))
            elif isinstance(node, DirNode):
                raise AssertionError(f"{op.path}: a directory opened as a file")
            elif op.flags & os.O_TRUNC:
                node.truncate(0)
            self.fds[op.fd] = node
        elif k == "close":
            self.fds.pop(op.fd, None)
        elif k == "pwrite":
            self.fds[op.fd].write(op.offset, op.data)
        elif k == "ftruncate":
            self.fds[op.fd].truncate(op.size)
        elif k == "fsync":
            self.fds[op.fd].sync()
        elif k == "fsync_failed":
            self.fds[op.fd].sync_failed()
        elif k == "rename":
            d, a = self._parent(op.path)
            d2, b = self._parent(op.dst)
            assert d is d2, "renames across directories are not modelled"
            d.change(("rename", a, b))
        elif k == "unlink":
            d, name = self._parent(op.path)
            d.change(("unlink", name))
        elif k == "mkdir":
            d, name = self._parent(op.path)
            d.change(("link", name, DirNode()))
        elif k == "fsync_dir":
            self._dir(self._parts(op.path)).sync()
        elif k != "mark":
            raise ValueError(f"unknown operation {k}")

    def crash(self, policy: CrashPolicy, rng: random.Random) -> Image:
        """One state the disk may hold after the power went out now."""

        def walk(d: DirNode) -> Image:
            entries = dict(d.durable)
            for op in d.pending[: policy.cut(rng, "dirs", len(d.pending))]:
                _apply_entry(entries, op)
            return {name: walk(n) if isinstance(n, DirNode) else n.crash(policy, rng)
                    for name, n in sorted(entries.items())}

        return walk(self.top)

    def current(self) -> Image:
        """What a reader sees now (the page cache): every operation applied."""

        def walk(d: DirNode) -> Image:
            return {name: walk(n) if isinstance(n, DirNode) else bytes(n.current)
                    for name, n in sorted(d.current.items())}

        return walk(self.top)


def replay(trace: list[Op], root: str | os.PathLike[str], points: list[int]) -> Iterator[tuple[int, DiskModel]]:
    """For each crash point ``i`` (in increasing order): the model after ``trace[:i]``."""
    model = DiskModel(root)
    todo = sorted(set(points))
    k = 0
    for i, op in enumerate(trace):
        while k < len(todo) and todo[k] == i:
            yield i, model
            k += 1
        model.apply(op)
    while k < len(todo):
        yield todo[k], model
        k += 1


def materialize(image: Image, dest: str | os.PathLike[str]) -> None:
    dest = pathlib.Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for name, v in image.items():
        if isinstance(v, dict):
            materialize(v, dest / name)
        else:
            (dest / name).write_bytes(v)


def read_tree(path: str | os.PathLike[str]) -> Image:
    """The real files under ``path`` as an Image."""
    out: Image = {}
    for e in sorted(os.scandir(path), key=lambda e: e.name):
        out[e.name] = read_tree(e.path) if e.is_dir() else pathlib.Path(e.path).read_bytes()
    return out
