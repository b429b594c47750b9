"""The FIVES interaction screen's counting in this process and on a 2-worker local Dask cluster,
on the capped values of real training rows."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from features.crosses import interaction_screen as isc
from features.schema import FeatureKind, load_schema
from pipelines.config_sections import EngineConfig
from pipelines.engines import open_runner


def encoded(shards: Path, rows: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """``ids [rows, F]`` (each field's values as integer codes, missing as one more code), the
    labels and the field names of the first ``rows`` training rows."""
    schema = load_schema("criteo").as_parquet()
    fields = [f.name for f in schema.model_inputs if f.kind != FeatureKind.SEQUENCE]
    table = pq.read_table(sorted(shards.glob("*.parquet")), columns=[*fields, "label"])
    table = table.slice(0, rows)
    ids = np.empty((table.num_rows, len(fields)), np.int64)
    for j, name in enumerate(fields):
        codes = pc.dictionary_encode(table.column(name).combine_chunks()).indices
        ids[:, j] = pc.fill_null(codes, len(codes)).to_numpy(zero_copy_only=False)
    return ids, table.column("label").to_numpy().astype(np.float64), fields


def screen_times(shards: Path, rows: int) -> dict[str, Any]:
    ids, y, fields = encoded(shards, rows)
    t0 = time.time()
    local, _ = isc.screen(ids, y, fields, order=3, max_cells=4096)
    local_s = time.time() - t0
    with open_runner(EngineConfig("dask", workers=2), lambda _: None) as runner:
        runner.describe()  # the cluster starts before the clock
        t0 = time.time()
        dask, _ = isc.screen(ids, y, fields, order=3, max_cells=4096, runner=runner)
        dask_s = time.time() - t0
    same = [(c.fields, c.z, c.effect) for c in local] == [(c.fields, c.z, c.effect) for c in dask]
    return {
        "rows": len(y),
        "sets": math.comb(len(fields), 3),
        "local_s": round(local_s, 1),
        "dask2_s": round(dask_s, 1),
        "speed": round(local_s / dask_s, 2),
        "equal": same,
    }
