"""The CUDA forms of the generated ops (the ``cuda`` modules of ``compiler_opt``'s embedding_op,
loop_op and row_op), checked without a GPU.

Each library is built with ``$STITCHREC_CUDA=1`` (nvcc compiles the device code for sm_80 /
sm_90 and links it in); the op then has a GPU and a CPU kernel. The device code itself runs
on the host through the launcher's ``on_host`` path (the same ``__host__ __device__``
``Element`` the GPU kernel calls), into outputs poisoned with NaN, and must equal the CPU
kernel: every method of the embedding op, forward and gradient, single-valued and ragged ids,
out-of-range ids and empty rows; every elementwise op of the loop ops. Running the GPU kernel
itself needs a GPU (``bench/compiler/cuda_check.py``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess

import numpy as np
import pytest
import tensorflow as tf  # tests/conftest.py sets TF_USE_LEGACY_KERAS first
from tensorflow.python.framework import kernels as tf_kernels

from compiler_opt import registry, toolchain, xy_op
from compiler_opt.embedding_op import cuda as emb_cuda
from compiler_opt.embedding_op import cuda_harness
from compiler_opt.embedding_op import gpu_kernels as emb_gpu
from compiler_opt.embedding_op import layer as emb_layer
from compiler_opt.embedding_op import ops as emb_ops
from compiler_opt.embedding_op import spec as emb_spec
from compiler_opt.loop_op import cpu as loop_cpu
from compiler_opt.loop_op import cuda as loop_cuda
from compiler_opt.loop_op import groups as loop_groups
from compiler_opt.loop_op import spec as loop_def
from embeddings.collection import EmbeddingCollection
from serving.model_version import kernel_devices
from tests.compiler_opt.conftest import need_compiler, share_kernels
from tests.compiler_opt.test_codegen import DENSE, TABLES, make_ids

GPU = "/job:localhost/replica:0/task:0/device:GPU:0"
CPU = "/job:localhost/replica:0/task:0/device:CPU:0"


def need_nvcc() -> None:
    """Skips without nvcc, unless ``STITCHREC_REQUIRE_NVCC`` is set (``.ci/run`` sets it where
    nvcc exists: there these tests must run)."""
    need_compiler()
    if toolchain.nvcc() is None:
        if os.environ.get("STITCHREC_REQUIRE_NVCC"):
            pytest.fail("STITCHREC_REQUIRE_NVCC is set but nvcc was not found")
        pytest.skip("no nvcc: the CUDA forms cannot be compiled here")


@pytest.fixture(scope="module")
def cuda(tmp_path_factory):
    """``$STITCHREC_CUDA=1`` and a fresh ``$STITCHREC_CACHE`` for this module, its kernels
    folder the suite's (``share_kernels``: a CUDA form has a cache key of its own)."""
    need_nvcc()
    old = {k: os.environ.get(k) for k in ("STITCHREC_CUDA", "STITCHREC_CACHE")}
    os.environ["STITCHREC_CUDA"] = "1"
    os.environ["STITCHREC_CACHE"] = str(share_kernels(tmp_path_factory.mktemp("cuda-cache")))
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def devices_of(op: str) -> set[str]:
    return {k.device_type for k in tf_kernels.get_registered_kernels_for_op(op).kernel}


def test_enabled_follows_the_environment(monkeypatch):
    monkeypatch.setenv("STITCHREC_CUDA", "0")
    assert toolchain.cuda_enabled() is False
    monkeypatch.setenv("STITCHREC_CUDA", "yes")
    with pytest.raises(ValueError, match=r"STITCHREC_CUDA must be '0', '1' or unset, got 'yes'"):
        toolchain.cuda_enabled()
    monkeypatch.setenv("STITCHREC_CUDA", "1")
    monkeypatch.setenv("NVCC", "/nonexistent/nvcc")
    with pytest.raises(toolchain.CompilerUnavailable, match="nvcc was not found"):
        toolchain.cuda_enabled()
    monkeypatch.delenv("STITCHREC_CUDA")
    monkeypatch.delenv("NVCC")
    if not tf.config.list_physical_devices("GPU"):
        assert toolchain.cuda_enabled() is False  # no GPU: CPU kernels only
    # with a GPU: built only when nvcc exists and the driver supports nvcc's runtime
    monkeypatch.setattr(toolchain, "_WARNED", set())
    gpu = [tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU")]
    monkeypatch.setattr(toolchain.tf.config, "list_physical_devices", lambda kind=None: gpu)
    monkeypatch.setattr(toolchain, "nvcc", lambda: "/opt/cuda/bin/nvcc")
    monkeypatch.setattr(toolchain, "nvcc_version", lambda path: 13000)
    monkeypatch.setattr(toolchain, "driver_version", lambda: 13000)
    assert toolchain.cuda_enabled() is True
    monkeypatch.setattr(toolchain, "driver_version", lambda: 12040)
    with pytest.warns(RuntimeWarning, match=r"CUDA 13\.0 but the driver supports CUDA 12\.4"):
        assert toolchain.cuda_enabled() is False
    monkeypatch.setattr(toolchain, "nvcc", lambda: None)
    with pytest.warns(RuntimeWarning, match="nvcc is not found"):
        assert toolchain.cuda_enabled() is False


def test_nvcc_version_is_read_from_its_banner():
    path = toolchain.nvcc()
    if path is None:
        pytest.skip("no nvcc")
    banner = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
    major, minor = banner.split("release ")[1].split(",")[0].split(".")
    assert toolchain.nvcc_version(path) == int(major) * 1000 + int(minor) * 10


# ----------------------------------------------------------------------------- loop ops

LOOP_SPECS = [
    # y = relu(x0 * b + s), z = sigmoid(x0 * b): row and scalar inputs, two outputs
    loop_def.LoopSpec(
        width=5,
        inputs=("full", "row", "scalar"),
        body=(("Mul", (0, 1)), ("AddV2", (3, 2)), ("Relu", (4,)), ("Sigmoid", (3,))),
        outputs=(2, 3),
    ),
    # every other op once, on two full inputs
    loop_def.LoopSpec(
        width=3,
        inputs=("full", "full"),
        body=(
            ("Sub", (0, 1)),
            ("RealDiv", (2, 1)),
            ("Maximum", (3, 0)),
            ("Minimum", (4, 1)),
            ("SquaredDifference", (5, 0)),
            ("Relu6", (6,)),
            ("Neg", (7,)),
            ("Square", (8,)),
            ("Tanh", (9,)),
            ("Exp", (10,)),
            ("Identity", (11,)),
            ("Add", (12, 0)),
            ("BiasAdd", (13, 1)),
            ("Sqrt", (11,)),  # of Exp's value: positive
            ("Rsqrt", (15,)),
        ),
        outputs=(12, 4, 14),
    ),
]


def test_every_elementwise_op_is_in_some_spec():
    used = {op for s in LOOP_SPECS for op, _ in s.body}
    assert used == set(xy_op.OPS)


@pytest.mark.parametrize("spec", LOOP_SPECS, ids=["row_scalar", "every_op"])
def test_loop_op_device_code_equals_the_cpu_kernel(cuda, spec):
    name = loop_groups.load(spec)
    assert registry.has_gpu_kernel(name)
    assert devices_of(name) == {"CPU", "GPU"}
    rng = np.random.default_rng(0)
    rows = 37
    size = {"full": (rows, spec.width), "row": (spec.width,), "scalar": (1,)}
    # away from 0 so that RealDiv stays finite; both signs so that Relu / Maximum branch
    xs = [
        (rng.uniform(0.5, 2.0, size[k]) * rng.choice([-1, 1], size[k])).astype(np.float32)
        for k in spec.inputs
    ]
    cpu = registry.op_function(name)([tf.constant(x) for x in xs], M=len(spec.outputs))
    host = loop_cuda.run_loop_on_host(loop_groups.library_path(spec), spec, xs, rows)
    for want, got in zip(cpu, host, strict=True):
        assert not np.isnan(got).any()  # every element written
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-6, atol=1e-7)


def test_a_loop_op_with_its_matmul_has_no_cuda_form():
    spec = loop_def.LoopSpec(
        width=4,
        inputs=("full", "full"),
        body=(("AddV2", (0, 1)),),
        outputs=(0,),
        dims=(4,),
        matmul=(0, 3, True),
    )
    assert "matmul" in loop_cuda.loop_unsupported(spec)
    with pytest.raises(ValueError, match="no CUDA form"):
        loop_cuda.loop_source(spec)


# ------------------------------------------------------------------------- embedding op

CUDA_TABLES = [{**t, "name": f"cu_{t['name']}"} for t in TABLES if t.get("method") != "amtl"]


def _ids(seed: int, batch: int) -> dict[str, tf.Tensor]:
    ids = make_ids(seed, batch)
    return {f"cu_{k}": v for k, v in ids.items() if f"cu_{k}" in {t["name"] for t in CUDA_TABLES}}


def _id_arrays(spec: emb_spec.KernelSpec, ids: dict[str, tf.Tensor]) -> list[np.ndarray]:
    out = []
    for f in spec.fields:
        x = ids[f.name]
        out += [x.values.numpy(), x.row_splits.numpy()] if f.ragged else [x.numpy()]
    return out


@pytest.fixture(scope="module")
def cuda_block(cuda):
    """Every method but AMTL's training form (full, hashing, QR x3, BH x2, ragged mean/sum)
    with dense columns, compiled with its CUDA form."""
    tf.keras.utils.set_random_seed(1)
    coll = EmbeddingCollection(CUDA_TABLES, name="cuda_block")
    ids = _ids(0, 7)
    coll(ids)
    block, kernel = emb_layer.fused_block(coll, ids, dense_dim=DENSE)
    return block, kernel


@pytest.mark.parametrize(("seed", "batch"), [(0, 7), (1, 300), (2, 1)])
def test_embedding_device_code_equals_the_cpu_kernel(cuda_block, seed, batch):
    block, kernel = cuda_block
    spec = kernel.spec
    assert kernel.gpu and emb_ops.gpu_fallback(kernel, [GPU]) == ""
    assert devices_of(kernel.forward_name) == {"CPU", "GPU"}
    assert devices_of(kernel.gradient_name) == {"CPU", "GPU"}
    ids = _ids(seed, batch)
    rng = np.random.default_rng(seed)
    dense = rng.normal(size=(batch, DENSE)).astype(np.float32)
    tables = [v.numpy() for v in block.variables]
    arrays = _id_arrays(spec, ids)
    lib = kernel.library.path

    want = emb_layer.fused_concat(block, kernel, ids, tf.constant(dense)).numpy()
    got = emb_gpu.run_embedding_on_host(lib, spec, tables, arrays, dense=dense)
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)

    dy = rng.normal(size=want.shape).astype(np.float32)
    grad = kernel._fn(kernel.gradient_name)(
        tables=[v.handle for v in block.variables],
        ids=[tf.constant(x) for x in arrays],
        dy=tf.constant(dy),
    )
    rows, values = emb_gpu.run_embedding_on_host(lib, spec, tables, arrays, dy=dy)
    for t in range(len(spec.tables)):
        np.testing.assert_array_equal(rows[t], grad[0][t].numpy())
        assert not np.isnan(values[t]).any()
        np.testing.assert_allclose(values[t], grad[1][t].numpy(), rtol=1e-6, atol=1e-7)


def test_embedding_device_code_with_hand_checked_values(cuda_block):
    """The full field (rows ``10 r + j``) and the ragged mean field (rows ``100 r + j``) of the
    block, values by hand: an out-of-range id reads row 0, an empty row is zeros."""
    block, kernel = cuda_block
    spec = kernel.spec
    assert [f.name for f in spec.fields[:2]] == ["cu_full", "cu_tags"]
    assert not spec.fields[0].ragged and spec.fields[1].combiner == "mean"
    full, tags = block.variables[:2]
    assert full.shape == (50, 4) and tags.shape == (40, 4)
    full.assign((10 * np.arange(50)[:, None] + np.arange(4)).astype(np.float32))
    tags.assign((100 * np.arange(40)[:, None] + np.arange(4)).astype(np.float32))
    ids = _ids(4, 3)
    ids["cu_full"] = tf.constant([1, 70, 3], tf.int64)  # 70 is out of range: row 0
    ids["cu_tags"] = tf.RaggedTensor.from_row_lengths(
        tf.constant([0, 2, 2], tf.int64), tf.constant([2, 0, 1], tf.int64)
    )
    tables = [v.numpy() for v in block.variables]
    dense = np.arange(3 * DENSE, dtype=np.float32).reshape(3, DENSE)
    got = emb_gpu.run_embedding_on_host(
        kernel.library.path, spec, tables, _id_arrays(spec, ids), dense=dense
    )
    want = [  # row 0 of tags: the mean of rows 0 and 2
        [10, 11, 12, 13, 100, 101, 102, 103],
        [0, 1, 2, 3, 0, 0, 0, 0],
        [30, 31, 32, 33, 200, 201, 202, 203],
    ]
    np.testing.assert_array_equal(got[:, :8], np.array(want, np.float32))
    np.testing.assert_array_equal(got[:, -DENSE:], dense)


@pytest.fixture(scope="module")
def amtl(cuda):
    """Two AMTL fields (one ragged) over 40 rows with ids in and out of range, and the op of
    their training form (its masks computed in the op: no CUDA form), compiled once."""
    n = 40
    tf.keras.utils.set_random_seed(2)
    coll = EmbeddingCollection(
        [
            {"name": "cu_a", "num_rows": n, "dim": 4, "method": "amtl"},
            {"name": "cu_a_tags", "num_rows": n, "dim": 4, "method": "amtl", "combiner": "mean"},
        ],
        counts={k: list(range(n, 0, -1)) for k in ("cu_a", "cu_a_tags")},
        name="cuda_amtl",
    )
    rng = np.random.default_rng(3)
    lens = rng.integers(0, 4, 9)
    ids = {
        "cu_a": tf.constant(rng.integers(-3, n + 9, 9), tf.int64),
        "cu_a_tags": tf.RaggedTensor.from_row_lengths(
            tf.constant(rng.integers(-2, n + 5, int(lens.sum())), tf.int64),
            tf.constant(lens, tf.int64),
        ),
    }
    coll(ids)
    block = emb_spec.build_spec(coll, ids)
    return n, coll, ids, block, emb_ops.load(block.spec), rng


def test_tabulated_masks_and_int64_compact_tables_have_a_cuda_form(amtl):
    """AMTL's serving forms: the op reading tabulated masks (``mask_rows``), and the compact
    form (values + row offsets) when its offsets are int64."""
    n, coll, ids, block, training, rng = amtl
    assert not training.gpu and "wheres" in emb_cuda.embedding_unsupported(block.spec)
    assert devices_of(training.forward_name) == {"CPU"}

    rows = emb_ops.load(dataclasses.replace(block.spec, mask_rows=True))
    assert rows.gpu and devices_of(rows.forward_name) == {"CPU", "GPU"}
    masks = [rng.uniform(0, 1, (n, 4)).astype(np.float32) for _ in range(2)]
    arrays = _id_arrays(rows.spec, ids)
    want = rows(block.variables, [tf.constant(x) for x in arrays], [tf.constant(m) for m in masks])
    got = emb_gpu.run_embedding_on_host(
        rows.library.path, rows.spec, [v.numpy() for v in block.variables], arrays, masks
    )
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6, atol=1e-7)

    serving = emb_layer.FusedEmbeddingCollection.from_collection(coll.serving_form())
    serving(ids)
    compact = serving.kernel
    assert "int32" in emb_cuda.embedding_unsupported(compact.spec)
    assert "has no GPU kernel" in emb_ops.gpu_fallback(compact, [GPU])
    assert emb_ops.gpu_fallback(compact, [CPU]) == ""
    wide = dataclasses.replace(
        compact.spec,
        tables=tuple(
            dataclasses.replace(t, dtype="int64") if t.dtype == "int32" else t
            for t in compact.spec.tables
        ),
    )
    kernel = emb_ops.load(wide)
    assert kernel.gpu
    variables = [
        tf.Variable(tf.cast(v, tf.int64)) if v.dtype == tf.int32 else v
        for v in _compact_variables(serving)
    ]
    arrays = _id_arrays(wide, ids)
    want = kernel(variables, [tf.constant(x) for x in arrays]).numpy()
    got = emb_gpu.run_embedding_on_host(
        kernel.library.path, wide, [v.numpy() for v in variables], arrays
    )
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(
        want, tf.concat(list(coll(ids).fields().values()), axis=1).numpy()
    )  # the same values as the training layers


def _compact_variables(fused: emb_layer.FusedEmbeddingCollection) -> list[tf.Variable]:
    ids = {
        f.name: tf.constant([0], tf.int64)
        if not f.ragged
        else tf.RaggedTensor.from_row_lengths(tf.constant([0], tf.int64), [1])
        for f in fused.kernel.spec.fields
    }
    return emb_spec.build_spec(fused, ids).variables


def test_a_version_whose_op_has_no_gpu_kernel_is_served_on_the_cpu(amtl):
    kernel = amtl[4]  # AMTL's training form: CPU only
    devices, note = kernel_devices([kernel.forward_name], [GPU, GPU.replace("GPU:0", "GPU:1")])
    assert devices == ["/device:CPU:0"]
    assert "served on the CPU" in note and kernel.forward_name in note and "wheres" in note
    assert kernel_devices([kernel.forward_name], [CPU]) == ([CPU], "")


def test_the_cuda_form_has_its_own_cache_entry_and_nvcc_errors_are_reported(cuda, tmp_path):
    spec = LOOP_SPECS[0]
    # in the module's cache: the CUDA form is the library the row_scalar loop test loaded, under
    # a key of its own (the CPU form's key: the hash of its source alone)
    plain_key = toolchain.cxx_toolchain().key(loop_cpu.generate(spec))
    with_cuda = toolchain.compile_kernel(
        loop_cpu.generate(spec, cuda=True), cuda_source=loop_cuda.loop_source(spec)
    )
    assert plain_key != with_cuda.key and with_cuda.path.exists()
    assert str(with_cuda.path) == loop_groups.library_path(spec)
    # built in a folder of its own whatever the suite's folder holds: nvcc, then the link with
    # CUDA's static runtime (not loaded: its op is registered already, by the library above)
    fresh = toolchain.compile_kernel(
        loop_cpu.generate(spec, cuda=True),
        tmp_path / "fresh",
        cuda_source=loop_cuda.loop_source(spec),
    )
    assert fresh.compiled and fresh.key == with_cuda.key
    assert fresh.path.parent == tmp_path / "fresh" and fresh.path.stat().st_size > 0
    with pytest.raises(toolchain.CudaUnavailable, match=r"nvcc failed .*\.cu"):
        toolchain.compile_kernel(
            loop_cpu.generate(spec, cuda=True), tmp_path, cuda_source="this is not CUDA"
        )
    assert not list(tmp_path.glob("tmp*.so"))  # no half-written library left behind


def test_the_gpu_check_harness_builds_and_runs_its_host_part(cuda_block, tmp_path):
    """The standalone check harness of a spec (``embedding_op.cuda_harness``, written by
    ``bench/compiler/cuda_check``): it builds with nvcc and runs the device code on the host
    (on a GPU it also runs and times the kernels)."""
    _, kernel = cuda_block
    (tmp_path / "k.cu").write_text(emb_cuda.embedding_source(kernel.spec))
    (tmp_path / "h.cu").write_text(cuda_harness.harness_source(kernel.spec, "test"))
    exe = tmp_path / "check"
    tc = toolchain.cuda_toolchain()
    flags = [f for f in tc.flags if f not in ("-Xcompiler", "-fPIC")]
    build = subprocess.run(
        [tc.nvcc, *flags, "-o", str(exe), str(tmp_path / "h.cu"), str(tmp_path / "k.cu")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    run = subprocess.run(
        [str(exe), "33", "1", "--host-only"], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == {"method": "test", "batch": 33, "host_only": True}
