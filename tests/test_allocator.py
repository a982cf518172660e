"""disd.allocator: the heap trimmer's rule (fake readings) and, in a process of its own, that
glibc really keeps a fragmented heap's free pages until the trimmer hands them back."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from disd.allocator import MiB, HeapTrimmer


class FakeProcess:
    """A resident size the test sets, and the trims asked of it; a trim brings the size down to
    ``after_trim`` when one is set."""

    def __init__(self, rss_mib: int) -> None:
        self.rss = rss_mib * MiB
        self.after_trim: int | None = None
        self.trims = 0

    def read(self) -> int:
        return self.rss

    def release(self) -> bool:
        self.trims += 1
        if self.after_trim is not None:
            self.rss = self.after_trim * MiB
        return True


def trimmer(p: FakeProcess, **kw) -> HeapTrimmer:
    return HeapTrimmer(read_resident=p.read, release=p.release, **kw)


def test_trims_once_the_size_is_growth_above_the_windows_low():
    p = FakeProcess(100)
    t = trimmer(p, growth=64 * MiB, window_s=60)
    assert not t.tick(now=0)
    p.rss = 163 * MiB
    assert not t.tick(now=1)  # 63 MiB above the low: not yet
    p.rss, p.after_trim = 164 * MiB, 101
    assert t.tick(now=2)
    assert p.trims == 1
    assert not t.tick(now=3)  # back down: nothing more to do
    assert p.trims == 1


def test_memory_that_stays_level_is_never_trimmed_however_high():
    p = FakeProcess(900)
    t = trimmer(p, growth=64 * MiB, window_s=60)
    for second in range(300):
        p.rss = (900 + second % 50) * MiB  # busy, up and down by less than the growth
        assert not t.tick(now=second)
    assert p.trims == 0


def test_a_trim_in_the_middle_of_a_burst_does_not_raise_the_bar_for_the_next():
    p = FakeProcess(100)
    t = trimmer(p, growth=64 * MiB, window_s=60)
    t.tick(now=0)
    p.rss, p.after_trim = 300 * MiB, 290  # the burst's blocks are in use: the trim returns little
    assert t.tick(now=1)
    p.after_trim = None
    p.rss = 200 * MiB  # the burst is over; its free pages stay resident
    p.after_trim = 100
    assert t.tick(now=2), "measured against the window's low (100), not the last trim's 290"
    assert p.rss == 100 * MiB


def test_a_lasting_rise_stops_counting_as_growth_once_the_window_has_passed():
    p = FakeProcess(100)
    t = trimmer(p, growth=64 * MiB, window_s=10)
    t.tick(now=0)
    p.rss = 400 * MiB  # the block cache filled: a trim releases nothing
    trimmed = [t.tick(now=s) for s in range(1, 25)]
    assert all(trimmed[:10]), trimmed
    assert not any(trimmed[11:]), trimmed
    assert p.trims == sum(trimmed)


PROBE = textwrap.dedent("""
    import json
    from disd.allocator import DIS, MiB, HeapTrimmer, resident_bytes, tune_malloc
    assert tune_malloc(DIS)
    blocks = [bytearray(64 * 1024) for _ in range(4000)]  # 250 MiB from the heap (below 4 MiB)
    kept = blocks[::16]  # every 16th stays in use: the free pages between them cannot go back
    full = resident_bytes()
    del blocks
    freed = resident_bytes()
    trimmer = HeapTrimmer()
    trimmer._readings.append((0.0, full - 250 * MiB))  # the size before the blocks
    trimmed = trimmer.tick(now=1.0)
    print(json.dumps({"full": full, "freed": freed, "trimmed": trimmed, "after": resident_bytes(),
                      "kept": len(kept)}))
""")


def test_the_trimmer_hands_a_fragmented_heaps_free_pages_back():
    """Freeing 15 of every 16 64 KiB blocks returns nothing by itself (the trim threshold only
    hands back a heap's top); the trimmer's tick returns them."""
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout.strip().splitlines()[-1])
    assert m["full"] - m["freed"] < 32 * MiB, m  # free alone keeps the pages
    assert m["trimmed"] is True, m
    assert m["freed"] - m["after"] > 180 * MiB, m  # about 15/16 of 250 MiB went back
