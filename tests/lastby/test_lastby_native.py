"""The last-by state's C key index (``lastbykeys.IndexKeys``) against the Arrow reference
(``ArrowKeys``): the same random operations on two states, one on each, must give identical
states, checkpoint files and IPC at every step, both equal to ``last_by`` of the rows.

The operations are a location's: rows appended (committed or not, so that some are rolled
back), publishes (the state catches up from the appended arrays, or from the rows as the files
return them), checkpoints (``lastby.<rows>.arrow`` written to real files), reloads (a fresh
state from the checkpoint's file, or rebuilt from the rows when the file is missing or damaged),
and a key limit the updates may pass.  Keys are one to three columns of every kind (strings
short and long, empty and null; integers, chars and timestamps with their null sentinels;
floats with -0.0, NaNs of two bit patterns and the sentinel; booleans)."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disd.schema import TableSchema
from disd.storage import lastbykeys
from disd.storage.fsio import OS
from disd.storage.lastby import LastBy, LastByLimitError, last_by, stored, to_ipc
from support.rows import bits

SCHEMA = TableSchema.from_dict({
    "namespace": "Test", "table": "Keys", "partition_column": "Date",
    "columns": [{"name": "S", "type": "string"}, {"name": "I", "type": "long"}, {"name": "D", "type": "double"},
                {"name": "B", "type": "bool"}, {"name": "C", "type": "char"}, {"name": "T", "type": "timestamp"},
                {"name": "F", "type": "float"}, {"name": "Y", "type": "byte"}, {"name": "V", "type": "int"}]})

_NAN2 = np.frombuffer(np.array([0xFFF8000000000001], np.uint64).tobytes(), np.float64)[0]  # another NaN
_F_NAN2 = np.frombuffer(np.array([0xFFC00001], np.uint32).tobytes(), np.float32)[0]
POOLS = {
    "S": ["", "a", "ab", "abc", "K1", "K12", "abcd", "K1234", "abcdefg", "abcdefgh", "abcdefghi", "K123456789012",
          "a much longer key that spans several words", "é", "日本", None],
    "I": [0, 1, -1, 7, 2**62, -(2**63), None],  # -(2**63): the null sentinel
    "D": [0.0, -0.0, 1.5, float("nan"), _NAN2, -np.finfo(np.float64).max, float("inf"), None],
    "B": [True, False, None],
    "C": [0, 65, 0xFFFE, 0xFFFF, None],  # 0xFFFF: the sentinel
    "T": [0, 1, 1_763_802_000_000_000_000, -(2**63), None],
    "F": [0.0, -0.0, 2.5, float("nan"), _F_NAN2, -np.finfo(np.float32).max, None],
    "Y": [0, 1, -1, -128, None],
}
KEYS = [("S",), ("I",), ("D",), ("B",), ("C",), ("T",), ("F",), ("Y",), ("S", "I"), ("D", "S"), ("F", "B", "C"),
        ("T", "S", "Y"), ("D", "F")]


def rows(n: int, seed: int, start: int, keys: tuple[str, ...], narrow: int) -> list[pa.Array]:
    """``n`` rows of the schema, the key columns drawn from (the first ``narrow`` values of) their
    pools, V the row number; the columns in the Arrow types the DIS holds."""
    rng = np.random.default_rng(seed)
    cols = []
    for c in SCHEMA.columns:
        if c.name == "V":
            cols.append(pa.array(np.arange(start, start + n, dtype=np.int32)))
            continue
        pool = POOLS[c.name][: max(1, narrow)] + ([None] if c.name in keys else [])
        values = [pool[i] for i in rng.integers(0, len(pool), n)] if c.name in keys else \
            [POOLS[c.name][i] for i in rng.integers(0, len(POOLS[c.name]) - 1, n)]
        t = c.type.arrow_type
        if c.name == "T":
            cols.append(pa.array(values, pa.int64()).view(t) if values else pa.array([], t))
        elif c.name == "F":
            cols.append(pa.array([None if v is None else np.float32(v) for v in values], t))
        else:
            cols.append(pa.array(values, t))
    return cols



def as_read(cols: list[pa.Array]) -> pa.Table:
    """The rows as a read of the column files returns them (sentinels as nulls)."""
    return pa.Table.from_arrays([stored(c, a) for c, a in zip(SCHEMA.columns, cols)], schema=SCHEMA.arrow_schema())


class Model:
    """One location's rows and the two states fed from them (C index, Arrow reference)."""

    def __init__(self, keys: tuple[str, ...], max_keys: int, root) -> None:
        self.keys, self.max_keys = keys, max_keys
        self.dirs = [root / "native", root / "arrow"]
        for d in self.dirs:
            d.mkdir()
        self.states = [LastBy(SCHEMA, keys, max_keys, native=True), LastBy(SCHEMA, keys, max_keys, native=False)]
        self.written: list[list[pa.Array]] = []  # appended batches (committed or not)
        self.committed = self.published = self.checkpointed = 0
        self.refs: list[dict | None] = [None, None]
        self.failed = False  # the key limit was passed: the location stopped

    def table(self) -> pa.Table:
        if not self.written:
            return as_read(rows(0, 0, 0, self.keys, 1))
        return as_read([pa.concat_arrays([b[i] for b in self.written]) for i in range(len(SCHEMA.columns))])

    def append(self, n: int, seed: int, commit: bool, narrow: int) -> None:
        start = sum(len(b[0]) for b in self.written)
        cols = rows(n, seed, start, self.keys, narrow)
        for lb in self.states:
            lb.pending.add(start, cols, [(0, n)])
        self.written.append(cols)
        if commit:
            self.committed = start + n

    def rollback(self) -> None:
        for lb in self.states:
            lb.pending.truncate(self.committed)
        kept, row = [], 0
        for b in self.written:
            if row + len(b[0]) <= self.committed:
                kept.append(b)
            elif row < self.committed:
                kept.append([c.slice(0, self.committed - row) for c in b])
            row += len(b[0])
        self.written = kept

    def publish(self, from_files: bool) -> None:
        self.published = self.committed
        table = self.table()
        outcomes = []
        for lb in self.states:
            if from_files:
                lb.pending.clear()
            try:
                lb.catch_up(self.published, lambda a, b, lb=lb: lb.rows(a, b, lambda: table.slice(a, b - a)))
                outcomes.append(None)
            except LastByLimitError as e:
                outcomes.append(str(e))
        assert outcomes[0] == outcomes[1]
        if outcomes[0] is not None:
            self.failed = True

    def checkpoint(self) -> None:
        data = []
        for i, lb in enumerate(self.states):
            state = lb.snapshot()
            ref = lb.write(str(self.dirs[i]), OS, state)
            lb.committed(str(self.dirs[i]), OS, ref)
            self.refs[i] = ref
            data.append((ref, (self.dirs[i] / ref["file"]).read_bytes()))
        assert data[0] == data[1]  # the same entry (size, CRC32C) and the same file bytes
        self.checkpointed = self.states[0].snapshot().rows

    def reload(self, damage: str) -> None:
        """A restart: fresh states loaded from the checkpoint (or rebuilt from its rows)."""
        rows_ = self.checkpointed
        self.committed = self.published = rows_
        self.rollback()
        table = self.table()
        fresh = [LastBy(SCHEMA, self.keys, self.max_keys, native=True),
                 LastBy(SCHEMA, self.keys, self.max_keys, native=False)]
        for i, lb in enumerate(fresh):
            ref = self.refs[i]
            if ref is not None and damage == "missing":
                os.unlink(self.dirs[i] / ref["file"])
            elif ref is not None and damage == "damaged":
                path = self.dirs[i] / ref["file"]
                data = bytearray(path.read_bytes())
                data[len(data) // 2] ^= 0x55
                path.write_bytes(bytes(data))
            lb.recover(str(self.dirs[i]), OS, ref, rows_, lambda a, b: table.slice(a, b - a), "test")
            self.refs[i] = lb.durable_ref
        self.states = fresh
        self.failed = False

    def check(self) -> None:
        a, b = (lb.snapshot() for lb in self.states)
        assert (a.rows, a.seq) == (b.rows, b.seq)
        assert bits(a.table).equals(bits(b.table))
        assert to_ipc(a.table) == to_ipc(b.table)
        if not self.failed:
            assert a.rows == self.published
            assert bits(a.table).equals(bits(last_by(self.table().slice(0, a.rows), self.keys)))
        assert a.table.num_rows <= self.max_keys


OPS = st.one_of(
    st.tuples(st.just("append"), st.integers(0, 300), st.integers(0, 2**16), st.booleans(), st.integers(1, 16)),
    st.tuples(st.just("rollback")),
    st.tuples(st.just("publish"), st.booleans()),
    st.tuples(st.just("checkpoint")),
    st.tuples(st.just("reload"), st.sampled_from(["none", "missing", "damaged"])),
)


@pytest.mark.skipif(lastbykeys.lastbyindex is None, reason="the C key index was not built")  # test_c_index_is_built fails then
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=st.sampled_from(KEYS), max_keys=st.sampled_from([3, 20, 1000]),
       ops=st.lists(OPS, min_size=1, max_size=25))
def test_the_c_index_gives_the_reference_states_files_and_ipc(tmp_path_factory, keys, max_keys, ops):
    m = Model(keys, max_keys, tmp_path_factory.mktemp("lastby"))
    for op in ops:
        if op[0] == "append":
            m.append(op[1], op[2], op[3], op[4])
        elif op[0] == "rollback":
            m.rollback()
        elif op[0] == "publish" and not m.failed:
            m.publish(op[1])
        elif op[0] == "checkpoint" and not m.failed:
            m.checkpoint()
        elif op[0] == "reload":
            m.reload(op[1])
        m.check()


def test_c_index_is_built():
    """``make install`` builds the C key index (setup.py), and states use it by default."""
    assert lastbykeys.lastbyindex is not None, "disd.storage.lastbyindex was not built (no C compiler?)"
    assert isinstance(LastBy(SCHEMA, ("S",), 10)._slots, lastbykeys.IndexKeys)  # noqa: SLF001 - the test checks which slot finder the state chose


def test_a_batch_with_many_new_keys_grows_the_index_and_keeps_every_key():
    """Many new keys in one batch of three chunks (the table doubles several times inside one
    update, hashing each key again where it lives: the state or the chunk it first appeared in)
    and then again in the next."""
    lb, ref = LastBy(SCHEMA, ("S", "I"), 10**6, native=True), LastBy(SCHEMA, ("S", "I"), 10**6, native=False)
    n = 0
    for size in (50_000, 70_000, 5):
        cols = rows(size, size, n, ("S", "I"), 16)
        cols[0] = pa.array([f"k{(i * 7919) % 90_000}" for i in range(n, n + size)])  # repeats across batches
        cut = size // 3  # as a publish's pieces: chunks, new keys first seen in each
        cols = [pa.chunked_array([c.slice(0, cut), c.slice(cut, cut), c.slice(2 * cut)]) for c in cols]
        for x in (lb, ref):
            x.apply(cols, n + size)
        n += size
        assert bits(lb.snapshot().table).equals(bits(ref.snapshot().table))
    assert len(lb.snapshot().table) >= 90_000
    assert lb.snapshot().nbytes < ref.snapshot().nbytes  # the index holds no key bytes


def test_columns_chunked_at_different_rows_give_the_same_state():
    """A batch whose columns are cut into chunks at different rows (not a publish's pieces):
    each key's last row is still taken from every column at the same row."""
    cols = rows(900, 7, 0, ("S",), 16)
    cuts = [[0, 100, 900], [0, 450, 451, 900]]
    chunked = [pa.chunked_array([c.slice(a, b - a) for a, b in zip(cuts[i % 2], cuts[i % 2][1:])])
               for i, c in enumerate(cols)]
    for native in (True, False):
        lb = LastBy(SCHEMA, ("S",), 1000, native=native)
        lb.apply(chunked, 900)
        assert bits(lb.snapshot().table).equals(bits(last_by(as_read(cols), ("S",))))


@pytest.mark.skipif(lastbykeys.lastbyindex is None, reason="the C key index was not built")  # test_c_index_is_built fails then
def test_an_update_holds_memory_of_the_keys_not_of_the_batch(monkeypatch):
    """A publish of many rows over few known keys builds its new state without a copy of the
    batch (no column of it joined: fresh memory the size of the batch is page faults at every
    large publish in the DIS): Arrow's and numpy's memory at its peak stays far below one column
    of the batch, and the state is still the last-by of the rows.  (The C index's key pass reads
    the pieces in place; the reference's joins the batch's keys, so only the C index is asked.)"""
    import tracemalloc

    from disd.storage import lastby as lastby_mod

    pool = pa.proxy_memory_pool(pa.system_memory_pool())
    monkeypatch.setattr(lastby_mod, "POOL", pool)
    monkeypatch.setattr(lastbykeys, "POOL", pool)
    lb = LastBy(SCHEMA, ("S",), 1000, native=True)
    first = rows(200, 1, 0, ("S",), 16)
    lb.apply(first, 200)
    n = 300_000
    batch = rows(n, 2, 200, ("S",), 16)
    pieces = [pa.chunked_array([c.slice(0, 100_000), c.slice(100_000, 100_000), c.slice(200_000)]) for c in batch]
    column_bytes = 8 * n  # one int64 column of the batch
    before = pool.bytes_allocated()
    tracemalloc.start()
    try:
        lb.apply(pieces, 200 + n)
        numpy_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert pool.max_memory() - before < column_bytes / 4, pool.max_memory() - before
    assert numpy_peak < column_bytes / 4, numpy_peak
    everything = as_read([pa.concat_arrays([a, b]) for a, b in zip(first, batch)])
    assert bits(lb.snapshot().table).equals(bits(last_by(everything, ("S",))))


@pytest.mark.skipif(lastbykeys.lastbyindex is None, reason="the C key index was not built")  # test_c_index_is_built fails then
def test_string_keys_alike_in_their_first_eight_bytes_stay_apart_in_large_and_small_publishes():
    """One string key column: a publish with at least a quarter as many rows as the state has
    keys compares each row with the state's keys as per-call records (length and first 8 bytes);
    a smaller one with the state's column.  Keys of the same length alike in their first 8 bytes
    (and a null, an empty string, keys of exactly 8 bytes) must stay distinct in both."""
    rng = np.random.default_rng(5)
    pool = [f"prefix00{i:05d}" for i in range(3000)] + [f"pre{i:05d}" for i in range(500)] + ["", None, "prefix00"]
    lb, ref = LastBy(SCHEMA, ("S",), 10**6, native=True), LastBy(SCHEMA, ("S",), 10**6, native=False)
    n, seed = 0, 0
    for size in (len(pool), 3000, 50, 900, 10, 2500):  # records (>= keys / 4) and the column (< keys / 4)
        seed += 1
        cols = rows(size, seed, n, ("S",), 16)
        drawn = rng.permutation(size) if n == 0 else rng.integers(0, len(pool), size)  # (every key, first)
        cols[0] = pa.array([pool[i] for i in drawn], pa.string())
        for x in (lb, ref):
            x.apply(cols, n + size)
        n += size
        assert bits(lb.snapshot().table).equals(bits(ref.snapshot().table)), size
    assert len(lb.snapshot().table) == len(pool)


@pytest.mark.skipif(lastbykeys.lastbyindex is None, reason="the C key index was not built")  # test_c_index_is_built fails then
def test_string_keys_whose_first_bytes_pack_alike_stay_apart_in_publishes_larger_than_the_state():
    """One string key column: a publish of at least as many rows as the state has keys finds the
    state's keys in a table of the call's own whose entries hold a key's length and first bytes
    packed into 8 bytes (a key of up to 7 bytes with its length in the top byte, a longer one its
    first 8 bytes).  So ``s1`` and every key of 8 bytes or more starting ``s1``, five zero bytes
    and a 2 pack to the same number, and must still stay apart; as must the null and the empty
    key, keys of exactly 8 bytes, and keys the state does not hold yet.  Hundreds of such keys, in
    several orders, put them in each other's probe runs."""
    shorts = [f"s{j}" for j in range(12)] + ["abcdefg", ""]
    partners = [k + "\x00" * (7 - len(k)) + chr(len(k)) + (f"{v}" if v else "") for k in shorts for v in range(15)]
    pool = shorts + partners + [None, "\x00", "abcdefgh"] + [f"new{j}" for j in range(40)]
    for trial in range(4):
        rng = np.random.default_rng(trial)
        lb, ref = LastBy(SCHEMA, ("S",), 10**6, native=True), LastBy(SCHEMA, ("S",), 10**6, native=False)
        n = 0
        for publish in range(6):
            # first most of the pool (each key once, in a random order), then publishes of twice
            # the state's keys drawn from the whole pool (new keys among them), one smaller
            size = len(pool) - 40 if publish == 0 else (30 if publish == 3 else 2 * len(lb.snapshot().table) + 7)
            cols = rows(size, 100 * trial + publish, n, ("S",), 16)
            drawn = rng.permutation(len(pool))[:size] if publish == 0 else rng.integers(0, len(pool), size)
            cols[0] = pa.array([pool[i] for i in drawn], pa.string())
            for x in (lb, ref):
                x.apply(cols, n + size)
            n += size
            assert bits(lb.snapshot().table).equals(bits(ref.snapshot().table)), (trial, publish)
        assert len(lb.snapshot().table) == len(pool)


def _index_update(index, state: list, batch: list, pieces: int):  # noqa: ANN001, ANN202
    """One ``KeyIndex.update`` of string keys: the state's keys and the batch's (in ``pieces``
    chunks) as Arrow arrays; (total, changed slots, their last rows)."""
    def cols(a: pa.Array) -> list:
        b = a.buffers()
        return [(b[0] if a.null_count else None, b[1], b[2], a.offset)]

    arr = pa.array(batch, pa.string())
    cut = np.linspace(0, len(batch), pieces + 1).astype(int)
    chunks = [(int(b - a), cols(arr.slice(a, b - a))) for a, b in zip(cut, cut[1:])]
    total, changed, rows = index.update(cols(pa.array(state, pa.string())), len(state), chunks, len(batch), 10**6)
    return total, np.frombuffer(changed, np.int64).tolist(), np.frombuffer(rows, np.int64).tolist()


@pytest.mark.skipif(lastbykeys.lastbyindex is None, reason="the C key index was not built")  # test_c_index_is_built fails then
@pytest.mark.parametrize("hash_bits", [0, 3, 64])
def test_every_string_comparison_of_the_index_tells_keys_apart_when_hashes_collide(hash_bits):
    """The index compares keys only when their hashes agree in position and tag, so random keys
    never reach most of its comparisons.  With a hash cut to ``hash_bits`` bits (0: every key the
    same hash) every row is compared with many keys, in each of a call's ways: with the state's
    column (a small batch), its records (a quarter of the keys or more), its own table (as many
    rows as keys or more: ``abcdefg`` and the keys of 8 bytes or more starting ``abcdefg\x07``
    pack alike there), and the keys new in the batch (their records).  Each call's slots and last
    rows must be a dict's."""
    shorts = ["s1", "abcdefg", "", "\x00", "a"]
    pool = (shorts + [k + "\x00" * (7 - len(k)) + chr(len(k)) + t for k in shorts for t in ("", "x", "yz")]
            + [None, "abcdefgh", "abcdefghi", "abcdefghj", "abcdefg\x00", "prefix0012345", "prefix0012346"]
            + [f"k{j}" for j in range(20)])
    rng = np.random.default_rng(hash_bits)
    for trial in range(3):
        index = lastbykeys.lastbyindex.KeyIndex([(3, 0, None)], hash_bits=hash_bits)
        state: list = []
        slots: dict = {}
        for size in (12, 3, 40, 9, 200, 2, 25, 120, 60):
            batch = [pool[i] for i in rng.integers(0, len(pool), size)]
            last: dict = {}
            for row, key in enumerate(batch):
                slots.setdefault(key, len(slots))
                last[slots[key]] = row
            got = _index_update(index, state, batch, 1 + trial)
            assert got == (len(slots), sorted(last), [last[c] for c in sorted(last)]), (trial, size)
            state = sorted(slots, key=slots.__getitem__)


@pytest.mark.parametrize("native", [True, False])
def test_new_keys_last_seen_in_pieces_out_of_their_order_keep_their_slots(native):
    """New string keys of one publish whose last rows lie in its pieces in another order than
    their first rows (A and B first seen in that order, B last in the first piece, A in the
    second): the state's key column, kept with its new keys appended, still lists them by first
    appearance, beside the rows of their other columns."""
    first = rows(3, 1, 0, ("S",), 1)
    first[0] = pa.array(["K0", "K0", "K0"])
    batch = rows(5, 2, 3, ("S",), 1)
    batch[0] = pa.array(["A", "B", "C", "A", "C"])  # last rows: B in piece 0, A and C in piece 1
    pieces = [pa.chunked_array([c.slice(0, 2), c.slice(2)]) for c in batch]
    lb = LastBy(SCHEMA, ("S",), 100, native=native)
    lb.apply(first, 3)
    lb.apply(pieces, 8)
    everything = as_read([pa.concat_arrays([a, b]) for a, b in zip(first, batch)])
    assert lb.snapshot().table.column("S").to_pylist() == ["K0", "A", "B", "C"]
    assert bits(lb.snapshot().table).equals(bits(last_by(everything, ("S",))))
