"""Multi-task heads: one shared input ``z`` ``[batch, k]`` -> one input per task, and the towers.

Every head maps ``z`` (the interaction's output) to per-task representations
``[batch, T, h]``, row ``t`` the input of task ``t``'s tower; ``TaskTowers`` turns them into
logits ``[batch, T]``.

* ``SharedBottom``: one shared network ``f``, every task reads ``f(z)`` (Caruana, 1997); with
  no units, ``z`` itself (ESMM's shared embedding).
* ``MMoE``: ``E`` experts ``f_i`` and one softmax gate per task,
  ``h^t = sum_i g^t(z)_i f_i(z)``, ``g^t(z) = softmax(W_t z)`` (Ma et al., "Modeling Task
  Relationships in Multi-task Learning with Multi-gate Mixture-of-Experts", KDD 2018).
* ``PLE``: Progressive Layered Extraction (Tang et al., RecSys 2020). Each extraction layer
  (Customized Gate Control) has ``m`` experts per task and ``s`` shared experts; task ``t``'s
  gate mixes its own and the shared experts, ``h^t = sum_j g^t(x^t)_j [E_t(x^t); E_s(x^s)]_j``;
  in a layer before the last a shared gate over every expert gives the next layer's shared
  input ``x^s``. The first layer reads ``x^t = x^s = z``.

An expert is made by ``expert_factory(kind)``: ``mlp`` is ``ranking.blocks.MLP``; another layer
``[batch, k] -> [batch, units[-1]]`` joins with ``register_expert_layer``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from ranking.blocks import MLP
from ranking.moe import MoELayer

#: ``factory(units, dropout=..., name=..., **options) -> layer [batch, k] -> [batch, units[-1]]``
ExpertFactory = Callable[..., tf.keras.layers.Layer]


def _mlp_expert(
    units: Sequence[int], dropout: float = 0.0, name: str | None = None, **options: Any
) -> tf.keras.layers.Layer:
    if options:
        raise ValueError(f"expert_layer 'mlp' takes no options, got {sorted(options)}")
    return MLP(list(units), dropout=dropout, name=name)


def _moe_expert(
    units: Sequence[int], dropout: float = 0.0, name: str | None = None, **options: Any
) -> tf.keras.layers.Layer:
    """A sparse mixture-of-experts layer (``ranking.moe``) of ``units`` per expert; its routing
    options (``num_experts``, ``top_k``, ``prototypes``, ``capacity_factor``) come from the
    config. Its experts apply no dropout."""
    return MoELayer(units=tuple(units), name=name, **options)


#: expert layers by ``expert_layer`` name
EXPERT_FACTORIES: dict[str, ExpertFactory] = {"mlp": _mlp_expert, "moe": _moe_expert}


def register_expert_layer(kind: str, factory: ExpertFactory) -> None:
    """Makes ``expert_layer = kind`` build its experts with ``factory``."""
    EXPERT_FACTORIES[kind] = factory


def expert_factory(kind: str) -> ExpertFactory:
    """The factory of expert layer ``kind`` (ValueError naming the known kinds otherwise)."""
    if kind not in EXPERT_FACTORIES:
        raise ValueError(
            f"expert_layer {kind!r} has no layer; known expert layers: {sorted(EXPERT_FACTORIES)}"
        )
    return EXPERT_FACTORIES[kind]


def _positive(name: str, value: int, lo: int = 1) -> int:
    if isinstance(value, bool) or int(value) != value or value < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")
    return int(value)


def _units(units: Sequence[int], allow_empty: bool = False) -> list[int]:
    units = [int(u) for u in units]
    if (not units and not allow_empty) or any(u < 1 for u in units):
        raise ValueError(f"units must be a list of positive sizes, got {units}")
    return units


def _mix(gate: tf.Tensor, experts: tf.Tensor) -> tf.Tensor:
    """``sum_j gate[:, j] * experts[:, j]``: gate ``[batch, n]``, experts ``[batch, n, h]``."""
    return tf.einsum("bn,bnh->bh", gate, experts)


class _ExpertHead(tf.keras.layers.Layer):
    """What the expert heads share: the expert kind, its sizes and options, and validation."""

    def __init__(
        self,
        num_tasks: int,
        expert_units: Sequence[int],
        dropout: float = 0.0,
        expert_layer: str = "mlp",
        expert_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.num_tasks = _positive("num_tasks", num_tasks)
        self.expert_units = _units(expert_units)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.dropout = float(dropout)
        self.expert_layer = expert_layer
        self.expert_options = dict(expert_options or {})
        self._factory = expert_factory(expert_layer)

    def _expert(self, name: str) -> tf.keras.layers.Layer:
        return self._factory(
            self.expert_units, dropout=self.dropout, name=name, **self.expert_options
        )

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "num_tasks": self.num_tasks,
            "expert_units": self.expert_units,
            "dropout": self.dropout,
            "expert_layer": self.expert_layer,
            "expert_options": self.expert_options,
        }


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class SharedBottom(_ExpertHead):
    """One shared network for every task: ``[batch, k] -> [batch, T, units[-1]]`` (each task
    row the same ``f(z)``); ``expert_units`` empty: ``[batch, T, k]``, ``z`` itself."""

    def __init__(self, num_tasks: int, expert_units: Sequence[int] = (), **kwargs: Any):
        units = _units(expert_units, allow_empty=True)
        super().__init__(num_tasks, units or [1], **kwargs)
        self.expert_units = units
        self._bottom = self._expert("bottom") if units else None

    def call(self, z: tf.Tensor, training: bool | None = None) -> tf.Tensor:
        h = self._bottom(z, training=training) if self._bottom is not None else z
        return tf.repeat(h[:, None, :], self.num_tasks, axis=1)


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class MMoE(_ExpertHead):
    """Multi-gate mixture of experts: ``[batch, k] -> [batch, T, expert_units[-1]]``.

    Args:
      num_tasks: T, one softmax gate ``Dense(num_experts)`` each.
      num_experts: E experts, each ``expert_layer`` of ``expert_units``.
    """

    def __init__(
        self, num_tasks: int, num_experts: int, expert_units: Sequence[int], **kwargs: Any
    ):
        super().__init__(num_tasks, expert_units, **kwargs)
        self.num_experts = _positive("num_experts", num_experts)
        self._experts = [self._expert(f"expert_{i}") for i in range(self.num_experts)]
        self._gates = [
            tf.keras.layers.Dense(self.num_experts, name=f"gate_{t}") for t in range(self.num_tasks)
        ]

    def gate_weights(self, z: tf.Tensor) -> tf.Tensor:
        """Each task's softmax weights over the experts: ``[batch, T, E]``, rows summing to 1."""
        return tf.stack([tf.nn.softmax(gate(z), axis=-1) for gate in self._gates], axis=1)

    def call(self, z: tf.Tensor, training: bool | None = None) -> tf.Tensor:
        experts = tf.stack([e(z, training=training) for e in self._experts], axis=1)
        return tf.einsum("bte,beh->bth", self.gate_weights(z), experts)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "num_experts": self.num_experts}


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class PLE(_ExpertHead):
    """Progressive Layered Extraction: ``[batch, k] -> [batch, T, expert_units[-1]]``.

    Args:
      task_experts: m, experts of each task in every extraction layer.
      shared_experts: s, shared experts in every extraction layer (0: none).
      levels: extraction layers; every layer but the last has a shared gate over all
        ``T * m + s`` experts.
    """

    def __init__(
        self,
        num_tasks: int,
        task_experts: int,
        shared_experts: int,
        levels: int,
        expert_units: Sequence[int],
        **kwargs: Any,
    ):
        super().__init__(num_tasks, expert_units, **kwargs)
        self.task_experts = _positive("task_experts", task_experts)
        self.shared_experts = _positive("shared_experts", shared_experts, lo=0)
        self.levels = _positive("levels", levels)
        m, s, t_count = self.task_experts, self.shared_experts, self.num_tasks
        # flat lists, level-major: task experts [level][task][j], shared [level][j]
        self._task_experts = [
            self._expert(f"l{lv}_task{t}_e{j}")
            for lv in range(self.levels)
            for t in range(t_count)
            for j in range(m)
        ]
        self._shared = [
            self._expert(f"l{lv}_shared_e{j}") for lv in range(self.levels) for j in range(s)
        ]
        self._task_gates = [
            tf.keras.layers.Dense(m + s, name=f"l{lv}_gate_task{t}")
            for lv in range(self.levels)
            for t in range(t_count)
        ]
        self._shared_gates = [
            tf.keras.layers.Dense(t_count * m + s, name=f"l{lv}_gate_shared")
            for lv in range(self.levels - 1)
            if s
        ]

    def _level(
        self, lv: int, xs: list[tf.Tensor], x_shared: tf.Tensor, training: bool | None
    ) -> tuple[list[tf.Tensor], tf.Tensor]:
        m, s, t_count = self.task_experts, self.shared_experts, self.num_tasks
        own = []
        for t in range(t_count):
            first = (lv * t_count + t) * m
            layers = self._task_experts[first : first + m]
            own.append(tf.stack([e(xs[t], training=training) for e in layers], axis=1))
        shared = [e(x_shared, training=training) for e in self._shared[lv * s : (lv + 1) * s]]
        outputs = []
        for t in range(t_count):
            experts = tf.concat([own[t], *([tf.stack(shared, axis=1)] if s else [])], axis=1)
            gate = tf.nn.softmax(self._task_gates[lv * t_count + t](xs[t]), axis=-1)
            outputs.append(_mix(gate, experts))
        if s and lv < self.levels - 1:
            everything = tf.concat([*own, tf.stack(shared, axis=1)], axis=1)
            gate = tf.nn.softmax(self._shared_gates[lv](x_shared), axis=-1)
            x_shared = _mix(gate, everything)
        return outputs, x_shared

    def call(self, z: tf.Tensor, training: bool | None = None) -> tf.Tensor:
        xs, x_shared = [z] * self.num_tasks, z
        for lv in range(self.levels):
            xs, x_shared = self._level(lv, xs, x_shared, training)
        return tf.stack(xs, axis=1)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "task_experts": self.task_experts,
            "shared_experts": self.shared_experts,
            "levels": self.levels,
        }


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class TaskTowers(tf.keras.layers.Layer):
    """One tower per task: ``[batch, T, h] -> logits [batch, T]``, column ``t`` =
    ``Dense(1)(MLP_t(x[:, t]))`` (no MLP when ``units`` is empty).

    Args:
      num_tasks: T.
      units: hidden sizes of each tower's MLP.
      initial_biases: starting logit bias of each task (e.g. the log-odds of its label rate).
    """

    def __init__(
        self,
        num_tasks: int,
        units: Sequence[int] = (),
        dropout: float = 0.0,
        initial_biases: Sequence[float] | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.num_tasks = _positive("num_tasks", num_tasks)
        self.units = _units(units, allow_empty=True)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.dropout = float(dropout)
        biases = [0.0] * self.num_tasks if initial_biases is None else list(initial_biases)
        if len(biases) != self.num_tasks:
            raise ValueError(f"initial_biases: expected {self.num_tasks} values, got {biases}")
        self.initial_biases = [float(b) for b in biases]
        self._towers = [
            MLP(self.units, dropout=self.dropout, name=f"tower_{t}") if self.units else None
            for t in range(self.num_tasks)
        ]
        self._logits = [
            tf.keras.layers.Dense(
                1, bias_initializer=tf.keras.initializers.Constant(b), name=f"logit_{t}"
            )
            for t, b in enumerate(self.initial_biases)
        ]

    def with_gradient(self, gradient: str) -> TaskTowers:
        """The same towers (shared layers) with each MLP's ``gradient`` (``MLP.with_gradient``);
        this object when they have it already."""
        if all(m is None or m.gradient == gradient for m in self._towers):
            return self
        other = TaskTowers(
            self.num_tasks, self.units, self.dropout, self.initial_biases, name=self.name
        )
        other._towers = [m.with_gradient(gradient) if m else None for m in self._towers]
        other._logits = self._logits
        other.built = self.built
        return other

    def call(self, x: tf.Tensor, training: bool | None = None) -> tf.Tensor:
        columns = []
        for t in range(self.num_tasks):
            h = x[:, t]
            if self._towers[t] is not None:
                h = self._towers[t](h, training=training)
            columns.append(self._logits[t](h)[:, 0])
        return tf.stack(columns, axis=1)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "num_tasks": self.num_tasks,
            "units": self.units,
            "dropout": self.dropout,
            "initial_biases": self.initial_biases,
        }
