"""FIVES: Feature Interaction Via Edge Search (Xie et al., KDD'21, arXiv 2007.14573).

FIVES finds which field crosses matter by learning the edges of a feature graph with one node
per field. Layer ``k`` of a graph network over that graph holds order-(k+1) interactions::

    n_i^(0) = e_i                                                  field embedding   [batch, d]
    p_i^(k) = sum_j A^(k)_ij W^(k)_j e_j / max(1, #{j: phi(A^(k)_ij) = 1})     (Eq. 2, MEAN)
    n_i^(k) = p_i^(k) * n_i^(k-1)                                  element-wise: order k+1
    logit   = MLP(concat_{i, k=0..K-1} n_i^(k))

with a learnable adjacency logit tensor ``H^(k)`` [F, F] per layer (Eq. 7, 8)::

    A^(1) = sigma(H^(1) / tau)
    A^(k) = rescale_tau(D^-1 phi(A^(k-1)) sigma(H^(k)))            k >= 2
    rescale_tau(a) = sigma(logit(a) / tau),   phi(a) = [a >= 0.5] (straight-through gradient)

``tau`` is annealed geometrically from ``tau_start`` (1) to ``tau_end`` (0.02) over the search,
closing the gap between the soft edges used in propagation and the binarized ones read out. The
diagonal (a field with itself) is masked. The search alternates (Algorithm 1, DARTS-style first
order): a step on the model weights (embeddings, W, MLP) on a training batch, then a step on the
adjacency logits H on a validation batch, whose loss adds ``sparsity * mean(A)`` (our addition,
a small push that turns edges nobody needs off; 0 disables it).

Crosses are read off the adjacencies (the paper's Fig. 2): an active edge i->l at layer 1 gives
the pair {i, l}; with an active edge i->j at layer 2 it gives the triple {i, l, j}, and so on.
A cross's ``strength`` is the product of its soft edges at tau = 1 along the path (the weight of
the product term e_i * W e_l * W e_j in n_i^(k)), maximized over the paths that give the same
field set; ``active`` says every edge on a best path is on after binarization. The ranking puts
all orders in one list, by strength.

Inputs: each field becomes ids (``encode``): categorical values by a training vocabulary (values
seen ``min_count`` times, at most ``max_vocab``; 1 = other, 0 = missing), a multi-categorical
cell as one value (its whole string), numeric values by ``numeric_bins`` training quantiles
(0 = missing). Fields with a single value or all values missing are skipped and reported; a
split without both classes is an error.

Shapes: ``ids`` int32 [batch, F]; ``H`` [K-1, F, F]; ``W`` [K-1, F, d, d]; logits [batch].
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import tensorflow as tf

from features.crosses.artifact import Cross, CrossArtifact
from features.crosses.fives_config import CONTRIBUTION_ROWS, FivesConfig, FivesDataError, Log
from features.crosses.fives_encoding import FieldEncoder, fit_encoder, float_values
from features.crosses.fives_graph import adjacency
from features.crosses.fives_network import FivesNetwork, predict_probabilities
from features.crosses.fives_readout import contributions, extract_crosses, with_distinct
from features.crosses.fives_screen import screen_and_rank
from features.schema import Schema
from features.tasks import TaskRunner
from ranking.metrics import auc

DEFAULT_CONFIG = FivesConfig()


@dataclasses.dataclass
class FivesResult:
    """A finished search: the network, the encoder, the ranked crosses and the history."""

    network: FivesNetwork
    encoder: FieldEncoder
    crosses: list[Cross]
    history: list[dict[str, Any]]
    config: FivesConfig
    rows: dict[str, int]
    seconds: float
    # the edge search's own ranking before the interaction screen (the paper's read-out;
    # ``distinct`` left at 0)
    edge_crosses: list[Cross] = dataclasses.field(default_factory=list)
    # what the interaction screen tested and selected (``screen_and_rank``); empty: no screen
    screen: dict[str, Any] = dataclasses.field(default_factory=dict)

    def predict(self, ids: np.ndarray, batch_size: int = 16384) -> np.ndarray:
        """Click probabilities of encoded rows ``ids`` [rows, F] (FIVES as a predictor)."""
        out = [
            tf.sigmoid(self.network(ids[i : i + batch_size], training=False)).numpy()
            for i in range(0, len(ids), batch_size)
        ]
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    def artifact(self, schema_name: str) -> CrossArtifact:
        cfg = dataclasses.asdict(self.config)
        return CrossArtifact(
            method="fives",
            schema=schema_name,
            fields=list(self.encoder.fields),
            crosses=self.crosses,
            boundaries=dict(self.encoder.boundaries),
            skipped=list(self.encoder.skipped),
            search={
                "paper": "FIVES, Xie et al., KDD'21 (arXiv 2007.14573)",
                "config": {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()},
                "rows": self.rows,
                "seconds": round(self.seconds, 2),
                "history": self.history,
                **({"screen": self.screen} if self.screen else {}),
            },
        )


def _check_labels(y: np.ndarray, split: str) -> None:
    pos = int(np.sum(y > 0.5))
    if pos == 0 or pos == y.size:
        what = "no positive" if pos == 0 else "no negative"
        raise FivesDataError(
            f"fives: the {split} split ({y.size:,} rows) has {what} labels; the search needs "
            f"both classes in the training and validation splits (more rows, or another "
            f"validation_fraction / seed)"
        )


def split_rows(rows: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) row indices: a seeded random ``fraction`` goes to validation."""
    rng = np.random.default_rng(seed)
    is_val = rng.random(rows) < fraction
    return np.flatnonzero(~is_val), np.flatnonzero(is_val)


def search(
    schema: Schema,
    table: pa.Table,
    config: FivesConfig = DEFAULT_CONFIG,
    fields: Sequence[str] | None = None,
    log: Log = print,
    top_k_log: int = 5,
    runner: TaskRunner | None = None,
) -> FivesResult:
    """Runs the FIVES search on ``table`` (columns named by field, label included).

    Splits the rows into training and validation (``validation_fraction``), encodes the fields
    (fit on the training rows), and alternates weight and adjacency updates for ``epochs``
    epochs while annealing tau; logs one line per epoch. Returns the ranked crosses. The
    interaction screen's counting runs as tasks on ``runner`` (default: this process).

    Raises:
      FivesDataError: fewer than two usable fields, or a split without both classes.
    """
    t0 = time.time()
    data = _encode_splits(schema, table, config, fields, log)
    log(
        f"fives: {len(data.encoder.fields)} fields, {len(data.y_train):,} training and "
        f"{len(data.y_val):,} validation rows, max order {config.max_order}, {config.epochs} "
        f"epochs (encoded in {time.time() - t0:.1f}s)"
    )
    net = build_network(data.encoder, config, data.x_train, data.y_train)

    def rank(net: FivesNetwork) -> list[tuple[tuple[str, ...], float, bool]]:
        if config.strength == "contribution":
            return contributions(net, data.x_val[:CONTRIBUTION_ROWS], data.encoder.fields)
        return extract_crosses(net.adjacency_at(1.0), data.encoder.fields)

    history = _train(net, config, data, rank, log, top_k_log)
    ranked = edge_ranked = rank(net)
    extras: dict[frozenset[str], tuple[str, float | None]] = {}
    screen_report: dict[str, Any] = {}
    x_train, y_train = data.x_train, data.y_train
    if orders := [o for o in config.screen_orders if o <= min(config.max_order, x_train.shape[1])]:
        ranked, extras, screen_report = screen_and_rank(
            ranked,
            orders,
            config,
            data.encoder.fields,
            (x_train, y_train),
            (data.x_val, data.y_val),
            log,
            runner,
        )
    crosses = with_distinct(ranked, data.encoder, x_train, extras=extras)
    return FivesResult(
        network=net,
        encoder=data.encoder,
        crosses=crosses,
        history=history,
        config=config,
        rows={"train": len(y_train), "validation": len(data.y_val)},
        seconds=time.time() - t0,
        edge_crosses=(
            with_distinct(edge_ranked, data.encoder, x_train, limit=0)
            if edge_ranked is not ranked
            else crosses
        ),
        screen=screen_report,
    )


@dataclasses.dataclass
class _Splits:
    """The encoder (fit on the training rows) and the encoded training and validation rows."""

    encoder: FieldEncoder
    x_train: np.ndarray  # int32 [rows, F]
    y_train: np.ndarray  # float32 [rows]
    x_val: np.ndarray
    y_val: np.ndarray


def _encode_splits(
    schema: Schema,
    table: pa.Table,
    config: FivesConfig,
    fields: Sequence[str] | None,
    log: Log,
) -> _Splits:
    """Splits ``table``'s rows, checks both splits' labels, fits the encoder and encodes."""
    label = schema.label.name
    if label not in table.column_names:
        raise FivesDataError(f"fives: the data has no label column {label!r}")
    if table.num_rows < 2:
        raise FivesDataError(f"fives: {table.num_rows} rows; the search needs more")
    y_all = float_values(table.column(label))
    train_idx, val_idx = split_rows(table.num_rows, config.validation_fraction, config.seed)
    _check_labels(y_all[train_idx], "training")
    _check_labels(y_all[val_idx], "validation")
    train_table = table.take(pa.array(train_idx))
    encoder = fit_encoder(
        schema, train_table, fields, config.numeric_bins, config.max_vocab, config.min_count
    )
    for s in encoder.skipped:
        log(f"fives: skipping field {s['field']!r}: {s['reason']}")
    if len(encoder.fields) < 2:
        raise FivesDataError(
            f"fives: {len(encoder.fields)} usable field(s) ({encoder.fields}) after skipping "
            f"{[s['field'] for s in encoder.skipped]}; a cross needs two or more"
        )
    x_train = encoder.transform(train_table)
    x_val = encoder.transform(table.take(pa.array(val_idx)))
    return _Splits(encoder, x_train, y_all[train_idx], x_val, y_all[val_idx])


def build_network(
    encoder: FieldEncoder, config: FivesConfig, x_train: np.ndarray, y_train: np.ndarray
) -> FivesNetwork:
    """A built FIVES network for ``encoder``'s fields, seeded by ``config.seed``; its output
    bias starts at the training rows' base-rate logit."""
    tf.keras.utils.set_random_seed(config.seed)
    net = FivesNetwork(
        encoder.vocab_sizes,
        embedding_dim=config.embedding_dim,
        max_order=config.max_order,
        mlp=config.mlp,
        dropout=config.dropout,
        init_logit=config.init_logit,
        weight_decay=config.weight_decay,
        embedding_stddev=config.embedding_stddev,
        w_init=config.w_init,
        heredity=config.heredity,
        name="fives",
    )
    net(x_train[:2])
    with tf.init_scope():
        bias = math.log(max(y_train.mean(), 1e-6) / max(1 - y_train.mean(), 1e-6))
        net.out.bias.assign([bias])
    return net


Step = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]


def _train_steps(net: FivesNetwork, config: FivesConfig) -> tuple[Step, Step]:
    """The compiled weight step (training loss) and adjacency step (validation loss plus
    ``sparsity`` times the mean soft edge), each with its own Adam optimizer."""
    opt_w = tf.keras.optimizers.Adam(config.learning_rate)
    opt_h = tf.keras.optimizers.Adam(config.arch_learning_rate)
    bce = tf.keras.losses.BinaryCrossentropy(from_logits=True)
    weight_vars, arch_vars = net.weight_variables, net.arch_variables
    off_diag = tf.constant(1.0 - np.eye(net.num_fields), tf.float32)

    @tf.function(reduce_retracing=True)
    def weight_step(xb: tf.Tensor, yb: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = bce(yb, net(xb, training=True))
            total = loss + tf.add_n(net.losses) if net.losses else loss
        opt_w.apply_gradients(zip(tape.gradient(total, weight_vars), weight_vars, strict=True))
        return loss

    @tf.function(reduce_retracing=True)
    def arch_step(xv: tf.Tensor, yv: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            val_loss = bce(yv, net(xv, training=False))
            adj = adjacency(net.h, net.tau, net.heredity)
            density = tf.add_n([tf.reduce_sum(a * off_diag) for a in adj]) / (
                len(adj) * tf.reduce_sum(off_diag)
            )
            arch_loss = val_loss + config.sparsity * density
        opt_h.apply_gradients(zip(tape.gradient(arch_loss, arch_vars), arch_vars, strict=True))
        return val_loss

    return weight_step, arch_step


Ranking = Callable[[FivesNetwork], list[tuple[tuple[str, ...], float, bool]]]


def _train(
    net: FivesNetwork,
    config: FivesConfig,
    data: _Splits,
    rank: Ranking,
    log: Log,
    top_k_log: int,
) -> list[dict[str, Any]]:
    """The alternating search (warm-up, search and fine-tune epochs); returns the history."""
    weight_step, arch_step = _train_steps(net, config)
    x_train, y_train, x_val, y_val = data.x_train, data.y_train, data.x_val, data.y_val
    bs = config.batch_size
    steps_per_epoch = max(1, math.ceil(len(x_train) / bs))
    total_steps = steps_per_epoch * (config.epochs - config.warmup_epochs)
    rng = np.random.default_rng(config.seed + 1)
    history: list[dict[str, Any]] = []
    global_step = 0
    val_pos = 0
    val_order = rng.permutation(len(x_val))
    epochs = config.epochs + config.finetune_epochs
    for epoch in range(epochs):
        t_epoch = time.time()
        order = rng.permutation(len(x_train))
        losses, val_losses = [], []
        warmup = epoch < config.warmup_epochs
        finetune = epoch >= config.epochs
        for s in range(steps_per_epoch):
            idx = order[s * bs : (s + 1) * bs]
            losses.append(float(weight_step(tf.constant(x_train[idx]), tf.constant(y_train[idx]))))
            if warmup or finetune:
                continue
            frac = global_step / max(total_steps - 1, 1)
            net.tau.assign(config.tau_start * (config.tau_end / config.tau_start) ** frac)
            if val_pos + bs > len(val_order):
                val_order, val_pos = rng.permutation(len(x_val)), 0
            vidx = val_order[val_pos : val_pos + bs]
            val_pos += bs
            val_losses.append(float(arch_step(tf.constant(x_val[vidx]), tf.constant(y_val[vidx]))))
            global_step += 1
        entry = _epoch_entry(
            net, epoch, losses, val_losses, y_val, predict_probabilities(net, x_val)
        )
        ranked = rank(net)
        entry["seconds"] = round(time.time() - t_epoch, 2)
        history.append(entry)
        top = ", ".join(f"{'x'.join(c)}:{s:.2f}" for c, s, _ in ranked[:top_k_log])
        phase = (
            f"val loss {entry['val_loss']:.4f} "
            if val_losses
            else ("(fine-tune) " if finetune else "(warm-up) ")
        )
        log(
            f"fives: epoch {epoch + 1}/{epochs} tau {entry['tau']:.3f} "
            f"loss {entry['train_loss']:.4f} "
            + phase
            + f"val auc {entry['val_auc']:.4f} active edges {entry['active_edges']} "
            f"({entry['seconds']:.1f}s); top: {top}"
        )
    return history


def _epoch_entry(
    net: FivesNetwork,
    epoch: int,
    losses: list[float],
    val_losses: list[float],
    y_val: np.ndarray,
    p_val: np.ndarray,
) -> dict[str, Any]:
    """One history entry (``seconds`` added by the caller): tau, losses, AUC, active edges."""
    adj = net.adjacency_at(1.0)
    return {
        "epoch": epoch + 1,
        "tau": round(float(net.tau.numpy()), 4),
        "train_loss": round(float(np.mean(losses)), 5),
        "val_loss": round(float(np.mean(val_losses)), 5) if val_losses else None,
        "val_auc": round(auc(y_val, p_val), 5),
        "active_edges": [int(np.sum(a >= 0.5)) for a in adj],
    }
