"""Which DIS instance owns which table: ``config/routing.yaml``.

    instances:
      - {name: dis-a, address: 127.0.0.1:22021, tables: ["Market.*"]}
      - {name: dis-b, address: 127.0.0.1:22031, tables: ["*"], http_address: 127.0.0.1:22032}

Patterns are shell-style (``fnmatch``) over ``<Namespace>.<Table>``; the first instance with a
matching pattern owns the table.  Tailers send each location to its owner; readers read each
location from its owner.  A single address is the routing of one instance that takes everything.
``http_address`` is where the JVM Spark reader finds the instance's block endpoint (default: the
address's port + 1, the DIS's default ``server.http_port``).
"""

from __future__ import annotations

import fnmatch
import pathlib
from dataclasses import dataclass

from disd.config import ConfigError, ConfigReader, load_yaml


@dataclass(frozen=True)
class Instance:
    name: str
    address: str
    tables: tuple[str, ...] = ("*",)
    http_address: str | None = None  # the block endpoint, for the JVM Spark reader

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

    @property
    def addresses(self) -> list[str]:
        return [i.address for i in self.instances]


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
        if not address or ":" not in address:
            raise ConfigError(source, ir.key("address"), "must be host:port")
        name = ir.get("name", str, address)
        tables = ir.get("tables", list, ["*"])
        if not all(isinstance(t, str) and t for t in tables):
            raise ConfigError(source, ir.key("tables"), "must be a list of <Namespace>.<Table> patterns")
        http_address = ir.get("http_address", str, None)
        if http_address is not None and ":" not in http_address:
            raise ConfigError(source, ir.key("http_address"), "must be host:port")
        ir.finish()
        out.append(Instance(name, address, tuple(tables), http_address))
    return Routing(tuple(out))


def load_routing(path: str | pathlib.Path) -> Routing:
    return parse_routing(load_yaml(path), str(path))


def resolve(address: str | None = None, routing: str | pathlib.Path | Routing | None = None) -> Routing:
    """The routing a client or tailer uses: from a single address or a routing file."""
    if isinstance(routing, Routing):
        return routing
    if routing is not None and address is not None:
        raise ValueError("give either an address or a routing file, not both")
    if routing is not None:
        return load_routing(routing)
    if address is None:
        raise ValueError("an address (host:port) or a routing file is required")
    return Routing.single(address)
