"""compiler_opt.embedding_op: generated C++ kernels against the embedding layers they replace.

Every covered method (full, hashing, QR mult/add/concat, BH sum/concat with both splits,
AMTL's mask), single-valued and ragged ids (mean and sum pooling), out-of-range ids, and the
dense columns: outputs and gradients (tables as IndexedSlices, AMTL's MLPs through the mask,
the dense input) within 1e-5 of the plain Keras layers. One spec is compiled once, into a
temporary ``STITCHREC_CACHE`` whose kernels folder is the suite's (``share_kernels``).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf  # tests/conftest.py sets TF_USE_LEGACY_KERAS first

from compiler_opt import toolchain, xy_op
from compiler_opt.embedding_op import assets as emb_assets
from compiler_opt.embedding_op import layer as emb_layer
from compiler_opt.embedding_op import ops as emb_ops
from compiler_opt.embedding_op import spec as emb_spec
from embeddings.collection import EmbeddingCollection
from embeddings.forms import Form
from tests.compiler_opt.conftest import need_compiler, share_kernels

ROOT = Path(__file__).resolve().parents[2]
B = 7
TABLES = [
    {"name": "full", "num_rows": 50, "dim": 4},
    {"name": "tags", "num_rows": 40, "dim": 4},  # ragged, mean
    {"name": "tags_sum", "num_rows": 30, "dim": 3, "combiner": "sum"},  # ragged, sum
    {
        "name": "hash",
        "num_rows": 1000,
        "dim": 4,
        "method": "hashing",
        "options": {"buckets": 17, "seed": 3},
    },
    {
        "name": "hash_closed",
        "num_rows": 100,
        "dim": 2,
        "method": "hashing",
        "options": {"buckets": 9, "open_vocabulary": False},
    },
    {"name": "qr_mult", "num_rows": 100, "dim": 4, "method": "qr", "options": {"collisions": 7}},
    {
        "name": "qr_add",
        "num_rows": 100,
        "dim": 4,
        "method": "qr",
        "options": {"collisions": 9, "operation": "add"},
    },
    {
        "name": "qr_concat",
        "num_rows": 100,
        "dim": 4,
        "method": "qr",
        "options": {"collisions": 7, "operation": "concat"},
    },
    {"name": "bh_sum", "num_rows": 300, "dim": 4, "method": "bh", "options": {"block_bits": 3}},
    {
        "name": "bh_concat",
        "num_rows": 300,
        "dim": 4,
        "method": "bh",
        "options": {"block_bits": 5, "fusion": "concat", "split": "skip", "code_bits": 10},
    },
    {"name": "amtl", "num_rows": 60, "dim": 4, "method": "amtl"},
    {"name": "amtl_tags", "num_rows": 60, "dim": 4, "method": "amtl", "combiner": "sum"},
]
RAGGED = {"tags", "tags_sum", "amtl_tags"}
DENSE = 3


def make_ids(seed: int, batch: int = B) -> dict[str, tf.Tensor]:
    """Ids with out-of-range values (negative, >= num_rows) and empty ragged rows."""
    rng = np.random.default_rng(seed)
    ids: dict[str, tf.Tensor] = {}
    for t in TABLES:
        n = t["num_rows"]
        if t["name"] in RAGGED:
            lens = rng.integers(0, 4, batch)
            lens[0] = 0
            vals = rng.integers(-3, n + 20, int(lens.sum()))
            ids[t["name"]] = tf.RaggedTensor.from_row_lengths(
                tf.constant(vals, tf.int64), tf.constant(lens, tf.int64)
            )
        else:
            ids[t["name"]] = tf.constant(rng.integers(-3, 3 * n, batch), tf.int64)
    return ids


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A fresh STITCHREC_CACHE for this module (restored afterwards), its kernels folder the
    suite's: a library of the same source and toolchain is compiled once."""
    d = share_kernels(tmp_path_factory.mktemp("stitchrec-cache"))
    old = os.environ.get("STITCHREC_CACHE")
    os.environ["STITCHREC_CACHE"] = str(d)
    yield d
    if old is None:
        os.environ.pop("STITCHREC_CACHE", None)
    else:
        os.environ["STITCHREC_CACHE"] = old


@pytest.fixture(scope="module")
def block(cache):
    """A built collection of every covered method, its spec and the loaded kernel."""
    need_compiler()
    tf.keras.utils.set_random_seed(0)
    counts = {n: (np.arange(60)[::-1] * 3).tolist() for n in ("amtl", "amtl_tags")}
    coll = EmbeddingCollection(TABLES, counts=counts, name="block")
    ids = make_ids(0)
    coll(ids)
    # AMTL lengths below dim for some ids: non-trivial masks (the last layer starts at zero)
    for name in ("amtl", "amtl_tags"):
        layer = coll.layers_by_field[name]
        for mlp in (layer.h_aml, layer.l_aml):
            k = mlp[-1].kernel
            k.assign(tf.random.stateless_normal(k.shape, seed=[1, 2]) * 3.0)
    spec_block, kernel = emb_layer.fused_block(coll, ids, dense_dim=DENSE)
    return coll, spec_block, kernel


def reference_and_fused(coll, spec_block, kernel, ids, dense, jit_fn=False):
    w = tf.constant(np.random.default_rng(5).normal(size=(B, 4 * 12 + DENSE)), tf.float32)

    def run():
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(dense)
            ref = tf.concat([*coll(ids).fields().values(), dense], axis=1)
            fused = emb_layer.fused_concat(spec_block, kernel, ids, dense)
            wr = w[:, : ref.shape[1]]
            lr, lf = tf.reduce_sum(ref * wr), tf.reduce_sum(fused * wr)
        sources = [*coll.trainable_variables, dense]
        return ref, fused, tape.gradient(lr, sources), tape.gradient(lf, sources)

    return tf.function(run)() if jit_fn else run()


def test_spec_covers_every_method_and_lays_out_columns(block):
    coll, spec_block, kernel = block
    spec = spec_block.spec
    assert spec_block.uncovered == {}
    assert [f.name for f in spec.fields] == coll.field_names
    assert [f.offset for f in spec.fields] == list(np.cumsum([0, *coll.dims[:-1]]))
    assert spec.emb_dim == sum(coll.dims) and spec.out_dim == sum(coll.dims) + DENSE
    by = {f.name: f for f in spec.fields}
    assert by["tags"].ragged and by["tags"].combiner == "mean"
    assert len(by["qr_mult"].tables) == 2 and by["bh_sum"].rows_per_id == 4  # ceil(10 bits / 3)
    assert [f.name for f in spec.masked_fields] == ["amtl", "amtl_tags"]
    src = kernel.source
    assert src.startswith("// Generated by stitchrec") and kernel.forward_name in src
    assert "lock_shared" in src and "LookupResource" in src  # tables through handles, locked
    assert "ParallelFor" in src
    lib = kernel.library.path
    assert lib.parent == Path(os.environ["STITCHREC_CACHE"]) / "compiler_opt" / "kernels"
    assert lib.name == f"{kernel.library.key}.so" and lib.exists()


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_outputs_and_gradients_match_the_layers(block, graph):
    coll, spec_block, kernel = block
    ids = make_ids(1)
    dense = tf.constant(np.random.default_rng(2).normal(size=(B, DENSE)), tf.float32)
    ref, fused, g_ref, g_fused = reference_and_fused(coll, spec_block, kernel, ids, dense, graph)
    np.testing.assert_allclose(fused.numpy(), ref.numpy(), atol=1e-5, rtol=0)
    assert fused.shape == (B, spec_block.spec.out_dim)
    names = [v.name for v in coll.trainable_variables] + ["dense"]
    tables = {id(v) for v in spec_block.variables}
    checked = 0
    for v, name, a, b in zip([*coll.trainable_variables, None], names, g_fused, g_ref, strict=True):
        assert a is not None, name
        if v is not None and id(v) in tables:
            assert isinstance(a, tf.IndexedSlices), name  # sparse updates
        a = tf.convert_to_tensor(a).numpy()
        b = np.zeros_like(a) if b is None else tf.convert_to_tensor(b).numpy()
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0, err_msg=name)
        checked += float(np.abs(b).max() > 0)
    assert checked >= len(names) - 2  # nearly every gradient is non-zero: a real check


def test_the_planner_puts_every_lookup_in_its_concat_group(block, hand):
    coll, _, _ = block
    dense = tf.zeros([B, DENSE])
    fields, summary = emb_layer.planned_fields(coll, make_ids(9), dense, hand, batch=B)
    assert fields == coll.field_names
    assert summary["concat_groups"] >= 1 and summary["fields_planned"] == len(TABLES)
    sub = emb_spec.build_spec(coll, make_ids(9), fields=fields[:3])
    assert [f.name for f in sub.spec.fields] == fields[:3]
    assert set(sub.uncovered) == set(fields[3:])
    assert all(r == "not in the planned concat group" for r in sub.uncovered.values())


def test_a_batch_of_several_tiles_and_shards(block):
    """300 examples: several tiles of the forward op, split over the thread pool."""
    coll, spec_block, kernel = block
    ids = make_ids(10, batch=300)
    dense = tf.constant(np.random.default_rng(3).normal(size=(300, DENSE)), tf.float32)
    ref = tf.concat([*coll(ids).fields().values(), dense], axis=1)
    got = emb_layer.fused_concat(spec_block, kernel, ids, dense)
    np.testing.assert_allclose(got.numpy(), ref.numpy(), atol=1e-5, rtol=0)


def test_masks_are_not_trivial(block):
    coll, _, _ = block
    lengths = coll.layers_by_field["amtl"].lengths()
    assert lengths.min() < 4  # some ids are masked: the mask path is exercised


def test_hand_checked_values(block):
    """Full row read, OOV to row 0, ragged mean with an empty row, dense copy."""
    coll, spec_block, kernel = block
    ids = make_ids(3)
    ids["full"] = tf.constant([1, -1, 50, 49, 0, 7, 1000], tf.int64)
    ids["tags"] = tf.RaggedTensor.from_row_lengths(
        tf.constant([2, 3, 5, 100], tf.int64), tf.constant([0, 2, 1, 1, 0, 0, 0], tf.int64)
    )
    dense = tf.reshape(tf.range(B * DENSE, dtype=tf.float32), [B, DENSE])
    y = emb_layer.fused_concat(spec_block, kernel, ids, dense).numpy()
    full = coll.layers_by_field["full"].table.numpy()
    tags = coll.layers_by_field["tags"].table.numpy()
    np.testing.assert_array_equal(y[:, 0:4], full[[1, 0, 0, 49, 0, 7, 0]])
    np.testing.assert_array_equal(y[0, 4:8], 0.0)  # an empty row: zeros, not NaN
    np.testing.assert_allclose(y[1, 4:8], (tags[2] + tags[3]) / 2, atol=1e-7)
    np.testing.assert_array_equal(y[3, 4:8], tags[0])  # 100 >= num_rows: the OOV row
    np.testing.assert_array_equal(y[:, -DENSE:], dense.numpy())


def test_training_step_with_sparse_updates(block):
    """SGD on the fused op's IndexedSlices moves the same rows as on the layers' gradients."""
    coll, spec_block, kernel = block
    ids = make_ids(4)
    dense = tf.zeros([B, DENSE])
    before = [v.numpy() for v in spec_block.variables]
    opt = tf.keras.optimizers.SGD(0.5)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(emb_layer.fused_concat(spec_block, kernel, ids, dense)))
    grads = tape.gradient(loss, spec_block.variables)
    with tf.GradientTape() as tape:
        ref = tf.reduce_sum(tf.square(tf.concat([*coll(ids).fields().values(), dense], axis=1)))
    ref_grads = tape.gradient(ref, spec_block.variables)
    np.testing.assert_allclose(loss.numpy(), ref.numpy(), rtol=1e-6)
    opt.apply_gradients(zip(grads, spec_block.variables, strict=True))
    for v, b0, g in zip(spec_block.variables, before, ref_grads, strict=True):
        np.testing.assert_allclose(v.numpy(), b0 - 0.5 * tf.convert_to_tensor(g).numpy(), atol=1e-5)
        v.assign(b0)


def test_cache_is_reused_and_keyed_by_source(block):
    _, spec_block, kernel = block
    again = toolchain.compile_kernel(kernel.source)
    assert not again.compiled and again.path == kernel.library.path
    assert emb_ops.load(spec_block.spec) is kernel  # once per process
    other = toolchain.cxx_toolchain().key(kernel.source + "\n// changed")
    assert other != kernel.library.key


def test_the_precompiled_header_is_keyed_by_the_toolchain(block, tmp_path, monkeypatch):
    """``$STITCHREC_CXX_PCH`` (set by the tests' conftest): one header per toolchain and flags,
    holding only headers that every generated source includes itself."""
    _, _, kernel = block
    tc = toolchain.cxx_toolchain()
    header = toolchain.precompiled_header(tc)
    text = "".join(f"#include {h}\n" for h in toolchain.PCH_HEADERS)
    assert header.parent == Path(os.environ[toolchain.PCH_ENV]) / tc.key(text)
    assert header.read_text() == text and header.with_name(f"{header.name}.gch").stat().st_size
    head = "\n".join(xy_op.xy_op_head("X", [], [], []))
    for h in toolchain.PCH_HEADERS:
        assert f"#include {h}" in kernel.source and f"#include {h}" in head
    flags = toolchain._compile_only(tc.flags)
    assert "-shared" not in flags and [f for f in tc.flags if f in flags] == flags
    monkeypatch.setenv(toolchain.PCH_ENV, str(tmp_path))
    bad = dataclasses.replace(tc, flags=(*tc.flags, "-fno-such-flag"))
    with pytest.raises(toolchain.CompilerUnavailable, match="on the precompiled header"):
        toolchain.precompiled_header(bad)
    assert not list(tmp_path.glob("*/*.gch")) and not list(tmp_path.glob("*/*.tmp"))
    monkeypatch.delenv(toolchain.PCH_ENV)
    assert toolchain.precompiled_header(tc) is None


def test_bad_inputs_raise_errors_naming_them(block):
    _, spec_block, kernel = block
    ids = make_ids(6)
    ids["full"] = tf.constant([1, 2, 3], tf.int64)  # batch 3, the others 7
    with pytest.raises(tf.errors.InvalidArgumentError, match="batch"):
        emb_layer.fused_concat(spec_block, kernel, ids, tf.zeros([B, DENSE]))
    with pytest.raises(ValueError, match="dense"):
        emb_layer.fused_concat(spec_block, kernel, make_ids(6), None)


def test_uncovered_fields_are_reported_and_run_unfused(cache):
    need_compiler()
    tf.keras.utils.set_random_seed(1)
    tables = [
        {"name": "a", "num_rows": 20, "dim": 3},
        {"name": "l2", "num_rows": 20, "dim": 3, "l2": 0.1},
        {"name": "grid", "num_rows": 20, "dim": 3},
    ]
    plain = EmbeddingCollection(tables, name="mixed")
    ids = {
        "a": tf.constant([1, 2], tf.int64),
        "l2": tf.constant([3, 4], tf.int64),
        "grid": tf.constant([[1, 2], [3, 4]], tf.int64),  # dense rank 2: not covered
    }
    ref = plain(ids).fields()
    fused = emb_layer.FusedEmbeddingCollection.from_collection(plain, output_form="concat")
    with pytest.warns(RuntimeWarning, match="left unfused"):
        out = fused(ids).fields()
    assert set(fused.uncovered) == {"l2", "grid"}
    assert "l2=0.1" in fused.uncovered["l2"] and "shape" in fused.uncovered["grid"]
    assert list(out) == ["a", "l2", "grid"]  # per field when some fields stay unfused
    for k in ref:
        np.testing.assert_allclose(out[k].numpy(), ref[k].numpy(), atol=1e-6)
    assert fused.losses  # the l2 field still adds its penalty
    # the covered field alone: one op, the concat form, no warning (and the same kernel: the
    # spec holds shapes and rules, not variable names)
    alone = EmbeddingCollection(tables[:1], name="alone")
    only = emb_layer.FusedEmbeddingCollection.from_collection(alone)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        out = only({"a": ids["a"]})
    assert out.form == Form.CONCAT and out.vectors is None and only.kernel is fused.kernel
    want = alone({"a": ids["a"]}).fields()["a"].numpy()
    np.testing.assert_array_equal(out.block.numpy(), want)


def test_without_a_compiler_warns_and_runs_unfused(cache, monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    monkeypatch.setattr(toolchain, "_TOOLCHAIN", None)
    tf.keras.utils.set_random_seed(2)
    plain = EmbeddingCollection([{"name": "x", "num_rows": 13, "dim": 5}], name="nocc")
    ids = {"x": tf.constant([1, 2, 30], tf.int64)}
    ref = plain(ids).fields()
    fused = emb_layer.FusedEmbeddingCollection.from_collection(plain)
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler"):
        out = fused(ids).fields()
    assert fused.kernel is None and "CXX" in fused.fallback_reason
    np.testing.assert_array_equal(out["x"].numpy(), ref["x"].numpy())
    monkeypatch.setattr(toolchain, "_TOOLCHAIN", None)


def test_saved_model_loads_in_a_fresh_process_after_the_library(block, tmp_path):
    coll, spec_block, kernel = block
    ids = make_ids(7)
    dense = tf.ones([B, DENSE])

    class Serve(tf.Module):
        def __init__(self):
            super().__init__()
            self.variables_ = list(spec_block.variables)
            self.coll = coll

        @tf.function
        def __call__(self):
            return emb_layer.fused_concat(spec_block, kernel, ids, dense)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def serve(self, x):
            return {"out": tf.reduce_sum(self(), axis=1) + tf.reduce_sum(x) * 0.0}

    m = Serve()
    want = m().numpy()
    path = tmp_path / "sm"
    tf.saved_model.save(m, str(path), signatures={"serving_default": m.serve})
    emb_assets.write_saved_model_assets(path, [kernel])
    np.save(tmp_path / "want.npy", want)
    script = (
        "import sys, numpy as np\n"
        "from pathlib import Path\n"
        "import pipelines\n"
        "import tensorflow as tf\n"
        "from compiler_opt.embedding_op import assets as emb_assets\n"
        "from serving.model_version import ModelVersion\n"
        "mv = ModelVersion('m', 1, Path(sys.argv[1]), ['/CPU:0']).load()  # the server loads the op\n"
        "out = mv.run(0, {'x': np.ones(3, np.float32)})['out']\n"
        "assert np.abs(out - np.load(sys.argv[2]).sum(1)).max() <= 1e-5, 'server differs'\n"
        "print('server', mv.kernels)\n"
        "names = emb_assets.load_for_saved_model(sys.argv[1])\n"
        "m = tf.saved_model.load(sys.argv[1])\n"
        "got = m().numpy()\n"
        "assert np.abs(got - np.load(sys.argv[2])).max() <= 1e-6, 'outputs differ'\n"
        "print('ok', names)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", script, str(path), str(tmp_path / "want.npy")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ),
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"ok ['{kernel.forward_name}']" in r.stdout
    assert f"server ['{kernel.forward_name}']" in r.stdout
    # a SavedModel without generated ops has nothing to load
    assert emb_assets.load_for_saved_model(tmp_path) == []
