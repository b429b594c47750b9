"""A server's prediction log as the data of an A/B comparison, and the scores it holds.

``stitchrec ab --data LOGDIR --join OUTCOMES --on request_id`` reads the prediction log that
``stitchrec serve --log-dir`` writes (``serving.log_format``) and joins it with an outcomes file
(Parquet or CSV): the join key, optionally ``row`` (the row's position in its request; without
it an outcome applies to every row of its request) and the label column(s) the schema names.
Logged rows without an outcome are dropped and counted (``Logs.info["rows_without_outcome"]``).
The joined table has one column per logged feature (named without the ``feature.`` prefix), the
outcome columns, and the log's metadata (``request_id``, ``row``, ``arm``, ``version``, ...) and
``output.<o>`` columns. Shadow rows (scored by a shadow version, never returned) are left out
unless ``include_shadow``.

``logged:ARM`` and ``logged:vN`` (``LoggedSource``) name the score the log holds
(``output.score``) for the rows served by traffic arm ``ARM`` or by model version ``N``.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from features.schema import Schema, load_schema
from features.shard_reader import column_to_numpy
from pipelines.evaluation.sources import SCHEMA_ASSET, Logs, ScoreSource, SourceError
from pipelines.evaluation.tasks import ModelTask
from serving import log_format

LOGGED = "logged:"
_POSITION = "__position"


def log_problem(data: list[str]) -> str | None:
    """Why ``data`` is not a prediction log (its first Parquet file must have the log's
    metadata columns), as a clause naming the path; None when it is one."""
    absent = [d for d in data if not Path(d).exists()]
    if absent:
        return f"{absent[0]!r} does not exist"
    files = log_format.log_files(data)
    if not files:
        return f"it holds no *{log_format.SUFFIX} file"
    first = files[0]
    if first.suffix != log_format.SUFFIX:
        return f"{str(first)!r} is not a *{log_format.SUFFIX} file"
    try:
        names = pq.read_schema(first).names
    except (pa.ArrowException, OSError) as e:
        return f"{str(first)!r} cannot be read as Parquet ({e})"
    missing = [c for c in log_format.META_COLUMNS if c not in names]
    if missing:
        return f"its file {str(first)!r} lacks the log's column(s) {missing}"
    return None


def is_prediction_log(data: list[str]) -> bool:
    """Whether ``data`` is a prediction log: its first Parquet file has the log's columns."""
    return log_problem(data) is None


def _read_log(data: list[str], model: str | None, include_shadow: bool) -> pa.Table:
    try:
        table = log_format.read_logs(data, model)
    except (ValueError, FileNotFoundError, pa.ArrowException) as e:
        raise SourceError(f"--data {' '.join(data)}: {e}") from None
    models = sorted(set(table.column("model").to_pylist()))
    if model is None and len(models) > 1:
        raise SourceError(
            f"the prediction log {' '.join(data)} holds models {models}: pick one with --model"
        )
    if not include_shadow:
        table = table.filter(pc.invert(table.column("shadow")))
    return table


def _read_outcomes(path: str) -> pa.Table:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"--join {path!r}: the outcomes file does not exist")
    try:
        if p.suffix == ".csv":
            return pacsv.read_csv(p)
        if p.suffix == ".parquet":
            return pq.read_table(p)
    except (pa.ArrowException, OSError) as e:
        raise SourceError(f"--join {path}: cannot read the outcomes ({e})") from None
    raise SourceError(f"--join {path}: expected a .parquet or .csv outcomes file")


def _keys(log: pa.Table, outcomes: pa.Table, on: str, where: str) -> list[str]:
    """The join columns, the outcomes' key cast to the log's type; checks one outcome per key."""
    if on not in outcomes.column_names:
        raise SourceError(f"{where} has no join column {on!r}; it has {outcomes.column_names}")
    if on not in log.column_names:
        raise SourceError(
            f"--on {on!r}: the prediction log has no such column; it has {log_format.META_COLUMNS}"
        )
    keys = [on, "row"] if "row" in outcomes.column_names and on != "row" else [on]
    seen = outcomes.group_by(keys).aggregate([([], "count_all")])
    dup = seen.filter(pc.greater(seen.column("count_all"), 1))
    if dup.num_rows:
        first = {k: dup.column(k)[0].as_py() for k in keys}
        raise SourceError(
            f"{where} has {dup.num_rows} repeated key(s) {keys} (first {first}); expected one "
            f"outcome per key"
        )
    return keys


def _joined(log: pa.Table, outcomes: pa.Table, on: str, where: str) -> tuple[pa.Table, int]:
    """(log rows with their outcome, in log order; how many log rows had no outcome)."""
    keys = _keys(log, outcomes, on, where)
    for k in keys:
        try:
            outcomes = outcomes.set_column(
                outcomes.schema.get_field_index(k),
                k,
                pc.cast(outcomes.column(k), log.schema.field(k).type),
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise SourceError(f"{where}: column {k!r} does not match the log's ({e})") from None
    extra = [c for c in outcomes.column_names if c not in keys and c in log.column_names]
    if extra:
        raise SourceError(f"{where}: columns {extra} are also in the prediction log; rename them")
    # only the keys go through the hash join (it takes no list columns, as multi-value outputs
    # are); the log's rows are then taken by position, in log order
    left = pa.table(
        {**{k: log.column(k) for k in keys}, _POSITION: np.arange(log.num_rows, dtype=np.int64)}
    )
    joined = left.join(outcomes, keys=keys, join_type="inner").sort_by(_POSITION)
    table = log.take(joined.column(_POSITION))
    for c in outcomes.column_names:
        if c not in keys:
            table = table.append_column(c, joined.column(c))
    return table, log.num_rows - table.num_rows


def _rename_features(table: pa.Table) -> pa.Table:
    names = [
        n[len(log_format.FEATURE_PREFIX) :] if n.startswith(log_format.FEATURE_PREFIX) else n
        for n in table.column_names
    ]
    if len(set(names)) != len(names):
        raise SourceError(f"the prediction log's features clash with other columns: {names}")
    return table.rename_columns(names)


def _schema(schema: str | Schema | None, sources: list[str]) -> Schema:
    if isinstance(schema, Schema):
        return schema
    if schema is not None:
        return load_schema(schema).as_parquet()
    for s in sources:
        if (Path(s) / SCHEMA_ASSET).is_file():
            return load_schema(Path(s) / SCHEMA_ASSET).as_parquet()
    raise SourceError(
        "no schema for the prediction log: pass --schema (a schema file naming the features "
        "and the label the outcomes hold)"
    )


def load_log_data(
    data: list[str],
    schema: str | Schema | None,
    *,
    join: str | None,
    on: str = "request_id",
    model: str | None = None,
    include_shadow: bool = False,
    sources: list[str] | None = None,
) -> Logs:
    """The prediction log ``data`` joined with the outcomes file ``join`` as A/B logs."""
    if join is None:
        raise SourceError(
            f"--data {' '.join(data)} is a prediction log, which holds no labels: pass --join "
            f"OUTCOMES (a .parquet or .csv file with {on!r} and the label column)"
        )
    sch = _schema(schema, sources or [])
    if not sch.labels:
        raise SourceError(f"schema {sch.name!r} has no label field: the outcomes' labels need one")
    log = _read_log(data, model, include_shadow)
    outcomes = _read_outcomes(join)
    missing = [f.name for f in sch.labels if f.name not in outcomes.column_names]
    if missing:
        raise SourceError(
            f"--join {join} has no label column(s) {missing} (named by schema {sch.name!r}); it "
            f"has {outcomes.column_names}"
        )
    table, dropped = _joined(log, outcomes, on, f"--join {join}")
    if not table.num_rows:
        raise SourceError(
            f"no logged row of {' '.join(data)} has an outcome in {join} (joined on {on!r})"
        )
    table = _rename_features(table)
    labels = column_to_numpy(table.column(sch.label.name), sch.label).astype(np.float64)
    desc = f"prediction log {', '.join(data)} joined with {join} ({dropped:,} rows without outcome)"
    info = {
        "format": "prediction_log",
        "outcomes": join,
        "join_on": on,
        "model": model,
        "shadow_included": include_shadow,
        "logged_rows": log.num_rows,
        "rows_without_outcome": dropped,
    }
    ids = np.arange(table.num_rows, dtype=np.int64)
    return Logs(table, sch, ids, labels, desc, info=info)


def subset(logs: Logs, mask: np.ndarray) -> Logs:
    """The logged rows where ``mask`` is true."""
    return replace(
        logs,
        table=logs.table.filter(pa.array(mask)),
        row_ids=logs.row_ids[mask],
        labels=logs.labels[mask],
    )


class LoggedSource(ScoreSource):
    """``logged:ARM`` / ``logged:vN``: the logged ``output.score`` of the rows served by traffic
    arm ``ARM`` or by model version ``N``."""

    can_score_candidates = False

    def __init__(self, spec: str) -> None:
        self.name = spec
        what = spec[len(LOGGED) :]
        if not what:
            raise SourceError(f"score source {spec!r}: expected logged:ARM or logged:vN")
        digits = what[1:]
        self.version = int(digits) if what[0] == "v" and digits.isdigit() else None
        self.arm = what if self.version is None else None
        self.output = "score"

    def for_task(self, task: ModelTask) -> LoggedSource:
        other = copy.copy(self)
        other.output = task.output
        return other

    def _check(self, logs: Logs) -> None:
        if "arm" not in logs.table.column_names or "version" not in logs.table.column_names:
            raise SourceError(
                f"{self.name}: logged scores need a prediction log as --data (a folder that "
                f"`stitchrec serve --log-dir` wrote)"
            )

    def rows(self, logs: Logs) -> np.ndarray:
        """``[n]`` bool: the rows served by this arm or version."""
        self._check(logs)
        if self.version is not None:
            mask = logs.table.column("version").to_numpy() == self.version
        else:
            mask = np.asarray(logs.table.column("arm").to_pylist(), dtype=object) == self.arm
        if not mask.any():
            arms = sorted(set(logs.table.column("arm").to_pylist()))
            versions = sorted(set(logs.table.column("version").to_pylist()))
            raise SourceError(
                f"{self.name}: no logged row was served by "
                f"{'version ' + str(self.version) if self.version is not None else 'arm ' + repr(self.arm)}"
                f"; the log's arms: {arms}, versions: {versions}"
            )
        return mask

    def scores(self, logs: Logs) -> np.ndarray:
        self._check(logs)
        col = log_format.OUTPUT_PREFIX + self.output
        if col not in logs.table.column_names:
            outs = sorted(log_format.outputs_of(logs.table))
            raise SourceError(f"{self.name}: the log has no output {self.output!r}; it has {outs}")
        return logs.table.column(col).to_numpy().astype(np.float64)

    def score_table(self, table: pa.Table, schema: Schema) -> np.ndarray:
        raise SourceError(
            f"{self.name}: logged scores exist only for the logged rows, not for other inputs"
        )


def open_logged(spec: str) -> LoggedSource | None:
    """The ``LoggedSource`` of a ``logged:`` spec, else None."""
    return LoggedSource(spec) if spec.startswith(LOGGED) else None
