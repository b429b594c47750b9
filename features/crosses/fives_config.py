"""FIVES search settings (``FivesConfig``), the triple-search preset and the search's data error."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

Log = Callable[[str], None]
CONTRIBUTION_ROWS = 20_000  # validation rows that measure each cross's contribution
# The settings under which the search can see pure triples (docs/fives.md, "Pure triples"):
# a linear readout, cross strength by contribution, W^(k) starting at (F - 1) I, larger
# embeddings at a larger scale, every edge firmly on at the start and no sparsity push.
TRIPLE_SEARCH: dict[str, Any] = {
    "mlp": (),
    "strength": "contribution",
    "w_init": "degree",
    "embedding_dim": 16,
    "embedding_stddev": 0.3,
    "learning_rate": 0.01,
    "init_logit": 3.0,
    "sparsity": 0.0,
    "weight_decay": 1e-4,
}


class FivesDataError(ValueError):
    """The search data cannot be used (no fields left, a split with one class); says why."""


@dataclasses.dataclass(frozen=True)
class FivesConfig:
    """Search settings.

    Attributes:
      max_order: K, the highest cross order (layers: K - 1; the default 3 finds pairs and
        triples).
      embedding_dim: field embedding size d.
      mlp: hidden sizes of the readout MLP.
      dropout: dropout in the readout MLP (the paper's notes: 0.3).
      weight_decay: L2 on the embedding rows looked up in a batch and on W (the notes: 1e-4).
      epochs, batch_size: passes over the training split, rows per step.
      warmup_epochs: the first epochs update the model weights only (H frozen, tau at
        ``tau_start``), so the dense starting graph has learned something the adjacency
        updates can judge (the DARTS warm-up; the paper does not say).
      learning_rate: Adam step of the model weights (alpha_1).
      arch_learning_rate: Adam step of the adjacency logits H (alpha_2).
      tau_start, tau_end: temperature annealed geometrically over all steps.
      init_logit: starting value of every H entry (> 0: every edge starts on).
      sparsity: weight of mean(A) in the adjacency loss (0: none; not in the paper).
      validation_fraction: rows held out for the adjacency updates.
      numeric_bins: quantile buckets of numeric fields.
      max_vocab, min_count: vocabulary of categorical fields.
      seed: initialization, the split and the data order.
      screen_orders: cross orders also tested exhaustively by ``features.crosses.interaction_screen``
        (orders above ``max_order`` are skipped; ``()``: no screen). The screen finds pure
        interactions, which the edge search cannot (it needs an active sub-cross first).
      screen_alpha: family-wise error rate of the screen's tests (Bonferroni over each order).
      screen_max_cells: table cells per tested field set (sets the values kept per field).
      screen_rows: training rows the screen reads (0: all).
      screen_max_sets: an order with more field sets than this is not screened (reported):
        the screen's time grows with the sets times the rows (9,139 triples of 39 fields over
        640k rows: about 60 s).
    """

    max_order: int = 3
    embedding_dim: int = 8
    mlp: tuple[int, ...] = (64,)
    dropout: float = 0.0
    weight_decay: float = 1e-5
    epochs: int = 4
    warmup_epochs: int = 0
    finetune_epochs: int = 0
    batch_size: int = 2048
    learning_rate: float = 3e-3
    arch_learning_rate: float = 3e-2
    tau_start: float = 1.0
    tau_end: float = 0.02
    init_logit: float = 0.5
    sparsity: float = 0.01
    embedding_stddev: float = 0.05
    strength: str = "adjacency"
    w_init: str = "identity"
    heredity: bool = True
    validation_fraction: float = 0.2
    numeric_bins: int = 10
    max_vocab: int = 1_000
    min_count: int = 5
    seed: int = 0
    screen_orders: tuple[int, ...] = (2, 3)
    screen_alpha: float = 0.01
    screen_max_cells: int = 4096
    screen_rows: int = 0
    screen_max_sets: int = 20_000

    def __post_init__(self) -> None:
        object.__setattr__(self, "mlp", tuple(int(u) for u in self.mlp))
        orders = self.screen_orders
        if isinstance(orders, int) and not isinstance(orders, bool):
            orders = (orders,)
        if not isinstance(orders, (tuple, list)) or any(
            not isinstance(o, int) or isinstance(o, bool) or o < 2 for o in orders
        ):
            raise ValueError(
                f"fives: screen_orders must be a list of integers >= 2 (or empty), got {orders!r}"
            )
        object.__setattr__(self, "screen_orders", tuple(sorted(set(orders))))
        if not 0 < self.screen_alpha < 1:
            raise ValueError(f"fives: screen_alpha must be in (0, 1), got {self.screen_alpha!r}")
        for key, lo in (("screen_max_cells", 4), ("screen_rows", 0), ("screen_max_sets", 1)):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"fives: {key} must be an integer >= {lo}, got {v!r}")
        ints = {
            "max_order": 2,
            "embedding_dim": 1,
            "epochs": 1,
            "batch_size": 1,
            "numeric_bins": 2,
            "max_vocab": 1,
            "min_count": 1,
        }
        for key, lo in ints.items():
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"fives: {key} must be an integer >= {lo}, got {v!r}")
        if any(u < 1 for u in self.mlp):
            raise ValueError(f"fives: mlp sizes must be >= 1, got {list(self.mlp)}")
        for key in ("learning_rate", "arch_learning_rate", "tau_start", "tau_end"):
            if not getattr(self, key) > 0:
                raise ValueError(f"fives: {key} must be > 0, got {getattr(self, key)}")
        if not isinstance(self.warmup_epochs, int) or not 0 <= self.warmup_epochs < self.epochs:
            raise ValueError(
                f"fives: warmup_epochs must be an integer in [0, epochs={self.epochs}), got "
                f"{self.warmup_epochs!r}"
            )
        if not isinstance(self.finetune_epochs, int) or self.finetune_epochs < 0:
            raise ValueError(
                f"fives: finetune_epochs must be an integer >= 0, got {self.finetune_epochs!r}"
            )
        if self.tau_end > self.tau_start:
            raise ValueError(
                f"fives: tau_end ({self.tau_end}) must be <= tau_start ({self.tau_start})"
            )
        if not 0 <= self.dropout < 1:
            raise ValueError(f"fives: dropout must be in [0, 1), got {self.dropout}")
        if self.weight_decay < 0 or self.sparsity < 0:
            raise ValueError("fives: weight_decay and sparsity must be >= 0")
        if self.strength not in ("adjacency", "contribution"):
            raise ValueError(
                f"fives: strength must be 'adjacency' or 'contribution', got {self.strength!r}"
            )
        if self.strength == "contribution" and (self.mlp or self.max_order > 3):
            raise ValueError(
                f"fives: strength = 'contribution' needs a linear readout (mlp = []) and "
                f"max_order <= 3, got mlp {list(self.mlp)} and max_order {self.max_order}"
            )
        if self.w_init not in ("identity", "degree"):
            raise ValueError(f"fives: w_init must be 'identity' or 'degree', got {self.w_init!r}")
        if not self.embedding_stddev > 0:
            raise ValueError(f"fives: embedding_stddev must be > 0, got {self.embedding_stddev}")
        if not 0 < self.validation_fraction < 1:
            raise ValueError(
                f"fives: validation_fraction must be in (0, 1), got {self.validation_fraction}"
            )
