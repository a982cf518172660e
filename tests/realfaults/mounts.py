"""FUSE daemons, loop devices and mounts that always go away: each is a context manager whose
exit unmounts, detaches or kills what it made, even when the test failed, so a shared machine
is never left with a mount or a loop device of ours."""

from __future__ import annotations

import contextlib
import os
import pathlib
import subprocess
import sys
import time
from typing import Iterator

from support import TESTS, subprocess_env


def run(*args: str | os.PathLike, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, check=check, timeout=timeout)


def _is_mount(path: pathlib.Path) -> bool:
    target = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == target for line in f)


def unmount(path: pathlib.Path) -> None:
    """Unmount ``path`` if mounted; lazily if something still holds it."""
    for _ in range(50):
        if not _is_mount(path) or run("umount", path, check=False).returncode == 0:
            return
        time.sleep(0.1)  # a process that was just killed may still be closing its files
    run("umount", "-l", path, check=False)


@contextlib.contextmanager
def fuse_daemon(module: str, mountpoint: pathlib.Path, *args: str | os.PathLike,
                log: pathlib.Path) -> Iterator[subprocess.Popen]:
    """``python -m realfaults.<module> MOUNTPOINT ARGS...`` until it has mounted; afterwards
    unmounted and the process gone."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    out = open(log, "ab")
    env = subprocess_env()
    p = subprocess.Popen([sys.executable, "-m", f"realfaults.{module}", str(mountpoint), *map(str, args)],
                         stdout=out, stderr=subprocess.STDOUT, env=env, cwd=TESTS)
    try:
        deadline = time.monotonic() + 30
        while not _is_mount(mountpoint):
            if p.poll() is not None:
                raise AssertionError(f"the FUSE daemon {module} exited ({p.returncode}): {log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"the FUSE daemon {module} did not mount {mountpoint}")
            time.sleep(0.02)
        yield p
    finally:
        unmount(mountpoint)  # as root a FUSE mount goes as any other; its daemon then exits
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)
        out.close()


@contextlib.contextmanager
def loop_device(backing: pathlib.Path) -> Iterator[str]:
    """A loop device over ``backing``, detached afterwards."""
    dev = run("losetup", "--find", "--show", backing).stdout.strip()
    try:
        yield dev
    finally:
        for _ in range(50):
            if run("losetup", "-d", dev, check=False).returncode == 0:
                break
            time.sleep(0.1)


@contextlib.contextmanager
def mounted(source: str | os.PathLike, target: pathlib.Path, options: str = "") -> Iterator[pathlib.Path]:
    """``mount [-o options] source target`` (an image file is mounted through a loop device the
    kernel frees at unmount), unmounted afterwards."""
    target.mkdir(parents=True, exist_ok=True)
    opts = ["-o", options] if options else []
    if not str(source).startswith("/dev/"):
        opts = ["-o", ",".join(filter(None, ["loop", options]))]
    run("mount", *opts, source, target)
    try:
        yield target
    finally:
        unmount(target)


def make_ext4(image: pathlib.Path, size_mib: int) -> None:
    """An ext4 file system in a new sparse file: a small journal, its metadata written in full
    (no lazy initialisation writing behind the test's back), no discards."""
    with open(image, "wb") as f:
        f.truncate(size_mib << 20)
    run("mkfs.ext4", "-q", "-F", "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0", "-J", "size=4", image)


def fsck(image: pathlib.Path) -> subprocess.CompletedProcess:
    """``e2fsck -fn``: a forced, read-only check; exit 0 only when the file system is clean."""
    return run("e2fsck", "-fn", image, check=False)
