"""A reader of Market.Trade: what a DIS (or a proxy) serves, summed up as one JSON line.

    python read_rows.py HOST:PORT

{"rows": n, "sum": sum of Size, "distinct": distinct Size values, "min": ..., "max": ...}"""

import json
import sys

import pyarrow.compute as pc

from disd.client import connect

with connect(sys.argv[1], retry_s=0) as c:
    sizes = c.read_table("Market", "Trade", columns=["Size"]).column("Size")
print(json.dumps({"rows": len(sizes), "sum": pc.sum(sizes.cast("int64")).as_py() or 0,
                  "distinct": pc.count_distinct(sizes).as_py(), "min": pc.min(sizes).as_py(), "max": pc.max(sizes).as_py()}))
