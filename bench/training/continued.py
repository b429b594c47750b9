"""The second half of the recipe for logs whose test rows come later (``bench.training.quality
--continue-over-validation``): after a run has been selected on its validation rows, continue
it over those rows, so that the model also learns from the most recent period.

- Each finished run of the table is continued as ``stitchrec refit --run RUN`` continues it
  (``pipelines.refit``: ``continue_from``, vocabularies merged by value, so ids first seen in
  the validation rows get rows of their own; one epoch over the validation rows at the run's
  learning rate, no validation split); the continued model is scored once on the test rows.
- The baseline is refit the same way: scikit-learn's ``LogisticRegression`` on one-hot features
  of the vocabulary of every training row (the continued ``lr`` run's preprocessor), ``C``
  chosen by training on the training rows and scoring the validation rows, then refit with that
  ``C`` on the training and validation rows together and scored once on the test rows.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from bench.training.lr_baseline import encode
from pipelines.refit import refit_config
from pipelines.run.model import load_trained_model
from pipelines.train import train

SUFFIX = "_continued"


def continue_run(run: Path, seed: int) -> tuple[Path, dict[str, Any]]:
    """``run`` continued for one epoch over its validation rows by ``stitchrec refit``'s
    config (``pipelines.refit``); its folder and report."""
    out = run.with_name(run.name + SUFFIX)
    if (out / "train_report.json").exists():  # finished by an earlier call: read back
        return out, json.loads((out / "train_report.json").read_text())
    return out, train(refit_config(run, out, epochs=1, seed=seed), lambda _line: None)


def refit_baseline(work: Path, shards: dict[str, Any], c_grid: tuple[float, ...]) -> dict:
    """``{"labels", "sk_lr": (validation AUC, "C=...", test probabilities)}`` of the refit."""
    model, schema, _ = load_trained_model(work / f"lr_seed0{SUFFIX}")
    x_tr, y_tr = encode(model, schema, shards["train"])
    x_va, y_va = encode(model, schema, shards["validation"])
    x_te, y_te = encode(model, schema, shards["test"])
    best = max(
        (
            roc_auc_score(
                y_va, LogisticRegression(C=c, max_iter=2000).fit(x_tr, y_tr).decision_function(x_va)
            ),
            c,
        )
        for c in c_grid
    )
    refit = LogisticRegression(C=best[1], max_iter=2000).fit(
        sp.vstack([x_tr, x_va]), np.concatenate([y_tr, y_va])
    )
    return {
        "labels": y_te,
        "sk_lr": (best[0], f"C={best[1]}, refit", refit.predict_proba(x_te)[:, 1]),
    }


def continued(
    result: dict[str, Any],
    shards: dict[str, Any],
    work: Path,
    run_row: Callable[..., dict[str, Any]],
    c_grid: tuple[float, ...],
) -> dict[str, Any]:
    """The table of ``result``'s runs continued over the validation rows, against the refit
    baseline (a result for ``bench.training.quality.report``); ``run_row(folder, report, seed,
    test_files)`` makes a run's row."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for method, runs in result["rows"].items():
        for r in runs:
            if r["dir"] is None:  # an ensemble of runs, not a run
                continue
            out, report = continue_run(r["dir"], r["seed"])
            rows.setdefault(method + " continued", []).append(
                run_row(out, report, r["seed"], shards["test"])
            )
            print(
                f"  {result['name']} {method} seed {r['seed']} continued: "
                f"{report['test']['auc']:.4f}",
                flush=True,
            )
    return {
        "name": f"{result['name']}, each run continued over its validation rows",
        "baselines": refit_baseline(work, shards, c_grid),
        "rows": rows,
        "latency": None,
    }
