"""Raw features -> model inputs, as a Keras layer that lives inside the model and its SavedModel.

``build_preprocessor(schema, stats)`` plans each model input from the schema and the training
statistics and returns a ``FeaturePreprocessor``; its ``call`` maps the raw batch
``{field: [batch]}`` (strings, ints, floats) to

* ``ids``: ``{field: int64 [batch]}`` for categorical and bucketized numeric fields (or, for
  fields planned with ``codes``, unique 63-bit codes: see ``FeaturePreprocessor._codes``), and
  ``{field: int64 ragged [batch, None]}`` for multi-valued fields, each in ``[0, num_rows)``;
* ``dense``: float32 ``[batch, n_dense]`` for numeric fields that are not bucketized
  (``None`` when there are none).

Sequence fields (plan op ``sequence``) give ``ids[name]``: int64 ragged ``[batch, None]``, the
cell split on its ``separator`` (an empty cell: no values), newest first, truncated to the
first ``max_len`` values. A sequence with ``shares_embedding_with`` looks its values up exactly
as its target field does (the target's vocabulary, hash buckets or codes: ids in the target's
table), so history and target read one embedding table; otherwise it has its own vocabulary
(or hash buckets) and table. ``sequence_fields`` describes them for the model builder; they are
not in ``embedded_fields`` or ``categorical_fields``, which give the per-field pooled tables.

Cross fields (schema kind ``cross``, e.g. from a FIVES search) are computed here from the RAW
values of their fields, so a SavedModel computes them at serving time: each crossed field gives
a string (categorical and multi-categorical: the cell as it is; numeric: its bucket index under
the cross's ``boundaries``, else under the field's own ``num_buckets`` boundaries, else the
value itself), the strings are joined with ``\x1f`` and fingerprint-hashed into rows
``1 .. hash_buckets - 1``; a row with any crossed field missing (``""``, ``-1``, non-finite) gets
row 0. ``cross_ids`` is the same computation in NumPy, for tests and offline features.

Row 0 of every looked-up field is the OOV row: missing (``""`` / ``-1``), rare (under
``min_count``) and never-seen values all land there. Hashed fields use ``hash_buckets`` rows of a
fingerprint hash: the rows the statistics record (``FieldStats.hash_buckets``, set by
``features.stats.cap_hash_tables``), else the schema's. Numeric values: non-finite ->
``default``; then ``log1p`` (of max(x, 0)) or nothing; then standardized with the training mean
and standard deviation of that value, unless ``transform = "none"``. The plans are plain dicts,
so ``get_config`` is complete and the layer rebuilds from its config without the statistics
files.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from features.schema import FeatureKind, Schema
from features.stats import DatasetStats

CODE_MODES = ("vocabulary", "fingerprint")
_OPS = ("lookup", "code", "hash", "bucketize", "dense", "cross", "sequence")
UNSEEN_BIT = 62  # codes of values outside the vocabulary have this bit set


def plan_fields(
    schema: Schema, stats: DatasetStats, codes: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """One JSON-able plan per model input (see the module docstring for what each does).

    Args:
      codes: ``{field: "vocabulary" | "fingerprint"}`` for categorical fields whose embedding
        takes unique codes instead of OOV-collapsed ids (binary-code hash embeddings).
    """
    codes = dict(codes or {})
    for name, mode in codes.items():
        if mode not in CODE_MODES:
            raise ValueError(f"field {name!r}: code mode {mode!r} is not one of {CODE_MODES}")
        kind = schema.field(name).kind
        if kind not in (FeatureKind.CATEGORICAL, FeatureKind.MULTI_CATEGORICAL):
            raise ValueError(f"field {name!r}: codes need a categorical field, not {kind.value}")
    plans = []
    for spec in schema.model_inputs:
        if spec.is_sequence:
            plans.append({"name": spec.name})  # planned below, once its target's plan is known
            continue
        fs = stats[spec.name]
        base = {"name": spec.name, "dtype": spec.dtype}
        if spec.kind in (FeatureKind.CATEGORICAL, FeatureKind.MULTI_CATEGORICAL):
            plan = {
                **base,
                "multi": spec.kind == FeatureKind.MULTI_CATEGORICAL,
                "separator": spec.separator,
            }
            if spec.name in codes:
                plan.update(
                    op="code",
                    codes=codes[spec.name],
                    vocabulary=list(fs.vocab) if codes[spec.name] == "vocabulary" else [],
                    num_rows=len(fs.vocab) + 1,
                )
            elif spec.vocab == "hash":
                plan.update(op="hash", num_rows=fs.hash_buckets or spec.hash_buckets)
            else:
                plan.update(op="lookup", vocabulary=list(fs.vocab), num_rows=len(fs.vocab) + 1)
        elif spec.num_buckets > 0:
            plan = {
                **base,
                "op": "bucketize",
                "boundaries": list(fs.boundaries),
                "num_rows": len(fs.boundaries) + 1,
                "transform": spec.transform,
                "default": spec.default,
            }
        else:
            plan = {
                **base,
                "op": "dense",
                "transform": spec.transform,
                "default": spec.default,
                "mean": 0.0 if spec.transform == "none" else fs.mean,
                "std": 1.0 if spec.transform == "none" else fs.std,
            }
        plans.append(plan)
    by_name = {p["name"]: p for p in plans}
    plans = [
        plan_sequence(schema, p["name"], stats, by_name) if "op" not in p else p for p in plans
    ]
    for spec in schema.crosses:
        plans.append(plan_cross(schema, spec, stats))
    return plans


def plan_sequence(
    schema: Schema, name: str, stats: DatasetStats, plans: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The plan of one ``sequence`` field: ``table`` (the field whose lookup and embedding table
    its values use: the shared target or itself), ``max_len``, ``aligned_with``, ``separator``,
    ``num_rows`` and, when not shared, its own ``lookup`` (``vocabulary`` or ``hash``) and
    ``vocabulary``."""
    spec = schema.field(name)
    plan: dict[str, Any] = {
        "name": name,
        "dtype": "string",
        "op": "sequence",
        "separator": spec.separator,
        "max_len": spec.max_len,
        "aligned_with": spec.aligned_with,
        "table": spec.shares_embedding_with or name,
    }
    if spec.shares_embedding_with is not None:
        return {**plan, "num_rows": plans[spec.shares_embedding_with]["num_rows"]}
    fs = stats[name]
    if spec.vocab == "hash":
        return {**plan, "lookup": "hash", "num_rows": fs.hash_buckets or spec.hash_buckets}
    vocab = list(fs.vocab)
    return {**plan, "lookup": "vocabulary", "vocabulary": vocab, "num_rows": len(vocab) + 1}


CROSS_SEPARATOR = "\x1f"


def plan_cross(schema: Schema, spec: Any, stats: DatasetStats | None = None) -> dict[str, Any]:
    """The plan of one ``cross`` field: its parts (name, dtype, kind, boundaries) and rows."""
    given = dict(spec.boundaries)
    parts = []
    for name in spec.fields:
        f = schema.field(name)
        part: dict[str, Any] = {"name": name, "dtype": f.dtype, "numeric": False}
        if f.kind == FeatureKind.NUMERIC:
            bounds = given.get(name)
            if bounds is None and stats is not None and f.num_buckets > 0:
                bounds = stats[name].boundaries
            part.update(numeric=True, boundaries=[float(b) for b in bounds or ()])
        parts.append(part)
    return {
        "name": spec.name,
        "dtype": "int64",
        "op": "cross",
        "parts": parts,
        "num_rows": spec.hash_buckets,
    }


def cross_ids(plan: dict[str, Any], columns: dict[str, Any]) -> Any:
    """NumPy reference of the in-model cross: raw columns -> int64 ids ``[rows]``.

    Uses TensorFlow's fingerprint hash on the joined strings, so the ids equal the model's.
    """
    import numpy as np

    strings, missing = [], None
    for part in plan["parts"]:
        x = np.asarray(columns[part["name"]])
        if part["numeric"]:
            v = x.astype(np.float32)
            bad = ~np.isfinite(v)
            if part["boundaries"]:
                b = np.asarray(part["boundaries"], np.float32)
                s = np.searchsorted(b, v, side="right").astype(str)
            else:
                s = tf.strings.as_string(tf.constant(v)).numpy().astype(str)
        elif x.dtype.kind in "iu":
            bad, s = x == -1, x.astype(str)
        else:
            s = x.astype(str)
            bad = s == ""
        strings.append(s)
        missing = bad if missing is None else missing | bad
    joined = strings[0]
    for s in strings[1:]:
        joined = np.char.add(np.char.add(joined, CROSS_SEPARATOR), s)
    h = tf.strings.to_hash_bucket_fast(tf.constant(joined), plan["num_rows"] - 1).numpy() + 1
    return np.where(missing, 0, h).astype(np.int64)


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class FeaturePreprocessor(tf.keras.layers.Layer):
    """Raw named features -> (ids per embedded field, dense numeric matrix).

    Args:
      plans: from ``plan_fields``; each has ``name``, ``dtype`` and ``op`` in
        ``lookup | code | hash | bucketize | dense | cross | sequence``. A shared sequence's
        ``table`` must be the name of a ``lookup``, ``code`` or ``hash`` plan among them.
    """

    def __init__(self, plans: list[dict[str, Any]], **kwargs: Any):
        super().__init__(**kwargs)
        if not plans:
            raise ValueError("plans must name at least one field")
        ops = {p.get("name"): p.get("op") for p in plans}
        for p in plans:
            if p.get("op") not in _OPS:
                raise ValueError(f"field {p.get('name')!r}: unknown op {p.get('op')!r}")
            shared = p["op"] == "sequence" and p["table"] != p["name"]
            if shared and ops.get(p["table"]) not in ("lookup", "code", "hash"):
                raise ValueError(
                    f"sequence {p['name']!r} shares the table of {p['table']!r}, which is not a "
                    f"looked-up, coded or hashed field of these plans {sorted(ops)}"
                )
        self._keep_plans(plans)
        self._lookups: dict[str, tf.keras.layers.Layer] = {}
        for p in self.plans:
            if p["op"] == "sequence" and p["table"] == p["name"]:
                p = {**p, "op": "lookup" if p["lookup"] == "vocabulary" else "hash"}
            if p["op"] in ("lookup", "code") and p["vocabulary"]:  # else every value is OOV
                self._lookups[p["name"]] = tf.keras.layers.StringLookup(
                    vocabulary=tuple(p["vocabulary"]),  # a tuple: not tracked
                    num_oov_indices=1,
                    mask_token=None,
                    name=f"lookup_{_safe(p['name'])}",
                )
            elif p["op"] == "hash":
                self._lookups[p["name"]] = tf.keras.layers.Hashing(
                    num_bins=p["num_rows"], name=f"hash_{_safe(p['name'])}"
                )

    @tf.__internal__.tracking.no_automatic_dependency_tracking
    def _keep_plans(self, plans: list[dict[str, Any]]) -> None:
        """``plans`` kept as plain data, outside Keras's tracking of lists and dicts: every
        ``trainable_variables`` walks each tracked list to its last item, here every word of
        every vocabulary (about 0.3 s a call for 39 fields of up to 10,000 words)."""
        self.plans = [dict(p) for p in plans]
        self._plans = {p["name"]: p for p in self.plans}

    @property
    def embedded_fields(self) -> dict[str, int]:
        """``{field: rows its embedding table needs}``, in schema order (not sequences)."""
        return {
            p["name"]: p["num_rows"] for p in self.plans if p["op"] not in ("dense", "sequence")
        }

    @property
    def sequence_fields(self) -> dict[str, dict[str, Any]]:
        """``{sequence: {"table": field whose table it reads (its shared target or itself),
        "max_len": L, "aligned_with": field or None, "num_rows": rows of that table}}``."""
        return {
            p["name"]: {k: p[k] for k in ("table", "max_len", "aligned_with", "num_rows")}
            for p in self.plans
            if p["op"] == "sequence"
        }

    @property
    def categorical_fields(self) -> list[str]:
        """Fields embedded from values (looked up, coded or hashed), not numeric buckets."""
        return [p["name"] for p in self.plans if p["op"] in ("lookup", "code", "hash")]

    @property
    def multi_valued_fields(self) -> list[str]:
        return [p["name"] for p in self.plans if p.get("multi")]

    @property
    def dense_fields(self) -> list[str]:
        return [p["name"] for p in self.plans if p["op"] == "dense"]

    @property
    def cross_fields(self) -> list[str]:
        """Fields computed by crossing other fields' raw values (not read from the input)."""
        return [p["name"] for p in self.plans if p["op"] == "cross"]

    @property
    def input_names(self) -> list[str]:
        """The raw features ``call`` reads."""
        return [p["name"] for p in self.plans if p["op"] != "cross"]

    def call(self, features: dict[str, tf.Tensor]) -> tuple[dict[str, tf.Tensor], tf.Tensor | None]:
        ids: dict[str, tf.Tensor] = {}
        dense: list[tf.Tensor] = []
        for p in self.plans:
            x = features[p["name"]] if p["op"] != "cross" else None
            if p["op"] in ("lookup", "hash"):
                ids[p["name"]] = self._ids(p, x)
            elif p["op"] == "sequence":
                ids[p["name"]] = self._sequence_ids(p, x)
            elif p["op"] == "code":
                ids[p["name"]] = self._codes(p, x)
            elif p["op"] == "cross":
                ids[p["name"]] = _cross(p, features)
            elif p["op"] == "bucketize":
                v = _numeric(x, p)
                b = tf.constant(p["boundaries"], tf.float32)
                ids[p["name"]] = tf.cast(tf.searchsorted(b, v, side="right"), tf.int64)
            else:
                v = _numeric(x, p)
                dense.append((v - p["mean"]) / p["std"])
        return ids, (tf.stack(dense, axis=1) if dense else None)

    def sequence_ids(self, features: dict[str, tf.Tensor]) -> dict[str, tf.RaggedTensor]:
        """The ids ``call`` gives the sequence fields present in ``features`` (int64 ragged
        ``[batch, None]``), without reading any other field: a shared sequence's values are
        looked up in its target's vocabulary or hash, so the target field itself need not be
        given (a ranking request sends the user's history once, apart from its candidates)."""
        return {
            p["name"]: self._sequence_ids(p, features[p["name"]])
            for p in self.plans
            if p["op"] == "sequence" and p["name"] in features
        }

    def _ids(self, plan: dict[str, Any], x: tf.Tensor) -> tf.Tensor:
        if x.dtype != tf.string:
            x = tf.strings.as_string(x)
        if plan["multi"]:
            x = tf.strings.split(x, sep=plan["separator"])
        return self._vocabulary_ids(plan["name"], x)

    def _vocabulary_ids(self, name: str, x: Any) -> Any:
        """int64 ids of string values ``x`` (a tensor or ragged tensor) by field ``name``'s
        lookup (its vocabulary: 1..V for known values, 0 (OOV) for others; or its hash); all 0
        for a field whose vocabulary is empty (every training value rarer than ``min_count``)."""
        if name not in self._lookups:
            return tf.zeros_like(x, dtype=tf.int64)
        return tf.cast(self._lookups[name](x), tf.int64)

    def _sequence_ids(self, plan: dict[str, Any], x: tf.Tensor) -> tf.RaggedTensor:
        """int64 ragged ``[batch, None]``: the first ``max_len`` values of each cell, looked up
        in the table's vocabulary, hash or codes (an empty cell has no values)."""
        if x.dtype != tf.string:  # Keras builds a restored model on float32 placeholders
            x = tf.strings.as_string(x)
        values = tf.strings.split(x, sep=plan["separator"])
        keep = tf.gather(tf.not_equal(x, ""), values.value_rowids())
        values = tf.ragged.boolean_mask(values, values.with_flat_values(keep))
        values = values[:, : plan["max_len"]]
        table = self._plans[plan["table"]] if plan["table"] != plan["name"] else plan
        if table["op"] == "code":
            return values.with_flat_values(self._value_codes(table, values.flat_values))
        return values.with_flat_values(self._vocabulary_ids(table["name"], values.flat_values))

    def _codes(self, plan: dict[str, Any], x: tf.Tensor) -> tf.Tensor | tf.RaggedTensor:
        """Unique non-negative int64 codes: 0 for a missing value; with ``vocabulary`` the
        vocabulary id (1..V) of a known value and ``2^62 | fingerprint`` of an unseen one; with
        ``fingerprint`` a 63-bit fingerprint of every value (no vocabulary held at all)."""
        if x.dtype != tf.string:
            x = tf.strings.as_string(x)
        if plan["multi"]:
            values = tf.strings.split(x, sep=plan["separator"])
            return values.with_flat_values(self._value_codes(plan, values.flat_values))
        return self._value_codes(plan, x)

    def _value_codes(self, plan: dict[str, Any], x: tf.Tensor) -> tf.Tensor:
        fingerprint = tf.strings.to_hash_bucket_fast(x, 2**63 - 1)
        if plan["codes"] == "fingerprint":
            codes = fingerprint
        else:
            ids = self._vocabulary_ids(plan["name"], x)
            unseen = tf.bitwise.bitwise_or(
                tf.bitwise.bitwise_and(fingerprint, (1 << UNSEEN_BIT) - 1),
                tf.constant(1 << UNSEEN_BIT, tf.int64),
            )
            codes = tf.where(ids > 0, ids, unseen)
        return tf.where(tf.equal(x, ""), tf.zeros_like(codes), codes)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "plans": self.plans}


def _numeric(x: tf.Tensor, plan: dict[str, Any]) -> tf.Tensor:
    x = tf.cast(x, tf.float32)
    x = tf.where(tf.math.is_finite(x), x, tf.cast(plan["default"], tf.float32))
    if plan["transform"] == "log1p":
        x = tf.math.log1p(tf.maximum(x, 0.0))
    return x


def _cross(plan: dict[str, Any], features: dict[str, tf.Tensor]) -> tf.Tensor:
    """The cross id of every row (see the module docstring): int64 ``[batch]``."""
    strings, missing = [], None
    for part in plan["parts"]:
        x = features[part["name"]]
        if part["numeric"]:
            v = tf.cast(x, tf.float32)
            bad = tf.logical_not(tf.math.is_finite(v))
            if part["boundaries"]:
                b = tf.constant(part["boundaries"], tf.float32)
                s = tf.strings.as_string(tf.searchsorted(b, v, side="right"))
            else:
                s = tf.strings.as_string(v)
        elif x.dtype != tf.string:
            bad, s = tf.equal(x, -1), tf.strings.as_string(x)
        else:
            bad, s = tf.equal(x, ""), x
        strings.append(s)
        missing = bad if missing is None else tf.logical_or(missing, bad)
    joined = tf.strings.join(strings, separator=CROSS_SEPARATOR)
    h = tf.strings.to_hash_bucket_fast(joined, plan["num_rows"] - 1) + 1
    return tf.where(missing, tf.zeros_like(h), h)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "_." else "_" for c in name)


def build_preprocessor(
    schema: Schema, stats: DatasetStats, codes: dict[str, str] | None = None
) -> FeaturePreprocessor:
    return FeaturePreprocessor(plan_fields(schema, stats, codes), name="preprocessor")
