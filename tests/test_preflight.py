"""Pre-flight rules: for each, a small ONNX model that breaks it and one that passes."""

import logging

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from et_trt_backend import preflight
from et_trt_backend.plugin_names import GROUPED_MM_DOMAIN
from et_trt_backend.preflight import PreflightError, check, enforce
from et_trt_backend.preflight import tensorrt_onnx as trt
from et_trt_backend.tensorrt_limits import TOPK_MAX_K

F, H, B, I32, I64 = TP.FLOAT, TP.FLOAT16, TP.BFLOAT16, TP.INT32, TP.INT64


def vi(name, elem_type, shape):
    return helper.make_tensor_value_info(name, elem_type, shape)


def const(name, values, dtype=np.int64):
    return numpy_helper.from_array(np.array(values, dtype=dtype), name)


def model(nodes, inputs, outputs, initializers=(), opset=18, custom=True):
    opsets = [helper.make_opsetid("", opset)]
    if custom:
        opsets.append(helper.make_opsetid(GROUPED_MM_DOMAIN, 1))
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=opsets)


def rules_hit(m):
    return sorted({v.rule for v in check(m)})


def unary(op, elem_type, **attrs):
    return model([helper.make_node(op, ["x"], ["y"], name=f"my_{op}", **attrs)],
                 [vi("x", elem_type, [4, 8])], [vi("y", elem_type, [4, 8])])


def test_clean_model_passes():
    m = model(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["y"], name="act")],
        [vi("x", B, ["tokens", 8])], [vi("y", B, ["tokens", 4])],
        [numpy_helper.from_array(np.ones((8, 4), np.float32), "w")],
    )
    m.graph.initializer[0].CopyFrom(helper.make_tensor("w", B, [8, 4], np.zeros(32, np.uint16).tobytes(), raw=True))
    assert check(m) == []


# ---- opset ----------------------------------------------------------------------
def test_opset_outside_the_parsers_range():
    assert rules_hit(unary("Relu", F)) == []
    too_new = unary("Relu", F)
    too_new.opset_import[0].version = trt.MAX_OPSET + 1
    violations = check(too_new)
    assert [v.rule for v in violations] == ["opset"] and f"opset {trt.MAX_OPSET + 1}" in violations[0].message


def test_custom_domain_must_be_imported():
    m = grouped_mm_model()
    assert rules_hit(m) == []
    del m.opset_import[1]
    assert "opset" in rules_hit(m)


# ---- supported ops ------------------------------------------------------------------
@pytest.mark.parametrize("op", ["Unique", "BitShift", "MadeUpOp"])
def test_unsupported_op(op):
    m = model([helper.make_node(op, ["x"], ["y"], name="bad")], [vi("x", F, [4])], [vi("y", F, None)])
    violations = [v for v in check(m) if v.rule == "supported_ops"]
    assert len(violations) == 1 and violations[0].node == "'bad'" and op in violations[0].message


def test_foreign_custom_op():
    m = model([helper.make_node("Fused", ["x"], ["y"], name="f", domain="com.example")],
              [vi("x", F, [4])], [vi("y", F, [4])])
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    assert [v.op_type for v in check(m)] == ["com.example::Fused"]


def test_ops_in_subgraphs_are_checked():
    then_branch = helper.make_graph([helper.make_node("Unique", ["x"], ["t"], name="inner")], "then", [],
                                    [vi("t", F, None)])
    else_branch = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [], [vi("e", F, None)])
    m = model([helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then_branch, else_branch=else_branch)],
              [vi("c", TP.BOOL, []), vi("x", F, [4])], [vi("y", F, None)])
    [violation] = [v for v in check(m) if v.rule == "supported_ops"]
    assert violation.node == "'inner' in main/branch.then_branch"


def test_ops_in_local_functions_are_checked():
    function = helper.make_function("local", "Wrapped", ["a"], ["b"], [helper.make_node("Unique", ["a"], ["b"])],
                                    [helper.make_opsetid("", 18)])
    m = model([helper.make_node("Wrapped", ["x"], ["y"], name="call", domain="local")],
              [vi("x", F, [4])], [vi("y", F, None)])
    m.functions.append(function)
    m.opset_import.append(helper.make_opsetid("local", 1))
    assert [v.op_type for v in check(m) if v.rule == "supported_ops"] == ["Unique"]


# ---- dtypes ---------------------------------------------------------------------------
def test_bf16_per_op():
    assert rules_hit(unary("Sigmoid", B)) == []
    violations = check(unary("Mish", B))
    assert [v.rule for v in violations] == ["dtypes"]
    assert "Mish on BF16" in violations[0].message and "no BF16" in violations[0].message
    assert rules_hit(unary("Mish", H)) == []


def test_dtype_of_inferred_intermediate():
    # Cast -> fp64 intermediate -> Exp: the Exp sees an inferred DOUBLE input.
    m = model([helper.make_node("Cast", ["x"], ["d"], to=TP.DOUBLE, name="to64"),
               helper.make_node("Exp", ["d"], ["e"], name="exp"),
               helper.make_node("Cast", ["e"], ["y"], to=F, name="back")],
              [vi("x", F, [4])], [vi("y", F, [4])])
    assert {(v.rule, v.node) for v in check(m)} == {("dtypes", "'to64'"), ("dtypes", "'exp'"), ("dtypes", "'back'")}


def test_where_checks_its_data_not_its_condition():
    m = model([helper.make_node("Where", ["c", "a", "b"], ["y"], name="w")],
              [vi("c", TP.BOOL, [4]), vi("a", F, [4]), vi("b", F, [4])], [vi("y", F, [4])])
    assert check(m) == []


def test_network_io_types():
    m = model([helper.make_node("Cast", ["x"], ["y"], to=TP.UINT16, name="c")], [vi("x", F, [4])],
              [vi("y", TP.UINT16, [4])])
    hits = [v for v in check(m) if v.rule == "dtypes"]
    assert any("network output of type UINT16" in v.message for v in hits)
    assert any(v.node == "'c'" for v in hits)  # Cast to UINT16 is not in Cast's list either


# ---- static inputs ----------------------------------------------------------------------
def cumsum_model(axis_is_constant: bool):
    nodes = [helper.make_node("CumSum", ["x", "axis"], ["y"], name="cs")]
    inputs = [vi("x", F, [4, 8])]
    inits = [const("axis", 0)] if axis_is_constant else []
    if not axis_is_constant:
        inputs.append(vi("axis", I64, []))
    return model(nodes, inputs, [vi("y", F, [4, 8])], inits)


def test_cumsum_axis_must_be_an_initializer():
    assert check(cumsum_model(True)) == []
    [violation] = check(cumsum_model(False))
    assert violation.rule == "static_inputs" and "`axis`" in violation.message


def test_constant_node_counts_as_static():
    m = model([helper.make_node("Constant", [], ["axes"], value=const("v", [1])),
               helper.make_node("Unsqueeze", ["x", "axes"], ["y"], name="u")],
              [vi("x", F, [4])], [vi("y", F, [4, 1])])
    assert check(m) == []
    m = model([helper.make_node("Shape", ["x"], ["axes"]),
               helper.make_node("Unsqueeze", ["x", "axes"], ["y"], name="u")],
              [vi("x", F, [1])], [vi("y", F, None)])
    assert [v.rule for v in check(m)] == ["static_inputs"]


def test_dropout_in_training_mode():
    def dropout(training):
        return model([helper.make_node("Dropout", ["x", "ratio", "training"], ["y"], name="d")],
                     [vi("x", F, [4])], [vi("y", F, [4])],
                     [const("ratio", 0.5, np.float32), const("training", training, np.bool_)])
    assert check(dropout(False)) == []
    assert [v.rule for v in check(dropout(True))] == ["static_inputs"]


def test_eyelike_needs_a_static_shape():
    def eyelike(shape):
        return model([helper.make_node("EyeLike", ["x"], ["y"], name="eye")], [vi("x", F, shape)],
                     [vi("y", F, shape)])
    assert check(eyelike([4, 4])) == []
    assert [v.rule for v in check(eyelike(["n", 4]))] == ["static_inputs"]


# ---- attributes ---------------------------------------------------------------------------
def test_resize_mode():
    def resize(mode):
        return model([helper.make_node("Resize", ["x", "", "scales"], ["y"], name="r", mode=mode)],
                     [vi("x", F, [1, 1, 4, 4])], [vi("y", F, [1, 1, 8, 8])],
                     [const("scales", [1, 1, 2, 2], np.float32)])
    assert check(resize("linear")) == []
    [violation] = check(resize("cubic"))
    assert violation.rule == "attributes" and "mode=cubic" in violation.message


def test_pooling_dilations():
    def pool(dilations):
        return model([helper.make_node("MaxPool", ["x"], ["y"], name="p", kernel_shape=[2, 2], dilations=dilations)],
                     [vi("x", F, [1, 1, 8, 8])], [vi("y", F, None)])
    assert check(pool([1, 1])) == []
    assert [v.rule for v in check(pool([2, 2]))] == ["attributes"]


def test_layernorm_extra_outputs():
    def layernorm(outputs):
        return model([helper.make_node("LayerNormalization", ["x", "s"], outputs, name="ln")],
                     [vi("x", F, [4, 8])], [vi("y", F, [4, 8])], [const("s", np.ones(8), np.float32)])
    assert check(layernorm(["y"])) == []
    assert [v.rule for v in check(layernorm(["y", "mean"]))] == ["attributes"]


def test_string_constant():
    m = model([helper.make_node("Constant", [], ["y"], name="s", value_string="hello")], [], [vi("y", TP.STRING, [])])
    assert "attributes" in rules_hit(m)


# ---- TopK ------------------------------------------------------------------------------------
def topk_model(k=None, rows=100, sorted_=1):
    """TopK over `rows`; K a constant, or (k None) computed from the input's shape."""
    if k is not None:
        nodes, inits = [], [const("k", [k])]
    else:
        nodes = [helper.make_node("Shape", ["x"], ["k"], start=0, end=1)]
        inits = []
    nodes.append(helper.make_node("TopK", ["x", "k"], ["v", "i"], name="top", axis=0, sorted=sorted_))
    return model(nodes, [vi("x", F, [rows])], [vi("v", F, None), vi("i", I64, None)], inits)


def test_topk_k_limit():
    assert check(topk_model(k=TOPK_MAX_K, rows=70000)) == []
    [violation] = check(topk_model(k=TOPK_MAX_K + 1, rows=70000))
    assert violation.rule == "topk" and f"K={TOPK_MAX_K + 1}" in violation.message


def test_topk_runtime_k_needs_a_small_static_axis():
    assert check(topk_model(rows=64)) == []  # argsort of 64 routed rows: fine
    assert [v.rule for v in check(topk_model(rows=70000))] == ["topk"]
    assert [v.rule for v in check(topk_model(rows="tokens_x_k"))] == ["topk"]


def test_topk_must_be_sorted():
    assert [v.rule for v in check(topk_model(k=2, sorted_=0))] == ["topk"]


# ---- scatter reductions -------------------------------------------------------------------------
def scatter_model(op, reduction):
    attrs = {} if reduction is None else {"reduction": reduction}
    indices = vi("idx", I64, [4, 1]) if op == "ScatterND" else vi("idx", I64, [4])
    return model([helper.make_node(op, ["x", "idx", "upd"], ["y"], name="sc", **attrs)],
                 [vi("x", F, [8]), indices, vi("upd", F, [4])], [vi("y", F, [8])])


@pytest.mark.parametrize("reduction", ["add", "none"])
def test_scatternd_reduction(reduction):
    assert check(scatter_model("ScatterND", None)) == []
    [violation] = check(scatter_model("ScatterND", reduction))
    assert violation.rule == "scatter" and "reduction" in violation.message


def test_scatter_elements_reduction():
    assert check(scatter_model("ScatterElements", None)) == []
    assert check(scatter_model("ScatterElements", "none")) == []
    assert [v.rule for v in check(scatter_model("ScatterElements", "add"))] == ["scatter"]


# ---- data-dependent shapes ---------------------------------------------------------------------
def test_data_dependent_size_must_not_reach_an_output():
    # NonZero -> Transpose -> output: the output's row count depends on the values.
    m = model([helper.make_node("NonZero", ["x"], ["nz"], name="nz"),
               helper.make_node("Transpose", ["nz"], ["y"], name="t")],
              [vi("x", F, ["tokens"])], [vi("y", I64, None)])
    [violation] = check(m)
    assert violation.rule == "data_dependent" and violation.node == "'nz'" and "'y'" in violation.message


def test_data_dependent_size_inside_the_engine_is_allowed():
    # NonZero's count summed to a scalar: TensorRT handles the inner size, the output is [].
    m = model([helper.make_node("NonZero", ["x"], ["nz"], name="nz"),
               helper.make_node("ReduceSum", ["nz"], ["y"], name="sum", keepdims=0)],
              [vi("x", F, ["tokens"])], [vi("y", I64, None)])
    assert check(m) == []


# ---- graph order ---------------------------------------------------------------------------------
def test_a_node_output_named_like_a_graph_input():
    # The exporter's name clash: the input "getitem_3" (a delegate's output outside the partition) and an
    # inner value "getitem_3"; NVIDIA's parser resolves both reads to one producer and finds a cycle.
    m = model([helper.make_node("Relu", ["getitem_3"], ["h"], name="relu"),
               helper.make_node("Neg", ["h"], ["getitem_3"], name="neg"),
               helper.make_node("Add", ["getitem_3", "h"], ["y"], name="add")],
              [vi("getitem_3", F, [4, 8])], [vi("y", F, [4, 8])])
    [violation] = check(m)
    assert (violation.rule, violation.node) == ("graph_order", "'neg'")
    assert "its output 'getitem_3' has the name of a graph input" in violation.message
    assert "Graph contains a cycle" in violation.message


def test_two_nodes_defining_one_name():
    m = model([helper.make_node("Relu", ["x"], ["h"], name="first"), helper.make_node("Neg", ["x"], ["h"], name="second"),
               helper.make_node("Abs", ["h"], ["y"], name="abs")], [vi("x", F, [4])], [vi("y", F, [4])])
    [violation] = check(m)
    assert violation.node == "'second'" and "has the name of the output of node 'first'" in violation.message


def test_a_cycle_is_named():
    m = model([helper.make_node("Add", ["x", "b"], ["a"], name="a"), helper.make_node("Relu", ["a"], ["b"], name="b"),
               helper.make_node("Abs", ["a"], ["y"], name="abs")], [vi("x", F, [4])], [vi("y", F, [4])])
    [violation] = check(m)
    assert violation.rule == "graph_order" and violation.node == "'a'"
    assert "the nodes do not sort topologically: 'a', 'b', 'abs' wait on values" in violation.message


def test_nodes_out_of_order_but_acyclic_are_fine():
    # TensorRT's parser sorts the nodes itself; only a cycle (or a clash) stops it.
    m = model([helper.make_node("Abs", ["h"], ["y"], name="abs"), helper.make_node("Relu", ["x"], ["h"], name="relu")],
              [vi("x", F, [4])], [vi("y", F, [4])])
    assert check(m) == []


# ---- GroupedMM ---------------------------------------------------------------------------------
def grouped_mm_model(dtype=B, offs_dtype=I32, trans_b=1, k_b=16, groups_offs=8, **attrs):
    attributes = {"plugin_version": "1", "plugin_namespace": "et_trt", "trans_b": trans_b, **attrs}
    attributes = {k: v for k, v in attributes.items() if v is not None}
    b_shape = [8, 32, k_b] if trans_b else [8, k_b, 32]
    node = helper.make_node("GroupedMM", ["a", "b", "offs"], ["y"], name="gmm", domain="et_trt", **attributes)
    return model([node], [vi("a", dtype, ["rows", 16]), vi("b", dtype, b_shape), vi("offs", offs_dtype, [groups_offs])],
                 [vi("y", dtype, ["rows", 32])])


def test_grouped_mm_valid():
    assert check(grouped_mm_model()) == []
    assert check(grouped_mm_model(dtype=H, trans_b=0)) == []


@pytest.mark.parametrize("change, words", [
    ({"plugin_version": "2"}, "plugin_version"),
    ({"plugin_namespace": None}, "plugin_namespace"),
    ({"trans_b": 2}, "trans_b"),
    ({"dtype": F}, "FP32"),
    ({"offs_dtype": I64}, "INT32 offsets"),
    ({"k_b": 17}, "K (16) differs"),
    ({"groups_offs": 7}, "7 entries"),
])
def test_grouped_mm_contract(change, words):
    violations = check(grouped_mm_model(**change))
    assert [v.rule for v in violations] == ["grouped_mm"], violations
    assert words in violations[0].message


def test_grouped_mm_output_type_flows_downstream():
    # ONNX cannot infer GroupedMM; the view gives its output a's type so the
    # per-op dtype rule still sees what follows (Mish has no BF16).
    m = grouped_mm_model()
    m.graph.node.append(helper.make_node("Mish", ["y"], ["z"], name="after"))
    m.graph.output[0].CopyFrom(vi("z", B, None))
    assert [(v.rule, v.node) for v in check(m)] == [("dtypes", "'after'")]


# ---- sources, reporting, enforce ------------------------------------------------------------------
def test_violation_names_the_pytorch_source_line():
    m = unary("Mish", B)
    helper.set_metadata_props(m.graph.node[0], {
        preflight.TORCH_STACK_TRACE_KEY:
            'File "/src/policy.py", line 10, in forward\n    return self.head(x)\n'
            '  File "/src/head.py", line 42, in forward\n    y = F.mish(x)',
    })
    [violation] = check(m)
    assert violation.source == "/src/head.py:42 (forward): y = F.mish(x)"
    assert "from /src/head.py:42" in str(violation) and "'my_Mish'" in str(violation)
    helper.set_metadata_props(m.graph.node[0], {preflight.SOURCE_KEY: "a.py:1 (f): g()"})
    assert check(m)[0].source == "a.py:1 (f): g()"


def test_without_a_stack_trace_the_pytorch_op_is_named():
    m = unary("Mish", B)
    helper.set_metadata_props(m.graph.node[0], {
        preflight.TORCH_STACK_TRACE_KEY: "",
        "pkg.torch.onnx.fx_node": "%mish_1 : [num_users=1] = call_function[target=torch.ops.aten.mish.default]"
                                  "(args = (%x,), kwargs = {})",
    })
    assert check(m)[0].source == "PyTorch op torch.ops.aten.mish.default (graph node %mish_1; no source line recorded)"


def test_torch_onnx_exporter_records_the_source_line():
    class Head(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.mish(x)  # the line the violation must name

    program = torch.onnx.export(Head(), (torch.randn(4, 8, dtype=torch.bfloat16),), dynamo=True, verbose=False)
    violations = [v for v in check(program.model_proto) if v.rule == "dtypes"]
    assert violations, "Mish on BF16 must be reported"
    assert all(v.source.startswith(f"{__file__}:") and "mish" in v.source for v in violations), violations


def test_enforce_raises_or_warns(caplog):
    bad = unary("Mish", B)
    with pytest.raises(PreflightError, match="(?s)velocity: 1 TensorRT pre-flight violation.*Mish on BF16"):
        enforce(bad, "error", where="velocity")
    with caplog.at_level(logging.WARNING, logger="et_trt_backend.preflight"):
        assert len(enforce(bad, "warn", where="velocity")) == 1
    assert "Mish on BF16" in caplog.text
    assert enforce(unary("Relu", B), "error") == []
    with pytest.raises(ValueError, match="preflight policy"):
        enforce(bad, "ignore")


def test_check_does_not_modify_the_model():
    m = grouped_mm_model()
    before = m.SerializeToString()
    check(m)
    assert m.SerializeToString() == before


# ---- IO specs against the graph --------------------------------------------------------------
def test_io_specs_must_describe_the_graph():
    from et_trt_backend.preflight import check_io
    from et_trt_backend.serialization.blob import DimSpec, TensorSpec

    m = model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
              [vi("x", B, ["tokens", 8])], [vi("y", B, ["tokens", 4])],
              [helper.make_tensor("w", B, [8, 4], np.zeros(32, np.uint16).tobytes(), raw=True)])
    tokens = DimSpec(None, "tokens", 1, 64, 512)

    def spec(name="x", dtype=torch.bfloat16, dims=(tokens, DimSpec(8, "", 8, 8, 8))):
        return TensorSpec(name, dtype, list(dims))

    out = TensorSpec("y", torch.bfloat16, [tokens, DimSpec(4, "", 4, 4, 4)])
    assert check_io(m, [spec()], [out]) == []
    cases = [
        ([spec(name="w")], "not the graph's inputs"),
        ([spec(), spec(name="z")], "not the graph's inputs"),
        ([spec(dtype=torch.float16)], "torch.float16, the graph says BF16"),
        ([spec(dims=[tokens])], "rank 1, the graph 2"),
        ([spec(dims=[tokens, DimSpec(9, "", 9, 9, 9)])], "axis 1: IO spec size 9, graph size 8"),
        ([spec(dims=[tokens, DimSpec(None, "k", 1, 8, 8)])], "axis 1: dynamic in the IO spec (k) but static"),
    ]
    for inputs, words in cases:
        violations = check_io(m, inputs, [out])
        assert len(violations) == 1 and words in violations[0].message, (words, violations)
        assert violations[0].rule == "io_specs"


# ---- the real lowering passes ------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("model_name, kernel", [
    ("index_add + one_hot counts", True),
    ("scatter_add + unstable sort", False),
    ("sigmoid, group-limited, shared expert", True),
    ("transformers DeepseekV3MoE", True),
])
def test_lowered_moe_models_have_no_violations(model_name, kernel):
    from support import moe_models
    from executorch.exir import to_edge_transform_and_lower

    import et_trt_backend.backend  # noqa: F401  (registers the backend)
    from et_trt_backend.serialization import blob
    from et_trt_partitioner import TensorRTPartitioner

    builders = {
        "index_add + one_hot counts": lambda: moe_models.GroupedMoE(combine="index_add", counts="one_hot"),
        "scatter_add + unstable sort": lambda: moe_models.GroupedMoE(combine="scatter_add", sort="sort"),
        "sigmoid, group-limited, shared expert": lambda: moe_models.GroupedMoE(
            experts=8, groups=(4, 2), scoring="sigmoid", shared=True, sort="sort_stable"),
        "transformers DeepseekV3MoE": lambda: moe_models.hf_moe_block("deepseek_v3"),
    }
    program = moe_models.export(moe_models.bf16(builders[model_name]()))
    # "warn": the lowering must not stop at its own pre-flight; this test asserts the result.
    recipe = {"default": {"preflight": "warn", "grouped_gemm_kernel": kernel, "kernel_archs": ["sm_90a"]}}
    edge = to_edge_transform_and_lower(program, partitioner=[TensorRTPartitioner(recipe)])
    blobs = [blob.deserialize(m.processed_bytes) for name, m in edge.exported_program().graph_module.named_children()
             if name.startswith("lowered_module")]
    assert len(blobs) == 1
    model = onnx.load_from_string(blobs[0].onnx)
    op_types = {node.op_type for node in model.graph.node}
    assert bool(op_types & {"GroupedMM", "MoEExperts"}) == kernel and "TopK" in op_types
    assert check(model) == []
    assert preflight.check_io(model, blobs[0].inputs, blobs[0].outputs) == []
