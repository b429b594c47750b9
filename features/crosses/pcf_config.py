"""PCF-GNN's hyper-parameters, apart from the model so that configs load without TensorFlow
(``pipelines.config``'s ``[pair_stats]`` section takes its defaults and checks from here)."""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class PCFGNNConfig:
    """Hyper-parameters of the encoder, the head and the pre-training (no TensorFlow needed).

    Attributes:
      dim: node vector size ``d``.
      layers: message-passing layers ``K`` (0: the head reads the learned embeddings directly,
        a factorisation model; the paper's suggested 2 is the default).
      head: hidden sizes of the edge head MLP.
      relation_dim: size of the learned relation vector fed to the head.
      steps: optimisation steps (each propagates over the whole graph).
      batch_edges: supervision edges per step.
      learning_rate: Adam learning rate.
      l2: L2 penalty on the node embeddings of a step's supervision edges.
      seed: initialisation and edge sampling.
      log_every: steps between progress lines.
    """

    dim: int = 16
    layers: int = 2
    head: tuple[int, ...] = (32,)
    relation_dim: int = 4
    steps: int = 300
    batch_edges: int = 8192
    learning_rate: float = 0.01
    l2: float = 1e-6
    seed: int = 0
    log_every: int = 50

    def __post_init__(self) -> None:
        object.__setattr__(self, "head", tuple(int(h) for h in self.head))
        for key, lo in (
            ("dim", 1),
            ("layers", 0),
            ("relation_dim", 1),
            ("steps", 1),
            ("batch_edges", 1),
            ("log_every", 1),
        ):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"{key} must be an integer >= {lo}, got {v!r}")
        if any(h < 1 for h in self.head):
            raise ValueError(f"head sizes must be >= 1, got {list(self.head)}")
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate!r}")
        if not (self.l2 >= 0 and math.isfinite(self.l2)):
            raise ValueError(f"l2 must be >= 0, got {self.l2!r}")
