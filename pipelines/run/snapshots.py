"""Auto-Ensemble inside ``stitchrec train``: ``[train] ensemble = "auto"`` (docs/ensembles.md).

The run trains under a cyclic learning rate (``CyclicSchedule``; one cycle per epoch unless
``[train.lr_schedule_options] cycle_steps`` says otherwise). After the update made at each
cycle's low point the ``SnapshotTaker`` writes the model (``snapshots/snapshot-<k>``), scores
it on the validation split and feeds its logits to a ``SnapshotCollector``; once the ensemble
of the snapshots stops improving (the saturation rule) collection ends, and with it the run.
At the end ``select_members`` picks the members on the validation rows and the choice is
written to ``snapshots/ensemble.json``, which ``stitchrec export`` turns into one SavedModel.
The test set is scored once, on the chosen ensemble, for the report only.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from features.dataset import iter_batches
from features.json_files import read_json_object
from features.schema import Schema
from pipelines.config import ConfigError
from pipelines.errors import UsageError
from pipelines.run import ensemble as ens
from pipelines.run.paths import Log
from pipelines.run.schedules import CyclicSchedule, check_lr_schedule
from pipelines.run.scoring import make_logit_scorer, predict
from pipelines.run.unseen import UnseenRows

#: ``[train] ensemble`` values: no ensemble, or Auto-Ensemble's snapshots of one run.
ENSEMBLE_MODES = ("none", "auto")

#: ``[train.ensemble_options]`` keys and their defaults: the saturation rule (``metric``,
#: ``min_gain``, ``patience``, ``max_snapshots``), the selection (``metric``, ``distance``,
#: ``diversity``, ``max_members``), how members combine, and whether saturation ends the run.
ENSEMBLE_OPTIONS: dict[str, Any] = {
    "metric": "logloss",
    "min_gain": 1e-4,
    "patience": 2,
    "max_snapshots": None,
    "combine": "logits",
    "distance": "correlation",
    "diversity": 0.0,
    "max_members": None,
    "stop_at_saturation": True,
}

#: The run's chosen ensemble (members, combine), written at the end of the run.
ENSEMBLE_FILE = f"{ens.SNAPSHOTS}/ensemble.json"

_KINDS: dict[str, tuple[type, ...]] = {
    "metric": (str,),
    "min_gain": (int, float),
    "patience": (int,),
    "max_snapshots": (int, type(None)),
    "combine": (str,),
    "distance": (str,),
    "diversity": (int, float),
    "max_members": (int, type(None)),
    "stop_at_saturation": (bool,),
}


def ensemble_options(tc: Any) -> dict[str, Any]:
    """``[train.ensemble_options]`` over ``ENSEMBLE_OPTIONS``, each checked.

    Raises:
      ConfigError: an unknown key, a value of the wrong type or out of range.
    """
    given = dict(tc.ensemble_options)
    for key, value in given.items():
        if key not in ENSEMBLE_OPTIONS:
            raise ConfigError(
                f"[train.ensemble_options] has no key {key!r} (= {value!r}); accepted: "
                f"{sorted(ENSEMBLE_OPTIONS)}"
            )
        kinds = _KINDS[key]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            names = " or ".join("none" if k is type(None) else k.__name__ for k in kinds)
            raise ConfigError(f"[train.ensemble_options] {key} = {value!r}: expected {names}")
    opts = {**ENSEMBLE_OPTIONS, **given}
    choices = {"metric": ens.METRICS, "combine": ens.COMBINES, "distance": ens.DISTANCES}
    for key, accepted in choices.items():
        if opts[key] not in accepted:
            raise ConfigError(
                f"[train.ensemble_options] {key} = {opts[key]!r}: expected one of {list(accepted)}"
            )
    for key in ("patience", "max_snapshots", "max_members"):
        if opts[key] is not None and opts[key] < 1:
            raise ConfigError(
                f"[train.ensemble_options] {key} = {opts[key]!r}: expected an integer >= 1"
            )
    if not opts["diversity"] >= 0:
        raise ConfigError(
            f"[train.ensemble_options] diversity = {opts['diversity']!r}: expected a number >= 0"
        )
    return opts


def check_ensemble(tc: Any) -> None:
    """Raises ConfigError when ``[train] ensemble`` or its options are not usable: an unknown
    mode, or ``auto`` with a schedule other than ``constant`` (replaced by the cycles) or
    ``cyclic``."""
    if tc.ensemble not in ENSEMBLE_MODES:
        raise ConfigError(
            f"[train] ensemble = {tc.ensemble!r}: expected one of {list(ENSEMBLE_MODES)}"
        )
    if tc.ensemble == "none":
        if tc.ensemble_options:
            raise ConfigError(
                "[train.ensemble_options] is set but [train] ensemble = 'none'; set ensemble = "
                "'auto' or remove the options"
            )
        return
    if tc.lr_schedule not in ("constant", "cyclic"):
        raise ConfigError(
            f"[train] ensemble = 'auto' trains under the cyclic schedule: lr_schedule = "
            f"{tc.lr_schedule!r} cannot be used with it; leave lr_schedule unset (one cycle "
            "per epoch) or set lr_schedule = 'cyclic' with its options"
        )
    ensemble_options(tc)
    if tc.lr_schedule == "cyclic":  # cycle_steps defaults to an epoch's steps here
        check_lr_schedule("cyclic", {"cycle_steps": 2, **tc.lr_schedule_options})


def run_schedule(tc: Any, steps_per_epoch: int, total_steps: int) -> tuple[str, dict[str, Any]]:
    """The learning-rate schedule a run trains under: ``[train] lr_schedule`` and its options,
    or with ``ensemble = "auto"`` the cyclic schedule (``cycle_steps`` by default one epoch).

    Raises:
      ConfigError: an ensemble run of fewer than two cycles (nothing to ensemble).
    """
    if tc.ensemble != "auto":
        return tc.lr_schedule, dict(tc.lr_schedule_options)
    options = dict(tc.lr_schedule_options) if tc.lr_schedule == "cyclic" else {}
    options.setdefault("cycle_steps", steps_per_epoch)
    cycles = total_steps // max(int(options["cycle_steps"]), 1)
    if cycles < 2 or options["cycle_steps"] < 2:
        raise ConfigError(
            f"[train] ensemble = 'auto': the run has {total_steps} steps, {cycles} cycle(s) of "
            f"{options['cycle_steps']} steps; an ensemble needs at least 2 cycles of at least 2 "
            "steps: raise [train] epochs (or max_steps), or set "
            "[train.lr_schedule_options] cycle_steps"
        )
    return "cyclic", options


def validation_labels(schema: Schema, files: list[Path]) -> np.ndarray:
    """The labels of every row of ``files``, in file order."""
    batches = iter_batches(schema, files, batch_size=8192, shuffle=False)
    return np.concatenate([b[schema.label.name] for b in batches]).astype(np.float64)


class SnapshotTaker:
    """Takes the snapshots of an ``ensemble = "auto"`` run and chooses its members.

    ``after_step(step)`` is called after every update with ``step`` the optimizer step the
    update was made at; at a low point of ``schedule`` it writes snapshot ``k`` (the model's
    variables), its validation logits and the manifest entry, then asks the collector whether
    to go on. ``resume(step)`` forgets snapshots after a restored checkpoint's step and
    replays the rest, so a resumed run collects exactly what an uninterrupted one does.
    """

    def __init__(
        self,
        run_dir: Path,
        model: tf.keras.Model,
        schema: Schema,
        validation_files: list[Path],
        schedule: CyclicSchedule,
        options: Mapping[str, Any],
        log: Log,
        unseen: UnseenRows | None = None,
    ) -> None:
        self.run_dir, self.model, self.schema = Path(run_dir), model, schema
        self.unseen = unseen
        self.validation_files, self.schedule, self.log = validation_files, schedule, log
        self.options = dict(options)
        self.scorer = make_logit_scorer(model, schema)
        self.labels = validation_labels(schema, validation_files)
        self.collector = ens.SnapshotCollector(
            self.labels,
            metric=self.options["metric"],
            min_gain=self.options["min_gain"],
            patience=self.options["patience"],
            max_snapshots=self.options["max_snapshots"],
            combine=self.options["combine"],
        )
        self.seconds = 0.0

    @property
    def saturated(self) -> bool:
        """Collection has ended (saturation or ``max_snapshots``)."""
        return self.collector.stopped

    @property
    def stops_run(self) -> bool:
        """Collection has ended and ``stop_at_saturation`` ends the run with it."""
        return self.saturated and bool(self.options["stop_at_saturation"])

    def resume(self, step: int) -> None:
        """Keeps the snapshots of steps up to ``step`` (a restored checkpoint's) and replays
        them into the collector."""
        (self.run_dir / ENSEMBLE_FILE).unlink(missing_ok=True)
        entries = ens.truncate_snapshots(self.run_dir, step)
        if not entries:
            return
        for row in ens.snapshot_logits(self.run_dir, entries):
            if self.collector.stopped:
                break
            self.collector.add(row)
        self.log(f"ensemble: {len(entries)} snapshot(s) of the killed run kept")

    def after_step(self, step: int) -> bool:
        """After the update made at optimizer step ``step``: a snapshot at a low point while
        collecting; True when one was taken."""
        if self.saturated or not self.schedule.is_low_point(step):
            return False
        t0 = time.perf_counter()
        k = len(self.collector.logits)
        if self.unseen is not None:  # the snapshot holds the unseen rows the export reads
            self.unseen.fill()
        tf.train.Checkpoint(model=self.model).write(ens.snapshot_prefix(self.run_dir, k))
        _, logits = predict(self.scorer, self.schema, self.validation_files)
        ens.record_snapshot(self.run_dir, k, step + 1, logits)
        self.collector.add(logits)
        h = self.collector.history[-1]
        gain = "" if h["gain"] is None else f", gain {h['gain']:+.5f}"
        self.log(
            f"ensemble: snapshot {k} at step {step + 1}: validation {self.options['metric']} "
            f"{h['member'][self.options['metric']]:.4f} alone, ensemble of {k + 1} "
            f"{h['ensemble'][self.options['metric']]:.4f}{gain}"
            + (" (saturated: collection ends)" if self.saturated else "")
        )
        self.seconds += time.perf_counter() - t0
        return True

    def choose(self) -> tuple[ens.Selection, list[str]] | None:
        """Selects the members over every snapshot taken and writes ``ensemble.json``
        (atomically); the selection and the members' checkpoints, None when the run took no
        snapshot."""
        entries = ens.read_snapshots(self.run_dir)
        if not entries:
            return None
        o = self.options
        selection = ens.select_members(
            self.labels,
            ens.snapshot_logits(self.run_dir, entries),
            metric=o["metric"],
            combine=o["combine"],
            distance=o["distance"],
            diversity=o["diversity"],
            max_members=o["max_members"],
        )
        members = [entries[i]["checkpoint"] for i in selection.members]
        chosen = {"combine": o["combine"], "members": members}
        path = self.run_dir / ENSEMBLE_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(chosen, indent=1))
        os.replace(tmp, path)
        self.log(
            f"ensemble: {len(members)} of {len(entries)} snapshot(s) chosen on validation "
            f"({', '.join(members)}): {o['metric']} "
            f"{selection.ensemble_metrics[o['metric']]:.4f}"
        )
        return selection, members

    def finish(self, test_files: list[Path]) -> dict[str, Any] | None:
        """The members chosen (``choose``) and, with a test split, the ensemble's test AUC and
        log loss, scored once; the ``ensemble`` entry of ``train_report.json``.

        The members are read into the model in turn: afterwards it holds the last member's
        weights."""
        chosen = self.choose()
        if chosen is None:
            return None
        selection, members = chosen
        report = {
            "collection": self.collector.to_dict(),
            "selection": selection.to_dict(),
            "checkpoints": members,
            "snapshot_seconds": round(self.seconds, 2),
            "test": None,
        }
        if test_files:
            rows = []
            for member in members:
                prefix = str(self.run_dir / member)
                tf.train.Checkpoint(model=self.model).read(prefix).expect_partial()
                labels, logits = predict(self.scorer, self.schema, test_files)
                rows.append(logits)
            logits = ens.average(np.stack(rows), self.options["combine"])
            report["test"] = {"rows": int(labels.size), **ens.evaluate(labels, logits)}
            self.log(
                f"ensemble test auc {report['test']['auc']:.4f} logloss "
                f"{report['test']['logloss']:.4f} ({labels.size:,} rows, {len(members)} member(s))"
            )
        return report


def chosen_ensemble(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's chosen ensemble (``{"combine", "members"}``), or None for a run without one.

    Raises:
      UsageError: the file is not the JSON object ``SnapshotTaker.choose`` writes (names it).
    """
    path = Path(run_dir) / ENSEMBLE_FILE
    if not path.exists():
        return None
    expected = (
        'the ensemble `stitchrec train` chose, {"combine": ..., "members": [checkpoint, ...]} '
        "(add --single to export the run's selected checkpoint alone)"
    )
    chosen = read_json_object(path, expected)
    members = chosen.get("members")
    if (
        chosen.get("combine") not in ens.COMBINES
        or not isinstance(members, list)
        or not members
        or not all(isinstance(m, str) for m in members)
    ):
        got = json.dumps({k: chosen.get(k) for k in ("combine", "members")})[:200]
        raise UsageError(f"{str(path)!r} holds {got}: expected {expected}")
    return chosen
