"""A sparse mixture-of-experts layer with top-k routing, expert capacity and expert prototyping.

``MoELayer``: ``x [batch, h] -> [batch, units[-1]]``. A router ``softmax(x W_g)`` sends each
example to a few of ``num_experts`` MLP experts, each expert takes at most ``C`` examples per
batch, and the output is the gate-weighted sum of the chosen experts' outputs (Shazeer et al.,
ICLR 2017; Switch Transformer, Fedus et al., JMLR 2022; expert prototyping from M6-T, Yang et
al., "M6-T: Exploring Sparse Expert Models and Beyond", 2021).

The routing is computed with dense masks so that it runs in any ``tf.function`` and SavedModel:
a one-hot dispatch mask ``[A * batch, E]`` over the assignments, its exclusive cumulative sum
down the batch for each assignment's position in its expert's buffer, and a drop where the
position reaches the capacity. Every expert is evaluated on every example (one batched einsum
per layer over an ``[E, n_in, n_out]`` kernel), and the combine weights select the output that
capacity-limited routing gives: ``activated_flops_per_example`` reports the multiply-adds of the
routed computation (the quantity to compare models at), not of this dense evaluation.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import tensorflow as tf

__all__ = ["MoELayer", "expert_capacity", "load_balance_loss", "route"]


def expert_capacity(
    batch: tf.Tensor, assignments: int, num_experts: int, factor: float
) -> tf.Tensor:
    """``C = ceil(factor * batch * assignments / num_experts)`` as an int32 scalar tensor."""
    rows = tf.cast(batch, tf.float64) * float(factor) * assignments / num_experts
    return tf.cast(tf.math.ceil(rows), tf.int32)


def route(
    logits: tf.Tensor, top_k: int, prototypes: int, capacity_factor: float
) -> dict[str, tf.Tensor]:
    """Capacity-limited routing of ``logits [batch, E]``.

    ``prototypes = 1``: ``p = softmax(logits)`` over all experts; each example makes ``top_k``
    assignments, to its ``top_k`` largest ``p``. ``prototypes = k``: the experts are ``k``
    groups of ``E / k`` consecutive experts, ``p`` is the softmax within each group and each
    example makes one assignment per group, to the group's largest ``p``. Gates: with
    ``top_k > 1`` the chosen ``p`` renormalized to sum to 1 over the chosen experts (GShard);
    with one choice (``top_k = 1``, and within each prototype group) the gate is ``p`` itself,
    as in Switch and M6-T (a renormalized single gate would be 1 and the router would get no
    gradient from the prediction).

    Each expert takes at most ``C = expert_capacity(batch, A, E, capacity_factor)`` assignments
    (``A = top_k * prototypes`` per example). Its buffer fills in order: all first choices in
    batch order, then all second choices, and so on; an assignment whose position reaches
    ``C`` is dropped and contributes nothing (the other gates are not rescaled).

    Returns ``{"probs": p [batch, E], "assigned": [batch, A, E] one-hot of every assignment,
    "kept": [batch, A, E] the assignments within capacity, "combine": [batch, E] the gate of
    each kept (example, expert), "capacity": C}``.
    """
    batch, experts = tf.shape(logits)[0], logits.shape[-1]
    if prototypes == 1:
        probs = tf.nn.softmax(logits, axis=-1)
        gates, choice = tf.math.top_k(probs, k=top_k)  # [batch, A]
        if top_k > 1:
            gates = gates / tf.reduce_sum(gates, axis=-1, keepdims=True)
    else:
        group = experts // prototypes
        grouped = tf.nn.softmax(tf.reshape(logits, [-1, prototypes, group]), axis=-1)
        probs = tf.reshape(grouped, [-1, experts])
        gates = tf.reduce_max(grouped, axis=-1)  # [batch, k]
        offsets = tf.range(prototypes, dtype=tf.int32) * group
        choice = tf.argmax(grouped, axis=-1, output_type=tf.int32) + offsets[None]
    assignments = top_k * prototypes
    assigned = tf.one_hot(choice, experts, dtype=logits.dtype)  # [batch, A, E]
    order = tf.reshape(tf.transpose(assigned, [1, 0, 2]), [-1, experts])  # choice-major
    position = tf.math.cumsum(order, axis=0, exclusive=True)
    capacity = expert_capacity(batch, assignments, experts, capacity_factor)
    fits = tf.cast(position < tf.cast(capacity, position.dtype), order.dtype)
    kept = tf.transpose(tf.reshape(order * fits, [assignments, -1, experts]), [1, 0, 2])
    combine = tf.reduce_sum(kept * gates[:, :, None], axis=1)
    return {
        "probs": probs,
        "assigned": assigned,
        "kept": kept,
        "combine": combine,
        "capacity": capacity,
    }


def load_balance_loss(probs: tf.Tensor, assigned: tf.Tensor, prototypes: int) -> tf.Tensor:
    """Switch Transformer's auxiliary loss, per prototype group and averaged over the groups:
    ``mean_g n * sum_{e in g} f_e P_e``, with ``n = E / prototypes`` experts per group,
    ``f_e`` the fraction of the group's assignments (before capacity) that went to ``e`` and
    ``P_e`` the batch mean of ``p_e`` (the router probability, softmax within the group). It is
    1 for a uniform router and ``n`` when all traffic and probability go to one expert; the
    gradient flows through ``P_e``.
    """
    experts = probs.shape[-1]
    group = experts // prototypes
    counts = tf.reduce_sum(assigned, axis=[0, 1])  # [E]
    per_group = tf.reshape(counts, [prototypes, group])
    fraction = per_group / tf.reduce_sum(per_group, axis=-1, keepdims=True)
    mean_prob = tf.reshape(tf.reduce_mean(probs, axis=0), [prototypes, group])
    return tf.reduce_mean(group * tf.reduce_sum(fraction * mean_prob, axis=-1))


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class MoELayer(tf.keras.layers.Layer):
    """Sparse mixture of MLP experts: ``x [batch, h] -> [batch, units[-1]]``.

    ``y = sum_e c_e(x) * expert_e(x)``, ``expert_e(x) = a(... a(x W_{e,1} + b_{e,1}) ...)``
    (``activation`` after every layer, as in ``blocks.MLP``), with the combine weights ``c``
    of ``route`` on the router logits ``x W_g`` (no bias): ``c_e`` is the gate of expert ``e``
    when the example was routed to ``e`` within its capacity, else 0.

    Counters (non-trainable int64 weights, summed over replicas under ``tf.distribute``),
    updated in training calls only: ``routed_total``, the assignments the router made
    (``A`` per example), and ``dropped_total``, those dropped for capacity; ``drop_rate`` is
    their ratio. With ``load_balance_weight > 0`` every call adds
    ``load_balance_weight * load_balance_loss(...)`` to the layer's losses.

    Args:
      num_experts: ``E``, the experts.
      units: each expert's layer sizes.
      top_k: the experts each example is routed to (``prototypes = 1``).
      prototypes: ``k`` groups of experts with top-1 routing in each (M6-T's expert
        prototyping; needs ``top_k = 1`` and ``num_experts`` divisible by ``k``).
      capacity_factor: ``C = ceil(capacity_factor * batch * A / E)`` per expert per batch,
        ``A = top_k * prototypes`` the assignments per example (``A / E`` is each expert's
        fair share).
      load_balance_weight: the auxiliary loss's weight (0: none).
      activation: the experts' activation, a Keras activation name.
    """

    def __init__(
        self,
        num_experts: int,
        units: tuple[int, ...] | list[int],
        top_k: int = 1,
        prototypes: int = 1,
        capacity_factor: float = 1.25,
        load_balance_weight: float = 0.0,
        activation: str = "relu",
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.num_experts = _positive_int("num_experts", num_experts)
        self.top_k = _positive_int("top_k", top_k)
        self.prototypes = _positive_int("prototypes", prototypes)
        units = tuple(units)
        if not units or any(isinstance(u, bool) or not isinstance(u, int) or u < 1 for u in units):
            raise ValueError(f"units must be a non-empty list of sizes >= 1, got {list(units)}")
        if prototypes > 1 and top_k != 1:
            raise ValueError(f"top_k must be 1 with prototypes={prototypes}, got top_k={top_k}")
        if num_experts % prototypes:
            raise ValueError(
                f"num_experts={num_experts} must be divisible by prototypes={prototypes}"
            )
        if top_k > num_experts:
            raise ValueError(f"top_k must be <= num_experts={num_experts}, got {top_k}")
        if not capacity_factor > 0:
            raise ValueError(f"capacity_factor must be > 0, got {capacity_factor!r}")
        if not load_balance_weight >= 0:
            raise ValueError(f"load_balance_weight must be >= 0, got {load_balance_weight!r}")
        if not isinstance(activation, str):
            raise ValueError(f"activation must be a Keras activation name, got {activation!r}")
        try:
            self._activation = tf.keras.activations.get(activation)
        except ValueError as e:
            raise ValueError(
                f"activation must be a Keras activation name, got {activation!r}"
            ) from e
        self.units = units
        self.capacity_factor = float(capacity_factor)
        self.load_balance_weight = float(load_balance_weight)
        self.activation = activation

    @property
    def assignments_per_example(self) -> int:
        """``A = top_k * prototypes``: the experts each example is routed to."""
        return self.top_k * self.prototypes

    def build(self, input_shape: Any) -> None:
        h = input_shape[-1]
        if h is None:
            raise ValueError(f"the input's last dimension must be known, got shape {input_shape}")
        self.input_dim = int(h)
        self.gate = self.add_weight(
            name="gate", shape=(self.input_dim, self.num_experts), initializer="glorot_uniform"
        )
        self.kernels, self.biases = [], []
        sizes = (self.input_dim, *self.units)
        for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
            limit = math.sqrt(6.0 / (n_in + n_out))  # Glorot uniform within each expert
            self.kernels.append(
                self.add_weight(
                    name=f"kernel_{i}",
                    shape=(self.num_experts, n_in, n_out),
                    initializer=tf.keras.initializers.RandomUniform(-limit, limit),
                )
            )
            self.biases.append(
                self.add_weight(
                    name=f"bias_{i}", shape=(self.num_experts, n_out), initializer="zeros"
                )
            )
        counter = {
            "shape": (),
            "dtype": tf.int64,
            "initializer": "zeros",
            "trainable": False,
            "synchronization": tf.VariableSynchronization.ON_READ,
            "aggregation": tf.VariableAggregation.SUM,
        }
        self.routed_total = self.add_weight(name="routed_total", **counter)
        self.dropped_total = self.add_weight(name="dropped_total", **counter)
        super().build(input_shape)

    @property
    def drop_rate(self) -> float:
        """``dropped_total / routed_total`` over the training calls so far (0 before any)."""
        routed = int(self.routed_total.numpy())
        return int(self.dropped_total.numpy()) / routed if routed else 0.0

    def experts(self, x: tf.Tensor) -> tf.Tensor:
        """Every expert on every example: ``[batch, h] -> [E, batch, units[-1]]``."""
        y = tf.einsum("bh,ehu->ebu", x, self.kernels[0]) + self.biases[0][:, None]
        y = self._activation(y)
        for kernel, bias in zip(self.kernels[1:], self.biases[1:], strict=True):
            y = self._activation(tf.einsum("ebu,euv->ebv", y, kernel) + bias[:, None])
        return y

    def routing(self, x: tf.Tensor, training: bool = True) -> dict[str, tf.Tensor]:
        """``route`` on this layer's router logits ``x W_g``: capacity-limited in training;
        outside training every assignment is kept (capacity ``batch * A``), so an example's
        output does not depend on the other examples of its batch (a served row scores the
        same in any batch the server forms)."""
        logits = tf.matmul(x, tf.cast(self.gate, x.dtype))
        factor = self.capacity_factor if training else float(self.num_experts)
        return route(logits, self.top_k, self.prototypes, factor)

    def call(self, x: tf.Tensor, training: bool | None = None) -> tf.Tensor:
        routed = self.routing(x, training=bool(training))
        if training:
            made = tf.cast(tf.reduce_sum(routed["assigned"]), tf.int64)
            self.routed_total.assign_add(made)
            self.dropped_total.assign_add(made - tf.cast(tf.reduce_sum(routed["kept"]), tf.int64))
        if self.load_balance_weight > 0:
            loss = load_balance_loss(routed["probs"], routed["assigned"], self.prototypes)
            self.add_loss(self.load_balance_weight * loss)
        return tf.einsum("be,ebu->bu", routed["combine"], self.experts(x))

    def activated_flops_per_example(self, input_dim: int | None = None) -> int:
        """Multiply-adds per example of the routed computation: the router's ``h * E`` plus
        ``A * sum_l n_{l-1} n_l`` for the ``A`` experts an example is routed to
        (``n_0 = h``, the input dimension; biases and activations not counted).

        Args:
          input_dim: ``h`` (None: the built layer's input dimension).
        """
        if input_dim is None:
            if not self.built:
                raise ValueError("input_dim is needed before the layer is built, got None")
            input_dim = self.input_dim
        h = _positive_int("input_dim", input_dim)
        sizes = (h, *self.units)
        expert = sum(a * b for a, b in itertools.pairwise(sizes))
        return h * self.num_experts + self.assignments_per_example * expert

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "num_experts": self.num_experts,
            "units": list(self.units),
            "top_k": self.top_k,
            "prototypes": self.prototypes,
            "capacity_factor": self.capacity_factor,
            "load_balance_weight": self.load_balance_weight,
            "activation": self.activation,
        }
