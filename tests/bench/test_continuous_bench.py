"""bench.continuous's command line: its usage errors (the bench itself trains dozens of runs),
and its count of the values active in the eviction horizon from a saved vocabulary state."""

from __future__ import annotations

import pyarrow as pa
import pytest

from bench.continuous.__main__ import parse
from bench.continuous.report import horizon_active
from features.vocab_state import VocabOptions, VocabState


def test_unknown_dataset_and_too_few_days_are_usage_errors(capsys):
    for flags, message in (
        (["--datasets", "synthetic,nope"], "--datasets: unknown ['nope']"),
        (["--days", "2"], "--days 2: expected at least 3"),
    ):
        with pytest.raises(SystemExit) as exit_:
            parse(flags)
        assert exit_.value.code == 2
        assert message in capsys.readouterr().err


def test_values_active_in_the_horizon_are_those_seen_in_its_last_windows(tmp_path):
    table = pa.table(
        {
            "value": ["a", "b", "c", "d", "e"],
            "count": [3.0, 2.0, 1.0, 1.0, 0.5],
            "last_seen": [5, 4, 3, 5, 2],
            "id": [1, 2, 3, 4, 0],  # e: counted, outside the vocabulary
        },
        schema=pa.schema(
            [("value", pa.string()), ("count", pa.float64()), ("last_seen", pa.int64()),
             ("id", pa.int64())]
        ),
    )  # fmt: skip
    VocabState({"item": table}, 5, VocabOptions()).save(tmp_path / "stats")
    assert horizon_active(tmp_path, evict_after=1) == {"item": 3}  # windows 4 and 5: a, b, d
    assert horizon_active(tmp_path, evict_after=3) == {"item": 5}
    assert horizon_active(tmp_path, evict_after=0) == {"item": 2}
