"""The cross artifact: a ranked list of explicit feature crosses, as readable JSON.

A cross search (``features.crosses.fives_search``) writes one artifact; a training config names it
(``[data] crosses = "crosses.json"``) and ``add_crosses`` turns its top-N crosses into schema
fields of kind ``cross``, which the model computes from raw features (``features.preprocessing``),
in training and inside the exported SavedModel. The file::

    {
      "format": "stitchrec.crosses/1",
      "method": "fives",
      "schema": "synthetic",
      "fields": ["I1", ..., "C26"],                 # the fields searched
      "skipped": [{"field": "C9", "reason": "a single value"}],
      "boundaries": {"I1": [0.0, 1.0, 3.0]},        # numeric fields' buckets in the search
      "crosses": [                                  # best first
        {"rank": 1, "name": "C3_x_C17", "fields": ["C3", "C17"], "order": 2,
         "strength": 0.998, "active": true, "distinct": 1532, "source": "fives",
         "effect": 0.0041},
        ...
      ],
      "search": {...}                               # settings, rows, timings, metrics
    }

``strength`` is in [0, 1] (FIVES: the product of the soft edge weights on the cross's path);
``active`` says whether the cross was selected (every FIVES edge on after binarization at 0.5,
or significant in the interaction screen); ``source`` names what selected it; ``effect`` is the
held-out share of label variance its pure interaction explains (selected crosses are ranked by
it); ``distinct`` counts the value tuples the search data holds (it sizes the hash table when
the config leaves it to us).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from features.schema import FeatureKind, FeatureSpec, Schema, SchemaError

FORMAT = "stitchrec.crosses/1"
MIN_AUTO_BUCKETS = 16
MAX_AUTO_BUCKETS = 1 << 20


class CrossArtifactError(ValueError):
    """A cross artifact is malformed or does not fit the schema; names the file and entry."""


@dataclasses.dataclass(frozen=True)
class Cross:
    """One ranked cross: ``fields`` (in order), its ``order`` (= len(fields)) and strength.

    ``source`` says what selected it (``"fives"``, ``"screen"`` or ``"fives+screen"``) and
    ``effect`` is its held-out pure-interaction effect (eta^2, ``features.crosses.interaction_screen``)
    when it was measured, else None.
    """

    fields: tuple[str, ...]
    strength: float
    active: bool = True
    distinct: int = 0
    source: str = "fives"
    effect: float | None = None

    @property
    def order(self) -> int:
        return len(self.fields)

    @property
    def name(self) -> str:
        return cross_name(self.fields)

    @property
    def key(self) -> frozenset[str]:
        return frozenset(self.fields)


def cross_name(fields: Sequence[str]) -> str:
    """``("C3", "C17")`` -> ``"C3_x_C17"``."""
    return "_x_".join(fields)


@dataclasses.dataclass
class CrossArtifact:
    """What a cross search found (see the module docstring)."""

    method: str
    schema: str
    fields: list[str]
    crosses: list[Cross]
    boundaries: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    skipped: list[dict[str, str]] = dataclasses.field(default_factory=list)
    search: dict[str, Any] = dataclasses.field(default_factory=dict)

    def top(self, n: int, order: int | None = None) -> list[Cross]:
        """The ``n`` best crosses (of one ``order`` when given)."""
        return [c for c in self.crosses if order is None or c.order == order][:n]

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "method": self.method,
            "schema": self.schema,
            "fields": list(self.fields),
            "skipped": list(self.skipped),
            "boundaries": {k: list(v) for k, v in self.boundaries.items()},
            "crosses": [
                {
                    "rank": i + 1,
                    "name": c.name,
                    "fields": list(c.fields),
                    "order": c.order,
                    "strength": round(float(c.strength), 6),
                    "active": bool(c.active),
                    "distinct": int(c.distinct),
                    "source": c.source,
                    **({} if c.effect is None else {"effect": round(float(c.effect), 8)}),
                }
                for i, c in enumerate(self.crosses)
            ],
            "search": self.search,
        }

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return p


def load_crosses(path: str | Path) -> CrossArtifact:
    """Reads an artifact written by ``CrossArtifact.save``; errors name the file and entry."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"cross artifact {str(p)!r} does not exist")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise CrossArtifactError(f"cross artifact {str(p)!r} is not valid JSON: {e}") from None
    where = f"cross artifact {str(p)!r}"
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise CrossArtifactError(f"{where}: expected format {FORMAT!r}, got {got!r}")
    crosses = []
    for i, c in enumerate(data.get("crosses", [])):
        try:
            fields = tuple(str(f) for f in c["fields"])
            cross = Cross(
                fields=fields,
                strength=float(c["strength"]),
                active=bool(c.get("active", True)),
                distinct=int(c.get("distinct", 0)),
                source=str(c.get("source", "fives")),
                effect=None if c.get("effect") is None else float(c["effect"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CrossArtifactError(
                f"{where}: crosses[{i}] needs `fields` (a list) and `strength` (a number): {e!r}"
            ) from None
        if len(set(fields)) != len(fields) or len(fields) < 2:
            raise CrossArtifactError(
                f"{where}: crosses[{i}] needs two or more distinct fields, got {list(fields)}"
            )
        crosses.append(cross)
    return CrossArtifact(
        method=str(data.get("method", "")),
        schema=str(data.get("schema", "")),
        fields=[str(f) for f in data.get("fields", [])],
        crosses=crosses,
        boundaries={k: [float(b) for b in v] for k, v in data.get("boundaries", {}).items()},
        skipped=list(data.get("skipped", [])),
        search=dict(data.get("search", {})),
    )


def auto_buckets(cross: Cross) -> int:
    """Hash rows for a cross: twice its distinct value tuples, clamped to [16, 2^20]."""
    return int(min(max(2 * cross.distinct, MIN_AUTO_BUCKETS), MAX_AUTO_BUCKETS))


def add_crosses(
    schema: Schema,
    artifact: CrossArtifact,
    top_n: int,
    hash_buckets: int = 0,
    embedding_dim: int | None = None,
) -> Schema:
    """``schema`` plus the artifact's ``top_n`` best crosses as fields of kind ``cross``.

    Each new field is named ``cross_name(fields)``, hashes its value tuples into
    ``hash_buckets`` rows (0: ``auto_buckets``) and carries the search's bucket boundaries of
    its numeric fields, so training and serving bucketize as the search did.

    Raises:
      SchemaError: a cross names a field the schema lacks, or its name is already a field.
    """
    if top_n < 1:
        raise ValueError(f"top_n must be >= 1, got {top_n}")
    new = []
    for cross in artifact.top(top_n):
        missing = [f for f in cross.fields if f not in schema.names]
        if missing:
            raise SchemaError(
                f"cross {cross.name!r} of the {artifact.method} artifact names fields {missing} "
                f"that schema {schema.name!r} does not have (was it searched on another dataset?)"
            )
        if cross.name in schema.names:
            raise SchemaError(f"schema {schema.name!r} already has a field named {cross.name!r}")
        bounds = [
            (f, tuple(artifact.boundaries[f]))
            for f in cross.fields
            if schema.field(f).kind == FeatureKind.NUMERIC and f in artifact.boundaries
        ]
        new.append(
            FeatureSpec(
                name=cross.name,
                kind=FeatureKind.CROSS,
                fields=cross.fields,
                hash_buckets=hash_buckets or auto_buckets(cross),
                boundaries=tuple(bounds),
                embedding_dim=embedding_dim,
            )
        )
    return dataclasses.replace(schema, fields=schema.fields + tuple(new))
