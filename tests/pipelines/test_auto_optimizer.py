"""``[train] optimizer = "auto"``, the default of ``type = "lr"``: the exact fit (L-BFGS) where
the run allows it, FTRL where it does not, with the choice logged and reported, and what
refit and continue_from do with either."""

import dataclasses
import json
import re

import pytest

from pipelines.cli import main
from pipelines.config import ConfigError, FusionConfig, load_config
from pipelines.config_train import EXACT_FIT_ROWS
from pipelines.run.lbfgs import choose_optimizer
from pipelines.train import train
from tests.testdata import NO_VALIDATION, write_categorical_problem, write_run_config

VALIDATION = "validation_fraction = 0.2"


def _config(data, name, data_extra=VALIDATION, **train_keys):
    out = data["root"] / name
    keys = {"deterministic": True, **train_keys}
    return write_run_config(
        data["root"] / f"{name}.toml", data, out, {"type": "lr"}, keys, data_extra=data_extra
    )


def test_auto_fits_exactly_where_it_can_refits_exactly_and_cannot_be_continued(tmp_path, capsys):
    data = write_categorical_problem(tmp_path)
    cfg = load_config(_config(data, "auto"))
    assert cfg.train.optimizer == "auto"  # a type = "lr" file that sets no optimizer
    logs: list[str] = []
    report = train(cfg, logs.append)
    chose = [line for line in logs if line.startswith("optimizer auto:")]
    assert len(chose) == 1
    assert re.fullmatch(
        r"optimizer auto: lbfgs \(the exact fit: [\d,]+ training rows <= 250,000\)", chose[0]
    )
    assert report["optimizer"] == "lbfgs" and report["learning_rate"] is None
    explicit = train(load_config(_config(data, "explicit", optimizer="lbfgs")), lambda _: None)
    assert report["lbfgs"]["selected_c"] == explicit["lbfgs"]["selected_c"]
    assert report["test"] == explicit["test"]  # the same fit as optimizer = "lbfgs"

    assert main(["refit", "--run", str(data["root"] / "auto")]) == 0
    c = report["lbfgs"]["selected_c"]
    assert f"C = {c:g} fitted by L-BFGS" in capsys.readouterr().out
    refit = json.loads((data["root"] / "auto-refit" / "train_report.json").read_text())
    assert refit["optimizer"] == "lbfgs" and refit["lbfgs"]["c_path"] == [c]

    cont = _config(data, "next", continue_from=str(data["root"] / "auto"))
    assert main(["train", "--config", str(cont)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: continue_from ")
    assert "fitted exactly by L-BFGS" in err[0]


def test_auto_trains_ftrl_where_the_exact_fit_does_not_apply_and_continues_it(tmp_path):
    data = write_categorical_problem(tmp_path)
    logs: list[str] = []
    first = train(load_config(_config(data, "first", data_extra=NO_VALIDATION)), logs.append)
    assert "optimizer auto: ftrl (stochastic: no validation split to choose C on)" in logs
    assert first["optimizer"] == "ftrl" and first["learning_rate"]["base"] == 0.1
    assert first["steps"] == 16  # 4,000 rows in batches of 256: FTRL's defaults, one epoch
    logs.clear()
    cont = _config(
        data, "next", data_extra=NO_VALIDATION, continue_from=str(data["root"] / "first")
    )
    nxt = train(load_config(cont), logs.append)
    assert "optimizer auto: ftrl (stochastic: it continues a run (continue_from))" in logs
    assert nxt["optimizer"] == "ftrl" and nxt["steps"] == 16


def test_choose_optimizer_names_the_first_reason_against_the_exact_fit(tiny_data):
    cfg = load_config(_config(tiny_data, "c"))

    def choice(rows=1000, distributed=False, validation=True, model=None, **train_keys):
        c = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **train_keys))
        if model:
            c = dataclasses.replace(c, model=dataclasses.replace(c.model, **model))
        return choose_optimizer(c, rows, distributed=distributed, validation=validation)

    assert EXACT_FIT_ROWS == 250_000
    assert choice(rows=250_000) == ("lbfgs", "250,000 training rows <= 250,000")
    assert choice(rows=250_001) == ("ftrl", "250,001 training rows > 250,000")
    assert choice(distributed=True) == ("ftrl", "a distribution strategy trains it")
    assert choice(validation=False) == ("ftrl", "no validation split to choose C on")
    assert choice(validation=False, lbfgs_c=(1.0,))[0] == "lbfgs"  # one C needs no choosing
    assert choice(warm_start="w") == ("ftrl", "warm_start is set")
    assert choice(lr_schedule="cosine") == ("ftrl", "lr_schedule = 'cosine'")
    assert choice(ensemble="auto") == ("ftrl", "ensemble = 'auto'")
    assert choice(weight_average="ema") == ("ftrl", "weight_average = 'ema'")
    assert choice(max_steps=5) == ("ftrl", "max_steps = 5")
    assert choice(model={"l2_wide": 1e-3}) == ("ftrl", "[model] l2_wide or l1_wide is set")
    fused = dataclasses.replace(cfg, fusion=FusionConfig())
    assert choose_optimizer(fused, 10, distributed=False, validation=True)[1] == "[fusion] is set"


def test_auto_is_for_linear_models_only(tiny_data):
    path = write_run_config(
        tiny_data["root"] / "dnn.toml",
        tiny_data,
        tiny_data["root"] / "dnn",
        {"type": "dnn"},
        {"optimizer": "auto"},
    )
    with pytest.raises(ConfigError, match=r"optimizer = 'auto' .* needs \[model\] type = 'lr'"):
        load_config(path)
