"""bench.serving.front_door_report: the paired ratios' 95% interval, against hand-computed
values, and the tables of a run of one section; front_door's --sections."""

from __future__ import annotations

import math

import pytest

from bench.serving.front_door import _args
from bench.serving.front_door_report import _paired, aggregate, interval, tables


def test_the_interval_of_equal_ratios_is_the_ratio():
    assert interval([1.1, 1.1, 1.1]) == pytest.approx([1.1, 1.1])


def test_the_interval_of_two_ratios_by_hand():
    # logs 0 and ln 1.21; mean ln 1.1; sd ln(1.21)/sqrt(2); t(0.975, 1) = 12.7062
    half = 12.7062 * (math.log(1.21) / math.sqrt(2)) / math.sqrt(2)
    lo, hi = interval([1.0, 1.21])
    assert lo == pytest.approx(1.1 * math.exp(-half), rel=1e-4)
    assert hi == pytest.approx(1.1 * math.exp(half), rel=1e-4)


@pytest.mark.parametrize("ratios", [[1.05], [], [1.0, 0.0]])
def test_no_interval_for_fewer_than_two_or_a_ratio_not_positive(ratios):
    assert interval(ratios) is None


def test_paired_ratios_carry_the_interval():
    rows = [
        {"section": "overheads", "repeat": rep, "server": name, "qps": qps, "p99_ms": p99,
         "p50_ms": 1.0}
        for rep, (b, v) in enumerate([(100.0, 90.0), (100.0, 95.0), (110.0, 99.0)])
        for name, qps, p99 in (("base", b, 10.0), ("trace", v, 11.0))
    ]  # fmt: skip
    d = _paired(rows, "overheads")["trace"]
    assert d["p99_ratio"]["ci95"] == pytest.approx([1.1, 1.1])
    assert d["qps_ratio"]["values"] == [0.9, 0.95, 0.9]
    lo, hi = d["qps_ratio"]["ci95"]
    assert lo < (0.9 * 0.95 * 0.9) ** (1 / 3) < hi < 1.0


def test_the_tables_of_a_run_with_the_overheads_alone():
    rows = [
        {"section": "overheads", "repeat": rep, "server": name, "protocol": "grpc",
         "candidates": 100, "driver": "loadgen", "qps": 100.0 + rep, "p99_ms": 10.0,
         "p50_ms": 5.0, "failures": 0, "requests": 10, "load": "1.0 1.0 1.0"}
        for rep in range(2)
        for name in ("base", "trace-0.1")
    ]  # fmt: skip
    text = tables(aggregate(rows))
    assert "| base | trace-0.1 | 1.000 [1.000, 1.000]; 95% 1.000 to 1.000 |" in text


def test_sections_are_checked():
    assert _args(["--sections", "overheads"]).sections == ("overheads",)
    assert _args([]).sections == ("protocols", "overheads", "shadow")
    with pytest.raises(SystemExit):
        _args(["--sections", "overheads,speed"])


def test_variants_are_checked():
    assert _args(["--variants", "log-10%"]).variants == ("log-10%",)
    assert _args([]).variants == ("log-10%", "trace-1.0", "trace-1.0-call", "trace-0.1")
    for bad in ("log-10%,trace-2", "base", ""):
        with pytest.raises(SystemExit):
            _args(["--variants", bad])


def test_help_prints_the_variants(capsys):
    with pytest.raises(SystemExit) as stop:
        _args(["--help"])
    assert stop.value.code == 0
    assert "log-10%,trace-1.0" in capsys.readouterr().out
