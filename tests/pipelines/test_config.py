from pathlib import Path

import pytest

from pipelines.config import ConfigError, load_config, parse_override
from pipelines.run.model import make_optimizer

CONFIG = """
output_dir = "runs/x"

[data]
schema = "schema.toml"
train = ["train"]
test = "test"

[model]
type = "dnn"
mlp = [8, 4]
embedding_methods = {userId = "bh", "movie-id" = "amtl"}
embedding_options = {bh = {block_bits = 4, codes = "fingerprint"}}

[train]
epochs = 2
"""


def test_load_resolves_paths_and_applies_overrides(tmp_path):
    (tmp_path / "c.toml").write_text(CONFIG)
    cfg = load_config(tmp_path / "c.toml", ["train.epochs=5", "model.type=dcn_v2"])
    assert cfg.output_dir == str(tmp_path / "runs" / "x")
    assert cfg.data.schema == str(tmp_path / "schema.toml")
    assert cfg.data.train == (str(tmp_path / "train"),)
    assert cfg.data.test == (str(tmp_path / "test"),)
    assert cfg.train.epochs == 5 and cfg.model.type == "dcn_v2" and cfg.model.mlp == (8, 4)
    assert cfg.model.method_of("userId") == "bh" and cfg.model.method_of("other") == "full"
    assert cfg.model.bh_codes() == "fingerprint"
    # a shipped schema name stays a name
    (tmp_path / "d.toml").write_text(CONFIG.replace('"schema.toml"', '"movielens"'))
    assert load_config(tmp_path / "d.toml").data.schema == "movielens"


def test_to_toml_round_trip(tmp_path):
    (tmp_path / "c.toml").write_text(CONFIG)
    cfg = load_config(tmp_path / "c.toml")
    (tmp_path / "back.toml").write_text(cfg.to_toml())
    assert load_config(tmp_path / "back.toml") == cfg


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (("epochs = 2", "epochs = 0"), r"\[train\] epochs must be >= 1"),
        (("epochs = 2", "epoch = 2"), r"unknown keys \['epoch'\]"),
        (('type = "dnn"', 'type = "gbdt"'), "model type 'gbdt'"),
        (('train = ["train"]', ""), "either `raw` files or `train`"),
        (("[train]", "[trian]"), r"unknown top-level keys \['trian'\]"),
        (("mlp = [8, 4]", "mlp = [8, 4"), "not valid TOML"),
        (('userId = "bh"', 'userId = "lsh"'), r"embedding_methods\['userId'\] = 'lsh'"),
        (('codes = "fingerprint"', 'codes = "md5"'), "bh.codes = 'md5'"),
        (("bh = {", "bhh = {"), r"unknown methods \['bhh'\]"),
    ],
)
def test_errors_name_file_and_key(tmp_path, edit, match):
    (tmp_path / "c.toml").write_text(CONFIG.replace(*edit))
    with pytest.raises(ConfigError, match=match) as e:
        load_config(tmp_path / "c.toml")
    assert "c.toml" in str(e.value)


def test_override_parsing():
    assert parse_override("train.learning_rate=0.01") == ("train.learning_rate", 0.01)
    assert parse_override("model.type=dnn") == ("model.type", "dnn")
    assert parse_override("model.mlp=[4, 2]") == ("model.mlp", [4, 2])
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_override("epochs")
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(Path("/nonexistent.toml"))


def test_an_unknown_optimizer_name_is_a_config_error():
    assert type(make_optimizer("sgd", 0.1)).__name__ == "SGD"
    with pytest.raises(
        ConfigError, match=r"\[train\] optimizer = 'adamw'.*'adagrad', 'adam', 'ftrl', 'sgd'"
    ):
        make_optimizer("adamw", 0.1)
