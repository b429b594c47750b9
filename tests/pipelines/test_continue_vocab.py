"""A continued run's vocabularies through ``pipelines.train.train``: the previous run's
``VocabState`` advanced by the new window (stable ids, eviction by ``[vocab] evict_after``, the
schema's ``max_vocab``), the kept values' embedding rows carried over, a rerun that does not
advance the window twice, and the continued run's export scoring in a fresh process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import tensorflow as tf

from features.stats import DatasetStats
from features.vocab_state import VocabState
from pipelines.config import load_config
from pipelines.export import export_run
from pipelines.run.model import load_trained_model
from pipelines.run.paths import RunPaths
from pipelines.train import train
from tests.testdata import NO_VALIDATION, write_run_config

MODEL = {"type": "dcn_v2", "embedding_dim": 4, "mlp": [8], "cross_layers": 1}

SCHEMA = """
name = "days"

[source]
format = "parquet"

[[fields]]
name = "user"
kind = "categorical"
max_vocab = 3

[[fields]]
name = "item"
kind = "categorical"

[[fields]]
name = "label"
kind = "label"
"""

#: Three windows of 20 rows: (value, count) of each column. Hand-computed states (decay 1,
#: evict_after 1, min_count 1):
#: item  w0: a b c d (ids 1-4); w1: a, c unseen once (kept), e f new -> a b c d e f;
#:       w2: a, c unseen twice (evicted, ids 1, 3 freed), h new -> id 1, f moves 6 -> 3:
#:       h b f d e.
#: user  w0: u0 8, u1 6, u2 4 (u3 2 outside max_vocab 3); w1 counts u0 10, u1 6, u2 4, u3 12,
#:       u4 8: the three hottest u3, u0, u4; u0 keeps id 1, u3 -> 2, u4 -> 3; w2 the same.
WINDOWS = [
    {"item": {"a": 8, "b": 6, "c": 4, "d": 2}, "user": {"u0": 8, "u1": 6, "u2": 4, "u3": 2}},
    {"item": {"b": 8, "d": 5, "e": 4, "f": 3}, "user": {"u3": 10, "u4": 8, "u0": 2}},
    {"item": {"b": 7, "e": 5, "f": 5, "h": 3}, "user": {"u0": 20}},
]


def _window(root: Path, counts: dict, seed: int) -> dict[str, Path]:
    rng = np.random.default_rng(seed)
    cols = {k: rng.permutation(np.repeat(list(c), list(c.values()))) for k, c in counts.items()}
    labels = (rng.random(20) < 0.4).astype(np.float32)
    t = pa.table({k: pa.array(v.tolist()) for k, v in cols.items()} | {"label": labels})
    (root / "train").mkdir(parents=True)
    (root / "schema.toml").write_text(SCHEMA)
    pq.write_table(t, root / "train" / "part-00000.parquet")
    return {"schema": root / "schema.toml", "train": root / "train", "test": root / "train"}


def _config(tmp: Path, day: int, **train_keys) -> object:
    keys = {"batch_size": 4, "epochs": 1, "learning_rate": 0.05, "deterministic": True}
    keys |= {"checkpoint_every": 100, "log_every": 100, **train_keys}
    data = _window(tmp / f"day{day}", WINDOWS[day], day)
    out = tmp / f"run{day}"
    extra = "[vocab]\nevict_after = 1\n"
    path = write_run_config(
        tmp / f"run{day}.toml", data, out, MODEL, keys, extra=extra, data_extra=NO_VALIDATION
    )
    return load_config(path)


def _rows(run: Path, field: str) -> dict[str, np.ndarray]:
    """``{value: embedding row}`` of a run's selected checkpoint (``""``: the OOV row)."""
    model, _, _ = load_trained_model(run)
    table = model.embedding.layers_by_field[field].table.numpy()
    vocab = DatasetStats.load(RunPaths(run).stats)[field].vocab
    return {"": table[0], **{v: table[i + 1] for i, v in enumerate(vocab)}}


def _vocab(run: Path, field: str) -> list[str]:
    return DatasetStats.load(RunPaths(run).stats)[field].vocab


def test_continued_runs_keep_ids_carry_rows_and_evict(tmp_path):
    train(_config(tmp_path, 0), lambda _: None)
    first = VocabState.load(tmp_path / "run0" / "stats")  # a run from scratch saves window 0
    assert first.window == 0 and first.vocab("user") == ["u0", "u1", "u2"]
    users = first.tables["user"].to_pydict()  # u3: counted, outside the vocabulary
    assert dict(zip(users["value"], users["id"], strict=True))["u3"] == 0

    # continued with a learning rate too small to move anything: the rows each run starts from
    tiny = {"learning_rate": 1e-12, "max_steps": 1}
    lines: list[str] = []
    report1 = train(
        _config(tmp_path, 1, continue_from=str(tmp_path / "run0"), **tiny), lambda _: None
    )
    assert _vocab(tmp_path / "run1", "item") == ["a", "b", "c", "d", "e", "f"]
    assert _vocab(tmp_path / "run1", "user") == ["u0", "u3", "u4"]  # max_vocab 3
    assert report1["vocabulary"]["fields"]["user"] == {
        "kept": 1, "added": 2, "evicted": 2, "moved": 0, "size": 3
    }  # fmt: skip
    cfg2 = _config(tmp_path, 2, continue_from=str(tmp_path / "run1"), **tiny)
    report2 = train(cfg2, lines.append)
    assert _vocab(tmp_path / "run2", "item") == ["h", "b", "f", "d", "e"]
    assert report2["vocabulary"] == {
        "window": 2,
        "fields": {
            "user": {"kept": 3, "added": 0, "evicted": 0, "moved": 0, "size": 3},
            "item": {"kept": 4, "added": 1, "evicted": 2, "moved": 1, "size": 5},
        },
    }
    assert any("vocabulary item (window 2" in line and "2 evicted" in line for line in lines)
    state = VocabState.load(tmp_path / "run2" / "stats")
    kept = sorted(state.tables["item"]["value"].to_pylist())
    assert state.window == 2 and kept == ["b", "d", "e", "f", "h"]  # a and c are forgotten
    for field in ("item", "user"):
        before, after = _rows(tmp_path / "run1", field), _rows(tmp_path / "run2", field)
        for value, row in after.items():
            if not value:  # the OOV row, reached by no row of the window: each run's mean row
                continue
            want = before.get(value, before[""])  # h starts at the previous OOV row
            np.testing.assert_allclose(row, want, atol=1e-6, err_msg=f"{field} {value}")

    # a rerun after a kill before stats.json advances run1's state again: the same window 2
    (tmp_path / "run2" / "stats" / "stats.json").unlink()
    again = train(cfg2, lambda _: None)
    assert again["steps_this_run"] == 0 and again["vocabulary"] == report2["vocabulary"]
    assert VocabState.load(tmp_path / "run2" / "stats").window == 2
    assert _vocab(tmp_path / "run2", "item") == ["h", "b", "f", "d", "e"]

    out = export_run(tmp_path / "run2")
    feats = {"user": ["u0", "u4", "u1", "zz"], "item": ["h", "f", "a", "b"]}
    model, _, _ = load_trained_model(tmp_path / "run2")
    expected = tf.sigmoid(model({k: tf.constant(v) for k, v in feats.items()})).numpy()
    script = textwrap.dedent(
        f"""
        import json, tensorflow as tf
        fn = tf.saved_model.load({str(out)!r}).signatures["serving_default"]
        feats = {{k: tf.constant(v) for k, v in json.loads({json.dumps(feats)!r}).items()}}
        print(json.dumps(fn(**feats)["score"].numpy().tolist()))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True)
    scores = json.loads(done.stdout.decode().strip().splitlines()[-1])
    np.testing.assert_allclose(scores, expected.reshape(-1), atol=1e-6)
