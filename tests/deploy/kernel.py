"""What the deployment tests need of the kernel, probed: the one reason they may skip.

Missing programs (systemd-nspawn, mmdebstrap, podman, runc) or missing root are failures, not
skips: ``.ci/run`` installs the programs and CI runs as root.  Only a kernel that cannot give a
container what it needs (namespaces, cgroups, overlayfs, veth and bridge devices) is a reason to
skip, and the skip names the feature."""

from __future__ import annotations

import functools
import os
import pathlib
import shutil
import subprocess

import pytest

#: the namespaces systemd-nspawn and runc put a container in
NAMESPACES = ("mnt", "pid", "net", "uts", "ipc", "cgroup")


def _filesystems() -> set[str]:
    try:
        return {line.split()[-1] for line in pathlib.Path("/proc/filesystems").read_text().splitlines() if line.strip()}
    except OSError:
        return set()


@functools.cache
def missing_for_containers() -> str:
    """The kernel features a booted container lacks here, as a sentence ("" when none)."""
    lacking = [f"{ns} namespaces" for ns in NAMESPACES if not os.path.exists(f"/proc/self/ns/{ns}")]
    fs = _filesystems()
    if "overlay" not in fs:
        lacking.append("the overlay file system (overlayfs)")
    if "cgroup" not in fs and "cgroup2" not in fs:
        lacking.append("control groups (cgroup or cgroup2 file system)")
    return "; ".join(lacking)


@functools.cache
def missing_for_networks() -> str:
    """What podman's bridge networks need of the kernel (veth pairs and a bridge, tried in a
    throwaway network namespace), as a sentence ("" when it is there)."""
    ip, unshare = shutil.which("ip"), shutil.which("unshare")
    assert ip and unshare, "ip (iproute2) and unshare (util-linux) are needed to probe the kernel"
    r = subprocess.run([unshare, "--net", "sh", "-c",
                        f"{ip} link add dis-probe0 type veth peer name dis-probe1 && {ip} link add dis-probe2 type bridge"],
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        return f"veth or bridge network devices ({r.stderr.strip()})"
    return ""


def require_root() -> None:
    """Fail (never skip): booting a container and building images need root, which CI has."""
    if os.geteuid() != 0:
        pytest.fail("the deployment tests run systemd-nspawn and podman as root: run them as root (CI does)")


def require_programs(*names: str) -> dict[str, str]:
    """Their paths; a missing program fails the test and names the Debian packages for it
    (``.ci/run`` installs them)."""
    found = {n: shutil.which(n) for n in names}
    missing = [n for n, p in found.items() if p is None]
    if missing:
        pytest.fail(f"not installed: {', '.join(missing)} (.ci/run installs them: apt-get install systemd-container "
                    "mmdebstrap eatmydata podman runc netavark aardvark-dns)")
    return {n: str(p) for n, p in found.items()}


def skip_without(what: str) -> None:
    """Skip when ``what`` (a sentence from the probes above) names a missing kernel feature."""
    if what:
        pytest.skip(f"this kernel lacks {what}: a container cannot run here")
