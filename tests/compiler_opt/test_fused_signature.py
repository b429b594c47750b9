"""A fused, bucketed serving signature: the export's spec, equal outputs at any batch size,
compilations only at load, and a real gRPC server serving an export made with --fuse."""

from __future__ import annotations

import dataclasses
import json
import shutil

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from compiler_opt.buckets import count_compilations
from compiler_opt.fused_signature import (
    FusedSignature,
    FusionSpec,
    FusionSpecError,
    read_spec,
    write_spec,
)
from serving.config import BatchingConfig, ServerOptions
from serving.testing import ServerThread
from tests.compiler_opt.conftest import need_compiler

LADDER = (8, 32, 128)


def _features(signature, rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Rows of plausible raw inputs: categorical tokens from a small pool, numbers >= 0."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, spec in signature.structured_input_signature[1].items():
        if spec.dtype == tf.string:
            out[name] = np.array([f"v{v}".encode() for v in rng.integers(0, 6, rows)], object)
        else:
            out[name] = rng.exponential(2.0, rows).astype(spec.dtype.as_numpy_dtype)
    return out


def test_spec_round_trip_and_bad_files_name_the_problem(tmp_path):
    assert read_spec(tmp_path) is None
    spec = FusionSpec(ladder=(8, 64), plan_batch=64)
    path = write_spec(tmp_path, spec)
    assert read_spec(tmp_path) == spec
    assert json.loads(path.read_text())["ladder"] == [8, 64]
    with pytest.raises(FusionSpecError, match="not larger than"):
        FusionSpec(ladder=(16, 8))
    assert FusionSpec(realization="generated").realization == "generated"
    with pytest.raises(FusionSpecError, match="realization='kernels'"):
        FusionSpec(realization="kernels")
    with pytest.raises(FusionSpecError, match="plan_batch=0"):
        FusionSpec(plan_batch=0)
    with pytest.raises(FusionSpecError, match="loop_matmuls='yes': expected true or false"):
        FusionSpec(loop_matmuls="yes")
    for text, match in [
        ("{", "not valid JSON"),
        ("[1]", "expected a JSON object"),
        ('{"ladders": [8]}', r"unknown key\(s\) \['ladders'\]"),
        ('{"ladder": []}', "at least one bucket"),
    ]:
        path.write_text(text)
        with pytest.raises(FusionSpecError, match=match) as e:
            read_spec(tmp_path)
        assert str(path) in str(e.value)


@pytest.mark.parametrize("realization", ["xla_clusters", "generated"])
def test_fused_signature_matches_the_saved_model_at_any_batch_size(
    tiny_saved_model, hand, realization
):
    if realization == "generated":
        need_compiler()
    model = tf.saved_model.load(str(tiny_saved_model))
    sig = model.signatures["serving_default"]
    spec = FusionSpec(realization=realization, ladder=LADDER, plan_batch=32, loop_matmuls=True)
    fused = FusedSignature(sig, spec, hand)
    # the cross layer's x0 * (W x + b) + x: its Mul and AddV2 as one generated op, and no XLA
    assert (fused.loops >= 1, fused.clusters >= 1) == (
        (True, False) if realization == "generated" else (False, True)
    )
    assert fused.describe()["realization"] == realization
    compiled = fused.warmup(_features(sig, 8))
    assert compiled >= fused.clusters  # every cluster, at least at one bucket
    if realization == "generated":  # the MLP's BiasAdd + Relu: folded or generated, and the
        # cross layer's matmul in its loop op or apart: timed, the fastest kept
        info = fused.describe()
        assert set(info["timings_ms"]) == {
            "epilogues_to_matmul",
            "epilogues_generated",
            "matmuls_inside",
        }
        assert (info["matmuls_in_loop_ops"] > 0) == (info["choice"] == "matmuls_inside")
        assert info["choice"] == min(info["timings_ms"], key=info["timings_ms"].get)
        assert fused.loops >= 1
    assert fused.describe()["compilations_at_load"] == compiled
    with count_compilations() as after:
        for rows in (1, 5, 8, 31, 100, 300):  # 300 > the top bucket: chunks of 128
            feats = _features(sig, rows, seed=rows)
            want = sig(**{k: tf.constant(v) for k, v in feats.items()})
            got = fused(feats)
            assert set(got) == set(want)
            for k in want:
                assert got[k].shape == want[k].shape
                np.testing.assert_allclose(got[k].numpy(), want[k].numpy(), rtol=1e-5, atol=1e-6)
    assert after.count == 0  # no request compiles: every bucket was compiled at load
    with pytest.raises(ValueError, match="missing input"):
        fused({})


def test_server_serves_an_export_with_fusion_equal_to_unfused(
    tiny_saved_model, tmp_path, caplog, monkeypatch
):
    monkeypatch.setenv("STITCHREC_CACHE", str(tmp_path / "cache"))  # calibrated at load
    repo = tmp_path / "repo"
    shutil.copytree(tiny_saved_model, repo / "ctr" / "1")
    write_spec(repo / "ctr" / "1", FusionSpec(ladder=LADDER, plan_batch=32))
    loaded = tf.saved_model.load(str(tiny_saved_model))  # kept alive while ``sig`` is used
    sig = loaded.signatures["serving_default"]
    options = ServerOptions(batching=BatchingConfig(enabled=False), warmup_sizes=(1,))
    caplog.set_level("INFO", logger="stitchrec.serving.repository")
    for fusion in (True, False):
        with ServerThread(repo, dataclasses.replace(options, fusion=fusion)) as s:
            mv = s.server.repository.get("ctr")
            assert bool(mv.fused) is fusion
            stub = prediction_service_pb2_grpc.PredictionServiceStub(
                grpc.insecure_channel(s.target)
            )
            for rows in (3, 70):
                feats = _features(sig, rows, seed=rows)
                req = predict_pb2.PredictRequest()
                req.model_spec.name = "ctr"
                for k, v in feats.items():
                    req.inputs[k].CopyFrom(tf.make_tensor_proto(v))
                resp = stub.Predict(req, timeout=30)
                want = sig(**{k: tf.constant(v) for k, v in feats.items()})
                for k in want:
                    np.testing.assert_allclose(
                        tf.make_ndarray(resp.outputs[k]), want[k].numpy(), rtol=1e-5, atol=1e-6
                    )
    fused_logs = [json.loads(r.message) for r in caplog.records if '"fused"' in r.message]
    assert len(fused_logs) == 1 and fused_logs[0]["compilations_at_load"] >= 1
    assert fused_logs[0]["ladder"] == list(LADDER)
