"""Off-policy estimates of the click rate a scoring model's policy would reach, from logs with
propensities (the Open Bandit Dataset: Saito et al., "Open Bandit Dataset and Pipeline", NeurIPS
2021 Datasets and Benchmarks).

Logged row i: context x_i, action a_i (``--action``, e.g. ``item_id``), reward r_i (the label),
propensity ``pi_b(a_i | x_i)`` (``--propensity``). The candidate actions are the distinct logged
actions (A of them). A model's policy scores every candidate for each row, keeping every other
feature of the row (so ``position`` stays the logged slot), and plays

    pi(a | x) = softmax_a(logit(score(x, a)) / T)      (T = ``--policy-temperature``; T = 0:
                                                        greedy, ties shared evenly)

With ``w_i = pi(a_i | x_i) / pi_b(a_i | x_i)`` and a reward model ``q(x, a)``:

* IPS   = (1/n) sum_i w_i r_i                                   (Horvitz & Thompson 1952)
* SNIPS = sum_i w_i r_i / sum_i w_i                              (Swaminathan & Joachims 2015)
* DM    = (1/n) sum_i sum_a pi(a | x_i) q(x_i, a)
* DR    = DM + (1/n) sum_i w_i (r_i - q(x_i, a_i))              (Dudík, Langford & Li 2011)

The reward model is an L2-regularised logistic regression (scikit-learn, C = 1) on one-hot
categorical inputs and standardised numeric inputs of the schema, including the action and the
columns joined on it; it is cross-fitted: rows in fold k get q from the model fitted on the other
folds (Chernozhukov et al. 2018), so DR does not reuse a row's own reward in q. Confidence
intervals: the paired row bootstrap of ``bootstrap.py`` (every estimator is a ratio of linear
forms in the resample counts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import scipy.sparse as sp
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import OneHotEncoder

from features.schema import FeatureKind
from pipelines.evaluation import bootstrap
from pipelines.evaluation.sources import Logs, SourceError

ESTIMATORS = ("ips", "snips", "dm", "dr")


def _show(x: object) -> str:
    """repr of a value, numpy scalars as plain Python values."""
    return repr(x.item() if isinstance(x, np.generic) else x)


@dataclass
class BanditLogs:
    actions: np.ndarray  # [A] candidate action values (as logged, column type)
    action_idx: np.ndarray  # [n] index of the logged action in ``actions``
    propensity: np.ndarray  # [n] pi_b(a_i | x_i)
    reward: np.ndarray  # [n] 0/1
    action: str
    item_columns: list[str]  # columns determined by the action (the schema's joins on it)


def bandit_logs(logs: Logs, action: str, propensity: str) -> BanditLogs:
    """Validated bandit view of the logs: propensities in (0, 1], actions, rewards.

    Raises:
      SourceError: the logs lack the action or propensity field, or a propensity is missing or
        outside (0, 1] (a user error: the command line prints one line).
    """
    for name in (action, propensity):
        if name not in logs.table.column_names:
            raise SourceError(
                f"off-policy estimates need field {name!r} in the logs; fields: "
                f"{logs.table.column_names[:40]}"
            )
    pb = pc.cast(logs.table.column(propensity), pa.float64()).to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(~np.isfinite(pb) | (pb <= 0) | (pb > 1))
    if bad.size:
        raise SourceError(
            f"propensity field {propensity!r}: {bad.size} values are missing or outside (0, 1], "
            f"first at row {int(bad[0])} (value {_show(pb[bad[0]])}); expected logging probabilities"
        )
    acts = logs.table.column(action).to_numpy(zero_copy_only=False)
    actions, idx = np.unique(acts, return_inverse=True)
    joined = [c for j in logs.schema.source.joins if j.on == action for c in (j.columns or ())]
    joined = [c for c in joined if c in logs.table.column_names and c != action]
    return BanditLogs(actions, idx.ravel(), pb, logs.labels, action, joined)


def candidate_builder(logs: Logs, bl: BanditLogs) -> Callable[[int, int], pa.Table]:
    """``build(lo, hi)``: rows lo..hi-1 repeated once per candidate action (row-major), with the
    action column and the columns joined on it replaced by each candidate's values."""
    first = np.array([np.flatnonzero(bl.action_idx == k)[0] for k in range(bl.actions.size)])
    item_values = {c: logs.table.column(c).take(pa.array(first)) for c in bl.item_columns}
    action_col = logs.table.column(bl.action).take(pa.array(first))
    a = bl.actions.size

    def build(lo: int, hi: int) -> pa.Table:
        m = hi - lo
        t = logs.table.slice(lo, m).take(pa.array(np.repeat(np.arange(m), a)))
        tile = pa.array(np.tile(np.arange(a), m))
        for name, values in [(bl.action, action_col), *item_values.items()]:
            i = t.column_names.index(name)
            t = t.set_column(i, name, values.take(tile))
        return t

    return build


def policy(scores: np.ndarray, temperature: float) -> np.ndarray:
    """``[n, A]`` action probabilities from ``[n, A]`` click probabilities (module docstring)."""
    if temperature < 0:
        raise ValueError(f"policy temperature must be >= 0, got {temperature}")
    p = np.clip(scores, 1e-7, 1 - 1e-7)
    logit = np.log(p) - np.log1p(-p)
    if temperature == 0:
        best = logit == logit.max(axis=1, keepdims=True)
        return best / best.sum(axis=1, keepdims=True)
    z = logit / temperature
    z -= z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _encoder(logs: Logs, bl: BanditLogs):
    cats = [
        f.name
        for f in logs.schema.model_inputs
        if f.kind == FeatureKind.CATEGORICAL and f.name in logs.table.column_names
    ]
    if bl.action not in cats:
        cats.append(bl.action)
    nums = [
        f.name
        for f in logs.schema.model_inputs
        if f.kind == FeatureKind.NUMERIC and f.name in logs.table.column_names
    ]
    enc = OneHotEncoder(handle_unknown="ignore", sparse_output=True)
    enc.fit(_cat_matrix(logs.table, cats))
    x = _num_matrix(logs.table, nums)
    mu, sd = x.mean(axis=0), x.std(axis=0)
    sd[sd == 0] = 1.0

    def encode(table: pa.Table):
        parts = [enc.transform(_cat_matrix(table, cats))]
        if nums:
            parts.append(sp.csr_matrix((_num_matrix(table, nums) - mu) / sd))
        return sp.hstack(parts, format="csr")

    return encode


def _cat_matrix(table: pa.Table, names: list[str]) -> np.ndarray:
    cols = [
        pc.cast(table.column(n), pa.string()).fill_null("").to_numpy(zero_copy_only=False)
        for n in names
    ]
    return np.stack(cols, axis=1).astype(object)


def _num_matrix(table: pa.Table, names: list[str]) -> np.ndarray:
    if not names:
        return np.zeros((table.num_rows, 0))
    cols = [
        pc.cast(table.column(n), pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False)
        for n in names
    ]
    return np.stack(cols, axis=1)


@dataclass
class RewardModel:
    q: np.ndarray  # [n, A] cross-fitted q(x_i, a)
    folds: int
    description: str
    fallback_folds: int  # folds whose training part had one class (q = its mean reward)


def fit_reward_model(
    logs: Logs,
    bl: BanditLogs,
    build: Callable[[int, int], pa.Table],
    folds: int = 2,
    seed: int = 0,
) -> RewardModel:
    """Cross-fitted logistic-regression reward model ``q(x, a)`` for every row and candidate."""
    if folds < 2:
        raise ValueError(f"reward-model folds must be >= 2 (cross-fitting), got {folds}")
    n, a = logs.n, bl.actions.size
    encode = _encoder(logs, bl)
    x = encode(logs.table)
    fold = np.random.default_rng([seed, 7]).permutation(n) % folds
    models: list[object] = []
    fallback = 0
    for k in range(folds):
        train = fold != k
        r = bl.reward[train]
        if r.min() == r.max():
            models.append(float(r.mean()))
            fallback += 1
            continue
        m = LogisticRegression(C=1.0, max_iter=2000)
        m.fit(x[train], r)
        models.append(m)
    q = np.empty((n, a))
    step = max(1, 65536 // a)
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        xc = encode(build(lo, hi))
        f = np.repeat(fold[lo:hi], a)
        out = np.empty(xc.shape[0])
        for k, m in enumerate(models):
            sel = f == k
            if not sel.any():
                continue
            out[sel] = m if isinstance(m, float) else m.predict_proba(xc[sel])[:, 1]
        q[lo:hi] = out.reshape(hi - lo, a)
    desc = (
        f"logistic regression (L2, C=1) on one-hot categorical and standardised numeric inputs, "
        f"{folds}-fold cross-fitted"
    )
    return RewardModel(q=q, folds=folds, description=desc, fallback_folds=fallback)


@dataclass
class PolicyRows:
    """Per-row terms of every estimator for one policy."""

    w: np.ndarray  # [n] importance weights
    wr: np.ndarray  # [n] w * r
    dm: np.ndarray  # [n] sum_a pi q
    dr: np.ndarray  # [n] dm + w (r - q(x, a_i))

    def kernels(self) -> dict[str, bootstrap.Kernel]:
        return {
            "ips": bootstrap.RatioKernel(self.wr),
            "snips": bootstrap.RatioKernel(self.wr, self.w),
            "dm": bootstrap.RatioKernel(self.dm),
            "dr": bootstrap.RatioKernel(self.dr),
        }

    def point(self) -> dict[str, float]:
        return {
            "ips": float(self.wr.mean()),
            "snips": float(self.wr.sum() / self.w.sum()) if self.w.sum() > 0 else float("nan"),
            "dm": float(self.dm.mean()),
            "dr": float(self.dr.mean()),
        }

    def diagnostics(self) -> dict[str, float]:
        return {
            "mean_weight": float(self.w.mean()),
            "max_weight": float(self.w.max()),
            "effective_sample_size": float(
                self.w.sum() ** 2 / max(np.square(self.w).sum(), 1e-300)
            ),
        }


def policy_rows(pi: np.ndarray, bl: BanditLogs, q: np.ndarray | None) -> PolicyRows:
    n = bl.reward.size
    rows = np.arange(n)
    w = pi[rows, bl.action_idx] / bl.propensity
    wr = w * bl.reward
    if q is None:
        dm = np.full(n, np.nan)
        dr = np.full(n, np.nan)
    else:
        dm = (pi * q).sum(axis=1)
        dr = dm + w * (bl.reward - q[rows, bl.action_idx])
    return PolicyRows(w=w, wr=wr, dm=dm, dr=dr)
