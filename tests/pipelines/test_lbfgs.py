"""``[train] optimizer = "lbfgs"``: the exact logistic regression, its regularization path chosen
on validation, its resume, and the configs it refuses."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import OneHotEncoder

from pipelines.cli import main
from pipelines.config import ConfigError, load_config
from pipelines.export import export_run
from pipelines.run import lbfgs
from pipelines.run.loop import Run
from pipelines.run.model import load_trained_model
from pipelines.run.scoring import evaluate_model, make_scorer
from pipelines.train import train
from tests.testdata import NO_VALIDATION, write_categorical_problem, write_run_config


def _config(data, out, data_extra=NO_VALIDATION, model=None, **train_keys):
    keys = {"optimizer": "lbfgs", "deterministic": True, **train_keys}
    path = data["root"] / f"{Path(out).name}.toml"
    model = {"type": "lr", **(model or {})}
    return write_run_config(path, data, out, model, keys, data_extra=data_extra)


def _quiet(_: str) -> None:
    pass


def test_one_c_fits_scikit_learns_logistic_regression(tmp_path):
    # the same objective on the same one-hot ids: the test probabilities agree to 1e-4
    data = write_categorical_problem(tmp_path)
    report = train(load_config(_config(data, tmp_path / "run", lbfgs_c=[0.05])), log=_quiet)
    tr, te = (pq.read_table(data[k]).to_pandas() for k in ("train", "test"))
    enc = OneHotEncoder(handle_unknown="ignore").fit(tr[["a", "b"]])
    sk = LogisticRegression(C=0.05, tol=1e-10, max_iter=10_000)
    sk.fit(enc.transform(tr[["a", "b"]]), tr["label"])
    expected = sk.predict_proba(enc.transform(te[["a", "b"]]))[:, 1]
    serve = tf.saved_model.load(str(export_run(tmp_path / "run"))).signatures["serving_default"]
    got = serve(**{k: tf.constant(te[k].to_numpy().astype(str)) for k in ("a", "b")})["score"]
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-4)
    fit = report["lbfgs"]["fits"][0]
    assert fit["converged"] and fit["c"] == 0.05 and fit["l2"] == pytest.approx(1 / (0.1 * 4000))
    assert report["learning_rate"] is None and report["steps"] == fit["iterations"]


def _objectives(cfg, data):
    """Both forms of J over the trained model of ``cfg``'s run."""
    train(cfg, log=_quiet)
    model, schema, _ = load_trained_model(cfg.output_dir)
    run = Run(cfg, None, None, schema, [data["train"]], [], [], _quiet)
    batches = lbfgs.preprocess(model, run.train_reader())
    return model, lbfgs.GraphObjective(model, batches), lbfgs.SparseObjective(model, batches)


def test_both_forms_compute_the_objective_and_its_gradient(tiny_data):
    # tiny_data has categorical, multi-valued and numeric fields: the two forms agree, and the
    # gradient is J's (central differences along random directions)
    cfg = load_config(_config(tiny_data, tiny_data["root"] / "g", lbfgs_c=[1.0]))
    model, graph, sparse = _objectives(cfg, tiny_data)
    assert model.wide._dense is not None  # the numeric weights are in the vector
    assert lbfgs.SparseObjective.applies(model)
    rng = np.random.default_rng(0)
    x = graph.weights() + rng.normal(0, 0.1, graph.weights().size)
    l2 = 0.01
    value, grad = sparse.value_and_gradient(x, l2)
    g_value, g_grad = graph.value_and_gradient(x, l2)
    assert g_value == pytest.approx(value, rel=1e-6)
    np.testing.assert_allclose(g_grad, grad, rtol=1e-4, atol=1e-7)
    for _ in range(3):
        d = rng.normal(size=x.size)
        d /= np.linalg.norm(d)
        h = 1e-3
        up, _ = sparse.value_and_gradient(x + h * d, l2)
        down, _ = sparse.value_and_gradient(x - h * d, l2)
        assert (up - down) / (2 * h) == pytest.approx(grad @ d, rel=1e-6, abs=1e-9)


def test_a_compressed_wide_table_is_fitted_by_the_graph_form(tmp_path):
    # a QR table is not one row per id: the graph form fits it, to a converged fit
    data = write_categorical_problem(tmp_path)
    model = {"embedding_method": "qr", "compress_min_rows": 1, "embedding_compression": 2.0}
    cfg = load_config(_config(data, tmp_path / "qr", model=model, lbfgs_c=[0.05]))
    report = train(cfg, log=_quiet)
    assert report["lbfgs"]["form"] == "graph"
    assert report["lbfgs"]["fits"][0]["converged"]
    plain = train(load_config(_config(data, tmp_path / "full", lbfgs_c=[0.05])), log=_quiet)
    assert plain["lbfgs"]["form"] == "sparse"


def test_the_path_is_chosen_on_validation_and_the_best_fit_is_exported(tmp_path):
    data = write_categorical_problem(tmp_path)
    path = [0.001, 0.01, 0.1, 1.0, 10.0]
    cfg = load_config(
        _config(
            data,
            tmp_path / "run",
            data_extra="validation_fraction = 0.2",
            lbfgs_c=path,
            early_stopping=False,
        )
    )
    logs = []
    report = train(cfg, log=logs.append)
    history = [
        json.loads(line)
        for line in (tmp_path / "run" / "history.jsonl").read_text().split("\n")
        if line
    ]
    assert [h["c"] for h in history] == path
    best = max(history, key=lambda h: h["auc"])
    assert report["lbfgs"]["selected_c"] == best["c"]
    assert (
        report["selected"]["step"] == best["step"]
        and report["selection"]["best"]["auc"] == best["auc"]
    )
    assert len({h["auc"] for h in history}) == len(path)  # the penalty changes the fit
    assert sum("test auc" in line for line in logs) == 1  # the test is scored once
    # the exported model is the best fit: its validation AUC is the best one
    model, schema, _ = load_trained_model(tmp_path / "run")
    val = sorted((tmp_path / "run" / "data" / "validation").glob("*.parquet"))
    assert evaluate_model(make_scorer(model, schema), schema, val)["auc"] == pytest.approx(
        best["auc"], abs=1e-6
    )


def test_early_stopping_ends_the_path(tmp_path):
    data = write_categorical_problem(tmp_path)
    cfg = load_config(
        _config(
            data,
            tmp_path / "run",
            data_extra="validation_fraction = 0.2",
            lbfgs_c=[0.001, 0.01, 0.1, 1.0, 10.0, 100.0, 1000.0],
            patience=1,
        )
    )
    report = train(cfg, log=_quiet)
    fitted = [f["c"] for f in report["lbfgs"]["fits"]]
    assert report["selection"]["stopped_early"] and len(fitted) < 7
    best = report["lbfgs"]["selected_c"]
    assert fitted[-1] == 10 * best  # one value past the best (patience 1)


def test_a_resumed_path_ends_where_an_uninterrupted_one_ends(tmp_path):
    data = write_categorical_problem(tmp_path)
    common = {"data_extra": "validation_fraction = 0.2", "early_stopping": False}
    full = [0.01, 0.1, 1.0]
    straight = train(load_config(_config(data, tmp_path / "s", lbfgs_c=full, **common)), _quiet)
    first_cfg = load_config(_config(data, tmp_path / "r", lbfgs_c=full[:2], **common))
    train(first_cfg, _quiet)
    resumed = train(
        dataclasses.replace(first_cfg, train=dataclasses.replace(first_cfg.train, lbfgs_c=full)),
        _quiet,
    )
    assert [f["c"] for f in resumed["lbfgs"]["fits"]] == [1.0]  # only the point not yet fitted
    a, _, _ = load_trained_model(tmp_path / "s")
    b, _, _ = load_trained_model(tmp_path / "r")
    for x, y in zip(a.weights, b.weights, strict=True):
        np.testing.assert_array_equal(x.numpy(), y.numpy())
    assert resumed["test"] == straight["test"]
    assert resumed["steps"] == straight["steps"]


def test_configs_lbfgs_cannot_fit_are_refused(tiny_data, tmp_path):
    root = tiny_data["root"]
    with pytest.raises(ConfigError, match=r"needs \[model\] type = 'lr', got 'dnn'"):
        load_config(_config(tiny_data, root / "a", model={"type": "dnn"}))
    with pytest.raises(ConfigError, match=r"lbfgs_c must be a list of values > 0"):
        load_config(_config(tiny_data, root / "b", lbfgs_c=[0.1, 0.0]))
    with pytest.raises(ConfigError, match=r"lbfgs_c has a value twice"):
        load_config(_config(tiny_data, root / "c", lbfgs_c=[0.1, 0.1]))
    with pytest.raises(ConfigError, match=r"with lr_schedule = 'cosine'"):
        load_config(_config(tiny_data, root / "d", lr_schedule="cosine"))
    with pytest.raises(ConfigError, match=r"is chosen on a validation split"):
        train(load_config(_config(tiny_data, root / "e")), _quiet)  # 7 values, no validation
    with pytest.raises(ConfigError, match=r"l2_wide = 0.01 and l1_wide = 0.0, expected 0"):
        cfg = _config(tiny_data, root / "f", model={"l2_wide": 0.01}, lbfgs_c=[1.0])
        train(load_config(cfg), _quiet)
    assert load_config(_config(tiny_data, root / "g", lbfgs_c=[1, 3])).train.lbfgs_c == (1.0, 3.0)


def test_the_cli_reports_a_refused_lbfgs_run_in_one_line(tiny_data, capsys):
    cfg = _config(tiny_data, tiny_data["root"] / "cli", model={"l2_wide": 0.01}, lbfgs_c=[1.0])
    assert main(["train", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "l2_wide = 0.01" in err[0]


def _sklearn_scores(train_dirs: list[Path], test_dir: Path, c: float) -> np.ndarray:
    """scikit-learn's LogisticRegression(C=c) on one-hot a, b of ``train_dirs``' rows: the test
    rows' probabilities."""
    tr = pa.concat_tables([pq.read_table(d) for d in train_dirs]).to_pandas()
    te = pq.read_table(test_dir).to_pandas()
    enc = OneHotEncoder(handle_unknown="ignore").fit(tr[["a", "b"]])
    sk = LogisticRegression(C=c, tol=1e-10, max_iter=10_000)
    sk.fit(enc.transform(tr[["a", "b"]]), tr["label"])
    return sk.predict_proba(enc.transform(te[["a", "b"]]))[:, 1]


def test_refit_fits_the_selected_c_on_training_and_validation_rows(tmp_path, capsys):
    data = write_categorical_problem(tmp_path)
    cfg = _config(
        data, tmp_path / "run", data_extra="validation_fraction = 0.2", lbfgs_c=[0.01, 0.1, 1.0]
    )
    chosen = train(load_config(cfg), _quiet)["lbfgs"]["selected_c"]
    assert main(["refit", "--run", str(tmp_path / "run"), "--learning-rate", "0.1"]) == 2
    assert "leave out --learning-rate" in capsys.readouterr().err  # no learning rate to set
    assert main(["refit", "--run", str(tmp_path / "run")]) == 0
    assert f"C = {chosen:g} fitted by L-BFGS" in capsys.readouterr().out
    refit = tmp_path / "run-refit"
    report = json.loads((refit / "train_report.json").read_text())
    run_data = tmp_path / "run" / "data"
    assert report["lbfgs"]["c_path"] == [chosen]
    assert report["train_rows"] == 4000 and report["validation_rows"] == 0
    expected = _sklearn_scores([run_data / "train", run_data / "validation"], data["test"], chosen)
    serve = tf.saved_model.load(str(export_run(refit))).signatures["serving_default"]
    te = pq.read_table(data["test"]).to_pandas()
    got = serve(**{k: tf.constant(te[k].to_numpy().astype(str)) for k in ("a", "b")})["score"]
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-4)
    (tmp_path / "run" / "train_report.json").write_text('{"lbfgs": ')  # damaged
    again = tmp_path / "again"
    assert main(["refit", "--run", str(tmp_path / "run"), "--output", str(again)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train_report.json' is not valid JSON" in err[0], err
    assert err[0].endswith("expected the report `stitchrec train` writes")
    assert not again.exists()  # refused before anything is written
