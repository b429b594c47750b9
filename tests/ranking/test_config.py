import sys

import pytest

from ranking.config import ModelConfig


def test_model_config_validation():
    with pytest.raises(ValueError, match="model type"):
        ModelConfig(type="xgb")
    with pytest.raises(ValueError, match="mlp"):
        ModelConfig(type="dnn", mlp=())
    with pytest.raises(ValueError, match="cross_rank"):
        ModelConfig(cross_rank=-1)


def test_defaults_are_valid_and_importing_needs_no_tensorflow():
    assert ModelConfig().type == "dcn_v2"
    assert ModelConfig(mlp=[4, 2]).mlp == (4, 2)
    # the command line reads configs (and reports their errors) before TensorFlow loads
    import subprocess

    code = "import sys, pipelines.config; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
