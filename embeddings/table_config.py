"""``TableConfig``: the embedding table of one field, as ``EmbeddingCollection`` builds it.

A table config names the field, its vocabulary size and dimension, the pooling of multi-valued
ids, the embedding method (a key of ``embeddings.collection.EMBEDDING_METHODS``), the L2 penalty
and the method's own arguments. Its stored form (Keras ``get_config``, a run's ``model.json``) is
the plain dict of :meth:`TableConfig.to_dict`::

    {"name": "user", "num_rows": 1000, "dim": 16, "combiner": "mean", "method": "qr",
     "l2": 0.0, "options": {"collisions": 32, "operation": "mult"}}

:meth:`TableConfig.from_dict` reads it back; keys left out take their defaults.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

#: keys of the stored form, in the order :meth:`TableConfig.to_dict` writes them
TABLE_KEYS = ("name", "num_rows", "dim", "combiner", "method", "l2", "options")
_REQUIRED = ("name", "num_rows", "dim")


@dataclasses.dataclass(frozen=True)
class TableConfig:
    """The embedding table of one field.

    Attributes:
      name: the field (the key of the ids dict and of the collection's output).
      num_rows: vocabulary rows of the field, row 0 being the OOV row.
      dim: embedding dimension.
      combiner: pooling of multi-valued (ragged) ids, ``mean`` or ``sum``.
      method: embedding method, ``full``, ``hashing``, ``qr``, ``bh`` or ``amtl``.
      l2: L2 penalty on the rows looked up in a batch.
      options: the method's own keyword arguments (e.g. ``{"buckets": 64}`` for ``hashing``).
    """

    name: str
    num_rows: int
    dim: int
    combiner: str = "mean"
    method: str = "full"
    l2: float = 0.0
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The stored form: every key of ``TABLE_KEYS``, ``options`` a plain dict."""
        stored = {key: getattr(self, key) for key in TABLE_KEYS}
        stored["options"] = dict(self.options)
        return stored

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any]) -> TableConfig:
        """Reads the stored form; ``combiner``, ``method``, ``l2`` and ``options`` may be left
        out (``options`` None: no options).

        Raises:
          ValueError: ``spec`` lacks ``name``, ``num_rows`` or ``dim``, or has other keys.
        """
        missing = [k for k in _REQUIRED if k not in spec]
        unknown = sorted(set(spec) - set(TABLE_KEYS))
        if missing or unknown:
            raise ValueError(
                f"table spec {dict(spec)!r} must have the keys {list(_REQUIRED)} and may have "
                f"{list(TABLE_KEYS[len(_REQUIRED) :])}; missing {missing}, unknown {unknown}"
            )
        given = {k: spec[k] for k in TABLE_KEYS if k in spec}
        given["options"] = dict(given.get("options") or {})
        return cls(**given)

    @classmethod
    def of(cls, spec: TableConfig | Mapping[str, Any]) -> TableConfig:
        """``spec`` itself when it is a ``TableConfig``, else ``from_dict(spec)``."""
        return spec if isinstance(spec, TableConfig) else cls.from_dict(spec)
