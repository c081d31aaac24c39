// Mixture-of-Experts on the device: routing, grouping the (token, slot) pairs by expert, the expert
// products as grouped GEMMs on the tensor cores (gemm_core.cuh), and the weighted combine. No host
// round trip and no size that depends on device data: every launch is sized from T, k and E alone,
// so a decode step captures into a CUDA graph.
//
// Pairs: pair p = t * k + j is slot j of token t. The plan puts the pairs of expert e in consecutive
// rows of the grouped products (in an arbitrary order inside the group: a product row's result depends
// only on its own input row, so the order changes no bit) and cuts each group into m-tiles of
// tile_rows rows, listed in a table the GEMM blocks read.
#include "gemm_fp8.cuh"
#include "gemm_gguf_blocks.cuh"
#include "gemm_nvfp4.cuh"
#include "gemm_tiled.cuh"

#ifndef MOE_PLAN_THREADS
#define MOE_PLAN_THREADS 1024
#endif

// ---- routing --------------------------------------------------------------------------------------
// (value, id) a beats (value, id) b: larger value, then lower id; id < 0 is "none" and loses to all.
__device__ __forceinline__ bool route_beats(float va, int ia, float vb, int ib) {
    if (ia < 0) return false;
    if (ib < 0) return true;
    return va > vb || (va == vb && ia < ib);
}

__device__ __forceinline__ void warp_best(float& v, int& i) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, offset);
        const int oi = __shfl_xor_sync(0xffffffffu, i, offset);
        if (route_beats(ov, oi, v, i)) {
            v = ov;
            i = oi;
        }
    }
}

// The key that orders choices as `route_beats` does by value, one reduction instruction a round: larger floats
// give larger unsigned keys (-0 counts as +0), and every float's key is above 0, an empty lane's.
__device__ __forceinline__ unsigned route_key(float v) {
    const unsigned bits = __float_as_uint(v == 0.0f ? 0.0f : v);
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

__device__ __forceinline__ unsigned warp_reduce_max(unsigned v) {
    unsigned out;
    asm volatile("redux.sync.max.u32 %0, %1, 0xffffffff;" : "=r"(out) : "r"(v));
    return out;
}

__device__ __forceinline__ unsigned warp_reduce_min(unsigned v) {
    unsigned out;
    asm volatile("redux.sync.min.u32 %0, %1, 0xffffffff;" : "=r"(out) : "r"(v));
    return out;
}

// One warp per token (RouterSpec in atlas_core.backends.ops.moe): scores (softmax or sigmoid), the
// selection-only correction bias, group-limited selection, top-k by (choice desc, id asc), weights
// from the unbiased scores, renormalised and scaled. Lane l owns experts l, l + 32, ...; E <= 1024.
// Dynamic shared memory: 2 * E floats per warp (scores, then choices).
extern "C" __global__ void moe_route(const bf16_t* __restrict__ logits, long long ld, const float* __restrict__ bias,
                                     float* __restrict__ weights, int* __restrict__ ids, int T, int E, int k,
                                     int sigmoid_scoring, int groups, int top_groups, int normalize, float scaling) {
    await_inputs();
    extern __shared__ float route_smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int t = blockIdx.x * (blockDim.x >> 5) + warp;
    if (t >= T) return;
    float* scores = route_smem + (long long)warp * 2 * E;
    float* choice = scores + E;
    const bf16_t* row = logits + (long long)t * ld;

    float peak = NEG_INF;
    for (int e = lane; e < E; e += 32) {
        const float l = bf16_to_float(row[e]);
        scores[e] = l;
        peak = fmaxf(peak, l);
    }
    peak = warp_max(peak);
    float total = 0.0f;
    for (int e = lane; e < E; e += 32) {
        const float s = sigmoid_scoring ? 1.0f / (1.0f + expf(-scores[e])) : expf(scores[e] - peak);
        scores[e] = s;
        total += s;
    }
    total = warp_sum(total);
    for (int e = lane; e < E; e += 32) {
        if (!sigmoid_scoring) scores[e] = scores[e] / total;
        choice[e] = bias ? scores[e] + bias[e] : scores[e];
    }
    __syncwarp();

    if (groups > 1) {  // keep the top_groups groups by the sum of their two best choices
        const int per_group = E / groups;
        unsigned kept = 0u;  // bit i: group lane + 32 i is kept (groups <= 1024)
        for (int round = 0; round < top_groups; ++round) {
            float best = NEG_INF;
            int best_group = -1;
            for (int gi = 0, grp = lane; grp < groups; ++gi, grp += 32) {
                if (kept & (1u << gi)) continue;
                float first = NEG_INF, second = NEG_INF;
                for (int e = grp * per_group; e < (grp + 1) * per_group; ++e) {
                    const float c = choice[e];
                    if (c > first) {
                        second = first;
                        first = c;
                    } else if (c > second) {
                        second = c;
                    }
                }
                const float score = second + first;
                if (route_beats(score, grp, best, best_group)) {
                    best = score;
                    best_group = grp;
                }
            }
            warp_best(best, best_group);
            if ((best_group & 31) == lane) kept |= 1u << (best_group >> 5);
        }
        __syncwarp();
        for (int grp = lane, gi = 0; grp < groups; grp += 32, ++gi) {
            if (!(kept & (1u << gi)))
                for (int e = grp * per_group; e < (grp + 1) * per_group; ++e) choice[e] = NEG_INF;
        }
        __syncwarp();
    }

    unsigned taken = 0u;  // bit i: expert lane + 32 i is chosen already
    float picked_weight = 0.0f, picked_sum = 0.0f;
    int picked_id = 0;
    for (int slot = 0; slot < k; ++slot) {
        unsigned lane_key = 0u, lane_id = 0xffffffffu;  // this lane's best untaken expert (lowest id on ties)
        for (int e = lane, i = 0; e < E; e += 32, ++i) {
            const unsigned key = route_key(choice[e]);
            if (!(taken & (1u << i)) && key > lane_key) {
                lane_key = key;
                lane_id = (unsigned)e;
            }
        }
        const unsigned top = warp_reduce_max(lane_key);
        const int best_id = (int)warp_reduce_min(lane_key == top ? lane_id : 0xffffffffu);
        if ((best_id & 31) == lane) taken |= 1u << (best_id >> 5);
        const float w = scores[best_id];
        picked_sum += w;
        if (lane == slot) {
            picked_weight = w;
            picked_id = best_id;
        }
    }
    // k <= 32: lane j holds slot j
    if (lane < k) {
        float w = normalize ? picked_weight / (picked_sum + 1e-20f) : picked_weight;
        weights[(long long)t * k + lane] = scaling != 1.0f ? w * scaling : w;
        ids[(long long)t * k + lane] = picked_id;
    }
}

// ---- grouping -------------------------------------------------------------------------------------
// One block of MOE_PLAN_THREADS: count the pairs per expert, prefix sums of rows and m-tiles, then give
// every pair its row and every m-tile its work. Outputs: tiles[3, max_tiles] (per m-tile: its expert, or
// -1 past the last tile; its first row; the end of its expert's rows), pair_rows[P] (the row of pair p),
// row_tokens[P] (the token whose activations row r reads). E <= MOE_PLAN_THREADS; max_tiles >= the tiles.
extern "C" __global__ void __launch_bounds__(MOE_PLAN_THREADS) moe_plan(
    const int* __restrict__ ids, int P, int k, int E, int tile_rows, int max_tiles, int* __restrict__ tiles,
    int* __restrict__ pair_rows, int* __restrict__ row_tokens) {
    await_inputs();
    __shared__ int counts[MOE_PLAN_THREADS];
    __shared__ int rows_scan[MOE_PLAN_THREADS];
    __shared__ int tiles_scan[MOE_PLAN_THREADS];
    const int tid = threadIdx.x;
    counts[tid] = 0;
    __syncthreads();
    for (int p = tid; p < P; p += MOE_PLAN_THREADS) {
        const int e = ids[p];
        if (e >= 0 && e < E) atomicAdd(&counts[e], 1);
    }
    __syncthreads();
    const int count = tid < E ? counts[tid] : 0;
    rows_scan[tid] = count;
    tiles_scan[tid] = (count + tile_rows - 1) / tile_rows;
    __syncthreads();
    for (int offset = 1; offset < MOE_PLAN_THREADS; offset <<= 1) {  // inclusive Hillis-Steele scans
        const int r = tid >= offset ? rows_scan[tid - offset] : 0;
        const int c = tid >= offset ? tiles_scan[tid - offset] : 0;
        __syncthreads();
        rows_scan[tid] += r;
        tiles_scan[tid] += c;
        __syncthreads();
    }
    const int first_row = tid == 0 ? 0 : rows_scan[tid - 1], first_tile = tid == 0 ? 0 : tiles_scan[tid - 1];
    if (tid < E) {
        for (int t = first_tile; t < tiles_scan[tid]; ++t) {
            tiles[t] = tid;
            tiles[max_tiles + t] = first_row + (t - first_tile) * tile_rows;
            tiles[2 * max_tiles + t] = rows_scan[tid];
        }
    }
    for (int t = tiles_scan[MOE_PLAN_THREADS - 1] + tid; t < max_tiles; t += MOE_PLAN_THREADS) tiles[t] = -1;
    counts[tid] = first_row;  // now: the next free row of each expert
    __syncthreads();
    for (int p = tid; p < P; p += MOE_PLAN_THREADS) {
        const int e = ids[p];
        const int row = (e >= 0 && e < E) ? atomicAdd(&counts[e], 1) : -1;
        pair_rows[p] = row;
        if (row >= 0) row_tokens[row] = p / k;
    }
}

// ---- expert products -------------------------------------------------------------------------------
// The rows one block computes: product rows [m0, M) of expert e. Grouped (tiles from moe_plan): m-tile
// blockIdx.y (tiles marked -1 exit), rows gathered through x_rows, each written to its own output row. Direct
// (tiles null: a single token, no plan): pair p = blockIdx.y alone, reading row p / pairs_per_row of x (the
// token for gate/up, the pair's own row for down) and the matrix of expert ids[p] (ids outside [0, E) compute
// nothing) into output row p. Both give the main loop the same operands (x, x_rows, m0, M).
struct ExpertBlock {
    int e, m0, M;
};

__device__ __forceinline__ bool expert_block(const int* tiles, int max_tiles, const int* ids, int pairs_per_row, int E,
                                             ExpertBlock& b) {
    const int y = blockIdx.y;
    if (tiles) {
        b = ExpertBlock{tiles[y], tiles[max_tiles + y], tiles[2 * max_tiles + y]};
    } else {
        const int row = y / pairs_per_row;
        b = ExpertBlock{ids[y], row, row + 1};
    }
    return b.e >= 0 && b.e < E;
}

// out[row(r), :] = x[x_rows ? x_rows[r] : r, :] @ w[e]^T for the rows r of the block (ExpertBlock), rounded to
// bf16; with relu2 (the non-gated activation) max(that, 0)^2 in fp32, rounded again. w is [E, N, K].
// grid.x: n-tiles of NT x 8 columns; grid.y: max_tiles (grouped) or pairs (direct).
template <int MT, int NT, int U, int VEC, typename W>
__device__ __forceinline__ void expert_product(const bf16_t* x, long long ldx, const int* x_rows, const W w,
                                               bf16_t* out, long long ldo, const int* tiles, int max_tiles,
                                               const int* ids, int pairs_per_row, int E, int N, int K, int relu2) {
    __shared__ TilePartials<MT, NT> partials;
    ExpertBlock b;
    if (!expert_block(tiles, max_tiles, ids, pairs_per_row, E, b)) return;
    const int n0 = blockIdx.x * NT * 8;
    tile_partials<MT, NT, U, VEC, W>(partials, x, ldx, x_rows, bank_matrix(w, b.e, N, K), b.m0, b.M, n0, N, K);
    for (int idx = threadIdx.x; idx < MT * NT * 4 * 32; idx += blockDim.x) {
        const int f = idx >> 5, l = idx & 31;
        const int e = f & 3, ij = f >> 2, i = ij / NT, j = ij % NT;
        const int row = b.m0 + i * 16 + (l >> 2) + ((e & 2) ? 8 : 0);
        const int col = n0 + j * 8 + 2 * (l & 3) + (e & 1);
        if (row >= b.M || col >= N) continue;
        float v = tile_sum<MT, NT>(partials, f, l);
        if (relu2) {
            v = fmaxf(bf16_to_float(float_to_bf16(v)), 0.0f);
            v = v * v;
        }
        out[(long long)(tiles ? row : blockIdx.y) * ldo + col] = float_to_bf16(v);
    }
}

// Each tile shape has a bf16-weight kernel, one over FP8 E4M3 weights with block scales (gemm_fp8.cuh:
// Fp8Weight), and one each over NVFP4 (gemm_nvfp4.cuh) and GGUF Q8_0 (gemm_gguf.cuh) weights read as whole rows of
// bytes, the quantized ones with U_FP8 chunks in flight (their conversion needs registers of its own), and for
// those also `vec8` kernels (VEC_LOW8, gemm_core.cuh) for blocks of at most 8 rows.
#define MOE_GEMM_ROWS_KERNEL(NAME, W, MT, NT, U, VEC, SUFFIX, MIN_BLOCKS)                                             \
    extern "C" __global__ void __launch_bounds__(GEMM_KSPLIT * 32, MIN_BLOCKS) NAME##_m##MT##_n##NT##_##SUFFIX(     \
        const bf16_t* __restrict__ x, long long ldx, const int* __restrict__ x_rows,                                  \
        const unsigned char* __restrict__ w, bf16_t* __restrict__ out, long long ldo, const int* __restrict__ tiles,  \
        int max_tiles, const int* __restrict__ ids, int pairs_per_row, int E, int N, int K, int relu2) {               \
        await_inputs();                                                                                                \
        expert_product<MT, NT, U, VEC, W>(x, ldx, x_rows, W{w}, out, ldo, tiles, max_tiles, ids, pairs_per_row, E, N, \
                                          K, relu2);                                                                  \
    }
#define MOE_GEMM_KERNEL(MT, NT, U, U_FP8, VEC, SUFFIX, MIN_BLOCKS)                                                   \
    extern "C" __global__ void __launch_bounds__(GEMM_KSPLIT * 32, MIN_BLOCKS) moe_gemm_m##MT##_n##NT##_##SUFFIX( \
        const bf16_t* __restrict__ x, long long ldx, const int* __restrict__ x_rows, const bf16_t* __restrict__ w,    \
        bf16_t* __restrict__ out, long long ldo, const int* __restrict__ tiles, int max_tiles,                        \
        const int* __restrict__ ids, int pairs_per_row, int E, int N, int K, int relu2) { await_inputs();             \
        expert_product<MT, NT, U, VEC, const bf16_t*>(x, ldx, x_rows, w, out, ldo, tiles, max_tiles, ids,             \
                                                      pairs_per_row, E, N, K, relu2);                                 \
    }                                                                                                                 \
    MOE_GEMM_QUANTIZED_KERNELS(MT, NT, U_FP8, VEC, SUFFIX, MIN_BLOCKS)
#define MOE_GEMM_QUANTIZED_KERNELS(MT, NT, U_FP8, VEC, SUFFIX, MIN_BLOCKS)                                          \
    extern "C" __global__ void __launch_bounds__(GEMM_KSPLIT * 32, MIN_BLOCKS) moe_gemm_fp8_m##MT##_n##NT##_##SUFFIX( \
        const bf16_t* __restrict__ x, long long ldx, const int* __restrict__ x_rows,                                  \
        const unsigned char* __restrict__ w, const float* __restrict__ scales, int bn, int bk,                        \
        bf16_t* __restrict__ out, long long ldo, const int* __restrict__ tiles, int max_tiles,                        \
        const int* __restrict__ ids, int pairs_per_row, int E, int N, int K, int relu2) { await_inputs();             \
        expert_product<MT, NT, U_FP8, VEC, Fp8Weight>(x, ldx, x_rows, Fp8Weight{w, scales, bn, bk}, out, ldo, tiles,  \
                                                      max_tiles, ids, pairs_per_row, E, N, K, relu2);                 \
    }                                                                                                                 \
    MOE_GEMM_ROWS_KERNEL(moe_gemm_nvfp4, Nvfp4Weight, MT, NT, U_FP8, VEC, SUFFIX, MIN_BLOCKS)                        \
    MOE_GEMM_ROWS_KERNEL(moe_gemm_gguf_q8_0, Q8_0Weight, MT, NT, U_FP8, VEC, SUFFIX, MIN_BLOCKS)

#ifndef GGUF_TYPE
MOE_GEMM_KERNEL(1, 2, 8, 4, true, vec, 2)
MOE_GEMM_QUANTIZED_KERNELS(1, 2, 4, VEC_LOW8, vec8, 2)
MOE_GEMM_QUANTIZED_KERNELS(1, 4, 2, VEC_LOW8, vec8, 2)
MOE_GEMM_KERNEL(1, 4, 4, 2, true, vec, 2)
MOE_GEMM_KERNEL(2, 4, 2, 2, true, vec, 1)
MOE_GEMM_KERNEL(1, 2, 4, 4, false, any, 2)
MOE_GEMM_KERNEL(1, 4, 2, 2, false, any, 2)
MOE_GEMM_KERNEL(2, 4, 2, 2, false, any, 1)
#else
// Built with GGUF_TYPE (registry dtype gguf_q4_0 ... gguf_q6_k): that format's expert products, the same tiles.
#define MOE_GGUF_KERNELS(NAME, W)                                 \
    MOE_GEMM_ROWS_KERNEL(moe_##NAME, W, 1, 2, 4, VEC_LOW8, vec8, 2) \
    MOE_GEMM_ROWS_KERNEL(moe_##NAME, W, 1, 4, 2, VEC_LOW8, vec8, 2) \
    MOE_GEMM_ROWS_KERNEL(moe_##NAME, W, 1, 2, 4, true, vec, 2)      \
    MOE_GEMM_ROWS_KERNEL(moe_##NAME, W, 1, 4, 2, true, vec, 2)      \
    MOE_GEMM_ROWS_KERNEL(moe_##NAME, W, 2, 4, 2, true, vec, 1)      \
    MOE_GEMM_ROWS_KERNEL(moe_##NAME, W, 1, 2, 4, false, any, 2)     \
    MOE_GEMM_ROWS_KERNEL(moe_##NAME, W, 1, 4, 2, false, any, 2)     \
    MOE_GEMM_ROWS_KERNEL(moe_##NAME, W, 2, 4, 2, false, any, 1)
GGUF_KERNELS(MOE_GGUF_KERNELS)
#endif

// Prefill-sized expert groups (outside the batch-invariant mode): the m-tiles of moe_plan cut at 64 rows, each
// block 64 rows of one expert by TG_BN columns through gemm_tiled.cuh's tiled product (rows gathered through
// x_rows, written to their own rows; relu2 as above). grid.x: column tiles; grid.y: max_tiles.
extern "C" __global__ void __launch_bounds__(TG_THREADS, 2)
    moe_gemm_tiled(const bf16_t* __restrict__ x, long long ldx, const int* __restrict__ x_rows,
                   const bf16_t* __restrict__ w, bf16_t* __restrict__ out, long long ldo, const int* __restrict__ tiles,
                   int max_tiles, int E, int N, int K, int relu2) {
    await_inputs();
    ExpertBlock b;
    if (!expert_block(tiles, max_tiles, nullptr, 1, E, b)) return;
    tiled_product<2>(x, ldx, x_rows, bank_matrix(w, b.e, N, K), nullptr, out, ldo, b.m0, b.M, blockIdx.x * TG_BN, N,
                     K, relu2);
}

// ---- combine --------------------------------------------------------------------------------------
// out[t, c] = sum_j weights[t, j] * y[row(t * k + j), c] in slot order, fp32 -> bf16. The row of pair p is
// pair_rows[p] (grouped products) or p itself (direct products: pair_rows null); -1, or an expert id outside
// [0, E), is none. grid (ceil(H / blockDim.x), T): a thread per output element.
extern "C" __global__ void moe_combine(const bf16_t* __restrict__ y, long long ldy, const int* __restrict__ pair_rows,
                                       const int* __restrict__ ids, int E, const float* __restrict__ weights,
                                       bf16_t* __restrict__ out, long long ldo, int k, int H) {
    await_inputs();
    const int t = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= H) return;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) {
        const long long p = (long long)t * k + j;
        const int row = pair_rows ? pair_rows[p] : (ids[p] >= 0 && ids[p] < E ? (int)p : -1);
        if (row >= 0) acc = __fmaf_rn(weights[p], bf16_to_float(y[(long long)row * ldy + c]), acc);
    }
    out[(long long)t * ldo + c] = float_to_bf16(acc);
}
