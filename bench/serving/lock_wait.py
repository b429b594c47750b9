"""How long a server's event loop would wait for the interpreter lock while a background thread
works: the measure behind ``bench.serving.log_cost`` and ``bench.serving.tracing_cost``.

A thread runs ``work`` while the main thread sleeps 1 ms at a time, as an idle event loop does;
each wake-up's lateness past its 1 ms is how long it waited for the lock. CPython hands the lock
to a waiting thread when the holder blocks, calls ``time.sleep``, or has held it for the switch
interval (5 ms) in Python code; C code that keeps the lock (a large NumPy or Arrow conversion)
holds it to the end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

SLEEP_S = 0.001


def lock_wait_ms(work: Callable[[], object], repeats: int = 3) -> dict[str, float]:
    """Max and p99 lateness (ms) of 1 ms sleeps while a thread runs ``work()``, the least of
    ``repeats`` runs (each run calls ``work`` once)."""
    best = {"max": float("inf"), "p99": float("inf")}
    for _ in range(repeats):
        done = threading.Event()

        def run(done: threading.Event = done) -> None:
            try:
                work()
            finally:
                done.set()

        worker = threading.Thread(target=run)
        late = []
        last = time.perf_counter()
        worker.start()
        while True:  # at least one sleep, however short the work
            time.sleep(SLEEP_S)
            now = time.perf_counter()
            late.append(now - last - SLEEP_S)
            last = now
            if done.is_set():
                break
        worker.join()
        ms = np.array(late) * 1e3
        best = {"max": min(best["max"], ms.max()), "p99": min(best["p99"], np.percentile(ms, 99))}
    return {k: round(float(v), 2) for k, v in best.items()}
