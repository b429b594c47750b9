"""Sequence pooling options the block does not take are a config error naming them."""

from __future__ import annotations

import pytest

from ranking.config import ModelConfig
from ranking.sequence_features import SequenceOptionsError, SequencePooling

GROUPS = [
    {
        "name": "hist",
        "members": ["hist"],
        "tables": ["item"],
        "dims": [4],
        "max_len": 5,
        "targets": ["item"],
    }
]


def test_unknown_option_names_the_option_and_the_pooling():
    with pytest.raises(SequenceOptionsError, match=r"\{'foo': 1\} for pooling 'din'.*'foo'"):
        SequencePooling(GROUPS, "din", {"foo": 1})


def test_bad_option_value_names_the_pooling():
    with pytest.raises(SequenceOptionsError, match="for pooling 'din'"):
        SequencePooling(GROUPS, "din", {"activation": "nope"})


def test_unknown_pooling_is_refused_by_the_config():
    with pytest.raises(ValueError, match=r"sequence_pooling 'attn' is not one of \['din'"):
        ModelConfig(sequence_pooling="attn")
