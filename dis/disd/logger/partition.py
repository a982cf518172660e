"""Column partitions computed by a user function, per row or vectorized over a batch."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from disd.logger.errors import LoggerValueError
from disd.names import NameKind, validate_name
from disd.schema import TableSchema


def python_values(arr: pa.Array) -> list:
    """An Arrow column's values as the Python values a partition function receives."""
    if pa.types.is_timestamp(arr.type):
        arr = arr.view(pa.int64())
    return arr.to_pylist()


class PartitionFunction:
    """A user's column partition function, the columns it is given, and how it is called."""

    def __init__(self, fn: Callable, schema: TableSchema, columns: Sequence[str] | None, vectorized: bool) -> None:
        self.fn = fn
        self.vectorized = vectorized
        names = schema.column_names
        if columns is not None:
            columns = [columns] if isinstance(columns, str) else list(columns)
            for c in columns:
                schema.column(c)  # KeyError for an unknown column
        self.columns: list[str] | None = columns
        self.indices = [names.index(c) for c in (columns or names)]
        self.names = [names[i] for i in self.indices]
        self.types = [schema.columns[i].type.arrow_type for i in self.indices]
        self._valid: set[str] = set()

    def check(self, value: Any) -> str:
        if value in self._valid:
            return value
        validate_name(NameKind.COLUMN_PARTITION, value)
        if len(self._valid) < 4096:
            self._valid.add(value)
        return value

    def for_row(self, row: tuple) -> str:
        """Partition of one normalized row (schema order)."""
        if self.vectorized:
            table = pa.table([pa.array([row[i]], t) for i, t in zip(self.indices, self.types)], names=self.names)
            out = self.fn(table)
            if not isinstance(out, str):
                out = pa.array(out) if not isinstance(out, (pa.Array, pa.ChunkedArray)) else out
                if len(out) != 1:
                    raise LoggerValueError(f"partition function returned {len(out)} values for 1 row")
                out = out[0].as_py()
            return self.check(out)
        return self.check(self.fn({n: row[i] for n, i in zip(self.names, self.indices)}))

    def for_batch(self, cols: list[pa.Array]) -> tuple[list[str], np.ndarray | None]:
        """(partition names in order of first appearance, per-row index into them or None when
        every row is in the first)."""
        n = len(cols[0])
        sub = [cols[i] for i in self.indices]
        if self.vectorized:
            out = self.fn(pa.Table.from_arrays(sub, names=self.names))
            if isinstance(out, str):
                return [self.check(out)], None
            if isinstance(out, pa.ChunkedArray):
                out = out.combine_chunks()
            elif not isinstance(out, pa.Array):
                out = pa.array(out, pa.string())
            if len(out) != n:
                raise LoggerValueError(f"partition function returned {len(out)} values for {n} rows")
            if out.null_count:
                raise LoggerValueError("partition function returned a null partition")
            enc = out.dictionary_encode()
            codes = np.asarray(enc.indices).astype(np.int64, copy=False)
            labels: list[str] = [self.check(v) for v in enc.dictionary.to_pylist()]
            return first_appearance(labels, codes)
        if self.columns is None:
            rows = zip(*[python_values(c) for c in sub])
            labels = []
            index: dict[str, int] = {}
            codes = np.empty(n, np.int64)
            for k, vals in enumerate(rows):
                p = self.fn(dict(zip(self.names, vals)))
                j = index.get(p)
                if j is None:
                    j = index[p] = len(labels)
                    labels.append(self.check(p))
                codes[k] = j
            return first_appearance(labels, codes)
        # One call per distinct combination of the named columns.
        key = np.zeros(n, np.int64)
        dicts = []
        codes_per_col = []
        radix_ok = True
        span = 1
        for c in sub:
            enc = c.dictionary_encode(null_encoding="encode")
            codes = np.asarray(enc.indices).astype(np.int64, copy=False)
            size = max(len(enc.dictionary), 1)
            dicts.append(python_values(enc.dictionary))
            codes_per_col.append(codes)
            span *= size
            if span >= 2**62:
                radix_ok = False
            else:
                key = key * size + codes
        if radix_ok:
            _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        else:
            _, first, inverse = np.unique(np.stack(codes_per_col, axis=1), axis=0, return_index=True,
                                          return_inverse=True)
        inverse = inverse.reshape(-1)
        labels = []
        index = {}
        combo_to_label = np.empty(len(first), np.int64)
        for u, r in enumerate(first.tolist()):
            row = {nm: d[cc[r]] for nm, d, cc in zip(self.names, dicts, codes_per_col)}
            p = self.fn(row)
            j = index.get(p)
            if j is None:
                j = index[p] = len(labels)
                labels.append(self.check(p))
            combo_to_label[u] = j
        return first_appearance(labels, combo_to_label[inverse])


def first_appearance(labels: list[str], codes: np.ndarray) -> tuple[list[str], np.ndarray | None]:
    """Renumber ``codes`` so that partitions number in the order their first row appears."""
    if len(labels) == 1:
        return labels, None
    present, first = np.unique(codes, return_index=True)
    order = present[np.argsort(first, kind="stable")]
    remap = np.empty(len(labels), np.int64)
    remap[order] = np.arange(len(order))
    return [labels[i] for i in order.tolist()], remap[codes]
