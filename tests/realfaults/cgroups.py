"""cgroup v1 groups of a test: the freezer (a process stopped without dying), CPU quotas and
memory limits.  Each group has a unique name and is removed on exit, its processes moved back to
the root group first, even after a failure."""

from __future__ import annotations

import contextlib
import pathlib
import time
import uuid
from typing import Iterator

ROOT = pathlib.Path("/sys/fs/cgroup")


class Group:
    def __init__(self, controllers: tuple[str, ...]) -> None:
        self.name = f"disrf-{uuid.uuid4().hex[:8]}"
        self.dirs = {c: ROOT / c / self.name for c in controllers}
        for d in self.dirs.values():
            d.mkdir()

    def add(self, pid: int) -> None:
        for d in self.dirs.values():
            (d / "cgroup.procs").write_text(str(pid))

    def set(self, controller: str, key: str, value: str | int) -> None:
        (self.dirs[controller] / key).write_text(str(value))

    def get(self, controller: str, key: str) -> str:
        return (self.dirs[controller] / key).read_text()

    # -- freezer --------------------------------------------------------------------------------
    def freeze(self) -> None:
        self.set("freezer", "freezer.state", "FROZEN")
        self._wait_state("FROZEN")

    def thaw(self) -> None:
        self.set("freezer", "freezer.state", "THAWED")
        self._wait_state("THAWED")

    def _wait_state(self, state: str) -> None:
        deadline = time.monotonic() + 10
        while self.get("freezer", "freezer.state").strip() != state:
            if time.monotonic() > deadline:
                raise AssertionError(f"cgroup {self.name} did not become {state}")
            time.sleep(0.01)

    def remove(self) -> None:
        if "freezer" in self.dirs and self.dirs["freezer"].exists():
            with contextlib.suppress(OSError):
                self.thaw()
        for c, d in self.dirs.items():
            if not d.exists():
                continue
            with contextlib.suppress(OSError):
                for pid in (d / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        (ROOT / c / "cgroup.procs").write_text(pid)
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


@contextlib.contextmanager
def group(*controllers: str) -> Iterator[Group]:
    g = Group(controllers)
    try:
        yield g
    finally:
        g.remove()
