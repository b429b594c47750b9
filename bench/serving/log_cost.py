"""What the prediction log's writer spends turning scored calls into log rows
(``serving.log_format``), without a server or a model.

    .venv/bin/python -m bench.serving.log_cost [--calls N] [--sizes 1,100]

Calls shaped like the bench model's (26 string and 13 numeric features, one score) of each
``--sizes`` rows are converted three ways in the same process: all of a flush together in one
go (``calls_table``), together in short steps with the writer's pause between them
(``calls_table(calls, pause=...)``, what the writer does) and one call at a time, then
concatenated (``call_table`` per call, the writer's fallback when a call cannot be logged). The
tables are checked equal. The flush's table is then written as Parquet to memory twice: with
the log's options (``log_format.parquet_options``: dictionaries and statistics for the metadata
columns only) and with pyarrow's defaults (a dictionary and statistics for every column), the
baseline. Prints one JSON line: CPU microseconds per call of each conversion and each write
(the best of 5 repeats), the one-at-a-time / together ratio, the default / log write ratio and
both writes' bytes per size, and the load average.

The writer runs in a thread of the server's process, where the event loop waits for the
interpreter lock while the writer holds it. ``lock_wait_ms`` (``bench.serving.lock_wait``)
measures that wait: a thread converts the flush while the main thread sleeps 1 ms at a time, as
an idle event loop does; each wake-up's lateness is how long it waited for the lock (max and p99
over the conversion; the least of 3 repeats), in one go and with the writer's pauses.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.serving.lock_wait import lock_wait_ms
from serving.calls import ScoredCall
from serving.log_format import COMPRESSIONS, call_table, calls_table, parquet_options, warm_up
from serving.prediction_log import writer_pause

REPEATS = 5


def scored_calls(count: int, rows: int, seed: int = 0) -> list[ScoredCall]:
    """``count`` calls of ``rows`` rows: 26 string features (8 hex digits), 13 float32 ones."""
    rng = np.random.default_rng(seed)
    calls = []
    for i in range(count):
        ids = rng.integers(0, 1 << 30, (26, rows))
        features = {f"C{j}": np.array([b"%08x" % v for v in ids[j]], object) for j in range(26)}
        features |= {f"I{j}": rng.random(rows).astype(np.float32) for j in range(13)}
        score = {"score": rng.random((rows, 1)).astype(np.float32)}
        calls.append(
            ScoredCall(
                f"{i:032x}",
                1.7e9 + i,
                "grpc",
                "bench",
                1,
                "serving_default",
                "",
                False,
                features,
                score,
            )
        )
    return calls


def cpu_us_per_call(convert, calls: list[ScoredCall]) -> tuple[float, pa.Table]:
    """The least CPU microseconds per call of ``REPEATS`` conversions, and the last table."""
    best = float("inf")
    for _ in range(REPEATS):
        t = time.process_time()
        table = convert(calls)
        best = min(best, time.process_time() - t)
    return best / len(calls) * 1e6, table


def write_us_per_call(table: pa.Table, calls: int, options: dict) -> tuple[float, int]:
    """The least CPU microseconds per call of ``REPEATS`` Parquet writes of ``table`` (to
    memory) with ``options``, and the bytes written."""
    best, size = float("inf"), 0
    for _ in range(REPEATS):
        sink = pa.BufferOutputStream()
        t = time.process_time()
        pq.write_table(table, sink, **options)
        best = min(best, time.process_time() - t)
        size = sink.getvalue().size
    return best / calls * 1e6, size


def one_at_a_time(calls: list[ScoredCall]) -> pa.Table:
    return pa.concat_tables([call_table(c) for c in calls], promote_options="permissive")


def paused(calls: list[ScoredCall]) -> pa.Table:
    return calls_table(calls, pause=writer_pause)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=200, help="calls per flush")
    p.add_argument("--sizes", default="1,100", help="rows per call, comma-separated")
    args = p.parse_args(argv)
    out: dict[str, object] = {"calls": args.calls}
    warm_up()  # as the writer does before any traffic
    for rows in (int(s) for s in args.sizes.split(",")):
        calls = scored_calls(args.calls, rows)
        together, a = cpu_us_per_call(calls_table, calls)
        steps, b = cpu_us_per_call(paused, calls)
        alone, c = cpu_us_per_call(one_at_a_time, calls)
        if not (a.equals(b) and a.equals(c)):
            raise AssertionError(f"the conversions differ at {rows} rows a call")
        write, size = write_us_per_call(a, len(calls), parquet_options(a.column_names))
        default, default_size = write_us_per_call(a, len(calls), {})
        by_compression = {
            c: write_us_per_call(a, len(calls), parquet_options(a.column_names, c))
            for c in COMPRESSIONS
        }
        out[f"rows_{rows}"] = {
            "together_us": round(together, 1),
            "paused_us": round(steps, 1),
            "one_at_a_time_us": round(alone, 1),
            "ratio": round(alone / together, 2),
            "write_us": round(write, 1),
            "write_default_us": round(default, 1),
            "write_ratio": round(default / write, 2),
            "bytes": size,
            "bytes_default": default_size,
            "compressions": {
                c: {"write_us": round(us, 1), "bytes": n} for c, (us, n) in by_compression.items()
            },
            "table_rows": a.num_rows,
            "lock_wait_ms": {
                "together": lock_wait_ms(lambda c=calls: calls_table(c)),
                "paused": lock_wait_ms(lambda c=calls: paused(c)),
            },
        }
    out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
