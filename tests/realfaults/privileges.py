"""What the kernel lets these tests do, asked once each: a test skips only when the machine
lacks a kernel feature or the privilege to use it, and says exactly which; a missing package
(fusepy, libfuse2, e2fsprogs, iproute2, iptables) is an error, since .ci/run installs them."""

from __future__ import annotations

import functools
import os
import pathlib
import subprocess
import uuid

import pytest

CAP_SYS_ADMIN = 21
CAP_NET_ADMIN = 12


def _has_cap(bit: int) -> bool:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> bit & 1)
    return False


@functools.cache
def fuse_problem() -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "the kernel offers no FUSE here (/dev/fuse is missing)"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as e:
        return f"/dev/fuse cannot be opened ({e.strerror}): FUSE needs root or access to /dev/fuse"
    if not _has_cap(CAP_SYS_ADMIN):
        return "no CAP_SYS_ADMIN: mounting FUSE, loop devices and ext4 needs it (.ci/run runs as root)"
    return None


@functools.cache
def loop_problem() -> str | None:
    if not _has_cap(CAP_SYS_ADMIN):
        return "no CAP_SYS_ADMIN: losetup and mount need it (.ci/run runs as root)"
    if not os.path.exists("/dev/loop-control"):
        return "the kernel has no loop devices (/dev/loop-control is missing)"
    if "ext4" not in pathlib.Path("/proc/filesystems").read_text():
        return "the kernel does not support ext4 (/proc/filesystems)"
    return None


@functools.cache
def netns_problem() -> str | None:
    if not _has_cap(CAP_SYS_ADMIN) or not _has_cap(CAP_NET_ADMIN):
        return "no CAP_SYS_ADMIN/CAP_NET_ADMIN: network namespaces, veth and iptables need them (.ci/run runs as root)"
    name = f"disprobe{uuid.uuid4().hex[:8]}"
    r = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if r.returncode != 0:
        return f"the kernel refuses a network namespace: ip netns add: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


CGROUP_V1 = pathlib.Path("/sys/fs/cgroup")


@functools.cache
def cgroup_problem(*controllers: str) -> str | None:
    if not _has_cap(CAP_SYS_ADMIN):
        return "no CAP_SYS_ADMIN: making cgroups needs it (.ci/run runs as root)"
    for c in controllers:
        d = CGROUP_V1 / c
        if not (d / "tasks").exists() or not os.access(d, os.W_OK):
            return f"no writable cgroup v1 {c} controller at {d} (the machine mounts no cgroup v1 hierarchy for it)"
    return None


def require(problem: str | None) -> None:
    """Skip the test, saying which kernel feature or privilege is missing."""
    if problem:
        pytest.skip(problem)

