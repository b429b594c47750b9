"""``stitchrec fuse explain`` on a real exported model, and its errors."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from compiler_opt import cost
from compiler_opt.embedding_op import layer as emb_layer
from pipelines import cli
from tests.compiler_opt.conftest import share_kernels

ROOT = Path(__file__).resolve().parents[2]


def _seed_cache(tmp_path, monkeypatch, hand) -> None:
    """A calibration file for this device with the hand coefficients (no measuring), in a
    fresh ``$STITCHREC_CACHE`` whose kernels folder is the suite's (``share_kernels``)."""
    monkeypatch.setenv("STITCHREC_CACHE", str(share_kernels(tmp_path / "cache")))
    key = cost.device_key()
    cost.save(
        cost.Coefficients(key, hand.launch_s, hand.bandwidth, hand.gather_row_s, 1e9),
        cost.calibration_path(),
    )


def test_explain_prints_and_writes_the_plan(tiny_saved_model, tmp_path, monkeypatch, capsys, hand):
    _seed_cache(tmp_path, monkeypatch, hand)
    out = tmp_path / "plan.json"
    rc = cli.main(["fuse", "explain", str(tiny_saved_model), "--batch", "512", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "[serving_default]" in text and "fusion plan at batch 512" in text
    assert "kernel launches" in text and "bytes moved" in text and "B/example" in text
    assert "concat" in text  # the lookups, pools and concat of the embeddings: one group
    # as served: the cross layer's Mul + AddV2 has a generated form; its BiasAdd and the MLP's
    # BiasAdd + Relu stay with their matmuls; a group with IsFinite has none, and why
    assert "served with --fuse-realization generated" in text
    assert "matmul epilogues left to the matmul: 3" in text
    assert "  loop Mul, AddV2: generated" in text
    assert "  loop StridedSlice, AddV2, Sigmoid: generated" in text  # the head: logits[:, 0] + b
    assert "op IsFinite has no generated form" in text
    assert "on a GPU with nvcc (CUDA forms): 2 of 2 generated loop/row ops, 0 of 0" in text
    plan = json.loads(out.read_text())
    s = plan["summary"]
    assert s["batch"] == 512 and s["launches_after"] < s["launches_before"]
    assert s["bytes_after"] < s["bytes_before"]
    kinds = {g["kind"] for g in plan["groups"]}
    assert "concat" in kinds and "loop" in kinds
    for g in plan["groups"]:
        assert g["launches_after"] == 1 and g["arguments"] <= 64


def test_explain_errors_name_the_problem(tiny_saved_model, tmp_path, monkeypatch, capsys, hand):
    _seed_cache(tmp_path, monkeypatch, hand)
    assert cli.main(["fuse", "explain", str(tmp_path)]) == 2
    assert "is not a SavedModel: it has no saved_model.pb" in capsys.readouterr().err
    assert cli.main(["fuse", "explain", str(tiny_saved_model), "--signature", "rank"]) == 2
    err = capsys.readouterr().err
    assert "signature 'rank' is not in SavedModel" in err and "serving_default" in err
    assert cli.main(["fuse", "explain", str(tiny_saved_model), "--batch", "0"]) == 2
    assert "--batch must be >= 1, got 0" in capsys.readouterr().err


def test_explain_runs_as_a_command(tiny_saved_model, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "fuse", "explain", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "STITCHREC_CACHE": str(tmp_path / "cache")},
        timeout=120,
    )
    assert proc.returncode == 2
    assert "error: SavedModel path" in proc.stderr and "is not a folder" in proc.stderr


def test_explain_names_the_embedding_ops_without_a_cuda_form():
    """AMTL's compact serving form reads int32 row offsets: no CUDA form, so on a GPU that
    version serves on the CPU, and ``fuse explain`` says so."""
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2

    from embeddings.collection import EmbeddingCollection
    from pipelines import fuse
    from tests.compiler_opt.conftest import need_compiler

    need_compiler()
    coll = EmbeddingCollection(
        [{"name": "fx_a", "num_rows": 12, "dim": 4, "method": "amtl"}],
        counts={"fx_a": list(range(12, 0, -1))},
        name="fx",
    )
    ids = {"fx_a": tf.constant([1, 5, 40], tf.int64)}
    coll(ids)
    fused = emb_layer.FusedEmbeddingCollection.from_collection(coll.serving_form())
    fused(ids)
    graph_def = graph_pb2.GraphDef()
    graph_def.node.add(name="emb", op=fused.kernel.forward_name)
    lines = fuse._cuda_forms(graph_def, 3)
    assert lines[0].endswith("3 of 3 generated loop/row ops, 0 of 1 embedding ops")
    assert fused.kernel.forward_name in lines[1] and "int32 tables" in lines[1]


def test_explain_floor_counts_the_models_matmuls_and_measures_each_unit(
    tiny_saved_model, tmp_path, monkeypatch, capsys, hand
):
    """``--floor``: the frozen signature's FLOPs are the 2 * batch * in * out of every Dense
    kernel of the model (the cross layer's, the tower's, the head's), read from the variables;
    with a seeded peak the floor is the sum of the units' rooflines; every unit is timed."""
    import tensorflow as tf

    from compiler_opt import floor

    _seed_cache(tmp_path, monkeypatch, hand)
    peak = floor.Peak(cost.device_key("/CPU:0"), 5e9, 2, 256, {"fma256_flops": 5e9})
    floor.peak_path().write_text(json.dumps(dataclasses.asdict(peak)))
    out = tmp_path / "plan.json"
    argv = ["fuse", "explain", str(tiny_saved_model), "--batch", "64", "--floor"]
    assert cli.main([*argv, "--floor-calls", "2", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "floor at batch 64: peak 5.0 GFLOP/s (FP32 FMA, measured), bandwidth 1.0 GB/s" in text
    assert "MatMul cross_0/dense" in text and "x the floor" in text
    loaded = tf.saved_model.load(str(tiny_saved_model))
    variables = loaded.signatures["serving_default"].variables
    kernels = [v.shape for v in variables if v.name.endswith("kernel:0") and len(v.shape) == 2]
    assert len(kernels) == 3
    report = json.loads(out.read_text())["floor"]
    assert report["flops"] == sum(2 * 64 * a * b for a, b in kernels)
    units = report["units"]
    assert report["floor_s"] == pytest.approx(sum(u["floor_s"] for u in units))
    for u in units:
        assert u["floor_s"] == pytest.approx(max(u["flops"] / 5e9, u["bytes"] / 1e9))
        assert u["measured_s"] is not None
    assert sum(u["kind"] == "matmul" and u["measured_s"] > 0 for u in units) == 3
    assert report["wall_s"] > 0
    assert cli.main([*argv, "--floor-calls", "0"]) == 2
    assert "--floor-calls must be >= 1, got 0" in capsys.readouterr().err


def test_explain_floor_times_an_export_as_the_server_realizes_it(
    tiny_saved_model, tmp_path, monkeypatch, capsys, hand
):
    """An export with ``fusion.json`` (generated loop ops): ``--floor`` also times the
    signature realized as ``stitchrec serve`` realizes it, with the candidate it chose."""
    import shutil

    from compiler_opt import floor
    from compiler_opt.fused_signature import FusionSpec, write_spec
    from tests.compiler_opt.conftest import need_compiler

    need_compiler()
    _seed_cache(tmp_path, monkeypatch, hand)
    peak = floor.Peak(cost.device_key("/CPU:0"), 5e9, 2, 256, {"fma256_flops": 5e9})
    floor.peak_path().write_text(json.dumps(dataclasses.asdict(peak)))
    export = tmp_path / "fused"
    shutil.copytree(tiny_saved_model, export)
    write_spec(export, FusionSpec(realization="generated", plan_batch=64))
    out = tmp_path / "plan.json"
    argv = ["fuse", "explain", str(export), "--batch", "64", "--floor", "--floor-calls", "2"]
    assert cli.main([*argv, "--json", str(out)]) == 0
    assert "as served (generated, " in capsys.readouterr().out
    report = json.loads(out.read_text())["floor"]
    assert report["served"].startswith("generated") and report["served_s"] > 0
