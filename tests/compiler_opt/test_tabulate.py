"""AMTL in serving graphs: tabulation of the embedding op's per-id masks (the id domain read from
the graph, the masks as constant tables with outputs bit-equal to the frozen graph, the op's row
form, the masks it must leave alone with the reason), and the op reading AMTL's compact serving
form (what exports hold)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from compiler_opt import graph_io, realize, tabulate
from compiler_opt.embedding_op import layer as emb_layer
from compiler_opt.embedding_op import ops as emb_ops
from compiler_opt.embedding_op import spec as emb_spec
from embeddings.collection import EmbeddingCollection
from embeddings.full import oov_safe
from tests.compiler_opt.conftest import need_compiler

N = 40  # rows of each AMTL table


def _frozen(fn, *specs) -> realize.Frozen:
    return realize.freeze(tf.function(fn, input_signature=list(specs)).get_concrete_function())


def _run(graph_def, frozen, *args) -> np.ndarray:
    f = graph_io.load_graph_def(graph_def, frozen.inputs, frozen.outputs, frozen.bound)
    return f(*tf.nest.flatten(list(args), expand_composites=True))[0].numpy()


def test_the_domain_is_read_from_the_oov_pattern():
    def f(x):
        return tf.unique(oov_safe(x, 17)).y, tf.unique(x).y

    frozen = _frozen(f, tf.TensorSpec([None], tf.int64))
    by = {n.name: n for n in frozen.graph_def.node}
    uniques = [n for n in frozen.graph_def.node if n.op == "Unique"]
    assert sorted(tabulate.oov_domain(by, u.input[0]) or 0 for u in uniques) == [0, 17]


@pytest.fixture(scope="module")
def amtl_block():
    """Two AMTL fields (one ragged) and a full one, lengths below dim for some ids."""
    need_compiler()
    tf.keras.utils.set_random_seed(3)
    tables = [
        {"name": "a", "num_rows": N, "dim": 4, "method": "amtl"},
        {"name": "tags", "num_rows": N, "dim": 4, "method": "amtl", "combiner": "mean"},
        {"name": "plain", "num_rows": 9, "dim": 4},
    ]
    counts = {n: (np.arange(N)[::-1] ** 2).tolist() for n in ("a", "tags")}
    coll = EmbeddingCollection(tables, counts=counts, name="block")
    fused = emb_layer.FusedEmbeddingCollection.from_collection(coll)
    fused(_ids(0))
    for name in ("a", "tags"):
        layer = coll.layers_by_field[name]
        for mlp in (layer.h_aml, layer.l_aml):
            k = mlp[-1].kernel
            k.assign(tf.random.stateless_normal(k.shape, seed=[4, 5]) * 3.0)
    lengths = coll.layers_by_field["a"].lengths()
    assert len(np.unique(lengths)) > 1, "the test needs masks that differ between ids"
    specs = {
        "a": tf.TensorSpec([None], tf.int64),
        "tags": tf.RaggedTensorSpec([None, None], tf.int64, 1, tf.int64),
        "plain": tf.TensorSpec([None], tf.int64),
    }
    frozen = _frozen(lambda ids: fused(ids).block, specs)
    return coll, frozen


def _ids(seed: int, batch: int = 33) -> dict[str, tf.Tensor]:
    """Ids with out-of-range values and an empty ragged row."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, 4, batch)
    lens[0] = 0
    return {
        "a": tf.constant(rng.integers(-3, N + 9, batch), tf.int64),
        "tags": tf.RaggedTensor.from_row_lengths(
            tf.constant(rng.integers(-2, N + 5, int(lens.sum())), tf.int64),
            tf.constant(lens, tf.int64),
        ),
        "plain": tf.constant(rng.integers(0, 12, batch), tf.int64),
    }


def test_amtl_masks_become_tables_and_the_op_its_row_form(amtl_block):
    coll, frozen = amtl_block
    graph_def, report = tabulate.tabulate_masks(
        frozen.graph_def, frozen.outputs, keep=tuple(frozen.inputs)
    )
    assert sorted(report.tables.values()) == [(N, 4), (N, 4)] and report.left == {}
    assert report.bytes == 2 * N * 4 * 4 and len(report.row_form) == 1
    ops = [n.op for n in graph_def.node]
    assert "Unique" not in ops and "MatMul" not in ops and "ArgMax" not in ops
    assert len(graph_def.node) < len(frozen.graph_def.node) / 5
    # the tables are the layer's masks: row i keeps the first lengths[i] entries
    by = {n.name: n for n in graph_def.node}
    tables = [
        tf.make_ndarray(by[f"{name}/stitch_tabulated"].attr["value"].tensor)
        for name in report.tables
    ]
    assert all(set(np.unique(t)) <= {0.0, 1.0} for t in tables)
    lengths = coll.layers_by_field["a"].lengths()
    want = (np.arange(4)[None, :] < np.asarray(lengths)[:, None]).astype(np.float32)
    assert any(np.array_equal(t, want) for t in tables)
    for seed, batch in ((1, 33), (2, 1), (3, 500)):
        ids = _ids(seed, batch)
        np.testing.assert_array_equal(
            _run(graph_def, frozen, ids), _run(frozen.graph_def, frozen, ids)
        )
    # the tables read the layers' weights as frozen: a realization is redone after training
    np.testing.assert_array_equal(
        _run(graph_def, frozen, _ids(4)),
        tf.concat(list(coll(_ids(4)).fields().values()), axis=1).numpy(),
    )


def test_generated_loops_tabulates_and_reports(amtl_block, hand):
    _, frozen = amtl_block
    r = realize.generated_loops(None, hand, 64, frozen=frozen)
    assert len(r.tabulation.tables) == 2
    ids = _ids(5)
    flat = tf.nest.flatten(ids, expand_composites=True)
    np.testing.assert_array_equal(r.fused(*flat)[0].numpy(), r.unfused(*flat)[0].numpy())
    off = realize.generated_loops(None, hand, 64, frozen=frozen, tabulate_masks=False)
    assert off.tabulation is None


def _one_amtl_field():
    need_compiler()
    coll = EmbeddingCollection(
        [{"name": "a", "num_rows": N, "dim": 4, "method": "amtl"}],
        counts={"a": list(range(N, 0, -1))},
    )
    ids = {"a": tf.constant([0, 3, 39], tf.int64)}
    coll(ids)
    block = emb_spec.build_spec(coll, ids)
    return block, emb_ops.load(block.spec)


@pytest.mark.parametrize(
    ("mask", "max_bytes", "reason"),
    [
        # a softmax over the unique ids: a row's value depends on the other ids of the batch
        (
            lambda u, x: tf.nn.softmax(tf.cast(u, tf.float32))[:, None] * tf.ones([1, 4]),
            None,
            "not row-wise",
        ),
        # reads the request itself, not only its unique ids
        (
            lambda u, x: tf.ones([tf.size(u), 4]) * tf.reduce_mean(tf.cast(x, tf.float32)),
            None,
            "reads the input",
        ),
        (
            lambda u, x: tf.ones([tf.size(u), 4]) + tf.cast(u, tf.float32)[:, None],
            100,
            "exceeds max_bytes=100",
        ),
    ],
)
def test_masks_that_cannot_be_tabulated_are_left_with_the_reason(mask, max_bytes, reason):
    block, kernel = _one_amtl_field()
    table = block.variables[0]

    def f(x):
        u, w = tf.unique(oov_safe(x, N))
        return kernel([table], [x], [mask(u, x)], [w])

    frozen = _frozen(f, tf.TensorSpec([None], tf.int64))
    options = {} if max_bytes is None else {"max_bytes": max_bytes}
    graph_def, report = tabulate.tabulate_masks(
        frozen.graph_def, frozen.outputs, keep=tuple(frozen.inputs), **options
    )
    assert report.tables == {} and len(report.left) == 1
    assert reason in next(iter(report.left.values()))
    x = tf.constant([5, 5, 1, -4, 70], tf.int64)
    np.testing.assert_array_equal(_run(graph_def, frozen, x), _run(frozen.graph_def, frozen, x))


def test_the_row_form_checks_its_mask_table():
    block, kernel = _one_amtl_field()
    import dataclasses

    row = emb_ops.load(dataclasses.replace(block.spec, mask_rows=True))
    assert row.forward_name != kernel.forward_name
    assert "mask_rows" not in block.spec.to_json()  # the training form's hash is unchanged
    x = tf.constant([0, 2, 99], tf.int64)
    masks = tf.constant(np.tril(np.ones((N, 4), np.float32)))  # row i: first min(i+1, 4)
    got = row(block.variables, [x], [masks]).numpy()
    t = block.variables[0].numpy()
    np.testing.assert_array_equal(got, t[[0, 2, 0]] * masks.numpy()[[0, 2, 0]])
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"must be \[{N}, 4\]"):
        row(block.variables, [x], [masks[:5]])


def test_the_op_reads_the_compact_serving_form(amtl_block):
    """``AMTLServingEmbedding`` (values + int32 row offsets): one forward-only op, equal to the
    serving layers and the training layers; frozen, the offsets stay handles too."""
    coll, _ = amtl_block
    serving = coll.serving_form()
    fused = emb_layer.FusedEmbeddingCollection.from_collection(serving)
    for seed, batch in ((6, 33), (7, 1)):
        ids = _ids(seed, batch)
        want = tf.concat(list(serving(ids).fields().values()), axis=1).numpy()
        np.testing.assert_array_equal(fused(ids).block.numpy(), want)
        np.testing.assert_array_equal(
            want, tf.concat(list(coll(ids).fields().values()), axis=1).numpy()
        )
    spec = fused.kernel.spec
    assert fused.uncovered == {} and not spec.trainable
    assert [(t.dtype, t.rank) for t in spec.tables[:2]] == [("float32", 1), ("int32", 1)]
    assert "Grad" not in fused.kernel.source.split("REGISTER_OP")[-1]
    lengths = coll.layers_by_field["a"].lengths()
    assert spec.tables[0].rows == int(lengths.sum()) < N * 4  # compact: only k_i per row
    specs = {
        "a": tf.TensorSpec([None], tf.int64),
        "tags": tf.RaggedTensorSpec([None, None], tf.int64, 1, tf.int64),
        "plain": tf.TensorSpec([None], tf.int64),
    }
    frozen = _frozen(lambda ids: fused(ids).block, specs)
    assert len(frozen.bound) == 5  # 2 + 2 compact tables and the plain one, read live
    ids = _ids(8)
    np.testing.assert_array_equal(
        _run(frozen.graph_def, frozen, ids), tf.concat(list(serving(ids).fields().values()), axis=1)
    )
