"""podman as the deployment tests use it: their own image store, and settings this host needs.

- The store is ``build/deploy/podman/`` (kept between runs, so a second run builds from its layer
  cache); its run-time state is under /tmp.  ``unmount()`` undoes the one mount podman leaves
  behind (the store's overlay directory, bind-mounted on itself).
- ``containers.conf`` (``CONTAINERS_CONF``): the ``runc`` runtime (``crun`` refuses this host's
  mixed cgroup v1/v2 layout), cgroups without a systemd on the host, events in a file, and
  open-file and process limits at or below the host's own (podman's defaults are above them, and
  runc then cannot start a container).
- Builds get the host's CA bundle and a ``pip.conf`` that names it, so ``pip`` inside a build
  trusts what the host trusts (an intercepting proxy's CA, where there is one); a build never
  pulls (``--pull=never``): no registry is reachable.  The ``pip.conf`` also names a local
  mirror (``find-links``): the tests' wheelhouse, wheels this host's pip already has (PySpark
  among them, which the index has only as a 400 MB source distribution that each build would
  otherwise fetch and turn into a wheel).  Only where pip takes a package from changes: the
  Dockerfile's commands are the same, and the index is still asked.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import resource
import shutil
import ssl
import subprocess

#: where the host CA bundle and the pip.conf naming it appear inside a build
BUILD_CA = "/etc/ssl/certs/dis-build-ca.pem"
#: where the local wheel mirror appears inside a build
BUILD_WHEELS = "/var/cache/dis-build-wheels"


def host_ca_bundle() -> pathlib.Path | None:
    """The CA bundle the host's pip and OpenSSL use."""
    for cand in (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"), ssl.get_default_verify_paths().cafile,
                 "/etc/ssl/certs/ca-certificates.crt"):
        if cand and pathlib.Path(cand).is_file():
            return pathlib.Path(cand)
    return None


class Podman:
    def __init__(self, home: pathlib.Path) -> None:
        self.home = home
        self.storage = home / "storage"
        self.runroot = pathlib.Path("/tmp") / ("dis-podman-" + hashlib.sha256(str(home).encode()).hexdigest()[:12])
        home.mkdir(parents=True, exist_ok=True)
        self.conf = home / "containers.conf"
        self.ulimits = {"nofile": min(65536, resource.getrlimit(resource.RLIMIT_NOFILE)[1]),
                        "nproc": min(32768, resource.getrlimit(resource.RLIMIT_NPROC)[1])}
        self.conf.write_text(
            "[containers]\n"
            f"default_ulimits = {json.dumps([f'{k}={v}:{v}' for k, v in self.ulimits.items()])}\n"
            'log_driver = "k8s-file"\n'
            "[engine]\n"
            'runtime = "runc"\n'
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "file"\n')
        self.pip_conf = home / "pip.conf"

    def argv(self, *args: str) -> list[str]:
        return ["podman", f"--root={self.storage}", f"--runroot={self.runroot}", *args]

    def env(self) -> dict[str, str]:
        return {**os.environ, "CONTAINERS_CONF": str(self.conf)}

    def __call__(self, *args: str, check: bool = True, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
        r = subprocess.run(self.argv(*args), capture_output=True, text=True, timeout=timeout, env=self.env(), **kw)
        if check and r.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        return r

    def build_args(self, mirror: pathlib.Path) -> list[str]:
        """The options every build of the tests gets (above: the host's CA, the local wheel
        mirror, never a pull)."""
        out = ["--pull=never", "--volume", f"{self.pip_conf}:/etc/pip.conf:ro", "--volume", f"{mirror}:{BUILD_WHEELS}:ro"]
        conf = f"[global]\nfind-links = {BUILD_WHEELS}\n"
        ca = host_ca_bundle()
        if ca is not None:
            out += ["--volume", f"{ca}:{BUILD_CA}:ro"]
            conf += f"cert = {BUILD_CA}\n"
        self.pip_conf.write_text(conf)
        return out

    def image_exists(self, ref: str) -> bool:
        return self("image", "exists", ref, check=False).returncode == 0

    def import_root(self, root: pathlib.Path, ref: str) -> None:
        """A root file system as a one-layer image (``podman import`` of its tar stream)."""
        tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "-cf", "-", "."], stdout=subprocess.PIPE)
        r = subprocess.run(self.argv("import", "--change", 'CMD ["python3"]', "-", ref), stdin=tar.stdout,
                           capture_output=True, text=True, timeout=600, env=self.env())
        tar.stdout.close()
        assert tar.wait() == 0 and r.returncode == 0, f"podman import failed:\n{r.stderr[-3000:]}"

    def unmount(self) -> None:
        """Undo the bind mount podman's overlay driver keeps on the store (nothing else of it
        stays mounted once no container runs), and its run-time state."""
        overlay = self.storage / "overlay"
        mounts = pathlib.Path("/proc/self/mountinfo").read_text().split("\n")
        if any(f" {overlay} " in line for line in mounts):
            subprocess.run(["umount", str(overlay)], capture_output=True, timeout=60)
        shutil.rmtree(self.runroot, ignore_errors=True)
