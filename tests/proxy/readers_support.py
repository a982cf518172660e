"""Routing files whose entries list proxies, for the reader tests of tests/proxy: readers must
go to the proxies (``Routing.read_replicas``) and nowhere else.  Without a ``dis proxy`` at hand
a real DIS stands in for a proxy (a proxy is a read-only DIS to a reader) while the entry's own
DIS address is a port nothing listens on: a reader that went to the DISes would fail."""

from __future__ import annotations

import pathlib

import yaml

from disd.historical.merge import IntradaySource, MergeRequest, merge
from support import free_port_pair

from .proxy_support import write_proxy_config


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


def check_merge(spark, routing: pathlib.Path, day: str, want: int, hist: pathlib.Path) -> None:
    """``dis merge`` of Market.Trade's ``day`` through ``routing`` into ``hist`` merges ``want``
    rows from the DIS, and the historical table read back holds them: Sizes 0 .. want-1."""
    r = merge(spark, MergeRequest("Market", "Trade", day, str(hist), IntradaySource(routing=str(routing)), force=True))
    assert (r.status, r.rows, r.source) == ("merged", want, "dis")
    back = (spark.read.format("dis").option("source", "historical").option("dbRoot", str(hist))
            .option("table", "Market.Trade").load())
    assert tuple(back.selectExpr("count(*)", "sum(CAST(Size AS BIGINT))").collect()[0]) == (want, want * (want - 1) // 2)


def start_proxy(tmp: pathlib.Path, routing: pathlib.Path, port: int | None = None, **proxy):
    """A real ``dis proxy`` process (``proxy_support.start_proxy``; output in ``tmp/proxy.log``)
    whose upstream is ``routing``, on loopback ``port`` (its block endpoint on port + 1) with
    metrics on a free port and the default cache (1 GiB), once healthy: ``(Proc, port, metrics_port)``."""
    from .proxy_support import metrics_port, start_proxy as start

    tmp.mkdir(parents=True, exist_ok=True)
    port = port or free_port_pair()
    config, _ = write_proxy_config(tmp, {"routing": str(routing), "retry_s": 10},
                                   **{"port": port, "cache_bytes": 1 << 30, "max_workers": 1024, **proxy})
    return start(tmp, config), port, metrics_port(config)
