"""Shared by the last-by tests and bench/lastby.py: random updates of many keys as Market.Trade
rows, and a DIS configuration declaring ``last_by: [Sym]``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

START_NS = 1_763_802_000_000_000_000


def random_updates(start: int, n: int, keys: int, seed: int) -> pa.Table:
    """Rows ``start`` .. ``start + n - 1`` of Market.Trade: Sym ``K<random below keys>`` (the
    first ``keys`` rows of the run cover every key once, so the state reaches ``keys``), Size the
    row number, Price random."""
    rng = np.random.default_rng(seed + start)
    idx = np.arange(start, start + n, dtype=np.int64)
    k = rng.integers(0, keys, n)
    cover = idx < keys
    k[cover] = idx[cover]
    sym = pa.array(np.char.add("K", k.astype(str)).astype(object), pa.string())
    return pa.table({
        "Timestamp": pa.array(START_NS + idx * 1000).cast(pa.timestamp("ns", tz="UTC")),
        "Sym": sym,
        "Price": pa.array(rng.random(n) * 100),
        "Size": pa.array(idx.astype(np.int32)),
    })


def with_last_by(settings: dict, keys=("Sym",), max_keys: int | None = None, table: str = "Market.Trade") -> dict:
    """``settings`` (a dis.yaml mapping) with ``import.tables.<table>.last_by``."""
    entry: dict = {"last_by": list(keys)}
    if max_keys is not None:
        entry["lastby_max_keys"] = max_keys
    settings.setdefault("import", {}).setdefault("tables", {})[table] = entry
    return settings
