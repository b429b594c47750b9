import pytest

from features.vocab_state import VocabOptions
from pipelines.config import ConfigError, VocabConfig, load_config

CONFIG = """
output_dir = "runs/x"

[data]
schema = "movielens"
train = ["train"]
"""


def test_vocab_section_loads_round_trips_and_gives_options(tmp_path):
    (tmp_path / "c.toml").write_text(CONFIG + "\n[vocab]\ndecay = 0.5\nevict_after = 3\n")
    cfg = load_config(tmp_path / "c.toml")
    assert cfg.vocab == VocabConfig(decay=0.5, evict_after=3)
    assert cfg.vocab.to_options() == VocabOptions(decay=0.5, evict_after=3)
    (tmp_path / "back.toml").write_text(cfg.to_toml())
    assert "[vocab]" in cfg.to_toml() and load_config(tmp_path / "back.toml") == cfg
    over = load_config(tmp_path / "c.toml", ["vocab.decay=1"])
    assert over.vocab.to_options() == VocabOptions(decay=1.0, evict_after=3)


def test_no_vocab_section_is_none_and_not_written(tmp_path):
    (tmp_path / "c.toml").write_text(CONFIG)
    cfg = load_config(tmp_path / "c.toml")
    assert cfg.vocab is None and "[vocab]" not in cfg.to_toml()
    assert VocabConfig().to_options() == VocabOptions()


@pytest.mark.parametrize(
    ("section", "match"),
    [
        ("decay = 0", r"\[vocab\] decay must be in \(0, 1\], got 0"),
        ("decay = 1.5", r"\[vocab\] decay must be in \(0, 1\], got 1.5"),
        ('decay = "half"', r"\[vocab\] decay"),
        ("evict_after = -1", r"\[vocab\] evict_after must be >= 0 \(windows; 0: never\), got -1"),
        ("evict_after = 1.5", r"\[vocab\] evict_after"),
        ("evict = 2", r"\[vocab\]: unknown keys \['evict'\]"),
    ],
)
def test_bad_vocab_values_are_config_errors(tmp_path, section, match):
    (tmp_path / "c.toml").write_text(CONFIG + f"\n[vocab]\n{section}\n")
    with pytest.raises(ConfigError, match=match) as e:
        load_config(tmp_path / "c.toml")
    assert "c.toml" in str(e.value)
