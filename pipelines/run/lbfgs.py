"""``[train] optimizer = "lbfgs"``: logistic regression (``[model] type = "lr"``) fitted exactly,
along a regularization path chosen on the validation split.

For each ``C`` of ``[train] lbfgs_c`` (scikit-learn's inverse regularization strength), from
the smallest (the strongest penalty) up, the run minimizes over every training row at once::

    J(w, b) = mean_i BCE(y_i, b + w . x_i) + l2 * ||w||^2,   l2 = 1 / (2 * C * N)

(``N`` training rows; the bias ``b`` is not penalized), which is the objective of
``sklearn.linear_model.LogisticRegression(C=C)`` on the same one-hot ids and standardized
numeric features. The minimizer is SciPy's L-BFGS-B (``scipy.optimize.minimize``) on the
float64 flat vector of the model's weights. Value and gradient come from one of two forms of
the same function: where every wide table reads one row per id (``full`` and ``hashing``
tables, the default), a float64 sparse design matrix of the training rows (``SparseObjective``);
otherwise the model's own forward and backward pass in batches of ``BATCH_ROWS``
(``GraphObjective``: logits in float32, losses summed in float64). Each fit starts from the previous one's
weights (a warm-started path, as scikit-learn's and glmnet's are).

Each point of the path is one "epoch" of the run: the fit is evaluated on the validation split,
recorded in ``history.jsonl`` (with its ``c``, ``l2`` and L-BFGS ``iterations``), checkpointed,
and kept as ``checkpoints/best/`` when it is the best so far; early stopping (``patience``)
ends the path after that many points without improvement. The run's step counts L-BFGS
iterations. A killed run resumes at the first point it had not finished, from the weights of
the last finished one, and ends where an uninterrupted run ends.

The training rows are preprocessed once (vocabulary lookups, standardization) and held in
memory: as the design matrix, about 12 bytes per id and numeric value of a row; in the graph
form, as ids and floats, about 8.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import scipy.optimize
import scipy.sparse
import scipy.special
import tensorflow as tf

from embeddings.full import FullEmbedding
from embeddings.hashing import HashingEmbedding
from pipelines.config_train import EXACT_FIT_ROWS
from pipelines.run.loop import TrainLoop

#: embedding layers that read one table row per id (``row_index``): a linear map of the table
GATHER_TABLES = (FullEmbedding, HashingEmbedding)

#: training rows per TensorFlow call of the objective
BATCH_ROWS = 16_384
#: L-BFGS-B's stopping rule per fit: at most this many iterations, or a projected gradient
#: below ``GRADIENT_TOLERANCE``, or a relative decrease of J below ``VALUE_TOLERANCE``.
MAX_ITERATIONS = 1_000
GRADIENT_TOLERANCE = 1e-6
VALUE_TOLERANCE = 1e-12
#: A fit whose line search ends on the float32 weights' resolution (SciPy's ``ABNORMAL``) with
#: every gradient component below this has converged as far as float32 weights can.
FLOAT32_GRADIENT = 1e-5


def l2_of(c: float, rows: int) -> float:
    """The ``l2`` of ``J`` equal to scikit-learn's ``C`` on ``rows`` training rows."""
    return 1.0 / (2.0 * c * rows)


class Objective:
    """``J`` of one linear model over its preprocessed training rows (base of the two forms).

    Args:
      model: a ``RankingModel`` whose trainable weights are its wide term's and its bias.
      batches: ``(ids, dense, labels)`` of every training row (``preprocess``).
    """

    def __init__(self, model: tf.keras.Model, batches: list[tuple[Any, Any, tf.Tensor]]):
        self.model, self.batches = model, batches
        self.variables = list(model.trainable_variables)
        penalized = {id(v) for v in model.wide.trainable_variables}
        self.rows = sum(int(y.shape[0]) for _, _, y in batches)
        self._sizes = [int(np.prod(v.shape)) for v in self.variables]
        self.offsets = dict(
            zip(
                (id(v) for v in self.variables),
                np.cumsum([0, *self._sizes])[:-1].tolist(),
                strict=True,
            )
        )
        self._mask = np.concatenate(
            [
                np.full(n, id(v) in penalized, dtype=bool)
                for v, n in zip(self.variables, self._sizes, strict=True)
            ]
        )

    def weights(self) -> np.ndarray:
        """The model's weights as one float64 vector."""
        return np.concatenate([v.numpy().reshape(-1) for v in self.variables]).astype(np.float64)

    def assign(self, x: np.ndarray) -> None:
        """Sets the model's weights from the vector ``x``."""
        offset = 0
        for v, n in zip(self.variables, self._sizes, strict=True):
            v.assign(x[offset : offset + n].reshape(v.shape).astype(np.float32))
            offset += n

    def loss_and_gradient(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        """The summed log loss over the training rows at ``x`` and its gradient (float64)."""
        raise NotImplementedError

    def value_and_gradient(self, x: np.ndarray, l2: float) -> tuple[float, np.ndarray]:
        """``J(x)`` and its gradient (float64) at penalty ``l2``."""
        total, grad = self.loss_and_gradient(x)
        w = np.where(self._mask, x, 0.0)
        value = total / self.rows + l2 * float(w @ w)
        return value, grad / self.rows + 2.0 * l2 * w

    def fit(self, l2: float, max_iterations: int = MAX_ITERATIONS) -> dict[str, Any]:
        """Minimizes ``J`` at ``l2`` from the model's current weights; leaves the minimizer in
        the model and returns the fit's iterations, value, gradient norm and SciPy's message."""
        result = scipy.optimize.minimize(
            self.value_and_gradient,
            self.weights(),
            args=(l2,),
            jac=True,
            method="L-BFGS-B",
            options={
                "maxiter": max_iterations,
                "gtol": GRADIENT_TOLERANCE,
                "ftol": VALUE_TOLERANCE,
            },
        )
        self.assign(result.x)
        gradient = float(np.max(np.abs(result.jac)))
        return {
            "iterations": int(result.nit),
            "evaluations": int(result.nfev),
            "objective": float(result.fun),
            "gradient_norm": gradient,
            "converged": bool(result.success) or gradient <= FLOAT32_GRADIENT,
            "message": str(result.message),
        }


class GraphObjective(Objective):
    """``J`` by the model's own forward and backward pass, one TensorFlow call per batch: any
    wide term (every embedding method)."""

    FORM = "graph"

    def __init__(self, model: tf.keras.Model, batches: list[tuple[Any, Any, tf.Tensor]]):
        super().__init__(model, batches)
        self._sum = tf.function(self._batch_sum, reduce_retracing=True, autograph=False)

    def _batch_sum(self, ids: Any, dense: Any, labels: tf.Tensor) -> tuple[tf.Tensor, list]:
        with tf.GradientTape() as tape:
            logits = tf.cast(self.model.logits_from(ids, dense, training=False), tf.float64)
            y = tf.cast(tf.reshape(labels, tf.shape(logits)), tf.float64)
            loss = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(y, logits))
        grads = tape.gradient(loss, self.variables)
        return loss, [tf.convert_to_tensor(g) for g in grads]

    def loss_and_gradient(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        self.assign(x)
        total, grad = 0.0, np.zeros_like(x)
        for ids, dense, labels in self.batches:
            loss, grads = self._sum(ids, dense, labels)
            total += float(loss)
            grad += np.concatenate([g.numpy().reshape(-1) for g in grads])
        return total, grad


class SparseObjective(Objective):
    """``J`` on the design matrix of the training rows (float64, SciPy CSR): a column per
    weight, one entry per id looked up (1, or 1/n for a ``mean`` field of n ids), the numeric
    features' values and a column of ones for the bias, so ``logits = X @ x``. For wide terms
    whose tables read one row per id (``full`` and ``hashing``); several times faster than the
    graph form and exact in float64. Holds about 12 bytes per id and numeric value of every
    training row."""

    FORM = "sparse"

    def __init__(self, model: tf.keras.Model, batches: list[tuple[Any, Any, tf.Tensor]]):
        super().__init__(model, batches)
        blocks = [self._design(ids, dense, int(y.shape[0])) for ids, dense, y in batches]
        self.x = scipy.sparse.vstack(blocks, format="csr")
        self.y = np.concatenate([y.numpy().reshape(-1) for _, _, y in batches]).astype(np.float64)
        self.batches = []  # the matrix holds them

    @staticmethod
    def applies(model: tf.keras.Model) -> bool:
        """Whether every wide weight is a table read one row per id, the numeric weights or
        the bias (else ``GraphObjective``)."""
        wide = model.wide
        tables = wide.field_weights.layers_by_field.values() if wide.field_weights else []
        if not all(type(t) in GATHER_TABLES and t.combiner in ("sum", "mean") for t in tables):
            return False
        known = {id(t.table) for t in tables} | {id(model.bias)}
        if wide._dense is not None:
            known.add(id(wide._dense.kernel))
        return all(id(v) in known for v in model.trainable_variables)

    def _design(self, ids: dict[str, Any], dense: Any, n: int) -> scipy.sparse.csr_matrix:
        """The ``n`` rows of one batch of the design matrix."""
        wide = self.model.wide
        rows, cols, vals = [], [], []
        tables = wide.field_weights.layers_by_field if wide.field_weights else {}
        for name, table in tables.items():
            x = ids[name]
            if isinstance(x, tf.RaggedTensor):
                r = x.value_rowids().numpy()
                flat = x.flat_values
                lengths = x.row_lengths().numpy()
                v = (1.0 / lengths[r]) if table.combiner == "mean" else np.ones(r.size)
            else:
                flat = tf.reshape(x, [-1])
                r = np.arange(int(flat.shape[0]))
                v = np.ones(r.size)
            rows.append(r)
            cols.append(self.offsets[id(table.table)] + table.row_index(flat).numpy())
            vals.append(v)
        if wide._dense is not None and dense is not None:
            d = dense.numpy().astype(np.float64)
            rows.append(np.repeat(np.arange(n), d.shape[1]))
            cols.append(np.tile(self.offsets[id(wide._dense.kernel)] + np.arange(d.shape[1]), n))
            vals.append(d.reshape(-1))
        rows.append(np.arange(n))
        cols.append(np.full(n, self.offsets[id(self.model.bias)]))
        vals.append(np.ones(n))
        return scipy.sparse.csr_matrix(
            (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
            shape=(n, len(self._mask)),
        )

    def loss_and_gradient(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        z = self.x @ x
        loss = float(np.sum(np.logaddexp(0.0, z) - self.y * z))
        return loss, self.x.T @ (scipy.special.expit(z) - self.y)


def make_objective(model: tf.keras.Model, batches: list[tuple[Any, Any, tf.Tensor]]) -> Objective:
    """``SparseObjective`` where it applies, else ``GraphObjective``."""
    if SparseObjective.applies(model):
        return SparseObjective(model, batches)
    return GraphObjective(model, batches)


def preprocess(model: tf.keras.Model, make: Any) -> list[tuple[Any, Any, tf.Tensor]]:
    """``(ids, dense, labels)`` of every training row, in batches of ``BATCH_ROWS``: the
    model's preprocessing (``RankingModel.preprocessed``) applied once. ``make`` is the run's
    reader."""
    return [
        (*model.preprocessed(features), model.labels_of(features))
        for features in make(batch_size=BATCH_ROWS, shuffle=False)
    ]


def choose_optimizer(
    cfg: Any, rows: int, *, distributed: bool, validation: bool
) -> tuple[str, str]:
    """``[train] optimizer = "auto"`` of a ``type = "lr"`` run with ``rows`` training rows:
    ``("lbfgs", why)`` where the exact fit applies, else ``("ftrl", the first reason it does
    not)``. ``distributed``: a distribution strategy trains the run; ``validation``: it has a
    validation split. With none of these, a ``type = "lr"`` model passes ``check_linear``."""
    tc, mc = cfg.train, cfg.model
    blockers = (
        (distributed, "a distribution strategy trains it"),
        (cfg.fusion is not None, "[fusion] is set"),
        (bool(tc.continue_from), "it continues a run (continue_from)"),
        (bool(tc.warm_start), "warm_start is set"),
        (tc.lr_schedule != "constant", f"lr_schedule = {tc.lr_schedule!r}"),
        (tc.ensemble != "none", f"ensemble = {tc.ensemble!r}"),
        (tc.weight_average != "none", f"weight_average = {tc.weight_average!r}"),
        (tc.max_steps > 0, f"max_steps = {tc.max_steps}"),
        (bool(mc.l2_wide or mc.l1_wide), "[model] l2_wide or l1_wide is set"),
        (len(tc.lbfgs_c) > 1 and not validation, "no validation split to choose C on"),
        (rows > EXACT_FIT_ROWS, f"{rows:,} training rows > {EXACT_FIT_ROWS:,}"),
    )
    for blocked, why in blockers:
        if blocked:
            return "ftrl", why
    return "lbfgs", f"{rows:,} training rows <= {EXACT_FIT_ROWS:,}"


def check_linear(model: tf.keras.Model) -> None:
    """Raises ValueError unless ``model``'s trainable weights are its wide term's and its bias,
    with no penalty of its own (L-BFGS fits ``J``, whose only penalty is the path's)."""
    wide = getattr(model, "wide", None)
    if wide is None or getattr(model, "interaction", None) is not None:
        raise ValueError(f"optimizer 'lbfgs' fits [model] type = 'lr' only, got {model.name!r}")
    allowed = {id(v) for v in wide.trainable_variables} | {id(model.bias)}
    others = [v.name for v in model.trainable_variables if id(v) not in allowed]
    if others or getattr(model, "residual", None) is not None:
        raise ValueError(
            f"optimizer 'lbfgs' fits the wide term and the bias; the model also trains {others}"
        )
    if wide.l2 or wide.l1:
        raise ValueError(
            f"optimizer 'lbfgs' sets the L2 penalty by [train] lbfgs_c; got [model] l2_wide = "
            f"{wide.l2} and l1_wide = {wide.l1}, expected 0 (L-BFGS needs a smooth objective)"
        )


class LbfgsLoop(TrainLoop):
    """The regularization path of a linear model as a run's epochs (module docstring)."""

    def __init__(self, run: Any, state: Any, scorer: Any, objective: Objective) -> None:
        metrics = (tf.keras.metrics.Mean(), tf.keras.metrics.AUC())
        super().__init__(run, state, None, metrics, scorer)
        self.objective = objective
        self.path = sorted(run.cfg.train.lbfgs_c)
        self.fits: list[dict[str, Any]] = []

    def run(self, steps_per_epoch: int = 0, total_steps: int = 0) -> None:
        r, s, obj = self.run_, self.state, self.objective
        t_start = time.time()
        while int(s.epoch) < len(self.path) and not self.stopped:
            epoch = int(s.epoch)
            c = self.path[epoch]
            l2 = l2_of(c, obj.rows)
            fit = {"c": c, "l2": l2, **obj.fit(l2, r.cfg.train.lbfgs_max_iterations)}
            self.fits.append(fit)
            s.step.assign_add(max(fit["iterations"], 1))
            self.trained_steps += fit["iterations"]
            self.examples += obj.rows * fit["evaluations"]
            s.epoch.assign_add(1)
            r.log(
                f"lbfgs C={c:g} (l2 {l2:.3g}): {fit['iterations']} iterations, objective "
                f"{fit['objective']:.6f}, max |gradient| {fit['gradient_norm']:.2g}"
                + ("" if fit["converged"] else f" (not converged: {fit['message']})")
            )
            keys = ("c", "l2", "iterations", "converged")
            extra = {k: fit[k] for k in keys}
            if r.validation_files:
                self._validate(epoch, extra)
            else:
                s.manager.save(checkpoint_number=int(s.step))
        if self.stopped:
            sel = s.selection
            r.log(
                f"early stopping after C={self.path[int(s.epoch) - 1]:g}: {sel.patience} "
                f"value(s) of C without improving validation {sel.metric}"
            )
        self.writer.flush()
        self.train_seconds = time.time() - t_start - self.eval_seconds

    def describe(self) -> dict[str, Any]:
        """The path's report: the C values, each fit of this process, the selected C."""
        chosen = None
        sel = self.state.selection
        if sel is not None and sel.has_best:  # the C recorded with the best evaluation
            best = [e for e in self.state.history.entries() if e["step"] == int(sel.best_step)]
            chosen = best[-1].get("c") if best else None
        return {
            "c_path": self.path,
            "rows": self.objective.rows,
            "form": self.objective.FORM,
            "fits": self.fits,
            "selected_c": chosen,
        }
