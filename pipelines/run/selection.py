"""Model selection of a training run: the evaluation history (kept across resumes) and the
early-stopping state (checkpointed with the run), read from the validation split only."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import tensorflow as tf

#: The evaluation history of a run folder: one JSON object per line, one line per evaluation.
HISTORY_FILE = "history.jsonl"


class History:
    """The validation evaluations of a run, one JSON line each in ``path``.

    Every write replaces the whole file atomically (a temporary file renamed over it), so a
    killed run leaves either the old or the new history, never half a line.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def entries(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def _write(self, entries: list[dict[str, Any]]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text("".join(json.dumps(e) + "\n" for e in entries))
        os.replace(tmp, self.path)

    def append(self, entry: dict[str, Any]) -> None:
        self._write([*self.entries(), entry])

    def keep_until(self, step: int) -> None:
        """Drops the entries after global step ``step`` (evaluated by a killed process after its
        last checkpoint: the resumed run evaluates those steps again)."""
        entries = self.entries()
        kept = [e for e in entries if e["step"] <= step]
        if len(kept) != len(entries):
            self._write(kept)


class Selection:
    """Best validation value so far, its step and epoch, evaluations since it, and whether
    early stopping has stopped the run: tf.Variables, so a resumed run keeps them.

    The score compared is ``auc`` or ``-logloss`` (``select_metric``): higher is better, and an
    evaluation improves on the best when its score exceeds the best by more than ``min_delta``.
    """

    def __init__(self, metric: str, patience: int, min_delta: float, early_stopping: bool) -> None:
        self.metric, self.patience, self.min_delta = metric, patience, min_delta
        self.early_stopping = early_stopping
        self.best_score = tf.Variable(-math.inf, dtype=tf.float64, name="best_score")
        self.best_step = tf.Variable(0, dtype=tf.int64, name="best_step")
        self.best_epoch = tf.Variable(0, dtype=tf.int64, name="best_epoch")
        self.since_best = tf.Variable(0, dtype=tf.int64, name="evaluations_since_best")
        self.stopped = tf.Variable(False, dtype=tf.bool, name="stopped_early")

    def variables(self) -> dict[str, tf.Variable]:
        """The checkpointed state, by checkpoint key."""
        return {
            "best_score": self.best_score,
            "best_step": self.best_step,
            "best_epoch": self.best_epoch,
            "evaluations_since_best": self.since_best,
            "stopped_early": self.stopped,
        }

    def _score(self, metrics: dict[str, float]) -> float:
        value = float(metrics[self.metric])
        return value if self.metric == "auc" else -value

    def update(self, metrics: dict[str, float], step: int, epoch: int) -> bool:
        """Records one evaluation; True when it is the new best. Sets ``stopped`` once
        ``patience`` evaluations in a row did not improve (with early stopping on)."""
        score = self._score(metrics)
        improved = score > float(self.best_score) + self.min_delta
        if improved:
            self.best_score.assign(score)
            self.best_step.assign(step)
            self.best_epoch.assign(epoch)
            self.since_best.assign(0)
        else:
            self.since_best.assign_add(1)
        if self.early_stopping and int(self.since_best) >= self.patience:
            self.stopped.assign(True)
        return improved

    @property
    def has_best(self) -> bool:
        return int(self.best_step) > 0

    @property
    def best_value(self) -> float | None:
        """The best ``select_metric`` value (logloss as it is, not negated); None before any."""
        if not self.has_best:
            return None
        score = float(self.best_score)
        return score if self.metric == "auc" else -score

    def reason(self) -> str:
        """Why the best checkpoint is the selected one, e.g. ``best validation auc = 0.7312 at
        step 48``."""
        return (
            f"best validation {self.metric} = {self.best_value:.4f} at step {int(self.best_step)}"
        )

    def describe(self) -> dict[str, Any]:
        """The report's ``selection`` block."""
        best = None
        if self.has_best:
            best = {
                self.metric: self.best_value,
                "step": int(self.best_step),
                "epoch": int(self.best_epoch),
            }
        return {
            "metric": self.metric,
            "early_stopping": self.early_stopping,
            "patience": self.patience,
            "min_delta": self.min_delta,
            "stopped_early": bool(self.stopped),
            "best": best,
            "evaluations_since_best": int(self.since_best),
        }
