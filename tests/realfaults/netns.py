"""Hosts of a test in network namespaces: each on a veth into one bridge that lives in a namespace
of its own, and the test process (the root namespace) on the same bridge, to watch and check.
Every name carries a random id (several people share the machine), the subnet is drawn from
198.18.0.0/15 (set aside for benchmarking networks, RFC 2544) and checked unused, and everything
is removed on exit, even after a failure: deleting the namespaces takes their veths with them.

Faults, all undone on exit (``heal``): ``partition`` (iptables DROP both ways between two hosts),
``lose`` (one way, ``-m statistic --probability``), ``cap`` (``tc tbf`` on a host's egress).
"""

from __future__ import annotations

import contextlib
import random
import subprocess
import uuid
from dataclasses import dataclass, field
from typing import Iterator

from .mounts import run


@dataclass
class Host:
    name: str
    ns: str
    ip: str
    dev: str

    def wrap(self) -> list[str]:
        """The command prefix that runs a program on this host."""
        return ["ip", "netns", "exec", self.ns]

    def sh(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return run(*self.wrap(), *args, check=check)


@dataclass
class Network:
    id: str
    hosts: dict[str, Host] = field(default_factory=dict)
    root_dev: str = ""
    subnet: str = ""
    rules: list[tuple[Host, list[str]]] = field(default_factory=list)
    qdiscs: list[Host] = field(default_factory=list)

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    # -- faults ------------------------------------------------------------------------------
    def _rule(self, host: Host, rule: list[str]) -> None:
        host.sh("iptables", "-A", *rule)
        self.rules.append((host, rule))

    def partition(self, a: str, b: str, reset: bool = False) -> None:
        """No packet between hosts ``a`` and ``b``, either way (silently dropped); with ``reset``
        their open connections are also torn down on both sides at once (``ss -K``), as when a
        host's link goes down, so neither waits for a keepalive to notice."""
        ha, hb = self[a], self[b]
        self._rule(ha, ["INPUT", "-s", hb.ip, "-j", "DROP"])
        self._rule(ha, ["OUTPUT", "-d", hb.ip, "-j", "DROP"])
        if reset:
            ha.sh("ss", "-K", "dst", hb.ip, check=False)
            hb.sh("ss", "-K", "dst", ha.ip, check=False)

    def lose(self, src: str, dst: str, probability: float) -> None:
        """Packets from ``src`` to ``dst`` dropped at random (one way only)."""
        self._rule(self[dst], ["INPUT", "-s", self[src].ip, "-m", "statistic", "--mode", "random",
                               "--probability", str(probability), "-j", "DROP"])

    def cap(self, host: str, rate: str = "1mbit") -> None:
        """``host``'s outgoing traffic limited to ``rate`` (a token bucket)."""
        h = self[host]
        h.sh("tc", "qdisc", "add", "dev", h.dev, "root", "tbf", "rate", rate, "burst", "32kbit", "latency", "400ms")
        self.qdiscs.append(h)

    def heal(self) -> None:
        """Every fault undone."""
        for host, rule in reversed(self.rules):
            host.sh("iptables", "-D", *rule, check=False)
        self.rules.clear()
        for h in self.qdiscs:
            h.sh("tc", "qdisc", "del", "dev", h.dev, "root", check=False)
        self.qdiscs.clear()


def _free_subnet() -> str:
    used = run("ip", "-4", "route", "show").stdout + run("ip", "-4", "addr", "show").stdout
    for _ in range(100):
        a, b = random.randrange(18, 20), random.randrange(0, 256)
        prefix = f"198.{a}.{b}."
        if prefix not in used:
            return prefix
    raise RuntimeError("no free /24 in 198.18.0.0/15")


@contextlib.contextmanager
def network(names: list[str]) -> Iterator[Network]:
    """Hosts ``names`` on one bridge, with the root namespace at ``.1``."""
    net = Network(uuid.uuid4().hex[:6])
    switch = f"disrf-{net.id}-sw"
    made: list[str] = []
    try:
        run("ip", "netns", "add", switch)
        made.append(switch)
        run("ip", "netns", "exec", switch, "ip", "link", "add", "br0", "type", "bridge")
        run("ip", "netns", "exec", switch, "ip", "link", "set", "br0", "up")
        prefix = _free_subnet()
        net.subnet = prefix + "0/24"
        net.root_dev = f"rf{net.id}r"
        run("ip", "link", "add", net.root_dev, "type", "veth", "peer", "name", f"rf{net.id}R", "netns", switch)
        run("ip", "netns", "exec", switch, "ip", "link", "set", f"rf{net.id}R", "master", "br0", "up")
        run("ip", "addr", "add", prefix + "1/24", "dev", net.root_dev)
        run("ip", "link", "set", net.root_dev, "up")
        for i, name in enumerate(names):
            ns = f"disrf-{net.id}-{name}"
            run("ip", "netns", "add", ns)
            made.append(ns)
            dev, peer = f"rf{net.id}{i}", f"rf{net.id}{i}b"
            run("ip", "link", "add", dev, "netns", ns, "type", "veth", "peer", "name", peer, "netns", switch)
            run("ip", "netns", "exec", switch, "ip", "link", "set", peer, "master", "br0", "up")
            ip = f"{prefix}{i + 2}"
            run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ip}/24", "dev", dev)
            run("ip", "netns", "exec", ns, "ip", "link", "set", dev, "up")
            run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            net.hosts[name] = Host(name, ns, ip, dev)
        yield net
    finally:
        net.heal()
        for ns in reversed(made):
            run("ip", "netns", "del", ns, check=False)
        if net.root_dev:
            run("ip", "link", "del", net.root_dev, check=False)
