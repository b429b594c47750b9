"""Kernels executed by one call of a tf.function, read from a TensorFlow profiler trace.

Plain graph mode: every TensorFlow op the executor ran (events named ``node:OpType`` on the
``tf_Compute`` / inter-op threads of the ``/host:CPU`` plane). Under XLA on CPU: the XLA
kernels (fusions and library calls) that ``CpuExecutable`` ran, i.e. the events ``X`` that
have a matching ``end: X`` marker. On a GPU: the events on the device plane's stream lines.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import tensorflow as tf

from compiler_opt.trace import profiler_trace


def _space(fn: Any, args: tuple) -> Any:
    """The profiler trace of one call of ``fn`` after a first, untraced one."""
    fn(*args)
    with profiler_trace(host_tracer_level=3) as trace:
        out = fn(*args)
        tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, out)
    return trace.space


def executed_kernels(fn: Any, *args: Any) -> dict[str, Any]:
    """``{"tf_ops", "tf_ops_outside_xla", "xla_kernels", "gpu_kernels": counts,
    "top_tf_ops": {op: count}}`` for one call (host tracer level 3: inexpensive ops too)."""
    space = _space(fn, args)
    tf_ops: Counter[str] = Counter()
    xla: Counter[str] = Counter()
    gpu = 0
    for plane in space.planes:
        md = plane.event_metadata
        if plane.name.startswith("/device:GPU"):
            for line in plane.lines:
                if line.name.startswith("Stream"):
                    gpu += len(line.events)
            continue
        if not plane.name.startswith("/host:CPU"):
            continue
        for line in plane.lines:
            names = [md[e.metadata_id].name for e in line.events]
            ends = {n[5:] for n in names if n.startswith("end: ")}
            for n in names:
                if n in ends:
                    xla[n.rstrip("0123456789.")] += 1
                elif ":" in n and "::" not in n and not n.startswith("end: "):
                    op = n.rsplit(":", 1)[1]
                    if op and (op[0].isupper() or op[0] == "_") and " " not in op:
                        tf_ops[op] += 1
    xla_ops = sum(tf_ops[op] for op in ("_XlaCompile", "_XlaRun", "_XlaMerge"))
    return {
        "tf_ops": sum(tf_ops.values()),
        "tf_ops_outside_xla": sum(tf_ops.values()) - xla_ops,
        "xla_kernels": sum(xla.values()),
        "gpu_kernels": gpu,
        "top_tf_ops": dict(tf_ops.most_common(8)),
    }
