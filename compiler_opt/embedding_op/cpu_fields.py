"""The C++ of one field in an embedding op's CPU kernels: forward, gradient, AMTL mask gradient."""

from __future__ import annotations

from compiler_opt.embedding_op.rules import grad_components, ptr_code, row_code, segments
from compiler_opt.embedding_op.spec import FieldSpec, KernelSpec


def prefetch(f: FieldSpec, spec: KernelSpec, first_id: int, distance: int) -> str:
    """Prefetch of the rows the field reads ``distance`` examples ahead (single-valued ids)."""
    if f.ragged or distance <= 0:
        return ""
    rows = row_code(f, "id_")
    ptrs = [p.split("=", 1)[1].rstrip(";").strip() for p in ptr_code(f, spec)]
    body = " ".join(rows + [f"__builtin_prefetch({q});" for q in ptrs])
    return f"      {{ const int64_t id_ = I{first_id}[b + {distance}]; {body} }}"


def _mask_row(spec: KernelSpec, m: int, k: str) -> str:
    """The mask row read for id ``k`` of masked field ``m``: its ``wheres`` entry, or the table
    row ``r0`` the id reads (``mask_rows``)."""
    return "r0" if spec.mask_rows else f"static_cast<int64_t>(W{m}[{k}])"


def field_forward(f: FieldSpec, spec: KernelSpec, first_id: int, mask_index: int | None) -> str:
    lines = [f"    {{  // field {f.name!r}: {f.method}, dim {f.dim}, columns {f.offset}.."]
    segs = segments(f)
    body_ptr = row_code(f, "id_") + ptr_code(f, spec)
    if mask_index is not None:
        body_ptr.append(
            f"const float* m_ = M{mask_index} + {_mask_row(spec, mask_index, 'k_')} * {f.dim};"
        )
    if not f.ragged:
        lines.append(f"      const int64_t k_ = b; const int64_t id_ = I{first_id}[b];")
        lines += [f"      {s}" for s in body_ptr]
        lines.append(f"      float* dst = y + {f.offset};")
        for start, width, expr in segs:
            lines.append(f"      for (int j = 0; j < {width}; ++j) dst[{start} + j] = {expr};")
    else:
        vals, splits = f"I{first_id}", f"I{first_id + 1}"
        lines.append(f"      const int64_t s_ = {splits}[b], e_ = {splits}[b + 1];")
        lines.append(f"      float acc[{f.dim}] = {{}};")
        lines.append("      for (int64_t k_ = s_; k_ < e_; ++k_) {")
        lines.append(f"        const int64_t id_ = {vals}[k_];")
        lines += [f"        {s}" for s in body_ptr]
        for start, width, expr in segs:
            lines.append(f"        for (int j = 0; j < {width}; ++j) acc[{start} + j] += {expr};")
        lines.append("      }")
        lines.append(f"      float* dst = y + {f.offset};")
        if f.combiner == "mean":
            lines.append(
                "      const float n_ = static_cast<float>(std::max<int64_t>(e_ - s_, 1));"
            )
            lines.append(f"      for (int j = 0; j < {f.dim}; ++j) dst[j] = acc[j] / n_;")
        else:
            lines.append(f"      for (int j = 0; j < {f.dim}; ++j) dst[j] = acc[j];")
    lines.append("    }")
    return "\n".join(lines)


def field_backward(f: FieldSpec, spec: KernelSpec, first_id: int, mask_index: int | None) -> str:
    lines = [f"    {{  // field {f.name!r}"]
    body = row_code(f, "id_") + ptr_code(f, spec)
    if mask_index is not None:
        body.append(
            f"const float* m_ = M{mask_index} + {_mask_row(spec, mask_index, 'k_')} * {f.dim};"
        )
    comps = grad_components(f)
    per_id = []
    nrow = f.rows_per_id
    for ci, (t, slot, start, width, factor) in enumerate(comps):
        pos = f"k_ * {nrow} + {slot}" if nrow > 1 else "k_"
        row = f"r{slot}" if f.method == "bh" else f"r{ci}"
        mult = f" * {factor}[j]" if factor else ""
        per_id.append(f"R{t}[{pos}] = {row};")
        per_id.append(
            f"{{ float* v_ = V{t} + ({pos}) * {width}; "
            f"for (int j = 0; j < {width}; ++j) v_[j] = g_[{start} + j]{mult}; }}"
        )
    if not f.ragged:
        lines.append(f"      const int64_t k_ = b; const int64_t id_ = I{first_id}[b];")
        lines.append(f"      const float* g_ = dy + {f.offset};")
        lines += [f"      {s}" for s in body + per_id]
    else:
        vals, splits = f"I{first_id}", f"I{first_id + 1}"
        lines.append(f"      const int64_t s_ = {splits}[b], e_ = {splits}[b + 1];")
        if f.combiner == "mean":
            lines.append(
                "      const float n_ = static_cast<float>(std::max<int64_t>(e_ - s_, 1));"
            )
            lines.append(f"      float g_[{f.dim}];")
            lines.append(
                f"      for (int j = 0; j < {f.dim}; ++j) g_[j] = dy[{f.offset} + j] / n_;"
            )
        else:
            lines.append(f"      const float* g_ = dy + {f.offset};")
        lines.append("      for (int64_t k_ = s_; k_ < e_; ++k_) {")
        lines.append(f"        const int64_t id_ = {vals}[k_];")
        lines += [f"        {s}" for s in body + per_id]
        lines.append("      }")
    lines.append("    }")
    return "\n".join(lines)


def mask_backward(f: FieldSpec, spec: KernelSpec, first_id: int, mask_index: int) -> str:
    """Serial accumulation ``dM[w(k)] += g(k) * T[row(k)]`` of one AMTL field."""
    t = f.tables[0]
    d = f.dim
    lines = [f"  if (m == {mask_index}) {{  // field {f.name!r}"]
    lines.append(f"    float* dm = DM{mask_index};")
    if f.ragged:
        vals, splits = f"I{first_id}", f"I{first_id + 1}"
        lines.append("    for (int64_t b = 0; b < batch; ++b) {")
        lines.append(f"      const int64_t s_ = {splits}[b], e_ = {splits}[b + 1];")
        scale = (
            "static_cast<float>(std::max<int64_t>(e_ - s_, 1))" if f.combiner == "mean" else "1.0f"
        )
        lines.append(f"      const float n_ = {scale};")
        lines.append("      for (int64_t k_ = s_; k_ < e_; ++k_) {")
        lines.append(f"        const int64_t id_ = {vals}[k_];")
        lines.append(f"        const int64_t r0 = OovSafe(id_, {f.param('num_rows')}LL);")
        lines.append(f"        const float* p0 = T{t} + r0 * {d};")
        lines.append(f"        float* o_ = dm + {_mask_row(spec, mask_index, 'k_')} * {d};")
        lines.append(f"        const float* g_ = dy + b * kOutDim + {f.offset};")
        lines.append(f"        for (int j = 0; j < {d}; ++j) o_[j] += g_[j] / n_ * p0[j];")
        lines.append("      }")
        lines.append("    }")
    else:
        lines.append("    for (int64_t b = 0; b < batch; ++b) {")
        lines.append(f"      const int64_t r0 = OovSafe(I{first_id}[b], {f.param('num_rows')}LL);")
        lines.append(f"      const float* p0 = T{t} + r0 * {d};")
        lines.append(f"      float* o_ = dm + {_mask_row(spec, mask_index, 'b')} * {d};")
        lines.append(f"      const float* g_ = dy + b * kOutDim + {f.offset};")
        lines.append(f"      for (int j = 0; j < {d}; ++j) o_[j] += g_[j] * p0[j];")
        lines.append("    }")
    lines.append("  }")
    return "\n".join(lines)
