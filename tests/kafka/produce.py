"""A producer process of the Kafka tests and bench: ``python produce.py BOOTSTRAP TOPIC N
PARTITIONS PER_TICK TICK_S [FIRST]`` writes messages FIRST..N-1 (default FIRST 0) (message ``i`` to partition ``i % PARTITIONS``,
key ``S<i % 7>``, JSON value with ``size`` = ``i``), ``PER_TICK`` messages every ``TICK_S``, and
waits for every delivery.  The first half of the messages carry a timestamp on one day, the
second half on the next (two column partitions)."""

from __future__ import annotations

import json
import sys
import time

from confluent_kafka import Producer

DAY0_MS = 1_795_392_000_000  # 2026-11-23T00:00:00Z


def value(i: int, n: int) -> bytes:
    ts = DAY0_MS + (86_400_000 if i >= n // 2 else 0) + i
    return json.dumps({"ts": ts, "price": i * 0.5, "size": i}).encode()


def main() -> int:
    bootstrap, topic, n, parts, per_tick, tick = sys.argv[1:7]
    n, parts, per_tick, tick = int(n), int(parts), int(per_tick), float(tick)
    first = int(sys.argv[7]) if len(sys.argv) > 7 else 0
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    failed = []
    for start in range(first, n, per_tick):
        for i in range(start, min(n, start + per_tick)):
            p.produce(topic, value=value(i, n), key=f"S{i % 7}".encode(), partition=i % parts,
                      on_delivery=lambda err, msg: failed.append(err) if err else None)
            while len(p) > 50_000:  # librdkafka's queue holds 100000 by default
                p.poll(0.05)
        p.poll(0)
        if tick:
            time.sleep(tick)
    left = p.flush(60)
    if left or failed:
        print(f"undelivered {left}, failed {failed[:3]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
