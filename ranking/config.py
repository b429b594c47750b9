"""Model configs: plain dataclasses, apart from the modules they configure (no TensorFlow import)."""

from __future__ import annotations

import dataclasses

MODEL_TYPES = ("lr", "fm", "dnn", "dcn_v2")
EMBEDDING_METHOD_NAMES = ("full", "hashing", "qr", "bh", "amtl")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """What ``build_model`` builds.

    Attributes:
      type: ``lr``, ``fm``, ``dnn`` or ``dcn_v2``.
      embedding_dim: default dimension of field embeddings (a field's schema
        ``embedding_dim`` overrides it; FM needs one dimension for all).
      mlp: hidden sizes of the MLP tower.
      cross_layers: DCN-v2 cross layers.
      cross_rank: DCN-v2 low-rank projection size (0: full rank).
      dropout: dropout after each MLP layer.
      l2: L2 penalty on the embedding rows and linear weights looked up in a batch.
      embedding_method: the embeddings/ method of every categorical field: ``full``,
        ``hashing``, ``qr``, ``bh`` (binary-code hash) or ``amtl``. Bucketized numeric fields
        always use ``full`` tables (they have a handful of rows).
      embedding_methods: per-field overrides of ``embedding_method``.
      embedding_options: per-method layer options, e.g. ``{"bh": {"block_bits": 8}}``; for
        ``bh`` also ``codes``: ``vocabulary`` (default: known values keep their vocabulary id,
        unseen values get a fingerprint) or ``fingerprint`` (no vocabulary in the model at all).
      embedding_compression: when > 1, each field with at least ``compress_min_rows`` rows gets
        the options that make its table about this many times smaller than the full table
        (``options_for_ratio`` of its method); explicit ``embedding_options`` win.
      compress_min_rows: fields with fewer rows keep full tables whatever their method (their
        table costs little; compressing it only loses accuracy).
    """

    type: str = "dcn_v2"
    embedding_dim: int = 16
    mlp: tuple[int, ...] = (256, 128)
    cross_layers: int = 3
    cross_rank: int = 0
    dropout: float = 0.0
    l2: float = 0.0
    embedding_method: str = "full"
    embedding_methods: dict[str, str] = dataclasses.field(default_factory=dict)
    embedding_options: dict[str, dict] = dataclasses.field(default_factory=dict)
    embedding_compression: float = 1.0
    compress_min_rows: int = 1000

    def __post_init__(self) -> None:
        if self.type not in MODEL_TYPES:
            raise ValueError(f"model type {self.type!r} is not one of {list(MODEL_TYPES)}")
        if self.embedding_dim < 1:
            raise ValueError(f"embedding_dim must be >= 1, got {self.embedding_dim}")
        object.__setattr__(self, "mlp", tuple(int(u) for u in self.mlp))
        if self.type in ("dnn", "dcn_v2") and not self.mlp:
            raise ValueError(f"model type {self.type!r} needs a non-empty mlp")
        if self.cross_layers < 1:
            raise ValueError(f"cross_layers must be >= 1, got {self.cross_layers}")
        if self.cross_rank < 0:
            raise ValueError(f"cross_rank must be >= 0 (0: full rank), got {self.cross_rank}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.l2 < 0:
            raise ValueError(f"l2 must be >= 0, got {self.l2}")
        for field, method in {"*": self.embedding_method, **self.embedding_methods}.items():
            if method not in EMBEDDING_METHOD_NAMES:
                where = "embedding_method" if field == "*" else f"embedding_methods[{field!r}]"
                raise ValueError(
                    f"{where} = {method!r} is not one of {list(EMBEDDING_METHOD_NAMES)}"
                )
        unknown = sorted(set(self.embedding_options) - set(EMBEDDING_METHOD_NAMES))
        if unknown:
            raise ValueError(
                f"embedding_options names unknown methods {unknown}; "
                f"methods: {list(EMBEDDING_METHOD_NAMES)}"
            )
        codes = self.embedding_options.get("bh", {}).get("codes", "vocabulary")
        if codes not in ("vocabulary", "fingerprint"):
            raise ValueError(
                f"embedding_options.bh.codes = {codes!r}: expected vocabulary or fingerprint"
            )
        if not self.embedding_compression >= 1.0:
            raise ValueError(
                f"embedding_compression must be >= 1, got {self.embedding_compression}"
            )
        if self.compress_min_rows < 1:
            raise ValueError(f"compress_min_rows must be >= 1, got {self.compress_min_rows}")

    def method_of(self, field: str) -> str:
        """The embedding method of a categorical field."""
        return self.embedding_methods.get(field, self.embedding_method)

    def bh_codes(self) -> str:
        return self.embedding_options.get("bh", {}).get("codes", "vocabulary")
