"""Snapshot ensembles of one training run: when to stop collecting, how far apart two members
are, which members to keep, how their outputs combine (docs/ensembles.md).

A ``cyclic`` learning-rate schedule (``pipelines.run.schedules.CyclicSchedule``) drives one
run into a new local optimum at the end of every cycle; the training loop writes the model there
(``snapshot_prefix``) and the snapshot's validation logits (``record_snapshot``), and asks a
``SnapshotCollector`` whether to go on. ``select_members`` then picks the members by greedy
forward selection on the validation set. Everything here is numpy over validation logits
(``[n]`` per snapshot, ``[m, n]`` for ``m`` snapshots); metrics are ``ranking.metrics``'.
``pipelines.ensemble_export`` writes the chosen members as one SavedModel.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ranking import metrics

#: What the members' outputs are averaged as: their logits, or their click probabilities.
COMBINES = ("logits", "probabilities")
#: Validation metrics a collection or a selection can follow (``logloss``: lower is better).
METRICS = ("logloss", "auc")
#: Pairwise distances between members (``distance_matrix``).
DISTANCES = ("correlation", "disagreement")

#: The run folder's sub-folder holding the snapshots and their manifest.
SNAPSHOTS = "snapshots"
MANIFEST = "snapshots.json"


def _choice(name: str, value: str, accepted: Sequence[str]) -> None:
    if value not in accepted:
        raise ValueError(f"{name} = {value!r}: expected one of {list(accepted)}")


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-x))`` without overflow (``(1 + tanh(x / 2)) / 2``)."""
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(logits, np.float64)))


def _log_sigmoid(x: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -x)


def average(logits: np.ndarray, combine: str = "logits") -> np.ndarray:
    """The ensemble's logits ``[n]`` of members' logits ``[m, n]``.

    ``combine = "logits"``: the mean logit. ``"probabilities"``: the logit of the mean
    probability, ``log(mean sigmoid(x)) - log(mean sigmoid(-x))``, computed from log-sigmoids so
    that it stays finite where a probability rounds to 0 or 1.
    """
    _choice("combine", combine, COMBINES)
    x = np.asarray(logits, np.float64)
    if combine == "logits":
        return x.mean(axis=0)
    top = np.logaddexp.reduce(_log_sigmoid(x), axis=0)
    bottom = np.logaddexp.reduce(_log_sigmoid(-x), axis=0)
    return top - bottom


def evaluate(labels: np.ndarray, logits: np.ndarray) -> dict[str, float]:
    """AUC and log loss of the click probabilities of ``logits`` ``[n]``.

    Raises:
      ranking.metrics.OneClassError: the labels hold one class (no AUC).
    """
    p = sigmoid(logits)
    return {"auc": metrics.auc(labels, p), "logloss": metrics.logloss(labels, p)}


def gain(metric: str, before: float, after: float) -> float:
    """How much ``after`` improves on ``before`` (positive: better): a drop of log loss, a
    rise of AUC."""
    _choice("metric", metric, METRICS)
    return before - after if metric == "logloss" else after - before


def _check(labels: np.ndarray, logits: Any) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(labels, np.float64)
    x = np.asarray(logits, np.float64)
    if y.ndim != 1:
        raise ValueError(f"labels: expected a 1-D array, got shape {y.shape}")
    if x.ndim == 1:
        x = x[None]
    if x.ndim != 2 or x.shape[1] != y.size or x.shape[0] == 0:
        raise ValueError(
            f"logits: expected shape [members, {y.size}] (one row per snapshot), got {x.shape}"
        )
    if not np.all(np.isfinite(x)):
        raise ValueError("logits: expected finite values, got NaN or infinity")
    return y, x


def distance_matrix(logits: np.ndarray, measure: str = "correlation") -> np.ndarray:
    """The ``[m, m]`` distances between members of validation logits ``[m, n]`` (0 on the
    diagonal, symmetric).

    ``correlation``: ``1 - r``, ``r`` the Pearson correlation of two members' logits (0: they
    move together, 1: unrelated, 2: opposed); a member of constant logits is at 0 from an equal
    one and 1 from any other. ``disagreement``: the fraction of rows where exactly one of the
    two predicts a click (probability > 0.5, i.e. logit > 0).
    """
    _choice("distance", measure, DISTANCES)
    x = np.asarray(logits, np.float64)
    m = x.shape[0]
    if measure == "disagreement":
        clicks = x > 0
        return (clicks[:, None, :] != clicks[None, :, :]).mean(axis=2)
    centred = x - x.mean(axis=1, keepdims=True)
    norms = np.sqrt((centred**2).sum(axis=1))
    d = np.ones((m, m))
    for i in range(m):
        for j in range(m):
            if norms[i] > 0 and norms[j] > 0:
                r = float(centred[i] @ centred[j]) / (norms[i] * norms[j])
                d[i, j] = 1.0 - min(max(r, -1.0), 1.0)
            elif np.array_equal(x[i], x[j]):
                d[i, j] = 0.0
    np.fill_diagonal(d, 0.0)
    return d


class SnapshotCollector:
    """Decides when a run has collected enough snapshots (the saturation rule).

    After each snapshot, the ensemble so far (every snapshot collected, combined by
    ``combine``) is scored on the validation set by ``metric``. The snapshot's gain is how much
    that score improves on the one before it (``gain``; the first snapshot has no gain and
    never stalls). A gain of at most ``min_gain`` is a stall (the ensemble did not improve by
    more than that: as in ``select_members``, where only a gain above it is eligible); ``patience`` stalls in a row, or
    ``max_snapshots`` snapshots, end the collection: ``add`` returns False from then on.
    """

    def __init__(
        self,
        labels: np.ndarray,
        *,
        metric: str = "logloss",
        min_gain: float = 1e-4,
        patience: int = 2,
        max_snapshots: int | None = None,
        combine: str = "logits",
    ) -> None:
        _choice("metric", metric, METRICS)
        _choice("combine", combine, COMBINES)
        if not (isinstance(patience, int) and patience >= 1):
            raise ValueError(f"patience = {patience!r}: expected an integer >= 1")
        if max_snapshots is not None and not (isinstance(max_snapshots, int) and max_snapshots > 0):
            raise ValueError(f"max_snapshots = {max_snapshots!r}: expected an integer >= 1")
        if not (isinstance(min_gain, (int, float)) and math.isfinite(min_gain)):
            raise ValueError(f"min_gain = {min_gain!r}: expected a finite number")
        self.labels = np.asarray(labels, np.float64)
        self.metric, self.min_gain, self.patience = metric, float(min_gain), patience
        self.max_snapshots, self.combine = max_snapshots, combine
        self.logits: list[np.ndarray] = []
        self.history: list[dict[str, Any]] = []
        self.stalls = 0
        self.stopped = False

    def add(self, logits: np.ndarray) -> bool:
        """Records one snapshot's validation logits ``[n]``; True while collecting goes on.

        Raises:
          ValueError: the collection has already stopped, or the logits do not match the labels.
        """
        if self.stopped:
            raise ValueError(f"SnapshotCollector: stopped after {len(self.logits)} snapshots")
        _, x = _check(self.labels, logits)
        self.logits.append(x[0])
        ensemble = evaluate(self.labels, average(np.stack(self.logits), self.combine))
        g = None
        if self.history:
            g = gain(self.metric, self.history[-1]["ensemble"][self.metric], ensemble[self.metric])
            self.stalls = self.stalls + 1 if g <= self.min_gain else 0
        self.history.append(
            {
                "snapshot": len(self.logits) - 1,
                "member": evaluate(self.labels, x[0]),
                "ensemble": ensemble,
                "gain": g,
                "stalls": self.stalls,
            }
        )
        full = self.max_snapshots is not None and len(self.logits) >= self.max_snapshots
        self.stopped = self.stalls >= self.patience or full
        return not self.stopped

    def to_dict(self) -> dict[str, Any]:
        """The rule's settings and each snapshot's record (for the training report)."""
        return {
            "metric": self.metric,
            "min_gain": self.min_gain,
            "patience": self.patience,
            "max_snapshots": self.max_snapshots,
            "combine": self.combine,
            "stopped": self.stopped,
            "snapshots": self.history,
        }


@dataclasses.dataclass
class Selection:
    """The members ``select_members`` chose (snapshot indices, in the order added) and why."""

    members: list[int]
    metric: str
    combine: str
    distance: str
    diversity: float
    member_metrics: list[dict[str, float]]
    ensemble_metrics: dict[str, float]
    distances: np.ndarray
    rounds: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the distance matrix as nested lists."""
        out = dataclasses.asdict(self)
        out["distances"] = self.distances.tolist()
        return out


def _round(
    y: np.ndarray, x: np.ndarray, chosen: list[int], d: np.ndarray, opts: dict[str, Any]
) -> dict[str, Any] | None:
    """One greedy round: the eligible candidate of the highest objective, or None."""
    metric = opts["metric"]
    current = evaluate(y, average(x[chosen], opts["combine"]))[metric]
    best = None
    for c in range(x.shape[0]):
        if c in chosen:
            continue
        after = evaluate(y, average(x[[*chosen, c]], opts["combine"]))
        g = gain(metric, current, after[metric])
        if g <= opts["min_gain"]:
            continue
        spread = float(d[c, chosen].mean())
        objective = g + opts["diversity"] * spread
        if best is None or objective > best["objective"]:
            best = {"added": c, "gain": g, "distance": spread, "objective": objective}
            best["ensemble"] = after
    return best


def select_members(
    labels: np.ndarray,
    logits: np.ndarray,
    *,
    metric: str = "logloss",
    combine: str = "logits",
    distance: str = "correlation",
    diversity: float = 0.0,
    min_gain: float = 0.0,
    max_members: int | None = None,
) -> Selection:
    """Greedy forward selection of members from snapshots' validation logits ``[m, n]``.

    The first member is the best snapshot alone by ``metric`` (the lowest index on a tie).
    Each round then scores every snapshot ``c`` not yet chosen: ``gain(c)``, how much adding
    it improves the averaged ensemble's ``metric``, and ``dist(c)``, its mean ``distance`` to
    the members chosen. Only a ``c`` with ``gain(c) > min_gain`` is eligible (accuracy gates);
    among those the one of the highest ``gain(c) + diversity * dist(c)`` joins (diversity
    ranks; the lowest index on a tie). Selection stops when no snapshot is eligible or at
    ``max_members``.

    Raises:
      ValueError: an argument out of range, or logits not of shape ``[m, len(labels)]``.
      ranking.metrics.OneClassError: the validation labels hold one class.
    """
    _choice("metric", metric, METRICS)
    _choice("combine", combine, COMBINES)
    if not (isinstance(diversity, (int, float)) and diversity >= 0 and math.isfinite(diversity)):
        raise ValueError(f"diversity = {diversity!r}: expected a finite number >= 0")
    if max_members is not None and not (isinstance(max_members, int) and max_members >= 1):
        raise ValueError(f"max_members = {max_members!r}: expected an integer >= 1")
    y, x = _check(labels, logits)
    d = distance_matrix(x, distance)
    singles = [evaluate(y, row) for row in x]
    first = max(range(len(singles)), key=lambda i: (gain(metric, 0.0, singles[i][metric]), -i))
    chosen = [first]
    rounds: list[dict[str, Any]] = [{"added": first, "ensemble": singles[first]}]
    opts = {"metric": metric, "combine": combine, "diversity": diversity, "min_gain": min_gain}
    while max_members is None or len(chosen) < max_members:
        best = _round(y, x, chosen, d, opts)
        if best is None:
            break
        chosen.append(best["added"])
        rounds.append(best)
    return Selection(
        members=chosen,
        metric=metric,
        combine=combine,
        distance=distance,
        diversity=float(diversity),
        member_metrics=singles,
        ensemble_metrics=rounds[-1]["ensemble"],
        distances=d,
        rounds=rounds,
    )


# --------------------------------------------------------------------------------------------
# snapshots in the run folder


def snapshot_prefix(run_dir: str | Path, index: int) -> str:
    """Where snapshot ``index`` is written: ``tf.train.Checkpoint(model=model).write(prefix)``
    (``<run>/snapshots/snapshot-<index>``)."""
    return str(Path(run_dir) / SNAPSHOTS / f"snapshot-{int(index)}")


def record_snapshot(
    run_dir: str | Path, index: int, step: int, val_logits: np.ndarray
) -> dict[str, Any]:
    """Saves snapshot ``index``'s validation logits and lists it in ``snapshots.json``
    (replacing an entry of the same index: a resumed run records its low points again).

    The entry: ``index``, ``step`` (the optimizer's ``iterations`` when written),
    ``checkpoint`` and ``val_logits`` (paths relative to the run folder).
    """
    root = Path(run_dir) / SNAPSHOTS
    root.mkdir(parents=True, exist_ok=True)
    name = f"snapshot-{int(index)}"
    np.save(root / f"{name}.val_logits.npy", np.asarray(val_logits, np.float32))
    entry = {
        "index": int(index),
        "step": int(step),
        "checkpoint": f"{SNAPSHOTS}/{name}",
        "val_logits": f"{SNAPSHOTS}/{name}.val_logits.npy",
    }
    entries = [e for e in read_snapshots(run_dir) if e["index"] != entry["index"]]
    _write_manifest(run_dir, sorted([*entries, entry], key=lambda e: e["index"]))
    return entry


def read_snapshots(run_dir: str | Path) -> list[dict[str, Any]]:
    """The recorded snapshots (``record_snapshot``'s entries), by index."""
    path = Path(run_dir) / SNAPSHOTS / MANIFEST
    return json.loads(path.read_text()) if path.exists() else []


def _write_manifest(run_dir: str | Path, entries: list[dict[str, Any]]) -> None:
    root = Path(run_dir) / SNAPSHOTS
    tmp = root / f"{MANIFEST}.tmp"
    tmp.write_text(json.dumps(entries, indent=1))
    os.replace(tmp, root / MANIFEST)


def truncate_snapshots(run_dir: str | Path, step: int) -> list[dict[str, Any]]:
    """Forgets the snapshots written after optimizer step ``step`` (``iterations``) and
    returns the others: what a run resumed from a checkpoint at ``step`` had collected (it
    takes the later ones again)."""
    entries = read_snapshots(run_dir)
    kept = [e for e in entries if e["step"] <= int(step)]
    if len(kept) != len(entries):
        _write_manifest(run_dir, kept)
    return kept


def snapshot_logits(run_dir: str | Path, entries: list[dict[str, Any]]) -> np.ndarray:
    """The validation logits ``[m, n]`` of ``entries`` (``read_snapshots``)."""
    root = Path(run_dir)
    return np.stack([np.load(root / e["val_logits"]) for e in entries])
