"""compiler_opt.fuse: nothing asked, nothing done; a fusion asked of a model without an
embedding collection is refused."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from compiler_opt import FuseSpec, fuse
from features.preprocessing import build_preprocessor
from features.schema import load_schema
from features.stats import compute_stats
from ranking.models import ModelConfig, build_model


@pytest.fixture()
def lr_model(tiny_data):
    schema = load_schema(tiny_data["schema"])
    stats = compute_stats(schema, pq.read_table(tiny_data["train"]).to_batches())
    return build_model(ModelConfig(type="lr"), build_preprocessor(schema, stats), "label")


def test_an_empty_spec_returns_the_model_itself_even_without_embeddings(lr_model):
    assert lr_model.embedding is None
    assert fuse(lr_model, FuseSpec()) is lr_model


@pytest.mark.parametrize("spec", [FuseSpec(kernels=True), FuseSpec(tables=True)])
def test_a_fusion_of_a_model_without_an_embedding_collection_is_refused(lr_model, spec):
    with pytest.raises(ValueError, match=r"model\.embedding must be an EmbeddingCollection"):
        fuse(lr_model, spec)
