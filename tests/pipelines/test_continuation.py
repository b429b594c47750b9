"""Warm start by value (``pipelines.run.continuation``) on tiny models, against hand-computed
rows: tables and Adam slots gathered by vocabulary value, new rows, AMTL counts, id-independent
tables copied as they are, and the errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from embeddings.collection import EmbeddingCollection
from features.stats import DatasetStats, FieldStats
from pipelines.config import ConfigError, TrainConfig
from pipelines.run.continuation import ContinueOptions, Previous, continue_model, id_map

OLD = ["a", "b", "c"]  # ids 1, 2, 3
NEW = ["c", "d", "a", "e"]  # c: 3 -> 1, d new, a: 1 -> 3, e new


class _Tiny(tf.keras.Model):
    """Embeddings of the ``tables`` fields, concatenated, into one Dense unit."""

    def __init__(self, tables: list[dict]) -> None:
        super().__init__()
        self.embedding = EmbeddingCollection(tables)
        self.head = tf.keras.layers.Dense(1)

    def call(self, ids: dict[str, tf.Tensor]) -> tf.Tensor:
        vectors = self.embedding(ids).vectors
        return self.head(tf.concat([vectors[n] for n in sorted(vectors)], axis=-1))


def _stats(**vocabs: list[str]) -> DatasetStats:
    fields = {
        n: FieldStats(n, "categorical", vocab=v, vocab_counts=[1] * len(v))
        for n, v in vocabs.items()
    }
    return DatasetStats(rows=10, positives=3, fields=fields)


def _model(
    tables: list[dict], optimizer: str = "adam"
) -> tuple[tf.keras.Model, tf.keras.optimizers.Optimizer]:
    model = _Tiny(tables)
    model({t["name"]: tf.constant([0], tf.int64) for t in tables})
    kinds = {
        "adam": tf.keras.optimizers.Adam,
        "adagrad": tf.keras.optimizers.Adagrad,
        "ftrl": tf.keras.optimizers.Ftrl,
    }
    opt = kinds[optimizer](0.1)
    opt.build(model.trainable_variables)
    return model, opt


def _fill(model: tf.keras.Model, opt: tf.keras.optimizers.Optimizer, iterations: int = 7) -> None:
    """Distinct hand-readable values: variable k holds ``100 k + arange``, its Adam m ``- that``
    and v ``2 x that``."""
    for k, v in enumerate(model.variables):
        value = 100.0 * (k + 1) + np.arange(np.prod(v.shape), dtype=np.float32).reshape(v.shape)
        v.assign(value)
        if v.trainable:
            i = opt._index_dict[opt._var_key(v)]
            opt._momentums[i].assign(-value)
            opt._velocities[i].assign(2 * value)
    opt.iterations.assign(iterations)


def _previous(model, opt, stats, bh_codes: str = "vocabulary") -> Previous:
    return Previous(Path("prev"), model, opt, stats, None, "prev/ckpt-1", "prev/ckpt-1", bh_codes)


def _slots(opt, var) -> tuple[np.ndarray, np.ndarray]:
    i = opt._index_dict[opt._var_key(var)]
    return opt._momentums[i].numpy(), opt._velocities[i].numpy()


def test_id_map_by_hand():
    np.testing.assert_array_equal(id_map(OLD, NEW), [0, 3, -1, 1, -1])
    np.testing.assert_array_equal(id_map(OLD, OLD), [0, 1, 2, 3])
    np.testing.assert_array_equal(id_map([], ["x"]), [0, -1])
    np.testing.assert_array_equal(id_map(["x", "y"], []), [0])


def test_full_table_rows_and_adam_slots_follow_the_values():
    old, old_opt = _model([{"name": "f", "num_rows": 4, "dim": 2}])
    _fill(old, old_opt)
    new, opt = _model([{"name": "f", "num_rows": 5, "dim": 2}])
    lines: list[str] = []
    summary = continue_model(
        new,
        opt,
        _previous(old, old_opt, _stats(f=OLD)),
        _stats(f=NEW),
        ContinueOptions(),
        lines.append,
    )
    assert summary["f"] == {"how": "by value", "kept": 2, "new": 2}
    w = old.embedding.layers_by_field["f"].table.numpy()  # rows [100, 101], [102, 103], ...
    got = new.embedding.layers_by_field["f"].table.numpy()
    # rows: OOV <- OOV; c <- old 3; d (new) <- old OOV; a <- old 1; e (new) <- old OOV
    np.testing.assert_array_equal(got, w[[0, 3, 0, 1, 0]])
    m, v = _slots(opt, new.embedding.layers_by_field["f"].table)
    old_m, old_v = _slots(old_opt, old.embedding.layers_by_field["f"].table)
    np.testing.assert_array_equal(m, [old_m[0], old_m[3], [0, 0], old_m[1], [0, 0]])
    np.testing.assert_array_equal(v, [old_v[0], old_v[3], [0, 0], old_v[1], [0, 0]])
    # the head and its slots as they are, the iterations carried over
    np.testing.assert_array_equal(new.head.kernel.numpy(), old.head.kernel.numpy())
    np.testing.assert_array_equal(_slots(opt, new.head.bias)[1], _slots(old_opt, old.head.bias)[1])
    assert int(opt.iterations) == 7
    assert "f 2 kept / 2 new" in lines[0] and "7 iterations" in lines[0]


@pytest.mark.parametrize("new_rows", ["mean", "zeros", "init"])
def test_new_rows(new_rows):
    old, old_opt = _model([{"name": "f", "num_rows": 4, "dim": 2}])
    _fill(old, old_opt)
    new, opt = _model([{"name": "f", "num_rows": 5, "dim": 2}])
    fresh = new.embedding.layers_by_field["f"].table.numpy()
    continue_model(
        new,
        opt,
        _previous(old, old_opt, _stats(f=OLD)),
        _stats(f=NEW),
        ContinueOptions(new_rows),
        lambda _: None,
    )
    w = old.embedding.layers_by_field["f"].table.numpy()
    got = new.embedding.layers_by_field["f"].table.numpy()
    want = {"mean": w[1:].mean(axis=0), "zeros": np.zeros(2), "init": fresh[[2, 4]]}[new_rows]
    np.testing.assert_allclose(got[[2, 4]], np.broadcast_to(want, (2, 2)))
    np.testing.assert_array_equal(got[[0, 1, 3]], w[[0, 3, 1]])


def test_adagrad_accumulators_of_new_rows_start_at_the_initial_value():
    old, old_opt = _model([{"name": "f", "num_rows": 4, "dim": 1}], "adagrad")
    table = old.embedding.layers_by_field["f"].table
    old_opt._accumulators[old_opt._index_dict[old_opt._var_key(table)]].assign(
        [[5.0], [6.0], [7.0], [8.0]]
    )
    new, opt = _model([{"name": "f", "num_rows": 5, "dim": 1}], "adagrad")
    continue_model(
        new,
        opt,
        _previous(old, old_opt, _stats(f=OLD)),
        _stats(f=NEW),
        ContinueOptions(),
        lambda _: None,
    )
    acc = opt._accumulators[opt._index_dict[opt._var_key(new.embedding.layers_by_field["f"].table)]]
    np.testing.assert_allclose(
        acc.numpy()[:, 0], [5.0, 8.0, 0.1, 6.0, 0.1], rtol=1e-6
    )  # Keras' initial 0.1


def test_ftrl_accumulators_and_linears_follow_the_values():
    old, old_opt = _model([{"name": "f", "num_rows": 4, "dim": 1}], "ftrl")
    i = old_opt._index_dict[old_opt._var_key(old.embedding.layers_by_field["f"].table)]
    old_opt._accumulators[i].assign([[5.0], [6.0], [7.0], [8.0]])
    old_opt._linears[i].assign([[-1.0], [-2.0], [-3.0], [-4.0]])
    new, opt = _model([{"name": "f", "num_rows": 5, "dim": 1}], "ftrl")
    previous = _previous(old, old_opt, _stats(f=OLD))
    continue_model(new, opt, previous, _stats(f=NEW), ContinueOptions(), lambda _: None)
    j = opt._index_dict[opt._var_key(new.embedding.layers_by_field["f"].table)]
    # rows: OOV <- OOV; c <- old 3; d (new); a <- old 1; e (new): Keras' initial 0.1 and 0
    np.testing.assert_allclose(opt._accumulators[j].numpy()[:, 0], [5, 8, 0.1, 6, 0.1], rtol=1e-6)
    np.testing.assert_array_equal(opt._linears[j].numpy()[:, 0], [-1, -4, 0, -2, 0])


def test_amtl_rows_and_counts_follow_the_values():
    old, old_opt = _model(
        [
            {
                "name": "f",
                "num_rows": 4,
                "dim": 2,
                "method": "amtl",
                "options": {"counts": [5, 30, 20, 10]},
            }
        ]
    )
    new, opt = _model(
        [
            {
                "name": "f",
                "num_rows": 5,
                "dim": 2,
                "method": "amtl",
                "options": {"counts": [1, 9, 8, 7, 6]},
            }
        ]
    )
    layer, before = new.embedding.layers_by_field["f"], old.embedding.layers_by_field["f"]
    continue_model(
        new,
        opt,
        _previous(old, old_opt, _stats(f=OLD)),
        _stats(f=NEW),
        ContinueOptions(),
        lambda _: None,
    )
    # kept values their previous counts, new ones (d, e) their window's
    np.testing.assert_array_equal(layer.counts.numpy(), [5, 10, 8, 30, 6])
    logs = np.log1p([5.0, 10, 8, 30, 6])
    np.testing.assert_allclose(layer.count_stats.numpy(), [logs.mean(), logs.std()], rtol=1e-6)
    np.testing.assert_array_equal(layer.table.numpy(), before.table.numpy()[[0, 3, 0, 1, 0]])
    for a, b in zip(layer.h_aml + layer.l_aml, before.h_aml + before.l_aml, strict=True):
        np.testing.assert_array_equal(a.kernel.numpy(), b.kernel.numpy())  # length MLPs as is


def test_hashing_qr_and_bh_tables_are_copied_as_they_are():
    hashing = {"name": "h", "num_rows": 4, "dim": 2, "method": "hashing", "options": {"buckets": 8}}
    bh = {
        "name": "b",
        "num_rows": 4,
        "dim": 2,
        "method": "bh",
        "options": {"block_bits": 2, "code_bits": 4},
    }
    qr = {"name": "q", "num_rows": 4, "dim": 2, "method": "qr", "options": {"collisions": 2}}
    old, old_opt = _model([hashing, bh, qr])
    _fill(old, old_opt)
    grown = [hashing, {**bh, "num_rows": 5}, {**qr, "num_rows": 6}]  # 3 quotient rows, not 2
    new, opt = _model(grown)
    fresh_quotient = new.embedding.layers_by_field["q"].quotient.numpy()
    lines: list[str] = []
    stats_old, stats_new = _stats(b=OLD, q=OLD), _stats(b=["b", "a", "c", "d"], q=[*OLD, "d", "e"])
    summary = continue_model(
        new, opt, _previous(old, old_opt, stats_old), stats_new, ContinueOptions(), lines.append
    )
    o, n = old.embedding.layers_by_field, new.embedding.layers_by_field
    for name in ("h", "b"):
        np.testing.assert_array_equal(n[name].table.numpy(), o[name].table.numpy())
        np.testing.assert_array_equal(
            _slots(opt, n[name].table)[0], _slots(old_opt, o[name].table)[0]
        )
    np.testing.assert_array_equal(n["q"].remainder.numpy(), o["q"].remainder.numpy())
    np.testing.assert_array_equal(n["q"].quotient.numpy()[:2], o["q"].quotient.numpy())
    np.testing.assert_array_equal(n["q"].quotient.numpy()[2], fresh_quotient[2])
    assert _slots(opt, n["q"].quotient)[0][2].tolist() == [0.0, 0.0]
    # BH with vocabulary codes: a and b swapped ids, which the log says
    assert summary["b"] == {"how": "as is", "kept": 3, "new": 1, "moved": 2}
    assert summary["q"]["moved"] == 0 and summary["h"]["how"] == "as is"
    assert "{'b': 2}" in lines[0]
    # fingerprint codes do not depend on the ids: nothing moved worth saying
    new2, opt2 = _model(grown)
    summary = continue_model(
        new2,
        opt2,
        _previous(old, old_opt, stats_old, "fingerprint"),
        stats_new,
        ContinueOptions(),
        lambda _: None,
    )
    assert "moved" not in summary["b"]


def test_mismatches_are_clear_errors():
    old, old_opt = _model(
        [{"name": "f", "num_rows": 4, "dim": 2}, {"name": "g", "num_rows": 3, "dim": 2}]
    )
    prev = _previous(old, old_opt, _stats(f=OLD, g=["x", "y"]))
    new, opt = _model([{"name": "f", "num_rows": 5, "dim": 2}])
    with pytest.raises(
        ValueError, match=r"\[\] only in this run, \['g'\] only in the previous run"
    ):
        continue_model(new, opt, prev, _stats(f=NEW), ContinueOptions(), lambda _: None)
    wider, opt = _model(
        [{"name": "f", "num_rows": 5, "dim": 3}, {"name": "g", "num_rows": 3, "dim": 2}]
    )
    with pytest.raises(
        ValueError, match=r"field 'f' .*table has shape \[4, 2\] there, \[5, 3\] here"
    ):
        continue_model(
            wider, opt, prev, _stats(f=NEW, g=["x", "y"]), ContinueOptions(), lambda _: None
        )
    other, opt = _model(
        [
            {"name": "f", "num_rows": 5, "dim": 2, "method": "qr", "options": {"collisions": 2}},
            {"name": "g", "num_rows": 3, "dim": 2},
        ]
    )
    with pytest.raises(ValueError, match="field 'f' is a FullEmbedding there, a QREmbedding here"):
        continue_model(
            other, opt, prev, _stats(f=NEW, g=["x", "y"]), ContinueOptions(), lambda _: None
        )
    same, adagrad = _model(
        [{"name": "f", "num_rows": 5, "dim": 2}, {"name": "g", "num_rows": 3, "dim": 2}], "adagrad"
    )
    with pytest.raises(ValueError, match="trained with Adam, this one with Adagrad"):
        continue_model(
            same, adagrad, prev, _stats(f=NEW, g=["x", "y"]), ContinueOptions(), lambda _: None
        )


def test_config_keys():
    assert TrainConfig().new_rows == "oov" and TrainConfig().continue_from == ""
    with pytest.raises(ConfigError, match=r"\[train\] new_rows 'copy' is not one of"):
        TrainConfig(new_rows="copy")
    with pytest.raises(ConfigError, match="set one of them"):
        TrainConfig(continue_from="a", warm_start="b")
    with pytest.raises(ValueError, match="new_rows 'x'"):
        ContinueOptions("x")
