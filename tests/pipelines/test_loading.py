"""``pipelines.loading``: the collector paused while a command's modules load, in the
``stitchrec`` script's own process only."""

from __future__ import annotations

import gc

import pytest

from pipelines import loading


@pytest.fixture()
def collector_restored():
    was_enabled = gc.isenabled()
    yield
    gc.unfreeze()
    if was_enabled:
        gc.enable()
    else:
        gc.disable()


def _cycles(n: int) -> list[list]:
    out = []
    for _ in range(n):
        a: list = []
        a.append(a)
        out.append(a)
    return out


def test_outside_the_script_nothing_changes(collector_restored, monkeypatch):
    monkeypatch.setitem(loading._PAUSE, "on", False)
    gc.enable()
    frozen = gc.get_freeze_count()
    with loading.loading_modules():
        assert gc.isenabled()
        _cycles(100)
    assert gc.isenabled() and gc.get_freeze_count() == frozen


def test_in_the_script_the_block_runs_unpaused_and_what_it_made_is_frozen(
    collector_restored, monkeypatch
):
    monkeypatch.setitem(loading._PAUSE, "on", False)
    loading.pause_collector_when_loading()
    assert loading._PAUSE["on"]
    gc.enable()
    full = gc.get_stats()[2]["collections"]
    with loading.loading_modules():
        assert not gc.isenabled()
        kept = _cycles(50_000)
    assert gc.isenabled()
    assert gc.get_stats()[2]["collections"] == full
    assert gc.get_freeze_count() >= len(kept)
    gc.disable()  # a collector that was off stays off
    with loading.loading_modules():
        pass
    assert not gc.isenabled()


def test_an_error_in_the_block_still_restores_the_collector(collector_restored, monkeypatch):
    monkeypatch.setitem(loading._PAUSE, "on", True)
    gc.enable()
    with pytest.raises(ImportError), loading.loading_modules():
        raise ImportError("no module named x")
    assert gc.isenabled()
