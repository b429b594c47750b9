"""The training realization: a training step inlined with its variables kept as handles and its
planned groups as XLA clusters (``realize.TrainingStep``), against the traced step; and
``stitchrec train`` with ``[fusion] clusters = true`` against without."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from compiler_opt import realize
from tests.compiler_opt.conftest import tiny_dcn_v2
from tests.testdata import write_run_config, write_tiny_dataset


def _model_and_step(tmp_path, optimizer: str):
    """A tiny DCN-v2, its traced training step with ``optimizer``, the step's variables and
    three batches of 64."""
    from features.dataset import make_dataset
    from pipelines.run.model import make_optimizer
    from pipelines.run.step import make_train_step

    tf.keras.utils.set_random_seed(0)
    model, schema, files = tiny_dcn_v2(tmp_path, rows=400, train_rows=300, mlp=(8,))
    ds = make_dataset(schema, files, batch_size=64)
    batches = [b for _, b in zip(range(3), ds, strict=False)]
    opt = make_optimizer(optimizer, 0.05)
    opt.build(model.trainable_variables)
    metrics = (tf.keras.metrics.Mean(), tf.keras.metrics.AUC(num_thresholds=50))
    step = make_train_step(
        model, opt, element_spec=ds.element_spec, loss_metric=metrics[0], auc_metric=metrics[1]
    )
    variables = [*model.variables, *opt.variables(), *metrics[0].variables, *metrics[1].variables]
    return step, variables, batches


@pytest.fixture(scope="module")
def steps(tmp_path_factory):
    """``_model_and_step`` once per optimizer for the module: the tests that realize the same
    traced step share it (each test sets the variables it compares from itself)."""
    made: dict[str, tuple] = {}

    def get(optimizer: str):
        if optimizer not in made:
            made[optimizer] = _model_and_step(tmp_path_factory.mktemp(optimizer), optimizer)
        return made[optimizer]

    return get


@pytest.mark.parametrize("optimizer", ["adam", "adagrad"])
def test_the_realized_step_updates_the_variables_as_the_traced_one(steps, hand, optimizer):
    step, variables, batches = steps(optimizer)
    start = [v.numpy().copy() for v in variables]
    fused = realize.TrainingStep(step, hand, 64, trial_steps=0)  # the clusters, always
    assert fused.clusters > 0 and fused.choice == "clusters"
    ops = {n.op for n in fused.realized.tagged.node}
    assert {"AssignVariableOp", "ResourceScatterAdd", "ResourceApplyAdam"} & ops  # the updates
    tagged = [n for n in fused.realized.tagged.node if "_XlaCompile" in n.attr]
    assert tagged and all(n.attr["_XlaScope"].s.startswith(b"stitch_") for n in tagged)

    want = [float(step(b)) for b in batches]
    after = [v.numpy().copy() for v in variables]
    for v, s in zip(variables, start, strict=True):
        v.assign(s)
    got = [float(fused(b)) for b in batches]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    moved = 0
    for a, g, s in zip(after, [v.numpy() for v in variables], start, strict=True):
        np.testing.assert_allclose(g, a, rtol=1e-4, atol=1e-6)
        moved += not np.array_equal(g, s)
    assert moved > 10  # tables, dense weights, slots, metrics: all updated


def test_the_first_steps_choose_between_clusters_and_the_inlined_step(steps, hand):
    step, _, batches = steps("adam")
    fused = realize.TrainingStep(step, hand, 64, trial_steps=1, warmup_steps=2)
    assert fused.choice == "" and fused.timings_ms == {}
    losses = [float(fused(batches[i % 3])) for i in range(5)]  # 2 untimed + 1 timed each
    assert fused.choice == "" and set(fused.timings_ms) == {"clusters"}
    losses.append(float(fused(batches[0])))
    assert fused.choice in ("clusters", "inlined") and set(fused.timings_ms) == {
        "clusters",
        "inlined",
    }
    assert all(np.isfinite(losses))
    with pytest.raises(ValueError, match="batch must be >= 1, got 0"):
        realize.TrainingStep(step, hand, 0)
    with pytest.raises(ValueError, match="trial_steps and warmup_steps must be >= 0, got -1, 3"):
        realize.TrainingStep(step, hand, 8, trial_steps=-1)
    with pytest.raises(ValueError, match=r"needs a tf\.function with an input_signature"):
        realize.TrainingStep(tf.function(lambda x: x), hand, 8)


def test_stitchrec_train_with_clusters_reaches_the_same_auc(tmp_path):
    from pipelines.config import ConfigError, load_config
    from pipelines.train import train

    data = write_tiny_dataset(tmp_path, rows=2500, train_rows=2000)
    model = {"type": "dcn_v2", "embedding_dim": 4, "mlp": [16], "cross_layers": 1}
    # 200 rows a step: 10 steps, of which the first 2 x (3 + 3) time the two candidates
    opts = {"batch_size": 200, "epochs": 2, "learning_rate": 0.01, "deterministic": True}
    reports, logs = {}, {}
    for fused in (False, True):
        out = tmp_path / f"run-{fused}"
        extra = "[fusion]\nclusters = true\n" if fused else ""
        cfg = load_config(write_run_config(out.with_suffix(".toml"), data, out, model, opts, extra))
        lines: list[str] = []
        reports[fused] = train(cfg, log=lines.append)
        logs[fused] = lines
    assert any("XLA clusters (compiler_opt.realize.TrainingStep" in ln for ln in logs[True])
    ran = reports[True]["fused_training_step"]
    assert ran["clusters"] > 0 and ran["choice"] in ("clusters", "inlined"), ran
    a, b = reports[False]["test"]["auc"], reports[True]["test"]["auc"]
    assert a > 0.55 and abs(a - b) < 2e-3, (a, b)
    bad = write_run_config(
        tmp_path / "bad.toml", data, tmp_path / "x", model, opts, "[fusion]\nclusters = 1\n"
    )
    with pytest.raises(ConfigError, match="clusters must be true or false"):
        load_config(bad)
