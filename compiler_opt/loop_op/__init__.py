"""Generated C++ kernels for the planner's elementwise ``loop`` groups of a serving graph.

A ``loop`` group of the plan (``compiler_opt.planner``) is a set of elementwise ops (``Mul``,
``AddV2``, ``Relu``...) that, run one by one, each read and write a whole tensor. Here such a
group becomes one TensorFlow op, generated from the group's nodes:

* ``groups.loop_spec`` reads the group out of the IR: its inputs, each classed by how it is indexed
  (``full`` ``[rows, width]`` like the result (a dimension the graph leaves unknown is checked
  when the op runs: a wrong-sized input is an ``InvalidArgument`` error, which the server's
  warm-up meets before a version turns ready), ``row`` ``[width]`` broadcast over the rows as a
  ``BiasAdd`` bias, ``scalar``), its nodes as an SSA expression list and the values read outside
  the group (the op's outputs). A group it cannot express (another dtype, an op outside
  ``OPS``, a broadcast other than these three) gives a ``None`` spec and a reason.
* ``cpu.generate`` writes the op: one pass over the rows (split over TensorFlow's CPU thread
  pool), for each element ``j`` of a row every SSA value in registers, then the outputs; the
  width and every constant are compile-time constants, so the inner loop vectorizes.
* ``groups.load`` compiles it (``toolchain.compile_kernel``: g++, cached by content hash) and loads it.
* ``xy_op.rewrite`` replaces the group's nodes in a ``GraphDef`` by one node of that op.

For ``y = x0 * (W x + b) + x`` (a DCN-v2 cross layer, the bias in the matmul's epilogue) the
``Mul`` and the ``AddV2`` read 4 and write 2 tensors of ``[batch, width]``; the generated op
reads 3 and writes 1. Serving graphs only: the op has no gradient.
"""
