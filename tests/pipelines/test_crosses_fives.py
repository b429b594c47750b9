"""End to end: ``stitchrec crosses fives`` on tiny data -> artifact -> train with the config
naming it -> export -> the SavedModel computes the crosses from raw features."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from features.crosses.artifact import load_crosses
from features.preprocessing import cross_ids
from pipelines import cli
from pipelines.config import ConfigError, load_config
from pipelines.export import export_run
from pipelines.run.model import load_trained_model
from pipelines.train import train
from tests.testdata import NO_VALIDATION, write_run_config

INPUTS = ("user", "item", "tags", "price", "age")


def _config(data, name: str, extra: str = "") -> Path:
    train = {"batch_size": 256, "epochs": 2, "learning_rate": 0.05, "log_every": 50}
    return write_run_config(
        data["root"] / f"{name}.toml",
        data,
        data["root"] / name,
        {"type": "lr"},
        train,
        data_extra=f"{NO_VALIDATION}\n{extra}",
    )


def _tensors(columns: dict[str, np.ndarray]) -> dict[str, tf.Tensor]:
    dtypes = {"item": tf.int64, "price": tf.float32, "age": tf.float32}
    return {n: tf.constant(columns[n], dtypes.get(n, tf.string)) for n in INPUTS}


def test_search_artifact_train_export_computes_crosses(tiny_data, capsys):
    search_cfg = _config(tiny_data, "search")
    artifact = tiny_data["root"] / "crosses.json"
    args = ["crosses", "fives", "--config", str(search_cfg), "--out", str(artifact)]
    options = ["--epochs", "2", "--max-order", "3", "--set", "batch_size=512", "--set", "seed=1"]
    code = cli.main([*args, *options])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "fives: epoch 2/2" in out and f"wrote {artifact}" in out
    art = load_crosses(artifact)
    assert art.method == "fives" and set(art.fields) == set(INPUTS)
    assert {c.order for c in art.crosses} == {2, 3}
    assert len(art.crosses) == 10 + 10  # every pair and triple of 5 fields, ranked once
    # the selected crosses first, by held-out effect; then FIVES's others, by strength
    head = [c for c in art.crosses if c.active]
    rest = art.crosses[len(head) :]
    assert [c.effect for c in head] == sorted((c.effect for c in head), reverse=True)
    assert [c.strength for c in rest] == sorted((c.strength for c in rest), reverse=True)
    assert not any(c.active for c in rest) and "interaction screen: order 3" in out
    assert art.search["config"]["seed"] == 1 and art.search["rows"]["train"] > 3000

    run_cfg = _config(
        tiny_data,
        "run",
        f'crosses = "{artifact}"\ncross_top_n = 3\ncross_hash_buckets = 512',
    )
    cfg = load_config(run_cfg)
    lines: list[str] = []
    report = train(cfg, log=lines.append)
    top = art.crosses[:3]
    assert any(line.startswith("crosses from") and top[0].name in line for line in lines)
    model, schema, _ = load_trained_model(cfg.output_dir)
    assert [c.name for c in schema.crosses] == [c.name for c in top]
    assert model.preprocessor.cross_fields == [c.name for c in top]
    assert report["test"]["auc"] > 0.6

    # the trained model's in-graph cross ids are the NumPy reference's
    t = pq.read_table(sorted(Path(tiny_data["test"]).glob("*.parquet"))[0])
    cols = {n: t.column(n).to_numpy(zero_copy_only=False) for n in INPUTS}
    ids, _ = model.preprocessor(_tensors(cols))
    for plan in model.preprocessor.plans:
        if plan["op"] == "cross":
            np.testing.assert_array_equal(ids[plan["name"]].numpy(), cross_ids(plan, cols))

    saved = export_run(cfg.output_dir)
    serve = tf.saved_model.load(str(saved)).signatures["serving_default"]
    logits = serve(**_tensors(cols))["logit"].numpy()
    np.testing.assert_allclose(logits, model(_tensors(cols)).numpy(), rtol=1e-5, atol=1e-5)

    # Swap one crossed field between two rows. LR is additive in the raw fields, so
    # l(r1) + l(r2) - l(r1 with r2's f) - l(r2 with r1's f) is zero without crosses; only the
    # crosses of f make it non-zero: the SavedModel crosses raw values itself.
    # Two TRAINING rows (their cross values were trained) with every crossed field present.
    cross = top[0]
    f = cross.fields[-1]
    t = pq.read_table(sorted(Path(tiny_data["train"]).glob("*.parquet"))[0])
    cols = {n: t.column(n).to_numpy(zero_copy_only=False) for n in INPUTS}
    present = np.ones(t.num_rows, bool)
    for name in cross.fields:
        v = cols[name]
        present &= (v != "") if v.dtype == object else np.isfinite(v.astype(float))
    r1 = int(np.flatnonzero(present)[0])
    r2 = next(i for i in np.flatnonzero(present) if str(cols[f][i]) != str(cols[f][r1]))
    rows = [r1, r2, r1, r2]
    swapped = {n: np.array(cols[n][rows]) for n in INPUTS}
    swapped[f][2], swapped[f][3] = cols[f][r2], cols[f][r1]
    s = serve(**_tensors(swapped))["logit"].numpy()
    interaction = s[0] + s[1] - s[2] - s[3]
    plain = _config(tiny_data, "plain")
    train(load_config(plain), log=lambda _: None)
    plain_serve = tf.saved_model.load(str(export_run(tiny_data["root"] / "plain")))
    p = plain_serve.signatures["serving_default"](**_tensors(swapped))["logit"].numpy()
    assert abs(p[0] + p[1] - p[2] - p[3]) < 1e-4
    assert abs(interaction) > 1e-3


def test_cli_errors_are_one_line(tiny_data, capsys):
    cfg = _config(tiny_data, "bad")
    assert cli.main(["crosses", "fives", "--config", str(cfg), "--set", "nope=1"]) == 2
    assert "unknown FIVES setting 'nope'" in capsys.readouterr().err
    assert cli.main(["crosses", "fives", "--config", str(cfg), "--fields", "user,zzz"]) == 2
    assert "no field 'zzz'" in capsys.readouterr().err
    assert cli.main(["crosses", "fives", "--config", str(cfg), "--max-order", "1"]) == 2
    assert "max_order must be an integer >= 2" in capsys.readouterr().err
    missing = _config(tiny_data, "missing", 'crosses = "nowhere.json"')
    assert cli.main(["train", "--config", str(missing)]) == 2
    assert "nowhere.json" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="cross_top_n must be >= 1"):
        load_config(_config(tiny_data, "zero", "crosses = 'x.json'\ncross_top_n = 0"))


def test_triple_search_flag_starts_from_the_preset_and_set_overrides_it():
    from features.crosses.fives_config import TRIPLE_SEARCH
    from pipelines.crosses_fives import fives_config

    parse = cli.build_parser().parse_args
    base = ["crosses", "fives", "--config", "c.toml", "--triple-search"]
    cfg = fives_config(parse([*base, "--set", "embedding_dim=8"]))
    assert cfg.strength == "contribution" and cfg.mlp == () and cfg.w_init == "degree"
    assert cfg.embedding_dim == 8 and cfg.init_logit == TRIPLE_SEARCH["init_logit"]
    assert fives_config(parse(base[:-1])).strength == "adjacency"
    assert fives_config(parse(base[:-1])).screen_orders == (2, 3)
    assert fives_config(parse([*base[:-1], "--no-screen"])).screen_orders == ()
    assert fives_config(parse([*base[:-1], "--set", "screen_orders=[3]"])).screen_orders == (3,)
    with pytest.raises(ValueError, match="needs a linear readout"):
        fives_config(parse([*base, "--set", "mlp=[8]"]))
