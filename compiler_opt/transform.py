"""``fuse(model, spec) -> model``: a ranking model with fused embedding blocks.

The model returned is a new ``RankingModel`` (``RankingModel.with_blocks``) holding the
original's preprocessor, interaction, tower, head, bias and task, and in place of

* ``kernels``: the embedding collection, a ``FusedEmbeddingCollection`` (the covered fields as
  one generated op, ``compiler_opt.embedding_op``) returning the form the interaction takes
  (its ``input_form``: ``concat`` for the DNN / DCN-v2 input, ``stacked`` for FM); the wide
  term's per-field weights, another one (the form ``LinearTerm.input_form``, ``concat``,
  summed). The same layers and variables: a checkpoint of either model restores into the other.
* ``tables``: the embedding collection, its ``HorizontalEmbeddingCollection``
  (``compiler_opt.table_fusion``: the ``full`` / ``hashing`` tables of one dim as one variable,
  the plain tables' weights copied into it when built).

The model passed in is not changed: its blocks, its call and its graph are what they were.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from compiler_opt.embedding_op.layer import FusedEmbeddingCollection
from compiler_opt.embedding_op.ops import Kernel
from compiler_opt.embedding_op.spec import KernelSpec, Schedule
from compiler_opt.table_fusion import HorizontalEmbeddingCollection
from embeddings.collection import EmbeddingCollection
from embeddings.forms import Form


@dataclasses.dataclass(frozen=True)
class FuseSpec:
    """What ``fuse`` fuses: ``kernels`` (the embedding lookups as generated ops) or ``tables``
    (the tables of one dim as one variable); not both (the generated op reads the per-field
    tables)."""

    kernels: bool = False
    tables: bool = False
    #: the generated op's schedule per spec (``compiler_opt.tune.recorded_schedule``); None:
    #: the default schedule
    schedule_for: Callable[[KernelSpec], Schedule] | None = None

    def __post_init__(self) -> None:
        if self.kernels and self.tables:
            raise ValueError("FuseSpec: kernels = True and tables = True: choose one")


def fuse(model: Any, spec: FuseSpec) -> Any:
    """A new model with ``model``'s embedding blocks fused as ``spec`` says (module docstring).

    Args:
      model: a ``RankingModel`` or ``MultiTaskModel`` whose ``embedding`` is an
        ``EmbeddingCollection``; behaviour sequences keep their pooling block and read the
        fused block's per-field lookups (``ranking.sequence_features.field_lookups``).
      spec: the fusions to apply.

    Raises:
      ValueError: a fusion is asked for and ``model.embedding`` is not an
        ``EmbeddingCollection``.
    """
    if not (spec.kernels or spec.tables):  # nothing to fuse: the model as it is
        return model
    emb = getattr(model, "embedding", None)
    if not isinstance(emb, EmbeddingCollection):
        raise ValueError(
            f"model.embedding must be an EmbeddingCollection, got {type(emb).__name__}"
        )
    blocks: dict[str, Any] = {}
    if spec.kernels:
        blocks.update(_kernel_blocks(model, spec.schedule_for))
    if spec.tables:
        blocks["embedding"] = HorizontalEmbeddingCollection.from_collection(emb)
    return model.with_blocks(**blocks) if blocks else model


def _kernel_blocks(model: Any, schedule_for: Any = None) -> dict[str, Any]:
    """``{"embedding": ..., "wide": ...}``: the blocks of ``model`` whose collections become
    FusedEmbeddingCollections returning the form their consumer declares (the embedding
    block's op under ``schedule_for``'s schedule)."""
    blocks: dict[str, Any] = {}
    emb = model.embedding
    if not isinstance(emb, FusedEmbeddingCollection):
        form = getattr(model.interaction, "input_form", Form.FIELDS)
        blocks["embedding"] = FusedEmbeddingCollection.from_collection(emb, form, schedule_for)
    wide = getattr(model, "wide", None)
    weights = getattr(wide, "field_weights", None)
    if isinstance(weights, EmbeddingCollection) and not isinstance(
        weights, FusedEmbeddingCollection
    ):
        form = getattr(wide, "input_form", Form.FIELDS)
        blocks["wide"] = wide.with_weights(FusedEmbeddingCollection.from_collection(weights, form))
    return blocks


def fused_collections(model: Any) -> list[FusedEmbeddingCollection]:
    """The FusedEmbeddingCollections of ``model`` (its embedding, its wide term's weights)."""
    found = [getattr(model, "embedding", None)]
    found.append(getattr(getattr(model, "wide", None), "field_weights", None))
    return [c for c in found if isinstance(c, FusedEmbeddingCollection)]


def kernels_of(collections: list[Any]) -> list[Kernel]:
    """The generated ops the FusedEmbeddingCollections among ``collections`` ran last (once
    each, in order)."""
    kernels: list[Kernel] = []
    for c in collections:
        kernel = c.kernel if isinstance(c, FusedEmbeddingCollection) else None
        if kernel is not None and kernel not in kernels:
            kernels.append(kernel)
    return kernels
