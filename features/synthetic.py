"""The embedded default dataset: a synthetic Criteo-layout click log with planted effects.

StitchRec's default data (``stitchrec demo`` trains on it) and the ground truth that later work
(cross search, pair statistics, embedding studies) is checked against. The layout is Criteo's:
a 0/1 ``label``, numeric counts ``I1..I{num_numeric}`` and hashed categoricals
``C1..C{num_categorical}`` whose values look like Criteo's 8-hex-digit tokens.

Features. Every cell is missing with probability ``m = missing_rate``. A categorical field ``f``
with vocabulary ``V_f`` draws the frequency rank ``r`` of its value Zipf-like::

    p_f(r) = (r + 1)^-s / sum_{j<V_f} (j + 1)^-s,        r = 0 .. V_f - 1,  s = zipf_exponent

(inverse-CDF sampling) and writes the token ``tok_f[r]``, a seeded random 32-bit number in hex,
unique over all (field, value) pairs, so the rank cannot be read from the token. A numeric field
``k`` is a Criteo-like non-negative count ``I_k = floor(exp(mu_k + sigma_k * eps))``,
``eps ~ N(0, 1)``, with per-field ``mu_k ~ U(-0.5, 5)``, ``sigma_k ~ U(0.6, 1.8)`` drawn from the
seed, stored as float32.

Click model. With ``v_f`` the value rank of field ``f`` and ``z_k`` the standardized
``log1p(I_k)``::

    logit = b + sum_{single f}        s_f   * w_f[v_f]
              + sum_{pairs (a,b)}     s_ab  * G_ab[v_a, v_b]
              + sum_{triples (a,b,c)} s_abc * G_abc[v_a, v_b, v_c]
              + sum_{numeric k}       w_k   * z_k,          z_k = (log1p(I_k) - mean_k) / std_k
    label ~ Bernoulli(sigmoid(logit))

* ``w_f`` holds one N(0, 1) weight per value, centered and scaled to mean 0, variance 1 under
  ``p_f``: ``s_f`` is the standard deviation of the term over the rows where ``f`` is present.
* ``G`` is a table of seeded random +-1 signs over the value tuples of the cross, projected onto
  its pure top-order interaction (the ``p``-weighted mean along every axis is subtracted in turn,
  the weighted ANOVA projection) and scaled to variance 1 under the product of the marginals.
  Its mean over any one field's values is exactly zero for every setting of the other fields, so a
  planted cross is a PURE interaction: it adds no main effect to its fields (and a planted triple
  adds no pair effect to its sub-pairs); only the crossed feature explains it.
* ``mean_k``, ``std_k`` are the population moments of ``log1p(I_k)`` (a 36k-point quadrature
  over ``eps``), reported in the ground truth: they define ``z_k``.
* A missing value contributes 0 to every term that involves it.
* ``s_* = effect_scale * U(0.75, 1.25)``; ``w_k = +-effect_scale * U(0.75, 1.25)``.
* ``b`` is found by bisection so that the mean click probability of a 2^17-row calibration
  sample equals ``target_ctr``.

The effect fields are chosen by the seed over disjoint field sets, so the ground truth is
unambiguous: triples among fields with ``2 <= V <= 100`` (``TRIPLE_MAX_VOCAB``), pairs among the
remaining fields with ``2 <= V <= 1000`` (``PAIR_MAX_VOCAB``), single effects among the other
fields with ``V >= 2``. Small vocabularies keep the head value tuples frequent, so every planted
effect is learnable from about a million rows.

Determinism. The model (tokens, effect tables, intercept) depends on the config and seed only,
never on ``rows`` or the batch size. Rows are generated in fixed chunks of ``CHUNK_ROWS`` rows,
chunk ``i`` from its own ``SeedSequence(seed, spawn_key=(1, i))`` stream, and re-cut to the
requested ``batch_rows``: the same config gives identical columns whatever ``batch_rows`` is,
and the rows of a shorter run are the first rows of a longer one with the same seed.

Opt-in extras (off by default, and then the rows are exactly the above): ``sequences`` adds a
target item, its category and behaviour sequences with a planted history x target click term,
``conversion`` a label ``buy`` defined on the clicked rows (``features.synthetic_sequences``
gives their formulas); the other columns are the same with or without them.

The settings, constants and schema are in ``features.synthetic_config``, the click model and
the ground truth in ``features.synthetic_model``; this module draws rows and writes datasets.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from features.readers import rebatch
from features.shards import ShardWriter
from features.synthetic_config import (
    CHUNK_ROWS,
    CONVERSION_LABEL,
    LABEL,
    SyntheticConfig,
    arrow_schema,
    is_int,
    is_real,
    synthetic_schema,
)
from features.synthetic_model import (
    ClickModel,
    Draw,
    click_model,
    draw_chunk,
    ground_truth,
    seeded_rng,
    sigmoid,
)
from features.synthetic_sequences import HistoryDraw, history_columns
from ranking.metrics import auc

# Private columns of the drawn batches (not written): the true click probability and the split
# draw of each row (and, with ``conversion``, the true pCVR).
PROB_COLUMN = "__prob"
SPLIT_COLUMN = "__split"
_PRIVATE_CVR = "__cvr"


def _head(x: Any, n: int) -> Any:
    if x is None:
        return None
    if isinstance(x, HistoryDraw):
        return x.head(n)
    return [a[:n] for a in x] if isinstance(x, list) else x[:n]


def _chunk_batch(config: SyntheticConfig, model: ClickModel, index: int) -> pa.RecordBatch:
    """Chunk ``index`` as a RecordBatch plus the private true-probability and split columns
    (and, with ``conversion``, the true pCVR)."""
    n = min(CHUNK_ROWS, config.rows - index * CHUNK_ROWS)
    # always a full chunk of draws, so a shorter run is a prefix of a longer one
    d = draw_chunk(config, model, seeded_rng(config.seed, 1, index), CHUNK_ROWS)
    if n < CHUNK_ROWS:
        d = Draw(*(_head(getattr(d, f.name), n) for f in dataclasses.fields(d)))
    return draw_batch(config, model, d)


def draw_batch(
    config: SyntheticConfig,
    model: ClickModel,
    d: Draw,
    extra: dict[str, pa.Array] | None = None,
) -> pa.RecordBatch:
    """The rows of a draw: the columns of ``arrow_schema(config)``, then the ``extra`` columns
    (not null), then the private ``PROB_COLUMN`` (``sigmoid(intercept + d.offset)``) and
    ``SPLIT_COLUMN`` (and, with ``conversion``, the true pCVR); ``label`` is drawn from
    ``PROB_COLUMN``."""
    prob = sigmoid(model.intercept + d.offset)
    click = (d.label_u < prob).astype(np.float32)
    cols: dict[str, pa.Array] = {LABEL: pa.array(click)}
    for name, c in zip(config.numeric_names, d.counts, strict=True):
        miss = np.isnan(c)
        cols[name] = pa.array(np.where(miss, np.float32(0), c), mask=miss, type=pa.float32())
    for name, r, tokens in zip(config.categorical_names, d.ranks, model.tokens, strict=True):
        cols[name] = pc.take(tokens, pa.array(r, mask=r < 0, type=pa.int32()))
    if model.history is not None:
        cols.update(history_columns(model.history, d.history))
    private = [pa.field(PROB_COLUMN, pa.float64()), pa.field(SPLIT_COLUMN, pa.float64())]
    cols[PROB_COLUMN], cols[SPLIT_COLUMN] = pa.array(prob), pa.array(d.split_u)
    if model.conversion is not None:
        cvr = sigmoid(model.conversion.intercept + d.buy_offset)
        cols[CONVERSION_LABEL] = pa.array(click * (d.buy_u < cvr).astype(np.float32))
        cols[_PRIVATE_CVR] = pa.array(cvr)
        private.append(pa.field(_PRIVATE_CVR, pa.float64()))
    schema = arrow_schema(config)
    for name, column in (extra or {}).items():
        schema = schema.append(pa.field(name, column.type, nullable=False))
        cols[name] = column
    for field in private:
        schema = schema.append(field)
    return pa.RecordBatch.from_arrays([cols[name] for name in schema.names], schema=schema)


def _check_positive(name: str, value: Any) -> int:
    if not is_int(value) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _private_batches(config: SyntheticConfig, batch_rows: int) -> Iterator[pa.RecordBatch]:
    model = click_model(config)
    chunks = (_chunk_batch(config, model, i) for i in range(-(-config.rows // CHUNK_ROWS)))
    return rebatch(chunks, batch_rows)


def generate_batches(
    config: SyntheticConfig, batch_rows: int = 262_144
) -> Iterator[pa.RecordBatch]:
    """Streams ``config.rows`` rows as RecordBatches of ``batch_rows`` rows (the last: the rest).

    Columns: ``label`` float32 0/1, ``I*`` float32 (null = missing), ``C*`` string (null =
    missing), and with ``conversion`` / ``sequences`` the columns of
    ``features.synthetic_sequences`` (order: ``arrow_schema(config)``). The rows do not depend
    on ``batch_rows``.
    """
    batch_rows = _check_positive("batch_rows", batch_rows)
    names = arrow_schema(config).names
    return (b.select(names) for b in _private_batches(config, batch_rows))


def click_probabilities(config: SyntheticConfig, batch_rows: int = 262_144) -> Iterator[np.ndarray]:
    """The true ``sigmoid(logit)`` of each row (float64), batched like ``generate_batches``."""
    batch_rows = _check_positive("batch_rows", batch_rows)
    return (b.column(PROB_COLUMN).to_numpy() for b in _private_batches(config, batch_rows))


# ---------------------------------------------------------------------------------------------
# Writing a dataset
# ---------------------------------------------------------------------------------------------


class _SplitWriter:
    """Parquet shards of one split (``features.shards.ShardWriter``) and its row and click
    counts; an empty split still gets one empty, readable shard."""

    def __init__(self, directory: Path, schema: pa.Schema, rows_per_shard: int) -> None:
        self.directory, self.schema = directory, schema
        self._shards = ShardWriter(directory, rows_per_shard, "part")
        self.paths: list[str] = []
        self.rows = 0
        self.clicks = 0.0

    def write(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows
        self.clicks += float(pc.sum(batch.column("label")).as_py() or 0.0)
        self._shards.write(batch)

    def finish(self) -> None:
        paths = self._shards.close()
        if not paths:
            paths = [self.directory / "part-00000.parquet"]
            pq.write_table(self.schema.empty_table(), paths[0])
        self.paths = [str(p) for p in paths]


class _TsvWriter:
    """Criteo TSV: label, I* as integers, C* hex tokens; tab separated, empty = missing (the
    conversion label and the history fields are not written)."""

    def __init__(self, path: Path, config: SyntheticConfig) -> None:
        import pyarrow.csv as pcsv

        self.path = path
        self.schema = pa.schema(
            [pa.field("label", pa.int8())]
            + [pa.field(n, pa.int64()) for n in config.numeric_names]
            + [pa.field(n, pa.string()) for n in config.categorical_names]
        )
        options = pcsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
        self._writer = pcsv.CSVWriter(str(path), self.schema, write_options=options)

    def write(self, batch: pa.RecordBatch) -> None:
        batch = batch.select(self.schema.names)
        cols = [c.cast(t) for c, t in zip(batch.columns, self.schema.types, strict=True)]
        self._writer.write_batch(pa.RecordBatch.from_arrays(cols, schema=self.schema))

    def close(self) -> None:
        self._writer.close()


def _check_write_args(test_fraction: Any, rows_per_shard: Any) -> tuple[float, int]:
    if not is_real(test_fraction) or not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be a number in [0, 1), got {test_fraction!r}")
    return float(test_fraction), _check_positive("rows_per_shard", rows_per_shard)


def write_dataset(
    config: SyntheticConfig,
    out_dir: str | Path,
    *,
    test_fraction: float = 0.2,
    rows_per_shard: int = 1_000_000,
    criteo_tsv: bool = False,
) -> dict[str, Any]:
    """Writes the dataset under ``out_dir`` and returns a summary.

    Files: ``train/part-NNNNN.parquet``, ``test/part-NNNNN.parquet`` (a row is a test row when
    its seeded split draw is below ``test_fraction``; stale ``part-*.parquet`` files in those
    folders are removed first), ``schema.toml``, ``ground_truth.json`` (``ground_truth(config)``
    plus an ``observed`` entry), and with ``criteo_tsv`` ``train.tsv`` / ``test.tsv`` holding the
    same rows as the parquet splits in Criteo's TSV layout.

    Summary: rows and CTR per split, ``oracle_auc`` (AUC of the true click probability on the test
    split, the ceiling of any model; None for an empty or one-class split) and the paths. With
    ``config.conversion`` also ``oracle_auc_tasks``: ``click`` (= ``oracle_auc``), ``ctcvr``
    (``buy`` against the true pCTR * pCVR on all test rows, ESMM's full-impression task) and
    ``cvr`` (``buy`` against the true pCVR on the clicked test rows).
    """
    test_fraction, rows_per_shard = _check_write_args(test_fraction, rows_per_shard)
    out = Path(out_dir)
    feature_schema = synthetic_schema(config)
    private = [PROB_COLUMN, LABEL] + ([_PRIVATE_CVR, CONVERSION_LABEL] if config.conversion else [])
    summary, test = write_splits(
        out,
        arrow_schema(config),
        _private_batches(config, 262_144),
        test_fraction=test_fraction,
        rows_per_shard=rows_per_shard,
        keep=private,
        tsv_config=config if criteo_tsv else None,
    )
    oracle = _oracle_aucs(test)
    summary["oracle_auc"] = oracle.pop("click")
    if config.conversion:
        summary["oracle_auc_tasks"] = {"click": summary["oracle_auc"], **oracle}
    feature_schema.save(out / "schema.toml")
    truth = ground_truth(config)
    keys = ("rows", "ctr", "oracle_auc") + (("oracle_auc_tasks",) if config.conversion else ())
    truth["observed"] = {k: summary[k] for k in keys}
    (out / "ground_truth.json").write_text(json.dumps(truth, indent=2) + "\n")
    return summary


def write_splits(
    out: Path,
    schema: pa.Schema,
    batches: Iterable[pa.RecordBatch],
    *,
    test_fraction: float,
    rows_per_shard: int,
    keep: list[str],
    tsv_config: SyntheticConfig | None = None,
) -> tuple[dict[str, Any], pa.Table]:
    """Writes drawn ``batches`` as the ``train/`` and ``test/`` Parquet shards of ``out``.

    A row is a test row when its ``SPLIT_COLUMN`` draw is below ``test_fraction``; the shards
    hold the columns of ``schema``; with ``tsv_config`` the same rows also go to ``train.tsv`` /
    ``test.tsv`` in Criteo's layout. Returns the summary of ``write_dataset`` with
    ``oracle_auc`` None, and the ``keep`` columns of the test rows (for the oracle AUCs).
    """
    out.mkdir(parents=True, exist_ok=True)
    shards = {s: _SplitWriter(out / s, schema, rows_per_shard) for s in ("train", "test")}
    tsv = {s: _TsvWriter(out / f"{s}.tsv", tsv_config) for s in shards} if tsv_config else {}
    test_parts: list[pa.RecordBatch] = []
    for batch in batches:
        is_test = pc.less(batch.column(SPLIT_COLUMN), test_fraction)
        for split, mask in (("test", is_test), ("train", pc.invert(is_test))):
            part = batch.filter(mask)
            if split == "test":
                test_parts.append(part.select(keep))
            part = part.select(schema.names)
            shards[split].write(part)
            if split in tsv:
                tsv[split].write(part)
    for shard in shards.values():
        shard.finish()
    for writer in tsv.values():
        writer.close()
    return _summary(out, shards, tsv, None), pa.Table.from_batches(test_parts)


def oracle_auc(labels: np.ndarray, scores: np.ndarray) -> float | None:
    """ROC AUC, None for an empty or one-class set."""
    positives = labels.sum()
    return auc(labels, scores) if 0 < positives < labels.size else None


def _oracle_aucs(test: pa.Table) -> dict[str, float | None]:
    """AUC of the true probability against the drawn labels of the test rows: ``click``, and
    with a conversion label ``ctcvr`` (buy against pCTR * pCVR on all rows) and ``cvr`` (buy
    against pCVR on the clicked rows)."""
    click, p_click = test.column(LABEL).to_numpy(), test.column(PROB_COLUMN).to_numpy()
    out = {"click": oracle_auc(click, p_click)}
    if CONVERSION_LABEL in test.column_names:
        buy, p_cvr = test.column(CONVERSION_LABEL).to_numpy(), test.column(_PRIVATE_CVR).to_numpy()
        clicked = click == 1
        out["ctcvr"] = oracle_auc(buy, p_click * p_cvr)
        out["cvr"] = oracle_auc(buy[clicked], p_cvr[clicked])
    return out


def _summary(
    out: Path, shards: dict[str, _SplitWriter], tsv: dict[str, _TsvWriter], oracle: float | None
) -> dict[str, Any]:
    paths: dict[str, Any] = {s: w.paths for s, w in shards.items()}
    paths["schema"] = str(out / "schema.toml")
    paths["ground_truth"] = str(out / "ground_truth.json")
    for s, w in tsv.items():
        paths[f"{s}_tsv"] = str(w.path)
    return {
        "rows": {s: w.rows for s, w in shards.items()},
        "ctr": {s: (w.clicks / w.rows if w.rows else None) for s, w in shards.items()},
        "oracle_auc": oracle,
        "paths": paths,
    }
