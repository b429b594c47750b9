"""The layout of a run folder (``RunPaths``) and the logging callback commands take."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

Log = Callable[[str], None]

#: The folder of a SavedModel holding StitchRec's files (schema, metadata, statistics).
ASSETS_EXTRA = "assets.extra"


@dataclasses.dataclass(frozen=True)
class RunPaths:
    """The files of the run folder ``root`` (see ``pipelines.train`` for what each holds)."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.toml"

    @property
    def schema(self) -> Path:
        return self.root / "schema.toml"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def stats(self) -> Path:
        return self.root / "stats"

    @property
    def model_json(self) -> Path:
        return self.root / "model.json"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def report(self) -> Path:
        return self.root / "train_report.json"

    @property
    def exports(self) -> Path:
        return self.root / "export"
