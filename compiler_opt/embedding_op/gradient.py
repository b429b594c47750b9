"""The gradient of a loaded embedding op: one ``tf.IndexedSlices`` per table."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

import compiler_opt.csource as csource
from compiler_opt.embedding_op.spec import KernelSpec


def register_gradient(spec: KernelSpec, forward: str, gradient: str, module: Any) -> None:
    nt, nm, nw = len(spec.tables), len(spec.masked_fields), spec.num_where_inputs
    ni = spec.num_id_inputs
    grad_fn = getattr(module, csource.python_name(gradient))
    # Python ints: a tensor made here would belong to whatever graph loaded the op first
    shapes = [(t.rows, t.cols) for t in spec.tables]

    @tf.RegisterGradient(forward)
    def _grad(op: tf.Operation, dy: tf.Tensor) -> list[Any]:
        inputs = list(op.inputs)
        tables = inputs[:nt]
        ids = inputs[nt : nt + ni]
        args: dict[str, Any] = {"tables": tables, "ids": ids, "dy": dy}
        if nm:
            args["masks"] = inputs[nt + ni : nt + ni + nm]
            if nw:
                args["wheres"] = inputs[nt + ni + nm : nt + ni + nm + nw]
        outs = grad_fn(**args)
        rows, values = outs[0], outs[1]
        grads: list[Any] = [
            tf.IndexedSlices(values[t], rows[t], dense_shape=tf.constant(shapes[t], tf.int64))
            for t in range(nt)
        ]
        grads += [None] * ni
        if nm:
            grads += list(outs[2]) + [None] * nw
        if spec.dense_dim:
            grads.append(dy[:, spec.emb_dim :])
        return grads

    del _grad
