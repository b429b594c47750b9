"""bench/fives at toy size, run as a program: the ground-truth scores, the random-cross baseline
and the relative gains in its JSON agree with the crosses it reports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fives_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    tmp = tmp_path_factory.mktemp("bench_fives")
    cmd = [
        sys.executable, "-m", "bench.fives", "--rows", "3000", "--seeds", "0", "--epochs", "1",
        "--downstream-rows", "2000", "--skip-movielens", "--skip-reference",
        "--out", str(tmp / "fives.json"), "--work", str(tmp / "work"),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp / "fives.json").read_text()), proc.stdout


def _fields(name: str, sep: str) -> frozenset[str]:
    return frozenset(name.split(sep))


@pytest.mark.slow
def test_planted_scores_count_exact_field_sets_only(fives_run):
    results, stdout = fives_run
    entry = results["synthetic"][0]
    for key in ("ground_truth", "ground_truth_edges"):
        s = entry[key]
        ranks = s["ranks"]
        assert s["planted"] == len(ranks) == 5 and s["top_n"] == 2 * s["planted"]
        hits = sum(r is not None and r <= s["top_n"] for r in ranks.values())
        assert s["recall"] == hits / s["planted"] and s["precision"] == hits / s["top_n"]
        assert s["all_in_top"] == (hits == s["planted"])
        pairs = [r for k, r in ranks.items() if len(k.split("x")) == 2]
        triples = [r for k, r in ranks.items() if len(k.split("x")) == 3]
        assert s["recall_pairs"] == sum(r is not None and r <= s["top_n"] for r in pairs) / len(
            pairs
        )
        assert s["recall_triples"] == sum(r is not None and r <= s["top_n"] for r in triples) / len(
            triples
        )
    # a planted cross's rank is that of the cross with exactly its fields: a sub-pair of a
    # planted triple ranked above it does not count
    top = [_fields(name, "_x_") for name, _, _ in entry["top"]]
    for planted, rank in entry["ground_truth"]["ranks"].items():
        fields = _fields(planted, "x")
        first = next((i + 1 for i, t in enumerate(top) if t == fields), None)
        if first is not None or (rank is not None and rank <= len(top)):
            assert rank == first
    assert "ground truth: precision" in stdout


@pytest.mark.slow
def test_random_crosses_keep_orders_and_avoid_exclusions(fives_run):
    down = fives_run[0]["synthetic"][0]["downstream"]
    found = [_fields(c, "x") for c in down["fives"]["crosses"]]
    random = [_fields(c, "x") for c in down["random"]["crosses"]]
    assert [len(c) for c in random] == [len(c) for c in found]
    assert len(set(random)) == len(random) and not set(random) & set(found)
    assert len(down["mi"]["crosses"]) == len(found)
    assert all(len(c.split("x")) == 2 for c in down["mi"]["crosses"])


@pytest.mark.slow
def test_relative_gains_are_against_plain_lr(fives_run):
    results, stdout = fives_run
    down = results["synthetic"][0]["downstream"]
    table3 = results["summary"]["synthetic"]["table3"]
    plain = down["none"]["lr_auc"]
    want_fives = 100 * (down["fives"]["lr_auc"] / plain - 1)
    want_xgb = 100 * (down["none"]["xgb_auc"] / plain - 1)
    assert abs(table3["fives+lr"]["gain_pct"]["mean"] - want_fives) < 1e-9
    assert abs(table3["none+xgb"]["gain_pct"]["mean"] - want_xgb) < 1e-9
    assert abs(table3["none+lr"]["gain_pct"]["mean"]) < 1e-9
    assert "relative AUC gain over plain LR" in stdout
