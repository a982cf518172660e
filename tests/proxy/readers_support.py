"""Routing files whose entries list proxies, for the reader tests of tests/proxy: readers must
go to the proxies (``Routing.read_replicas``) and nowhere else.  Without a ``dis proxy`` at hand
a real DIS stands in for a proxy (a proxy is a read-only DIS to a reader) while the entry's own
DIS address is a port nothing listens on: a reader that went to the DISes would fail."""

from __future__ import annotations

import pathlib

import yaml

from support import free_port_pair


def dead_address() -> str:
    """A loopback address nothing listens on (a free port pair, never bound)."""
    return f"127.0.0.1:{free_port_pair()}"


def proxied_routing(path: pathlib.Path, dis: str, proxies: list[str], tables=("*",)) -> pathlib.Path:
    """``path``: one entry owning ``tables`` whose DIS is ``dis`` and whose proxies are ``proxies``
    (named ``tdcp-1``, ``tdcp-2``, ...; block endpoints at port + 1)."""
    path.write_text(yaml.safe_dump({"instances": [{
        "name": "market", "tables": list(tables), "address": dis,
        "proxies": [{"name": f"tdcp-{i + 1}", "address": a} for i, a in enumerate(proxies)]}]}))
    return path


def plain_routing(path: pathlib.Path, dis: str) -> pathlib.Path:
    """``path``: the same entry without proxies."""
    path.write_text(yaml.safe_dump({"instances": [{"name": "market", "tables": ["*"], "address": dis}]}))
    return path


def start_proxy(tmp: pathlib.Path, routing: pathlib.Path, port: int | None = None, **proxy):  # noqa: ANN201
    """A real ``dis proxy`` process (output in ``tmp/proxy.log``) whose upstream is ``routing``,
    on loopback ``port`` (its block endpoint on port + 1) with metrics on a free port, once its
    health service answers SERVING: ``(Proc, port, metrics_port)``."""
    from support import BIN, Proc, dis_healthy, free_port, wait_for

    tmp.mkdir(parents=True, exist_ok=True)
    port = port or free_port_pair()
    metrics_port = free_port()
    config = tmp / "proxy.yaml"
    config.write_text(yaml.safe_dump({
        "proxy": {"name": "tdcp-test", "host": "127.0.0.1", "port": port, "metrics_port": metrics_port, **proxy},
        "upstream": {"routing": str(routing), "retry_s": 10}}))
    p = Proc([str(BIN / "dis"), "proxy", "--config", str(config), "--json-logs"], tmp / "proxy.log").start()

    def healthy():  # noqa: ANN202
        if not p.alive():
            raise AssertionError("dis proxy exited:\n" + p.log_text()[-3000:])
        return dis_healthy(port)

    wait_for(healthy, 60, 0.1, "proxy health")
    return p, port, metrics_port
