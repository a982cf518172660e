"""A ``dis`` command broken on purpose, for the tests of the tests: ``python -m realfaults.broken
BREAK ARGS...`` applies one breakage of the checkpoint's order (the same engines
``faults/test_power_loss.py`` breaks, ``BREAKS``) or of the proxy's published sizes
(``OTHER_BREAKS``), then runs ``dis ARGS...`` as the real command would."""

from __future__ import annotations

import sys


def _proxy_publishes_any_size() -> None:
    """A proxy that publishes whatever its upstream DIS lists, smaller sizes included (the rule
    it breaks: docs/proxy.md, "Published sizes")."""
    from disd.blocks import LocationSnapshot
    from disd.proxy import upstream

    def publish(self, infos, address):
        changed = []
        with self._lock:
            for m in infos:
                snap = LocationSnapshot.from_msg(m, address)
                if (snap.key.namespace, snap.key.table) != (self.namespace, self.table):
                    continue
                old = self.snaps.get(snap.key)
                if old is not None and snap.rows == old.rows:
                    continue
                self.snaps[snap.key] = snap
                changed.append(snap)
            listeners = list(self._listeners)
        for f in listeners if changed else ():
            f(changed)
        return changed

    owner = next(c for c in vars(upstream).values() if isinstance(c, type) and "publish" in vars(c))
    owner.publish = publish


OTHER_BREAKS = {"proxy_publishes_any_size": _proxy_publishes_any_size}


def apply(name: str) -> None:
    from faults.test_power_loss import BREAKS

    if name in BREAKS:
        target, attr, fn = BREAKS[name]
        setattr(target, attr, fn)
    elif name in OTHER_BREAKS:
        OTHER_BREAKS[name]()
    else:
        raise SystemExit(f"unknown breakage {name!r} (known: {', '.join([*sorted(BREAKS), *OTHER_BREAKS])})")


def main() -> int:
    name, *argv = sys.argv[1:]
    apply(name)
    from disd.cli import main as dis_main

    return dis_main(argv)


if __name__ == "__main__":
    sys.exit(main())
