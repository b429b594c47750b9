"""``[fusion] activations = "forward_ad"`` through real ``stitchrec train`` runs: the same
weights as plain back-propagation, step for step."""

from __future__ import annotations

import numpy as np

from pipelines.config import load_config
from pipelines.train import train
from tests.pipelines.test_train import _weights
from tests.ranking.test_multitask import _model as _multitask_model
from tests.ranking.test_multitask import tiny  # noqa: F401  (the fixture)
from tests.testdata import NO_VALIDATION, write_run_config


def _run(data, name: str, extra: str) -> tuple[dict, list[str], list[np.ndarray]]:
    model = {"type": "dcn_v2", "embedding_dim": 4, "mlp": [32, 16], "cross_layers": 1}
    model["dropout"] = 0.3
    keys = {"batch_size": 256, "epochs": 1, "learning_rate": 0.01, "deterministic": True}
    out = data["root"] / name
    cfg = write_run_config(
        data["root"] / f"{name}.toml", data, out, model, keys, extra, data_extra=NO_VALIDATION
    )
    lines: list[str] = []
    report = train(load_config(cfg), lines.append)
    return report, lines, _weights(out)


def test_forward_ad_activations_train_the_plain_models_weights(tiny_data):
    plain, _, w_plain = _run(tiny_data, "plain", "")
    ours, lines, w_ours = _run(tiny_data, "fad", '[fusion]\nactivations = "forward_ad"\n')
    assert any("differentiated as forward_ad" in line for line in lines)
    assert ours["steps"] == plain["steps"] > 0
    assert len(w_ours) == len(w_plain)
    for a, b in zip(w_ours, w_plain, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert abs(ours["test"]["auc"] - plain["test"]["auc"]) < 1e-5


def test_with_gradient_reaches_the_task_towers_of_a_multitask_model(tiny):  # noqa: F811
    from pipelines.run.fusion import with_gradient

    model = _multitask_model(tiny, "mmoe", dropout=0.2)
    ours = with_gradient(model, "forward_ad")
    assert ours is not model and ours.towers is not model.towers
    assert all(t.gradient == "forward_ad" for t in ours.towers._towers)
    assert [v.ref() for v in ours.trainable_variables] == [
        v.ref() for v in model.trainable_variables
    ]
    assert with_gradient(model, "backprop") is model
    assert with_gradient(ours, "forward_ad") is ours
