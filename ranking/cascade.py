"""A pre-ranking -> ranking cascade for one request: one user, N candidates.

::

    p      = prerank(user, candidates)            # [N] pre-ranking logits
    top    = top_k(p, M)                          # the M = min(keep, N) best candidates
    r      = rank(user, candidates[top])          # [M] ranking logits
    score  = -1 everywhere, sigmoid(r) at top     # [N]

Request-side fields (schema ``group`` ``user`` or ``context``) come ONCE per request, as
``[1]`` tensors; item fields come as ``[N]`` tensors. Each model computes the request side
once: the two-tower model runs its user tower on the one row, a ``RankingModel`` looks up the
request fields' embeddings (and dense features) on the one row and repeats the vectors for the
candidates (``RequestScorer``). Dropped candidates get ``score = DROPPED_SCORE`` (-1, below
every probability), so sorting by ``score`` puts them after every kept one.

``CascadeModule`` exports both models as one SavedModel with two signatures:

* ``rank_request``: every field by name, request fields ``[1]``, item fields ``[N]`` -> ``score``
  ``[N]`` (float32), ``prerank_score`` ``[N]`` (the pre-ranking click probability of every
  candidate), ``kept`` ``[N]`` (bool: passed to ranking). An empty candidate list fails with
  ``InvalidArgumentError`` naming the problem.
* ``serving_default``: the ranking model alone on flat ``[batch]`` features (``score``,
  ``logit``), for a client that tiles request features itself.

``rank_request`` may score with other forms of the two models (``request_models``): e.g. forms
whose embedding collections compute several lookups in one op, sharing the variables.
``RequestScorer.embedding_collections`` lists the collections a scorer calls.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf
from tf_keras.src.saving.legacy.saved_model.utils import keras_option_scope

from ranking.models import RankingModel
from ranking.request_scorer import (
    RequestScorer,
    input_dtypes,
    model_inputs,
    request_and_item_fields,
)

__all__ = [
    "DROPPED_SCORE",
    "CascadeModule",
    "RequestScorer",
    "export_cascade",
    "input_dtypes",
    "model_inputs",
    "request_and_item_fields",
]

DROPPED_SCORE = -1.0


class CascadeModule(tf.Module):
    """Pre-ranking keeps the top ``keep`` of N candidates; ranking scores those.

    Args:
      prerank: ``TwoTowerModel`` or (fine-tuned FSCD) ``RankingModel``.
      rank: the ranking ``RankingModel``.
      groups: ``{field: schema group}`` in schema order, for every field either model reads
        (the order of the signature's inputs).
      keep: M, the candidates passed to ranking (fewer when N < M).
      request_models: ``(prerank, rank)`` forms that ``rank_request`` scores with instead of
        ``prerank`` / ``rank`` (the same variables, e.g. embedding lookups in one op);
        ``serving_default`` runs ``rank`` itself.
    """

    def __init__(
        self,
        prerank: tf.keras.Model,
        rank: RankingModel,
        groups: Mapping[str, str | None],
        keep: int,
        request_models: tuple[tf.keras.Model, tf.keras.Model] | None = None,
    ):
        super().__init__(name="stitchrec_cascade")
        if int(keep) < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.keep = int(keep)
        self.prerank_name, self.rank_name = prerank.name, rank.name
        scored = request_models if request_models is not None else (prerank, rank)
        self.prerank_scorer = RequestScorer(scored[0], groups, name="prerank")
        self.rank_scorer = RequestScorer(scored[1], groups, name="rank")
        self.rank_model = rank
        self.dtypes = {**input_dtypes(prerank), **input_dtypes(rank)}
        self.fields = [n for n in groups if n in self.dtypes]
        self.request_names, self.item_names = request_and_item_fields(groups, self.fields)
        spec = {
            f: tf.TensorSpec([1] if f in self.request_names else [None], self.dtypes[f], name=f)
            for f in self.fields
        }
        self.rank_request = tf.function(self._rank_request, input_signature=[spec], autograph=False)
        rank_spec = {
            f: tf.TensorSpec([None], self.dtypes[f], name=f)
            for f in self.fields
            if f in set(model_inputs(rank))
        }
        self.serve = tf.function(self._serve, input_signature=[rank_spec], autograph=False)

    def _serve(self, features: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        logits = self.rank_model(features, training=False)
        return {"score": tf.sigmoid(logits), "logit": logits}

    def _rank_request(self, features: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        request = {k: features[k] for k in self.request_names}
        items = {k: features[k] for k in self.item_names}
        n = tf.shape(items[self.item_names[0]])[0]
        checks = [
            tf.debugging.assert_positive(
                n, message="rank_request: the candidate list is empty (item fields have 0 rows)"
            )
        ]
        for k in self.item_names[1:]:
            checks.append(
                tf.debugging.assert_equal(
                    tf.shape(items[k])[0],
                    n,
                    message=f"rank_request: item field {k!r} has a different number of rows "
                    f"than {self.item_names[0]!r}",
                )
            )
        with tf.control_dependencies(checks):
            n = tf.identity(n)
        pre_logit = self.prerank_scorer(
            {k: request[k] for k in self.prerank_scorer.request_names},
            {k: items[k] for k in self.prerank_scorer.item_names},
        )
        m = tf.minimum(self.keep, n)
        top = tf.math.top_k(pre_logit, k=m, sorted=True).indices
        chosen = {k: tf.gather(v, top) for k, v in items.items()}
        rank_logit = self.rank_scorer(
            {k: request[k] for k in self.rank_scorer.request_names},
            {k: chosen[k] for k in self.rank_scorer.item_names},
        )
        where = top[:, None]
        score = tf.tensor_scatter_nd_update(
            tf.fill([n], tf.constant(DROPPED_SCORE, tf.float32)), where, tf.sigmoid(rank_logit)
        )
        kept = tf.scatter_nd(where, tf.ones([m], tf.int32), [n]) > 0
        return {"score": score, "prerank_score": tf.sigmoid(pre_logit), "kept": kept}

    def save(self, output: str | Path, extra: dict[str, Any] | None = None) -> Path:
        """Writes the cascade SavedModel (signatures ``rank_request`` and ``serving_default``)
        to ``output`` (replacing it) and returns its folder.

        ``assets.extra/stitchrec.json`` lists the request/candidate inputs, ``keep``, the
        dropped score and ``extra`` (``pipelines.preranking.export_cascade_runs`` adds
        ``schema.toml``).
        """
        out = Path(output)
        if out.exists():
            shutil.rmtree(out)
        with keras_option_scope(save_traces=False, in_tf_saved_model_scope=True):
            tf.saved_model.save(
                self,
                str(out),
                signatures={"serving_default": self.serve, "rank_request": self.rank_request},
            )
        assets = out / "assets.extra"
        assets.mkdir(exist_ok=True)
        meta = {
            "model": "cascade",
            "prerank": self.prerank_name,
            "rank": self.rank_name,
            "keep": self.keep,
            "dropped_score": DROPPED_SCORE,
            "inputs": self.fields,
            "request_inputs": self.request_names,
            "candidate_inputs": self.item_names,
            **(extra or {}),
        }
        (assets / "stitchrec.json").write_text(json.dumps(meta, indent=1))
        return out

    def rank_candidates(
        self, request: dict[str, Any], candidates: dict[str, Any]
    ) -> dict[str, np.ndarray]:
        """Eager entry point with Python errors: ``request`` one value per request field,
        ``candidates`` a list/array per item field."""
        missing = [k for k in self.request_names if k not in request]
        missing += [k for k in self.item_names if k not in candidates]
        if missing:
            raise KeyError(f"the request lacks fields {missing}")
        sizes = {k: len(np.atleast_1d(candidates[k])) for k in self.item_names}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"candidate fields differ in length: {sizes}")
        if not next(iter(sizes.values())):
            raise ValueError("the candidate list is empty: give at least one candidate")
        feats = {}
        for f in self.fields:
            src = request if f in self.request_names else candidates
            value = np.atleast_1d(np.asarray(src[f]))
            if f in self.request_names and value.shape != (1,):
                raise ValueError(f"request field {f!r} needs one value, got shape {value.shape}")
            feats[f] = tf.constant(value, dtype=self.dtypes[f])
        return {k: v.numpy() for k, v in self.rank_request(feats).items()}


def export_cascade(
    prerank: tf.keras.Model,
    rank: RankingModel,
    groups: Mapping[str, str | None],
    output: str | Path,
    keep: int,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Writes the cascade SavedModel of ``prerank`` and ``rank`` (``CascadeModule.save``)."""
    return CascadeModule(prerank, rank, groups, keep).save(output, extra)
