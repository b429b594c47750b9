"""Multi-task ranking models: one shared input, a multi-task head, one tower and logit per task.

``MultiTaskModel`` computes the logits of ``T`` tasks (``ranking.config.TaskConfig``) of a batch
of raw features::

    ids, dense = preprocessor(features)                 # raw -> ids / dense matrix
    z          = interaction(embedding(ids), dense)     # [batch, k]
    h          = head(z)                                # [batch, T, h] (ranking.multitask_heads)
    logits     = towers(h)                              # [batch, T], columns in task order

Task 0 is the primary task (``primary``). The loss (``task_loss``) is
``sum_t weight_t * mean BCE_t``; a task ``defined_on`` a parent task counts only the rows whose
parent label is 1 (its tower models the rate given the parent, e.g. conversion given click).

ESMM (Ma et al., "Entire Space Multi-Task Model", SIGIR 2018; ``kind = "esmm"``): two tasks,
click then conversion defined_on click. The towers give the pCTR logit ``a`` and the pCVR logit
``b`` over the shared input; column 1 is the logit of ``pCTCVR = sigmoid(a) * sigmoid(b)``,
trained on every row against the conversion label (0 where not clicked), so pCVR is learned
over the whole impression space. ``conditional_logits`` gives ``b``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from embeddings.collection import EmbeddingCollection
from ranking.blocks import ConcatInteraction, CrossInteraction, FMInteraction
from ranking.click_model import ClickModel, ranking_task
from ranking.config import MULTITASK_KINDS, ModelConfig, TaskConfig, check_tasks, tasks_of
from ranking.multitask_heads import PLE, MMoE, SharedBottom, TaskTowers
from ranking.sequence_features import embed_with_history, sequence_blocks
from ranking.tables import embedding_tables


def _log_add_exp(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    """``log(exp(x) + exp(y))`` without overflow."""
    top = tf.maximum(x, y)
    return top + tf.math.log1p(tf.exp(-tf.abs(x - y)))


def ctcvr_logit(ctr_logit: tf.Tensor, cvr_logit: tf.Tensor) -> tf.Tensor:
    """``logit(sigmoid(a) * sigmoid(b))`` for logits ``a``, ``b`` of any magnitude.

    With ``ls = log_sigmoid``: ``log p = ls(a) + ls(b)`` and
    ``log(1 - p) = log(sigmoid(-a) + sigmoid(a) sigmoid(-b)) = logaddexp(ls(-a), ls(a) + ls(-b))``,
    so ``logit(p) = log p - log(1 - p)`` stays finite (no ``1 - p`` rounding to 0 when both
    logits are large, no ``p`` underflowing when they are very negative). Computed in float64,
    returned in the input's dtype.
    """
    a = tf.cast(ctr_logit, tf.float64)
    b = tf.cast(cvr_logit, tf.float64)
    ls = tf.math.log_sigmoid
    log_p = ls(a) + ls(b)
    log_not_p = _log_add_exp(ls(-a), ls(a) + ls(-b))
    return tf.cast(log_p - log_not_p, ctr_logit.dtype)


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class MultiTaskModel(ClickModel):
    """Multi-task logits ``[batch, T]`` from blocks (see the module docstring).

    Args:
      preprocessor: raw features -> (ids dict, dense matrix or None).
      tasks: ``TaskConfig``s (or their dicts), task 0 the primary one.
      embedding: ids dict -> vectors (``EmbeddingCollection``).
      interaction: (vectors, dense) -> ``[batch, k]`` (concat, FM or DCN-v2 cross).
      head: ``[batch, k] -> [batch, T, h]`` (``SharedBottom``, ``MMoE``, ``PLE``).
      towers: ``[batch, T, h] -> [batch, T]`` (``TaskTowers``).
      kind: the multi-task head's name, ``ranking.config.MULTITASK_KINDS``; ``esmm`` turns
        column 1 into the pCTCVR logit.
      dense_blocks: layers ``raw features -> [batch, k]`` appended to the dense matrix.
    """

    def __init__(
        self,
        preprocessor: tf.keras.layers.Layer,
        tasks: Sequence[TaskConfig | Mapping[str, Any]],
        embedding: tf.keras.layers.Layer,
        interaction: tf.keras.layers.Layer,
        head: tf.keras.layers.Layer,
        towers: tf.keras.layers.Layer,
        kind: str = "shared_bottom",
        dense_blocks: list[tf.keras.layers.Layer] | None = None,
        sequences: tf.keras.layers.Layer | None = None,
        sequence_tables: tf.keras.layers.Layer | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if kind not in MULTITASK_KINDS:
            raise ValueError(f"kind {kind!r} is not one of {list(MULTITASK_KINDS)}")
        configs = tasks_of(list(tasks))
        if not configs:
            raise ValueError("a multi-task model needs at least one task")
        check_tasks(configs, kind)
        for block, what in ((head, "head"), (towers, "towers")):
            count = getattr(block, "num_tasks", len(configs))
            if count != len(configs):
                raise ValueError(f"{what} has {count} tasks, the model {len(configs)}")
        self._task_configs = [dataclasses.asdict(t) for t in configs]
        names = [t.name for t in configs]
        self._parents = [
            None if t.defined_on is None else names.index(t.defined_on) for t in configs
        ]
        self._task_weights = [t.weight for t in configs]
        self._task_labels = [t.label for t in configs]
        self._task_names = names
        self.kind = kind
        self.label = configs[0].label
        self.preprocessor = preprocessor
        self.embedding = embedding
        self.interaction = interaction
        self.head = head
        self.towers = towers
        self.dense_blocks = list(dense_blocks or [])
        self.sequences = sequences
        self.sequence_tables = sequence_tables
        self.task = ranking_task()  # metrics of the primary task

    @property
    def task_names(self) -> list[str]:
        return list(self._task_names)

    @property
    def tasks(self) -> tuple[TaskConfig, ...]:
        return tuple(TaskConfig(**t) for t in self._task_configs)

    def labels_of(self, features: Mapping[str, tf.Tensor]) -> tf.Tensor:
        """The tasks' labels ``[batch, T]`` (float32), columns in task order."""
        return tf.stack([tf.cast(features[n], tf.float32) for n in self._task_labels], axis=1)

    def tower_logits(
        self, features: Mapping[str, tf.Tensor], training: bool | None = None
    ) -> tf.Tensor:
        """The towers' logits ``[batch, T]``: each task's logit given its parent's label is 1
        (for ESMM column 1 is the pCVR logit)."""
        ids, dense = self.preprocessor(features)
        if self.dense_blocks:
            extra = [block(features) for block in self.dense_blocks]
            dense = tf.concat(([dense] if dense is not None else []) + extra, axis=1)
        embedded = embed_with_history(
            self.embedding, ids, self.sequences, self.sequence_tables, training
        )
        z = self.interaction(embedded, dense)
        return self.towers(self.head(z, training=training), training=training)

    def call(self, features: dict[str, tf.Tensor], training: bool | None = None) -> tf.Tensor:
        """Raw features ``{field: [batch]}`` -> logits ``[batch, T]``."""
        logits = self.tower_logits(features, training=training)
        if self.kind != "esmm":
            return logits
        ctr, cvr = logits[:, 0], logits[:, 1]
        return tf.stack([ctr, ctcvr_logit(ctr, cvr)], axis=1)

    #: the blocks ``with_blocks`` replaces
    BLOCKS = (
        "preprocessor",
        "embedding",
        "interaction",
        "head",
        "towers",
        "sequences",
        "sequence_tables",
    )

    def with_blocks(self, **blocks: tf.keras.layers.Layer | None) -> MultiTaskModel:
        """A new ``MultiTaskModel`` with the blocks named in ``blocks`` (of ``BLOCKS``)
        replaced, every other block this model's own object (shared variables)."""
        unknown = sorted(set(blocks) - set(self.BLOCKS))
        if unknown:
            raise ValueError(f"blocks must be some of {list(self.BLOCKS)}, got {unknown}")
        parts = {name: getattr(self, name) for name in self.BLOCKS} | blocks
        model = MultiTaskModel(
            tasks=self.tasks,
            kind=self.kind,
            dense_blocks=self.dense_blocks,
            name=self.name,
            **parts,
        )
        model.built = self.built
        return model

    def serving_logits(
        self, features: Mapping[str, tf.Tensor]
    ) -> tuple[tf.Tensor, dict[int, tf.Tensor]]:
        """(``[batch, T]`` logits of each task's label over every row, ``{t: [batch]}``
        logits of each ``defined_on`` task given its parent's label is 1), in inference mode.

        A task with a parent has P(label) = P(parent) * P(label | parent): its first logit is
        ``ctcvr_logit`` of the parent's and its tower's (ESMM's pCTCVR), its second the tower's
        (pCVR; under the other heads the tower trained on the parent-positive rows)."""
        towers = self.tower_logits(features, training=False)
        joint: list[tf.Tensor] = []
        conditional = {}
        for t, parent in enumerate(self._parents):
            if parent is None:
                joint.append(towers[:, t])
            else:
                joint.append(ctcvr_logit(joint[parent], towers[:, t]))
                conditional[t] = towers[:, t]
        return tf.stack(joint, axis=1), conditional

    @property
    def parents(self) -> list[int | None]:
        """The index of each task's parent task (None: a task of every row)."""
        return list(self._parents)

    def conditional_logits(self, features: Mapping[str, tf.Tensor]) -> tf.Tensor:
        """ESMM's pCVR logits ``[batch]`` (conversion given click), in inference mode."""
        if self.kind != "esmm":
            raise ValueError(
                f"conditional_logits is ESMM's pCVR; this model's head is {self.kind!r}, whose "
                "defined_on tasks' columns are already conditional"
            )
        return self.tower_logits(features, training=False)[:, 1]

    def task_loss(self, labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
        """``sum_t weight_t * loss_t`` of logits ``[batch, T]`` against labels ``[batch, T]``:
        ``loss_t`` the mean binary cross-entropy of column ``t``, over the rows whose parent
        label is 1 for a ``defined_on`` task (but under ESMM, whose pCTCVR column counts every
        row); 0 for such a task in a batch without parent rows."""
        labels = tf.cast(labels, logits.dtype)
        bce = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
        total = tf.constant(0.0, logits.dtype)
        for t, (parent, weight) in enumerate(zip(self._parents, self._task_weights, strict=True)):
            if parent is None or self.kind == "esmm":
                loss = tf.reduce_mean(bce[:, t])
            else:
                on = tf.cast(labels[:, parent] > 0.5, bce.dtype)
                loss = tf.math.divide_no_nan(tf.reduce_sum(on * bce[:, t]), tf.reduce_sum(on))
            total = total + weight * loss
        return total

    def get_config(self) -> dict[str, Any]:
        ser = tf.keras.layers.serialize
        return {
            "name": self.name,
            "tasks": [dict(t) for t in self._task_configs],
            "kind": self.kind,
            "preprocessor": ser(self.preprocessor),
            "embedding": ser(self.embedding),
            "interaction": ser(self.interaction),
            "head": ser(self.head),
            "towers": ser(self.towers),
            "dense_blocks": [ser(b) for b in self.dense_blocks],
            "sequences": ser(self.sequences) if self.sequences is not None else None,
            "sequence_tables": (
                ser(self.sequence_tables) if self.sequence_tables is not None else None
            ),
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> MultiTaskModel:
        config = dict(config)
        for key in ("preprocessor", "embedding", "interaction", "head", "towers"):
            config[key] = tf.keras.layers.deserialize(config[key])
        for key in ("sequences", "sequence_tables"):
            if config.get(key) is not None:
                config[key] = tf.keras.layers.deserialize(config[key])
        config["dense_blocks"] = [
            tf.keras.layers.deserialize(b) for b in config.get("dense_blocks") or []
        ]
        return cls(**config)


def _logit(p: float) -> float:
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


def initial_biases(
    tasks: Sequence[TaskConfig], label_means: Mapping[str, float] | None
) -> list[float]:
    """Each tower's starting logit bias: the log-odds of its label's mean over all rows, or for
    a ``defined_on`` task of its rate given the parent (child mean / parent mean); zeros
    without ``label_means``."""
    if label_means is None:
        return [0.0] * len(tasks)
    by_name = {t.name: t for t in tasks}
    biases = []
    for t in tasks:
        p = float(label_means[t.label])
        if t.defined_on is not None:
            parent = float(label_means[by_name[t.defined_on].label])
            p = p / parent if parent > 0 else 0.0
        biases.append(_logit(p))
    return biases


def _head(config: ModelConfig, num_tasks: int) -> tf.keras.layers.Layer:
    """The ``config.multitask`` head over ``num_tasks`` tasks."""
    experts = {
        "expert_units": config.expert_mlp,
        "dropout": config.dropout,
        "expert_layer": config.expert_layer,
        "expert_options": _expert_options(config),
        "name": config.multitask,
    }
    if config.multitask == "mmoe":
        return MMoE(num_tasks, config.num_experts, **experts)
    if config.multitask == "ple":
        return PLE(
            num_tasks, config.num_experts, config.shared_experts, config.ple_levels, **experts
        )
    if config.multitask == "esmm":  # the towers read the shared interaction directly
        return SharedBottom(num_tasks, (), name="esmm")
    return SharedBottom(num_tasks, **experts)


def _expert_options(config: ModelConfig) -> dict[str, Any]:
    """The expert layer's options from the config (``moe``: routing and capacity)."""
    if config.expert_layer != "moe":
        return {}
    return {
        "num_experts": config.moe_experts,
        "top_k": config.moe_top_k,
        "prototypes": config.moe_prototypes,
        "capacity_factor": config.moe_capacity_factor,
    }


def build_multitask_model(
    config: ModelConfig,
    preprocessor: tf.keras.layers.Layer,
    *,
    field_dims: dict[str, int] | None = None,
    field_combiners: dict[str, str] | None = None,
    counts: dict[str, list[int]] | None = None,
    label_means: Mapping[str, float] | None = None,
    dense_blocks: list[tf.keras.layers.Layer] | None = None,
) -> MultiTaskModel:
    """The multi-task model of ``config.tasks`` around ``preprocessor``.

    The interaction follows ``config.type`` (``dnn``: concatenation, ``dcn_v2``: cross
    network, ``fm``: FM pairwise term), the head ``config.multitask``. ``label_means``:
    ``{label: mean over the training rows}``, the towers' starting biases
    (``initial_biases``). Other arguments as ``ranking.models.build_model``.
    """
    if not config.tasks:
        raise ValueError("build_multitask_model needs config.tasks")
    if config.type == "lr":
        raise ValueError("model type 'lr' has no multi-task form; use dnn, dcn_v2 or fm")
    if not preprocessor.embedded_fields:
        raise ValueError(f"model type {config.type!r} needs at least one embedded field")
    dense_blocks = list(dense_blocks or [])
    num_dense = len(preprocessor.dense_fields) + sum(int(b.output_dim) for b in dense_blocks)
    field_dims = {} if config.type == "fm" else dict(field_dims or {})  # FM: one dimension
    if config.type == "fm":
        interaction: tf.keras.layers.Layer = FMInteraction(
            num_dense, config.embedding_dim, name="fm"
        )
    elif config.type == "dnn":
        interaction = ConcatInteraction(name="concat")
    else:
        interaction = CrossInteraction(
            config.cross_layers, projection_dim=config.cross_rank or None, name="cross"
        )

    def dim_of(name: str) -> int:
        return field_dims.get(name, config.embedding_dim)

    tables = embedding_tables(config, preprocessor, dim_of, field_combiners or {})
    sequences, sequence_tables = sequence_blocks(
        preprocessor, config.sequence_pooling, config.sequence_options, dim_of, config.l2
    )
    tasks = config.tasks
    return MultiTaskModel(
        preprocessor=preprocessor,
        tasks=tasks,
        embedding=EmbeddingCollection(tables, counts=counts, name="embedding"),
        interaction=interaction,
        head=_head(config, len(tasks)),
        towers=TaskTowers(
            len(tasks),
            config.tower_mlp,
            dropout=config.dropout,
            initial_biases=initial_biases(tasks, label_means),
            name="towers",
        ),
        kind=config.multitask,
        dense_blocks=dense_blocks,
        sequences=sequences,
        sequence_tables=sequence_tables,
        name=f"{config.type}_{config.multitask}",
    )
