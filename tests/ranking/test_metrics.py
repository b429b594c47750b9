import numpy as np
import pytest
from sklearn.metrics import log_loss, roc_auc_score

from pipelines import metrics


@pytest.mark.parametrize("seed", range(5))
def test_auc_and_logloss_match_sklearn(seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 5000).astype(float)
    p = np.clip(rng.beta(2, 3, 5000) + 0.1 * y, 0, 1)
    p[:500] = np.round(p[:500], 1)  # ties
    assert metrics.auc(y, p) == pytest.approx(roc_auc_score(y, p), abs=1e-9)
    assert metrics.logloss(y, p) == pytest.approx(log_loss(y, np.clip(p, 1e-7, 1 - 1e-7)), abs=1e-9)


def test_auc_by_hand():
    # positives 0.8, 0.4; negatives 0.4, 0.1: pairs (0.8>0.4) (0.8>0.1) (0.4=0.4 -> 1/2) (0.4>0.1)
    assert metrics.auc([1, 1, 0, 0], [0.8, 0.4, 0.4, 0.1]) == pytest.approx(3.5 / 4)


@pytest.mark.parametrize(
    ("y", "p", "match"),
    [
        ([1, 1], [0.2, 0.3], "both classes"),
        ([1, 2], [0.2, 0.3], "0 or 1"),
        ([1, 0], [0.2], "rows"),
        ([1, 0], [np.nan, 0.3], "non-finite"),
        ([], [], "empty"),
    ],
)
def test_auc_errors(y, p, match):
    with pytest.raises(ValueError, match=match):
        metrics.auc(y, p)


def test_logloss_rejects_out_of_range_probabilities():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        metrics.logloss([1, 0], [1.2, 0.3])
