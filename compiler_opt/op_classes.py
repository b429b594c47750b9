"""The op classes of compiler_opt's graph IR: which TensorFlow op types are elementwise,
reductions, gathers... (the tables below); the planner fuses the memory-bound classes.

Op classes (``classify``):

* ``elementwise``: one output element from the same element of each input (``Mul``, ``Relu``,
  ``Cast``, ``Select``...); scalar / broadcastable inputs allowed.
* ``broadcast``: an index remap that changes the shape (``BroadcastTo``, ``Tile``, ``Slice``,
  ``StridedSlice``, ``Transpose``, ``Pad``, ``OneHot``, ``Range``, ``Fill``...).
* ``reduce``: reductions along axes (``Sum``, ``Mean``, ``Max``, ``ArgMax``, segment sums...).
* ``gather``: rows read by index (``GatherV2``, ``ResourceGather``, ``GatherNd``...).
* ``concat``: ``ConcatV2``, ``Pack``.
* ``matmul``: ``MatMul``, ``BatchMatMulV2``, ``Einsum``, convolutions.
* ``opaque``: everything else (hash tables, string ops, variable updates, control flow, unknown
  ops): never fused.
* ``free``: no kernel of its own (``Identity``, ``Reshape``, ``ExpandDims``, ``Squeeze``,
  ``StopGradient``, ``NoOp``): an alias of its input; the planner sees through it.
* ``source``: values that exist before the step (``Placeholder``/function arguments, ``Const``,
  ``VarHandleOp``, ``ReadVariableOp``): kernel arguments, no kernel.
"""

from __future__ import annotations

OP_CLASSES = (
    "elementwise",
    "broadcast",
    "reduce",
    "gather",
    "concat",
    "matmul",
    "opaque",
    "free",
    "source",
)
# The classes the planner may fuse (memory-bound ops).
FUSIBLE_CLASSES = frozenset({"elementwise", "broadcast", "reduce", "gather", "concat"})

_ELEMENTWISE = [
    "Abs",
    "Acos",
    "Acosh",
    "Add",
    "AddN",
    "AddV2",
    "All",
    "Any",
    "Asin",
    "Asinh",
    "Atan",
    "Atan2",
    "Atanh",
    "BiasAdd",
    "BiasAddGrad",
    "Cast",
    "Ceil",
    "ClipByValue",
    "Cos",
    "Cosh",
    "DivNoNan",
    "Div",
    "Elu",
    "EluGrad",
    "Equal",
    "Erf",
    "Erfc",
    "Exp",
    "Expm1",
    "Floor",
    "FloorDiv",
    "FloorMod",
    "Greater",
    "GreaterEqual",
    "Inv",
    "InvGrad",
    "IsFinite",
    "IsInf",
    "IsNan",
    "LeakyRelu",
    "LeakyReluGrad",
    "Less",
    "LessEqual",
    "Lgamma",
    "Log",
    "Log1p",
    "LogicalAnd",
    "LogicalNot",
    "LogicalOr",
    "Maximum",
    "Minimum",
    "Mod",
    "Mul",
    "MulNoNan",
    "Neg",
    "NotEqual",
    "Pow",
    "RealDiv",
    "Reciprocal",
    "ReciprocalGrad",
    "Relu",
    "Relu6",
    "Relu6Grad",
    "ReluGrad",
    "Rint",
    "Round",
    "Rsqrt",
    "RsqrtGrad",
    "Select",
    "SelectV2",
    "Selu",
    "SeluGrad",
    "Sigmoid",
    "SigmoidGrad",
    "Sign",
    "Sin",
    "Sinh",
    "Softplus",
    "SoftplusGrad",
    "Softsign",
    "Sqrt",
    "SqrtGrad",
    "Square",
    "SquaredDifference",
    "Sub",
    "Tan",
    "Tanh",
    "TanhGrad",
    "Xdivy",
    "Xlogy",
    "OnesLike",
    "BitwiseAnd",
    "BitwiseOr",
    "BitwiseXor",
    "LeftShift",
    "RightShift",
    "Invert",
    "PopulationCount",
    "ClipByValueV2",
    "ZerosLike",
    "Bucketize",
]
_REDUCE = [
    "Sum",
    "Mean",
    "Max",
    "Min",
    "Prod",
    "ArgMax",
    "ArgMin",
    "EuclideanNorm",
    "SegmentSum",
    "SegmentMean",
    "SegmentMax",
    "SegmentMin",
    "UnsortedSegmentSum",
    "UnsortedSegmentMax",
    "UnsortedSegmentMin",
    "UnsortedSegmentProd",
    "SparseSegmentSum",
    "SparseSegmentMean",
    "SparseSegmentSqrtN",
    "SparseSegmentSumWithNumSegments",
    "SparseSegmentMeanWithNumSegments",
    "SparseSegmentSqrtNWithNumSegments",
    "SparseSegmentMeanGrad",
    "SparseSegmentSumGrad",
    "SparseSegmentSqrtNGrad",
    "SparseSegmentMeanGradV2",
    "SparseSegmentSumGradV2",
    "SparseSegmentSqrtNGradV2",
    "Softmax",
    "LogSoftmax",
    "FusedBatchNormV3",
    "FusedBatchNormGradV3",
    "_FusedBatchNormEx",
    "L2Loss",
    "Cumsum",
    "Cumprod",
    "BiasAddGrad",
]
#: reductions along segments of rows (pools of multi-valued fields): one result per segment
SEGMENT_REDUCTIONS = frozenset(
    op for op in _REDUCE if "Segment" in op and not op.endswith(("Grad", "GradV2"))
)
_BROADCAST = [
    "BroadcastTo",
    "Tile",
    "Slice",
    "StridedSlice",
    "StridedSliceGrad",
    "Transpose",
    "Pad",
    "PadV2",
    "MirrorPad",
    "OneHot",
    "Range",
    "Fill",
    "ReverseV2",
    "BroadcastGradientArgs",
    "Shape",
    "ShapeN",
    "Size",
    "Rank",
    "BroadcastArgs",
    "Split",
    "SplitV",
    "Unpack",
]
_GATHER = ["Gather", "GatherV2", "ResourceGather", "GatherNd", "ResourceGatherNd"]
_CONCAT = ["ConcatV2", "Concat", "Pack", "ConcatOffset"]
_MATMUL = [
    "MatMul",
    "BatchMatMul",
    "BatchMatMulV2",
    "BatchMatMulV3",
    "Einsum",
    "Conv2D",
    "Conv2DBackpropInput",
    "Conv2DBackpropFilter",
    "Conv1D",
    "_FusedMatMul",
    "_MklMatMul",
    "_MklFusedMatMul",
]
_FREE = [
    "Identity",
    "IdentityN",
    "Reshape",
    "ExpandDims",
    "Squeeze",
    "StopGradient",
    "NoOp",
    "PreventGradient",
    "Snapshot",
    "EnsureShape",
    "CheckNumerics",
]
#: ops that only rename or reshape a tensor: no kernel of their own, no bytes moved
ALIAS_OPS = frozenset(_FREE) - {"NoOp"}
_SOURCE = [
    "Placeholder",
    "PlaceholderWithDefault",
    "Const",
    "HostConst",
    "VarHandleOp",
    "ReadVariableOp",
    "_Arg",
    "_Retval",
    "VariableV2",
    "HashTableV2",
    "MutableHashTableV2",
    "MutableDenseHashTableV2",
]

OP_CLASS: dict[str, str] = {}
for _names, _cls in (
    (_ELEMENTWISE, "elementwise"),
    (_BROADCAST, "broadcast"),
    (_REDUCE, "reduce"),
    (_GATHER, "gather"),
    (_CONCAT, "concat"),
    (_MATMUL, "matmul"),
    (_FREE, "free"),
    (_SOURCE, "source"),
):
    for _name in _names:
        OP_CLASS[_name] = _cls


def classify(op_type: str) -> str:
    """The op class of ``op_type`` (one of ``OP_CLASSES``); unknown ops are ``opaque``."""
    return OP_CLASS.get(op_type, "opaque")


__all__ = [
    "ALIAS_OPS",
    "FUSIBLE_CLASSES",
    "OP_CLASS",
    "OP_CLASSES",
    "SEGMENT_REDUCTIONS",
    "classify",
]
