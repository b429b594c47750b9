"""The daily journal read back: the same call continues, another call or a damaged journal is
one error naming the file."""

from __future__ import annotations

import pytest

from features.read_report import DataError
from pipelines.daily_state import JOURNAL_FILE, Journal
from pipelines.errors import UsageError

CALL = {"window": "2026-12-01", "repo": "models", "rule": "better", "metric": "auc"}


def test_the_same_call_continues_its_journal(tmp_path):
    journal = Journal.start(tmp_path, CALL)
    journal.steps["train"] = {"run": "r1"}
    journal.save()
    back = Journal.open(tmp_path, dict(CALL))
    assert back is not None and back.call == CALL and back.steps == {"train": {"run": "r1"}}
    assert Journal.open(tmp_path / "nowhere", CALL) is None
    with pytest.raises(UsageError, match="holds the day of --rule better, not --rule always"):
        Journal.open(tmp_path, {**CALL, "rule": "always"})


@pytest.mark.parametrize(
    ("text", "error", "expected"),
    [
        ('{"call": {', DataError, "is not valid JSON (Expecting"),
        ("[]", DataError, "holds a JSON array, not an object"),
        ('{"call": {}}', UsageError, "has no call and steps objects"),
    ],
)
def test_a_damaged_journal_is_one_error_naming_it(tmp_path, text, error, expected):
    (tmp_path / JOURNAL_FILE).write_text(text)
    with pytest.raises(error) as err:
        Journal.open(tmp_path, CALL)
    assert repr(str(tmp_path / JOURNAL_FILE)) in str(err.value) and expected in str(err.value)
    assert "the journal `stitchrec daily` keeps" in str(err.value)
