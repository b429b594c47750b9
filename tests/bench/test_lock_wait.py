"""bench.serving.lock_wait: a worker that keeps the lock in C code delays the sleeper by about
its length; a worker that ends at once still gives a measurement."""

from __future__ import annotations

import random
import time

from bench.serving.lock_wait import lock_wait_ms


def test_work_that_ends_at_once_still_gives_a_wait():
    waits = lock_wait_ms(lambda: None, repeats=1)
    assert waits["max"] >= waits["p99"] >= 0


def test_c_code_holding_the_lock_delays_the_sleeper():
    rng = random.Random(0)
    values = [rng.random() for _ in range(1_000_000)]
    t0 = time.perf_counter()
    sorted(values)  # list.sort runs in C and keeps the interpreter lock to the end
    alone_ms = (time.perf_counter() - t0) * 1e3
    waits = lock_wait_ms(lambda: sorted(values), repeats=1)
    assert waits["max"] > 0.5 * alone_ms, (waits, alone_ms)
    assert lock_wait_ms(lambda: time.sleep(alone_ms / 1e3), repeats=1)["max"] < 0.5 * alone_ms
