import sys

import pytest

from ranking.config import ModelConfig, TaskConfig


def test_model_config_validation():
    with pytest.raises(ValueError, match="model type"):
        ModelConfig(type="xgb")
    with pytest.raises(ValueError, match="mlp"):
        ModelConfig(type="dnn", mlp=())
    with pytest.raises(ValueError, match="cross_rank"):
        ModelConfig(cross_rank=-1)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"full": {"initalizer": "zeros"}}, r"embedding_options.full has unknown options \['init"),
        ({"hashing": {"bucket": 10}}, r"hashing takes \['buckets', 'seed'"),
        ({"qr": 4}, "embedding_options.qr must be a table of options, got 4"),
    ],
)
def test_embedding_options_are_checked_by_name(options, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(embedding_options=options)


def test_defaults_are_valid_and_importing_needs_no_tensorflow():
    assert ModelConfig().type == "dcn_v2"
    assert ModelConfig(mlp=[4, 2]).mlp == (4, 2)
    # the command line reads configs (and reports their errors) before TensorFlow loads
    import subprocess

    code = "import sys, pipelines.config; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


_CLICK = {"name": "click", "label": "click"}
_BUY = {"name": "buy", "label": "buy", "defined_on": "click"}


def test_tasks_are_task_configs_and_keep_their_order():
    config = ModelConfig(tasks=[_CLICK, {**_BUY, "weight": 2}], multitask="esmm")
    assert config.tasks == (TaskConfig("click", "click"), TaskConfig("buy", "buy", 2.0, "click"))
    assert ModelConfig().tasks == () and ModelConfig().multitask == "shared_bottom"
    assert ModelConfig(expert_mlp=[8, 4], tower_mlp=[]).expert_mlp == (8, 4)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"tasks": [_CLICK, _CLICK]}, "two tasks are named 'click'"),
        ({"tasks": [_CLICK, {**_BUY, "defined_on": "view"}]}, "defined_on = 'view' names no task"),
        ({"tasks": [_BUY, _CLICK]}, "defined_on = 'click' names a later task"),
        ({"tasks": [{**_CLICK, "defined_on": "click"}]}, "defined_on names the task itself"),
        ({"tasks": [_CLICK, {**_BUY, "wieght": 1}]}, r"tasks\[1\]: unknown keys \['wieght'\]"),
        ({"tasks": [{"name": "click"}]}, r"tasks\[0\]: missing keys \['label'\]"),
        ({"tasks": [{**_CLICK, "weight": -1}]}, "task 'click': weight must be a finite number"),
        ({"tasks": [{**_CLICK, "label": ""}]}, "task label must be a non-empty string"),
        ({"tasks": [_CLICK], "multitask": "esmm"}, "'esmm' needs exactly two tasks"),
        (
            {"tasks": [_CLICK, {**_BUY, "defined_on": None}], "multitask": "esmm"},
            "the second defined_on the first",
        ),
        ({"multitask": "mmo"}, "multitask 'mmo' is not one of"),
        ({"ple_levels": 0}, "ple_levels must be >= 1"),
        ({"num_experts": 0}, "num_experts must be >= 1"),
        ({"shared_experts": -1}, "shared_experts must be >= 0"),
        ({"expert_mlp": []}, "expert_mlp must be a non-empty list"),
        ({"tower_mlp": [4, 0]}, "tower_mlp sizes must be >= 1"),
        ({"expert_layer": "moa"}, "expert_layer 'moa' is not one of"),
        ({"moe_capacity_factor": 0}, "moe_capacity_factor must be > 0"),
        ({"type": "lr", "tasks": [_CLICK]}, "'lr' has no multi-task form"),
    ],
)
def test_multitask_validation(options, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(**options)
