"""Fixtures of the compiler_opt tests: fixed cost coefficients, a small exported DCN-v2, the
folder of generated-op libraries the tests share and their precompiled header."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from compiler_opt import toolchain
from compiler_opt.cost import Coefficients
from tests.testdata import write_tiny_dataset

# Round numbers so that costs can be checked by hand: 1 us per launch, 1 GB/s, 10 ns per row;
# A 1-byte cache: every gather pays the row latency.
HAND = Coefficients(
    device="hand",
    launch_s=1e-6,
    bandwidth=1e9,
    gather_row_s=1e-8,
    matmul_flops=1e9,
    cache_bytes=1,
)


#: the libraries of the generated ops: the kernels folder of the cache the tests started with
#: (``$STITCHREC_CACHE`` or ``~/.cache/stitchrec``), read before any test sets its own
SHARED_KERNELS = toolchain.kernels_dir()
#: the precompiled TensorFlow headers of every compile the tests start (``$STITCHREC_CXX_PCH``,
#: ``toolchain.precompiled_header``; subprocesses inherit it): beside the shared kernels, so
#: both xdist workers and later runs build it once. The libraries are the same without it.
os.environ.setdefault(toolchain.PCH_ENV, str(SHARED_KERNELS.parent / "pch"))


@pytest.fixture()
def hand() -> Coefficients:
    return HAND


def share_kernels(cache: Path) -> Path:
    """Makes ``<cache>/compiler_opt/kernels`` a link to :data:`SHARED_KERNELS` and returns
    ``cache``: a test with its own ``$STITCHREC_CACHE`` (its own calibration) loads the
    libraries other tests compiled from the same source and toolchain (the cache key) instead
    of compiling them again, and leaves its own there for the others."""
    kernels = cache / "compiler_opt" / "kernels"
    kernels.parent.mkdir(parents=True, exist_ok=True)
    SHARED_KERNELS.mkdir(parents=True, exist_ok=True)
    if not kernels.is_symlink():
        kernels.symlink_to(SHARED_KERNELS, target_is_directory=True)
    return cache


def tiny_dcn_v2(
    directory: Path,
    rows: int = 600,
    train_rows: int = 500,
    mlp: tuple = (16,),
    model_type: str = "dcn_v2",
):
    """An untrained DCN-v2 (dim 4, 1 cross layer; ``model_type`` another of ranking's types)
    built on the tiny dataset written to ``directory``: ``(model, schema, training files)``."""
    from features.dataset import iter_record_batches, list_parquet, make_dataset
    from features.schema import load_schema
    from features.stats import compute_stats
    from pipelines.config import DataConfig, PipelineConfig
    from pipelines.run.model import build_run_model
    from ranking.config import ModelConfig

    data = write_tiny_dataset(directory, rows=rows, train_rows=train_rows)
    schema = load_schema(data["schema"])
    files = list_parquet(data["train"])
    stats = compute_stats(schema, iter_record_batches(schema, files))
    cfg = PipelineConfig(
        output_dir=str(directory / "run"),
        data=DataConfig(schema=str(data["schema"]), train=(str(data["train"]),)),
        model=ModelConfig(type=model_type, embedding_dim=4, mlp=mlp, cross_layers=1),
    )
    model = build_run_model(cfg, schema, stats)
    model(next(iter(make_dataset(schema, files, batch_size=2))))
    return model, schema, files


@pytest.fixture(scope="session")
def tiny_saved_model(tmp_path_factory) -> Path:
    """An untrained DCN-v2 (dim 4, MLP 16, 1 cross layer) over the tiny dataset, exported with
    ``stitchrec export``'s serving signature (raw features in, score out)."""
    from pipelines.export import export_saved_model

    d = tmp_path_factory.mktemp("fuse")
    model, schema, _ = tiny_dcn_v2(d)
    return export_saved_model(model, schema, d / "saved_model")


def need_compiler() -> None:
    """Skips a generated-kernel test on a machine without a C++ compiler (the op then falls
    back to the plain layers, which ``test_without_a_compiler_warns_and_runs_unfused``
    checks), unless ``STITCHREC_REQUIRE_CXX`` is set: ``.ci/run`` sets it wherever g++ is
    present, so there the tests must run."""
    from compiler_opt import toolchain

    if toolchain.compiler() is None:
        if os.environ.get("STITCHREC_REQUIRE_CXX"):
            pytest.fail("STITCHREC_REQUIRE_CXX is set but no C++ compiler was found")
        pytest.skip("no C++ compiler ($CXX or g++): generated kernels cannot be built here")
