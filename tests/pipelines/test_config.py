from pathlib import Path

import pytest

from features.schema import load_schema
from pipelines.config import EPOCHS_BOUND, ConfigError, TrainConfig, load_config, parse_override
from pipelines.preranking import prerank_model_config
from pipelines.run.model import check_tasks, make_optimizer
from ranking.config import ModelConfig, TaskConfig

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
        (("epochs = 2", "continue_epochs = -1"), r"\[train\] continue_epochs must be >= 0"),
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


# Values of the wrong type: named with section, key, value and the expected type, before any
# section's own checks read them loosely.
_TYPED = """
output_dir = "runs/x"
[data]
schema = "schema.toml"
train = "train"
"""


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('[model]\nmlp = "64"', r"\[model\] mlp must be a list of integers, got '64'"),
        ("[model]\nmlp = [64, 1.5]", r"\[model\] mlp must be a list of integers, got \[64, 1.5\]"),
        ("[model]\nembedding_dim = true", r"\[model\] embedding_dim must be an integer, got True"),
        ("[model]\nembedding_methods = {a = 1}", r"embedding_methods must be a table of strings"),
        ('[train]\ndeterministic = "false"', r"\[train\] deterministic must be true or false"),
        ("[train]\nbatch_size = 12.5", r"\[train\] batch_size must be an integer, got 12.5"),
        ('[train]\nbatch_size = "big"', r"\[train\] batch_size must be an integer, got 'big'"),
        ('[train]\nlearning_rate = "0.1"', r"\[train\] learning_rate must be a finite number"),
        ("[train]\nwarm_start = 3", r"\[train\] warm_start must be a string, got 3"),
        ("[fusion]\nkernels = 1", r"\[fusion\] kernels must be true or false, got 1"),
        (
            '[fusion]\nactivations = "fwd"',
            r"\[fusion\] activations must be one of \['backprop', 'forward_ad'\], got 'fwd'",
        ),
        ("[distribute]\nstrategy = 2", r"\[distribute\] strategy must be a string, got 2"),
        ("[preranking]\ntower_mlp = 64", r"\[preranking\] tower_mlp must be a list of integers"),
        ('[preranking]\nreg_weight = "x"', r"\[preranking\] reg_weight must be a finite number"),
        ('[pair_stats]\npairs = [["a", "b"]]\nalpha = "x"', r"\[pair_stats\] alpha must be a"),
        ('[pair_stats]\npairs = [["a", 1]]', r"\[pair_stats\] pairs must be a list of lists of"),
        ('[pair_stats]\npairs = [["a", "b"]]\nhead = "32"', r"\[pair_stats\] head must be a list"),
        ('[pair_stats]\npairs = [["a", "a"]]', r"\['a', 'a'\]: a pair needs two different fields"),
        ('[pair_stats]\npairs = [["a", "b"], ["b", "a"]]', r"\['b', 'a'\] is given twice"),
        ("[model]\n[train]\nseed = 1.0", r"\[train\] seed must be an integer, got 1.0"),
    ],
)
def test_values_of_the_wrong_type_are_config_errors(tmp_path, text, match):
    (tmp_path / "c.toml").write_text(_TYPED + text + "\n")
    with pytest.raises(ConfigError, match=match) as e:
        load_config(tmp_path / "c.toml")
    assert "c.toml" in str(e.value)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ("schema = 5\ntrain = 't'", r"\[data\] schema must be a string, got 5"),
        ("schema = 's.toml'\ntrain = [1]", r"\[data\] train must be a list of strings, got \[1\]"),
        (
            "schema = 's.toml'\nraw = 'r'\ntest_fraction = '0.1'",
            r"test_fraction must be a finite number",
        ),
        ("schema = 's.toml'\ntrain = 't'\nmax_bad_rows = 1.5", r"max_bad_rows must be an integer"),
    ],
)
def test_data_values_of_the_wrong_type_are_config_errors(tmp_path, data, match):
    (tmp_path / "c.toml").write_text(f'output_dir = "r"\n[data]\n{data}\n')
    with pytest.raises(ConfigError, match=match):
        load_config(tmp_path / "c.toml")
    (tmp_path / "c.toml").write_text(f"output_dir = 3\n[data]\n{data}\n")
    with pytest.raises(ConfigError, match="output_dir must be a string, got 3"):
        load_config(tmp_path / "c.toml")
    (tmp_path / "c.toml").write_text('output_dir = "r"\ndata = 3\n')
    with pytest.raises(ConfigError, match=r"\[data\] must be a table, got 3"):
        load_config(tmp_path / "c.toml")


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ("train = 't'\nvalidation_split = 'last'", r"validation_split 'last' is not one of"),
        (
            "train = 't'\nvalidation = 'v'\nvalidation_split = 'recent'",
            r"validation_split = 'recent' splits the training rows, but validation files",
        ),
    ],
)
def test_validation_split_errors(tmp_path, data, match):
    (tmp_path / "c.toml").write_text(f'output_dir = "r"\n[data]\nschema = "s.toml"\n{data}\n')
    with pytest.raises(ConfigError, match=match):
        load_config(tmp_path / "c.toml")


def test_right_types_are_kept_and_integers_count_as_numbers(tmp_path):
    (tmp_path / "c.toml").write_text(
        _TYPED + "[train]\nlearning_rate = 1\ndeterministic = false\n[model]\nmlp = [64]\n"
    )
    cfg = load_config(tmp_path / "c.toml")
    assert cfg.train.learning_rate == 1 and cfg.train.deterministic is False
    assert cfg.model.mlp == (64,)


def test_overrides_meet_the_same_type_checks(tmp_path):
    (tmp_path / "c.toml").write_text(_TYPED)
    cfg = load_config(tmp_path / "c.toml", ["train.deterministic=false", "model.mlp=[8]"])
    assert cfg.train.deterministic is False and cfg.model.mlp == (8,)
    assert load_config(tmp_path / "c.toml", ["data.test=t2"]).data.test == (str(tmp_path / "t2"),)
    for text, match in (
        ("train.batch_size=big", r"--set train.batch_size=big: \[train\] batch_size must be an"),
        ("train.deterministic=yes", r"deterministic must be true or false, got 'yes'"),
        ("model.mlp=64", r"--set model.mlp=64: \[model\] mlp must be a list of integers, got 64"),
        ("data.schema=5", r"\[data\] schema must be a string, got 5"),
        ("fusion.tables=1", r"\[fusion\] tables must be true or false, got 1"),
        ("nosuch.key=1", r"^--set nosuch.key=1: unknown section 'nosuch'; expected one of \["),
        ("train.epoch=1", r"^--set train.epoch=1: \[train\] unknown key 'epoch'; allowed: \["),
    ):
        with pytest.raises(ConfigError, match=match):
            load_config(tmp_path / "c.toml", [text])


def test_raw_files_with_test_shards_are_refused(tmp_path):
    (tmp_path / "c.toml").write_text('output_dir = "r"\n[data]\nschema = "s"\nraw = "a.csv"\n')
    assert load_config(tmp_path / "c.toml").data.raw == (str(tmp_path / "a.csv"),)
    with pytest.raises(ConfigError, match=r"\[data\] raw and test:.*give `test` only with"):
        load_config(tmp_path / "c.toml", ["data.test=t"])


@pytest.mark.parametrize(
    ("train", "data", "epochs"),
    [
        ("", "", EPOCHS_BOUND),  # early stopping on the default 10% validation split
        ('ensemble = "auto"', "", EPOCHS_BOUND),  # the snapshots' saturation ends the run
        ('ensemble = "auto"\nearly_stopping = false', "", EPOCHS_BOUND),
        ("early_stopping = false", "", 1),
        ("", "validation_fraction = 0.0", 1),  # nothing would end it
        ("", 'validation = ["val"]', EPOCHS_BOUND),
        ("epochs = 3", "", 3),  # a value the file sets wins
    ],
)
def test_epochs_default_is_a_bound_where_validation_ends_the_run(tmp_path, train, data, epochs):
    text = CONFIG.replace("epochs = 2", train).replace('test = "test"', f'test = "test"\n{data}')
    (tmp_path / "c.toml").write_text(text)
    cfg = load_config(tmp_path / "c.toml")
    assert EPOCHS_BOUND == 20
    assert cfg.train.epochs == epochs
    assert cfg.train.batch_size == 256 == TrainConfig().batch_size
    assert TrainConfig().epochs == 1  # built in code: no file, no bound
    distributed = text + '\n[distribute]\nstrategy = "auto"\n'
    (tmp_path / "d.toml").write_text(distributed)
    if "epochs = 3" not in train:
        assert load_config(tmp_path / "d.toml").train.epochs == 1  # no early stopping there


_TASKS = """
[model]
type = "dnn"
multitask = "esmm"
tasks = [{name = "click", label = "label"}, {name = "buy", label = "buy", defined_on = "click"}]
"""


def test_model_tasks_from_toml_and_back(tmp_path):
    (tmp_path / "c.toml").write_text(_TYPED + _TASKS)
    cfg = load_config(tmp_path / "c.toml", ["model.tower_mlp=[4]"])
    assert cfg.model.tasks == (TaskConfig("click", "label"), TaskConfig("buy", "buy", 1.0, "click"))
    assert cfg.model.multitask == "esmm" and cfg.model.tower_mlp == (4,)
    (tmp_path / "back.toml").write_text(cfg.to_toml())
    assert load_config(tmp_path / "back.toml") == cfg


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (('label = "buy"', "label = 3"), r"\[model\] tasks must be a list of tables \{name, label"),
        (("tasks = [{", 'tasks = ["click", {'), r"\[model\] tasks must be a list of tables"),
        (
            ('defined_on = "click"', 'defined_on = "view"'),
            "task 'buy': defined_on = 'view' names no",
        ),
        (('defined_on = "click"', "weight = 1, wieght = 2"), r"tasks\[1\]: unknown keys"),
        (('multitask = "esmm"', 'multitask = "esmm"\nple_levels = 0'), "ple_levels must be"),
    ],
)
def test_model_task_errors_are_config_errors(tmp_path, edit, match):
    (tmp_path / "c.toml").write_text(_TYPED + _TASKS.replace(*edit))
    with pytest.raises(ConfigError, match=match) as e:
        load_config(tmp_path / "c.toml")
    assert "c.toml" in str(e.value)


_THREE_LABELS = """
name = "three"
[source]
format = "parquet"
[[fields]]
name = "user"
kind = "categorical"
[[fields]]
name = "label"
kind = "label"
[[fields]]
name = "view"
kind = "label"
[[fields]]
name = "buy"
kind = "label"
defined_on = "label"
"""


def test_tasks_are_checked_against_the_schema_labels(tmp_path):
    (tmp_path / "s.toml").write_text(_THREE_LABELS)
    schema = load_schema(tmp_path / "s.toml")
    click, buy = TaskConfig("click", "label"), TaskConfig("buy", "buy", defined_on="click")
    check_tasks(ModelConfig(tasks=(click, buy)), schema)
    check_tasks(ModelConfig(), schema)
    cases = [
        ((click, TaskConfig("x", "nope")), r"tasks\[1\] \('x'\): label 'nope' is not a label"),
        ((TaskConfig("v", "view"), click), r"tasks\[0\] \('v'\) is the primary task"),
        (
            (click, TaskConfig("v", "view"), TaskConfig("b", "buy", defined_on="v")),
            "defined_on task 'v' reads label 'view', but the schema defines label 'buy' on",
        ),
    ]
    for tasks, match in cases:
        with pytest.raises(ConfigError, match=match):
            check_tasks(ModelConfig(tasks=tasks), schema)


def test_fscd_refuses_a_model_with_a_wide_term(tmp_path):
    (tmp_path / "c.toml").write_text(
        _TYPED + '[model]\ntype = "dnn"\nwide = true\n[preranking]\nmethod = "fscd"\n'
    )
    with pytest.raises(ConfigError, match="'fscd' needs a model without a wide term"):
        prerank_model_config(load_config(tmp_path / "c.toml"))


def test_run_epochs_are_continue_epochs_only_where_a_run_continues():
    first = TrainConfig(epochs=20, continue_epochs=1)
    assert first.run_epochs().epochs == 20
    continued = TrainConfig(epochs=20, continue_epochs=1, continue_from="runs/day1")
    assert continued.run_epochs().epochs == 1
    assert TrainConfig(epochs=20, continue_from="runs/day1").run_epochs().epochs == 20
