"""``disd.server.threadnames``: the DIS's threads carry their Python names at the OS level, so
per-thread CPU (``/proc/<pid>/task/*/comm``, ``top -H``, ``bench/_burstcpu.py``) says which is which."""

from __future__ import annotations

import sys
import threading
from concurrent.futures import ThreadPoolExecutor

from disd.server.threadnames import name_threads_from_now


def os_name(native_id: int) -> str:
    with open(f"/proc/self/task/{native_id}/comm") as f:
        return f.read().strip()


def native_id_of_a_thread(name: str) -> tuple[int, str]:
    seen: list[tuple[int, str]] = []
    t = threading.Thread(target=lambda: seen.append((threading.get_native_id(), os_name(threading.get_native_id()))),
                         name=name)
    t.start()
    t.join()
    return seen[0]


def test_threads_started_after_it_carry_their_names_cut_to_the_os_limit():
    _, before = native_id_of_a_thread("dis-before")
    if sys.version_info < (3, 14):
        assert before != "dis-before"  # Python names no OS thread by itself before 3.14
    name_threads_from_now()
    try:
        assert native_id_of_a_thread("dis-flusher")[1] == "dis-flusher"
        assert native_id_of_a_thread("dis-checkpointer")[1] == "dis-checkpointe"  # 15 bytes at most
        with ThreadPoolExecutor(1, thread_name_prefix="grpc") as pool:
            assert pool.submit(lambda: os_name(threading.get_native_id())).result() == "grpc_0"
    finally:
        threading.setprofile(None)


def test_the_hook_leaves_no_profiler_behind():
    name_threads_from_now()
    try:
        seen: list[object] = []
        t = threading.Thread(target=lambda: seen.append(sys.getprofile()), name="dis-probe")
        t.start()
        t.join()
        assert seen == [None]
    finally:
        threading.setprofile(None)
