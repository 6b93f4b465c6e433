"""The INT4 kernels' Triton source in Triton's interpreter on the CPU, against int4_weights' references.

Run by tests/test_int4_kernels.py in a subprocess with TRITON_INTERPRET=1 (chosen before Triton is imported).
Launches each path as the launchers do (grids, workspace regions), every buffer poisoned first (NaN in outputs and
intermediate rows, -1 in the routing buffers), so an unwritten element or a row read before it is written fails:

- GroupedMM: the tensor-core build of grouped_mm_kernel (INT4 = True) and grouped_mm_int4_gemv_kernel, at odd K
  and N (K 40: one chunk and a padded one), every group size, empty groups and invalid offsets;
- the MoEExperts op: route + INT4 gate+up + INT4 down + combine, and the vector-matrix path (gate+up, down,
  combine; and with the down and combine in one launch), every gated activation and layout, biases, invalid ids,
  odd sizes, float16 routing weights, an expert's pairs over several row blocks.

Every check is float16: the interpreter's bfloat16 is wrong (Triton 3.9: tl.dot off by 1e10 on unit inputs, and
float32 -> bfloat16 truncates instead of rounding to nearest). Prints "interpreter ok" last.
"""

import pathlib
import sys

import torch
import triton

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from support.int4_cases import grouped_case, moe_case, relative_error  # noqa: E402

from et_trt_backend import int4_weights, moe_experts  # noqa: E402
from et_trt_backend.kernels import grouped_mm, int4_kernels, moe_aot  # noqa: E402
from et_trt_backend.kernels import moe_experts as moe_kernels  # noqa: E402
from et_trt_backend.plugin_names import MOE_ACTIVATIONS  # noqa: E402

# The kernels accumulate in float32 like the reference; what differs is the order of the sums, which flips a rare
# rounding to float16 (2^-11 of one element): far below this, relative to the norm.
TOLERANCE = 2e-3


def grouped_mm_tiles(a, w, offs):
    rows, k = a.shape
    groups, n = w.packed.shape[:2]
    out = torch.full((rows, n), float("nan"), dtype=a.dtype)
    grouped_mm.grouped_mm_kernel[(3,)](a, w.packed, offs, out, rows, k, n, groups, None, w.scales, FP8=False,
                                       WAIT_PRIOR_GRID=False, TRANS_B=True, USE_TMA=False, BLOCK_M=16, BLOCK_N=16,
                                       BLOCK_K=32, GROUP_CHUNK=4, group_size=w.group_size, INT4=True)
    return out


def grouped_mm_gemv(a, w, offs, block_n=8, block_c=2):
    rows, k = a.shape
    groups, n = w.packed.shape[:2]
    out = torch.full((rows, n), float("nan"), dtype=a.dtype)
    int4_kernels.grouped_mm_int4_gemv_kernel[(rows * triton.cdiv(n, block_n),)](
        a, w.packed, offs, out, rows, k, n, groups, w.scales, w.group_size, BLOCK_N=block_n, BLOCK_C=block_c,
        GROUP_CHUNK=4)
    return out


def check_grouped(name, a, w, offs, run):
    out = run(a, w, offs)
    want = int4_weights.grouped_mm_reference(a, w.packed, w.scales, offs, w.group_size)
    assert not out.isnan().any(), (name, "unwritten (NaN-poisoned) outputs")
    err = relative_error(out, want)
    assert err < TOLERANCE, (name, err)
    print(f"{name}: relative error {err:.2e}")


def moe_buffers(case):
    tokens, size = case.hidden.shape
    pairs, ffn = case.ids.numel(), case.dense_down.shape[2]
    h = torch.full((pairs, ffn), float("nan"), dtype=case.hidden.dtype)
    y = torch.full((pairs, size), float("nan"))
    out = torch.full((tokens, size), float("nan"), dtype=case.hidden.dtype)
    no_bias = torch.empty(1, dtype=case.hidden.dtype)
    return h, y, out, no_bias


def moe_block(case) -> int:
    if not moe_experts.is_gated(case.activation):
        return 1
    return moe_experts.layout_block(case.layout, case.dense_down.shape[2])


def combine(case, y, out):
    tokens, size = case.hidden.shape
    moe_kernels.moe_combine_kernel[(triton.cdiv(tokens, 4), triton.cdiv(size, 16))](
        y, case.ids, out, tokens, size, case.ids.shape[1], case.dense_down.shape[0], BLOCK_T=4, BLOCK_H=16)


def moe_tiles(case, block_m=16, block_n=16, chunk=16, e_pad=16):
    """route + INT4 gate+up + INT4 down + combine, as MoEExpertsLauncher runs the tensor-core path."""
    tokens, size = case.hidden.shape
    top_k, experts, ffn = case.ids.shape[1], case.dense_down.shape[0], case.dense_down.shape[2]
    pairs = tokens * top_k
    max_tiles = triton.cdiv(pairs, block_m) + min(experts, pairs)
    offs = torch.full((experts,), -1, dtype=torch.int32)
    order = torch.full((pairs,), -1, dtype=torch.int32)
    tiles = torch.full((1 + 2 * max_tiles,), -1, dtype=torch.int32)
    h, y, out, no_bias = moe_buffers(case)
    gated = moe_experts.is_gated(case.activation)
    moe_kernels.moe_route_kernel[(triton.cdiv(pairs, chunk),)](case.ids, offs, order, tiles, pairs, experts, block_m,
                                                               CHUNK=chunk, E_PAD=e_pad)
    moe_kernels.moe_gate_up_kernel[(max_tiles, triton.cdiv(ffn, block_n))](
        case.hidden, order, case.gate_up.packed, no_bias if case.b_gate_up is None else case.b_gate_up, tiles, offs,
        h, size, ffn, top_k, moe_block(case), MOE_ACTIVATIONS[case.activation], moe_experts.GPTOSS_ALPHA,
        moe_experts.GPTOSS_LIMIT, int(case.b_gate_up is not None), GATED=gated, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_K=32, scale_ptr=case.gate_up.scales, group_size=case.group_size, INT4=True)
    moe_kernels.moe_down_kernel[(max_tiles, triton.cdiv(size, block_n))](
        h, order, case.down.packed, no_bias if case.b_down is None else case.b_down, case.weights, tiles, offs, y,
        size, ffn, int(case.b_down is not None), int(case.weights.dtype != torch.float32), BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_K=32, scale_ptr=case.down.scales, group_size=case.group_size, INT4=True)
    combine(case, y, out)
    return out


def moe_without_route(case, gate_up_kernel, down_kernel, block_n, combined=False, **blocks):
    """The launches of the paths without a route (gate+up by pair, down by pair, combine; `combined`: down and
    combine in one launch by token), as the launcher runs them."""
    tokens, size = case.hidden.shape
    top_k, experts, ffn = case.ids.shape[1], case.dense_down.shape[0], case.dense_down.shape[2]
    pairs = tokens * top_k
    h, y, out, no_bias = moe_buffers(case)
    gated = moe_experts.is_gated(case.activation)
    gate_up_kernel[(pairs, triton.cdiv(ffn, block_n))](
        case.hidden, case.ids, case.gate_up.packed, case.gate_up.scales,
        no_bias if case.b_gate_up is None else case.b_gate_up, h, pairs, experts, size, ffn, top_k, moe_block(case),
        case.group_size, MOE_ACTIVATIONS[case.activation], moe_experts.GPTOSS_ALPHA, moe_experts.GPTOSS_LIMIT,
        int(case.b_gate_up is not None), GATED=gated, BLOCK_N=block_n,
        **{name: value and gated if name == "PAIRED" else value for name, value in blocks.items()})
    down_blocks = {name: value for name, value in blocks.items() if name != "PAIRED"}
    down_inputs = (h, case.ids, case.down.packed, case.down.scales, no_bias if case.b_down is None else case.b_down,
                   case.weights)
    flags = (case.group_size, int(case.b_down is not None), int(case.weights.dtype != torch.float32))
    if combined:
        down_kernel[(tokens, triton.cdiv(size, block_n))](*down_inputs, out, tokens, experts, size, ffn, top_k,
                                                          *flags, BLOCK_N=block_n, **down_blocks)
        return out
    down_kernel[(pairs, triton.cdiv(size, block_n))](*down_inputs, y, pairs, experts, size, ffn, *flags,
                                                     BLOCK_N=block_n, **down_blocks)
    combine(case, y, out)
    return out


def moe_gemv(case, block_n=8, block_c=2, paired=False):
    """The vector-matrix path: gate+up per pair, down per pair, combine (no route)."""
    return moe_without_route(case, int4_kernels.moe_int4_gemv_gate_up_kernel, int4_kernels.moe_int4_gemv_down_kernel,
                             block_n, BLOCK_C=block_c, PAIRED=paired)


def moe_gemv_combined(case):
    """The vector-matrix path with its down and combine in one launch (moe_int4_gemv_down_combine_kernel)."""
    return moe_without_route(case, int4_kernels.moe_int4_gemv_gate_up_kernel,
                             int4_kernels.moe_int4_gemv_down_combine_kernel, 8, combined=True, BLOCK_C=2, PAIRED=True)


def moe_gemv_shipped(case):
    """The vector-matrix path at the shipped blocking (moe_aot.MOE_GEMV_CONFIGS: gate and up rows in one loop, a step
    of K longer than these cases' K, so every step is masked)."""
    config = moe_aot.MOE_GEMV_CONFIGS[0]
    return moe_gemv(case, block_n=config.block_n, block_c=config.block_c, paired=config.paired)


MOE_PATHS = (moe_tiles, moe_gemv, moe_gemv_shipped, moe_gemv_combined)


def check_moe(name, case, paths=MOE_PATHS):
    want = case.reference()
    for run in paths:
        out = run(case)
        assert not out.isnan().any(), (name, run.__name__, "unwritten (NaN-poisoned) outputs")
        err = relative_error(out, want)
        assert err < TOLERANCE, (name, run.__name__, err)
        print(f"{name} ({run.__name__}): relative error {err:.2e}")


def main():
    torch.manual_seed(0)
    # GroupedMM: K 40 (a chunk and a padded one), N 13 (masked columns), an empty group, rows past the last group.
    for group_size in int4_weights.GROUP_SIZES:
        a, w, offs = grouped_case(11, 40, 13, [4, 4, 9], group_size=group_size, dtype=torch.float16, seed=group_size)
        check_grouped(f"grouped tiles g{group_size}", a, w, offs, grouped_mm_tiles)
        check_grouped(f"grouped gemv g{group_size}", a, w, offs, grouped_mm_gemv)
    # K 160 over several chunks and groups.
    a, w, offs = grouped_case(6, 160, 24, [2, 6], group_size=64, dtype=torch.float16, seed=1)
    check_grouped("grouped K 160 (tiles)", a, w, offs, grouped_mm_tiles)
    check_grouped("grouped K 160 (gemv)", a, w, offs, grouped_mm_gemv)
    # Invalid offsets: decreasing, negative, past the end (contract 4's clamp); more groups than one GROUP_CHUNK.
    a, w, offs = grouped_case(9, 64, 16, [3, 1, -5, 20, 7, 9], group_size=32, dtype=torch.float16, seed=2)
    check_grouped("grouped invalid offsets (tiles)", a, w, offs, grouped_mm_tiles)
    check_grouped("grouped invalid offsets (gemv)", a, w, offs, grouped_mm_gemv)

    # The MoE op: each gate+up layout, a clamped gated activation and a non-gated one (the activations' code is the
    # dense kernels', checked for every activation by moe_interpreter_check.py), biases and invalid ids. Layouts and
    # activations differ only in the gate+up: every gate+up kernel (the tiles', the vector-matrix one unpaired and
    # paired) runs each; the shipped blocking (the paired kernel again; its 4 x 32 blocking was
    # 40% of a case's time in the interpreter) runs the first and the cases below.
    for activation, layout in (("swiglu", "concat"), ("swiglu", "interleaved"), ("swiglu", "blocked8"),
                               ("gptoss_glu", "blocked8"), ("relu2", "concat")):
        case = moe_case(7, 3, 5, 64, 16, activation=activation, layout=layout, group_size=32, dtype=torch.float16,
                        bias=True, invalid=0.15, seed=len(layout) + MOE_ACTIVATIONS[activation])
        first = (activation, layout) == ("swiglu", "concat")
        check_moe(f"moe {activation} {layout}", case, paths=(moe_tiles, moe_gemv, moe_gemv_combined,
                                                             *([moe_gemv_shipped] if first else [])))
    # Odd sizes (H 40, F 20: padded chunks, masked columns), group 64 and 128, float16 routing weights.
    check_moe("moe odd sizes g64", moe_case(5, 2, 4, 40, 20, group_size=64, dtype=torch.float16,
                                            weights_dtype=torch.float16, seed=3))
    check_moe("moe odd sizes g128", moe_case(5, 2, 4, 40, 20, group_size=128, dtype=torch.float16, seed=4))
    # Skewed routing: every token to experts 0 and 1 (an expert's rows over several m-tiles), experts 2-3 empty.
    case = moe_case(20, 2, 4, 32, 16, dtype=torch.float16, seed=5)
    case.ids = torch.stack([torch.zeros(20), torch.ones(20)], 1).int()
    case.ids[3, 0] = 4
    case.ids[9, 1] = -(2**31)
    check_moe("moe skewed", case)
    # Every id invalid: every output row zero.
    case = moe_case(3, 2, 4, 32, 16, dtype=torch.float16, seed=6)
    case.ids.fill_(9)
    for run in MOE_PATHS:
        assert (run(case) == 0).all(), (run.__name__, "rows of invalid pairs must be zero")
    print("interpreter ok")


if __name__ == "__main__":
    main()
