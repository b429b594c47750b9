"""Activations whose derivative is computed in the forward pass and kept compact.

Nested forward-mode AD for element-wise activations ("Nesting Forward Automatic
Differentiation for Memory-Efficient Deep Neural Network Training"): an element-wise ``f`` has
a diagonal Jacobian, so its local derivative ``f'(z)`` can be computed in the forward pass
(one forward-mode product with a tangent of ones) and kept in place of what back-propagation
would keep; the backward pass is then ``dz = dy * f'(z)``. It pays where the derivative has a
smaller exact form than what plain back-propagation keeps.

``dense_relu_dropout(x, kernel, bias, rate, seed)`` is
``stateless_dropout(relu(x @ kernel + bias), rate, seed)``: a layer of the MLP's training step
with dropout. Plain back-propagation keeps, per element, the ReLU's output
(``ReluGrad`` reads it, 4 bytes), the dropout's keep mask (``SelectV2``'s gradient, 1 byte) and
the dropout's output (the next matmul's gradient reads it, 4 bytes). The derivative is
``f'(z) = scale`` where ``z > 0`` and the element is kept, else ``0``: one boolean (1 byte), so
with the output the step keeps 5 bytes per element instead of 9. Where the next layer is one
of these too, it keeps this layer's output as its input, and the boolean is read off that
output in the backward pass (``out != 0``): 4 bytes per element. The gradient is the plain
one: the same products ``dy * scale`` selected by the same elements.

ReLU without dropout gains nothing: TensorFlow's ``ReluGrad`` already reads the ReLU's output,
which the next matmul's gradient keeps anyway, so :class:`ranking.blocks.MLP` leaves it as it
is. Sigmoid and softmax gates read their outputs likewise. DCN-v2's cross layer
``x0 * (W x + b) + x`` keeps ``x0``, ``W x + b`` and ``x``, each needed by an exact gradient;
it has no smaller exact form.
"""

from __future__ import annotations

import tensorflow as tf


def dense_relu_dropout(
    x: tf.Tensor,
    kernel: tf.Tensor,
    bias: tf.Tensor,
    rate: float,
    seed: tf.Tensor,
    output_kept: bool = False,
) -> tf.Tensor:
    """``stateless_dropout(relu(x @ kernel + bias), rate, seed)`` keeping a boolean derivative.

    The layer's input, weights and the derivative are all the backward pass reads: ``dz = dy *
    scale`` where the element passed (else 0), then the matmul's and the bias's gradients of
    ``dz`` as TensorFlow's own ``MatMul`` / ``BiasAdd`` gradients compute them. The
    pre-activation and the ReLU's output are not kept (the custom gradient takes the layer's
    input, not its pre-activation: ``tf.custom_gradient`` keeps its arguments).

    With ``output_kept`` (the output is kept for the backward pass anyway, as the input of a next
    layer of this kind is), the boolean is not kept either: the backward pass reads it off the
    output (``out != 0``), and the layer keeps nothing of its own.

    Args:
      x: the layer's input ``[batch, k]``.
      kernel: ``[k, units]``; bias: ``[units]``.
      rate: the dropout rate, in ``(0, 1)``.
      seed: the stateless dropout's seed, a ``[2]`` int tensor.
      output_kept: whether something after the layer keeps its output for the backward pass.

    Returns:
      ``[batch, units]``, equal to the plain ops' output element for element; the gradients
      equal theirs.
    """
    if not 0.0 < rate < 1.0:
        raise ValueError(f"rate must be in (0, 1), got {rate}")

    @tf.custom_gradient
    def forward(x: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor) -> tuple[tf.Tensor, object]:
        scale = tf.constant(1.0 / (1.0 - rate), x.dtype)
        z = tf.nn.bias_add(tf.matmul(x, kernel), bias)
        out = tf.nn.experimental.stateless_dropout(tf.nn.relu(z), rate=rate, seed=seed)
        # relu(z) * scale > 0 exactly where z > 0 and the element is kept (scale > 1)
        derivative = None if output_kept else tf.not_equal(out, 0.0)

        def backward(dy: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
            passed = tf.not_equal(out, 0.0) if derivative is None else derivative
            dz = tf.where(passed, dy * scale, tf.zeros_like(dy))
            return (
                tf.matmul(dz, kernel, transpose_b=True),
                tf.matmul(x, dz, transpose_a=True),
                tf.raw_ops.BiasAddGrad(out_backprop=dz),
            )

        return out, backward

    return forward(x, kernel, bias)
