from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from embeddings.amtl import AMTLEmbedding, AMTLServingEmbedding
from embeddings.full import FullEmbedding
from tests.embeddings.roundtrip import layer_module

ROWS, DIM = 50, 8


def _zipf_counts(rows: int, top: float = 10_000.0) -> np.ndarray:
    counts = np.floor(top / np.arange(1, rows + 1) ** 1.1)
    counts[0] = 40.0  # the OOV row
    return counts


def _force_logits(layer: AMTLEmbedding, h_bias: np.ndarray, l_bias: np.ndarray) -> None:
    """Zero output kernels: hAML / lAML logits are exactly their biases for every id."""
    for mlp, bias in ((layer.h_aml, h_bias), (layer.l_aml, l_bias)):
        mlp[-1].kernel.assign(tf.zeros_like(mlp[-1].kernel))
        mlp[-1].bias.assign(np.asarray(bias, np.float32))


def _peak(p: int, height: float = 10.0, dim: int = DIM) -> np.ndarray:
    b = np.zeros(dim, np.float32)
    b[p] = height
    return b


def _layer(**kw) -> AMTLEmbedding:
    kw.setdefault("counts", _zipf_counts(ROWS))
    layer = AMTLEmbedding(ROWS, DIM, **kw)
    layer.build(None)
    layer.table.assign(np.random.default_rng(0).normal(size=(ROWS, DIM)).astype(np.float32))
    return layer


def _mixed_lengths(layer: AMTLEmbedding) -> None:
    """Frequent ids (gate > 0.5) -> k = 6, rare ids -> k = 2."""
    _force_logits(layer, _peak(5), _peak(1))


def _expected(layer: AMTLEmbedding, ids: np.ndarray) -> np.ndarray:
    table = layer.table.numpy()
    safe = np.where((ids >= 0) & (ids < layer.num_rows), ids, 0)
    k = layer.lengths()[safe]
    return table[safe] * (np.arange(layer.dim)[None, :] < k[:, None])


# ------------------------------------------------------------------ mask, gate, OOV, pooling


def test_mask_and_length_from_known_logits():
    layer = _layer()
    _force_logits(layer, _peak(2), _peak(2))  # argmax 2 for every id -> k = 3
    ids = np.array([1, 7, 49], np.int64)
    out = layer(tf.constant(ids)).numpy()
    want = layer.table.numpy()[ids].copy()
    want[:, 3:] = 0.0
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(layer.lengths(), np.full(ROWS, 3))

    _mixed_lengths(layer)
    gate = layer.gate(tf.range(ROWS, dtype=tf.int64)).numpy()
    k = layer.lengths()
    np.testing.assert_array_equal(k, np.where(gate > 0.5, 6, 2))
    assert {2, 6} == set(k.tolist())
    ids = np.arange(ROWS, dtype=np.int64)
    np.testing.assert_array_equal(layer(tf.constant(ids)).numpy(), _expected(layer, ids))


def test_straight_through_hard_forward_soft_gradient():
    layer = _layer()
    _force_logits(layer, _peak(3, 2.0), _peak(1, 2.0))
    ids = tf.constant([1, 2, 30, 49, 1], tf.int64)
    weights = tf.constant(np.random.default_rng(1).normal(size=(5, DIM)), tf.float32)
    with tf.GradientTape() as tape:
        out = layer(ids)
        loss = tf.reduce_sum(out * weights)
    mlp_vars = [v for mlp in (layer.h_aml, layer.l_aml) for d in mlp for v in d.trainable_weights]
    grads = tape.gradient(loss, [*mlp_vars, layer.table])
    k = layer.lengths()[ids.numpy()]
    beyond = np.arange(DIM)[None, :] >= k[:, None]
    assert np.all(out.numpy()[beyond] == 0.0)  # hard forward: exact zeros after k_i
    assert np.all(out.numpy()[~beyond] != 0.0)
    # the relaxation carries gradient into both twins' output layers
    by_name = {v.name: g for v, g in zip(mlp_vars, grads[:-1], strict=True)}
    for name in ("h_aml_out/kernel", "h_aml_out/bias", "l_aml_out/kernel", "l_aml_out/bias"):
        g = next(g for n, g in by_name.items() if name in n)
        assert g is not None and float(tf.reduce_max(tf.abs(g))) > 0, name
    # masked table entries get no gradient, kept ones do
    table_grad = tf.convert_to_tensor(grads[-1]).numpy()[ids.numpy()]
    assert np.all(table_grad[beyond] == 0.0)


def test_hidden_layers_get_gradient_once_output_kernel_moves():
    layer = _layer(hidden=(16, 8))
    for d in (layer.h_aml[-1], layer.l_aml[-1]):
        d.kernel.assign(tf.random.stateless_normal(d.kernel.shape, seed=(1, 2)))
    ids = tf.constant([1, 5, 40], tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(ids) * tf.range(DIM, dtype=tf.float32))
    first = [layer.h_aml[0].kernel, layer.l_aml[0].kernel]
    for g in tape.gradient(loss, first):
        assert float(tf.reduce_max(tf.abs(g))) > 0


def test_frequency_gate_and_twins_do_not_share_weights():
    counts = _zipf_counts(ROWS)
    layer = _layer(counts=counts)
    ids = tf.range(ROWS, dtype=tf.int64)
    gate = layer.gate(ids).numpy()
    logs = np.log1p(counts)
    np.testing.assert_allclose(gate, 1 / (1 + np.exp(-(logs - logs.mean()) / logs.std())), 1e-5)
    assert gate[1] > gate[10] > gate[49]
    assert gate[1] > 0.5 > gate[49]

    h_ids = {id(v) for d in layer.h_aml for v in d.weights}
    l_ids = {id(v) for d in layer.l_aml for v in d.weights}
    assert len(h_ids) == len(l_ids) == 4 and not h_ids & l_ids
    # changing one twin moves only its share a_i (hAML) / 1 - a_i (lAML) of the logits
    before = layer.logits(ids).numpy()
    layer.h_aml[-1].bias.assign_add(np.ones(DIM, np.float32))
    delta = layer.logits(ids).numpy() - before
    np.testing.assert_allclose(delta, np.repeat(gate[:, None], DIM, 1), atol=1e-5)
    # gradients: the frequent id mostly trains hAML, the rare one lAML
    for i in (1, 49):
        with tf.GradientTape() as tape:
            h = layer.logits(tf.constant([i], tf.int64))
        gh, gl = tape.gradient(h, [layer.h_aml[-1].bias, layer.l_aml[-1].bias])
        assert (float(gh[0]) > float(gl[0])) == (i == 1)


def test_zero_counts_give_neutral_gate():
    layer = AMTLEmbedding(5, 3)  # no counts: zeros until set or restored
    np.testing.assert_allclose(layer.gate(tf.constant([0, 4], tf.int64)).numpy(), [0.5, 0.5])
    layer.set_counts([9, 5, 3, 1, 0])
    assert float(layer.gate(tf.constant([0], tf.int64))[0]) > 0.5
    np.testing.assert_array_equal(layer.counts.numpy(), [9, 5, 3, 1, 0])


def test_oov_path_reads_row_zero():
    layer = _layer()
    _mixed_lengths(layer)
    out = layer(tf.constant([0, -1, -100, ROWS, 10**9], tf.int64)).numpy()
    for row in out[1:]:
        np.testing.assert_array_equal(row, out[0])
    np.testing.assert_array_equal(out[0], _expected(layer, np.array([0]))[0])


def test_dense_ids_of_any_shape():
    layer = _layer()
    _mixed_lengths(layer)
    ids = np.array([[1, 40], [-3, 2], [49, 49]], np.int64)
    out = layer(tf.constant(ids)).numpy()
    assert out.shape == (3, 2, DIM)
    np.testing.assert_array_equal(out.reshape(6, DIM), _expected(layer, ids.reshape(-1)))
    serving = layer.serving_form()
    np.testing.assert_array_equal(serving(tf.constant(ids)).numpy(), out)


@pytest.mark.parametrize("combiner", ["mean", "sum"])
def test_ragged_pooling(combiner):
    layer = _layer(combiner=combiner)
    _mixed_lengths(layer)
    ids = tf.ragged.constant([[1, 40], [3], [], [-5, 60, 2]], dtype=tf.int64)
    out = layer(ids).numpy()
    assert out.shape == (4, DIM)
    for r, row in enumerate(ids.to_list()):
        if not row:
            np.testing.assert_array_equal(out[r], np.zeros(DIM))
            continue
        vecs = _expected(layer, np.array(row))
        want = vecs.mean(0) if combiner == "mean" else vecs.sum(0)
        np.testing.assert_allclose(out[r], want, rtol=1e-6, atol=1e-7)


def test_l2_and_length_penalty_losses():
    layer = _layer(l2=0.5, length_penalty=0.2)
    _force_logits(layer, _peak(2), _peak(2))
    ids = np.array([1, 1, 7], np.int64)
    layer(tf.constant(ids))
    l2, pen = (float(x) for x in layer.losses)
    masked = _expected(layer, ids)
    assert l2 == pytest.approx(0.5 * np.sum(masked**2) / 3, rel=1e-5)
    assert pen == pytest.approx(0.2 * 3 / DIM, rel=1e-6)  # k = 3 for both unique ids


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_rows": 0, "dim": 3}, "num_rows"),
        ({"num_rows": 5, "dim": 0}, "dim"),
        ({"num_rows": 5, "dim": 3, "combiner": "max"}, "combiner"),
        ({"num_rows": 5, "dim": 3, "l2": -1.0}, "l2"),
        ({"num_rows": 5, "dim": 3, "counts": [1, 2, 3]}, "counts"),
        ({"num_rows": 3, "dim": 3, "counts": [1, -2, 3]}, "counts"),
        ({"num_rows": 3, "dim": 3, "counts": [1, np.nan, 3]}, "counts"),
        ({"num_rows": 5, "dim": 3, "temperature": 0.0}, "temperature"),
        ({"num_rows": 5, "dim": 3, "temperature": -1.0}, "temperature"),
        ({"num_rows": 5, "dim": 3, "hidden": (0,)}, "hidden"),
        ({"num_rows": 5, "dim": 3, "length_bias": 0.0}, "length_bias"),
        ({"num_rows": 5, "dim": 3, "length_penalty": -0.1}, "length_penalty"),
    ],
)
def test_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AMTLEmbedding(**kwargs)


def test_validation_of_warm_start_and_serving_layer():
    layer = AMTLEmbedding(5, 3)
    with pytest.raises(ValueError, match="shape"):
        layer.warm_start_from(np.zeros((5, 4)))
    with pytest.raises(ValueError, match="counts"):
        layer.set_counts([1, 2])
    with pytest.raises(ValueError, match="built"):
        AMTLEmbedding.from_full(FullEmbedding(5, 3), counts=None)
    with pytest.raises(ValueError, match="total_values"):
        AMTLServingEmbedding(5, 3, total_values=4)
    with pytest.raises(ValueError, match="total_values"):
        AMTLServingEmbedding(5, 3, total_values=16)
    with pytest.raises(ValueError, match="dim"):
        AMTLServingEmbedding(5, 0)


# ------------------------------------------------------------------ training


def _train(seed: int, length_penalty: float, steps: int = 300, rows: int = 200, dim: int = 8):
    """Multi-output regression: the 20 most frequent ids have an 8-d target (needs every
    coordinate), the rarer ids pure N(0, 1) noise (best prediction 0: needs none)."""
    rng = np.random.default_rng(seed)
    tf.keras.utils.set_random_seed(seed)
    p = 1.0 / np.arange(1, rows)
    ids = rng.choice(np.arange(1, rows), size=20_000, p=p / p.sum())
    counts = np.bincount(ids, minlength=rows)
    targets = rng.normal(size=(rows, dim))
    frequent = ids <= 20
    y = np.where(frequent[:, None], targets[ids], rng.normal(size=(ids.size, dim)))
    y = y.astype(np.float32)
    emb = AMTLEmbedding(rows, dim, counts=counts, length_penalty=length_penalty)
    head = tf.keras.layers.Dense(dim)
    emb.build(None)
    head.build((None, dim))
    variables = emb.trainable_variables + head.trainable_variables
    opt = tf.keras.optimizers.Adam(0.02)

    @tf.function
    def step(x, t):
        with tf.GradientTape() as tape:
            mse = tf.reduce_mean(tf.square(head(emb(x)) - t))
            loss = mse + tf.add_n(emb.losses) if emb.losses else mse
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
        return mse

    losses = []
    for _ in range(steps):
        b = rng.integers(0, ids.size, 256)
        losses.append(float(step(tf.constant(ids[b], tf.int64), tf.constant(y[b]))))
    k = emb.lengths()
    return np.mean(losses[:20]), np.mean(losses[-20:]), k[1:21].mean(), k[21:].mean(), emb


def test_training_learns_longer_lengths_for_frequent_ids():
    # thresholds checked over seeds 0..9 (both settings): last/first loss 0.43-0.60 (last 20
    # steps 0.375-0.41, noise floor ~0.39); with the penalty: frequent mean k 7.25-8, rare
    # 1.00-1.20, serve bytes 0.33-0.36 of the full table; without it: frequent 8, rare 2.0-6.35
    first, last, k_freq, k_rare, emb = _train(seed=0, length_penalty=0.05)
    assert last < 0.7 * first
    assert k_freq >= 6.5 and k_rare <= 2.0
    assert emb.memory_bytes()["serve"] < 0.45 * emb.num_rows * emb.dim * 4
    # the paper's plain objective (no memory price) also separates them
    first, last, k_freq, k_rare, _ = _train(seed=1, length_penalty=0.0)
    assert last < 0.7 * first
    assert k_freq > k_rare + 1.0


# ------------------------------------------------------------------ warm start


def test_from_full_warm_start_equals_full_layer_before_training():
    full = FullEmbedding(ROWS, DIM, combiner="sum", l2=0.1)
    ids = tf.constant([0, 3, 49, -1, 99], tf.int64)
    ragged = tf.ragged.constant([[1, 2, 3], [], [7]], dtype=tf.int64)
    full_out, full_rag = full(ids).numpy(), full(ragged).numpy()
    amtl = AMTLEmbedding.from_full(full, counts=_zipf_counts(ROWS), hidden=(16, 16))
    assert (amtl.num_rows, amtl.dim, amtl.combiner, amtl.l2) == (ROWS, DIM, "sum", 0.1)
    assert amtl.hidden == (16, 16)
    np.testing.assert_array_equal(amtl.table.numpy(), full.table.numpy())
    np.testing.assert_array_equal(amtl.lengths(), np.full(ROWS, DIM))
    np.testing.assert_array_equal(amtl(ids).numpy(), full_out)
    np.testing.assert_array_equal(amtl(ragged).numpy(), full_rag)
    np.testing.assert_allclose(float(amtl.losses[-1]), float(full.losses[-1]), rtol=1e-6)


# ------------------------------------------------------------------ serving form, memory


_IDS = tf.constant([0, 1, 2, 17, 49, -1, 50, 10**6, 1], tf.int64)
_RAGGED = tf.ragged.constant([[1, 30], [], [-2, 49, 5, 5], [7]], dtype=tf.int64)


@pytest.mark.parametrize("combiner", ["mean", "sum"])
def test_serving_form_equals_training_layer(combiner):
    layer = _layer(combiner=combiner)
    # random MLP output layers: a spread of lengths, not just two
    rng = np.random.default_rng(3)
    for d in (layer.h_aml[-1], layer.l_aml[-1]):
        d.kernel.assign(rng.normal(size=d.kernel.shape).astype(np.float32))
        d.bias.assign(rng.normal(size=d.bias.shape).astype(np.float32))
    k = layer.lengths()
    assert len(set(k.tolist())) >= 3
    serving = layer.serving_form()
    assert isinstance(serving, AMTLServingEmbedding)
    assert serving.total_values == k.sum() and serving.row_splits.dtype == tf.int32
    assert not serving.trainable_weights
    all_ids = tf.range(-3, ROWS + 3, dtype=tf.int64)
    for x in (_IDS, _RAGGED, all_ids):
        np.testing.assert_allclose(serving(x).numpy(), layer(x).numpy(), rtol=0, atol=1e-6)
    np.testing.assert_array_equal(serving(all_ids).numpy(), layer(all_ids).numpy())
    mem = serving.memory_bytes()
    assert mem == {"train": 4 * k.sum() + 4 * (ROWS + 1)} | {"serve": 4 * k.sum() + 4 * (ROWS + 1)}
    assert layer.memory_bytes()["serve"] == mem["serve"]


def test_memory_bytes():
    layer = AMTLEmbedding(1000, 8, hidden=(32,))
    mlp = 2 * (2 * 32 + 32 + 32 * 8 + 8)
    train = 4 * (1000 * 8 + mlp + 1000 + 2)
    assert layer.memory_bytes() == {"train": train, "serve": 1000 * 8 * 4 + 1001 * 4}
    layer.build(None)
    _force_logits(layer, _peak(0, dim=8), _peak(0, dim=8))  # k = 1 everywhere
    assert layer.memory_bytes() == {"train": train, "serve": 1000 * 4 + 1001 * 4}
    assert AMTLServingEmbedding.compact_bytes(10, 2**31) == 2**31 * 4 + 11 * 8


def test_config_round_trip_and_weights_restore():
    layer = _layer(combiner="sum", l2=0.01, hidden=(8, 4), temperature=0.5, length_penalty=0.1)
    _mixed_lengths(layer)
    config = layer.get_config()
    assert "counts" not in config
    clone = tf.keras.layers.deserialize(tf.keras.layers.serialize(layer))
    assert isinstance(clone, AMTLEmbedding)
    assert clone.get_config() == config
    clone.build(None)
    assert float(tf.reduce_sum(clone.counts)) == 0.0  # data, not config
    clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(clone.counts.numpy(), layer.counts.numpy())
    np.testing.assert_array_equal(clone(_IDS).numpy(), layer(_IDS).numpy())

    serving = layer.serving_form(name="srv")
    s_clone = tf.keras.layers.deserialize(tf.keras.layers.serialize(serving))
    assert isinstance(s_clone, AMTLServingEmbedding)
    assert s_clone.get_config() == serving.get_config()
    assert s_clone.get_config()["total_values"] == int(layer.lengths().sum())
    s_clone.build(None)
    s_clone.set_weights(serving.get_weights())
    np.testing.assert_array_equal(s_clone(_RAGGED).numpy(), layer(_RAGGED).numpy())


def test_saved_model_round_trip_of_both_layers(tmp_path):
    layer = _layer()
    _mixed_lengths(layer)
    lengths = _RAGGED.row_lengths()
    for name, lyr in (("train", layer), ("serve", layer.serving_form())):
        module = layer_module(lyr)
        before = module.f(_IDS, _RAGGED.flat_values, lengths)
        tf.saved_model.save(module, str(tmp_path / name))
        loaded = tf.saved_model.load(str(tmp_path / name))
        after = loaded.f(_IDS, _RAGGED.flat_values, lengths)
        for key in before:
            np.testing.assert_array_equal(before[key].numpy(), after[key].numpy())
            np.testing.assert_array_equal(
                after[key].numpy(), layer(_IDS if key == "dense" else _RAGGED).numpy()
            )


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def test_saved_model_of_serving_form_is_small_on_disk(tmp_path):
    rows, dim = 200_000, 16
    full = FullEmbedding(rows, dim)
    full.build(None)
    amtl = AMTLEmbedding.from_full(full, counts=_zipf_counts(rows, top=1e4))
    # frequent ids (gate > 0.5: the 4,328 ids with log1p(count) above the field mean) keep all
    # 16 entries, the long tail 1
    _force_logits(amtl, _peak(dim - 1, dim=dim), _peak(0, dim=dim))
    k = amtl.lengths()
    total = int(k.sum())
    assert set(np.unique(k).tolist()) == {1, dim} and total < 0.1 * rows * dim
    serving = amtl.serving_form()
    tf.saved_model.save(layer_module(full), str(tmp_path / "full"))
    tf.saved_model.save(layer_module(serving), str(tmp_path / "amtl"))
    full_bytes = _dir_bytes(tmp_path / "full" / "variables")
    amtl_bytes = _dir_bytes(tmp_path / "amtl" / "variables")
    compact = total * 4 + (rows + 1) * 4
    assert serving.memory_bytes()["serve"] == compact == amtl.memory_bytes()["serve"]
    assert rows * dim * 4 <= full_bytes < rows * dim * 4 * 1.01
    assert compact <= amtl_bytes < compact * 1.01 + 4096
    assert amtl_bytes < 0.2 * full_bytes
    loaded = tf.saved_model.load(str(tmp_path / "amtl"))
    ids = tf.constant([0, 1, 5, 150_000, 199_999, -1], tf.int64)
    no_values = tf.zeros([0], tf.int64)
    out = loaded.f(ids, no_values, tf.zeros([6], tf.int64))["dense"].numpy()
    np.testing.assert_array_equal(out, amtl(ids).numpy())
    print(f"variables/ bytes: full {full_bytes}, AMTL serving {amtl_bytes}, sum k_i {total}")
