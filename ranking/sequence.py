"""Behaviour-sequence blocks: pool a user's history into one vector, given the target item.

Every block has one calling convention, ``block(history, mask, target, training=None) ->
[batch, d]``: ``history`` float ``[batch, L, d]`` (the history items' vectors, newest first),
``mask`` bool ``[batch, L]`` (True at a real item, False at padding), ``target`` float
``[batch, d]`` (the candidate item's vector). Values at padded positions never reach the
output, and an empty history (no True in its row) gives a finite output.

* ``MaskedMeanPooling`` (``mean``): ``sum_j m_j h_j / max(1, sum_j m_j)``; zeros when empty.
* ``DINAttention`` (``din``): Deep Interest Network's local activation unit (Zhou et al., KDD
  2018): ``w_j = MLP([h_j, t, h_j - t, h_j * t])``, output ``sum_j m_j w_j h_j``.
* ``SelfAttentionEncoder`` (``bst``): Behavior Sequence Transformer (Chen et al., DLP-KDD 2019):
  one transformer layer over ``[t; h_1, ..., h_L]`` with learned position vectors; the output is
  the layer's output at the target position.

``sequence_block(kind, **options)`` builds one by kind, and ``ragged_to_padded`` turns a
preprocessor's ragged sequence ids into the padded ids and mask the blocks take.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

__all__ = [
    "DINAttention",
    "Dice",
    "MaskedMeanPooling",
    "SelfAttentionEncoder",
    "din_features",
    "din_first_layer",
    "masked_mean",
    "masked_softmax",
    "ragged_to_padded",
    "sequence_block",
]

DIN_ACTIVATIONS = ("sigmoid", "prelu", "dice")


def ragged_to_padded(ids: tf.RaggedTensor, max_len: int) -> tuple[tf.Tensor, tf.Tensor]:
    """Ragged sequence ids ``[batch, None]`` -> (ids ``[batch, max_len]`` int64, padded with
    0; mask ``[batch, max_len]`` bool, True at the real values).

    A row longer than ``max_len`` keeps its first ``max_len`` values (the newest ones, for
    sequences stored newest first).
    """
    if not isinstance(ids, tf.RaggedTensor) or ids.ragged_rank != 1:
        raise ValueError(f"ids must be a RaggedTensor [batch, None], got {ids!r}")
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len must be an int >= 1, got {max_len!r}")
    kept = ids[:, :max_len]
    dense = tf.cast(kept.to_tensor(default_value=0, shape=[None, max_len]), tf.int64)
    mask = tf.sequence_mask(kept.row_lengths(), max_len)
    return dense, mask


def masked_mean(history: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
    """``sum_j m_j h_j / max(1, sum_j m_j)``: ``[batch, L, d], [batch, L] -> [batch, d]``."""
    m = tf.cast(mask, history.dtype)[:, :, None]
    total = tf.reduce_sum(history * m, axis=1)
    count = tf.maximum(tf.reduce_sum(m, axis=1), 1.0)
    return total / count


def masked_softmax(scores: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
    """``exp(w_j) / sum_{k: m_k} exp(w_k)`` at the positions where ``mask`` is True, 0 at the
    others, and 0 everywhere in a row without a True: ``[batch, L] -> [batch, L]``."""
    peak = tf.reduce_max(tf.where(mask, scores, tf.constant(-float("inf"), scores.dtype)), 1)
    peak = tf.stop_gradient(tf.where(tf.math.is_finite(peak), peak, 0.0))  # shift-invariant
    e = tf.where(mask, tf.exp(tf.where(mask, scores - peak[:, None], 0.0)), 0.0)
    return tf.math.divide_no_nan(e, tf.reduce_sum(e, axis=1, keepdims=True))


def din_features(history: tf.Tensor, target: tf.Tensor) -> tf.Tensor:
    """DIN's activation-unit input ``[h_j, t, h_j - t, h_j * t]``:
    ``[batch, L, d], [batch, d] -> [batch, L, 4d]``."""
    t = tf.broadcast_to(target[:, None, :], tf.shape(history))
    return tf.concat([history, t, history - t, history * t], axis=-1)


def din_first_layer(
    history: tf.Tensor, target: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor
) -> tf.Tensor:
    """The activation unit's first affine map ``[h_j, t, h_j - t, h_j * t] W + b`` without
    building the ``[batch, L, 4d]`` input: ``[batch, L, d], [batch, d], [4d, u], [u] ->
    [batch, L, u]``.

    With ``W = [W_h; W_t; W_d; W_p]`` (four ``[d, u]`` blocks) the map is
    ``[h_j, h_j * t] [W_h + W_d; W_p] + (t (W_t - W_d) + b)``: one ``[batch * L, 2d] x [2d, u]``
    product per history position and one ``[batch, d] x [d, u]`` product per row, half the
    multiply-adds of the concatenated form, with the same result up to float rounding.
    """
    w_h, w_t, w_d, w_p = tf.split(kernel, 4, axis=0)
    shape = tf.shape(history)
    per_position = tf.concat([history, history * target[:, None, :]], axis=-1)
    flat = tf.reshape(per_position, [-1, 2 * kernel.shape[0] // 4])
    x = tf.matmul(flat, tf.concat([w_h + w_d, w_p], axis=0))
    x = tf.reshape(x, [shape[0], shape[1], kernel.shape[1]])
    return x + (tf.matmul(target, w_t - w_d) + bias)[:, None, :]


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class Dice(tf.keras.layers.Layer):
    """DIN's data-adaptive activation (Zhou et al., KDD 2018), per unit of the last axis:
    ``f(s) = p(s) s + (1 - p(s)) alpha s`` with
    ``p(s) = sigmoid((s - E[s]) / sqrt(Var[s] + epsilon))``: ``[..., u] -> [..., u]``.

    In a training call ``E[s]`` and ``Var[s]`` are the batch's mean and (biased) variance over
    every axis but the last, counting only the positions where ``valid`` is True (all when it
    is None), and the moving averages ``m <- momentum m + (1 - momentum) batch_value`` are
    updated (not on a batch without a valid position); other calls use the moving averages.
    ``alpha`` is learned per unit, starting at 0.

    Args:
      momentum: the moving averages' decay, in [0, 1).
      epsilon: added to the variance (the paper's 1e-8).
    """

    def __init__(self, momentum: float = 0.99, epsilon: float = 1e-8, **kwargs: Any):
        super().__init__(**kwargs)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
        if not epsilon > 0.0:
            raise ValueError(f"epsilon must be > 0, got {epsilon!r}")
        self.momentum = float(momentum)
        self.epsilon = float(epsilon)

    def build(self, input_shape: Any) -> None:
        units = int(input_shape[-1])
        self.alpha = self.add_weight(name="alpha", shape=(units,), initializer="zeros")
        moving = {
            "trainable": False,
            "synchronization": tf.VariableSynchronization.ON_READ,
            "aggregation": tf.VariableAggregation.MEAN,
        }
        self.moving_mean = self.add_weight(
            name="moving_mean", shape=(units,), initializer="zeros", **moving
        )
        self.moving_variance = self.add_weight(
            name="moving_variance", shape=(units,), initializer="ones", **moving
        )
        super().build(input_shape)

    def call(
        self, x: tf.Tensor, valid: tf.Tensor | None = None, training: bool | None = None
    ) -> tf.Tensor:
        if training:
            mean, variance = self._batch_moments(x, valid)
        else:
            mean, variance = self.moving_mean, self.moving_variance
        p = tf.sigmoid((x - mean) * tf.math.rsqrt(variance + self.epsilon))
        return p * x + (1.0 - p) * self.alpha * x

    def _batch_moments(self, x: tf.Tensor, valid: tf.Tensor | None) -> tuple[tf.Tensor, tf.Tensor]:
        """The masked batch mean and variance per unit; updates the moving averages."""
        w = tf.ones_like(x[..., :1]) if valid is None else tf.cast(valid, x.dtype)[..., None]
        axes = list(range(x.shape.rank - 1))
        count = tf.reduce_sum(w * tf.ones_like(x), axis=axes)  # [u]
        mean = tf.math.divide_no_nan(tf.reduce_sum(w * x, axis=axes), count)
        variance = tf.math.divide_no_nan(tf.reduce_sum(w * tf.square(x - mean), axis=axes), count)
        seen = count > 0
        decay = 1.0 - self.momentum
        self.moving_mean.assign(
            tf.where(seen, self.moving_mean + decay * (mean - self.moving_mean), self.moving_mean)
        )
        self.moving_variance.assign(
            tf.where(
                seen,
                self.moving_variance + decay * (variance - self.moving_variance),
                self.moving_variance,
            )
        )
        return mean, variance

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "momentum": self.momentum, "epsilon": self.epsilon}


class _SequenceBlock(tf.keras.layers.Layer):
    """Shared by the blocks: the output is one vector per row, so no Keras mask leaves it."""

    def compute_mask(self, inputs: Any, mask: Any = None) -> None:
        return None


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class MaskedMeanPooling(_SequenceBlock):
    """The mean of the real history items: ``sum_j m_j h_j / max(1, sum_j m_j)``,
    ``[batch, d]``; zeros for an empty history. ``target`` is accepted and unused."""

    def call(
        self,
        history: tf.Tensor,
        mask: tf.Tensor,
        target: tf.Tensor | None = None,
        training: bool | None = None,
    ) -> tf.Tensor:
        return masked_mean(history, mask)


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class DINAttention(_SequenceBlock):
    """Deep Interest Network's attention pooling (Zhou et al., "Deep Interest Network for
    Click-Through Rate Prediction", KDD 2018): ``[batch, d]``.

    The local activation unit scores each history item against the target,
    ``w_j = v^T a(... a(W_1 [h_j, t, h_j - t, h_j * t] + b_1) ...) + c`` (hidden layers of
    ``hidden`` units with activation ``a``, then one linear unit), and the output is
    ``sum_j m_j w_j h_j``. As in the paper the weights are not normalized (the sum keeps the
    intensity of the user's interest); ``softmax=True`` uses ``softmax_j`` over the real
    positions instead. An empty history gives zeros.

    With ``positions`` the first hidden layer also adds a learned vector ``p_j`` per history
    position (``j = 0`` the newest; ``[max_len, hidden[0]]``, starting at 0):
    ``a(W_1 [h_j, t, h_j - t, h_j * t] + b_1 + p_j)``, the same as giving the unit a one-hot
    position, so an item's weight can depend on how recent it is as well as on the target.

    With ``normalize`` (the default) the activation unit reads the unit vectors
    ``h_j / |h_j|`` and ``t / |t|`` in place of ``h_j`` and ``t``; the output still sums the raw
    ``h_j``. Embedding tables start small (a truncated normal of std 0.05), so the paper's
    ``h_j * t`` starts near 0.0025 per element and its gradient is as small: the unit learns the
    target-history match slowly, and on logs where the other fields overfit after one or two
    epochs early stopping can end the run first. Normalized, ``sum(h_j * t)`` is their cosine
    from the first step: 1 where the history item is the target item itself.
    ``normalize=False`` is the paper's unit.

    Args:
      hidden: the activation unit's hidden layer sizes. The default, one layer of 16 units, is
        smaller than the paper's 80 and 40: at embedding sizes of 8 to 16 it scored as well or
        better in ``bench.multitask`` at about 1.35x the serving latency of mean pooling instead
        of 2x (docs/multitask.md).
      activation: ``"sigmoid"``; ``"prelu"`` (a learned slope per unit for negative inputs,
        starting at 0.25); or ``"dice"`` (``Dice``: the paper's data-adaptive activation, with
        statistics over the batch's real positions).
      softmax: normalize the scores with a softmax over the real positions.
      positions: add the learned position vectors ``p_j`` (needs ``max_len``).
      max_len: the longest history (the schema's ``max_len``); histories are at most this long.
      normalize: score the unit vectors of ``h_j`` and ``t`` (above).
    """

    def __init__(
        self,
        hidden: tuple[int, ...] | list[int] = (16,),
        activation: str = "sigmoid",
        softmax: bool = False,
        positions: bool = False,
        max_len: int | None = None,
        normalize: bool = True,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        hidden = tuple(hidden)
        if not hidden or any(
            isinstance(u, bool) or not isinstance(u, int) or u < 1 for u in hidden
        ):
            raise ValueError(f"hidden must be a non-empty list of sizes >= 1, got {list(hidden)}")
        if activation not in DIN_ACTIVATIONS:
            raise ValueError(f"activation must be one of {DIN_ACTIVATIONS}, got {activation!r}")
        if not isinstance(softmax, bool):
            raise ValueError(f"softmax must be True or False, got {softmax!r}")
        if not isinstance(positions, bool):
            raise ValueError(f"positions must be True or False, got {positions!r}")
        if not isinstance(normalize, bool):
            raise ValueError(f"normalize must be True or False, got {normalize!r}")
        if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int)):
            raise ValueError(f"max_len must be an int >= 1 or None, got {max_len!r}")
        if (max_len is not None and max_len < 1) or (positions and max_len is None):
            raise ValueError(f"positions needs max_len >= 1, got max_len={max_len!r}")
        self.hidden = hidden
        self.activation = activation
        self.softmax = softmax
        self.positions = positions
        self.max_len = max_len
        self.normalize = normalize
        self._dense = [
            tf.keras.layers.Dense(
                u, activation="sigmoid" if activation == "sigmoid" else None, name=f"dense_{i}"
            )
            for i, u in enumerate(hidden)
        ]
        self._act: list[tf.keras.layers.Layer] = []
        if activation == "prelu":
            self._act = [
                tf.keras.layers.PReLU(
                    alpha_initializer=tf.keras.initializers.Constant(0.25),
                    shared_axes=[1],
                    name=f"prelu_{i}",
                )
                for i in range(len(hidden))
            ]
        elif activation == "dice":
            self._act = [Dice(name=f"dice_{i}") for i in range(len(hidden))]
        self._score = tf.keras.layers.Dense(1, name="score")

    def build(self, input_shape: Any) -> None:
        d = int(input_shape[-1])
        width = 4 * d
        for i, dense in enumerate(self._dense):
            dense.build((None, None, width))
            if self._act:
                self._act[i].build((None, None, dense.units))
            width = dense.units
        self._score.build((None, None, width))
        self.position_bias = None
        if self.positions:
            if input_shape[1] is not None and int(input_shape[1]) > self.max_len:
                raise ValueError(
                    f"the history's length {int(input_shape[1])} exceeds max_len={self.max_len}"
                )
            self.position_bias = self.add_weight(
                name="position_bias", shape=(self.max_len, self.hidden[0]), initializer="zeros"
            )
        super().build(input_shape)

    @property
    def dense_layers(self) -> list[tf.keras.layers.Dense]:
        """The activation unit's Dense layers, input side first, the scoring unit last."""
        return [*self._dense, self._score]

    def scores(
        self,
        history: tf.Tensor,
        mask: tf.Tensor,
        target: tf.Tensor,
        training: bool | None = None,
    ) -> tf.Tensor:
        """The weights ``w_j`` (softmax-normalized when ``softmax``), 0 at padding:
        ``[batch, L]``."""
        first = self._dense[0]
        if self.normalize:
            history = tf.math.l2_normalize(history, axis=-1)
            target = tf.math.l2_normalize(target, axis=-1)
        x = din_first_layer(history, target, first.kernel, first.bias)
        if self.position_bias is not None:
            x = x + self.position_bias[None, : tf.shape(history)[1], :]
        for i, dense in enumerate(self._dense):
            x = first.activation(x) if i == 0 else dense(x)
            if self.activation == "prelu":
                x = self._act[i](x)
            elif self.activation == "dice":
                x = self._act[i](x, valid=mask, training=training)
        w = self._score(x)[:, :, 0]
        if self.softmax:
            return masked_softmax(w, mask)
        return w * tf.cast(mask, w.dtype)

    def call(
        self,
        history: tf.Tensor,
        mask: tf.Tensor,
        target: tf.Tensor,
        training: bool | None = None,
    ) -> tf.Tensor:
        w = self.scores(history, mask, target, training=training)
        return tf.reduce_sum(w[:, :, None] * history, axis=1)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "hidden": list(self.hidden),
            "activation": self.activation,
            "softmax": self.softmax,
            "positions": self.positions,
            "max_len": self.max_len,
            "normalize": self.normalize,
        }


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class SelfAttentionEncoder(_SequenceBlock):
    """Behavior Sequence Transformer's encoder (Chen et al., "Behavior Sequence Transformer for
    E-commerce Recommendation in Alibaba", DLP-KDD 2019), one layer: ``[batch, d]``.

    The sequence is ``s = [t; h_1, ..., h_L] + P[0 : L + 1]`` with ``P`` a learned
    ``[max_len + 1, d]`` position table (position 0 is the target, position j the j-th newest
    history item). One post-norm transformer layer as in the paper,
    ``s' = LayerNorm(s + Dropout(MultiHead(s)))``,
    ``f = LayerNorm(s' + Dropout(LeakyReLU(s' W_1 + b_1) W_2 + b_2))``,
    with attention over the target and the real history items only (padding is masked out as a
    key). The output is ``f`` at the target position, ``f_0``: the target attended over the
    history (with one layer the other positions' outputs do not reach ``f_0``, so only it is
    computed). An empty history gives the target's own transform.

    Args:
      max_len: the longest history (``L <= max_len``); sizes the position table.
      num_heads: attention heads; ``d`` must be divisible by it (head size ``d / num_heads``).
      ff_dim: the feed-forward layer's hidden size (None: ``4 * d``).
      dropout: dropout rate on the attention probabilities and both residual branches.
    """

    def __init__(
        self,
        max_len: int,
        num_heads: int = 2,
        ff_dim: int | None = None,
        dropout: float = 0.0,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        for arg, value in (("max_len", max_len), ("num_heads", num_heads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{arg} must be an int >= 1, got {value!r}")
        if ff_dim is not None and (
            isinstance(ff_dim, bool) or not isinstance(ff_dim, int) or ff_dim < 1
        ):
            raise ValueError(f"ff_dim must be None or an int >= 1, got {ff_dim!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        self.max_len = max_len
        self.num_heads = num_heads
        self.ff_dim = ff_dim
        self.dropout = float(dropout)
        self._drop_attention = tf.keras.layers.Dropout(self.dropout)
        self._drop_ff = tf.keras.layers.Dropout(self.dropout)
        self._norm_attention = tf.keras.layers.LayerNormalization(name="norm_attention")
        self._norm_ff = tf.keras.layers.LayerNormalization(name="norm_ff")

    def build(self, input_shape: Any) -> None:
        d = int(input_shape[-1])
        if d % self.num_heads:
            raise ValueError(
                f"the history's dimension d={d} must be divisible by num_heads={self.num_heads}"
            )
        if input_shape[1] is not None and int(input_shape[1]) > self.max_len:
            raise ValueError(
                f"the history's length {int(input_shape[1])} exceeds max_len={self.max_len}"
            )
        self.positions = self.add_weight(
            name="positions", shape=(self.max_len + 1, d), initializer="truncated_normal"
        )
        self._attention = tf.keras.layers.MultiHeadAttention(
            num_heads=self.num_heads,
            key_dim=d // self.num_heads,
            dropout=self.dropout,
            name="attention",
        )
        self._ff_in = tf.keras.layers.Dense(self.ff_dim or 4 * d, name="ff_in")
        self._ff_out = tf.keras.layers.Dense(d, name="ff_out")
        super().build(input_shape)

    def call(
        self,
        history: tf.Tensor,
        mask: tf.Tensor,
        target: tf.Tensor,
        training: bool | None = None,
    ) -> tf.Tensor:
        length = tf.shape(history)[1]
        s = tf.concat([target[:, None, :], history], axis=1) + self.positions[None, : length + 1]
        query = s[:, :1]  # [batch, 1, d]: the target position
        keys = tf.concat([tf.ones_like(mask[:, :1]), mask], axis=1)  # [batch, L + 1]
        attended = self._attention(query, s, attention_mask=keys[:, None, :], training=training)
        x = self._norm_attention(query + self._drop_attention(attended, training=training))
        ff = self._ff_out(tf.nn.leaky_relu(self._ff_in(x)))
        return self._norm_ff(x + self._drop_ff(ff, training=training))[:, 0]

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "max_len": self.max_len,
            "num_heads": self.num_heads,
            "ff_dim": self.ff_dim,
            "dropout": self.dropout,
        }


SEQUENCE_BLOCKS: dict[str, type[tf.keras.layers.Layer]] = {
    "mean": MaskedMeanPooling,
    "din": DINAttention,
    "bst": SelfAttentionEncoder,
}


def sequence_block(kind: str, **options: Any) -> tf.keras.layers.Layer:
    """The sequence block of ``kind`` (``"mean"``, ``"din"`` or ``"bst"``) built with
    ``options`` (its constructor's arguments, e.g. ``max_len`` for ``"bst"``)."""
    if kind not in SEQUENCE_BLOCKS:
        raise ValueError(
            f"sequence block kind must be one of {tuple(SEQUENCE_BLOCKS)}, got {kind!r}"
        )
    return SEQUENCE_BLOCKS[kind](**options)
