"""Schedules of the generated embedding op: one result under every schedule, the search on a
known landscape, the records, and ``stitchrec fuse tune`` feeding ``stitchrec export``."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import tensorflow as tf

from compiler_opt import cost, registry, tune
from compiler_opt.embedding_op import layer as emb_layer
from compiler_opt.embedding_op import ops as emb_ops
from compiler_opt.embedding_op.spec import (
    DEFAULT_SCHEDULE,
    SCHEDULE_SPACE,
    Schedule,
    build_spec,
    spec_from_json,
)
from embeddings.collection import EmbeddingCollection
from tests.compiler_opt.conftest import need_compiler, share_kernels, tiny_dcn_v2

TABLES = [
    {"name": "a", "num_rows": 300, "dim": 4},
    {"name": "tags", "num_rows": 40, "dim": 4},  # ragged, mean
    {"name": "h", "num_rows": 1000, "dim": 2, "method": "hashing", "options": {"buckets": 17}},
]


def _collection_and_ids(batch: int = 50):
    coll = EmbeddingCollection(TABLES, name="tune")
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 4, batch)
    ids = {
        "a": tf.constant(rng.integers(-2, 320, batch), tf.int64),
        "tags": tf.RaggedTensor.from_row_lengths(
            tf.constant(rng.integers(0, 40, lengths.sum()), tf.int64), lengths
        ),
        "h": tf.constant(rng.integers(0, 5000, batch), tf.int64),
    }
    coll(ids)
    return coll, ids


def test_a_schedule_is_part_of_the_op_and_its_spec():
    with pytest.raises(ValueError, match=r"tile must be one of \[1, 8, .*\], got 3"):
        Schedule(tile=3)
    coll, ids = _collection_and_ids()
    spec = build_spec(coll, ids).spec
    assert spec.schedule == DEFAULT_SCHEDULE and "schedule" not in spec.to_json()
    other = spec.with_schedule(Schedule(tile=16, prefetch=0, grain=64))
    assert other.op_name != spec.op_name  # two schedules load side by side
    assert spec_from_json(other.to_json()) == other
    assert spec_from_json(spec.to_json()) == spec
    assert other.schedule.key() == "t16-p0-g64"


def test_every_schedule_computes_the_same_embeddings(tmp_path, monkeypatch):
    need_compiler()
    monkeypatch.setenv("STITCHREC_CACHE", str(share_kernels(tmp_path / "cache")))
    coll, ids = _collection_and_ids(300)
    base = build_spec(coll, ids).spec
    schedules = [Schedule(tile=1, prefetch=16, grain=16), Schedule(tile=1024, prefetch=0)]
    specs = [base, *(base.with_schedule(s) for s in schedules)]
    registry.precompile([(s, emb_ops.EMBEDDING) for s in specs])
    outs, grads = [], []
    for spec in specs:
        fused = emb_layer.FusedEmbeddingCollection.from_collection(
            coll, schedule_for=lambda _, s=spec.schedule: s
        )
        with tf.GradientTape() as tape:
            out = fused(ids).concat()
            loss = tf.reduce_sum(out * tf.range(out.shape[1], dtype=tf.float32))
        assert fused.kernel is not None and fused.kernel.spec == spec
        outs.append(out.numpy())
        grads.append([tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, coll.weights)])
    np.testing.assert_allclose(outs[0], coll(ids).concat().numpy(), rtol=1e-6, atol=1e-7)
    for out, grad in zip(outs[1:], grads[1:], strict=True):
        np.testing.assert_array_equal(out, outs[0])
        for g, g0 in zip(grad, grads[0], strict=True):
            np.testing.assert_array_equal(g, g0)


def _landscape(spec) -> float:
    """A known cost: fastest at tile 32, prefetch 8, grain 256 (seconds)."""
    s = spec.schedule
    return 1e-3 * (
        1
        + 0.1 * abs(np.log2(s.tile) - 5)
        + 0.05 * abs(s.prefetch - 8)
        + 0.08 * abs(np.log2(s.grain + 1) - 8)
    )


def test_search_finds_the_fastest_schedule_of_a_known_landscape():
    coll, ids = _collection_and_ids()
    spec = build_spec(coll, ids).spec
    seen = []
    result = tune.search(spec, _landscape, 256, trials=40, initial=8, progress=seen.append)
    assert seen == result.trials and len(result.trials) == 40
    assert result.trials[0].schedule == DEFAULT_SCHEDULE and result.trials[0].predicted is None
    assert len({t.schedule for t in result.trials}) == 40  # nothing measured twice
    assert result.best == Schedule(tile=32, prefetch=8, grain=256)
    assert result.best_seconds == pytest.approx(1e-3, rel=1e-3)
    assert result.default_seconds == pytest.approx(_landscape(spec))
    assert result.speedup == pytest.approx(result.default_seconds / result.best_seconds)
    # the model's predictions of what it proposed (near the best: a narrow range) still rank
    # in the truth's order more often than not
    assert result.rank_correlation is not None and result.rank_correlation > 0
    assert result.trials_to(0.95) <= 40 and result.op == spec.op_name
    # the exact optimum of 324 schedules in 40 trials: a random search of 40 finds it with
    # probability 40 / 324
    space = np.prod([len(v) for v in SCHEDULE_SPACE.values()])
    assert space == 324 and result.trials_to(1.0) <= 40
    with pytest.raises(ValueError, match="need trials >= 2"):
        tune.search(spec, _landscape, 256, trials=1)


def test_records_are_per_device_and_pick_the_largest_batch(tmp_path, caplog):
    coll, ids = _collection_and_ids()
    spec = build_spec(coll, ids).spec
    path = tmp_path / "tuning.json"
    assert tune.recorded_schedule(spec, tune.load_records(path)) == DEFAULT_SCHEDULE
    for batch, best in ((256, Schedule(tile=16)), (4096, Schedule(prefetch=8))):
        result = tune.TuneResult(
            spec.op_name, batch, cost.device_key("/CPU:0"), 2e-3, best, 1e-3, [], None, 1.0
        )
        tune.save_record(result, path)
    records = tune.load_records(path)
    assert sorted(records) == [f"{spec.op_name}@256", f"{spec.op_name}@4096"]
    assert tune.recorded_schedule(spec, records) == Schedule(prefetch=8)
    # a tuned spec looks up the records of its default op
    assert tune.recorded_schedule(spec.with_schedule(Schedule(tile=8)), records).prefetch == 8
    data = json.loads(path.read_text())
    data["device"] = "cpu-another-machine-64cores"
    path.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, logger="compiler_opt.tune"):
        assert tune.load_records(path) == {}
    assert "tuned on cpu-another-machine-64cores" in caplog.text
    path.write_text("{")
    assert tune.load_records(path) == {} and "not a records file" in caplog.text


def test_fuse_tune_records_a_schedule_that_export_then_uses(tmp_path, monkeypatch, capsys):
    """``stitchrec fuse tune`` on a ``--fuse-kernels`` export (real ids from the training
    shards), then ``stitchrec export --fuse-kernels`` builds the op under the recorded schedule;
    its scores are the untuned export's."""
    need_compiler()
    from pipelines import cli
    from pipelines.export import export_saved_model

    monkeypatch.setenv("STITCHREC_CACHE", str(share_kernels(tmp_path / "cache")))
    model, schema, files = tiny_dcn_v2(tmp_path)
    plain = export_saved_model(model, schema, tmp_path / "plain", kernels=True)
    out = tmp_path / "trials.json"
    argv = ["fuse", "tune", str(plain), "--batch", "64", "--trials", "2", "--seed", "1"]
    assert cli.main([*argv, "--data", str(files[0].parent), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "trial   1 t128-p4-g0" in text and "at batch 64: best" in text
    (result,) = json.loads(out.read_text())
    assert len(result["trials"]) == 2 and result["batch"] == 64
    records = tune.load_records()
    assert list(records) == [f"{result['op']}@64"]
    best = Schedule(**records[f"{result['op']}@64"]["schedule"])
    tuned = export_saved_model(model, schema, tmp_path / "tuned", kernels=True)
    specs = list((tuned / "assets" / "compiler_opt_kernels").glob("*.spec.json"))
    assert [spec_from_json(p.read_text()).schedule for p in specs] == [best]
    features = next(iter(_rows(schema, files)))
    scores = [
        tf.saved_model.load(str(p)).signatures["serving_default"](**features)["score"].numpy()
        for p in (plain, tuned)
    ]
    np.testing.assert_array_equal(scores[0], scores[1])
    assert cli.main(["fuse", "tune", str(plain), "--trials", "1"]) == 2
    assert "--trials must be >= 2, got 1" in capsys.readouterr().err


def _rows(schema, files):
    from features.dataset import make_dataset

    for batch in make_dataset(schema, files, batch_size=32):
        yield {f.name: batch[f.name] for f in schema.model_inputs}


def test_confirm_measures_the_winner_again_before_it_wins():
    coll, ids = _collection_and_ids()
    spec = build_spec(coll, ids).spec
    calls: dict[Schedule, int] = {}

    def lucky_once(s) -> float:  # another schedule's first measurement was a fluke
        calls[s.schedule] = calls.get(s.schedule, 0) + 1
        if s.schedule == DEFAULT_SCHEDULE:
            return 1e-3
        return 1e-4 if calls[s.schedule] == 1 else 5e-3

    fooled = tune.search(spec, lucky_once, 256, trials=2, initial=1)
    assert fooled.best != DEFAULT_SCHEDULE and fooled.best_seconds == 1e-4
    calls.clear()
    checked = tune.search(spec, lucky_once, 256, trials=2, initial=1, confirm=3)
    assert checked.best == DEFAULT_SCHEDULE and checked.best_seconds == 1e-3
    assert sorted(calls.values()) == [4, 4] and checked.speedup == 1.0
