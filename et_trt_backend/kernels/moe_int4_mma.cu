// INT4 MoE experts on the tensor cores with mma.sync (sm_80 and newer), each weight byte read once per expert.
//
// The same launch, arguments and results as int4_kernels.py's vector-matrix kernels (moe_int4_gemv_gate_up_kernel,
// moe_int4_gemv_down_kernel), so runtime/kernels/moe_experts_launcher.cc runs them under the same kernel names:
// grid (pairs, column blocks); program (p, block) serves expert e = topk_ids[p] if p is e's first pair and returns
// at once otherwise. It multiplies NP of e's pairs at a time with its block of e's weight rows (et_trt_backend/
// int4_weights.py's packed layout and semantics: products of q * scale with the activations, summed in float32).
//
// Why: at 8-64 tokens an expert serves a few to tens of pairs. The vector-matrix kernels unpack its weights once per
// pair; Triton's tensor-core kernels unpack into shared memory in float32. Here the weights go to the tensor cores
// as "A" (16 weight rows x 16 of K), the pairs as "B" (8 pairs a tile: few pairs waste little), so:
// - weights and activations stream global -> shared with cp.async, STAGES deep, 16 bytes a thread, coalesced;
// - a thread's A fragment is one 32-bit shared load per row: bytes 4q..4q+3 of a 16-byte chunk (q = lane % 4).
//   mma's sum over k does not care which k a fragment slot holds as long as A and B agree, so slot k = 2q, 2q + 1,
//   2q + 8, 2q + 9 of a k16 step holds element 4q + 0..3 of the chunk's low nibbles (step 0) or high nibbles
//   (step 1), and the B fragment is the 8 bytes of activations 4q..4q + 3 (+ 16): one 64-bit shared load;
// - nibbles become bf16 (fp16) with a byte permute, a mask and an OR of the magic exponent (1 LOP3: 128 + n in
//   bf16, 1024 + n in fp16) and one packed FMA that subtracts 128 + 8: exact, 2 values per instruction;
// - a k16 step lies in one 32-element chunk, so in one scale group: each group's products accumulate unscaled and
//   are added to the result times the group's scale in float32 (exact semantics, no scaled bf16 weights).
// Gated gate+up (MODE 1): a 16-row tile holds 8 features' gate rows then their up rows, so a thread's accumulator
// rows g and g + 8 are one feature's gate and up: the activation needs no exchange between threads.
//
// BY_EXPERT 1 (run where moe_experts_launcher.cc's int4_mma_by_expert says: from 2-8 pairs per expert): where the
// launch has no more experts than pairs, program (x, block) serves expert x, and the launcher makes the grid
// min(pairs, E) programs across (variant "mma_p<NP>_by_expert"; programs x >= E would return before any load).
// The first-pair rule launches pairs across,
// of which all but one per expert return after reading the ids (31 of 32 at 256 tokens on 16 experts). With more
// experts than pairs, the first-pair rule. The expert's weights' first stages are requested before the ids are read
// (an expert without pairs wastes those), and its pairs are found by one scan of all threads (the first-pair rule's
// kernel: warp 0, 32 ids at a time, after a scan for the first pair).
// Build macros (et_trt_backend/kernels/int4_mma.py): MODE 0 gate+up, 1 gated gate+up, 2 down; WARPS; MT (16-row
// tiles per warp); NP (pairs per pass, a multiple of 8); CHUNKS (32-element chunks of K per stage); STAGES;
// MAX_SCALE_GROUPS (scale groups of K held in shared memory at once); ELEM (__nv_bfloat16 or __half); BY_EXPERT;
// WAIT_PRIOR_GRID (sm_90 and newer: programmatic dependent launch, wait_prior_grid below).
// K (H for gate+up, F for down) must be a multiple of 8; the launcher runs this build where H and F are multiples
// of 16 (variant "gemv").
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

#if !defined(MODE) || !defined(WARPS) || !defined(MT) || !defined(NP) || !defined(CHUNKS) || !defined(STAGES) || \
    !defined(MAX_SCALE_GROUPS) || !defined(ELEM) || !defined(BY_EXPERT) || !defined(WAIT_PRIOR_GRID)
#error "build with et_trt_backend/kernels/int4_mma.py (it sets MODE, WARPS, MT, NP, CHUNKS, STAGES, ...)"
#endif

using Elem = ELEM;
constexpr bool kBf16 = std::is_same<Elem, __nv_bfloat16>::value;
constexpr bool kGated = MODE == 1;
constexpr bool kDown = MODE == 2;
constexpr int kThreads = WARPS * 32;
constexpr int kRows = WARPS * MT * 16;                   // weight rows per block
constexpr int kFeatures = kGated ? kRows / 2 : kRows;    // output features per block
constexpr int kNT = NP / 8;                              // 8-pair tiles
constexpr int kWeightStride = CHUNKS * 16 + 16;          // bytes per weight row in a stage (+16: no bank conflicts)
constexpr int kActStride = CHUNKS * 64 + 32;             // bytes per activation row (+32: 64-bit loads, no conflicts)
constexpr int kStageBytes = kRows * kWeightStride + NP * kActStride;
constexpr int kScaleStride = MAX_SCALE_GROUPS + 2;       // bf16 scales per row held
static_assert(NP % 8 == 0 && NP <= 64, "NP: a multiple of 8, at most 64");
static_assert(STAGES >= 2, "STAGES >= 2");
static_assert(CHUNKS <= MAX_SCALE_GROUPS, "a stage's groups fit the scales held");
static_assert(kRows * CHUNKS % kThreads == 0, "whole weight loads per thread");
constexpr int kWeightLoads = kRows * CHUNKS / kThreads;                   // 16-byte weight loads per thread a stage
constexpr int kActLoads = (NP * CHUNKS * 4 + kThreads - 1) / kThreads;    // ... of activations

// Shared memory: the stage ring, then the scales of the block's rows (a window of groups), then the pass's pairs.
constexpr int kScaleOffset = STAGES * kStageBytes;
constexpr int kPairsOffset = kScaleOffset + ((kRows * kScaleStride * 2 + 15) / 16) * 16;
constexpr int kSharedBytes = kPairsOffset + NP * 4;
#ifdef SHARED_BYTES  // what the image tells the launcher to give (int4_mma.py's shared_bytes)
static_assert(kSharedBytes <= SHARED_BYTES, "int4_mma.py's shared_bytes is short of the kernel's layout");
#endif

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  // src-size 0 fills the 16 bytes with zeros (rows and K past the end).
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Programmatic dependent launch (WAIT_PRIOR_GRID builds; the image says so and the launcher then starts the kernel
// while the block's previous kernel still runs): waits until that grid has finished and its writes are visible,
// then lets the next kernel start. Before it a program touches only its weights (BY_EXPERT requests the first
// stages), which no kernel of the block writes (the launcher starts the block's first kernel after all work before
// it): the ids, the activations and the outputs come after.
__device__ __forceinline__ void wait_prior_grid() {
#if WAIT_PRIOR_GRID
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two nibbles (bits 0-3 and 16-19 of `spread`, after `shift`) as two 16-bit floats q = nibble - 8, exactly:
// OR-ing a nibble into the mantissa of 128 (bf16 0x4300) or 1024 (fp16 0x6400) gives 128 + n (1024 + n), and one
// packed FMA subtracts 136 (1032).
__device__ __forceinline__ uint32_t nibbles_to_pair(uint32_t spread, int shift) {
  constexpr uint32_t magic = kBf16 ? 0x43004300u : 0x64006400u;
  uint32_t biased;  // (spread >> shift) & 0x000F000F | magic in one LOP3 (written plainly, ptxas makes two)
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(biased) : "r"(spread >> shift), "r"(0x000F000Fu), "r"(magic));
  uint32_t out;
  if constexpr (kBf16) {
    __nv_bfloat162 v = *reinterpret_cast<__nv_bfloat162*>(&biased);
    __nv_bfloat162 r = __hsub2(v, __floats2bfloat162_rn(136.0f, 136.0f));
    out = *reinterpret_cast<uint32_t*>(&r);
  } else {
    __half2 v = *reinterpret_cast<__half2*>(&biased);
    __half2 r = __hsub2(v, __floats2half2_rn(1032.0f, 1032.0f));
    out = *reinterpret_cast<uint32_t*>(&r);
  }
  return out;
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }
__device__ __forceinline__ float gelu(float x, bool tanh_form) {
  return tanh_form ? x * sigmoid(1.5957691216057308f * (x + 0.044715f * x * x * x))  // tanh(z) = 2 sigmoid(2z) - 1
                   : 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
}
// moe_experts.py's _activate (plugin_names.MOE_ACTIVATIONS), in float32.
__device__ __forceinline__ float activate(float g, float u, int activation, float alpha, float limit) {
  if (kGated) {
    if (activation == 0) return g * sigmoid(g) * u;
    if (activation == 3) {
      float gc = fminf(g, limit), uc = fminf(fmaxf(u, -limit), limit);
      return (uc + 1.0f) * gc * sigmoid(alpha * gc);
    }
    return gelu(g, activation == 1) * u;
  }
  if (activation == 4) return g * sigmoid(g);
  if (activation == 7) return fmaxf(g, 0.0f) * fmaxf(g, 0.0f);
  return gelu(g, activation == 5);
}
__device__ __forceinline__ float round_elem(float x) {
  if constexpr (kBf16) return __bfloat162float(__float2bfloat16(x));
  else return __half2float(__float2half(x));
}

struct Args {
  const Elem* x;  // activation rows: hidden [T, K] (gate+up, row = pair / top_k) or h [pairs, K] (down)
  const int32_t* ids;
  const uint8_t* w;
  const __nv_bfloat16* scale;
  const Elem* bias;
  int pairs, E, K, N, top_k, layout_block, group_size, has_bias;
};

// Weight row of feature-row `r` of the block (0 <= r < kRows): its index among all experts' rows, -1 past the end.
__device__ __forceinline__ int64_t weight_row(const Args& a, int e, int block, int r) {
  if (kGated) {
    const int tile = r / 16, in_tile = r % 16;
    const int f = block * kFeatures + tile * 8 + (in_tile & 7);
    if (f >= a.N) return -1;
    const int B = a.layout_block;
    return int64_t(e) * 2 * a.N + f / B * 2 * B + f % B + (in_tile >= 8 ? B : 0);
  }
  const int n = block * kFeatures + r;
  return n < a.N ? int64_t(e) * a.N + n : -1;
}

// This thread's i-th weight load of every stage: its row's first chunk of the stage's column; null past the end.
__device__ __forceinline__ const uint8_t* weight_src(const Args& a, int e, int block, int i, int row_bytes) {
  const int index = threadIdx.x + i * kThreads;
  const int64_t row = weight_row(a, e, block, index / CHUNKS);
  return row >= 0 ? a.w + row * row_bytes + index % CHUNKS * 16 : nullptr;
}

// Stage `slot`'s weights from chunk `first_chunk` of the rows (zeros past the end).
__device__ __forceinline__ void load_weights(const Args& a, const uint8_t* const (&w_src)[kWeightLoads],
                                             uint32_t smem_base, int slot, int first_chunk) {
  const int chunks = (a.K + 31) / 32;
  const uint32_t stage = smem_base + slot * kStageBytes;
#pragma unroll
  for (int i = 0; i < kWeightLoads; ++i) {
    const int index = threadIdx.x + i * kThreads;
    const bool ok = w_src[i] != nullptr && first_chunk + index % CHUNKS < chunks;
    cp_async16(stage + index / CHUNKS * kWeightStride + index % CHUNKS * 16, ok ? w_src[i] + first_chunk * 16 : a.w,
               ok);
  }
}

// BY_EXPERT: the weights of the first STAGES - 1 stages, a commit group each (compute's prologue then adds the
// activations'), requested before the pairs are known.
__device__ __forceinline__ void request_weights(const Args& a, int e, int block, uint8_t* smem) {
  const uint8_t* w_src[kWeightLoads];
#pragma unroll
  for (int i = 0; i < kWeightLoads; ++i) w_src[i] = weight_src(a, e, block, i, (a.K + 31) / 32 * 16);
  const int steps = ((a.K + 31) / 32 + CHUNKS - 1) / CHUNKS;
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < steps) load_weights(a, w_src, smem_base, s, s * CHUNKS);
    cp_async_commit();
  }
}

// weights_requested: request_weights ran for this pass (BY_EXPERT only).
__device__ __forceinline__ void compute(const Args& a, int e, int block, int count, const int* pair_s,
                                        uint8_t* smem, float (&acc)[MT][kNT][4], bool weights_requested = false) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, q = lane & 3;
  const int row_bytes = (a.K + 31) / 32 * 16;
  const int chunks = row_bytes / 16;
  const int groups = (a.K + a.group_size - 1) / a.group_size;
  const int chunks_per_group = a.group_size / 32;  // 1, 2 or 4: the launcher takes groups of 32, 64 and 128 only
  // Chunk to group by shift and mask: the divisions by the runtime group size cost ~20 instructions a chunk on the
  // ALU pipe, the kernel's busiest (Nsight Compute, benchmarks/results/h100_moe_ncu/).
  const int group_shift = __ffs(chunks_per_group) - 1;
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  auto* scale_s = reinterpret_cast<__nv_bfloat16*>(smem + kScaleOffset);

  // This thread's loads, the same rows every stage (their addresses computed once): weight rows' chunks,
  // activation rows' 16-byte pieces; null where the row lies past the end.
  const uint8_t* w_src[kWeightLoads];
#pragma unroll
  for (int i = 0; i < kWeightLoads; ++i) w_src[i] = weight_src(a, e, block, i, row_bytes);
  const Elem* x_src[kActLoads];
#pragma unroll
  for (int i = 0; i < kActLoads; ++i) {
    const int index = tid + i * kThreads, n = index / (CHUNKS * 4);
    x_src[i] = index < NP * CHUNKS * 4 && n < count
                   ? a.x + int64_t(pair_s[n] / a.top_k) * a.K + index % (CHUNKS * 4) * 8 : nullptr;
  }
  auto load_acts = [&](int slot, int first_chunk) {
    const uint32_t stage = smem_base + slot * kStageBytes;
#pragma unroll
    for (int i = 0; i < kActLoads; ++i) {
      const int index = tid + i * kThreads;
      if (index >= NP * CHUNKS * 4) break;
      const bool ok = x_src[i] != nullptr && first_chunk * 32 + index % (CHUNKS * 4) * 8 < a.K;
      cp_async16(stage + kRows * kWeightStride + index / (CHUNKS * 4) * kActStride + index % (CHUNKS * 4) * 16,
                 ok ? x_src[i] + first_chunk * 32 : a.x, ok);
    }
  };
  auto load_stage = [&](int slot, int first_chunk) {
    load_weights(a, w_src, smem_base, slot, first_chunk);
    load_acts(slot, first_chunk);
  };
  // The scales of groups [first, first + MAX_SCALE_GROUPS) of the block's rows.
  auto load_scales = [&](int first) {
    const int held = min(MAX_SCALE_GROUPS, groups - first);
    for (int i = tid; i < kRows * held; i += kThreads) {
      const int r = i / held, j = i % held;
      const int64_t row = weight_row(a, e, block, r);
      scale_s[r * kScaleStride + j] = row >= 0 ? a.scale[row * groups + first + j] : __float2bfloat16(0.0f);
    }
  };

  const int steps = (chunks + CHUNKS - 1) / CHUNKS;
  if constexpr (BY_EXPERT) {
    // The first stages' weights, then their activations, a commit group each: waiting for all but the newest
    // STAGES - 2 groups at step s still covers stage s (its activations' group and every weights' group before).
    if (!weights_requested) {
#pragma unroll
      for (int s = 0; s < STAGES - 1; ++s) {
        if (s < steps) load_weights(a, w_src, smem_base, s, s * CHUNKS);
        cp_async_commit();
      }
    }
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < steps) load_acts(s, s * CHUNKS);
      cp_async_commit();
    }
  } else {
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < steps) load_stage(s, s * CHUNKS);
      cp_async_commit();
    }
  }
  int scale_first = 0;
  load_scales(0);

  float part[MT][kNT][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int t = 0; t < kNT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][t][i] = part[m][t][i] = 0.0f;

  for (int step = 0; step < steps; ++step) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // the stage has landed for every thread; the slot loaded next was read by all
    const int last_group = (min((step + 1) * CHUNKS, chunks) - 1) >> group_shift;
    if (last_group - scale_first >= MAX_SCALE_GROUPS) {  // past the scales held: the window from this step's first
      scale_first = (step * CHUNKS) >> group_shift;      // group (rare: long K at small groups)
      load_scales(scale_first);
      __syncthreads();
    }
    if (step + STAGES - 1 < steps) load_stage((step + STAGES - 1) % STAGES, (step + STAGES - 1) * CHUNKS);
    cp_async_commit();
    const uint8_t* stage = smem + (step % STAGES) * kStageBytes;
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      const int chunk = step * CHUNKS + c;
      if (chunk >= chunks) break;
      // A fragments: rows g and g + 8 of each of the warp's tiles, bytes 4q..4q+3 of the chunk.
      uint32_t lo_bytes[MT][2];
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          lo_bytes[m][h] = *reinterpret_cast<const uint32_t*>(
              stage + ((warp * MT + m) * 16 + g + 8 * h) * kWeightStride + c * 16 + 4 * q);
#pragma unroll
      for (int half = 0; half < 2; ++half) {  // low nibbles: elements 0-15 of the chunk; high: 16-31
        uint32_t frag[MT][4];
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          const uint32_t r0_01 = __byte_perm(lo_bytes[m][0], 0, 0x4140), r0_23 = __byte_perm(lo_bytes[m][0], 0, 0x4342);
          const uint32_t r8_01 = __byte_perm(lo_bytes[m][1], 0, 0x4140), r8_23 = __byte_perm(lo_bytes[m][1], 0, 0x4342);
          frag[m][0] = nibbles_to_pair(r0_01, 4 * half);  // row g, slots 2q, 2q+1
          frag[m][1] = nibbles_to_pair(r8_01, 4 * half);  // row g+8
          frag[m][2] = nibbles_to_pair(r0_23, 4 * half);  // row g, slots 2q+8, 2q+9
          frag[m][3] = nibbles_to_pair(r8_23, 4 * half);
        }
#pragma unroll
        for (int t = 0; t < kNT; ++t) {
          const uint2 b = *reinterpret_cast<const uint2*>(stage + kRows * kWeightStride + (t * 8 + g) * kActStride +
                                                          c * 64 + half * 32 + 8 * q);
#pragma unroll
          for (int m = 0; m < MT; ++m) mma16816(part[m][t], frag[m], b.x, b.y);
        }
      }
      if (((chunk + 1) & (chunks_per_group - 1)) == 0 || chunk + 1 == chunks) {  // the group ends: scale, add it
        const int group = chunk >> group_shift;
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          const int r = (warp * MT + m) * 16 + g;
          const float s0 = __bfloat162float(scale_s[r * kScaleStride + group - scale_first]);
          const float s8 = __bfloat162float(scale_s[(r + 8) * kScaleStride + group - scale_first]);
#pragma unroll
          for (int t = 0; t < kNT; ++t) {
            acc[m][t][0] += part[m][t][0] * s0;
            acc[m][t][1] += part[m][t][1] * s0;
            acc[m][t][2] += part[m][t][2] * s8;
            acc[m][t][3] += part[m][t][3] * s8;
#pragma unroll
            for (int i = 0; i < 4; ++i) part[m][t][i] = 0.0f;
          }
        }
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the stages and scales are free for the next pass
}

// Whether pair p is expert e's first (program p then serves all of e's pairs).
__device__ __forceinline__ bool first_pair_of(const int32_t* ids, int p, int e) {
  int seen = 0;
  for (int i = threadIdx.x; i < p; i += kThreads) seen |= ids[i] == e;
  return !__syncthreads_or(seen);
}

// The next (up to) NP pairs of expert e from `start` into pair_s; returns their count and moves start past them.
__device__ __forceinline__ int next_pairs(const int32_t* ids, int pairs, int e, int* start, int* pair_s,
                                          int* count_s) {
  __syncthreads();  // the last pass's epilogue has read pair_s
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int count = 0, pos = *start;
    while (pos < pairs && count < NP) {
      const int i = pos + lane;
      const unsigned match = __ballot_sync(0xffffffffu, i < pairs && ids[i] == e);
      const int rank = __popc(match & ((1u << lane) - 1));
      if ((match >> lane & 1) && count + rank < NP) pair_s[count + rank] = i;
      const int taken = min(__popc(match), NP - count);
      if (count + __popc(match) > NP) {  // stop after the last one taken
        unsigned m = match;
        for (int j = 0; j < taken; ++j) m &= m - 1;  // drop the taken ones
        pos += __ffs(m) - 1;
        count += taken;
        break;
      }
      count += taken;
      pos += 32;
    }
    if (lane == 0) *count_s = count;
    *start = min(pos, pairs);
  }
  __syncthreads();
  const int count = *count_s;
  __syncthreads();  // count_s is written again by the next call
  return count;
}

// BY_EXPERT: expert e's pairs ranked [first, first + NP) into pair_s, in one scan of the ids by all threads (pair i
// is thread i % kThreads's; ranks by thread, then by index: any fixed order serves, each pair's rows are its own).
// Returns e's count of pairs, or -1 where one lies below `below` (the first-pair rule: another program serves e).
__device__ __forceinline__ int rank_pairs(const int32_t* ids, int pairs, int e, int first, int below, int* pair_s,
                                          int* warp_s) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  constexpr int kUnroll = 4;  // loads in flight per thread (512 pairs: one round trip with 128 threads)
  int mine = 0;
  bool earlier = false;
  for (int base = tid; base < pairs; base += kUnroll * kThreads) {
    int id[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) id[u] = base + u * kThreads < pairs ? __ldg(ids + base + u * kThreads) : -1;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      mine += id[u] == e;
      earlier |= id[u] == e && base + u * kThreads < below;
    }
  }
  if (__syncthreads_or(earlier)) return -1;
  int inclusive = mine;  // the prefix of the threads' counts: within the warp, then over the warps before
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int v = __shfl_up_sync(0xffffffffu, inclusive, d);
    if (lane >= d) inclusive += v;
  }
  if (lane == 31) warp_s[warp] = inclusive;
  __syncthreads();
  int rank = inclusive - mine, total = 0;
#pragma unroll
  for (int w = 0; w < WARPS; ++w) {
    rank += w < warp ? warp_s[w] : 0;
    total += warp_s[w];
  }
  if (mine > 0 && rank < first + NP && rank + mine > first)  // this thread's pairs again (from L1), in index order
    for (int i = tid; i < pairs; i += kThreads)
      if (__ldg(ids + i) == e) {
        if (rank >= first && rank < first + NP) pair_s[rank - first] = i;
        ++rank;
      }
  __syncthreads();  // pair_s is written; warp_s is read by all
  return total;
}

// A program's passes over its expert's pairs: next() puts the next (up to) NP of them in pair_s and returns their
// count (0: none left, or another program serves the expert).
struct PairPasses {
  const int32_t* ids;
  int pairs, e;
  int start;  // next_pairs': where warp 0 scans on; rank_pairs': the first-pair rule's pair (0: none)
  int* pair_s;
  int* count_s;
  int* warp_s;
  int first = 0;  // rank_pairs': the rank of the pass's first pair

  __device__ __forceinline__ int next() {
    if constexpr (BY_EXPERT) {
      const int total = rank_pairs(ids, pairs, e, first, start, pair_s, warp_s);
      start = 0;
      const int count = max(0, min(NP, total - first));
      first += NP;
      return count;
    } else {
      return next_pairs(ids, pairs, e, &start, pair_s, count_s);
    }
  }
};

// Program p's expert, after the wait for the grid before (wait_prior_grid); -1 where it has none to serve. The
// expert is p where `requested` (BY_EXPERT with no more experts than pairs: its weights' first stages are requested
// first), else pair p's if p is its first pair (BY_EXPERT: PairPasses checks that).
__device__ __forceinline__ int program_expert(const Args& a, int p, int block, uint8_t* smem, bool requested) {
  if (requested && p < a.E) request_weights(a, p, block, smem);
  wait_prior_grid();
  const int e = requested ? p : a.ids[p];
  if (e < 0 || e >= a.E || !(BY_EXPERT || first_pair_of(a.ids, p, e))) {
    if (requested) cp_async_wait<0>();  // the requested stages land before the exit
    return -1;
  }
  return e;
}

#if MODE != 2
extern "C" __global__ void __launch_bounds__(kThreads, 1) moe_int4_mma_gate_up(
    const Elem* x, const int32_t* ids, const uint8_t* w, const __nv_bfloat16* scale, const Elem* bias, Elem* h,
    int pairs, int E, int H, int F, int top_k, int layout_block, int group_size, int activation, float alpha,
    float limit, int has_bias, void*, void*) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int p = blockIdx.x, block = blockIdx.y;
  int* pair_s = reinterpret_cast<int*>(smem + kPairsOffset);
  __shared__ int count_s, warp_s[WARPS];
  const Args a{x, ids, w, scale, bias, pairs, E, H, F, top_k, layout_block, group_size, has_bias};
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const bool requested = BY_EXPERT && E <= pairs;  // the weights' first stages before the pairs are known
  const int e = program_expert(a, p, block, smem, requested);
  if (e < 0) return;
  PairPasses passes{ids, pairs, e, requested ? 0 : p, pair_s, &count_s, warp_s};
  for (int pass = 0;; ++pass) {
    const int count = passes.next();
    if (count == 0) break;
    float acc[MT][kNT][4];
    compute(a, e, block, count, pair_s, smem, acc, requested && pass == 0);
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
      for (int t = 0; t < kNT; ++t)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int n = t * 8 + 2 * q + j;
          if (n >= count) continue;
          const int pair = pair_s[n];
          if (kGated) {
            const int f = block * kFeatures + (warp * MT + m) * 8 + g;
            if (f >= F) continue;
            float gate = acc[m][t][j], up = acc[m][t][2 + j];
            if (has_bias) {
              const int64_t row = weight_row(a, e, block, (warp * MT + m) * 16 + g);
              gate += static_cast<float>(bias[row]);
              up += static_cast<float>(bias[row + layout_block]);
            }
            h[int64_t(pair) * F + f] = Elem(activate(round_elem(gate), round_elem(up), activation, alpha, limit));
          } else {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              const int f = block * kFeatures + (warp * MT + m) * 16 + g + 8 * half;
              if (f >= F) continue;
              float v = acc[m][t][2 * half + j];
              if (has_bias) v += static_cast<float>(bias[int64_t(e) * F + f]);
              h[int64_t(pair) * F + f] = Elem(activate(round_elem(v), 0.0f, activation, alpha, limit));
            }
          }
        }
    }
    if (count < NP) break;
  }
  if (requested) cp_async_wait<0>();  // an expert without pairs: its requested weights land before the exit
}
#else
extern "C" __global__ void __launch_bounds__(kThreads, 1) moe_int4_mma_down(
    const Elem* hrows, const int32_t* ids, const uint8_t* w, const __nv_bfloat16* scale, const Elem* bias,
    const void* topk_weights, float* y, int pairs, int E, int H, int F, int group_size, int has_bias,
    int weights_16bit, void*, void*) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int p = blockIdx.x, block = blockIdx.y;
  int* pair_s = reinterpret_cast<int*>(smem + kPairsOffset);
  __shared__ int count_s, warp_s[WARPS];
  const Args a{hrows, ids, w, scale, bias, pairs, E, F, H, 1, 1, group_size, has_bias};
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const bool requested = BY_EXPERT && E <= pairs;  // the weights' first stages before the pairs are known
  const int e = program_expert(a, p, block, smem, requested);
  if (e < 0) return;
  PairPasses passes{ids, pairs, e, requested ? 0 : p, pair_s, &count_s, warp_s};
  for (int pass = 0;; ++pass) {
    const int count = passes.next();
    if (count == 0) break;
    float acc[MT][kNT][4];
    compute(a, e, block, count, pair_s, smem, acc, requested && pass == 0);
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int t = 0; t < kNT; ++t)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int n = t * 8 + 2 * q + j;
          if (n >= count) continue;
          const int pair = pair_s[n];
          const float weight = weights_16bit ? static_cast<float>(reinterpret_cast<const Elem*>(topk_weights)[pair])
                                             : reinterpret_cast<const float*>(topk_weights)[pair];
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int n_out = block * kFeatures + (warp * MT + m) * 16 + g + 8 * half;
            if (n_out >= H) continue;
            float v = acc[m][t][2 * half + j];
            if (has_bias) v += static_cast<float>(bias[int64_t(e) * H + n_out]);
            y[int64_t(pair) * H + n_out] = v * weight;
          }
        }
    if (count < NP) break;
  }
  if (requested) cp_async_wait<0>();  // an expert without pairs: its requested weights land before the exit
}
#endif
