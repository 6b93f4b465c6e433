"""The INT4 expert kernels on a GPU, through the C++ launchers (no Triton in the process), against int4_weights'
references (float32 on the CPU, weights q * scale).

Runs on the device through benchmarks/device/int4_run.sh, which builds the launcher and points ET_TRT_KERNEL_IMAGES
at images compiled on the CPU machine; skipped where there is no CUDA GPU. The invalid, odd, empty and single-token
cases also run under `compute-sanitizer --tool memcheck` there.
"""

import re

import pytest
import torch
from support.gpu_launchers import launcher_device
from support.int4_cases import grouped_case, moe_case, relative_error, run_moe

from et_trt_backend import int4_weights, moe_experts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs an NVIDIA GPU (runs on the device through benchmarks/device/int4_run.sh)"),
]

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# Against the float32 reference: bf16 and fp16 rounding of the output (and, in the MoE op, of the gate+up output
# and the activation, where a flipped rounding moves one element by one unit).
BOUND = {torch.bfloat16: 1e-2, torch.float16: 2e-3}


def _grouped(a, w, offs):
    """GroupedMM with INT4 weights through GroupedMMLauncher into a NaN-poisoned output; (out, kernel)."""
    from et_trt_backend.kernels import launcher, op

    device = launcher_device()
    a, packed, scales, offs = (t.to(device).contiguous() for t in (a, w.packed, w.scales, offs))
    rows, k = a.shape
    groups, n = packed.shape[:2]
    out = torch.full((rows, n), float("nan"), dtype=a.dtype, device=device)
    grouped = op._launcher(device, op._DTYPES[a.dtype], True, "int4")
    grouped.launch(a.data_ptr(), packed.data_ptr(), offs.data_ptr(), out.data_ptr(), rows, k, n, groups, True,
                   torch.cuda.current_stream().cuda_stream, int4=launcher.Int4Operands(scales.data_ptr(),
                                                                                        w.group_size))
    torch.cuda.synchronize()
    return out.cpu(), grouped.last_kernel


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group_size", int4_weights.GROUP_SIZES)
@pytest.mark.parametrize("rows, k, n, offs", [
    (3, 256, 64, [1, 1, 3]),  # gemv, an empty group
    (9, 40, 13, [3, 1, -5, 20, 7, 9]),  # gemv, odd K and N, invalid offsets
    (300, 200, 96, [100, 100, 250, 290]),  # tiles, odd K, an empty group, rows past the last group
    (257, 512, 130, [64, 128, 192, 400]),  # tiles, odd N, an offset past the rows
])
def test_grouped_mm(dtype, group_size, rows, k, n, offs):
    a, w, offs_t = grouped_case(rows, k, n, offs, group_size=group_size, dtype=DTYPES[dtype], seed=rows + k)
    out, kernel = _grouped(a, w, offs_t)
    want = int4_weights.grouped_mm_reference(a, w.packed, w.scales, offs_t, group_size)
    assert not out.isnan().any(), f"{kernel}: unwritten (NaN-poisoned) outputs"
    assert relative_error(out, want) < BOUND[DTYPES[dtype]], kernel
    assert ("gemv" in kernel) == (rows <= max(len(offs), 16)), kernel


def _moe(case):
    """The MoE op with INT4 weights through MoEExpertsLauncher, into a NaN-poisoned output and a 0xff workspace
    (one byte spare); (out, kernels)."""
    from et_trt_backend.kernels import moe_op

    device = launcher_device()
    case = case.to(device)
    launcher = moe_op.launcher_for(device, case.hidden.dtype, "int4")
    return run_moe(launcher, case, case.dense_down.shape[0], spare_workspace=1)


# moe_experts_launcher.cc's int4_path and int4_mma_by_expert: the vector-matrix kernels at pairs <= max(E, 16) (and,
# where the mma.sync ones serve: H and F multiples of 16, pairs <= 2 or pairs x H x F <= 2^23), the mma.sync ones
# above (BY_EXPERT from 8 pairs per expert, or from 2 with at most 16 experts and E x H x F <= 2^26; else the
# first-pair grid), the route and tiles where they do not serve. A pattern of last_kernels.
def _expected_path(case) -> str:
    pairs, experts = case.ids.numel(), case.dense_down.shape[0]
    size, ffn = case.hidden.shape[1], case.dense_down.shape[2]
    mma = size % 16 == 0 and ffn % 16 == 0
    if pairs <= max(experts, 16) and (not mma or pairs <= 2 or pairs * size * ffn <= 2**23):
        return r"moe_gemv_gate_up"
    if not mma:
        return r"moe_route"
    per_expert = -(-pairs // min(experts, pairs))
    by_expert = per_expert >= 8 or (per_expert >= 2 and experts <= 16 and experts * size * ffn <= 2**26)
    return r"moe_mma_down \(mma_p\d+_by_expert\)" if by_expert else r"moe_mma_down \(mma_p\d+\)"


def _check_moe(case) -> str:
    out, kernels = _moe(case)
    want = case.reference()
    assert not out.isnan().any(), f"{kernels}: unwritten (NaN-poisoned) outputs"
    if want.numel():
        assert relative_error(out, want) < BOUND[case.hidden.dtype], kernels
        assert (out[(want == 0).all(1)] == 0).all(), f"{kernels}: rows of no valid pair are not zero"
        assert re.search(_expected_path(case), kernels), kernels
    return kernels


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 16, 32, 200])  # gemv, mma BY_EXPERT (8, 16 and 64 pairs a pass)
@pytest.mark.parametrize("activation, layout", [("swiglu", "concat"), ("swiglu", "blocked8"),
                                                ("gptoss_glu", "interleaved"), ("relu2", "concat")])
def test_moe_paths_activations_and_layouts(dtype, tokens, activation, layout):
    case = moe_case(tokens, 2, 8, 256, 128, activation=activation, layout=layout, dtype=DTYPES[dtype],
                    bias=activation == "gptoss_glu", seed=tokens)
    kernels = _check_moe(case)
    assert ("moe_gemv_down_combine" in kernels) == (tokens * 2 <= 16), kernels  # the down and combine: one launch


@pytest.mark.parametrize("group_size", int4_weights.GROUP_SIZES)
@pytest.mark.parametrize("tokens", [1, 100])
def test_moe_odd_sizes_every_group_size(group_size, tokens):
    _check_moe(moe_case(tokens, 2, 4, 200, 72, group_size=group_size, weights_dtype=torch.bfloat16,
                        seed=group_size + tokens))


@pytest.mark.parametrize("tokens", [1, 3, 64])
def test_moe_invalid_ids_and_empty_experts(tokens):
    case = moe_case(tokens, 2, 16, 128, 64, invalid=0.3, seed=tokens)
    case.ids[0] = torch.tensor([-(2**31), 16], dtype=torch.int32)  # both outside [0, E): token 0's row is zero
    _check_moe(case)


@pytest.mark.parametrize("tokens", [32, 120])  # the mma path: passes of 16 pairs, of 64 pairs
def test_moe_skewed_routing(tokens):
    """Every token to experts 0 and 1 (one invalid id; each expert's rows over several passes or tiles), the
    others empty."""
    case = moe_case(tokens, 2, 8, 256, 128, seed=7)
    case.ids = torch.stack([torch.zeros(tokens), torch.ones(tokens)], 1).int()
    case.ids[5, 1] = 8
    _check_moe(case)


@pytest.mark.parametrize("experts, size, ffn, tokens, build", [
    (2, 2048, 4096, 4, "mma_p8_by_expert"), (2, 2048, 4096, 8, "mma_p16_by_expert"),
    (2, 2048, 4096, 32, "mma_p64_by_expert"), (32, 512, 1024, 32, "mma_p8"), (32, 512, 1024, 96, "mma_p16")])
def test_moe_mma_builds(experts, size, ffn, tokens, build):
    """Each shipped mma.sync build where the launcher takes it: the family by int4_mma_by_expert (BY_EXPERT on 2
    experts of H x F = 2^23 from 4 pairs per expert; the first-pair grid on 32 experts at 2-6), then the fewest pairs
    per pass that hold twice the average expert's."""
    kernels = _check_moe(moe_case(tokens, 2, experts, size, ffn, seed=tokens))
    assert f"moe_mma_down ({build})" in kernels, kernels


@pytest.mark.parametrize("path, kernel", [("gemv", "moe_gemv_gate_up"), ("mma", "moe_mma_down"),
                                          ("tiles", "moe_route")])
def test_moe_forced_int4_path(path, kernel):
    """MoEExpertsLauncher.set_int4_path (the sweep and int4_mma_check.py force a path at every shape): each path at
    16 tokens on 8 experts (the rule's: mma.sync), then the rule again."""
    from et_trt_backend.kernels import moe_op

    case = moe_case(16, 2, 8, 256, 128, seed=16)
    launcher = moe_op.launcher_for(launcher_device(), case.hidden.dtype, "int4")
    launcher.set_int4_path(path)
    try:
        out, kernels = run_moe(launcher, case.to(launcher_device()), 8)
    finally:
        launcher.set_int4_path("rule")  # the launcher is shared with the other tests
    assert kernel in kernels, kernels
    assert relative_error(out, case.reference()) < BOUND[case.hidden.dtype], kernels
    _check_moe(case)  # the rule again


@pytest.mark.parametrize("tokens", [1, 16])  # the gemv kernels (down and combine in one launch), mma.sync BY_EXPERT
def test_moe_kernels_wait_for_the_work_before_them(tokens):
    """Programmatic dependent launch (from sm_90 the images wait for the grid before them, and the launcher starts
    each kernel after a block's first while the one before it runs): three blocks back to back on one stream into one
    workspace, no sync between, each right after the copies that write its hidden rows, ids and weights (which the
    mma.sync builds by expert request before they wait) into shared buffers. Each output matches its reference, and
    the same launches without the overlap exactly."""
    from et_trt_backend.kernels import moe_op
    from et_trt_backend.kernels.launcher import moe_workspace_bytes

    device = launcher_device()
    cases = [moe_case(tokens, 2, 8, 256, 128, seed=seed).to(device) for seed in (11, 12, 13)]
    launcher = moe_op.launcher_for(device, torch.bfloat16, "int4")
    hidden = torch.full_like(cases[0].hidden, float("nan"))
    ids = torch.full_like(cases[0].ids, -1)
    weights = [torch.zeros_like(t) for t in (cases[0].gate_up.packed, cases[0].gate_up.scales, cases[0].down.packed,
                                             cases[0].down.scales)]
    workspace = torch.full((moe_workspace_bytes(tokens, 2, 8, 256, 128),), 0xFF, dtype=torch.uint8, device=device)
    stream = torch.cuda.current_stream().cuda_stream

    def run_all() -> list[torch.Tensor]:
        outs = [torch.full_like(hidden, float("nan")) for _ in cases]
        for case, out in zip(cases, outs):
            for shared, own in zip([hidden, ids, *weights], [case.hidden, case.ids, case.gate_up.packed,
                                                             case.gate_up.scales, case.down.packed, case.down.scales]):
                shared.copy_(own)
            gate_up, gate_up_scale, down, down_scale = weights
            launcher.launch(moe_op.launch_args(
                hidden, ids, case.weights, gate_up, down, out, workspace, experts=8, ffn=128,
                activation=case.activation, gate_up_layout=case.layout, w_gate_up_scale=gate_up_scale,
                w_down_scale=down_scale, group_size=case.group_size), stream)
        torch.cuda.synchronize()
        return [out.cpu() for out in outs]

    overlapped, kernels = run_all(), launcher.last_kernels
    launcher.set_programmatic_launch(False)
    try:
        serialized = run_all()
    finally:
        launcher.set_programmatic_launch(True)  # the launcher is shared with the other tests
    assert re.search(_expected_path(cases[0]), kernels), kernels
    for case, out, plain in zip(cases, overlapped, serialized):
        assert relative_error(out, case.to("cpu").reference()) < BOUND[torch.bfloat16], kernels
        assert torch.equal(out, plain), f"{kernels}: the overlapped launches differ from the serialized ones"


def test_moe_single_token_no_tokens_and_robot_size():
    _check_moe(moe_case(1, 2, 64, 2048, 1024, seed=1))
    assert "moe_gemv_gate_up" in _check_moe(moe_case(1, 2, 16, 2048, 4096, seed=5))  # two pairs: gemv at any size
    out, _ = _moe(moe_case(0, 2, 8, 64, 32, seed=2))
    assert out.shape == (0, 64)


def test_eager_ops_take_the_int4_form():
    from et_trt_backend.kernels import moe_op, op  # noqa: F401  (registers the ops)

    device = launcher_device()
    case = moe_case(5, 2, 4, 128, 64, seed=3).to(device)
    out = torch.ops.et_trt.moe_experts(
        case.hidden, case.ids, case.weights, case.gate_up.packed, case.down.packed, None, None, "swiglu", "concat",
        moe_experts.GPTOSS_ALPHA, moe_experts.GPTOSS_LIMIT, case.gate_up.scales, case.down.scales, case.group_size)
    assert relative_error(out.cpu(), case.to("cpu").reference()) < 1e-2
    a, w, offs = grouped_case(6, 128, 32, [2, 6], group_size=64, seed=4)
    out = torch.ops.et_trt.grouped_mm(a.to(device), w.packed.to(device), offs.to(device), True, w.scales.to(device),
                                      64)
    assert relative_error(out.cpu(), int4_weights.grouped_mm_reference(a, w.packed, w.scales, offs, 64)) < 1e-2
    with pytest.raises(ValueError, match="group size must be one of"):
        torch.ops.et_trt.grouped_mm(a.to(device), w.packed.to(device), offs.to(device), True, w.scales.to(device), 16)

