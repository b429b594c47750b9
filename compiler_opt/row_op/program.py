"""The C++ of one row of a row program, shared by the CPU kernel and the device code."""

from __future__ import annotations

from collections.abc import Sequence

from compiler_opt.row_op.spec import REDUCTIONS, VIEWS, RowSpec, size
from compiler_opt.xy_op import OPS


def _strides(shape: Sequence[int]) -> list[int]:
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= d
    return list(reversed(out))


def _linear(shape: Sequence[int], operand: Sequence[int]) -> str:
    """C++ index into ``operand`` (broadcast to ``shape``, NumPy-aligned) at the position of
    the loop variables ``i0, i1, ...`` over ``shape``: affine in them, so the innermost loop
    is contiguous (or constant) and vectorizes."""
    pad = [1] * (len(shape) - len(operand)) + list(operand)
    terms = []
    for a, (d, ost) in enumerate(zip(pad, _strides(pad), strict=True)):
        if d == 1:
            continue
        terms.append(f"i{a} * {ost}" if ost != 1 else f"i{a}")
    return " + ".join(terms) or "0"


def _nested(shape: Sequence[int], inner: Sequence[str]) -> list[str]:
    """C++ loops ``i0, i1, ...`` over ``shape`` around ``inner`` (a block when ``shape`` is
    ``()``: the inner declarations stay local)."""
    if not shape:
        return ["    {", *[f"      {x}" for x in inner], "    }"]
    lines, pad = [], "    "
    for a, d in enumerate(shape):
        lines.append(f"{pad}for (int64_t i{a} = 0; i{a} < {d}; ++i{a}) {{")
        pad += "  "
    lines += [f"{pad}{x}" for x in inner]
    lines += ["    " + "  " * a + "}" for a in reversed(range(len(shape)))]
    return lines


#: OpenMP reduction identifiers of the reductions (``#pragma omp simd``: the compiler may
#: reassociate the accumulation and vectorize it)
_OMP = {"Sum": "+", "Mean": "+", "Max": "max", "Min": "min", "Prod": "*"}


def _value_code(spec: RowSpec, i: int, ops: dict[str, str]) -> list[str]:
    """C++ computing body value ``i`` of one row into ``v<k>`` (``k = len(inputs) + i``)."""
    n_in = len(spec.inputs)
    shapes = [s for _, s in spec.inputs] + [v.shape for v in spec.body]
    v = spec.body[i]
    k, n = n_in + i, size(v.shape)
    if v.op in VIEWS:
        return [f"    const float* v{k} = v{v.operands[0]};"]
    lines = [f"    float v{k}[{n}];"]
    exp = ops.get("Exp", "RowExp({a})")
    if v.op in OPS:
        args = {
            name: f"v{o}[{_linear(v.shape, shapes[o])}]"
            for name, o in zip("ab", v.operands, strict=False)
        }
        template = exp if v.op == "Exp" else ops.get(v.op, OPS[v.op][1])
        if v.op == "Sigmoid":
            template = "1.0f / (1.0f + " + exp.format(a="-({a})") + ")"
        expr = template.format(a=args["a"], b=args.get("b", ""))
        return lines + _nested(v.shape, [f"v{k}[{_linear(v.shape, v.shape)}] = {expr};"])
    x = shapes[v.operands[0]]
    src = f"v{v.operands[0]}"
    if v.op == "Softmax":
        last = x[-1]
        e = exp.format(a="xs[j] - m")
        lines += [
            f"    for (int64_t p = 0; p < {n // last}; ++p) {{",
            f"      const float* xs = {src} + p * {last};",
            f"      float* ys = v{k} + p * {last};",
            "      float m = xs[0];",
            "      #pragma omp simd reduction(max:m)",
            f"      for (int64_t j = 1; j < {last}; ++j) m = xs[j] > m ? xs[j] : m;",
            "      float s = 0.0f;",
            "      #pragma omp simd reduction(+:s)",
            f"      for (int64_t j = 0; j < {last}; ++j) {{ ys[j] = {e}; s += ys[j]; }}",
            "      const float inv = 1.0f / s;",
            f"      for (int64_t j = 0; j < {last}; ++j) ys[j] *= inv;",
            "    }",
        ]
        return lines
    init, update = REDUCTIONS[v.op]
    suffix = len(x) - len(v.axes)
    if tuple(v.axes) == tuple(range(suffix, len(x))):
        # the reduced axes are the trailing ones: per output element one contiguous run
        run = size(x[suffix:])
        outer = list(x[:suffix])
        at = _linear(outer, outer)
        inner = [
            f"float acc = {init};",
            f"const float* xs = {src} + ({at}) * {run};",
            f"#pragma omp simd reduction({_OMP[v.op]}:acc)",
            f"for (int64_t j = 0; j < {run}; ++j) {{ const float x = xs[j]; {update}; }}",
            f"v{k}[{at}] = acc;",
        ]
        lines += _nested(outer, inner)
    else:  # an accumulator array, the input walked in order
        kept = tuple(1 if a in v.axes else d for a, d in enumerate(x))
        lines.append(f"    for (int64_t o = 0; o < {n}; ++o) v{k}[o] = {init};")
        body = [
            f"const float x = {src}[{_linear(x, x)}];",
            f"float& acc = v{k}[{_linear(x, kept)}];",
            f"{update};",
        ]
        lines += _nested(x, body)
    if v.op == "Mean":
        lines.append(f"    for (int64_t o = 0; o < {n}; ++o) v{k}[o] /= {float(size(x) // n)}f;")
    return lines


def row_program(spec: RowSpec, ops: dict[str, str]) -> list[str]:
    """C++ of one row ``r``: inputs ``X<k>`` (batched: offset by the row), outputs ``Y<o>``."""
    lines = []
    for k, (batched, shape) in enumerate(spec.inputs):
        offset = f" + r * {size(shape)}" if batched else ""
        lines.append(f"    const float* v{k} = X{k}{offset};")
    for i in range(len(spec.body)):
        lines += _value_code(spec, i, ops)
    n_in = len(spec.inputs)
    for o, value in enumerate(spec.outputs):
        n = size(spec.body[value].shape)
        lines.append(
            f"    for (int64_t f = 0; f < {n}; ++f) Y{o}[r * {n} + f] = v{n_in + value}[f];"
        )
    return lines
