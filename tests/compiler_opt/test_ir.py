"""The IR: op classes, inlining of nested functions, topological order, shapes."""

from __future__ import annotations

import pytest
import tensorflow as tf

from compiler_opt import ir, op_classes


def test_known_ops_are_classed():
    expected = {
        "Mul": "elementwise",
        "AddV2": "elementwise",
        "Relu": "elementwise",
        "Cast": "elementwise",
        "BroadcastTo": "broadcast",
        "StridedSlice": "broadcast",
        "Tile": "broadcast",
        "Sum": "reduce",
        "Mean": "reduce",
        "SparseSegmentMean": "reduce",
        "ResourceGather": "gather",
        "GatherV2": "gather",
        "ConcatV2": "concat",
        "Pack": "concat",
        "MatMul": "matmul",
        "BatchMatMulV2": "matmul",
        "Identity": "free",
        "Reshape": "free",
        "NoOp": "free",
        "Const": "source",
        "ReadVariableOp": "source",
        "Placeholder": "source",
        "LookupTableFindV2": "opaque",
        "StatelessWhile": "opaque",
        "AssignVariableOp": "opaque",
        "SomeOpNobodyKnows": "opaque",
    }
    assert {op: op_classes.classify(op) for op in expected} == expected


def test_nested_function_is_inlined_with_shapes():
    table = tf.Variable(tf.ones([10, 4]))

    @tf.function
    def inner(x):
        return tf.nn.relu(x * 2.0)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int32)])
    def outer(ids):
        e = tf.gather(table, ids)
        return tf.reduce_sum(inner(e) + 1.0, axis=-1)

    g = ir.from_concrete_function(outer.get_concrete_function())
    ops = [n.op for n in g.nodes.values()]
    assert "PartitionedCall" not in ops and "StatefulPartitionedCall" not in ops
    (mul,) = [n for n in g.nodes.values() if n.op == "Mul"]
    (relu,) = [n for n in g.nodes.values() if n.op == "Relu"]
    assert mul.name.startswith("PartitionedCall/")  # prefixed by the call it came from
    assert mul.outputs[0] == ir.TensorInfo((None, 4), "float32")
    (gather,) = [n for n in g.nodes.values() if n.op == "ResourceGather"]
    assert gather.attrs["table_shape"] == (10, 4)
    # the inlined Mul reads the gather's output (through the function's argument)
    assert ir.split_ref(mul.inputs[0])[0] == gather.name
    (total,) = [n for n in g.nodes.values() if n.op == "Sum"]
    assert total.attrs["axes"] == [1] and total.attrs["input_rank"] == 2
    assert g.outputs and ir.split_ref(g.outputs[0])[0] in g.nodes
    # topological: every producer (data and control) comes before its consumer
    pos = {name: i for i, name in enumerate(g.nodes)}
    for n in g.nodes.values():
        for p in g.producers(n.name):
            assert pos[p] < pos[n.name], (p, n.name)
    assert pos[gather.name] < pos[mul.name] < pos[relu.name] < pos[total.name]
    assert g.class_counts()["gather"] == 1 and g.kernel_count() >= 5


def _node(name, op, inputs=(), control=()):
    return ir.Node(name, op, op_classes.classify(op), list(inputs), list(control), [])


def test_topological_order_and_cycle_check():
    nodes = [_node("c", "Mul", ["a", "b"]), _node("b", "Exp", ["a"]), _node("a", "Const")]
    for n in nodes:
        n.outputs = [ir.TensorInfo((2,), "float32")]
    g = ir.Graph(nodes, inputs=[], outputs=["c:0"])
    assert list(g.nodes) == ["a", "b", "c"]
    assert g.consumers("a") == ["c", "b"] or sorted(g.consumers("a")) == ["b", "c"]
    loop = [_node("x", "Exp", ["y"]), _node("y", "Exp", ["x"]), _node("z", "Const")]
    with pytest.raises(ir.CycleError, match="cycle through 2 node"):
        ir.Graph(loop, inputs=[], outputs=[])
    with pytest.raises(ValueError, match="reads 'nowhere'"):
        ir.Graph([_node("x", "Exp", ["nowhere:0"])], inputs=[], outputs=[])


def test_graph_def_import_and_tensor_bytes():
    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    def f(x):
        return tf.concat([x, tf.exp(x)], axis=1)

    gd = f.get_concrete_function().graph.as_graph_def()
    g = ir.from_graph_def(gd, outputs=["Identity:0"])
    (concat,) = [n for n in g.nodes.values() if n.op == "ConcatV2"]
    assert concat.outputs[0].shape == (None, 6)
    assert concat.outputs[0].nbytes(batch=10) == 10 * 6 * 4
    assert ir.TensorInfo((None, None, 2), "int64").nbytes(batch=5, unknown_dim=3) == 5 * 3 * 2 * 8
    assert ir.TensorInfo(None, "float32").nbytes(batch=7) == 28
    with pytest.raises(ValueError, match="'nope:0', which is not a tensor"):
        ir.from_graph_def(gd, outputs=["nope:0"])


def test_saved_model_ir_has_the_models_ops(tiny_saved_model):
    g = ir.from_saved_model(tiny_saved_model)
    counts = g.op_counts()
    assert "StatefulPartitionedCall" not in counts
    assert counts["ResourceGather"] >= 2 and counts["MatMul"] >= 2
    assert counts["LookupTableFindV2"] == 3  # user, item, tags vocabularies
    with pytest.raises(
        ValueError, match=r"signature 'nope' is not in SavedModel .*serving_default"
    ):
        ir.from_saved_model(tiny_saved_model, "nope")
    with pytest.raises(FileNotFoundError, match="is not a SavedModel"):
        ir.from_saved_model(tiny_saved_model / "variables")
