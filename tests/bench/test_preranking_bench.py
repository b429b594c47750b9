"""bench.preranking's synthetic dataset: the generated files are not where the run converts
them, so the run's test split is the generated test rows."""

from __future__ import annotations

from bench.preranking.__main__ import parser
from bench.preranking.datasets import synthetic_config
from pipelines.run.data import prepare_data
from pipelines.run.paths import RunPaths


def test_the_synthetic_run_keeps_its_generated_test_rows(tmp_path):
    args = parser().parse_args(["--dataset", "synthetic", "--rows", "2000"])
    cfg = synthetic_config(tmp_path, args)
    paths = RunPaths(tmp_path)
    _, train, _, test = prepare_data(cfg, paths, lambda _line: None)
    assert train and test  # the test folder was emptied when the two were the same folder
    assert not any(str(f).startswith(str(paths.data)) for f in test)
