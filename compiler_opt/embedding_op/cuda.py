"""The device code (``.cu``) of an embedding op: ``Element(i)`` per output element, forward and
gradient, generated from the same row rules as the CPU kernel."""

from __future__ import annotations

from collections.abc import Sequence

import compiler_opt.csource as csource
from compiler_opt.embedding_op.rules import grad_components, id_layout, ptr_code, row_code, segments
from compiler_opt.embedding_op.spec import FieldSpec, KernelSpec, op_names


def embedding_unsupported(spec: KernelSpec) -> str | None:
    """Why embedding op ``spec`` has no CUDA form, or None."""
    if spec.masked_fields and not spec.mask_rows:
        return (
            "AMTL masks in their training form (int32 wheres, kept in host memory for GPU "
            "kernels) have no CUDA form; the tabulated serving form (mask_rows) has"
        )
    if any(t.dtype == "int32" for t in spec.tables):
        return "int32 tables (row offsets) have no CUDA form; export them as int64"
    return None


def gradient_on_gpu(spec: KernelSpec) -> bool:
    """Whether the CUDA form of ``spec`` has the gradient op too: trainable specs without
    masks (the tabulated masks are a serving form: its gradient stays on the CPU kernel)."""
    return spec.trainable and not spec.masked_fields


_CU_HELPERS = """\
__host__ __device__ inline int64_t Clamp(int64_t v, int64_t lo, int64_t hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

// The row b of a ragged field holding value k (splits[b] <= k < splits[b + 1]).
__host__ __device__ inline int64_t RowOf(const int64_t* splits, int64_t batch, int64_t k) {
  int64_t lo = 0, hi = batch;
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (splits[mid] <= k) lo = mid; else hi = mid;
  }
  return lo;
}
"""


def _tables_code(spec: KernelSpec) -> list[str]:
    lines = []
    for t, table in enumerate(spec.tables):
        ctype = csource.C_TYPES[table.dtype][0]
        lines.append(f"  const {ctype}* T{t} = static_cast<const {ctype}*>(a.t[{t}]);")
    for i in range(spec.num_id_inputs):
        lines.append(f"  const int64_t* I{i} = a.ids[{i}];")
    for m in range(len(spec.masked_fields)):
        lines.append(f"  const float* M{m} = a.m[{m}];")
    lines.append("  (void)T0; (void)I0;")
    return lines


def _segment_select(segs: Sequence[tuple[int, int, str]], jf: str, assign: str) -> list[str]:
    """C++: ``assign`` (``v = `` or ``acc += ``) the expression of the segment holding column
    ``jf`` of the field, with ``j`` the column within the segment."""
    lines = []
    for n, (start, width, expr) in enumerate(segs):
        cond = "if" if n == 0 else "else if"
        lines.append(
            f"    {cond} ({jf} < {start + width}) {{ const int64_t j = {jf} - {start}; "
            f"{assign}{expr}; }}"
        )
    return lines


def _field_element(
    f: FieldSpec, spec: KernelSpec, first_id: int, mask_index: int | None
) -> list[str]:
    """C++: ``v`` = column ``c`` of example ``b`` for field ``f`` (columns ``[offset, +dim)``)."""
    body = row_code(f, "id_") + ptr_code(f, spec)
    if mask_index is not None:  # the tabulated form: the mask row of the table row
        body.append(f"const float* m_ = M{mask_index} + r0 * {f.dim};")
    segs = segments(f)
    lines = [
        f"    // field {f.name!r}: {f.method}, dim {f.dim}",
        f"    const int64_t jf = c - {f.offset};",
    ]
    if not f.ragged:
        lines.append(f"    const int64_t id_ = I{first_id}[b];")
        lines += [f"    {s}" for s in body]
        lines += _segment_select(segs, "jf", "v = ")
        return lines
    vals, splits = f"I{first_id}", f"I{first_id + 1}"
    lines += [
        f"    const int64_t nnz_ = a.nids[{first_id}];",
        f"    const int64_t s_ = Clamp({splits}[b], 0, nnz_);",
        f"    const int64_t e_ = Clamp({splits}[b + 1], s_, nnz_);",
        "    float acc = 0.0f;",
        "    for (int64_t k_ = s_; k_ < e_; ++k_) {",
        f"    const int64_t id_ = {vals}[k_];",
        *[f"    {s}" for s in body],
        *_segment_select(segs, "jf", "acc += "),
        "    }",
    ]
    if f.combiner == "mean":
        lines.append("    v = acc / static_cast<float>(e_ - s_ > 1 ? e_ - s_ : 1);")
    else:
        lines.append("    v = acc;")
    return lines


def _dispatch(parts: Sequence[tuple[int, list[str]]], var: str, indent: str = "  ") -> list[str]:
    """A binary search over ``parts`` (``(first value of var, code)``, ascending): the code of
    the part holding ``var``, in ``log2(len(parts))`` comparisons."""
    if len(parts) == 1:
        return [f"{indent}{{", *parts[0][1], f"{indent}}}"]
    mid = len(parts) // 2
    return [
        f"{indent}if ({var} < {parts[mid][0]}) {{",
        *_dispatch(parts[:mid], var, indent + "  "),
        f"{indent}}} else {{",
        *_dispatch(parts[mid:], var, indent + "  "),
        f"{indent}}}",
    ]


def _embedding_args(spec: KernelSpec, grad: bool) -> str:
    nt, ni, nm = len(spec.tables), spec.num_id_inputs, max(len(spec.masked_fields), 1)
    common = (
        f"const void* t[{nt}]; const int64_t* ids[{ni}]; int64_t nids[{ni}]; "
        f"const float* m[{nm}]; int64_t batch;"
    )
    if grad:
        return (
            f"struct Args {{ {common} const float* dy; int64_t* rows[{nt}]; float* values[{nt}]; "
            f"int64_t off[{nt + 1}]; }};"
        )
    return f"struct Args {{ {common} const float* dense; float* y; }};"


def embedding_source(spec: KernelSpec) -> str:
    """The ``.cu`` source of embedding op ``spec`` (forward, and the gradient when trainable).

    Forward ``Element(i)``: ``b = i / out_dim``, ``c = i % out_dim``; the field holding column
    ``c`` (a binary search over the fields' offsets) computes that one column (ragged fields
    pool over the row's ids), or ``c`` is a dense column. Gradient ``Element(i)``: ``i`` runs
    over the ``values`` outputs of every table, one after the other (``off``: their starts),
    ``pos = e / cols`` is the id's row entry, ``j = e % cols`` the column; the value is
    ``dy[b, o_f + start + j] (/ n) * factor[j]`` as in the CPU gradient, and ``j == 0`` also
    writes ``rows[pos]``.
    """
    reason = embedding_unsupported(spec)
    if reason:
        raise ValueError(reason)
    fwd, grad = op_names(spec)
    _, _, first_id = id_layout(spec)
    mask_of = {f.name: i for i, f in enumerate(spec.masked_fields)}
    head = [
        "// Generated by stitchrec compiler_opt/codegen_cuda.py: do not edit.",
        f"// spec: {spec.to_json()}",
        csource.CU_PRELUDE,
        "namespace {",
        f"constexpr int64_t kOutDim = {spec.out_dim};",
        f"constexpr int64_t kEmbDim = {spec.emb_dim};",
        f"constexpr int64_t kDenseDim = {spec.dense_dim};",
        csource.id_helpers("__host__ __device__ "),
        _CU_HELPERS,
    ]
    parts = [
        (f.offset, _field_element(f, spec, first_id[f.name], mask_of.get(f.name)))
        for f in spec.fields
    ]
    if spec.dense_dim:
        parts.append((spec.emb_dim, ["    v = a.dense[b * kDenseDim + (c - kEmbDim)];"]))
    sym = csource.symbol(fwd)
    forward = [
        *head,
        _embedding_args(spec, grad=False),
        "__host__ __device__ inline void Element(int64_t i, const Args& a) {",
        "  const int64_t b = i / kOutDim, c = i % kOutDim;",
        *_tables_code(spec),
        "  float v = 0.0f;",
        *_dispatch(parts, "c"),
        "  a.y[i] = v;",
        "}",
        csource.launch_text(sym),
        _extern_entry(
            sym,
            "float* y",
            "a.y = y;",
            "batch * kOutDim",
            spec,
            "const float* dense",
            "a.dense = dense;",
        ),
    ]
    if not gradient_on_gpu(spec):
        return "\n".join(forward)
    gsym = csource.symbol(grad)
    backward = [
        "",
        "// ------------------------------------------------------------------ gradient",
        "namespace {",  # the gradient's Element/Kernel/Run: namespace grad in the anonymous one
        "namespace grad {",
        _embedding_args(spec, grad=True),
        "__host__ __device__ inline void Element(int64_t i, const Args& a) {",
        *_tables_code(spec),
        "  int t = 0;",
        f"  while (t + 1 < {len(spec.tables)} && i >= a.off[t + 1]) ++t;",
        "  const int64_t e = i - a.off[t];",
        "  switch (t) {",
    ]
    for t in range(len(spec.tables)):
        backward += [f"  case {t}: {{", *_table_gradient(t, spec, first_id), "    break;", "  }"]
    backward += [
        "  }",
        "}",
        csource.launch_text(gsym).replace(
            "}  // namespace", "}  // namespace grad\n}  // namespace"
        ),
        _extern_entry(
            gsym,
            "const float* dy, int64_t* const* rows, float* const* values, const int64_t* off",
            f"a.dy = dy; for (int t = 0; t < {len(spec.tables)}; ++t) {{ a.rows[t] = rows[t]; "
            f"a.values[t] = values[t]; }} for (int t = 0; t <= {len(spec.tables)}; ++t) "
            "a.off[t] = off[t];",
            f"off[{len(spec.tables)}]",
            spec,
            "",
            "",
            prefix="grad::",
        ),
    ]
    return "\n".join(forward + backward)


def _extern_entry(
    sym: str,
    out_params: str,
    out_set: str,
    n: str,
    spec: KernelSpec,
    extra_param: str,
    extra_set: str,
    prefix: str = "",
) -> str:
    nt, ni, nm = len(spec.tables), spec.num_id_inputs, len(spec.masked_fields)
    params = [
        "int on_host",
        "void* stream",
        "int64_t batch",
        "const void* const* tables",
        "const int64_t* const* ids",
        "const int64_t* nids",
        "const float* const* masks",
    ]
    if extra_param:
        params.append(extra_param)
    params.append(out_params)
    return "\n".join(
        [
            f'extern "C" int {sym}({", ".join(params)}) {{',
            f"  {prefix}Args a = {{}};",
            "  a.batch = batch;",
            f"  for (int t = 0; t < {nt}; ++t) a.t[t] = tables[t];",
            f"  for (int k = 0; k < {ni}; ++k) {{ a.ids[k] = ids[k]; a.nids[k] = nids[k]; }}",
            f"  for (int m = 0; m < {nm}; ++m) a.m[m] = masks[m];",
            f"  {extra_set}" if extra_set else "",
            f"  {out_set}",
            f"  return {prefix}Run(on_host, stream, {n}, a);",
            "}",
            "",
        ]
    )


def _table_gradient(t: int, spec: KernelSpec, first_id: dict[str, int]) -> list[str]:
    """C++ of one table's gradient entries (see :func:`embedding_source`)."""
    f = next(f for f in spec.fields if t in f.tables)
    cols = spec.tables[t].cols
    nrow = f.rows_per_id
    first = first_id[f.name]
    lines = [
        f"    // table {t}: field {f.name!r} ({f.method})",
        f"    const int64_t pos = e / {cols}, j = e % {cols};",
        f"    const int64_t k_ = pos / {nrow};",
        f"    const int64_t slot = pos % {nrow};",
        "    (void)slot;",
    ]
    if f.ragged:
        splits = f"I{first + 1}"
        lines += [
            f"    const int64_t b = RowOf({splits}, a.batch, k_);",
            f"    const int64_t n_ = {splits}[b + 1] - {splits}[b];",
        ]
        scale = " / static_cast<float>(n_ > 1 ? n_ : 1)" if f.combiner == "mean" else ""
    else:
        lines.append("    const int64_t b = k_;")
        scale = ""
    lines.append(f"    const int64_t id_ = I{first}[k_];")
    lines += [f"    {s}" for s in row_code(f, "id_") + ptr_code(f, spec)]
    lines.append(f"    const float* g_ = a.dy + b * kOutDim + {f.offset};")
    comps = grad_components(f)
    first_branch = True
    for ci, (table, slot, start, width, factor) in enumerate(comps):
        if table != t:
            continue
        if width != cols:
            raise ValueError(f"field {f.name!r}: gradient width {width} != table {t}'s {cols}")
        row = f"r{slot}" if f.method == "bh" else f"r{ci}"
        mult = f" * {factor}[j]" if factor else ""
        cond = "if" if first_branch else "else if"
        first_branch = False
        lines += [
            f"    {cond} (slot == {slot}) {{",
            f"      a.values[{t}][pos * {cols} + j] = g_[{start} + j]{scale}{mult};",
            f"      if (j == 0) a.rows[{t}][pos] = {row};",
            "    }",
        ]
    return lines
