"""Model configs: plain dataclasses, apart from the modules they configure (no TensorFlow import)."""

from __future__ import annotations

import dataclasses

MODEL_TYPES = ("lr", "fm", "dnn", "dcn_v2")


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
      embedding_method: the embeddings/ method for every field (``full``).
      embedding_methods: per-field overrides of ``embedding_method``.
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
