"""What TensorRT's ONNX parser accepts: the facts the pre-flight rules check.

Source: the support matrix of the ONNX-TensorRT parser (onnx/onnx-tensorrt,
docs/operators.md, branch 10.1-GA) and, where the matrix is silent, that
parser's importers (onnxOpImporters.cpp of the same branch). Encoded here as
data; when a newer TensorRT is the oldest one robots run, update this module
and its version line. Limits the op support rules and the lowering respect too
(TopK's K) are in et_trt_backend/tensorrt_limits.py.
"""

from __future__ import annotations

from onnx import TensorProto

FACTS_FROM = "onnx-tensorrt 10.1-GA docs/operators.md"

# Opsets of the default ONNX domain the parser imports (inclusive).
MIN_OPSET = 9
MAX_OPSET = 20

# Short dtype names, as the support matrix writes them.
DTYPE_NAMES = {
    TensorProto.FLOAT: "FP32",
    TensorProto.FLOAT16: "FP16",
    TensorProto.BFLOAT16: "BF16",
    TensorProto.DOUBLE: "FP64",
    TensorProto.INT32: "INT32",
    TensorProto.INT64: "INT64",
    TensorProto.INT8: "INT8",
    TensorProto.UINT8: "UINT8",
    TensorProto.BOOL: "BOOL",
    TensorProto.INT4: "INT4",
    TensorProto.FLOAT8E4M3FN: "FP8",
    TensorProto.INT16: "INT16",
    TensorProto.UINT16: "UINT16",
    TensorProto.UINT32: "UINT32",
    TensorProto.UINT64: "UINT64",
    TensorProto.STRING: "STRING",
    TensorProto.COMPLEX64: "COMPLEX64",
    TensorProto.COMPLEX128: "COMPLEX128",
}


def dtype_name(elem_type: int) -> str:
    return DTYPE_NAMES.get(elem_type) or TensorProto.DataType.Name(elem_type)


# Types a network input or output may have. UINT8 is allowed only there;
# DOUBLE is cast down to FP32 with clamping, which we do not accept silently.
NETWORK_IO_DTYPES = frozenset({"FP32", "FP16", "BF16", "INT32", "INT64", "INT8", "UINT8", "BOOL", "FP8", "INT4"})

_FLOAT = ("FP32", "FP16", "BF16")
_NUMERIC = _FLOAT + ("INT32", "INT64")
_ANY = _NUMERIC + ("BOOL",)


def _ops(names: str, dtypes: tuple[str, ...]) -> dict[str, frozenset[str]]:
    return {name: frozenset(dtypes) for name in names.split()}


# Supported operators of the default domain -> the data types each accepts.
SUPPORTED_OPS: dict[str, frozenset[str]] = {
    **_ops(
        "Acos Acosh Asin Asinh Atan Atanh AveragePool BatchNormalization Ceil Celu Clip Conv ConvTranspose Cos "
        "Cosh CumSum Dropout Einsum Elu Erf Exp Floor Gemm GlobalAveragePool GlobalLpPool GlobalMaxPool "
        "GroupNormalization GRU HardSigmoid HardSwish Hardmax ImageScaler InstanceNormalization IsInf "
        "LayerNormalization LeakyRelu Log LogSoftmax LRN LSTM LpNormalization LpPool MatMul MaxPool "
        "MeanVarianceNormalization ParametricSoftplus Pow PRelu QuantizeLinear RandomNormal RandomNormalLike "
        "RandomUniform RandomUniformLike Reciprocal Resize RNN Round ScaledTanh Scan Selu Sigmoid Sin Sinh "
        "Softmax Softplus Softsign Sqrt Tan Tanh ThresholdedRelu Upsample",
        _FLOAT,
    ),
    **_ops(
        "Abs Add ArgMax ArgMin DepthToSpace Div Equal Greater GreaterOrEqual IsNaN Less LessOrEqual Max Min Mod "
        "Mul Neg Pad Range ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin "
        "ReduceProd ReduceSum ReduceSumSquare Relu Scatter ScatterElements ScatterND Shrink Sign SpaceToDepth "
        "Sub Sum TopK",
        _NUMERIC,
    ),
    **_ops(
        "Concat Constant ConstantOfShape Expand EyeLike Flatten Gather GatherElements GatherND Identity If Loop "
        "OneHot Reshape ReverseSequence Shape Size Slice Split Squeeze Tile Transpose Trilu Unsqueeze Where",
        _ANY,
    ),
    # No BF16 for these.
    **_ops("DeformConv GridSample Mish NonMaxSuppression NonZero RoiAlign", ("FP32", "FP16")),
    **_ops("And Not Or Xor", ("BOOL",)),
    **_ops("Cast CastLike", _ANY + ("UINT8",)),
    **_ops("DequantizeLinear", ("INT8", "FP8", "INT4")),
    **_ops("Gelu", _NUMERIC + ("INT8",)),
    **_ops("Mean", _NUMERIC + ("FP8",)),
}

# Operators the matrix lists as unsupported (anything absent is unsupported too;
# this list only lets messages say "TensorRT does not support" with certainty).
UNSUPPORTED_OPS = frozenset(
    "AffineGrid Bernoulli BitShift BitwiseAnd BitwiseNot BitwiseOr BitwiseXor BlackmanWindow Col2Im "
    "CenterCropPad Compress ConcatFromSequence ConvInteger DFT Det DynamicQuantizeLinear HammingWindow "
    "HannWindow ImageDecoder MatMulInteger MaxRoiPool MaxUnpool MelWeightMatrix Multinomial "
    "NegativeLogLikelihoodLoss Optional OptionalGetElement OptionalHasElement QLinearConv QLinearMatMul "
    "RegexFullMatch STFT SequenceAt SequenceConstruct SequenceEmpty SequenceErase SequenceInsert SequenceLength "
    "SequenceMap SoftmaxCrossEntropyLoss SplitToSequence StringConcat StringNormalizer StringSplit "
    "TfIdfVectorizer Unique".split()
)

# Which tensor carries an op's data type ("in", i) / ("out", i); default ("in", 0).
DTYPE_TENSOR: dict[str, tuple[str, int]] = {
    "Where": ("in", 1),
    "Constant": ("out", 0),
    "ConstantOfShape": ("out", 0),
    "EyeLike": ("out", 0),
    "OneHot": ("out", 0),
    "RandomNormal": ("out", 0),
    "RandomNormalLike": ("out", 0),
    "RandomUniform": ("out", 0),
    "RandomUniformLike": ("out", 0),
}
# Cast's source and target types both must be in its list.
DTYPE_BOTH_ENDS = frozenset({"Cast", "CastLike"})
# Control flow: types vary per output, checked through the ops of their bodies.
DTYPE_EXEMPT = frozenset({"If", "Loop", "Scan"})

# Inputs the parser needs as initializers (weights) at build time:
# op -> [(input index, input name)]. A Constant node's output counts too.
STATIC_INPUTS: dict[str, list[tuple[int, str]]] = {
    "CumSum": [(1, "axis")],
    "Pad": [(3, "axes")],
    "Slice": [(3, "axes")],
    "Squeeze": [(1, "axes")],
    "Unsqueeze": [(1, "axes")],
    "OneHot": [(1, "depth")],
    "Dropout": [(2, "training_mode")],
    **{op: [(1, "axes")] for op in (
        "ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum "
        "ReduceSumSquare").split()},
}
# Inputs whose shape must be fully static.
STATIC_SHAPE_INPUTS: dict[str, list[tuple[int, str]]] = {"EyeLike": [(0, "input")]}

# Supported ops whose output size depends on the input values (data-dependent
# shapes); TensorRT sizes them while the engine runs.
DATA_DEPENDENT_OPS = frozenset({"NonZero", "NonMaxSuppression"})

# Attribute values the parser accepts: (op, attribute) -> (allowed values, ONNX default).
ATTRIBUTE_VALUES: dict[tuple[str, str], tuple[frozenset, object]] = {
    ("Resize", "mode"): (frozenset({b"nearest", b"linear"}), b"nearest"),
    ("Resize", "coordinate_transformation_mode"): (
        frozenset({b"half_pixel", b"pytorch_half_pixel", b"tf_half_pixel_for_nn", b"asymmetric", b"align_corners"}),
        b"half_pixel",
    ),
    ("Resize", "nearest_mode"): (
        frozenset({b"floor", b"ceil", b"round_prefer_floor", b"round_prefer_ceil"}), b"round_prefer_floor"
    ),
    ("Resize", "keep_aspect_ratio_policy"): (frozenset({b"stretch"}), b"stretch"),
    ("Resize", "antialias"): (frozenset({0}), 0),
    ("LSTM", "input_forget"): (frozenset({0}), 0),
    ("LSTM", "layout"): (frozenset({0}), 0),
}
# Pooling dilations must be absent or all ones; so must a ConvTranspose's (NVIDIA's builder refuses a dilated
# deconvolution: TensorRT for RTX 1.7, seen building for sm_80).
ONES_ATTRIBUTES = {("AveragePool", "dilations"), ("LpPool", "dilations"), ("MaxPool", "dilations"),
                   ("ConvTranspose", "dilations")}
# Constant attributes the parser cannot read.
UNSUPPORTED_CONSTANT_ATTRIBUTES = frozenset({"sparse_value", "value_string", "value_strings"})
# Ops of which only the first output is supported.
FIRST_OUTPUT_ONLY = frozenset({"LayerNormalization", "MaxPool"})
# Quantization zero points must be zero: op -> zero-point input index.
ZERO_POINT_INPUTS = {"QuantizeLinear": 2, "DequantizeLinear": 2}
