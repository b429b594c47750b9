"""The prediction log: a call observer that writes a sample of the scored calls to Parquet.

``PredictionLogger`` is registered on the server's ``CallObservers`` (``stitchrec serve --log-dir
DIR``). For each scored call it decides, from a hash of the request id, whether the call is
sampled; a sampled call joins an in-memory buffer (only a reference: the observer runs on the
event loop and does no conversion there). A background thread turns the buffer into log rows
(``serving.log_format.call_table``) and writes them as one new file per model and flush
(``<folder>/<model>/part-<ms>-<pid>-<seq>.parquet``, ``log_format.write_file``: atomic), every
``flush_s`` seconds or as soon as ``flush_rows`` rows wait. ``close()`` writes what is left and
stops the thread.

Sampling: a call is kept when ``u(request_id) < rate``, with ``u`` the first 8 bytes of
BLAKE2b of the request id read as a fraction of 2**64 and ``rate`` the model's rate
(``rates[model]``, else ``default_rate``). All rows of a call are kept or dropped together, a
replay of the same request ids samples the same calls, and a shadow call (same request id as
its primary) is kept exactly when its primary is, at equal rates.

Loss bound: a file appears only complete (temporary name, then a rename), so a crash never
leaves an unreadable file. A process killed without ``close()`` (SIGKILL, OOM) loses only the
calls not yet written: those buffered since the writer last took the buffer (at most ``flush_s``
seconds of calls; under heavy traffic about ``flush_rows`` rows, as a flush starts once that
many wait, and never more than ``max_buffer_rows``), plus the file being written.

Back-pressure: when ``max_buffer_rows`` rows already wait (the disk is slower than the traffic),
a sampled call is dropped instead of buffered. Metrics (``serving.metrics``):
``stitchrec_log_rows_total{model}`` rows written, ``stitchrec_log_dropped_total{model}`` sampled
rows dropped (buffer full, a failed write, or after ``close()``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa

from serving import log_format
from serving.calls import ScoredCall
from serving.metrics import Metrics

log = logging.getLogger("stitchrec.serving.prediction_log")

# one sequence per process: two loggers writing one folder in the same millisecond never clash
_SEQUENCE = itertools.count()
_HASH_SCALE = float(2**64)


def writer_pause() -> None:
    """The writer's pause between two conversion steps (``log_format.calls_table``): a sleep
    releases the interpreter lock, which a thread waiting for it (the event loop) then takes."""
    time.sleep(0)


def sample_fraction(request_id: str) -> float:
    """``u`` in [0, 1): the first 8 bytes of BLAKE2b(request id) over 2**64."""
    digest = hashlib.blake2b(request_id.encode("utf-8", "replace"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _HASH_SCALE


def call_rows(call: ScoredCall) -> int:
    """The rows of a scored call (the first dimension of its outputs)."""
    for v in call.outputs.values():
        return int(np.shape(v)[0]) if np.ndim(v) else 1
    for v in call.features.values():
        return len(v)
    return 0


def _check_rate(rate: float, what: str) -> float:
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0.0 <= rate <= 1.0:
        raise ValueError(f"prediction log: {what} must be a number in [0, 1], got {rate!r}")
    return float(rate)


def _check_count(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"prediction log: {what} must be an integer >= 1, got {value!r}")
    return value


class PredictionLogger:
    """A call observer writing a deterministic sample of the scored calls to ``folder``.

    Args:
      folder: the log folder; each model's files go to ``folder/<model>/``.
      rates: ``{model: sampling rate in [0, 1]}``; other models use ``default_rate``.
      default_rate: the sampling rate of models not in ``rates`` (1.0: every call).
      flush_rows: a flush starts once this many rows wait.
      flush_s: seconds between flushes (> 0).
      max_buffer_rows: rows that may wait; a sampled call past it is dropped and counted.
      metrics: the server's metrics (``stitchrec_log_rows_total``,
        ``stitchrec_log_dropped_total``); None: counted on ``rows_written`` / ``rows_dropped``
        only.
      compression: the files' Parquet compression (``log_format.COMPRESSIONS``).
    """

    def __init__(
        self,
        folder: str | Path,
        rates: Mapping[str, float] | None = None,
        default_rate: float = 1.0,
        flush_rows: int = 10_000,
        flush_s: float = 5.0,
        max_buffer_rows: int = 100_000,
        metrics: Metrics | None = None,
        compression: str = "snappy",
    ):
        self.folder = Path(folder)
        self.rates = {
            str(m): _check_rate(r, f"rate of model {m!r}") for m, r in (rates or {}).items()
        }
        self.default_rate = _check_rate(default_rate, "default_rate")
        self.flush_rows = _check_count(flush_rows, "flush_rows")
        self.max_buffer_rows = _check_count(max_buffer_rows, "max_buffer_rows")
        if isinstance(flush_s, bool) or not isinstance(flush_s, int | float) or flush_s <= 0:
            raise ValueError(f"prediction log: flush_s must be a number > 0, got {flush_s!r}")
        self.flush_s = float(flush_s)
        if compression not in log_format.COMPRESSIONS:
            raise ValueError(
                f"prediction log: compression must be one of {log_format.COMPRESSIONS}, "
                f"got {compression!r}"
            )
        self.compression = compression
        self.metrics = metrics
        self.folder.mkdir(parents=True, exist_ok=True)
        self.rows_written: dict[str, int] = {}
        self.rows_dropped: dict[str, int] = {}
        self.files: list[Path] = []
        self._buffer: list[ScoredCall] = []
        self._buffered_rows = 0
        self._lock = threading.Lock()  # the buffer and the counters
        self._write_lock = threading.Lock()  # one flush at a time, files in sequence order
        self._wake = threading.Event()
        self._closed = False
        self.__name__ = "prediction_log"  # the name CallObservers logs if it raises
        log_format.warm_up()  # before any traffic: the first flush imports nothing
        self._thread = threading.Thread(
            target=self._run, name="stitchrec-prediction-log", daemon=True
        )
        self._thread.start()

    def rate(self, model: str) -> float:
        """The sampling rate of ``model``."""
        return self.rates.get(model, self.default_rate)

    def keeps(self, call: ScoredCall) -> bool:
        """Whether ``call`` is in the sample (a pure function of its request id and rate)."""
        rate = self.rate(call.model)
        return rate >= 1.0 or (rate > 0.0 and sample_fraction(call.request_id) < rate)

    def __call__(self, call: ScoredCall) -> None:
        """Buffers ``call`` when sampled (no conversion here: it runs on the event loop)."""
        if not self.keeps(call):
            return
        rows = call_rows(call)
        with self._lock:
            if self._closed or self._buffered_rows + rows > self.max_buffer_rows:
                self._count_dropped(call.model, rows)
                return
            self._buffer.append(call)
            self._buffered_rows += rows
            full = self._buffered_rows >= self.flush_rows
        if full:
            self._wake.set()

    def buffered_rows(self) -> int:
        """Rows waiting to be written."""
        with self._lock:
            return self._buffered_rows

    def _count_dropped(self, model: str, rows: int) -> None:
        self.rows_dropped[model] = self.rows_dropped.get(model, 0) + rows
        if self.metrics is not None:
            self.metrics.log_dropped.labels(model).inc(rows)

    def _count_written(self, model: str, rows: int) -> None:
        with self._lock:
            self.rows_written[model] = self.rows_written.get(model, 0) + rows
        if self.metrics is not None:
            self.metrics.log_rows.labels(model).inc(rows)

    def _run(self) -> None:
        while True:
            self._wake.wait(self.flush_s)
            self._wake.clear()
            closed = self._closed
            self.flush()
            if closed:
                return

    def flush(self) -> list[Path]:
        """Writes the waiting calls now, one file per model; returns the files written."""
        with self._write_lock:
            with self._lock:
                calls, self._buffer, self._buffered_rows = self._buffer, [], 0
            by_model: dict[str, list[ScoredCall]] = {}
            for c in calls:
                by_model.setdefault(c.model, []).append(c)
            written = []
            for model, group in by_model.items():
                path = self._write(model, group)
                if path is not None:
                    written.append(path)
            self.files += written
            return written

    def _write(self, model: str, calls: list[ScoredCall]) -> Path | None:
        try:  # every call at once, in short steps that leave the event loop the lock
            table = log_format.calls_table(calls, pause=writer_pause)
        except (ValueError, TypeError, pa.ArrowException):
            table = self._table_call_by_call(model, calls)
        if table is None:
            return None
        name = log_format.file_name(int(time.time() * 1000), os.getpid(), next(_SEQUENCE))
        try:
            path = log_format.write_file(self.folder / model / name, table, self.compression)
        except (OSError, pa.ArrowException) as e:
            log.error(json.dumps({"event": "log_write_error", "model": model, "error": str(e)}))
            with self._lock:
                self._count_dropped(model, table.num_rows)
            return None
        self._count_written(model, table.num_rows)
        return path

    def _table_call_by_call(self, model: str, calls: list[ScoredCall]) -> pa.Table | None:
        """The log rows of the calls that can be logged, each converted alone; the others are
        logged as errors and counted as dropped."""
        tables = []
        for c in calls:
            try:
                tables.append(log_format.call_table(c))
            except (ValueError, TypeError, pa.ArrowException) as e:
                log.error(json.dumps({"event": "log_row_error", "model": model, "error": str(e)}))
                with self._lock:
                    self._count_dropped(model, call_rows(c))
        return pa.concat_tables(tables, promote_options="permissive") if tables else None

    def close(self, timeout: float | None = 60.0) -> None:
        """Writes what is buffered and stops the writer thread; later calls are dropped."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake.set()
        self._thread.join(timeout)
        self.flush()  # a no-op unless the thread is stuck past ``timeout``
