import json
from pathlib import Path

from pipelines.demo import run_demo


def test_demo_runs_the_whole_pipeline_on_synthetic_data(tmp_path):
    lines: list[str] = []
    summary = run_demo(rows=30_000, output=tmp_path / "demo", log=lines.append)
    assert summary["rows"]["train"] + summary["rows"]["test"] == 30_000
    # the planted single-field effects alone give LR about 0.65 on this data; the oracle ~0.83
    assert 0.6 < summary["test_auc"] < summary["oracle_auc"]
    assert 0.3 < summary["test_logloss"] < 0.6
    saved = Path(summary["artifacts"]["saved_model"])
    assert (saved / "saved_model.pb").exists()
    assert summary["saved_model_variable_bytes"] > 0
    assert json.loads((tmp_path / "demo" / "demo_report.json").read_text()) == summary
    assert any("StitchRec demo report" in line for line in lines)
    # a second demo reuses the data, and trains a fresh run
    again = run_demo(rows=30_000, output=tmp_path / "demo", log=lines.append)
    assert any("reusing the 30,000 synthetic rows" in line for line in lines)
    assert abs(again["test_auc"] - summary["test_auc"]) < 0.005  # same seed, same data
