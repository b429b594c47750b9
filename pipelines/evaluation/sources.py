"""Logged data and the score sources an A/B comparison reads.

A source is named by one string (``--control`` / ``--treatment``):

* a directory holding ``saved_model.pb``: a SavedModel exported by ``stitchrec export``; its
  ``serving_default`` takes raw features by name and returns ``score``;
* ``grpc://HOST:PORT/MODEL`` (optional ``?signature=NAME&version=N``): a running server speaking
  TensorFlow Serving's ``PredictionService.Predict`` (ours, or TF Serving itself); the inputs it
  takes are read with ``GetModelMetadata`` when the server offers it, else every model input of
  the logs' schema is sent;
* a ``.parquet`` file, or a ``stitchrec predict`` output folder: scores computed elsewhere, one
  row per logged row, with a row-id column
  (``--id-column``, default ``row_id``) and a score column (``--score-column``, default
  ``score``). Row ids are the logs' ``--row-id`` field, or else the 0-based row position in the
  order the ``--data`` files are read. If the file also has the action column (``--action``),
  it may hold one row per (row id, candidate action): the logged action's score is used for the
  metrics and all of them for off-policy estimates;
* ``uniform``: the same score (0.5) for every row and candidate: the no-skill model and, as a
  policy, the uniform-random one.
"""

from __future__ import annotations

import copy
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import tensorflow as tf
from tensorflow_serving.apis import get_model_metadata_pb2, predict_pb2, prediction_service_pb2_grpc

from features import read_report, readers
from features.schema import FeatureKind, Schema, load_schema
from features.shard_reader import column_to_numpy, list_parquet
from pipelines.evaluation.tasks import ModelTask, saved_model_tasks, unloadable_saved_model

SCHEMA_ASSET = Path("assets.extra") / "schema.toml"


def _show(x: object) -> str:
    """repr of a value, numpy scalars as plain Python values."""
    return repr(x.item() if isinstance(x, np.generic) else x)


class SourceError(ValueError):
    """A score source that cannot be read or does not fit the logs."""


@dataclass
class Logs:
    """The logged rows: an Arrow table of the schema's fields, with row ids and labels."""

    table: pa.Table
    schema: Schema
    row_ids: np.ndarray  # [n]
    labels: np.ndarray  # [n] float64 0/1
    description: str
    bad_rows: int = 0
    info: dict = field(default_factory=dict)  # how the rows were read (a prediction log: its join)

    @property
    def n(self) -> int:
        return self.table.num_rows

    def column(self, name: str) -> np.ndarray:
        if name not in self.table.column_names:
            raise KeyError(
                f"the logs have no field {name!r}; fields: {self.table.column_names[:40]}"
            )
        return column_to_numpy(self.table.column(name), self.schema.field(name))


def _find_schema(data: list[str], sources: list[str]) -> Schema:
    for d in data:
        p = Path(d)
        for cand in (p / "schema.toml", p.parent / "schema.toml", p.parent.parent / "schema.toml"):
            if cand.is_file():
                return load_schema(cand).as_parquet()
    for s in sources:
        if (Path(s) / SCHEMA_ASSET).is_file():
            return load_schema(Path(s) / SCHEMA_ASSET).as_parquet()
    raise SourceError(
        f"no schema for the logs {data}: pass --schema (a schema file or a shipped name such as "
        f"'open_bandit'), or keep the schema.toml that `stitchrec convert` writes beside the shards"
    )


def load_logs(
    data: list[str],
    schema: str | Schema | None = None,
    *,
    row_id: str | None = None,
    sources: list[str] | None = None,
    max_bad_rows: int = 0,
) -> Logs:
    """Reads ``data`` (raw files with ``schema``, or Parquet shards) into one table.

    Without ``schema``, the data must be Parquet shards with a ``schema.toml`` beside them (as
    ``stitchrec convert`` and ``generate`` write), or a SavedModel source lends its schema.
    """
    if schema is None:
        list_parquet(data)  # FileNotFoundError naming the paths if there is no Parquet
        sch = _find_schema(list(data), sources or [])
    else:
        sch = schema if isinstance(schema, Schema) else load_schema(schema)
    files: list = list(data)
    if sch.source.format == "parquet":
        files = list_parquet(files)  # a folder of shards holds schema.toml too
    report = read_report.ReadReport()
    batches = list(readers.read_batches(sch, files, max_bad_rows=max_bad_rows, report=report))
    table = pa.Table.from_batches(batches)
    labels = column_to_numpy(table.column(sch.label.name), sch.label).astype(np.float64)
    if row_id is None:
        ids = np.arange(table.num_rows, dtype=np.int64)
    else:
        spec = sch.field(row_id)
        ids = column_to_numpy(table.column(row_id), spec)
        uniq, counts = np.unique(ids, return_counts=True)
        if (counts > 1).any():
            dup = uniq[counts > 1]
            raise SourceError(
                f"row-id field {row_id!r} of the logs repeats {dup.size} ids (first {_show(dup[0])}); "
                f"expected one row per id"
            )
    desc = ", ".join(str(d) for d in data)
    return Logs(table, sch, ids, labels, desc, bad_rows=report.bad_rows)


# --------------------------------------------------------------------------------------------
# sources


class ScoreSource:
    """Scores the logged rows (``scores``) and arbitrary rows of raw features (``score_table``)."""

    name: str
    can_score_candidates = True

    def for_task(self, task: ModelTask) -> ScoreSource:
        """This source scoring ``task`` (sources with one score column score every task)."""
        return self

    def score_table(self, table: pa.Table, schema: Schema) -> np.ndarray:
        raise NotImplementedError

    def scores(self, logs: Logs) -> np.ndarray:
        return self.score_table(logs.table, logs.schema)

    def candidate_scores(
        self, logs: Logs, action: str, actions: np.ndarray, build: object
    ) -> np.ndarray:
        """``[n, A]`` scores of every candidate action; ``build(lo, hi)`` makes candidate rows."""
        n, a = logs.n, actions.size
        out = np.empty((n, a))
        step = max(1, 65536 // a)
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            table = build(lo, hi)
            out[lo:hi] = self.score_table(table, logs.schema).reshape(hi - lo, a)
        return out


class UniformSource(ScoreSource):
    name = "uniform"

    def score_table(self, table: pa.Table, schema: Schema) -> np.ndarray:
        return np.full(table.num_rows, 0.5)

    def candidate_scores(
        self, logs: Logs, action: str, actions: np.ndarray, build: object
    ) -> np.ndarray:
        return np.full((logs.n, actions.size), 0.5)


def _inputs(table: pa.Table, schema: Schema, names: list[str], where: str) -> dict[str, np.ndarray]:
    missing = [n for n in names if n not in table.column_names]
    if missing:
        raise SourceError(
            f"{where} needs inputs {missing} that the logs lack; logs fields: "
            f"{table.column_names[:30]}"
        )
    return {n: column_to_numpy(table.column(n), schema.field(n)) for n in names}


class SavedModelSource(ScoreSource):
    """A SavedModel exported by ``stitchrec export`` (``serving_default`` returns ``score``)."""

    def __init__(self, path: str | Path, batch_size: int = 8192) -> None:
        self.path = Path(path)
        self.name = str(path)
        self.batch_size = batch_size
        asset = self.path / SCHEMA_ASSET
        if not asset.is_file():
            raise SourceError(f"{path} is not a StitchRec SavedModel: it has no {SCHEMA_ASSET}")
        self.model_schema, self.tasks = saved_model_tasks(self.path)
        self.output = "score"
        try:
            self.fn = tf.saved_model.load(str(self.path)).signatures["serving_default"]
        except (OSError, tf.errors.OpError) as e:
            raise unloadable_saved_model(self.path, e) from None
        self.input_names = [f.name for f in self.model_schema.model_inputs]

    def for_task(self, task: ModelTask) -> SavedModelSource:
        """This source scoring ``task``: the model's output for a task of that name, or its
        ``score`` when it is a single-task model of the task's label."""
        mine = {t.name: t for t in self.tasks}
        if task.name in mine:
            output = mine[task.name].output
        elif len(self.tasks) == 1 and self.tasks[0].label == task.label:
            output = "score"
        else:
            raise SourceError(
                f"SavedModel {self.name} has no task {task.name!r} (label {task.label!r}); its "
                f"tasks: {sorted(mine)}"
            )
        other = copy.copy(self)
        other.output = output
        return other

    def score_table(self, table: pa.Table, schema: Schema) -> np.ndarray:
        out = []
        for lo in range(0, table.num_rows, self.batch_size):
            part = table.slice(lo, self.batch_size)
            feats = _inputs(part, self.model_schema, self.input_names, f"SavedModel {self.name}")
            res = self.fn(**{k: tf.constant(v) for k, v in feats.items()})
            out.append(res[self.output].numpy().reshape(-1).astype(np.float64))
        return np.concatenate(out) if out else np.empty(0)


class GrpcSource(ScoreSource):
    """A TF-Serving-compatible ``PredictionService`` at ``grpc://host:port/model``."""

    def __init__(self, url: str, batch_size: int = 2048, timeout_s: float = 60.0) -> None:
        u = urllib.parse.urlparse(url)
        if u.scheme != "grpc" or not u.hostname or not u.port or not u.path.strip("/"):
            raise SourceError(
                f"gRPC source {url!r}: expected grpc://HOST:PORT/MODEL[?signature=S&version=N]"
            )
        q = urllib.parse.parse_qs(u.query)
        self.name = url
        self.model = u.path.strip("/")
        self.signature = q.get("signature", ["serving_default"])[0]
        self.version = int(q["version"][0]) if "version" in q else None
        self.batch_size, self.timeout = batch_size, timeout_s
        self.channel = grpc.insecure_channel(f"{u.hostname}:{u.port}")
        self.stub = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)
        self.input_names: list[str] | None = None
        self.output = "score"

    def for_task(self, task: ModelTask) -> GrpcSource:
        """This source scoring ``task`` by its output (``score_<task>``; ``score`` for the
        primary task of a single-task model)."""
        other = copy.copy(self)
        other.output = task.output
        return other

    def _spec(self, msg):
        msg.model_spec.name = self.model
        msg.model_spec.signature_name = self.signature
        if self.version is not None:
            msg.model_spec.version.value = self.version

    def _server_inputs(self) -> list[str] | None:
        req = get_model_metadata_pb2.GetModelMetadataRequest()
        self._spec(req)
        req.metadata_field.append("signature_def")
        try:
            res = self.stub.GetModelMetadata(req, timeout=self.timeout)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                return None
            raise SourceError(
                f"gRPC source {self.name}: GetModelMetadata failed: {e.details()}"
            ) from None
        sig_map = get_model_metadata_pb2.SignatureDefMap()
        res.metadata["signature_def"].Unpack(sig_map)
        if self.signature not in sig_map.signature_def:
            raise SourceError(
                f"gRPC source {self.name}: model has no signature {self.signature!r}; it has "
                f"{sorted(sig_map.signature_def)}"
            )
        return sorted(sig_map.signature_def[self.signature].inputs)

    def score_table(self, table: pa.Table, schema: Schema) -> np.ndarray:
        if self.input_names is None:
            names = self._server_inputs()
            self.input_names = names or [f.name for f in schema.model_inputs]
        out = []
        for lo in range(0, table.num_rows, self.batch_size):
            part = table.slice(lo, self.batch_size)
            feats = _inputs(part, schema, self.input_names, f"gRPC source {self.name}")
            req = predict_pb2.PredictRequest()
            self._spec(req)
            for k, v in feats.items():
                req.inputs[k].CopyFrom(tf.make_tensor_proto(v))
            try:
                res = self.stub.Predict(req, timeout=self.timeout)
            except grpc.RpcError as e:
                raise SourceError(
                    f"gRPC source {self.name}: Predict failed ({e.code().name}): {e.details()}"
                ) from None
            if self.output not in res.outputs:
                raise SourceError(
                    f"gRPC source {self.name}: the response has no {self.output!r} output; it "
                    f"has {sorted(res.outputs)}"
                )
            out.append(tf.make_ndarray(res.outputs[self.output]).reshape(-1).astype(np.float64))
        return np.concatenate(out) if out else np.empty(0)


class ParquetScoresSource(ScoreSource):
    """Scores computed elsewhere: a Parquet file (or a ``stitchrec predict`` output folder of
    them) with a row-id column and a score column; a multi-task task reads the column named by
    its output (``score_<task>``) when the file has one."""

    def __init__(
        self,
        path: str | Path,
        id_column: str = "row_id",
        score_column: str = "score",
        action_column: str | None = None,
    ) -> None:
        self.path = Path(path)
        self.name = str(path)
        try:
            table = pq.read_table(self.path)
        except (pa.ArrowException, OSError) as e:
            raise SourceError(
                f"scores file {self.name}: not a readable Parquet file ({e})"
            ) from None
        for col in (id_column, score_column):
            if col not in table.column_names:
                raise SourceError(
                    f"scores file {self.name} has no column {col!r}; it has {table.column_names} "
                    f"(set --id-column / --score-column)"
                )
        self.table = table
        self.ids = table.column(id_column).to_numpy(zero_copy_only=False)
        self.values = self._numbers(score_column)
        self.id_column, self.score_column = id_column, score_column
        self.actions = None
        self.action_name = action_column or ""
        if action_column and action_column in table.column_names:
            self.actions = table.column(action_column).to_numpy(zero_copy_only=False)
        self.can_score_candidates = self.actions is not None

    def for_task(self, task: ModelTask) -> ScoreSource:
        """This file scoring ``task``: its column ``task.output`` when present (a multi-task
        model's ``stitchrec predict`` output), else the score column."""
        if task.output == self.score_column or task.output not in self.table.column_names:
            return self
        other = copy.copy(self)
        other.score_column = task.output
        other.values = self._numbers(task.output)
        return other

    def _numbers(self, column: str) -> np.ndarray:
        """The column ``column`` as float64; SourceError unless it holds numbers."""
        col = self.table.column(column)
        if not (pa.types.is_floating(col.type) or pa.types.is_integer(col.type)):
            raise SourceError(
                f"scores file {self.name}: column {column!r} holds {col.type} values; expected "
                f"numbers (the scores `stitchrec predict` writes)"
            )
        return col.to_numpy(zero_copy_only=False).astype(np.float64)

    def _align(self, key_file: np.ndarray, key_logs: np.ndarray, what: str) -> np.ndarray:
        """Index into the file for each logs key; clear errors for duplicates and gaps."""
        order = np.argsort(key_file, kind="stable")
        sk = key_file[order]
        dup = np.flatnonzero(sk[1:] == sk[:-1])
        if dup.size:
            raise SourceError(
                f"scores file {self.name}: {dup.size} duplicate {what} (first {_show(sk[dup[0]])}); "
                f"expected one score per {what.rstrip('s')}"
            )
        pos = np.clip(np.searchsorted(sk, key_logs), 0, max(sk.size - 1, 0))
        found = sk[pos] == key_logs if sk.size else np.zeros(key_logs.size, bool)
        if not found.all():
            missing = key_logs[~found]
            raise SourceError(
                f"scores file {self.name} is misaligned with the logs: {missing.size} of "
                f"{key_logs.size} logged rows have no score (first {what.rstrip('s')} "
                f"{_show(missing[0])}); the file has {key_file.size} rows"
            )
        return order[pos]

    def _keys(self, ids: np.ndarray, actions: np.ndarray | None) -> np.ndarray:
        ids = np.asarray(ids)
        if actions is None:
            return ids
        return np.char.add(np.char.add(ids.astype(str), "\x1f"), np.asarray(actions).astype(str))

    def scores(self, logs: Logs) -> np.ndarray:
        if self.actions is None:
            ids = self.ids
            if ids.dtype.kind != np.asarray(logs.row_ids).dtype.kind:
                try:
                    ids = ids.astype(np.asarray(logs.row_ids).dtype)
                except (TypeError, ValueError):
                    raise SourceError(
                        f"scores file {self.name}: row ids of type {self.ids.dtype} do not match "
                        f"the logs' row ids of type {logs.row_ids.dtype}"
                    ) from None
            idx = self._align(ids, logs.row_ids, "row ids")
            if ids.size != logs.n:  # every logged row has a score, so the file has extra rows
                extra = np.setdiff1d(ids, logs.row_ids)
                raise SourceError(
                    f"scores file {self.name} is misaligned with the logs: it has {ids.size} "
                    f"rows but the logs have {logs.n}; {extra.size} of its row ids are not in "
                    f"the logs (first {_show(extra[0])})"
                )
            return self.values[idx]
        # long format: one row per (row id, candidate); take the logged action's
        return self._by_pair(logs.row_ids, logs.column(self.action_name))

    def candidate_scores(
        self, logs: Logs, action: str, actions: np.ndarray, build: object
    ) -> np.ndarray:
        if self.actions is None:
            raise SourceError(
                f"scores file {self.name} has no {action!r} column: off-policy estimates need a "
                f"score for every candidate action"
            )
        n, a = logs.n, actions.size
        ids = np.repeat(logs.row_ids, a)
        acts = np.tile(actions.astype(str), n)
        return self._by_pair(ids, acts).reshape(n, a)

    def _by_pair(self, ids: np.ndarray, acts: np.ndarray) -> np.ndarray:
        key_file = self._keys(self.ids, self.actions)
        return self.values[self._align(key_file, self._keys(ids, acts), "(row id, action) pairs")]


def _is_predict_output(p: Path) -> bool:
    """A folder of Parquet scores written by ``stitchrec predict`` (``_SUCCESS`` and parts)."""
    return p.is_dir() and (p / "_SUCCESS").is_file() and any(p.glob("part-*.parquet"))


def open_source(
    spec: str,
    *,
    id_column: str = "row_id",
    score_column: str = "score",
    action: str | None = None,
    grpc_timeout_s: float = 60.0,
) -> ScoreSource:
    """The score source named by ``spec`` (see the module docstring)."""
    if spec == "uniform":
        return UniformSource()
    if spec.startswith("grpc://"):
        return GrpcSource(spec, timeout_s=grpc_timeout_s)
    p = Path(spec)
    if p.is_dir() and (p / "saved_model.pb").is_file():
        return SavedModelSource(p)
    if (p.is_file() and p.suffix == ".parquet") or _is_predict_output(p):
        return ParquetScoresSource(p, id_column, score_column, action)
    if not p.exists():
        raise FileNotFoundError(
            f"score source {spec!r} does not exist: expected a SavedModel directory, a .parquet "
            f"scores file, grpc://HOST:PORT/MODEL or 'uniform'"
        )
    raise SourceError(
        f"score source {spec!r} is neither a SavedModel directory (no saved_model.pb) nor a "
        f".parquet scores file; expected one of those, grpc://HOST:PORT/MODEL or 'uniform'"
    )


def categorical_inputs(schema: Schema) -> list[str]:
    return [
        f.name
        for f in schema.model_inputs
        if f.kind in (FeatureKind.CATEGORICAL, FeatureKind.MULTI_CATEGORICAL)
    ]
