"""Waiting for something that happens in another thread or process."""

from __future__ import annotations

import time


def wait_for(pred, timeout: float = 30.0, interval: float = 0.05, what: str = "condition"):
    """Call ``pred`` until it returns a truthy value and return that value.  An exception from
    ``pred`` counts as not yet (it is retried until the deadline).  At the deadline, an
    AssertionError names ``what`` and the last value or exception."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            last = pred()
        except Exception as e:  # noqa: BLE001 - retried until the deadline
            last = e
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} not met within {timeout} s (last: {last!r})")
        time.sleep(interval)
