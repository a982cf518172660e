"""Which DIS instance owns which table: ``config/routing.yaml``.

    instances:
      - {name: dis-a, address: 127.0.0.1:22021, tables: ["Market.*"]}
      - {name: dis-b, address: 127.0.0.1:22031, tables: ["*"], http_address: 127.0.0.1:22032}

Patterns are shell-style (``fnmatch``) over ``<Namespace>.<Table>``; the first instance with a
matching pattern owns the table.  Tailers send each location to its owner; readers read each
location from its owner.  A single address is the routing of one instance that takes everything.
``http_address`` is where the JVM Spark reader finds the instance's block endpoint (default: the
address's port + 1, the DIS's default ``server.http_port``).

An entry may instead name a **replica set**: several DISes that each hold a full copy of its
tables (hot replicas, docs/replicas.md)::

    instances:
      - name: market
        tables: ["Market.*"]
        replicas:
          - {name: dis-a1, address: 10.0.0.1:22021}
          - {name: dis-a2, address: 10.0.0.2:22021, http_address: 10.0.0.2:22022}
      - {name: dis-b, address: 127.0.0.1:22041, tables: ["*"]}

Tailers send every location of the entry's tables to every replica; readers read from any
replica that has published what they need.  An entry with ``address`` is a set of one replica.

An entry may also list **proxies** (``dis proxy``, Table Data Cache Proxies, docs/proxy.md)
beside its ``address`` or ``replicas``::

    instances:
      - name: market
        tables: ["Market.*"]
        address: 10.0.0.1:22021
        proxies:
          - {name: tdcp-1, address: 10.0.1.1:22051}                    # http_address: port + 1
          - {name: tdcp-2, address: 10.0.1.2:22051, http_address: 10.0.1.2:22052}

A proxy is a read-only DIS to a reader, so readers (the client, the Spark sources, ``dis merge``)
read the entry's tables through its proxies (``read_replicas``), which they treat as a replica
set (several proxies fail over between them), while tailers, ``dis status --routing`` and the
proxies themselves keep talking to the DISes (``members``; ``upstream()`` drops the proxies).
"""

from __future__ import annotations

import fnmatch
import pathlib
from dataclasses import dataclass, replace

from disd.config import ConfigError, ConfigReader, load_yaml


@dataclass(frozen=True)
class Replica:
    """One DIS of a routing entry."""

    name: str
    address: str
    http_address: str | None = None  # the block endpoint, for the JVM Spark reader


@dataclass(frozen=True)
class Instance:
    """A routing entry: the tables it owns and the DIS, or the replica set, that serves them.
    ``address``/``http_address`` are the first replica's (the only one's for a plain entry)."""

    name: str
    address: str
    tables: tuple[str, ...] = ("*",)
    http_address: str | None = None  # the block endpoint, for the JVM Spark reader
    replicas: tuple[Replica, ...] = ()  # empty: one replica, ``address``
    proxies: tuple[Replica, ...] = ()  # the ``dis proxy`` instances readers go through (none: the DISes)

    @property
    def members(self) -> tuple[Replica, ...]:
        """Every replica of the entry (one for a plain entry), in the routing file's order: the
        DISes, which tailers feed and a proxy reads from."""
        return self.replicas or (Replica(self.name, self.address, self.http_address),)

    @property
    def read_replicas(self) -> tuple[Replica, ...]:
        """Where readers read the entry's tables: its proxies when it lists any (a proxy serves
        the same published bytes as the DISes behind it), else its members."""
        return self.proxies or self.members

    def owns(self, namespace: str, table: str) -> bool:
        key = f"{namespace}.{table}"
        return any(fnmatch.fnmatchcase(key, p) for p in self.tables)


@dataclass(frozen=True)
class Routing:
    instances: tuple[Instance, ...]

    @classmethod
    def single(cls, address: str) -> "Routing":
        return cls((Instance(address, address, ("*",)),))

    def owner(self, namespace: str, table: str) -> Instance | None:
        for inst in self.instances:
            if inst.owns(namespace, table):
                return inst
        return None

    def replicas(self, namespace: str, table: str) -> tuple[Replica, ...]:
        """The DISes holding a table: its entry's replicas (empty when no entry owns it)."""
        inst = self.owner(namespace, table)
        return inst.members if inst is not None else ()

    def read_replicas(self, namespace: str, table: str) -> tuple[Replica, ...]:
        """Where readers read a table: its entry's proxies when it has any, else its replicas
        (empty when no entry owns it)."""
        inst = self.owner(namespace, table)
        return inst.read_replicas if inst is not None else ()

    def upstream(self) -> "Routing":
        """This routing without its proxies: what a proxy reads through (its readers' routing
        may be the same file; a proxy must never read from itself or another proxy)."""
        return Routing(tuple(replace(i, proxies=()) for i in self.instances))

    @property
    def addresses(self) -> list[str]:
        """Every DIS of the routing (each replica of each entry) once, in the file's order."""
        return list(dict.fromkeys(r.address for i in self.instances for r in i.members))


def parse_routing(data: object, source: str) -> Routing:
    r = ConfigReader(source, data)
    raw = r.get("instances", list, None)
    r.finish()
    if not raw:
        raise ConfigError(source, "instances", "missing or empty")
    out = []
    for i, item in enumerate(raw):
        ir = ConfigReader(source, item, f"instances[{i}].")
        address = ir.get("address", str, None)
        raw_replicas = ir.get("replicas", list, None)
        if address is not None and raw_replicas is not None:
            raise ConfigError(source, ir.key("replicas"), "give either 'address' (one DIS) or 'replicas', not both")
        if raw_replicas is None:
            if not address or ":" not in address:
                raise ConfigError(source, ir.key("address"), "must be host:port")
        elif not raw_replicas:
            raise ConfigError(source, ir.key("replicas"), "must list at least one {address: host:port}")
        name = ir.get("name", str, address or f"instances[{i}]")
        tables = ir.get("tables", list, ["*"])
        if not all(isinstance(t, str) and t for t in tables):
            raise ConfigError(source, ir.key("tables"), "must be a list of <Namespace>.<Table> patterns")
        http_address = ir.get("http_address", str, None)
        if http_address is not None and ":" not in http_address:
            raise ConfigError(source, ir.key("http_address"), "must be host:port")
        if raw_replicas is not None and http_address is not None:
            raise ConfigError(source, ir.key("http_address"), "goes on each replica of a replica set")
        raw_proxies = ir.get("proxies", list, None)
        if raw_proxies is not None and not raw_proxies:
            raise ConfigError(source, ir.key("proxies"),
                              "must list at least one {address: host:port} (leave the key out for none)")
        ir.finish()
        replicas = _replicas(source, f"instances[{i}].replicas", raw_replicas) if raw_replicas is not None else ()
        if replicas:
            address = replicas[0].address
            http_address = replicas[0].http_address
        proxies: tuple[Replica, ...] = ()
        if raw_proxies is not None:
            dises = {r.address for r in replicas} or {address}
            proxies = _replicas(source, f"instances[{i}].proxies", raw_proxies, "proxy", dises)
        out.append(Instance(name, address, tuple(tables), http_address, replicas, proxies))
    return Routing(tuple(out))


def _replicas(source: str, where: str, raw: list, what: str = "replica",
              dises: set[str] | frozenset[str] = frozenset()) -> tuple[Replica, ...]:
    """The ``{name, address, http_address}`` items of a ``replicas`` (or ``proxies``) list;
    ``dises`` are the entry's DIS addresses, which a proxy must not take."""
    out: list[Replica] = []
    for j, item in enumerate(raw):
        rr = ConfigReader(source, item, f"{where}[{j}].")
        address = rr.get("address", str, None)
        name = rr.get("name", str, address)
        http_address = rr.get("http_address", str, None)
        rr.finish()
        if not address or ":" not in address:
            raise ConfigError(source, rr.key("address"), "must be host:port")
        if any(r.address == address for r in out):
            raise ConfigError(source, rr.key("address"), f"{address} is already a {what} of this entry")
        if address in dises:
            raise ConfigError(source, rr.key("address"),
                              f"{address} is a DIS of this entry; a proxy is a `dis proxy` at its own address")
        if http_address is not None and ":" not in http_address:
            raise ConfigError(source, rr.key("http_address"), "must be host:port")
        out.append(Replica(name, address, http_address))
    return tuple(out)


def load_routing(path: str | pathlib.Path) -> Routing:
    return parse_routing(load_yaml(path), str(path))


def resolve(address: str | None = None, routing: str | pathlib.Path | Routing | None = None) -> Routing:
    """The routing a client or tailer uses: from a single address or a routing file."""
    if isinstance(routing, Routing):
        return routing
    if routing is not None and address is not None:
        raise ConfigError("connecting", "address", "give either an address or a routing file, not both")
    if routing is not None:
        return load_routing(routing)
    if address is None:
        raise ConfigError("connecting", "address", "an address (host:port) or a routing file is required")
    return Routing.single(address)
