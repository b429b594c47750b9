"""PSI, Jensen-Shannon divergence and binning (features.drift) against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from features import drift


def test_psi_of_a_two_bin_shift_by_hand():
    # (0.25 - 0.5) ln(0.25 / 0.5) + (0.75 - 0.5) ln(0.75 / 0.5)
    expected = 0.25 * math.log(2) + 0.25 * math.log(1.5)
    assert drift.psi([0.5, 0.5], [0.25, 0.75]) == pytest.approx(expected)
    assert drift.psi([2, 2], [1, 3]) == pytest.approx(expected)  # counts are normalized
    assert drift.psi([1, 2, 3], [1, 2, 3]) == 0.0


def test_psi_raises_an_empty_bin_to_epsilon():
    # reference [1, 0], current [0.5, 0.5]: bin 2 of the reference is raised to 1e-4
    expected = (0.5 - 1.0) * math.log(0.5 / 1.0) + (0.5 - 1e-4) * math.log(0.5 / 1e-4)
    assert drift.psi([1, 0], [1, 1]) == pytest.approx(expected)
    assert drift.psi([1, 0], [1, 1], epsilon=0.01) == pytest.approx(
        0.5 * math.log(2) + 0.49 * math.log(50)
    )


def test_js_divergence_by_hand_and_its_range():
    # m = [0.75, 0.25]; KL(t||m) = log2(4/3); KL(s||m) = 0.5 log2(2/3) + 0.5 log2(2)
    expected = (math.log2(4 / 3) + 0.5 * math.log2(2 / 3) + 0.5) / 2
    assert drift.js_divergence([1, 0], [0.5, 0.5]) == pytest.approx(expected)
    assert drift.js_divergence([1, 0], [0, 1]) == pytest.approx(1.0)
    assert drift.js_divergence([3, 1], [3, 1]) == 0.0
    assert drift.js_divergence([1, 2], [2, 1]) == pytest.approx(drift.js_divergence([2, 1], [1, 2]))


def test_bins_quantiles_and_status():
    assert drift.bin_numeric(np.array([0.0, 1.0, 1.5, 5.0, np.nan]), [1.0, 2.0]).tolist() == [
        1,
        2,
        1,
    ]
    assert drift.quantile_boundaries(np.arange(1.0, 101.0), 4) == [25.75, 50.5, 75.25]
    assert drift.quantile_boundaries(np.ones(10), 4) == [1.0]  # ties collapse
    assert drift.mean_std(np.array([1.0, 3.0, np.nan])) == (2.0, 1.0)
    assert [drift.status(v) for v in (0.1, 0.15, 0.2, 0.21)] == ["ok", "watch", "watch", "flagged"]


def test_bad_histograms_are_value_errors():
    with pytest.raises(ValueError, match="differ in bins"):
        drift.psi([1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="finite and >= 0"):
        drift.js_divergence([1, -1], [1, 1])
    with pytest.raises(ValueError, match="epsilon"):
        drift.psi([1], [1], epsilon=0)
