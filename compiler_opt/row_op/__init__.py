"""Generated ops for the planner's ``input`` and ``stitch`` groups: row programs with reductions.

A planned ``stitch`` group holds a row reduction (over non-batch axes: one result per example)
and its consumers, an ``input`` group ends in one; LayerNorm, softmax and DeepFM's FM term
``0.5 * sum_d((sum_f v)^2 - sum_f v^2)`` are such groups. TensorFlow runs them as one op per
node, each reading and writing whole tensors; FusionStitching runs each group as one kernel
that keeps an example's intermediate values on chip. Here a group becomes one TensorFlow op
(CPU, and GPU through ``row_op.cuda``) that runs the group's program **one example (row) at a
time**, every intermediate value of the row in a small local array (compile-time sizes: at
most ``MAX_ROW_FLOATS`` floats per row), so only the group's inputs and outputs touch memory:

* ``groups.row_spec`` reads a group out of the IR: inputs (``batched`` ``[rows, *shape]``, or
  constant, broadcast against the row as NumPy does), and per node a value with its row
  shape: an elementwise op of ``xy_op.OPS`` (NumPy broadcasting between row shapes),
  a reduction (``Sum``, ``Mean``, ``Max``, ``Min``, ``Prod`` over constant non-batch axes, with
  or without kept dims), ``Softmax`` (last axis), or a view (``Reshape``, ``ExpandDims``,
  ``Squeeze``, ``Identity`` between members of the group, absorbed from outside the plan's
  node list since the planner counts them as free). A group it cannot express gives a reason.
* ``cpu.generate`` writes the op: rows split over TensorFlow's CPU thread pool; per row each
  value is a loop over its (static) shape, operands indexed with broadcast strides, a
  reduction an accumulator array; the outputs copied out at the end of the row.
* ``groups.load`` (through the one ``registry`` of generated ops) compiles it
  (``toolchain.compile_kernel``) and loads it; ``xy_op.rewrite`` puts one node of it in
  place of the group's nodes.

The op has no gradient: serving graphs only (as the loop ops).
"""
