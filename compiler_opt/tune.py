"""Schedules of the generated embedding op, searched on the machine that runs them.

The embedding op computes the same values under every :class:`Schedule` (tile of examples,
prefetch distance, thread-pool grain; ``embedding_op.spec.SCHEDULE_SPACE``); which is fastest
depends on the CPU, the tables and the batch. :func:`search` measures schedules the way Ansor
(Zheng et al., OSDI 2020) does, scaled to this space:

1. the default schedule and ``initial`` random ones are measured;
2. each round, a cost model (gradient-boosted trees, scikit-learn's
   ``HistGradientBoostingRegressor``, on features of the schedule, the op and the batch; target
   the log of the time) is fitted on every measurement so far; candidates are mutations of the
   best measured schedules (one knob moved to a neighbouring value) and random ones; the
   ``per_round`` candidates the model predicts fastest are measured;
3. until ``trials`` measurements or ``timeout_s``.

Every measurement made after the model predicted it is held out for the model's quality: the
Spearman rank correlation of predicted and measured times (``TuneResult.rank_correlation``).

What a measurement is belongs to the caller (``measure(spec) -> seconds``): ``stitchrec fuse
tune`` times the whole served signature with the op swapped (:func:`signature_measurer`).

Records (:func:`save_record`, :func:`recorded_schedule`): one JSON file per device,
``<cache>/tuning-<device key>.json``::

    {"version": 1, "device": "cpu-amd-epyc-2cores",
     "records": {"<default op name>@<batch>": {"schedule": {"tile": 32, "prefetch": 8,
                 "grain": 0}, "seconds": ..., "default_seconds": ..., "trials": 24,
                 "created": "..."}}}

A file whose ``device`` is not this machine's is ignored, with a log line.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from compiler_opt import cost, graph_io, realize
from compiler_opt.embedding_op import ops as emb_ops
from compiler_opt.embedding_op.spec import (
    DEFAULT_SCHEDULE,
    SCHEDULE_SPACE,
    KernelSpec,
    Schedule,
)

log = logging.getLogger(__name__)
RECORD_VERSION = 1
Measure = Callable[[KernelSpec], float]


@dataclasses.dataclass
class Trial:
    """One measured schedule: its index in measuring order, seconds, the cost model's
    prediction before it was measured (None: measured before a model existed) and the
    search's elapsed seconds when it finished."""

    index: int
    schedule: Schedule
    seconds: float
    predicted: float | None
    elapsed_s: float


@dataclasses.dataclass
class TuneResult:
    """What :func:`search` found for one op at one batch."""

    op: str
    batch: int
    device: str
    default_seconds: float
    best: Schedule
    best_seconds: float
    trials: list[Trial]
    rank_correlation: float | None
    seconds: float

    @property
    def speedup(self) -> float:
        """Default schedule's time over the best one's."""
        return self.default_seconds / self.best_seconds

    def trials_to(self, fraction: float = 0.95) -> int:
        """Trials measured until one reached ``fraction`` of the best speed found."""
        for t in self.trials:
            if self.best_seconds / t.seconds >= fraction:
                return t.index + 1
        return len(self.trials)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["speedup"] = self.speedup
        d["trials_to_95"] = self.trials_to(0.95)
        return d


def features(spec: KernelSpec, schedule: Schedule, batch: int) -> list[float]:
    """The cost model's inputs: the schedule's knobs (log scale), the op's shape (fields,
    output width, table bytes, rows read per example) and the batch."""
    table_bytes = sum(t.rows * t.cols * 4 for t in spec.tables)
    reads = sum(len(f.tables) * f.rows_per_id for f in spec.fields)
    return [
        math.log2(schedule.tile),
        float(schedule.prefetch),
        math.log2(schedule.grain + 1),
        math.log2(batch),
        float(len(spec.fields)),
        float(spec.out_dim),
        math.log2(table_bytes + 1),
        float(reads),
        math.log2(max(batch // max(schedule.grain, 1), 1)) if schedule.grain else 0.0,
    ]


def _random(rng: random.Random) -> Schedule:
    return Schedule(**{k: rng.choice(v) for k, v in SCHEDULE_SPACE.items()})


def _mutations(schedule: Schedule) -> list[Schedule]:
    """Every schedule one knob away (the knob moved to a neighbouring value)."""
    out = []
    for key, values in SCHEDULE_SPACE.items():
        i = values.index(getattr(schedule, key))
        for j in (i - 1, i + 1):
            if 0 <= j < len(values):
                out.append(dataclasses.replace(schedule, **{key: values[j]}))
    return out


def _fit(spec: KernelSpec, batch: int, measured: dict[Schedule, float]) -> Any:
    from sklearn.ensemble import HistGradientBoostingRegressor

    x = np.array([features(spec, s, batch) for s in measured])
    y = np.log(np.array(list(measured.values())))
    model = HistGradientBoostingRegressor(
        max_iter=60, learning_rate=0.2, min_samples_leaf=2, max_leaf_nodes=8, random_state=0
    )
    return model.fit(x, y)


def search(
    spec: KernelSpec,
    measure: Measure,
    batch: int,
    *,
    trials: int = 32,
    timeout_s: float = 600.0,
    initial: int = 8,
    per_round: int = 4,
    seed: int = 0,
    progress: Callable[[Trial], None] | None = None,
    prepare: Callable[[list[KernelSpec]], None] | None = None,
    confirm: int = 0,
) -> TuneResult:
    """Searches schedules of ``spec``'s op (module docstring); ``measure(spec)`` gives the
    seconds of one run of ``spec`` (its schedule set); ``prepare(specs)``, when given, is called
    with each batch of schedules about to be measured (e.g. to compile them side by side).
    Stops after ``trials`` measurements or once ``timeout_s`` have passed (the default schedule
    is always measured). With ``confirm``, the best and the default schedule are measured
    ``confirm`` more times each, alternating; their medians are the result's times, and the
    default stays the best unless the best is faster on those."""
    if trials < 2 or initial < 1 or per_round < 1:
        raise ValueError(
            f"need trials >= 2, initial >= 1 and per_round >= 1, got {trials}, {initial}, "
            f"{per_round}"
        )
    rng = random.Random(seed)
    base = spec.with_schedule(DEFAULT_SCHEDULE)
    start = time.perf_counter()
    measured: dict[Schedule, float] = {}
    done: list[Trial] = []

    def run(schedule: Schedule, predicted: float | None) -> None:
        seconds = measure(base.with_schedule(schedule))
        measured[schedule] = seconds
        trial = Trial(len(done), schedule, seconds, predicted, time.perf_counter() - start)
        done.append(trial)
        if progress is not None:
            progress(trial)

    def left() -> bool:
        return len(measured) < trials and time.perf_counter() - start < timeout_s

    first = _first_schedules(rng, min(1 + initial, trials))
    if prepare is not None:
        prepare([base.with_schedule(s) for s in first])
    for s in first:
        if s is DEFAULT_SCHEDULE or left():
            run(s, None)
    while left():
        picks = _propose(base, batch, measured, rng, per_round)
        if not picks:
            break
        if prepare is not None:
            prepare([base.with_schedule(s) for s, _ in picks])
        for schedule, predicted in picks:
            if not left():
                break
            run(schedule, predicted)
    best, best_s, default_s = _confirmed(base, measure, measured, confirm)
    return TuneResult(
        op=base.op_name,
        batch=batch,
        device=cost.device_key("/CPU:0"),
        default_seconds=default_s,
        best=best,
        best_seconds=best_s,
        trials=done,
        rank_correlation=_rank_correlation(done),
        seconds=time.perf_counter() - start,
    )


def _first_schedules(rng: random.Random, n: int) -> list[Schedule]:
    """The default schedule and ``n - 1`` distinct random ones."""
    first = [DEFAULT_SCHEDULE]
    while len(first) < n:
        s = _random(rng)
        if s not in first:
            first.append(s)
    return first


def _propose(
    base: KernelSpec,
    batch: int,
    measured: dict[Schedule, float],
    rng: random.Random,
    count: int,
) -> list[tuple[Schedule, float]]:
    """The ``count`` unmeasured schedules (and their predicted seconds) the cost model, fitted
    on ``measured``, predicts fastest among the best four's neighbours and 64 random ones."""
    model = _fit(base, batch, measured)
    best = sorted(measured, key=measured.__getitem__)[:4]
    pool = {m for s in best for m in _mutations(s)} | {_random(rng) for _ in range(64)}
    # a stable order for the model's ties
    pool_list = sorted((s for s in pool if s not in measured), key=dataclasses.astuple)
    if not pool_list:
        return []
    predicted = np.exp(model.predict(np.array([features(base, s, batch) for s in pool_list])))
    order = np.argsort(predicted, kind="stable")[:count]
    return [(pool_list[i], float(predicted[i])) for i in order]


def _confirmed(
    base: KernelSpec, measure: Measure, measured: dict[Schedule, float], confirm: int
) -> tuple[Schedule, float, float]:
    """``(best, its seconds, the default's seconds)``: with ``confirm``, the best and the
    default measured ``confirm`` more times each, alternating (one noisy measurement does not
    make a winner), their medians compared."""
    best = min(measured, key=measured.__getitem__)
    default_s, best_s = measured[DEFAULT_SCHEDULE], measured[best]
    if not confirm or best == DEFAULT_SCHEDULE:
        return best, best_s, default_s
    again: dict[Schedule, list[float]] = {DEFAULT_SCHEDULE: [default_s], best: [best_s]}
    for _ in range(confirm):
        for s in again:
            again[s].append(measure(base.with_schedule(s)))
    default_s, best_s = (float(np.median(again[s])) for s in (DEFAULT_SCHEDULE, best))
    if default_s <= best_s:
        return DEFAULT_SCHEDULE, default_s, default_s
    return best, best_s, default_s


def _rank_correlation(trials: Sequence[Trial]) -> float | None:
    """Spearman's rho of predicted and measured times over the trials predicted before they
    were measured (None with fewer than 4)."""
    held = [t for t in trials if t.predicted is not None]
    if len(held) < 4:
        return None
    from scipy.stats import spearmanr

    rho = spearmanr([t.predicted for t in held], [t.seconds for t in held]).statistic
    return None if math.isnan(rho) else float(rho)


# ---------------------------------------------------------------------------------- records


def records_path(directory: str | Path | None = None) -> Path:
    """``<directory or cost.cache_dir()>/tuning-<cpu device key>.json``."""
    return Path(directory or cost.cache_dir()) / f"tuning-{cost.device_key('/CPU:0')}.json"


def load_records(path: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """The records of ``path`` (default :func:`records_path`) for this machine's device: ``{}``
    when there is no file, and (with a log line) when it was written on another device or is
    not a records file."""
    p = Path(path) if path is not None else records_path()
    if not p.is_file():
        return {}
    try:
        data = json.loads(p.read_text())
        device, records = data["device"], data["records"]
        if data.get("version") != RECORD_VERSION or not isinstance(records, dict):
            raise ValueError(f"version {data.get('version')!r}")
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        log.warning("tuning records %s ignored: not a records file (%s)", p, e)
        return {}
    here = cost.device_key("/CPU:0")
    if device != here:
        log.warning("tuning records %s ignored: tuned on %s, this device is %s", p, device, here)
        return {}
    return records


def save_record(result: TuneResult, path: str | Path | None = None) -> Path:
    """Adds (or replaces) ``result``'s record in the device's records file (atomically)."""
    p = Path(path) if path is not None else records_path()
    records = load_records(p)
    records[f"{result.op}@{result.batch}"] = {
        "schedule": dataclasses.asdict(result.best),
        "seconds": result.best_seconds,
        "default_seconds": result.default_seconds,
        "trials": len(result.trials),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    body = {"version": RECORD_VERSION, "device": result.device, "records": records}
    return cost.write_atomically(p, json.dumps(body, indent=1, sort_keys=True))


def recorded_schedule(
    spec: KernelSpec, records: dict[str, dict[str, Any]] | None = None
) -> Schedule:
    """The tuned schedule of ``spec``'s op in ``records`` (default: this device's file): the
    record of the largest batch tuned; the default schedule when there is none."""
    records = load_records() if records is None else records
    op = spec.with_schedule(DEFAULT_SCHEDULE).op_name
    mine = [(int(k.rsplit("@", 1)[1]), r) for k, r in records.items() if k.split("@")[0] == op]
    if not mine:
        return DEFAULT_SCHEDULE
    return Schedule(**max(mine, key=lambda kr: kr[0])[1]["schedule"])


# ----------------------------------------------------------------------- measuring an export


@dataclasses.dataclass
class OpBench:
    """One embedding op of a served graph, ready to time under any schedule: its spec and its
    inputs at one batch (computed once by the graph's own preprocessing)."""

    spec: KernelSpec
    node: Any  # the op's NodeDef in the frozen graph
    inputs: list[Any]  # its input tensors, in the node's input order
    batch: int
    # the imported one-op graph per op name (a schedule measured again reuses it)
    _functions: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)

    def measure(self, spec: KernelSpec, calls: int = 7, warmup: int = 3) -> float:
        """Median seconds of one call of ``spec``'s op (compiled and loaded first) on the
        inputs, after ``warmup`` untimed calls."""
        name = emb_ops.load(spec).forward_name
        if name not in self._functions:
            graph_def, names = _op_graph(self.node, name, self.inputs)
            self._functions[name] = graph_io.load_graph_def(
                graph_def, names, [f"{self.node.name}:0"]
            )
        fn = self._functions[name]
        times = []
        for i in range(calls + warmup):
            t0 = time.perf_counter()
            fn(*self.inputs)[0].numpy()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        return float(np.median(times))


def _op_graph(node: Any, op: str, inputs: Sequence[Any]) -> tuple[Any, list[str]]:
    """A GraphDef of ``node`` as op ``op`` fed by one placeholder per input."""
    graph_def = graph_pb2.GraphDef()
    names = []
    new = graph_def.node.add()
    new.CopyFrom(node)
    new.op = op
    del new.input[:]
    for i, t in enumerate(inputs):
        ph = graph_def.node.add(name=f"stitchrec_tune_in_{i}", op="Placeholder")
        ph.attr["dtype"].type = t.dtype.as_datatype_enum
        ph.attr["shape"].shape.CopyFrom(tf.TensorShape(None).as_proto())
        new.input.append(ph.name)
        names.append(f"{ph.name}:0")
    return graph_def, names


def export_ops(signature_fn: Any, inputs: Sequence[Any]) -> list[OpBench]:
    """The embedding ops of a signature (a ``--fuse-kernels`` export, its ops loaded), each
    with its inputs on the signature's flat ``inputs`` (one batch)."""
    frozen = realize.freeze(signature_fn)
    nodes = [n for n in frozen.graph_def.node if n.op.startswith("StitchrecFusedEmb")]
    nodes = [n for n in nodes if not n.op.startswith("StitchrecFusedEmbGrad")]
    out = []
    for node in nodes:
        refs = [r for r in node.input if not r.startswith("^")]
        refs = [r if ":" in r else f"{r}:0" for r in refs]
        fn = graph_io.load_graph_def(frozen.graph_def, frozen.inputs, refs, frozen.bound)
        values = fn(*inputs)
        batch = int(tf.shape(inputs[0])[0])
        out.append(OpBench(emb_ops.kernel_named(node.op).spec, node, list(values), batch))
    return out
