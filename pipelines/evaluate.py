"""``stitchrec evaluate``: AUC and log loss of an exported SavedModel on held-out data.

The data is either Parquet shards written by StitchRec (columns named by field; the schema comes
from the SavedModel's ``assets.extra/schema.toml``), or raw files read with a schema
(``--schema``), streamed through ``features.readers`` with the same bad-row rules as training.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from features import read_report, readers
from features.dataset import iter_batches, list_parquet, table_to_numpy
from features.schema import Schema, SchemaError, load_schema
from pipelines.run.paths import ASSETS_EXTRA
from ranking import metrics


def _batches(
    schema: Schema | None,
    model_schema: Schema,
    data: Sequence[str | Path],
    batch_size: int,
    max_bad_rows: int,
    report: read_report.ReadReport,
) -> Iterator[dict[str, np.ndarray]]:
    fields = [*model_schema.model_inputs, model_schema.label]
    if schema is None:
        yield from iter_batches(
            model_schema, list_parquet(list(data)), batch_size=batch_size, shuffle=False
        )
        return
    missing = [f.name for f in fields if f.name not in schema.names]
    if missing:
        raise SchemaError(f"schema {schema.name!r} lacks fields the model needs: {missing}")
    for batch in readers.read_batches(
        schema, data, batch_rows=batch_size, max_bad_rows=max_bad_rows, report=report
    ):
        yield table_to_numpy(batch, [schema.field(f.name) for f in fields])


def score_saved_model(
    model_dir: str | Path,
    data: Sequence[str | Path],
    *,
    schema: Schema | None = None,
    batch_size: int = 8192,
    max_bad_rows: int = 0,
) -> tuple[np.ndarray, np.ndarray, read_report.ReadReport]:
    """(labels, scores, read report) of the SavedModel's ``serving_default`` over ``data``."""
    model_dir = Path(model_dir)
    schema_file = model_dir / ASSETS_EXTRA / "schema.toml"
    if not schema_file.exists():
        raise FileNotFoundError(f"{model_dir} is not a StitchRec SavedModel: no {schema_file}")
    model_schema = load_schema(schema_file)
    fn = tf.saved_model.load(str(model_dir)).signatures["serving_default"]
    inputs = [f.name for f in model_schema.model_inputs]
    label = model_schema.label.name
    report = read_report.ReadReport()
    labels, scores = [], []
    for batch in _batches(schema, model_schema, data, batch_size, max_bad_rows, report):
        out = fn(**{n: tf.constant(batch[n]) for n in inputs})
        labels.append(batch[label])
        scores.append(out["score"].numpy())
    if not labels:
        raise read_report.DataError(f"no rows to evaluate in {[str(d) for d in data]}")
    return np.concatenate(labels), np.concatenate(scores), report


def evaluate(
    model_dir: str | Path,
    data: Sequence[str | Path],
    *,
    schema: str | Path | None = None,
    batch_size: int = 8192,
    max_bad_rows: int = 0,
) -> dict[str, Any]:
    y, p, report = score_saved_model(
        model_dir,
        data,
        schema=load_schema(schema) if schema else None,
        batch_size=batch_size,
        max_bad_rows=max_bad_rows,
    )
    return {
        "rows": int(y.size),
        "positives": int(y.sum()),
        "auc": metrics.auc(y, p),
        "logloss": metrics.logloss(y, p),
        "mean_score": float(p.mean()),
        "bad_rows_skipped": report.bad_rows,
    }


def cmd_evaluate(args: argparse.Namespace) -> int:
    """``stitchrec evaluate`` (flags in ``pipelines.cli_args``): prints the metrics as JSON."""
    result = evaluate(args.model, args.data, schema=args.schema, max_bad_rows=args.max_bad_rows)
    print(json.dumps(result, indent=1), flush=True)
    return 0
