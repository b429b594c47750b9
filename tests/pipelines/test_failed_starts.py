"""Commands that cannot finish say so with one ``error:`` line (exit status 2) before they do
work that the error makes useless, and leave no output behind that a later run would take for
its own."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.cli import main
from serving.testing import SCHEMA, write_linear_model
from tests.testdata import write_run_config, write_tiny_dataset


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_continue_from_a_folder_that_is_not_a_run_stops_before_the_data_is_read(tmp_path, capsys):
    data = write_tiny_dataset(tmp_path, rows=300, train_rows=240)
    config = write_run_config(tmp_path / "c.toml", data, tmp_path / "run", {"type": "lr"}, {})
    missing = tmp_path / "no-such-run"
    assert main(["train", "--config", str(config), "--continue", str(missing)]) == 2
    line = _error_line(capsys)
    assert f"continue_from = {str(missing)!r}: no statistics of a training run there" in line
    assert not (tmp_path / "run").exists()  # no config, no copied data, no folder


def test_a_run_whose_training_files_are_missing_leaves_no_run_folder(tmp_path, capsys):
    data = write_tiny_dataset(tmp_path, rows=300, train_rows=240)
    data["train"] = tmp_path / "gone"
    config = write_run_config(tmp_path / "c.toml", data, tmp_path / "run", {"type": "lr"}, {})
    assert main(["train", "--config", str(config)]) == 2
    assert "gone" in _error_line(capsys)
    assert not (tmp_path / "run").exists()
    # a run folder that was there before the failed start stays, with what it held
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    assert main(["train", "--config", str(config)]) == 2
    assert (tmp_path / "run" / "notes.txt").read_text() == "mine"


def test_predict_refuses_a_row_id_field_whose_values_repeat(tmp_path, capsys):
    model = write_linear_model(tmp_path / "model", bias=-1.0)
    (model / "assets.extra" / "schema.toml").write_text(
        SCHEMA + '\n[[fields]]\nname = "click"\nkind = "label"\n'
    )
    logs = tmp_path / "logs"
    logs.mkdir()
    table = pa.table(
        {
            "user": pa.array(["u0", "u1", "u0", "u2"]),
            "item": pa.array([1, 2, 3, 4], pa.int64()),
            "price": pa.array([1.0, 2.0, 3.0, 4.0], pa.float32()),
        }
    )
    pq.write_table(table, logs / "part-00000.parquet")
    out = tmp_path / "scores"
    argv = ["predict", "--model", str(model), "--data", str(logs), "--output", str(out)]
    assert main([*argv, "--row-id", "user"]) == 2
    line = _error_line(capsys)
    assert "--row-id 'user': 3 distinct values in 4 rows ('u0' on 2 rows)" in line
    assert not out.exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert main([*argv, "--row-id", "item"]) == 0  # unique ids score
    assert pq.read_table(out).column("row_id").to_pylist() == [1, 2, 3, 4]


def test_generate_replaces_its_own_output_whole_and_refuses_other_folders(tmp_path, capsys):
    out = tmp_path / "synth"
    assert main(["generate", "--output", str(out), "--rows", "300", "--criteo-tsv"]) == 0
    assert (out / "train.tsv").is_file()
    assert main(["generate", "--output", str(out), "--rows", "200"]) == 0
    # the earlier output is replaced whole: no TSV of the first call beside the new shards
    assert sorted(p.name for p in out.iterdir()) == [
        "ground_truth.json",
        "schema.toml",
        "test",
        "train",
    ]
    assert pq.read_table(out / "train").num_rows + pq.read_table(out / "test").num_rows == 200
    days = tmp_path / "days"
    assert main(["generate", "--output", str(days), "--rows", "200", "--days", "2"]) == 0
    assert main(["generate", "--output", str(days), "--rows", "200"]) == 0  # days.json: ours
    assert not (days / "days.json").exists() and (days / "ground_truth.json").is_file()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    capsys.readouterr()
    assert main(["generate", "--output", str(mine), "--rows", "100"]) == 2
    assert "holds files that are not a `stitchrec generate` output" in _error_line(capsys)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_export_combine_only_with_ensemble_runs(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["export", "--run", str(tmp_path / "run"), "--output", str(out)]
    assert main([*argv, "--combine", "probabilities"]) == 2
    assert "export --combine probabilities: only with --ensemble-runs" in _error_line(capsys)
    assert not out.exists()


def test_stats_replaces_its_own_output_whole_and_refuses_other_folders(tmp_path, capsys):
    data = write_tiny_dataset(tmp_path, rows=300, train_rows=240)
    out = tmp_path / "stats"
    argv = ["stats", "--schema", str(data["schema"]), "--input", str(data["train"])]
    assert main([*argv, "--output", str(out)]) == 0
    stale = out / "vocab" / "999.parquet"  # a vocabulary of an earlier, wider schema
    stale.write_bytes(b"old")
    assert main([*argv, "--output", str(out)]) == 0
    assert not stale.exists() and (out / "stats.json").is_file()
    capsys.readouterr()
    assert main([*argv, "--output", str(data["train"])]) == 2  # the training shards' folder
    assert "holds files that are not a `stitchrec stats` output" in _error_line(capsys)
    assert sorted(p.name for p in data["train"].iterdir()) == ["part-00000.parquet"]
