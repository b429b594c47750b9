"""One SavedModel of several snapshots of a run (pipelines.export.export_ensemble): its outputs
are the members' averaged, and a server ranks with it like with any model."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest
import tensorflow as tf  # tests/conftest.py sets TF_USE_LEGACY_KERAS first

from features.dataset import field_tf_dtype
from features.schema import load_schema
from pipelines.cli import main
from pipelines.config import load_config
from pipelines.export import (
    EnsembleError,
    export_ensemble,
    export_run_ensemble,
    export_saved_model,
    load_checkpoint_model,
)
from pipelines.run import ensemble as E
from pipelines.run.model import load_trained_model
from pipelines.run.scoring import predict
from pipelines.train import train
from serving.client import RankingClient
from serving.config import ServerOptions
from serving.testing import ServerThread
from tests.testdata import write_run_config, write_tiny_dataset

MEMBERS = 3


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A trained tiny run plus three snapshots written as a training loop writes them (the
    trained weights moved by different noise stand for the low points of three cycles)."""
    root = tmp_path_factory.mktemp("ensemble")
    data = write_tiny_dataset(root, rows=3000, train_rows=2000)
    model_section = {"type": "dcn_v2", "embedding_dim": 4, "mlp": [8], "cross_layers": 1}
    train_section = {"batch_size": 256, "epochs": 1, "learning_rate": 0.02, "log_every": 100}
    cfg = write_run_config(root / "run.toml", data, root / "run", model_section, train_section)
    train(load_config(cfg), log=lambda _: None)
    run_dir = root / "run"
    model, schema, _ = load_trained_model(run_dir)
    val = [data["train"] / "part-00000.parquet"]  # stands for the run's validation rows
    base = [v.numpy() for v in model.trainable_variables]
    rng = np.random.default_rng(7)
    for k in range(MEMBERS):
        for v, w in zip(model.trainable_variables, base, strict=True):
            v.assign(w + rng.normal(0.0, 0.05, w.shape).astype(w.dtype.name))
        tf.train.Checkpoint(model=model).write(E.snapshot_prefix(run_dir, k))
        _, val_logits = predict(lambda f: model(f, training=False), schema, val)
        E.record_snapshot(run_dir, k, 100 * (k + 1), val_logits)
    return {"dir": run_dir, "data": data, "schema": schema, "val": val}


def _rows(run, n: int = 16) -> dict[str, np.ndarray]:
    table = pq.read_table(run["data"]["test"] / "part-00000.parquet").slice(0, n).to_pydict()
    out = {}
    for f in run["schema"].model_inputs:
        dtype = field_tf_dtype(f)
        out[f.name] = np.array(
            table[f.name], object if dtype == tf.string else dtype.as_numpy_dtype
        )
    return out


def _call(path, feats):
    sig = tf.saved_model.load(str(path)).signatures["serving_default"]
    return {k: v.numpy() for k, v in sig(**{k: tf.constant(v) for k, v in feats.items()}).items()}


def test_snapshots_restore_their_own_weights(run):
    entries = E.read_snapshots(run["dir"])
    assert [e["index"] for e in entries] == list(range(MEMBERS))
    want = E.snapshot_logits(run["dir"], entries)
    for e, row in zip(entries, want, strict=True):
        model = load_checkpoint_model(run["dir"], e["checkpoint"])
        _, got = predict(lambda f, m=model: m(f, training=False), run["schema"], run["val"])
        np.testing.assert_allclose(got, row, atol=1e-5)
    assert not np.allclose(want[0], want[1])  # the members differ


@pytest.mark.parametrize(("combine", "count"), [("logits", 3), ("probabilities", 2)])
def test_ensemble_outputs_are_the_members_mean(run, tmp_path, combine, count):
    ckpts = [e["checkpoint"] for e in E.read_snapshots(run["dir"])][:count]
    out = export_ensemble(run["dir"], ckpts, tmp_path / "ens", combine=combine)
    feats = _rows(run)
    members = []
    for i, c in enumerate(ckpts):
        single = export_saved_model(
            load_checkpoint_model(run["dir"], c), run["schema"], tmp_path / f"m{i}"
        )
        members.append(_call(single, feats))
    got = _call(out, feats)
    logits = np.stack([m["logit"] for m in members]).astype(np.float64)
    scores = np.stack([m["score"] for m in members]).astype(np.float64)
    if combine == "logits":
        np.testing.assert_allclose(got["logit"], logits.mean(axis=0), atol=1e-6)
        np.testing.assert_allclose(got["score"], E.sigmoid(logits.mean(axis=0)), atol=1e-6)
    else:
        np.testing.assert_allclose(got["score"], scores.mean(axis=0), atol=1e-6)
        np.testing.assert_allclose(got["logit"], E.average(logits, "probabilities"), atol=1e-5)
    meta = json.loads((out / "assets.extra" / "stitchrec.json").read_text())
    assert meta["ensemble"] == {"combine": combine, "members": ckpts}
    assert meta["inputs"] == [f.name for f in run["schema"].model_inputs]
    assert load_schema(out / "assets.extra" / "schema.toml").model_inputs == (
        run["schema"].model_inputs
    )
    assert (out / "assets.extra" / "stats.json").exists()


def test_export_ensemble_defaults_to_the_next_version_and_checks_its_arguments(run):
    latest = tf.train.latest_checkpoint(str(run["dir"] / "checkpoints"))  # the run's own
    out = export_ensemble(run["dir"], [latest, "snapshots/snapshot-0"])
    assert out == run["dir"] / "export" / "1"
    meta = json.loads((out / "assets.extra" / "stitchrec.json").read_text())
    assert meta["ensemble"]["members"] == [latest, "snapshots/snapshot-0"]
    with pytest.raises(ValueError, match=r"checkpoints = \[\]"):
        export_ensemble(run["dir"], [])
    with pytest.raises(ValueError, match="each at most once"):
        export_ensemble(run["dir"], ["snapshots/snapshot-0", "snapshots/snapshot-0"])
    with pytest.raises(ValueError, match="combine = 'max'"):
        export_ensemble(run["dir"], ["snapshots/snapshot-0"], combine="max")
    with pytest.raises(FileNotFoundError, match="snapshot-9"):
        export_ensemble(run["dir"], ["snapshots/snapshot-9"])
    shutil.rmtree(out)


def test_server_ranks_with_the_ensemble_like_the_saved_model(run, tmp_path):
    ckpts = [e["checkpoint"] for e in E.read_snapshots(run["dir"])]
    repo = tmp_path / "repo"
    export_ensemble(run["dir"], ckpts, repo / "ens" / "1")
    feats = _rows(run, 6)
    user = {"user": "u3"}
    candidates = {k: v for k, v in feats.items() if k != "user"}
    want = _call(repo / "ens" / "1", {**candidates, "user": np.array(["u3"] * 6, object)})
    with ServerThread(repo, ServerOptions()) as s, RankingClient(s.target) as client:
        result = client.rank("ens", user, candidates)
    np.testing.assert_array_equal(result.indices, np.arange(6))
    np.testing.assert_allclose(result.scores, want["score"], atol=1e-6)


def _second_run(run, name: str, schema_text: str | None = None, seed: int = 1):
    """Another tiny run over the fixture's data (another seed, or another schema)."""
    root = run["data"]["root"]
    data = dict(run["data"])
    if schema_text is not None:
        data["schema"] = root / f"{name}_schema.toml"
        data["schema"].write_text(schema_text)
    model_section = {"type": "dnn", "embedding_dim": 4, "mlp": [8]}
    train_section = {"batch_size": 256, "epochs": 1, "seed": seed, "log_every": 100}
    cfg = write_run_config(root / f"{name}.toml", data, root / name, model_section, train_section)
    train(load_config(cfg), log=lambda _: None)
    return root / name


def test_runs_of_other_seeds_export_as_one_ensemble(run, tmp_path, capsys):
    """``export --ensemble-runs``: the selected checkpoints of several runs (another model type
    here: each member keeps its own preprocessing), averaged behind one signature."""
    other = _second_run(run, "seed1")
    out = tmp_path / "runs_ens"
    argv = ["export", "--run", str(run["dir"]), "--ensemble-runs", str(other), "--output", str(out)]
    assert main(argv) == 0
    assert "ensemble of 2 runs' selected checkpoints" in capsys.readouterr().out
    feats = _rows(run)
    logits = [
        load_trained_model(r)[0]({k: tf.constant(v) for k, v in feats.items()}).numpy()
        for r in (run["dir"], other)
    ]
    np.testing.assert_allclose(_call(out, feats)["logit"], np.mean(logits, axis=0), atol=1e-5)
    meta = json.loads((out / "assets.extra" / "stitchrec.json").read_text())
    assert meta["runs"] == [str(run["dir"].resolve()), str(other.resolve())]
    members = meta["ensemble"]["members"]
    assert [m.split(":")[0] for m in members] == meta["runs"] and meta["ensemble"][
        "combine"
    ] == "logits"
    with pytest.raises(EnsembleError, match="expected two or more runs"):
        export_run_ensemble([run["dir"], run["dir"]])


def test_runs_of_other_fields_or_flags_that_do_not_combine_are_usage_errors(run, capsys):
    without_price = load_schema(run["data"]["schema"]).select(
        [f.name for f in load_schema(run["data"]["schema"]).fields if f.name != "price"]
    )
    path = run["data"]["root"] / "no_price.toml"
    without_price.save(path)
    other = _second_run(run, "no_price", path.read_text())
    argv = ["export", "--run", str(run["dir"]), "--ensemble-runs", str(other), "--output", "x"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "an ensemble's members must take the same fields" in err and "Traceback" not in err
    assert main([*argv, "--single"]) == 2
    assert "export --ensemble-runs: not with --cascade-rank, --single" in capsys.readouterr().err


def test_quantized_export_is_smaller_and_scores_within_tolerance(run, tmp_path, capsys):
    """``export --quantize int8``: the tables of at least ``--quantize-min-rows`` rows are held
    as int8 rows with a scale and an offset each (``user``: 41 rows), the smaller ones as fp32;
    ``stitchrec.json`` records them; the scores stay within the quantization error."""
    fp32, int8 = tmp_path / "fp32", tmp_path / "int8"
    argv = ["export", "--run", str(run["dir"]), "--single", "--output"]
    assert main([*argv, str(fp32)]) == 0
    assert main([*argv, str(int8), "--quantize", "int8", "--quantize-min-rows", "30"]) == 0
    assert "quantized 1 of 4 embedding tables to int8 (those of at least 30 rows)" in (
        capsys.readouterr().out
    )
    meta = json.loads((int8 / "assets.extra" / "stitchrec.json").read_text())["quantization"]
    modes = {t["field"]: t["mode"] for t in meta["tables"]}
    assert modes == {"user": "int8", "item": "fp32", "tags": "fp32", "age": "fp32"}
    user = next(t for t in meta["tables"] if t["field"] == "user")
    assert user["bytes"] == user["rows"] * (user["dim"] + 4) < user["bytes_fp32"]
    # the variables hold the int8 table: smaller by what the record says (the files of so
    # small a model are mostly names and the object graph, so the tensors are summed)
    sizes = [_tensor_bytes(p) for p in (fp32, int8)]
    assert sizes[0] - sizes[1] == meta["bytes_fp32"] - meta["bytes"] > 0
    feats = _rows(run, 64)
    want, got = _call(fp32, feats), _call(int8, feats)
    np.testing.assert_allclose(got["score"], want["score"], atol=0.01)
    assert not np.array_equal(got["score"], want["score"])
    # an ensemble: each member's tables quantized, one record per member
    ckpts = [e["checkpoint"] for e in E.read_snapshots(run["dir"])][:2]
    plain = export_ensemble(run["dir"], ckpts, tmp_path / "ens")
    small = export_ensemble(
        run["dir"], ckpts, tmp_path / "qens", quantize="int8", quantize_min_rows=30
    )
    record = json.loads((small / "assets.extra" / "stitchrec.json").read_text())["quantization"]
    assert record["mode"] == "int8" and len(record["members"]) == 2
    assert all(m["tables"][0]["mode"] == "int8" for m in record["members"])
    np.testing.assert_allclose(
        _call(small, feats)["score"], _call(plain, feats)["score"], atol=0.01
    )
    capsys.readouterr()
    for bad, message in (
        (["--quantize", "int8", "--fuse-kernels"], "export --quantize: not with --fuse-kernels"),
        (["--quantize-min-rows", "-1"], "export --quantize-min-rows -1: expected a row count"),
    ):
        assert main([*argv, str(tmp_path / "bad"), *bad]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1
        assert not (tmp_path / "bad").exists()
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, str(tmp_path / "bad"), "--quantize", "int4"])
    assert exit_info.value.code == 2 and "invalid choice: 'int4'" in capsys.readouterr().err


def _tensor_bytes(saved_model) -> int:
    """Bytes of the tensors in a SavedModel's variables."""
    reader = tf.train.load_checkpoint(str(saved_model / "variables" / "variables"))
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    return sum(
        int(np.prod(shapes[k])) * dtypes[k].size
        for k in shapes
        if k != "_CHECKPOINTABLE_OBJECT_GRAPH"
    )
