"""The C++ of an embedding op's row rules, shared by its CPU kernel and its device code: the
table rows of an id, the pointers to them, the pieces of a field's vector, its gradient rows."""

from __future__ import annotations

from compiler_opt.embedding_op.spec import FieldSpec, KernelSpec
from embeddings.hashing import GOLDEN, U64

#: C++ of a kernel's Compute: the table variables through their handles, read-locked, their
#: dtypes and shapes checked, their data pointers in ``tables`` (CPU and GPU kernels)
TABLE_READS = (
    "    std::vector<tensorflow::core::RefCountPtr<Var>> refs;",
    "    if (!ReadTables(ctx, &refs)) return;",
    "    std::vector<Var*> raw;",
    "    for (auto& r : refs) raw.push_back(r.get());",
    "    TableLocks locks(raw);",
    "    const void* tables[kNumTables];",
    "    if (!CheckTables(ctx, refs, tables)) return;",
)


def row_code(f: FieldSpec, var: str) -> list[str]:
    """C++ statements computing the table row(s) of id ``var`` of field ``f``: ``r0``.. (one per
    table or block)."""
    p = dict(f.index)
    n = p["num_rows"]
    if f.method in ("full", "amtl"):
        return [f"const int64_t r0 = OovSafe({var}, {n}LL);"]
    if f.method == "amtl_serving":  # the row's first n0_ entries start at values[s0_]
        s = f"T{f.tables[1]}"
        return [
            f"const int64_t r0 = OovSafe({var}, {n}LL);",
            f"const int64_t s0_ = static_cast<int64_t>({s}[r0]);",
            f"const int64_t n0_ = static_cast<int64_t>({s}[r0 + 1]) - s0_;",
        ]
    if f.method == "hashing":
        buckets = p["buckets"]
        if buckets == 1:
            return ["const int64_t r0 = 0;"]
        seed_add = ((p["seed"] + 1) * GOLDEN) & U64
        oov = f"{var} <= 0" + ("" if p["open_vocabulary"] else f" || {var} >= {n}LL")
        return [f"const int64_t r0 = HashBucket({var}, 0x{seed_add:X}ULL, {buckets}LL, {oov});"]
    if f.method == "qr":
        m = p["collisions"]
        return [
            f"const int64_t q_ = OovSafe({var}, {n}LL);",
            f"const int64_t r0 = q_ / {m}LL;",
            f"const int64_t r1 = q_ % {m}LL;",
        ]
    # bh
    bits = p["code_bits"]
    lines = [f"int64_t c_ = {var} < 0 ? 0 : {var};"]
    space = (1 << bits) - n
    if bits < 63 and space > 0:
        lines.append(f"if (c_ >= {n}LL) c_ = {n}LL + (c_ - {n}LL) % {space}LL;")
    lines.append(f"c_ &= {(1 << bits) - 1}LL;")
    for j, size in enumerate(p["block_sizes"]):
        if p["split"] == "succession":
            shift = j * p["block_bits"]
            v = f"((c_ >> {shift}) & {(1 << size) - 1}LL)"
        else:
            pos = p["positions"][j][:size]
            v = " | ".join(f"(((c_ >> {q}) & 1LL) << {k})" for k, q in enumerate(pos))
            v = f"({v})"
        lines.append(f"const int64_t r{j} = {p['offsets'][j]}LL + {v};")
    return lines


def ptr_code(f: FieldSpec, spec: KernelSpec) -> list[str]:
    """Pointers ``p0``.. to the rows read for the current id (after :func:`row_code`)."""
    if f.method == "amtl_serving":
        return [f"const float* p0 = T{f.tables[0]} + s0_;"]
    if f.method == "bh":
        t = f.tables[0]
        cols = spec.tables[t].cols
        return [f"const float* p{j} = T{t} + r{j} * {cols};" for j in range(f.rows_per_id)]
    return [
        f"const float* p{j} = T{t} + r{j} * {spec.tables[t].cols};" for j, t in enumerate(f.tables)
    ]


def segments(f: FieldSpec) -> list[tuple[int, int, str]]:
    """``(start, width, expression in j)`` pieces of the field's vector."""
    d = f.dim
    if f.method in ("full", "hashing"):
        return [(0, d, "p0[j]")]
    if f.method == "amtl":
        return [(0, d, "p0[j] * m_[j]")]
    if f.method == "amtl_serving":
        return [(0, d, "(j < n0_ ? p0[j] : 0.0f)")]
    if f.method == "qr":
        op = f.param("operation")
        if op == "mult":
            return [(0, d, "p0[j] * p1[j]")]
        if op == "add":
            return [(0, d, "p0[j] + p1[j]")]
        return [(0, d // 2, "p0[j]"), (d // 2, d // 2, "p1[j]")]
    n = f.rows_per_id
    if f.param("fusion") == "sum":
        return [(0, d, " + ".join(f"p{j}[j]" for j in range(n)))]
    bd = d // n
    return [(j * bd, bd, f"p{j}[j]") for j in range(n)]


def grad_components(f: FieldSpec) -> list[tuple[int, int, int, int, str]]:
    """Per row read: ``(table, slot within the id's rows, grad column start, width, factor)``;
    the gradient row is ``g[start + j] * factor[j]`` (factor ``""``: 1)."""
    d = f.dim
    if f.method in ("full", "hashing"):
        return [(f.tables[0], 0, 0, d, "")]
    if f.method == "amtl":
        return [(f.tables[0], 0, 0, d, "m_")]
    if f.method == "qr":
        q, r = f.tables
        op = f.param("operation")
        if op == "mult":
            return [(q, 0, 0, d, "p1"), (r, 0, 0, d, "p0")]
        if op == "add":
            return [(q, 0, 0, d, ""), (r, 0, 0, d, "")]
        return [(q, 0, 0, d // 2, ""), (r, 0, d // 2, d // 2, "")]
    n = f.rows_per_id
    t = f.tables[0]
    if f.param("fusion") == "sum":
        return [(t, j, 0, d, "") for j in range(n)]
    bd = d // n
    return [(t, j, j * bd, bd, "") for j in range(n)]


def id_layout(spec: KernelSpec) -> tuple[list[int], list[int], dict[str, int]]:
    """(field index per id input, kind per id input, first id input per field)."""
    fields, kinds, first = [], [], {}
    for i, f in enumerate(spec.fields):
        first[f.name] = len(fields)
        if f.ragged:
            fields += [i, i]
            kinds += [1, 2]
        else:
            fields.append(i)
            kinds.append(0)
    return fields, kinds, first
