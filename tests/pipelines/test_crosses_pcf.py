"""``stitchrec crosses pcf-gnn`` end to end: tiny data -> graph + pre-training -> train with the
artifact -> export -> the SavedModel computes the pair statistics from raw features."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from features.crosses.pcf_artifact import PCFArtifact
from features.crosses.pcf_graph import PairGraph
from features.dataset import iter_batches
from features.schema import load_schema
from pipelines.cli import main
from pipelines.config import load_config
from pipelines.export import export_run
from pipelines.run.model import load_trained_model
from tests.testdata import NO_VALIDATION, write_run_config, write_tiny_dataset


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny data (as the ``tiny_data`` fixture) and the config of a ``crosses pcf-gnn`` run."""
    root = tmp_path_factory.mktemp("pcf")
    data = write_tiny_dataset(root)
    data["config"] = _config(data, root / "run")
    return data


def _config(tiny_data: dict[str, Path], out: Path, source: str = "pcf_gnn") -> Path:
    pair_stats = f"""
[pair_stats]
source = "{source}"
pairs = [["user", "item"], ["user", "tags"]]
artifact = "{out.parent / "artifact"}"
steps = 10
batch_edges = 256
log_every = 10
"""
    model = {"type": "dnn", "embedding_dim": 4, "mlp": [8]}
    train = {"batch_size": 256, "epochs": 1, "seed": 0, "log_every": 10}
    cfg = out.parent / f"{out.name}.toml"
    return write_run_config(
        cfg, tiny_data, out, model, train, extra=pair_stats, data_extra=NO_VALIDATION
    )


def _raw_batch(tiny_data: dict[str, Path], n: int = 64) -> dict[str, tf.Tensor]:
    schema = load_schema(tiny_data["schema"]).as_parquet()
    files = sorted(Path(tiny_data["test"]).glob("*.parquet"))
    batch = next(iter_batches(schema, files, batch_size=n, shuffle=False))
    return {f.name: tf.constant(batch[f.name]) for f in schema.model_inputs}


def test_pcf_gnn_end_to_end(pretrained: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    tiny_data = pretrained
    run = tiny_data["root"] / "run"
    cfg_path = tiny_data["config"]
    assert main(["crosses", "pcf-gnn", "--config", str(cfg_path)]) == 0
    printed = capsys.readouterr().out
    assert "pcf-gnn step 10/10" in printed and "pcf-gnn artifact:" in printed
    artifact_dir = tiny_data["root"] / "artifact"
    report = json.loads((artifact_dir / "report.json").read_text())
    assert report["rows"] == 4000 and report["edges_per_pair"]["user x item"] > 0
    artifact = PCFArtifact.load(artifact_dir)
    assert artifact.pairs == [("user", "item"), ("user", "tags")]

    assert main(["train", "--config", str(cfg_path)]) == 0
    out = export_run(run)
    model, _, _ = load_trained_model(run)
    block = model.dense_blocks[0]
    assert type(block).__name__ == "PairStatsGNN"
    # the restored block holds the pre-trained node table, not the zeros its config builds
    np.testing.assert_allclose(block.node_table.numpy(), artifact.nodes, rtol=1e-6)

    features = _raw_batch(tiny_data)
    expected = model.score(features).numpy()
    served = tf.saved_model.load(str(out)).signatures["serving_default"](**features)
    np.testing.assert_allclose(served["score"].numpy(), expected, rtol=1e-5, atol=1e-6)

    # the statistics are an input of the score: other statistics, other scores
    stats = block(features).numpy()
    assert stats.shape == (64, 2) and np.std(stats[:, 0]) > 0
    block.node_table.assign(np.zeros_like(artifact.nodes))
    changed = model.score(features).numpy()
    assert np.abs(changed - expected).max() > 1e-4


def test_table_source_end_to_end(pretrained: dict[str, Path]) -> None:
    """The table baseline reads the graph the ``pcf-gnn`` run wrote into the artifact."""
    tiny_data = pretrained
    if not (tiny_data["root"] / "artifact" / "graph").exists():  # run alone
        assert main(["crosses", "pcf-gnn", "--config", str(tiny_data["config"])]) == 0
    run = tiny_data["root"] / "run_table"
    cfg_path = _config(tiny_data, run, source="table")
    assert main(["train", "--config", str(cfg_path)]) == 0
    out = export_run(run)
    model, _, _ = load_trained_model(run)
    block = model.dense_blocks[0]
    assert type(block).__name__ == "PairStatsTable"
    graph = PairGraph.load(tiny_data["root"] / "artifact" / "graph")
    assert block.num_keys == graph.num_edges  # every user has a value, min_count 1: no OOV
    features = _raw_batch(tiny_data)
    served = tf.saved_model.load(str(out)).signatures["serving_default"](**features)
    np.testing.assert_allclose(
        served["score"].numpy(), model.score(features).numpy(), rtol=1e-5, atol=1e-6
    )
    # user x item statistic of the first row, by hand from the graph's counts
    u = graph.local_ids("user", features["user"].numpy()[:1].astype(str).tolist())[0]
    i = graph.local_ids("item", [int(features["item"].numpy()[0])])[0]
    rel = graph.relations[0]
    hit = np.flatnonzero((rel.u == u) & (rel.v == i))
    p = graph.prior
    if hit.size:
        p = (rel.clicks[hit[0]] + graph.alpha * graph.prior) / (
            rel.impressions[hit[0]] + graph.alpha
        )
    np.testing.assert_allclose(block(features).numpy()[0, 0], np.log(p / (1 - p)), rtol=1e-4)


def test_config_errors(tiny_data: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    run = tiny_data["root"] / "bad"
    cfg_path = _config(tiny_data, run)
    text = cfg_path.read_text()
    cfg_path.write_text(text.replace('source = "pcf_gnn"', 'source = "gnn"'))
    assert main(["crosses", "pcf-gnn", "--config", str(cfg_path)]) == 2
    err = capsys.readouterr().err
    assert "[pair_stats] source = 'gnn'" in err and str(cfg_path) in err
    cfg_path.write_text(text.replace('["user", "tags"]', '["user", "price"]'))
    assert main(["crosses", "pcf-gnn", "--config", str(cfg_path)]) == 2
    assert "'price' is numeric" in capsys.readouterr().err
    cfg_path.write_text(text.replace('["user", "tags"]', '["user", "nope"]'))
    assert main(["crosses", "pcf-gnn", "--config", str(cfg_path)]) == 2
    assert "'nope' is not a field" in capsys.readouterr().err
    cfg_path.write_text(text.replace("steps = 10", "steps = 0"))
    assert main(["crosses", "pcf-gnn", "--config", str(cfg_path)]) == 2
    assert "[pair_stats] steps must be an integer >= 1" in capsys.readouterr().err
    no_section = text.split("[pair_stats]")[0]
    cfg_path.write_text(no_section)
    assert load_config(cfg_path).pair_stats is None
    assert main(["crosses", "pcf-gnn", "--config", str(cfg_path)]) == 2
    assert "no [pair_stats] section" in capsys.readouterr().err


def test_pairs_the_graph_cannot_take_are_config_errors(
    tiny_data: dict[str, Path], capsys: pytest.CaptureFixture
) -> None:
    """A field paired with itself, a pair given twice, two multi-valued fields: one error
    line naming the pair (exit 2), not a traceback."""
    run = tiny_data["root"] / "pairs"
    cfg_path = _config(tiny_data, run)
    text = cfg_path.read_text()
    schema = tiny_data["root"] / "two_multi.toml"
    extra = '\n[[fields]]\nname = "tags2"\nkind = "multi_categorical"\ncolumn = "tags"\n'
    schema.write_text(Path(tiny_data["schema"]).read_text() + extra + 'separator = "|"\n')
    cases = [
        ('[["user", "user"]]', "['user', 'user']: a pair needs two different fields"),
        ('[["user", "item"], ["item", "user"]]', "['item', 'user'] is given twice"),
        ('[["tags", "tags2"]]', "at most one field of a pair may be multi_categorical"),
    ]
    for pairs, words in cases:
        edited = text.replace('[["user", "item"], ["user", "tags"]]', pairs)
        cfg_path.write_text(edited.replace(str(tiny_data["schema"]), str(schema)))
        assert main(["crosses", "pcf-gnn", "--config", str(cfg_path)]) == 2
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err
