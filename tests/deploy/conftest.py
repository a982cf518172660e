"""What the deployment tests share, made once per run and in the background where it can be:

- ``dist``: ``make dist``'s wheel and sdist (dist/), the wheel every test installs;
- ``wheelhouse``: that wheel and the wheels of its dependencies, its spark extra's included
  (build/deploy/wheelhouse/, from this host's pip cache): the index of the booted machine, which
  has no network, and a local mirror for the image builds (podman.py);
- ``rootfs``: the Debian root of tests/deploy/rootfs.py, made by mmdebstrap, cached under
  build/deploy/rootfs/;
- ``images``: docker/Dockerfile built by podman, both targets, from a base imported from that root.

The first deployment test starts all of it: the wheel and the root side by side, then the images
(which need the root) while the other tests run; each fixture waits only for its own part.  Every
test here is marked ``deploy`` (``-m deploy`` selects them, ``-m "not deploy"`` leaves them out).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import pathlib
import re
import subprocess
import sys
import threading

import pytest

from support import ROOT

from . import kernel
from .podman import Podman
from .rootfs import PYTHON, ensure_rootfs, key

BUILD = ROOT / "build" / "deploy"
VERSION = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
RUNTIME_IMAGE = f"localhost/dis:{VERSION}"
SPARK_IMAGE = f"localhost/dis-spark:{VERSION}"


#: the shared artefacts the selected tests use (fixture names): only those are prepared
NEEDED: set[str] = set()
SHARED = ("dist", "wheelhouse", "rootfs", "images")


HERE = pathlib.Path(__file__).parent


@pytest.hookimpl(tryfirst=True)  # before -m selects by markers
def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in pathlib.Path(item.fspath).parents:
            item.add_marker(pytest.mark.deploy)


def pytest_collection_finish(session):
    """What the tests left after -m and -k use (those fixtures only are prepared)."""
    for item in session.items:
        if HERE in pathlib.Path(item.fspath).parents:
            NEEDED.update(name for name in SHARED if name in getattr(item, "fixturenames", ()))


@dataclasses.dataclass(frozen=True)
class Dist:
    wheel: pathlib.Path
    sdist: pathlib.Path


@dataclasses.dataclass(frozen=True)
class Images:
    podman: Podman
    base: str
    runtime: str
    spark: str


class Prepared:
    """The shared artefacts as futures, started together and waited for one by one."""

    def __init__(self, needed: set[str]) -> None:
        BUILD.mkdir(parents=True, exist_ok=True)
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="deploy-prep")
        self.podman = Podman(BUILD / "podman")
        self.cancelled = threading.Event()
        self.procs: list[subprocess.Popen] = []
        never: concurrent.futures.Future = concurrent.futures.Future()
        never.set_exception(AssertionError("not prepared: no selected test asked for it"))
        want_images = "images" in needed and not kernel.missing_for_containers() and not kernel.missing_for_networks()
        self.dist = self.pool.submit(self._dist) if needed & {"dist", "wheelhouse", "images"} else never
        self.rootfs = self.pool.submit(ensure_rootfs, BUILD / "rootfs", BUILD / "mmdebstrap.log") \
            if needed & {"rootfs", "images"} else never
        self.wheelhouse = self.pool.submit(self._wheelhouse) if needed & {"wheelhouse", "images"} else never
        self.images = self.pool.submit(self._images) if want_images else never

    def _run(self, argv: list[str], log: pathlib.Path, timeout: float, env: dict | None = None) -> None:
        """``argv`` with its output in ``log``; killed (its process group) if the run ends first."""
        if self.cancelled.is_set():
            raise RuntimeError("the test run ended first")
        with open(log, "w") as out:
            p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True)
            self.procs.append(p)
            try:
                rc = p.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait()
                raise AssertionError(f"{argv[:3]} did not end within {timeout} s; its output: {log}") from None
        if rc != 0:
            raise AssertionError(f"{' '.join(argv[:6])} exited {rc}:\n{log.read_text()[-4000:]}")

    def _dist(self) -> Dist:
        self._run(["make", "dist"], BUILD / "make-dist.log", 900)
        wheels = sorted((ROOT / "dist").glob(f"dis-{VERSION}-*.whl"))
        sdists = sorted((ROOT / "dist").glob(f"dis-{VERSION}.tar.gz"))
        assert len(wheels) == 1 and len(sdists) == 1, sorted((ROOT / "dist").iterdir())
        return Dist(wheels[0], sdists[0])

    def _wheelhouse(self) -> pathlib.Path:
        wheel = self.dist.result().wheel
        house = BUILD / "wheelhouse"
        for old in house.glob("dis-*.whl"):
            old.unlink()
        self._run([sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(house), f"{wheel}[spark]"],
                  BUILD / "wheelhouse.log", 900)
        return house

    def _images(self) -> Images:
        root = self.rootfs.result()
        mirror = self.wheelhouse.result()
        pm = self.podman
        base = f"localhost/dis-test-python:{PYTHON}-{key()}"  # the Dockerfile's PYTHON_IMAGE
        if not pm.image_exists(base):
            pm.import_root(root, base)
        refs = {"spark": SPARK_IMAGE, "runtime": RUNTIME_IMAGE}
        for target in ("spark", "runtime"):  # spark builds the runtime stage too: runtime is then cached
            self._run(pm.argv("build", "--format=docker", "--file", "docker/Dockerfile",
                              "--ignorefile", "docker/Dockerfile.dockerignore",
                              "--target", target, "--build-arg", f"PYTHON_IMAGE={base}", *pm.build_args(mirror),
                              "--tag", refs[target], "."),
                      BUILD / f"podman-build-{target}.log", 1500, env=pm.env())
        return Images(pm, base, RUNTIME_IMAGE, SPARK_IMAGE)

    def close(self) -> None:
        self.cancelled.set()
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, 15)
        self.pool.shutdown(wait=True)
        self.podman.unmount()


@pytest.fixture(scope="session")
def prepared():
    kernel.require_root()
    kernel.require_programs("systemd-nspawn", "mmdebstrap", "podman", "runc", "nsenter", "make")
    p = Prepared(NEEDED)
    yield p
    p.close()


@pytest.fixture(autouse=True)
def _start_preparing(prepared):
    """Every deployment test starts the shared builds, whichever runs first."""


@pytest.fixture(scope="session")
def dist(prepared) -> Dist:
    return prepared.dist.result()


@pytest.fixture(scope="session")
def wheelhouse(prepared) -> pathlib.Path:
    return prepared.wheelhouse.result()


@pytest.fixture(scope="session")
def rootfs(prepared) -> pathlib.Path:
    kernel.skip_without(kernel.missing_for_containers())
    return prepared.rootfs.result()


@pytest.fixture(scope="session")
def images(prepared) -> Images:
    kernel.skip_without(kernel.missing_for_containers())
    kernel.skip_without(kernel.missing_for_networks())
    return prepared.images.result()
