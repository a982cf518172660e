"""A last-by state's update alone, in process: CPU per row of ``LastBy.apply`` and of its key pass.

The rows of ``bench/lastby.py`` (2,000,000 Market.Trade rows of random updates over 100,000
``Sym`` keys) handed to a state's ``Pending`` in pieces of 130,000 rows, as the compiled ingest
path hands a chunk's rows, then absorbed in publishes of ``--publish`` rows; the allocator tuned
as ``dis serve`` tunes it.  Why: the update's cost per row is what bounds ``bench/lastby.py``'s
ratio, and that bench's wall time on a shared machine cannot tell a few ns a row apart; thread
CPU of the update alone can (docs/benchmarks-history.md, "Last-by: what a publish's update costs
in the DIS").  ``--fresh``: each publish's pieces copied just before it (recently written memory,
as ``take_tail`` leaves them) instead of all handed over first.

Prints each pass and, last, one JSON line: ``update_ns_per_row`` and ``key_pass_ns_per_row``, the
best pass's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import pyarrow as pa

from _common import TRADE_SCHEMA
from disd.allocator import DIS, tune_malloc
from disd.schema import load_schema
from disd.storage.lastby import LastBy
from lastby.support_lastby import random_updates

PIECE = 130_000
KEYS = 100_000


def one_pass(schema, cols: list[pa.Array], n: int, publish: int, fresh: bool) -> tuple[float, float]:  # noqa: ANN001
    """(update seconds, key pass seconds) of thread CPU for the ``n`` rows."""
    lb = LastBy(schema, ("Sym",), 1_000_000)
    if not fresh:
        for a in range(0, n, PIECE):
            lb.pending.put(a, [c.slice(a, min(PIECE, n - a)) for c in cols])
    slots, key_s = lb._slots, 0.0  # noqa: SLF001 - the bench times the key pass inside the update
    key = slots.key

    def timed_key(*args):  # noqa: ANN002, ANN202
        nonlocal key_s
        t0 = time.thread_time()
        try:
            return key(*args)
        finally:
            key_s += time.thread_time() - t0

    slots.key = timed_key  # type: ignore[method-assign]
    total = 0.0
    for a in range(0, n, publish):
        b = min(n, a + publish)
        if fresh:
            for x in range(a, b, PIECE):
                lb.pending.put(x, [pa.concat_arrays([c.slice(x, min(PIECE, b - x))]) for c in cols])
        t0 = time.thread_time()
        lb.catch_up(b, lambda s, e: lb.rows(s, e, lambda: None))  # type: ignore[arg-type, return-value]
        total += time.thread_time() - t0
    if lb.rows_read_back or len(lb.snapshot().table) != KEYS:
        raise SystemExit("the state did not take every row from Pending")
    return total, key_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--publish", type=int, default=250_000)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--fresh", action="store_true")
    args = ap.parse_args()
    tune_malloc(DIS)
    schema = load_schema(TRADE_SCHEMA)
    t = random_updates(0, args.rows, KEYS, seed=3)
    cols = [t.column(c.name).combine_chunks().cast(c.type.arrow_type) for c in schema.columns]
    best = None
    for _ in range(args.passes):
        update_s, key_s = one_pass(schema, cols, args.rows, args.publish, args.fresh)
        per = (update_s / args.rows * 1e9, key_s / args.rows * 1e9)
        print(f"publishes of {args.publish:,}: update {per[0]:.1f} ns a row, key pass {per[1]:.1f}, "
              f"rest {per[0] - per[1]:.1f}", flush=True)
        best = per if best is None or per[0] < best[0] else best
    assert best is not None
    print(json.dumps({"update_ns_per_row": round(best[0], 1), "key_pass_ns_per_row": round(best[1], 1)}))


if __name__ == "__main__":
    main()
