"""One Debian root file system for the deployment tests, made by mmdebstrap from Debian's
packages and kept under ``build/deploy/rootfs/`` (the key names what went into it).

It serves twice: ``systemd-nspawn --boot`` starts its systemd as PID 1 (tests/deploy/
test_booted_systemd.py), and podman imports it as the base image of docker/Dockerfile, since no
container registry is reachable (tests/deploy/test_podman_image.py).  So it is both a small
systemd host and a stand-in for the Dockerfile's default base, ``python:3.11-slim-bookworm``:
Debian bookworm's Python 3.11 with its headers, ``python``/``pip`` in ``/usr/local/bin`` (a venv
at ``/usr/local``, with setuptools and wheel as in that image), and the same dpkg exclusions as
Debian's slim images (no manual pages, documentation or translations)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import pathlib
import shutil
import subprocess

SUITE = "bookworm"
#: the Python of the Dockerfile's default base (python:3.11-slim-bookworm)
PYTHON = "3.11"
SOURCES = (
    f"deb http://deb.debian.org/debian {SUITE} main",
    f"deb http://deb.debian.org/debian {SUITE}-updates main",
    f"deb http://deb.debian.org/debian-security {SUITE}-security main",
)
PACKAGES = (
    "systemd", "systemd-sysv", "dbus",                     # a booted systemd, systemctl, systemd-analyze
    f"python{PYTHON}", f"python{PYTHON}-venv", f"python{PYTHON}-dev", "python3-wheel-whl",
    "ca-certificates",
)
#: as Debian's slim images (debuerreotype): what they leave out, left out here
DPKG_OPTIONS = (
    "path-exclude=/usr/share/man/*", "path-exclude=/usr/share/doc/*", "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/info/*", "path-exclude=/usr/share/locale/*",
)
CUSTOMIZE = (
    f'chroot "$1" python{PYTHON} -m venv /usr/local',
    'chroot "$1" sh -c "/usr/local/bin/pip install -q --no-index /usr/share/python-wheels/wheel-*.whl"',
)
EATMYDATA_HOOKS = pathlib.Path("/usr/share/mmdebstrap/hooks/eatmydata")


def key() -> str:
    """What the root is made of, as a short digest: a change makes a new one."""
    what = {"suite": SUITE, "sources": SOURCES, "packages": PACKAGES, "dpkg": DPKG_OPTIONS, "customize": CUSTOMIZE}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def ensure_rootfs(cache: pathlib.Path, log: pathlib.Path) -> pathlib.Path:
    """The root for the current ``key()`` under ``cache``, made by mmdebstrap unless it is there
    (a lock keeps two test runs from making it at once; an interrupted attempt is discarded)."""
    cache.mkdir(parents=True, exist_ok=True)
    root = cache / key()
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = cache / (key() + ".complete")
        if done.is_file() and root.is_dir():
            return root
        done.unlink(missing_ok=True)
        part = cache / (key() + ".part")
        shutil.rmtree(part, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
        cmd = ["mmdebstrap", "--variant=minbase", "--mode=root", "--format=directory",
               *(f"--dpkgopt={o}" for o in DPKG_OPTIONS), f"--include={','.join(PACKAGES)}",
               *(f"--customize-hook={h}" for h in CUSTOMIZE)]
        if EATMYDATA_HOOKS.is_dir() and shutil.which("eatmydata"):
            cmd.append(f"--hook-dir={EATMYDATA_HOOKS}")  # no fsync per package: a throwaway root
        with open(log, "w") as out:
            r = subprocess.run([*cmd, SUITE, str(part), *SOURCES], stdout=out, stderr=subprocess.STDOUT, timeout=900)
        if r.returncode != 0:
            shutil.rmtree(part, ignore_errors=True)
            raise AssertionError(f"mmdebstrap failed (exit {r.returncode}):\n{log.read_text()[-3000:]}")
        part.rename(root)
        done.write_text(" ".join(cmd) + "\n")
        return root
