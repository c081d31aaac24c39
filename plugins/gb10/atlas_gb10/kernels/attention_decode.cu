// Decode attention on the tensor cores (outside the batch-invariant mode): the 16-row work items of attention.cu
// (the (query token, head of the GQA group) rows of a decode token, or of a few tokens of a verify step) over
// bf16 or fp8 caches, in attention.cu's split mode (one 64-key split a block, its partials to the workspace that
// `attention_combine` merges) or direct mode (the block walks its splits and merges them itself).
//
// Each of the 4 warps takes 16 of the split's 64 keys: S = Q K^T with mma.sync.m16n8k16 (fragments by ldmatrix),
// attention.cu's masks, the softmax of its 16 keys in registers, and O = P V with P rounded to bf16. The block
// then merges the warps' (max, sum, O) in warp order into the split's, with the split's max in natural-log
// units as attention.cu writes it; direct mode folds the splits in order with `merge_factors` / `merge_value`,
// as `attention_combine` does. So both modes give the same bits, and a row's result depends on its row and
// its keys alone. The arithmetic is not attention.cu's (tensor-core dot products, P in bf16), which is why
// the batch-invariant mode keeps that kernel. Head dims: 16 * DK (64, 128, 256).
#include "gemm_core.cuh"
#include "mma_frags.cuh"
#include "paged_kv.cuh"

#define DEC_KEYS 64  // keys of a split (attention.cu's ATT_SPLIT), 16 a warp
#define DEC_ROWS 16
#define DEC_WARPS 4
#define DEC_THREADS (32 * DEC_WARPS)
#define LN2 0.6931471805599453f

// Shared memory, in order: the split's KV slots [DEC_KEYS]; per warp and row the max (log2 units) and sum of its
// keys and the factor that brings its output to the split's max [3][DEC_WARPS][DEC_ROWS]; per row direct mode's
// running (max, sum) and the factors of the merge in progress [4][DEC_ROWS]; the rows' positions [2][DEC_ROWS];
// the query rows [DEC_ROWS][16 DK + 8]; the key and value tiles [2][DEC_KEYS][16 DK + 8], which the warps'
// fp32 outputs [DEC_WARPS][DEC_ROWS][16 DK + 8] overwrite once the products are done; fp8 caches then stage
// the tile's bytes [2][DEC_KEYS][16 DK + 8]. `decode_shared_bytes` in attention_decode.py mirrors it.
template <int DK>
__device__ __forceinline__ void attention_decode_body(ATTENTION_PARAMS) {
    extern __shared__ __align__(16) unsigned char smem[];
    constexpr int D_PAD = 16 * DK;
    constexpr int STRIDE = D_PAD + 8;  // padded rows: conflict-free ldmatrix and fp32 row writes
    constexpr int PER_THREAD = DEC_ROWS * D_PAD / DEC_THREADS;  // output elements a thread merges
    long long* kslot = reinterpret_cast<long long*>(smem);
    float* warp_m = reinterpret_cast<float*>(kslot + DEC_KEYS);
    float* warp_l = warp_m + DEC_WARPS * DEC_ROWS;
    float* warp_f = warp_l + DEC_WARPS * DEC_ROWS;
    float* run_m = warp_f + DEC_WARPS * DEC_ROWS;
    float* run_l = run_m + DEC_ROWS;
    float* fac_run = run_l + DEC_ROWS;
    float* fac_split = fac_run + DEC_ROWS;
    int* qpos = reinterpret_cast<int*>(fac_split + DEC_ROWS);
    int* qlast = qpos + DEC_ROWS;
    bf16_t* Qs = reinterpret_cast<bf16_t*>(qlast + DEC_ROWS);
    bf16_t* Ks = Qs + DEC_ROWS * STRIDE;
    bf16_t* Vs = Ks + DEC_KEYS * STRIDE;
    float* Ow = reinterpret_cast<float*>(Ks);
#if KV_FP8
    kv_t* Kst = reinterpret_cast<kv_t*>(Vs + DEC_KEYS * STRIDE);
    kv_t* Vst = Kst + DEC_KEYS * STRIDE;
#else
    kv_t* Kst = Ks;
    kv_t* Vst = Vs;
#endif

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const BlockWork bw = block_work(work, query_start, seq_lens, block_tables, table_width, q_heads, kv_heads,
                                    DEC_ROWS, window, visible_end);
    if (bw.w.rows <= 0) return;
    const int q_begin = bw.w.q_begin, tile_tok = bw.w.tile_tok, rows = bw.w.rows, key_start = bw.w.key_start;
    const int key_end = bw.w.key_end, hk = bw.hk, group = bw.group, only_split = bw.split;
    auto ws_at = [&](int r, int s) {  // row r's split s in the workspace: ((token, head) row) x splits + s
        return ((q_begin + tile_tok + r / group) * (long long)q_heads + hk * group + r % group) * splits + s;
    };
    row_positions<DEC_THREADS>(qpos, qlast, bw.w, DEC_ROWS, visible_end, tid);
    reset_running<DEC_THREADS>(run_m, run_l, DEC_ROWS, tid);
    load_q_rows<DEC_THREADS>(Qs, STRIDE, q, q_s0, q_s1, q_begin + tile_tok, DEC_ROWS, rows, group, hk, d, D_PAD / 8,
                             q_vec, tid);
    const int2 split_span = split_range(bw, DEC_KEYS);
    float O[PER_THREAD];  // direct mode: element tid + DEC_THREADS * i of the [DEC_ROWS, D_PAD] output
#pragma unroll
    for (int i = 0; i < PER_THREAD; ++i) O[i] = 0.0f;
    const int g = lane >> 2, qd = lane & 3, r0 = g, r1 = g + 8;
    const float scale2 = scale * LOG2E;  // scores in log2 units: exp2f

    for (int s = split_span.x; s <= split_span.y; ++s) {
        const int first = s * DEC_KEYS;
        const bool keys = first < key_end && first + DEC_KEYS > key_start;  // the same in every thread
        __syncthreads();  // the previous split's merge is done with the tile (Ow) and the factors
        if (keys) tile_slots<DEC_KEYS, DEC_THREADS>(kslot, bw.table, first, key_start, key_end, block_size, tid);
        __syncthreads();
        if (keys) load_kv_tile<DEC_KEYS, DEC_THREADS>(Kst, Vst, kslot, k_cache, v_cache, kv_heads, hk, d, D_PAD, STRIDE, tid);
        cp_async_commit();
        cp_async_wait_all();  // the query rows' copies too
        __syncthreads();
        if (!keys) {  // split mode: no key of this split is seen by any row
            if (only_split >= 0)
                for (int r = tid; r < rows; r += DEC_THREADS) ws_ml[ws_at(r, s)] = make_float2(NEG_INF, 0.0f);
            continue;
        }
#if KV_FP8
        unstage_kv_tile<DEC_KEYS, DEC_THREADS>(Ks, Vs, Kst, Vst, D_PAD, STRIDE, tid);
        __syncthreads();
#endif
        // ---- S = Q K^T for this warp's 16 keys: two n-tiles of 8
        float sc[2][4];
#pragma unroll
        for (int n = 0; n < 2; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < DK; ++kk) {
            unsigned a[4], kb[4];
            ldmatrix_x4(a, Qs + (lane & 15) * STRIDE + kk * 16 + (lane >> 4) * 8);
            ldmatrix_x4(kb, Ks + (warp * 16 + (lane & 7) + ((lane >> 4) << 3)) * STRIDE + kk * 16 + ((lane >> 3) & 1) * 8);
            mma_16816(sc[0], a[0], a[1], a[2], a[3], kb[0], kb[1]);
            mma_16816(sc[1], a[0], a[1], a[2], a[3], kb[2], kb[3]);
        }
        // ---- masks and the softmax of rows r0 (sc[.][0..1]) and r1 (sc[.][2..3]) over the warp's keys
        const RowMasks masks{key_start, qlast[r0], qlast[r1], qpos[r0], qpos[r1], window};
        float mx0, mx1;
        mask_scores<2>(sc, first + warp * 16, qd, masks, mx0, mx1);
        const float m0 = quad_max(mx0) * scale2, m1 = quad_max(mx1) * scale2;
        const float base0 = m0 == NEG_INF ? 0.0f : m0, base1 = m1 == NEG_INF ? 0.0f : m1;
        unsigned pa[2][2];
        float sum0, sum1;
        exp2_pack<2>(sc, scale2, base0, base1, pa, sum0, sum1);
        const float l0 = quad_sum(sum0), l1 = quad_sum(sum1);
        // ---- this warp's O = P V: one k-step of its 16 keys, 2 * DK n-tiles of 8 dims
        float o[2 * DK][4];
#pragma unroll
        for (int n = 0; n < 2 * DK; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
#pragma unroll
        for (int nd = 0; nd < DK; ++nd) {
            unsigned vb[4];
            ldmatrix_x4_trans(vb, Vs + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * STRIDE + nd * 16 + (lane >> 4) * 8);
            mma_16816(o[2 * nd], pa[0][0], pa[0][1], pa[1][0], pa[1][1], vb[0], vb[1]);
            mma_16816(o[2 * nd + 1], pa[0][0], pa[0][1], pa[1][0], pa[1][1], vb[2], vb[3]);
        }
        if (qd == 0) {
            warp_m[warp * DEC_ROWS + r0] = m0;
            warp_m[warp * DEC_ROWS + r1] = m1;
            warp_l[warp * DEC_ROWS + r0] = l0;
            warp_l[warp * DEC_ROWS + r1] = l1;
        }
        __syncthreads();  // every warp is done with the key and value tiles: their memory takes the outputs
        float* mine = Ow + warp * DEC_ROWS * STRIDE;
#pragma unroll
        for (int n = 0; n < 2 * DK; ++n) {
            const int col = n * 8 + 2 * qd;
            *reinterpret_cast<float2*>(mine + r0 * STRIDE + col) = make_float2(o[n][0], o[n][1]);
            *reinterpret_cast<float2*>(mine + r1 * STRIDE + col) = make_float2(o[n][2], o[n][3]);
        }
        if (tid < DEC_ROWS) {  // the split's statistics of row tid and each warp's factor, in warp order
            const int r = tid;
            float M = NEG_INF, L = 0.0f;
#pragma unroll
            for (int v = 0; v < DEC_WARPS; ++v) M = fmaxf(M, warp_m[v * DEC_ROWS + r]);
#pragma unroll
            for (int v = 0; v < DEC_WARPS; ++v) {
                const float f = M == NEG_INF ? 0.0f : exp2f(warp_m[v * DEC_ROWS + r] - M);
                warp_f[v * DEC_ROWS + r] = f;
                L = __fmaf_rn(warp_l[v * DEC_ROWS + r], f, L);
            }
            const float m_split = M == NEG_INF ? NEG_INF : M * LN2;
            if (only_split >= 0) {
                if (r < rows) ws_ml[ws_at(r, s)] = make_float2(m_split, L);
            } else if (m_split != NEG_INF) {
                float a, bb, M_new;
                merge_factors(run_m[r], m_split, &a, &bb, &M_new);
                run_l[r] = merge_value(run_l[r], a, L, bb);
                run_m[r] = M_new;
                fac_run[r] = a;
                fac_split[r] = bb;
            } else {  // no key of the split for this row: the running output stays as it is
                fac_run[r] = 1.0f;
                fac_split[r] = 0.0f;
            }
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < PER_THREAD; ++i) {
            const int e = tid + DEC_THREADS * i, r = e / D_PAD, col = e - r * D_PAD;
            float acc = 0.0f;
#pragma unroll
            for (int v = 0; v < DEC_WARPS; ++v)
                acc = __fmaf_rn(Ow[(v * DEC_ROWS + r) * STRIDE + col], warp_f[v * DEC_ROWS + r], acc);
            if (only_split < 0) {
                O[i] = merge_value(O[i], fac_run[r], acc, fac_split[r]);
            } else if (r < rows && col < d) {
                ws_acc[ws_at(r, s) * d + col] = acc;
            }
        }
    }
    cp_async_wait_all();  // without splits, nothing waited for the query rows' copies
    if (only_split < 0) {
        __syncthreads();
#pragma unroll
        for (int i = 0; i < PER_THREAD; ++i) {
            const int e = tid + DEC_THREADS * i, r = e / D_PAD, col = e - r * D_PAD;
            if (r < rows && col < d) {
                const long long t = q_begin + tile_tok + r / group;
                out[t * o_s0 + (long long)(hk * group + r % group) * o_s1 + col] =
                    normalized_output(O[i], run_l[r], v_scale);
            }
        }
    }
}

#define ATTENTION_DECODE_KERNEL(DK)                                                                                   \
    extern "C" __global__ void __launch_bounds__(DEC_THREADS) attention_decode_d##DK(ATTENTION_PARAMS) {              \
        await_inputs();                                                                                               \
        attention_decode_body<DK>(ATTENTION_ARGS);                                                                    \
    }

ATTENTION_DECODE_KERNEL(4)
ATTENTION_DECODE_KERNEL(8)
ATTENTION_DECODE_KERNEL(16)
