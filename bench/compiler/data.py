"""The synthetic data bench/compiler's models train and run on, written without TensorFlow (a
parent process writes it once, before its measuring child processes start)."""

from __future__ import annotations

from pathlib import Path

from features import synthetic, synthetic_config


def write_data(work: Path, rows: int, seed: int = 0) -> Path:
    """Synthetic Criteo-layout data under ``work/data`` (reused when present)."""
    data_dir = work / "data"
    if not (data_dir / "ground_truth.json").exists():
        synthetic.write_dataset(synthetic_config.SyntheticConfig(rows=rows, seed=seed), data_dir)
    return data_dir
