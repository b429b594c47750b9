"""Ranking models composed from blocks passed in, with a tensorflow-recommenders Ranking task.

``RankingModel`` computes the click logit of a batch of raw features::

    ids, dense = preprocessor(features)                 # raw -> ids / dense matrix
    e          = embedding(ids)                         # Embedded: {field: [batch, d]}
    z          = interaction(e, dense)                  # [batch, k]
    logit      = head(tower(z)) + wide(ids, dense)      # [batch]

Any of ``embedding``/``interaction``/``tower``/``wide`` may be absent (logistic regression is
``wide`` alone). The task (``tfrs.tasks.Ranking`` with binary cross-entropy on logits, AUC and
log loss metrics) owns the loss; the model only computes outputs. ``with_blocks`` gives a new
model with some blocks replaced and everything else (variables included) shared. ``build_model`` assembles the
standard models from a ``ModelConfig``:

* ``lr``: wide term (one weight per id, one per numeric feature) + bias; ``l2_wide`` /
  ``l1_wide`` penalize the wide term's weights (also those of ``fm``).
* ``fm``: wide term + FM pairwise term.
* ``dnn``: embeddings -> concat -> MLP -> logit.
* ``dcn_v2``: embeddings -> concat -> cross network -> MLP -> logit (DCN-v2 "stacked").
* ``dnn`` / ``dcn_v2`` with ``wide = true``: the same, plus ``lr``'s wide term (Wide & Deep).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
import tensorflow_recommenders as tfrs

from embeddings.collection import EmbeddingCollection
from ranking.blocks import MLP, ConcatInteraction, CrossInteraction, FMInteraction, LinearTerm
from ranking.click_model import ClickModel, ranking_task
from ranking.config import MODEL_TYPES, ModelConfig
from ranking.moe import MoELayer
from ranking.multitask import build_multitask_model
from ranking.sequence_features import embed_with_history, sequence_blocks
from ranking.tables import embedding_tables, planned_method

__all__ = [
    "MODEL_TYPES",
    "ClickModel",
    "ModelConfig",
    "RankingModel",
    "build_model",
    "embedding_tables",
    "planned_method",
    "ranking_task",
]


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class RankingModel(ClickModel):
    """Click-logit model from blocks (see the module docstring).

    Args:
      preprocessor: raw features -> (ids dict, dense matrix or None).
      label: name of the label feature (read by ``compute_loss``).
      embedding: ids dict -> vectors dict (e.g. ``EmbeddingCollection``).
      interaction: (list of vectors, dense) -> ``[batch, k]``.
      tower: ``[batch, k] -> [batch, h]`` (e.g. ``MLP``).
      wide: (ids, dense) -> ``[batch]`` linear term.
      initial_bias: starting value of the logit bias (log-odds of the base rate).
      dense_blocks: layers ``raw features -> [batch, k]`` floats (e.g. ``ranking.pair_stats``)
        whose outputs are appended to the preprocessor's dense matrix, inside the model.
      residual: a model ``raw features -> logits [batch]`` added to the logit, trained jointly
        (a ``TwoTowerModel``: ``[preranking] tower_residual``, where a pre-ranking model over a
        few item fields keeps every field's main effects through the towers).
      head, bias, task: the logit layer, the bias variable and the tfrs task to hold instead of
        new ones (``with_blocks`` shares them with the model it starts from).
    """

    #: the blocks ``with_blocks`` replaces
    BLOCKS = (
        "preprocessor",
        "embedding",
        "interaction",
        "tower",
        "wide",
        "sequences",
        "sequence_tables",
    )

    def __init__(
        self,
        preprocessor: tf.keras.layers.Layer,
        label: str,
        embedding: tf.keras.layers.Layer | None = None,
        interaction: tf.keras.layers.Layer | None = None,
        tower: tf.keras.layers.Layer | None = None,
        wide: tf.keras.layers.Layer | None = None,
        initial_bias: float = 0.0,
        dense_blocks: list[tf.keras.layers.Layer] | None = None,
        residual: tf.keras.Model | None = None,
        sequences: tf.keras.layers.Layer | None = None,
        sequence_tables: tf.keras.layers.Layer | None = None,
        *,
        head: tf.keras.layers.Layer | None = None,
        bias: tf.Variable | None = None,
        task: tfrs.tasks.Ranking | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.dense_blocks = list(dense_blocks or [])
        self.residual = residual
        if interaction is not None and embedding is None:
            raise ValueError("an interaction needs an embedding block")
        if sequences is not None and interaction is None:
            raise ValueError("sequences need an interaction to read the pooled histories")
        self.sequences = sequences
        self.sequence_tables = sequence_tables
        if interaction is None and wide is None:
            raise ValueError("a model needs an interaction or a wide term (or both)")
        self.preprocessor = preprocessor
        self.label = label
        self.embedding = embedding
        self.interaction = interaction
        self.tower = tower
        self.wide = wide
        self.initial_bias = float(initial_bias)
        if head is None and interaction is not None:
            head = tf.keras.layers.Dense(1, use_bias=False, name="head")
        self.head = head
        self.bias = (
            bias
            if bias is not None
            else self.add_weight(
                name="bias",
                shape=(),
                initializer=tf.keras.initializers.Constant(self.initial_bias),
            )
        )
        self.task = task if task is not None else ranking_task()

    def with_blocks(self, **blocks: tf.keras.layers.Layer | None) -> RankingModel:
        """A new ``RankingModel`` with the blocks named in ``blocks`` (of ``BLOCKS``) replaced;
        every other block, the dense blocks, the residual, the head, the bias and the task are
        this model's own objects, so the two share their variables (a checkpoint of one
        restores into the other) and this model is left as it is."""
        unknown = sorted(set(blocks) - set(self.BLOCKS))
        if unknown:
            raise ValueError(f"blocks must be some of {list(self.BLOCKS)}, got {unknown}")
        if type(self) is not RankingModel:
            raise ValueError(f"with_blocks rebuilds a RankingModel, not a {type(self).__name__}")
        parts = {name: getattr(self, name) for name in self.BLOCKS} | blocks
        model = RankingModel(
            label=self.label,
            initial_bias=self.initial_bias,
            dense_blocks=self.dense_blocks,
            residual=self.residual,
            head=self.head,
            bias=self.bias,
            task=self.task,
            name=self.name,
            **parts,
        )
        model.built = self.built  # its variables exist when this model's do
        return model

    def call(self, features: dict[str, tf.Tensor], training: bool | None = None) -> tf.Tensor:
        """Raw features ``{field: [batch]}`` -> logits ``[batch]``."""
        ids, dense = self.preprocessed(features)
        logit = self.logits_from(ids, dense, training)
        if self.residual is not None:
            logit = logit + self.residual(features, training=training)
        return logit

    def preprocessed(self, features: dict[str, tf.Tensor]) -> tuple[dict[str, tf.Tensor], Any]:
        """Raw features -> ``(ids, dense)``: the preprocessor's outputs, the dense blocks'
        outputs appended to the dense matrix (``logits_from``'s inputs)."""
        ids, dense = self.preprocessor(features)
        if self.dense_blocks:
            extra = [block(features) for block in self.dense_blocks]
            dense = tf.concat(([dense] if dense is not None else []) + extra, axis=1)
        return ids, dense

    def logits_from(
        self, ids: dict[str, tf.Tensor], dense: tf.Tensor | None, training: bool | None = None
    ) -> tf.Tensor:
        """Preprocessed ``ids`` / ``dense`` (``preprocessor``'s outputs, dense blocks
        appended) -> logits ``[batch]``: bias + head(tower(interaction(embeddings))) + wide."""
        logit = self.bias
        if self.interaction is not None:
            embedded = embed_with_history(
                self.embedding, ids, self.sequences, self.sequence_tables, training
            )
            z = self.interaction(embedded, dense)
            if self.tower is not None:
                z = self.tower(z, training=training)
            logit = logit + self.head(z)[:, 0]
        if self.wide is not None:
            logit = logit + self.wide(ids, dense)
        return logit

    def get_config(self) -> dict[str, Any]:
        ser = tf.keras.layers.serialize
        return {
            "name": self.name,
            "label": self.label,
            "initial_bias": self.initial_bias,
            "preprocessor": ser(self.preprocessor),
            "embedding": ser(self.embedding) if self.embedding is not None else None,
            "interaction": ser(self.interaction) if self.interaction is not None else None,
            "tower": ser(self.tower) if self.tower is not None else None,
            "wide": ser(self.wide) if self.wide is not None else None,
            "dense_blocks": [ser(b) for b in self.dense_blocks],
            "residual": ser(self.residual) if self.residual is not None else None,
            "sequences": ser(self.sequences) if self.sequences is not None else None,
            "sequence_tables": (
                ser(self.sequence_tables) if self.sequence_tables is not None else None
            ),
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> RankingModel:
        config = dict(config)
        keys = ("preprocessor", "embedding", "interaction", "tower", "wide", "residual")
        for key in (*keys, "sequences", "sequence_tables"):
            if config.get(key) is not None:
                config[key] = tf.keras.layers.deserialize(config[key])
        config["dense_blocks"] = [
            tf.keras.layers.deserialize(b) for b in config.get("dense_blocks") or []
        ]
        return cls(**config)


def _tower(config: ModelConfig) -> tf.keras.layers.Layer:
    """The MLP tower of ``mlp``, or with ``expert_layer = "moe"`` a mixture-of-experts layer
    of ``moe_experts`` experts of ``mlp`` units (``ranking.moe``)."""
    if config.expert_layer != "moe":
        return MLP(list(config.mlp), dropout=config.dropout, name="tower")
    return MoELayer(
        num_experts=config.moe_experts,
        units=tuple(config.mlp),
        top_k=config.moe_top_k,
        prototypes=config.moe_prototypes,
        capacity_factor=config.moe_capacity_factor,
        name="tower",
    )


def build_model(
    config: ModelConfig,
    preprocessor: tf.keras.layers.Layer,
    label: str,
    *,
    field_dims: dict[str, int] | None = None,
    field_combiners: dict[str, str] | None = None,
    counts: dict[str, list[int]] | None = None,
    initial_bias: float = 0.0,
    dense_blocks: list[tf.keras.layers.Layer] | None = None,
    label_means: dict[str, float] | None = None,
) -> ClickModel:
    """Builds ``config.type`` around ``preprocessor`` (a ``FeaturePreprocessor``); with
    ``config.tasks`` the multi-task model of ``ranking.multitask.build_multitask_model``
    (``label`` then unused: the tasks name their labels).

    Args:
      field_dims: per-field embedding dimensions overriding ``config.embedding_dim``.
      field_combiners: pooling per multi-valued field (``mean``/``sum``).
      counts: training count per id of each looked-up field (AMTL's frequency features).
      initial_bias: starting logit bias, e.g. log(p / (1 - p)) of the training click rate.
      dense_blocks: extra dense inputs computed from raw features (``RankingModel``); each has
        ``output_dim`` columns, fed wherever the numeric features go.
      label_means: ``{label: training mean}`` of every task's label, the multi-task towers'
        starting biases (``initial_bias`` is the single-task model's).
    """
    dense_blocks = list(dense_blocks or [])
    field_dims = field_dims or {}
    combiners = field_combiners or {}
    unknown = sorted(set(config.embedding_methods) - set(preprocessor.categorical_fields))
    if unknown:
        raise ValueError(
            f"embedding_methods names fields {unknown} that are not categorical embedded fields; "
            f"those are: {preprocessor.categorical_fields}"
        )
    if config.tasks:
        return build_multitask_model(
            config,
            preprocessor,
            field_dims=field_dims,
            field_combiners=combiners,
            counts=counts,
            label_means=label_means,
            dense_blocks=dense_blocks,
        )
    return _single_task_model(
        config,
        preprocessor,
        label,
        field_dims=field_dims,
        combiners=combiners,
        counts=counts,
        initial_bias=initial_bias,
        dense_blocks=dense_blocks,
    )


def _wide_term(
    config: ModelConfig, preprocessor: tf.keras.layers.Layer, num_dense: int
) -> LinearTerm:
    """The linear term over every embedded field (one weight a value, multi-valued fields
    summed) and the ``num_dense`` dense inputs: ``lr`` itself, or the ``wide`` part of the
    others."""
    sum_all = {name: "sum" for name in preprocessor.embedded_fields}
    wide_tables = embedding_tables(config, preprocessor, lambda _: 1, sum_all, wide=True)
    return LinearTerm(
        EmbeddingCollection(wide_tables, name="wide_weights") if wide_tables else None,
        num_dense,
        l2=config.l2_wide,
        l1=config.l1_wide,
        name="wide",
    )


def _single_task_model(
    config: ModelConfig,
    preprocessor: tf.keras.layers.Layer,
    label: str,
    *,
    field_dims: dict[str, int],
    combiners: dict[str, str],
    counts: dict[str, list[int]] | None,
    initial_bias: float,
    dense_blocks: list[tf.keras.layers.Layer],
) -> RankingModel:
    """``build_model`` of a config without tasks: ``lr``, ``fm``, ``dnn`` or ``dcn_v2``."""
    rows = preprocessor.embedded_fields
    num_dense = len(preprocessor.dense_fields) + sum(int(b.output_dim) for b in dense_blocks)
    wide = _wide_term(config, preprocessor, num_dense)
    common = {
        "preprocessor": preprocessor,
        "label": label,
        "initial_bias": initial_bias,
        "dense_blocks": dense_blocks,
    }
    if config.type == "lr":
        return RankingModel(**common, wide=wide, name="lr")
    if not rows:
        raise ValueError(f"model type {config.type!r} needs at least one embedded field")
    if config.type == "fm":
        tables = embedding_tables(config, preprocessor, lambda _: config.embedding_dim, combiners)
        sequences, sequence_tables = sequence_blocks(
            preprocessor,
            config.sequence_pooling,
            config.sequence_options,
            lambda _: config.embedding_dim,
            config.l2,
        )
        return RankingModel(
            **common,
            embedding=EmbeddingCollection(tables, counts=counts, name="embedding"),
            interaction=FMInteraction(num_dense, config.embedding_dim, name="fm"),
            wide=wide,
            sequences=sequences,
            sequence_tables=sequence_tables,
            name="fm",
        )

    def dim_of(name: str) -> int:
        return field_dims.get(name, config.embedding_dim)

    tables = embedding_tables(config, preprocessor, dim_of, combiners)
    sequences, sequence_tables = sequence_blocks(
        preprocessor, config.sequence_pooling, config.sequence_options, dim_of, config.l2
    )
    tower = _tower(config)
    if config.type == "dnn":
        interaction: tf.keras.layers.Layer = ConcatInteraction(name="concat")
    else:
        interaction = CrossInteraction(
            config.cross_layers, projection_dim=config.cross_rank or None, name="cross"
        )
    return RankingModel(
        **common,
        embedding=EmbeddingCollection(tables, counts=counts, name="embedding"),
        interaction=interaction,
        tower=tower,
        wide=wide if config.wide else None,
        sequences=sequences,
        sequence_tables=sequence_tables,
        name=config.type,
    )
