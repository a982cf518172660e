"""The rule for "still being written": a merge of such a column partition is refused unless forced.

Merging a partition that is still growing would publish a historical copy that misses rows (and
a later merge would have to replace it).  A column partition is **live** when any of these holds:

1. its value is an ISO date (``YYYY-MM-DD``) that is today or later, in UTC;
2. read from a DIS: one of its locations has published rows that are not yet checkpointed, or
   a connected tailer that brought rows less than ``quiet_s`` seconds ago (its last checkpoint
   of new rows is younger: a tailer stays connected all day, and yesterday's idle one does not
   make yesterday live);
3. read from the column files: one of its locations has column file bytes past its checkpoint
   (rows written since ``table.size``; a location never checkpointed counts too), or its
   ``table.size`` changed less than ``quiet_s`` seconds ago (the DIS rewrites it only when rows
   were added, so a recent change means recent ingestion).

``dis merge --force`` merges anyway; the merged copy records exactly which rows it holds, and a
later merge of the same partition writes a new version when more rows have arrived.
"""

from __future__ import annotations

import datetime as dt

from disd.errors import DisError
from disd.historical.intraday import SourceSnapshot

#: Seconds a location's checkpoint must be unchanged before its partition counts as finished
#: (four of the DIS's default 30 s checkpoint intervals).
DEFAULT_QUIET_S = 120.0


class LivePartitionError(DisError):
    """The partition is still being written; the message lists why and how to force it."""


def today_utc() -> dt.date:
    return dt.datetime.now(dt.timezone.utc).date()


def live_reasons(snap: SourceSnapshot, today: dt.date | None = None, quiet_s: float = DEFAULT_QUIET_S) -> list[str]:
    """Why ``snap``'s column partition is still being written (empty: it is not)."""
    reasons = []
    today = today or today_utc()
    try:
        day = dt.date.fromisoformat(snap.value)
    except ValueError:
        day = None
    if day is not None and len(snap.value) == 10 and day >= today:
        reasons.append(f"{snap.value} is not before today ({today.isoformat()}, UTC)")
    for loc in snap.locations:
        where = f"{snap.namespace}.{snap.table}/{loc.internal_partition}/{snap.value}"
        if loc.tailer and (loc.tailer_idle_s is None or loc.tailer_idle_s < quiet_s):
            idle = "" if loc.tailer_idle_s is None else f" and its rows last changed {loc.tailer_idle_s:.0f} s ago"
            reasons.append(f"{where}: tailer {loc.tailer} is connected{idle} (< {quiet_s:g} s)")
        if loc.rows_past_checkpoint:
            reasons.append(f"{where}: {loc.rows_past_checkpoint} published rows are not checkpointed yet")
        if loc.bytes_past_checkpoint:
            reasons.append(f"{where}: {loc.bytes_past_checkpoint} column bytes past its checkpoint")
        if loc.checkpoint_age_s is not None and loc.checkpoint_age_s < quiet_s:
            reasons.append(f"{where}: checkpoint changed {loc.checkpoint_age_s:.0f} s ago (< {quiet_s:g} s)")
    return reasons


def check_not_live(snap: SourceSnapshot, today: dt.date | None = None, quiet_s: float = DEFAULT_QUIET_S) -> None:
    reasons = live_reasons(snap, today, quiet_s)
    if reasons:
        raise LivePartitionError(
            f"{snap.namespace}.{snap.table} {snap.value} is still being written: " + "; ".join(reasons)
            + " (use --force to merge it anyway)")
