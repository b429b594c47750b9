"""The vector-product pre-ranking anchor: a two-tower model on tensorflow-recommenders.

::

    u     = user_tower(user and context fields)      # [batch, dim]
    v     = item_tower(item fields)                  # [batch, dim]
    logit = <u, v> + b                               # [batch]

Each tower is ``preprocessor -> embeddings -> concat (+ dense) -> MLP -> Dense(dim)``. The user
tower reads the schema's ``group = "user"`` and ``"context"`` fields (both known once per
request), the item tower the ``group = "item"`` fields (``tower_fields``; a model input without
a group is an error); the pipeline builds each side's preprocessor
(``pipelines.preranking.build_run_two_tower``). Item vectors depend on item fields only, so they can be computed ahead of requests
(``item_vectors``) and a request costs one user-tower pass plus one dot product per candidate
(``score_candidates``). Trained pointwise on the same click labels as the ranking model, with
the ``tfrs.tasks.Ranking`` binary cross-entropy task. (COLD and FSCD use this model as the
pre-ranking baseline.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from embeddings.collection import EmbeddingCollection
from embeddings.forms import Embedded
from ranking.blocks import MLP, ConcatInteraction
from ranking.click_model import ClickModel, ranking_task
from ranking.config import ModelConfig, PrerankConfig
from ranking.tables import embedding_tables

REQUEST_GROUPS = ("user", "context")


def tower_fields(groups: Mapping[str, str | None]) -> tuple[list[str], list[str]]:
    """(request-side fields: user and context groups, item fields), in the given order.

    Args:
      groups: ``{model input: its schema group}`` (``pipelines.preranking.field_groups``).

    Raises:
      ValueError: a model input has no group, or a side is empty.
    """
    loose = [n for n, g in groups.items() if g is None]
    if loose:
        raise ValueError(
            f"model inputs {loose} have no `group`; a two-tower model and a ranking request "
            f"need group = 'user', 'item' or 'context' on every input"
        )
    request = [n for n, g in groups.items() if g in REQUEST_GROUPS]
    items = [n for n, g in groups.items() if g == "item"]
    if not request or not items:
        raise ValueError(
            f"a two-tower model needs user/context fields and item fields; got request fields "
            f"{request} and item fields {items}"
        )
    return request, items


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class Tower(tf.keras.layers.Layer):
    """Raw features of one side -> ``[batch, dim]`` vectors.

    Args:
      preprocessor: raw features -> (ids, dense) for this side's fields.
      embedding: ids -> field vectors.
      mlp: hidden layers applied to the concatenation.
      dim: output dimension.
    """

    def __init__(
        self,
        preprocessor: tf.keras.layers.Layer,
        embedding: tf.keras.layers.Layer | None,
        mlp: Sequence[int],
        dim: int,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        self.preprocessor = preprocessor
        self.embedding = embedding
        self.mlp_units = [int(u) for u in mlp]
        self.dim = int(dim)
        self.concat = ConcatInteraction(name="concat")
        self.mlp = MLP(self.mlp_units, name="mlp") if self.mlp_units else None
        self.out = tf.keras.layers.Dense(self.dim, name="out")

    @property
    def input_names(self) -> list[str]:
        return self.preprocessor.input_names

    def call(self, features: dict[str, tf.Tensor], training: bool | None = None) -> tf.Tensor:
        ids, dense = self.preprocessor(features)
        embedded = self.embedding(ids) if self.embedding is not None else Embedded(vectors={})
        x = self.concat(embedded, dense)
        if self.mlp is not None:
            x = self.mlp(x, training=training)
        return self.out(x)

    def get_config(self) -> dict[str, Any]:
        ser = tf.keras.layers.serialize
        return {
            **super().get_config(),
            "preprocessor": ser(self.preprocessor),
            "embedding": ser(self.embedding) if self.embedding is not None else None,
            "mlp": self.mlp_units,
            "dim": self.dim,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Tower:
        config = dict(config)
        config["preprocessor"] = tf.keras.layers.deserialize(config["preprocessor"])
        if config.get("embedding") is not None:
            config["embedding"] = tf.keras.layers.deserialize(config["embedding"])
        return cls(**config)


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class TwoTowerModel(ClickModel):
    """``logit = <user_tower(x_user), item_tower(x_item)> + b`` (see the module docstring)."""

    def __init__(
        self,
        user_tower: tf.keras.layers.Layer,
        item_tower: tf.keras.layers.Layer,
        label: str,
        initial_bias: float = 0.0,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if user_tower.dim != item_tower.dim:
            raise ValueError(f"tower dimensions differ: {user_tower.dim} vs {item_tower.dim}")
        self.user_tower = user_tower
        self.item_tower = item_tower
        self.label = label
        self.initial_bias = float(initial_bias)
        self.bias = self.add_weight(
            name="bias", shape=(), initializer=tf.keras.initializers.Constant(self.initial_bias)
        )
        self.task = ranking_task()

    def user_vectors(self, features: dict[str, tf.Tensor]) -> tf.Tensor:
        """``[batch, dim]`` from the request-side fields."""
        return self.user_tower({k: features[k] for k in self.user_tower.input_names})

    def item_vectors(self, features: dict[str, tf.Tensor]) -> tf.Tensor:
        """``[batch, dim]`` from the item fields (precomputable per item)."""
        return self.item_tower({k: features[k] for k in self.item_tower.input_names})

    def score_candidates(self, user_vector: tf.Tensor, item_vectors: tf.Tensor) -> tf.Tensor:
        """Logits ``[N]`` of one user ``[1, dim]`` against ``N`` item vectors ``[N, dim]``."""
        return tf.linalg.matvec(item_vectors, user_vector[0]) + self.bias

    def call(self, features: dict[str, tf.Tensor], training: bool | None = None) -> tf.Tensor:
        """Raw features ``{field: [batch]}`` -> logits ``[batch]``."""
        u = self.user_tower(
            {k: features[k] for k in self.user_tower.input_names}, training=training
        )
        v = self.item_tower(
            {k: features[k] for k in self.item_tower.input_names}, training=training
        )
        return tf.reduce_sum(u * v, axis=1) + self.bias

    def get_config(self) -> dict[str, Any]:
        ser = tf.keras.layers.serialize
        return {
            "name": self.name,
            "label": self.label,
            "initial_bias": self.initial_bias,
            "user_tower": ser(self.user_tower),
            "item_tower": ser(self.item_tower),
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> TwoTowerModel:
        config = dict(config)
        for key in ("user_tower", "item_tower"):
            config[key] = tf.keras.layers.deserialize(config[key])
        return cls(**config)


def _tower(
    preprocessor: tf.keras.layers.Layer,
    model: ModelConfig,
    prerank: PrerankConfig,
    field_dims: Mapping[str, int],
    combiners: Mapping[str, str],
    side: str,
) -> Tower:
    full = ModelConfig(type="dnn", embedding_dim=model.embedding_dim, l2=model.l2)
    dims = {n: field_dims.get(n, model.embedding_dim) for n in preprocessor.embedded_fields}
    tables = embedding_tables(full, preprocessor, lambda n: dims[n], dict(combiners))
    embedding = EmbeddingCollection(tables, name=f"{side}_embedding") if tables else None
    return Tower(
        preprocessor, embedding, prerank.tower_mlp, prerank.tower_dim, name=f"{side}_tower"
    )


def build_two_tower(
    user_preprocessor: tf.keras.layers.Layer,
    item_preprocessor: tf.keras.layers.Layer,
    label: str,
    model: ModelConfig,
    prerank: PrerankConfig,
    *,
    field_dims: Mapping[str, int] | None = None,
    field_combiners: Mapping[str, str] | None = None,
    initial_bias: float = 0.0,
) -> TwoTowerModel:
    """A two-tower model around a request-side and an item-side ``FeaturePreprocessor`` (full
    embedding tables of ``model``'s ``embedding_dim`` unless ``field_dims`` overrides, ``model``'s
    ``l2``; ``prerank.tower_mlp`` and ``tower_dim``)."""
    dims, combiners = dict(field_dims or {}), dict(field_combiners or {})
    return TwoTowerModel(
        _tower(user_preprocessor, model, prerank, dims, combiners, "user"),
        _tower(item_preprocessor, model, prerank, dims, combiners, "item"),
        label=label,
        initial_bias=initial_bias,
        name="two_tower",
    )
