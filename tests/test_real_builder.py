"""NVIDIA's own ONNX parser and builder (TensorRT for RTX, on this CPU machine), driven by et-trt's C++ engine
builder (libet_trt_plugin.so, the builder the robot runs at init), on every partition we produce, with our C++
GroupedMM plugin: the example policy, the test models, unmodified transformers MoE blocks and whole decoder
layers (attention, rotary, norms and MoE) of eight families parse with 0 errors and build. The example policy builds
for every target (sm_80, sm_86, sm_89 and sm_120); each other case for one, the cases of a test taking the targets in
turn (one target proves the parse; the targets differ in the builder's kernel choice, which the example covers).
Negative controls fail with the parser's or builder's own
message, not a crash (they run in a subprocess: the library can abort a process). Where the real parser and a
pre-flight rule disagree, DISAGREEMENTS records it.

Skipped, with the reason, where TensorRT for RTX or the builder library is not installed (pip install
'et-trt[tensorrt-rtx]'; scripts/setup.sh builds the library against ../shared's TensorRT headers).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from executorch.exir import to_edge_transform_and_lower
from onnx import TensorProto as TP
from onnx import external_data_helper, helper, numpy_helper

from et_trt_backend import preflight
from et_trt_backend.engines import onnx_build, providers
from et_trt_backend.serialization.kernel_image import KernelImage
from et_trt_backend.options import CompileOptions
from et_trt_backend.plugin_names import (
    ACTIVATION_ATTRIBUTE,
    ACTIVATIONS,
    FP8_WEIGHT_ONNX_TYPE,
    GROUPED_MM_DOMAIN,
    GROUPED_MM_OP,
    PLUGIN_ATTRIBUTES,
)
from et_trt_backend.serialization import blob
from et_trt_backend.serialization.named_data import NamedData
from et_trt_partitioner import TensorRTPartitioner
from support import moe_models
from support.kernel_records import fp8_image_records, image_record
from support.lowering import delegated_parts
from support.nvidia_builders import (
    built_target,
    serialized_group_sizes,
    serialized_plugin_fields,
    tensorrt_rtx_or_skip,
)

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ["sm_80", "sm_86", "sm_89", "sm_120a"]
# Kernel images for the RTX targets only (fewer to compile); no engine at export: the test builds them. The MoE
# blocks stay GroupedMMs, this module's subject (test_moe_fusion.py builds the fused MoEExperts form).
RECIPE = {"kernel_archs": TARGETS, "engine_build": "never", "fused_experts": False}
FP8_TARGETS = ["sm_89", "sm_120a"]  # the RTX targets with FP8 tensor cores


@pytest.fixture(scope="module")
def rtx():
    return tensorrt_rtx_or_skip()


def _partitions(exported, recipe=None) -> list[blob.BlobContents]:
    edge = to_edge_transform_and_lower(exported, partitioner=[TensorRTPartitioner(recipe or {"default": RECIPE})])
    return [contents for _, contents in delegated_parts(edge)]


def _partitions_for(exported, target: str, **options) -> list[blob.BlobContents]:
    """The partitions of `exported` with RECIPE (and `options`), their kernel images for `target` only."""
    return _partitions(exported, {"default": {**RECIPE, "kernel_archs": [target], **options}})


def _images_id(kernels: list[KernelImage]) -> bytes:
    """The 32-byte reference each GroupedMM node of an engine holds (schema.fbs, table Engine)."""
    return hashlib.sha256(b"".join(k.image.bytes() for k in kernels)).digest()


def _in_turn(case: str, cases) -> str:
    """The one target `case` builds for: the cases of `cases` take TARGETS in turn."""
    return TARGETS[list(cases).index(case) % len(TARGETS)]


def _assert_builds(rtx, partitions: list[blob.BlobContents], targets=TARGETS) -> list[bytes]:
    """Every partition parses and builds for each of `targets`, the plan recording that target and, for each GroupedMM
    node, the reference to the blob's kernel images; the plans, partition by partition and target by target."""
    assert partitions, "nothing was delegated"
    plans = []
    for contents in partitions:
        nodes = [n.op_type for n in onnx.load_from_string(contents.onnx).graph.node].count("GroupedMM")
        for target in targets:
            engine = onnx_build.parse_and_build(rtx, contents, target)  # BuildFailed lists the parser's errors
            assert len(engine.plan) > 10_000
            assert built_target(engine.plan) == engine.compute_capability == providers.RTX_TARGETS[target]
            fields = serialized_plugin_fields(engine.plan)
            assert len(fields) >= nodes
            assert all(f.kernel_images_id == _images_id(contents.kernels) for f in fields)
            plans.append(engine.plan)
    return plans


# ---- every partition we produce ---------------------------------------------------------------
@pytest.mark.slow
def test_example_policy(rtx):
    import tomllib

    from examples import moe_policy

    recipe = tomllib.loads((ROOT / "examples" / "recipe.toml").read_text())
    for table in [recipe["default"], *recipe["parts"].values()]:
        table["engine_build"] = "never"
    # The decoder with FP8 experts (its two MoE blocks as MoEExperts nodes with e4m3 weights and float32 scales), the
    # action head's block fused in bf16: both forms of the fused op through the real parser and builder in one export.
    # (The FP8 GroupedMM form: test_transformers_decoder_layer_with_fp8_experts.)
    recipe["parts"]["decoder"].update(expert_precision="fp8", kernel_archs=FP8_TARGETS)
    partitions = _partitions(moe_policy.export_policy(), recipe)
    assert sorted(c.part for c in partitions) == ["decoder", "velocity"]
    by_part = {c.part: c for c in partitions}
    assert {k.weight_format for k in by_part["decoder"].kernels if k.kernel != "moe_combine"} == {"fp8"}
    assert {k.weight_format for k in by_part["velocity"].kernels} == {"dense"}
    fp8_inputs = [len(n.input) for n in onnx.load_from_string(by_part["decoder"].onnx).graph.node
                  if n.op_type == "MoEExperts"]
    assert fp8_inputs == [9] * 2
    _assert_builds(rtx, [by_part["velocity"]])
    for plan in _assert_builds(rtx, [by_part["decoder"]], targets=FP8_TARGETS):
        assert serialized_group_sizes(plan) == [0, 0]  # the FP8 form: no INT4 group size


@pytest.mark.slow
def test_example_policy_with_int4_experts(rtx):
    """The decoder with expert_precision = "int4" (group 128, the default): its two MoE blocks as INT4 MoEExperts
    nodes (packed INT8 weights, zero biases, bf16 scales) build for every RTX target, each plugin serializing its group
    size. (tests/test_lowering_int4.py builds the INT4 GroupedMM form.)"""
    import tomllib

    from examples import moe_policy

    recipe = tomllib.loads((ROOT / "examples" / "recipe.toml").read_text())
    for table in [recipe["default"], *recipe["parts"].values()]:
        table["engine_build"] = "never"
    recipe["parts"]["decoder"].update(expert_precision="int4", kernel_archs=TARGETS)
    recipe["parts"]["velocity"].update(grouped_gemm_kernel=False, fused_experts=False)  # no images to compile
    decoder = {c.part: c for c in _partitions(moe_policy.export_policy(), recipe)}["decoder"]
    nodes = [n for n in onnx.load_from_string(decoder.onnx).graph.node if n.op_type == "MoEExperts"]
    assert [len(n.input) for n in nodes] == [9, 9]
    assert {k.weight_format for k in decoder.kernels if k.kernel not in ("moe_route", "moe_combine")} == {"int4"}
    for plan in _assert_builds(rtx, [decoder]):
        assert serialized_group_sizes(plan) == [128, 128]


MODELS = {
    "argsort-index_add-histc": lambda: moe_models.GroupedMoE(sort="argsort_stable", combine="index_add"),
    "sort-scatter_add-one_hot": lambda: moe_models.GroupedMoE(sort="sort", combine="scatter_add", counts="one_hot"),
    "sort_stable-index_put-bincount": lambda: moe_models.GroupedMoE(sort="sort_stable", counts="bincount"),
    "sigmoid-grouped-shared": lambda: moe_models.GroupedMoE(experts=8, scoring="sigmoid", groups=(4, 2), shared=True),
    "top1-max": lambda: moe_models.GroupedMoE(top_k=1),
    "stack-of-two": lambda: moe_models.MoEStack(),
}


@pytest.mark.parametrize("name", MODELS)
def test_test_models(rtx, name):
    target = _in_turn(name, MODELS)
    _assert_builds(rtx, _partitions_for(moe_models.export(moe_models.bf16(MODELS[name]())), target), [target])


HF_BLOCKS = ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3", "gpt_oss"]


@pytest.mark.parametrize("name", HF_BLOCKS)
def test_transformers_moe_blocks(rtx, name):
    block = moe_models.hf_moe_block(name)
    target = _in_turn(name, HF_BLOCKS)
    _assert_builds(rtx, _partitions_for(moe_models.export(block, hidden=moe_models.HF_HIDDEN, batch=True), target),
                   [target])


@pytest.mark.slow
@pytest.mark.parametrize("name", moe_models.HF_FAMILIES)
def test_transformers_decoder_layers(rtx, name):
    """Whole unmodified decoder layers (attention, rotary, norms and MoE), dynamic token count."""
    layer = moe_models.bf16(moe_models.HFDecoderLayer(name))
    with torch.no_grad():
        exported = torch.export.export(layer, (torch.randn(1, 8, moe_models.HF_HIDDEN, dtype=moe_models.DTYPE),),
                                       dynamic_shapes=({1: torch.export.Dim("tokens", min=2, max=256)},))
    target = _in_turn(name, moe_models.HF_FAMILIES)
    partitions = _partitions_for(exported, target)
    assert any(contents.kernels for contents in partitions), "no GroupedMM partition"
    _assert_builds(rtx, partitions, [target])


@pytest.mark.slow
def test_transformers_decoder_layer_with_fp8_experts(rtx):
    """A whole unmodified Qwen3-MoE decoder layer with FP8 experts: its down GroupedMM takes the gate+up output
    (activation 1) and the real builder takes the partition for both FP8 targets."""
    layer = moe_models.bf16(moe_models.HFDecoderLayer("qwen3_moe"))
    with torch.no_grad():
        exported = torch.export.export(layer, (torch.randn(1, 8, moe_models.HF_HIDDEN, dtype=moe_models.DTYPE),),
                                       dynamic_shapes=({1: torch.export.Dim("tokens", min=2, max=256)},))
    partitions = _partitions(exported, {"default": {**RECIPE, "expert_precision": "fp8", "kernel_archs": FP8_TARGETS}})
    fields = [serialized_plugin_fields(plan) for plan in _assert_builds(rtx, partitions, targets=FP8_TARGETS)]
    # one partition holds the GroupedMMs; its plan for each target
    assert [sorted(f.activation for f in plan) for plan in fields if plan] == [[0, 1]] * len(FP8_TARGETS)


def test_dense_lowering_and_fp16(rtx):
    model = moe_models.bf16(moe_models.GroupedMoE(experts=8, shared=True))
    for target, options in zip(TARGETS, ({"grouped_gemm_kernel": False}, {"precision": "fp16"}, {"precision": "fp32"})):
        _assert_builds(rtx, _partitions_for(moe_models.export(model), target, **options), [target])


# ---- the FP8 form of GroupedMM (4 inputs), hand-made ---------------------------------------------------------
FP8_SIZES = {"G": 4, "N": 48, "K": 64, "max_rows": 512}


def _fp8_weights(groups: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random weights quantized as the FP8 contract says: a scale per output feature, amax / 448."""
    w = torch.randn(groups, n, k)
    scale = w.abs().amax(dim=2) / 448
    return (w / scale[..., None]).to(torch.float8_e4m3fn), scale


def fp8_partition(kernels: list[KernelImage], *, weight_type: str = FP8_WEIGHT_ONNX_TYPE, trans_b: int = 1,
                  scale_shape: tuple[int, ...] | None = None, scale_type=TP.FLOAT,
                  activation: int | None = None) -> blob.BlobContents:
    """A partition of one FP8 GroupedMM: a bf16 [rows, K] (rows dynamic), offs int32 [G] -> out [rows, N].
    Its weights b [G, N, K] (e4m3, of ONNX type `weight_type`: the bits as they are) and b_scale [G, N] are
    external initializers, handed to the parser as the runtime does; the arguments make malformed forms.
    activation 1: a is a gate+up output [rows, 2K]."""
    g, n, k, max_rows = (FP8_SIZES[key] for key in ("G", "N", "K", "max_rows"))
    a_columns = 2 * k if activation == ACTIVATIONS["swiglu"] else k
    b_q, b_scale = _fp8_weights(g, n, k)
    scale = np.ones(scale_shape, np.float32) if scale_shape else b_scale.numpy()
    scale = scale.astype(helper.tensor_dtype_to_np_dtype(scale_type))
    weights = {"b": (b_q.view(torch.uint8).numpy().tobytes(), getattr(TP, weight_type), [g, n, k]),
               "b_scale": (scale.tobytes(), scale_type, list(scale.shape))}
    initializers = []
    for name, (raw, elem_type, shape) in weights.items():
        tensor = helper.make_tensor(name, elem_type, shape, raw, raw=True)
        external_data_helper.set_external_data(tensor, location=name)
        tensor.ClearField("raw_data")
        tensor.data_location = TP.EXTERNAL
        initializers.append(tensor)
    extra = {ACTIVATION_ATTRIBUTE: activation} if activation is not None else {}
    node = helper.make_node(GROUPED_MM_OP, ["a", "b", "offs", "b_scale"], ["out"], name="experts",
                            domain=GROUPED_MM_DOMAIN, trans_b=trans_b, **extra, **PLUGIN_ATTRIBUTES)
    graph = helper.make_graph([node], "fp8_experts",
                              [_vi("a", TP.BFLOAT16, ["rows", a_columns]), _vi("offs", TP.INT32, [g])],
                              [_vi("out", TP.BFLOAT16, ["rows", n])], initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid(GROUPED_MM_DOMAIN, 1)])
    rows = blob.DimSpec(None, "rows", 1, 64, max_rows)
    return blob.BlobContents(
        part="experts", options=CompileOptions(), onnx=model.SerializeToString(), kernels=kernels, engines=[],
        inputs=[blob.TensorSpec("a", torch.bfloat16, [rows, blob.DimSpec(a_columns, "", a_columns, a_columns,
                                                                          a_columns)]),
                blob.TensorSpec("offs", torch.int32, [blob.DimSpec(g, "", g, g, g)])],
        outputs=[blob.TensorSpec("out", torch.bfloat16, [rows, blob.DimSpec(n, "", n, n, n)])],
        producer=blob.producer_versions(18),
        weights=[blob.WeightRecord(name, NamedData.of(raw)) for name, (raw, _, _) in weights.items()])


@pytest.mark.parametrize("activation", [None, ACTIVATIONS["swiglu"]], ids=["activations", "gate_up_output"])
def test_fp8_grouped_mm_parses_and_builds_for_sm_89_and_sm_120(rtx, activation):
    """The FP8 form, its weights FLOAT8E4M3FN, a the activations or (activation 1) a gate+up output [rows, 2K]:
    0 parser and builder errors for both FP8 targets; the e4m3 weights and their scales are in the plan byte for
    byte (TensorRT kept them as given, converted nothing)."""
    contents = fp8_partition(fp8_image_records(), activation=activation)
    for target in ("sm_89", "sm_120a"):
        plan = onnx_build.parse_and_build(rtx, contents, target).plan  # BuildFailed lists the parser's errors
        fields = serialized_plugin_fields(plan)
        assert fields and fields[0].kernel_images_id == _images_id(contents.kernels)
        assert fields[0].activation == (activation or 0)
        for weight in contents.weights:
            assert weight.data.bytes() in plan, weight.name


FP8_REFUSALS = {
    "int8-weights": ({"weight_type": "INT8"},
                     r"the FP8 form's b \(input 1\) must be FLOAT8E4M3FN \(TensorRT FP8\) \[G, N, K\]; it is k?INT8"),
    "fp16-scale": ({"scale_type": TP.FLOAT16},
                   r"the FP8 form's b_scale \(input 3\) must be float32 \[G, N\]; it is k?HALF"),
    "scale-per-expert": ({"scale_shape": (4,)},
                         r"the FP8 form's b_scale \(input 3\) must be \[G, N\] of b \[4, 48, 64\]; it is \[4\]"),
    "scale-transposed": ({"scale_shape": (48, 4)},
                         r"the FP8 form's b_scale \(input 3\) must be \[G, N\] of b \[4, 48, 64\]; it is \[48, 4\]"),
    "trans_b-0": ({"trans_b": 0},
                  r"the FP8 form \(4 inputs\) needs trans_b=1: its weights are \[G, N, K\]; the node has trans_b=0"),
    "activation-2": ({"activation": 2}, r"field activation must be (one integer, 0 or 1; |0 \(a holds the "
                                        r"activations\) or 1 \(a gate\+up output, its SwiGLU\), )got (INT32 \[)?2"),
}


@pytest.mark.parametrize("case", FP8_REFUSALS)
def test_malformed_fp8_forms_are_refused_with_the_plugins_message(rtx, case):
    """Refused while parsing, with the plugin's message."""
    arguments, message = FP8_REFUSALS[case]
    # A dense [G, K, N] image too: the creator then takes trans_b=0, and the plugin judges the form.
    contents = fp8_partition([*fp8_image_records(), image_record("any", "bf16", False, "dense")], **arguments)
    with pytest.raises(onnx_build.BuildFailed) as refused:
        onnx_build.parse_and_build(rtx, contents, "sm_89")
    assert not refused.value.parsed
    assert any(re.search(message, error) for error in refused.value.errors), refused.value.errors


def test_fp8_form_needs_fp8_images_of_its_dtype(rtx):
    """An FP8 node in a blob with only dense images, or only fp16 FP8 ones, is refused naming what it lacks."""
    dense = [image_record(variant, "bf16", True, "dense") for variant in ("any", "quantize_rows")]
    for kernels, has in ((dense, "none"), (fp8_image_records("fp16"), "fp16")):
        with pytest.raises(onnx_build.BuildFailed) as refused:
            onnx_build.parse_and_build(rtx, fp8_partition(kernels), "sm_89")
        assert any(f"the blob has no bf16 FP8 kernel image for trans_b=1 (it has {has})" in error
                   for error in refused.value.errors), refused.value.errors


# ---- negative controls: the parser's or builder's message, no crash ------------------------------------------
def _grouped_mm(model: onnx.ModelProto) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.op_type == "GroupedMM")


def _attribute(node: onnx.NodeProto, name: str, value) -> None:
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend([*kept, helper.make_attribute(name, value)])


def _plugin_missing(model):
    _attribute(_grouped_mm(model), "plugin_version", "2")


def _wrong_field(model):
    _attribute(_grouped_mm(model), "trans_b", 1.5)


def _refused_dtype(model):
    """The first GroupedMM in fp16 (Casts around it); the blob has bf16 kernel images only."""
    node = _grouped_mm(model)
    position = list(model.graph.node).index(node)
    result = node.output[0]
    casts = [helper.make_node("Cast", [name], [f"{name}_fp16"], name=f"to_fp16_{i}", to=TP.FLOAT16)
             for i, name in enumerate(node.input[:2])]
    node.input[0], node.input[1] = casts[0].output[0], casts[1].output[0]
    node.output[0] = f"{result}_fp16"
    back = helper.make_node("Cast", [node.output[0]], [result], name="to_bf16", to=TP.BFLOAT16)
    model.graph.node.insert(position + 1, back)
    for cast in reversed(casts):
        model.graph.node.insert(position, cast)


def _wrong_output_width(model):
    """A consumer that expects the first GroupedMM's output one column wider than it is."""
    node = _grouped_mm(model)
    position = list(model.graph.node).index(node)
    width = 65  # GroupedMoE(ffn=32): the gate+up GroupedMM is 64 wide
    model.graph.initializer.append(numpy_helper.from_array(np.zeros([width], np.float32), "wider"))
    cast = helper.make_node("Cast", ["wider"], ["wider_bf16"], name="wider_cast", to=TP.BFLOAT16)
    add = helper.make_node("Add", [f"{node.output[0]}_narrow", "wider_bf16"], [node.output[0]], name="expects_65")
    node.output[0] = f"{node.output[0]}_narrow"
    model.graph.node.insert(position + 1, cast)
    model.graph.node.insert(position + 2, add)


NEGATIVE = {
    "plugin-missing": (_plugin_missing, r"node '[^']+' \(GroupedMM\): .*Plugin not found, are the plugin name, "
                                        r"version, and namespace correct\?"),
    "wrong-field": (_wrong_field, r"node '[^']+' \(GroupedMM\): .*Could not create the plugin.*\n.*GroupedMM plugin: "
                                  r"field trans_b must be one integer, 0 or 1; got FLOAT32 \[1.5\]"),
    "refused-dtype": (_refused_dtype, r"node '[^']+' \(GroupedMM\): .*getOutputDataTypes reported a non-zero "
                                      r"return code.*\n.*GroupedMM plugin: the blob has no fp16 kernel image for trans_b=1 "
                                      r"\(it has bf16\)"),
    "wrong-output-width": (_wrong_output_width, r"node 'expects_65' \(Add\): .*Shape Error \(broadcast dimensions "
                                                r"must be conformable"),
}


def _damaged(pte: bytes, mutate) -> bytes:
    """The .pte with `mutate` applied to its TensorRT partition's ONNX."""
    from support.damaged_pte import rewrite_blob

    def change(data: bytes) -> bytes:
        contents = blob.deserialize(data)
        model = onnx.load_from_string(contents.onnx)
        mutate(model)
        return blob.serialize(blob.BlobContents(**{**contents.__dict__, "onnx": model.SerializeToString()}))

    return rewrite_blob(pte, change)


# `et-trt check --build --require-builder` of each .pte, one after the other in ONE subprocess (the library can abort
# a process: then every case fails, none passes): a section per file on stdout and stderr, then its exit status.
_CHECK_EACH = textwrap.dedent("""
    import sys, traceback
    from et_trt_partitioner import cli
    for path in sys.argv[1:]:
        for stream in (sys.stdout, sys.stderr):
            print("=== " + path, file=stream, flush=True)
        try:
            status = cli.main(["-q", "check", "--build", "--require-builder", path])
        except Exception:
            traceback.print_exc(file=sys.stdout)
            status = "an exception"
        sys.stderr.flush()
        print("=== exit", status, flush=True)
""")


@pytest.fixture(scope="module")
def checked(tmp_path_factory, rtx) -> dict[str, tuple[str, str, str]]:
    """case -> (exit status, stdout, stderr) of `et-trt check --build` of a small MoE model's .pte ("sound") and of
    each NEGATIVE control's damaged copy of it."""
    exported = moe_models.export(moe_models.bf16(moe_models.GroupedMoE()))
    edge = to_edge_transform_and_lower(exported, partitioner=[TensorRTPartitioner({"default": {
        **RECIPE, "kernel_archs": ["sm_86"]}})])
    pte = edge.to_executorch().buffer
    folder = tmp_path_factory.mktemp("checked")
    files = {"sound": pte, **{case: _damaged(pte, mutate) for case, (mutate, _) in NEGATIVE.items()}}
    for case, data in files.items():
        (folder / f"{case}.pte").write_bytes(data)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _CHECK_EACH, *(str(folder / f"{case}.pte") for case in files)],
                          capture_output=True, text=True, env=env, timeout=900)
    out, err = (re.split(r"^=== .*/(\S+)\.pte\n", text, flags=re.M) for text in (done.stdout, done.stderr))
    results = {}
    for case, section, err_section in zip(out[1::2], out[2::2], err[2::2]):
        status = re.search(r"^=== exit (.+)\n\Z", section, re.M)
        results[case] = (status.group(1), section[:status.start()], err_section) if status else ("none", section, "")
    assert list(results) == list(files), f"exit {done.returncode} (a crash is negative):\n{done.stdout[-3000:]}\n" \
                                         f"{done.stderr[-3000:]}"
    return results


def test_check_build_of_a_sound_partition(checked, rtx):
    status, out, err = checked["sound"]
    assert status == "0", out + err
    # NVIDIA's parser and builder say nothing about our nodes (they warned of each plugin field a node lacked).
    assert not [line for line in err.splitlines() if " WARNING " in line], err
    assert f"    TensorRT for RTX {rtx.version}: built for sm_86 in" in out
    assert out.rstrip().endswith("1 partition(s), 0 violation(s), 0 build failure(s)")


@pytest.mark.parametrize("case", NEGATIVE)
def test_negative_control_fails_with_the_nvidia_message(checked, case):
    status, out, err = checked[case]
    assert status == "1", f"exit {status} (a crash is negative):\n{out}\n{err[-3000:]}"
    assert "FAILED for sm_86" in out
    assert re.search(NEGATIVE[case][1], out, re.S), out


# ---- where the real parser and the pre-flight rules disagree ------------------------------------------------
def _vi(name, elem_type, shape):
    return helper.make_tensor_value_info(name, elem_type, shape)


def _model(nodes, inputs, outputs, initializers=(), opset=18):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _unary(op, elem_type, opset=18, **attrs):
    return _model([helper.make_node(op, ["x"], ["y"], name=f"my_{op}", **attrs)],
                  [_vi("x", elem_type, [4, 8])], [_vi("y", elem_type, [4, 8])], opset=opset)


def _topk(k, rows):
    return _model([helper.make_node("TopK", ["x", "k"], ["v", "i"], name="top", axis=0)],
                  [_vi("x", TP.FLOAT, [rows])], [_vi("v", TP.FLOAT, [k]), _vi("i", TP.INT64, [k])],
                  [numpy_helper.from_array(np.array([k], np.int64), "k")])


def _scatter_nd(reduction):
    return _model([helper.make_node("ScatterND", ["x", "idx", "upd"], ["y"], name="sc", reduction=reduction)],
                  [_vi("x", TP.FLOAT, [8]), _vi("idx", TP.INT64, [4, 1]), _vi("upd", TP.FLOAT, [4])],
                  [_vi("y", TP.FLOAT, [8])])


def _cumsum_int():
    return _model([helper.make_node("CumSum", ["x", "axis"], ["y"], name="cs")],
                  [_vi("x", TP.INT32, [8])], [_vi("y", TP.INT32, [8])],
                  [numpy_helper.from_array(np.array(0, np.int64), "axis")])


def _add_mismatched():
    return _model([helper.make_node("Add", ["x", "w"], ["y"], name="add")], [_vi("x", TP.FLOAT, [4, 8])],
                  [_vi("y", TP.FLOAT, [4, 8])], [numpy_helper.from_array(np.zeros([9], np.float32), "w")])


# case -> (model, pre-flight flags it, TensorRT for RTX 1.7's parser + builder (sm_86) refuse it). A row whose
# two columns differ is a disagreement; the test fails when either side changes, so this table stays true.
# The pre-flight rules encode onnx-tensorrt 10.1's support matrix, for the TensorRT on Jetson and H100/H200:
# where TensorRT for RTX accepts more (opset 21, integer CumSum), the rule stays for those devices.
DISAGREEMENTS = {
    "clean Relu": (lambda: _unary("Relu", TP.FLOAT), False, False),
    "Unique (unsupported op)": (lambda: _unary("Unique", TP.FLOAT), True, True),
    "opset 21 (beyond the matrix's 20)": (lambda: _unary("Relu", TP.FLOAT, opset=21), True, False),
    "TopK K=3841 (beyond 3840)": (lambda: _topk(3841, 70000), True, True),
    "ScatterND reduction=add": (lambda: _scatter_nd("add"), True, True),
    "CumSum on INT32 (the matrix says float only)": (_cumsum_int, True, False),
    "Mish in BF16": (lambda: _unary("Mish", TP.BFLOAT16), True, True),
    "Add of widths 8 and 9 (shapes are not a rule)": (_add_mismatched, False, True),
}


_TORCH_DTYPES = {TP.FLOAT: torch.float32, TP.BFLOAT16: torch.bfloat16, TP.INT32: torch.int32, TP.INT64: torch.int64}


def _blob_of(model: onnx.ModelProto) -> blob.BlobContents:
    """A partition of `model` as it is (static shapes, its initializers inline), as the builder takes one."""
    def specs(values):
        return [blob.TensorSpec(v.name, _TORCH_DTYPES[v.type.tensor_type.elem_type],
                                [blob.DimSpec(d.dim_value, "", d.dim_value, d.dim_value, d.dim_value)
                                 for d in v.type.tensor_type.shape.dim]) for v in values]

    return blob.BlobContents(part="case", options=CompileOptions(), onnx=model.SerializeToString(), kernels=[],
                             engines=[], inputs=specs(model.graph.input), outputs=specs(model.graph.output),
                             producer=blob.producer_versions(18), weights=[])


def test_preflight_and_the_real_parser_agree_where_recorded(rtx, tmp_path):
    for i, (case, (build, _, _)) in enumerate(DISAGREEMENTS.items()):
        (tmp_path / f"{i}.blob").write_bytes(blob.serialize(_blob_of(build())))
    # One subprocess: a refusal that aborts the library must fail this test, not the test run.
    script = textwrap.dedent("""
        import pathlib, sys
        from et_trt_backend.engines import onnx_build, providers
        from et_trt_backend.serialization import blob
        rtx = providers.tensorrt_rtx()
        for i in range(int(sys.argv[2])):
            try:
                onnx_build.parse_and_build(rtx, blob.deserialize(pathlib.Path(sys.argv[1], f"{i}.blob").read_bytes()),
                                           "sm_86")
                print("built")
            except onnx_build.BuildFailed as e:
                print("refused:", str(e).replace("\\n", " "))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path), str(len(DISAGREEMENTS))],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    real = dict(zip(DISAGREEMENTS, done.stdout.splitlines()[-len(DISAGREEMENTS):]))
    table = {case: (bool(preflight.check(build())), real[case].startswith("refused:"))
             for case, (build, _, _) in DISAGREEMENTS.items()}
    assert table == {case: (flagged, refused) for case, (_, flagged, refused) in DISAGREEMENTS.items()}, real
