"""The transaction flag rules of a batch of rows, planned in O(transactions) numpy steps.

A location applies a ``TransactionPlan`` to its buffers; the plan itself depends only on the
flags and on whether a transaction was open before the batch, so it lives apart from the I/O
(docs/storage-format.md, Transactions).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from disd.binlog import RowFlag


@dataclass
class TransactionPlan:
    """How a batch of flags applies to a location (see docs/storage-format.md, Transactions)."""

    keep: np.ndarray | None  # rows to write; None = all
    rollback_open: bool  # the transaction open before this batch is abandoned
    last_commit: int  # index of the batch's last committing row, -1 when none
    open_at_end: bool  # a transaction is still open after the batch
    abandoned: int  # transactions abandoned by a Start or SingleRow inside them
    end_without_start: int


def plan_transactions(flags: np.ndarray, in_txn: bool) -> TransactionPlan:
    """Apply the flag rules to a batch in O(transactions) steps, not O(rows).

    Outside a transaction every row commits by itself (SingleRow; also None and a stray End).
    Start opens a transaction; End commits it.  A Start or SingleRow inside an open transaction
    abandons it: its rows are rolled back and the row is then processed outside a transaction."""
    n = len(flags)
    starts = np.flatnonzero(flags == RowFlag.START_TRANSACTION)
    breakers = np.flatnonzero(flags != RowFlag.NONE)
    keep: np.ndarray | None = None
    rollback_open = False
    last_commit = -1
    abandoned = end_without_start = 0
    txn_begin = -1  # batch index where the open transaction began; -1: before this batch
    pos = 0
    while pos < n:
        if in_txn:
            i = int(np.searchsorted(breakers, pos))
            if i == len(breakers):
                break
            b = int(breakers[i])
            if flags[b] == RowFlag.END_TRANSACTION:
                last_commit = b
                in_txn = False
                pos = b + 1
            else:
                abandoned += 1
                if txn_begin < 0:
                    rollback_open = True
                if b > max(txn_begin, 0):
                    if keep is None:
                        keep = np.ones(n, bool)
                    keep[max(txn_begin, 0) : b] = False
                in_txn = False
                pos = b
        else:
            i = int(np.searchsorted(starts, pos))
            stop = int(starts[i]) if i < len(starts) else n
            if stop > pos:
                last_commit = stop - 1
                end_without_start += int(np.count_nonzero(flags[pos:stop] == RowFlag.END_TRANSACTION))
            if stop == n:
                break
            in_txn = True
            txn_begin = stop
            pos = stop + 1
    return TransactionPlan(keep, rollback_open, last_commit, in_txn, abandoned, end_without_start)
