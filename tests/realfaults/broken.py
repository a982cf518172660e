"""A ``dis`` command broken on purpose, for the tests of the tests: ``python -m realfaults.broken
BREAK ARGS...`` applies one breakage of the checkpoint's order (the same engines
``faults/test_power_loss.py`` breaks, ``BREAKS``) or of publishing (``PUBLISH_BREAKS``), then runs
``dis ARGS...`` as the real command would."""

from __future__ import annotations

import sys


def _publish_uncommitted() -> None:
    """Publish every row written, committed or not: an open transaction's rows become visible
    and, when its stream breaks and it is rolled back, vanish again."""
    from disd.storage import location as location_mod

    real = location_mod.Location._flush_locked

    def flush_all(self):  # noqa: ANN001, ANN202
        changed = real(self)
        rows = self.writers and min(w.rows for w in self.writers.values()) if hasattr(
            next(iter(self.writers.values()), None), "rows") else None
        if rows and rows > self.published_rows:
            self.published_rows = rows
        return changed

    location_mod.Location._flush_locked = flush_all


def apply(name: str) -> None:
    from faults.test_power_loss import BREAKS

    if name in BREAKS:
        target, attr, fn = BREAKS[name]
        setattr(target, attr, fn)
    elif name == "publish_uncommitted":
        _publish_uncommitted()
    else:
        raise SystemExit(f"unknown breakage {name!r} (known: {', '.join([*sorted(BREAKS), 'publish_uncommitted'])})")


def main() -> int:
    name, *argv = sys.argv[1:]
    apply(name)
    from disd.cli import main as dis_main

    return dis_main(argv)


if __name__ == "__main__":
    sys.exit(main())
