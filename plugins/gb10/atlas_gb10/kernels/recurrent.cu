// Kernels of the recurrent layers (atlas_core/backends/ops/gated_delta.py and mamba2.py): the short causal
// convolution with SiLU, the gated delta rule, the Mamba-2 selective scan, their gated RMSNorms, the gated
// delta net's gates and the squared ReLU of the Mamba-2 hybrids' MLPs.
//
// A batch's sequence b owns rows starts[b] .. starts[b+1] and the state rows of slot slots[b]; a slot of -1
// (a padding row of a captured decode graph) reads a zero state and writes nothing. Where the recurrent kernels
// get `checkpoints` (null: none), the state after row t is also written to slot checkpoints[t] when that is not
// -1 (speculative decoding's draft positions, atlas_core/backends/ops/checkpoints.py). The recurrences run
// sequentially in time within a sequence, in parallel over sequences, heads and state columns. Every
// kernel computes a sequence with a thread layout that depends only on the layer's sizes, never on the
// batch, and keeps the state in fp32, so a sequence's values are the same bits alone or batched, eager or
// replayed in a graph, in one call or in prefill chunks.
#include "recurrent_gates.cuh"

#define CONV_MAX_K 8       // causal conv taps
#define GDN_ROWS 16        // delta-rule state rows (key dims) per thread: a block has ceil(Dk / 16) warps
#define GDN_MAX_WARPS 8    // so Dk <= 128
#define GDN_L2_EPS 1e-6f
#define SSM_ROWS 8         // Mamba-2 state rows (head dims) per warp
#define SSM_WARPS 4
#ifndef CHECKPOINTED_TOKENS
#define CHECKPOINTED_TOKENS 64  // a sequence with checkpoints has fewer tokens in a call (the registry passes core's)
#endif

// ---- causal conv1d + SiLU ------------------------------------------------------------------------------
// x [T, C] (row stride ldx), weight [C, K], bias [C] or null, state [S, C, K-1] (the last K-1 inputs,
// oldest first), out [T, C] contiguous. A window win[CONV_MAX_K - 1 - j] holds the input j steps back and
// tap[j] = weight[c, K-1-j] multiplies it; the sum runs oldest tap first.
__device__ __forceinline__ void conv_taps(const bf16_t* __restrict__ weight, int c, int taps, float (&tap)[CONV_MAX_K]) {
#pragma unroll
    for (int j = 0; j < CONV_MAX_K; ++j) tap[j] = j < taps ? bf16_to_float(weight[(long long)c * taps + taps - 1 - j]) : 0.0f;
}

__device__ __forceinline__ float conv_output(const float (&win)[CONV_MAX_K], const float (&tap)[CONV_MAX_K], int taps,
                                             float bias) {
    float acc = 0.0f;
#pragma unroll
    for (int j = CONV_MAX_K - 1; j >= 0; --j)
        if (j < taps) acc = __fmaf_rn(win[CONV_MAX_K - 1 - j], tap[j], acc);
    return silu_f(__fadd_rn(acc, bias));
}

// The sequence of a row: the b with starts[b] <= row < starts[b + 1] (empty sequences are skipped).
__device__ __forceinline__ int sequence_of(const int* __restrict__ starts, int num_seqs, int row) {
    int lo = 0, hi = num_seqs;
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (starts[mid] <= row) lo = mid; else hi = mid;
    }
    return lo;
}

// The last K-1 inputs of a window into a state row (oldest first).
__device__ __forceinline__ void store_window(const float (&win)[CONV_MAX_K], bf16_t* __restrict__ row, int taps) {
#pragma unroll
    for (int i = 0; i < CONV_MAX_K - 1; ++i)
        if (i < taps - 1) row[taps - 2 - i] = float_to_bf16(win[CONV_MAX_K - 1 - i]);
}

// A thread per (channel, sequence) walks the sequence's rows with the window in registers, writes every
// output when `outputs` (decode-sized batches), stores the windows of checkpointed rows, and leaves the last
// K-1 inputs in the state row. Without `outputs` it only updates the state (and the checkpoints of sequences
// short enough to have them), after conv1d_tokens_bf16 has written the outputs. Grid (ceil(C / blockDim), B).
extern "C" __global__ void conv1d_sequences_bf16(const bf16_t* __restrict__ x, long long ldx,
                                                 const bf16_t* __restrict__ weight, const bf16_t* __restrict__ bias,
                                                 bf16_t* __restrict__ state, const int* __restrict__ starts,
                                                 const int* __restrict__ slots, bf16_t* __restrict__ out, int channels,
                                                 int taps, int outputs, const int* __restrict__ checkpoints) {
    await_inputs();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= channels) return;
    const int r0 = starts[blockIdx.y], r1 = starts[blockIdx.y + 1];
    const long long slot = slots[blockIdx.y];
    if (!outputs && (slot < 0 || r1 <= r0)) return;
    bf16_t* row = slot >= 0 ? state + (slot * channels + c) * (taps - 1) : nullptr;
    float win[CONV_MAX_K], tap[CONV_MAX_K];
    conv_taps(weight, c, taps, tap);
#pragma unroll
    for (int i = 0; i < CONV_MAX_K; ++i)
        win[CONV_MAX_K - 1 - i] = (row && i < taps - 1) ? bf16_to_float(row[taps - 2 - i]) : 0.0f;
    const float bias_c = bias ? bf16_to_float(bias[c]) : 0.0f;
    const bool walk_all = outputs || (checkpoints && r1 - r0 < CHECKPOINTED_TOKENS);
    for (long long t = walk_all ? r0 : max(r0, r1 - (taps - 1)); t < r1; ++t) {
#pragma unroll
        for (int j = 0; j < CONV_MAX_K - 1; ++j) win[j] = win[j + 1];
        win[CONV_MAX_K - 1] = bf16_to_float(x[t * ldx + c]);
        if (outputs) out[t * channels + c] = float_to_bf16(conv_output(win, tap, taps, bias_c));
        const long long checkpoint = checkpoints ? checkpoints[t] : -1;
        if (checkpoint >= 0) store_window(win, state + (checkpoint * channels + c) * (taps - 1), taps);
    }
    if (row && r1 > r0) store_window(win, row, taps);
}

// A thread per (channel, row) for prefill-sized batches: reads its K inputs from x, or from the state for
// steps before the sequence's first row; never writes the state. Grid (ceil(C / blockDim), min(T, 65535)).
extern "C" __global__ void conv1d_tokens_bf16(const bf16_t* __restrict__ x, long long ldx, const bf16_t* __restrict__ weight,
                                              const bf16_t* __restrict__ bias, const bf16_t* __restrict__ state,
                                              const int* __restrict__ starts, const int* __restrict__ slots,
                                              bf16_t* __restrict__ out, int channels, int taps, int num_seqs, int tokens) {
    await_inputs();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= channels) return;
    float tap[CONV_MAX_K];
    conv_taps(weight, c, taps, tap);
    const float bias_c = bias ? bf16_to_float(bias[c]) : 0.0f;
    for (int t = blockIdx.y; t < tokens; t += gridDim.y) {
        const int b = sequence_of(starts, num_seqs, t);
        const int r0 = starts[b];
        const long long slot = slots[b];
        float win[CONV_MAX_K];
#pragma unroll
        for (int j = 0; j < CONV_MAX_K; ++j) {
            float value = 0.0f;
            if (j < taps) {
                const int row = t - j;
                if (row >= r0) value = bf16_to_float(x[(long long)row * ldx + c]);
                else if (slot >= 0) value = bf16_to_float(state[(slot * channels + c) * (taps - 1) + taps - 1 - (r0 - row)]);
            }
            win[CONV_MAX_K - 1 - j] = value;
        }
        out[(long long)t * channels + c] = float_to_bf16(conv_output(win, tap, taps, bias_c));
    }
}

// ---- gated delta net -----------------------------------------------------------------------------------
// g = -exp(a_log) * softplus(a + dt_bias), beta = sigmoid(b); a, b [rows, H] (row strides lda, ldb),
// a_log, dt_bias [H] fp32 -> g, beta [rows, H] fp32.
extern "C" __global__ void gdn_gates_bf16(const bf16_t* __restrict__ a, long long lda, const bf16_t* __restrict__ b,
                                          long long ldb, const float* __restrict__ a_log, const float* __restrict__ dt_bias,
                                          float* __restrict__ g, float* __restrict__ beta, int heads, long long rows) {
    await_inputs();
    const long long total = rows * heads;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / heads;
        const int h = (int)(i - r * heads);
        g[i] = gdn_decay(a[r * lda + h], a_log[h], dt_bias[h]);
        beta[i] = gdn_beta(b[r * ldb + h]);
    }
}

// The gated delta rule, recurrent form. A block per (32 value dims, value head h, sequence b): lane = value
// dim j, warp w keeps state rows i = 16 w .. 16 w + 15 of column j in registers for the whole sequence.
// Per token, q and k are staged in shared memory (double-buffered; the next token's inputs are loaded
// while this one computes) and every warp takes their norms itself. With e = exp(g) and q, k normalised
// (q times scale), the update S = e S; S += k (x) beta (v - k.S); o = q.S is evaluated as
//     Sk_j = sum_i k_i S_ij, Sq_j = sum_i q_i S_ij       (the state before the token; partial sums per warp,
//                                                         added over the warps in a fixed order)
//     delta_j = beta (v_j - e Sk_j);  o_j = e Sq_j + (q.k) delta_j;  S_ij = e S_ij + k_i delta_j
// q, k [T, Hk, Dk] and v [T, Hv, Dv] strided (s0 token, s1 head; dims contiguous), the gates as GdnGates reads
// them (recurrent_gates.cuh), state [S, Hv, Dk, Dv] fp32, out [T, Hv, Dv]. Value head h reads key head h / (Hv / Hk).
// Sequences of at least `chunk_from` tokens are left to chunked_scan.cu (INT_MAX: none).
//
// NORMED (the _normed kernels): out is the rule's output o through the layer's gated RMSNorm instead,
// o / rms(o) * norm_w * silu(z) over the Dv dims of a head (rms_norm_silu_gate with the bits of
// gated_rms_norm_bf16: o rounded to bf16 first, lane l summing dims l, l + 32, ... in order). The CLUSTER blocks
// of a head (CLUSTER = ceil(Dv / 32), a thread-block cluster on sm_90 and later) hand each other their 32 dims of
// o through distributed shared memory, one cluster barrier a token. z [T, Hv, Dv] strided (z_s0, z_s1).
template <int CLUSTER>
__device__ __forceinline__ void gated_delta_tokens(
    const bf16_t* __restrict__ q, long long q_s0, long long q_s1, const bf16_t* __restrict__ k, long long k_s0,
    long long k_s1, const bf16_t* __restrict__ v, long long v_s0, long long v_s1, const GdnGates& gates,
    float* __restrict__ state, const int* __restrict__ starts, const int* __restrict__ slots, bf16_t* __restrict__ out,
    int key_heads, int value_heads, int dk, int dv, float scale, int l2norm, int chunk_from,
    const int* __restrict__ checkpoints, const GdnNorm& norm) {
    __shared__ float qs[2][GDN_ROWS * GDN_MAX_WARPS], ks[2][GDN_ROWS * GDN_MAX_WARPS];
    __shared__ float partial[2][GDN_MAX_WARPS][32];
    __shared__ float normed[2][32];  // this block's 32 dims of o, by token parity (NORMED with CLUSTER > 1)
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
    const int j = blockIdx.x * 32 + lane, h = blockIdx.y, kh = h / (value_heads / key_heads);
    const int r0 = starts[blockIdx.z], r1 = starts[blockIdx.z + 1];
    if (r1 <= r0 || r1 - r0 >= chunk_from) return;
    const long long slot = slots[blockIdx.z];
    const bool column = j < dv;
    float* rows = slot >= 0 ? state + (slot * value_heads + h) * (long long)dk * dv : nullptr;
    float s[GDN_ROWS];
    auto store = [&](float* __restrict__ to) {  // this thread's rows of the state
#pragma unroll
        for (int r = 0; r < GDN_ROWS; ++r) {
            const int i = warp * GDN_ROWS + r;
            if (i < dk) to[(long long)i * dv + j] = s[r];
        }
    };
#pragma unroll
    for (int r = 0; r < GDN_ROWS; ++r) {
        const int i = warp * GDN_ROWS + r;
        s[r] = (rows && column && i < dk) ? rows[(long long)i * dv + j] : 0.0f;
    }
    float nq = 0.0f, nk = 0.0f, nv = 0.0f, ng = 0.0f, nb = 0.0f;  // the next token's inputs
    auto load = [&](long long t) {
        if (tid < dk) {
            nq = bf16_to_float(q[t * q_s0 + kh * q_s1 + tid]);
            nk = bf16_to_float(k[t * k_s0 + kh * k_s1 + tid]);
        }
        nv = column ? bf16_to_float(v[t * v_s0 + h * v_s1 + j]) : 0.0f;
        ng = gates.decay(t, h, value_heads);
        nb = gates.strength(t, h, value_heads);
    };
    load(r0);
    for (long long t = r0; t < r1; ++t) {
        const int p = (int)((t - r0) & 1);
        if (tid < dk) {
            qs[p][tid] = nq;
            ks[p][tid] = nk;
        }
        const float vj = nv, e = expf(ng), bt = nb;
        if (t + 1 < r1) load(t + 1);
        __syncthreads();
        float qq = 0.0f, kk = 0.0f, qk = 0.0f;
        for (int i = lane; i < dk; i += 32) {
            const float a = qs[p][i], c = ks[p][i];
            qq = __fmaf_rn(a, a, qq);
            kk = __fmaf_rn(c, c, kk);
            qk = __fmaf_rn(a, c, qk);
        }
        const float qn = l2norm ? scale / sqrtf(__fadd_rn(warp_sum(qq), GDN_L2_EPS)) : scale;
        const float kn = l2norm ? 1.0f / sqrtf(__fadd_rn(warp_sum(kk), GDN_L2_EPS)) : 1.0f;
        qk = warp_sum(qk) * qn * kn;
        float sk = 0.0f, sq = 0.0f;
#pragma unroll
        for (int r = 0; r < GDN_ROWS; ++r) {
            const int i = warp * GDN_ROWS + r;
            if (i < dk) {
                sk = __fmaf_rn(ks[p][i], s[r], sk);
                sq = __fmaf_rn(qs[p][i], s[r], sq);
            }
        }
        partial[0][warp][lane] = sk;
        partial[1][warp][lane] = sq;
        __syncthreads();
        sk = 0.0f;
        sq = 0.0f;
        for (int w = 0; w < warps; ++w) {
            sk = __fadd_rn(sk, partial[0][w][lane]);
            sq = __fadd_rn(sq, partial[1][w][lane]);
        }
        const float delta = bt * (vj - e * kn * sk);
        const float o = __fmaf_rn(qk, delta, e * qn * sq);
#pragma unroll
        for (int r = 0; r < GDN_ROWS; ++r) {
            const int i = warp * GDN_ROWS + r;
            if (i < dk) s[r] = __fmaf_rn(e, s[r], ks[p][i] * kn * delta);
        }
        const long long checkpoint = checkpoints ? checkpoints[t] : -1;
        if (checkpoint >= 0 && column) store(state + (checkpoint * value_heads + h) * (long long)dk * dv);
        if constexpr (CLUSTER == 0) {
            if (warp == 0 && column) out[(t * value_heads + h) * dv + j] = float_to_bf16(o);
        } else {
            const float hv = column ? bf16_to_float(float_to_bf16(o)) : 0.0f;
            if constexpr (CLUSTER > 1) {
                if (warp == 0) normed[p][lane] = hv;
                cluster_sync();
            }
            if (warp == 0) {
                float sumsq = 0.0f;
#pragma unroll
                for (int b = 0; b < CLUSTER; ++b) {
                    const float x = CLUSTER > 1 ? cluster_load(&normed[p][lane], b) : hv;
                    if (b * 32 + lane < dv) sumsq = __fmaf_rn(x, x, sumsq);
                }
                const float inv = 1.0f / sqrtf(__fadd_rn(__fdiv_rn(warp_sum(sumsq), (float)dv), norm.eps));
                if (column) {
                    const float gv = silu_f(bf16_to_float(norm.z[t * norm.z_s0 + h * norm.z_s1 + j]));
                    out[(t * value_heads + h) * dv + j] = float_to_bf16(hv * inv * bf16_to_float(norm.weight[j]) * gv);
                }
            }
        }
    }
    if (rows && column) store(rows);
    if constexpr (CLUSTER > 1) cluster_sync();  // no block leaves while the others may read its dims
}

#define GATED_DELTA_RULE_PARAMS                                                                                       \
    const bf16_t *__restrict__ q, long long q_s0, long long q_s1, const bf16_t *__restrict__ k, long long k_s0,      \
        long long k_s1, const bf16_t *__restrict__ v, long long v_s0, long long v_s1, GDN_GATE_PARAMS,                \
        float *__restrict__ state, const int *__restrict__ starts, const int *__restrict__ slots,                     \
        bf16_t *__restrict__ out, int key_heads, int value_heads, int dk, int dv, float scale, int l2norm,            \
        int chunk_from, const int *__restrict__ checkpoints
#define GATED_DELTA_RULE_ARGS                                                                                         \
    q, q_s0, q_s1, k, k_s0, k_s1, v, v_s0, v_s1, GDN_GATES, state, starts, slots, out, key_heads, value_heads, dk, dv, \
        scale, l2norm, chunk_from, checkpoints

extern "C" __global__ void __launch_bounds__(GDN_MAX_WARPS * 32, 1) gated_delta_rule_bf16(GATED_DELTA_RULE_PARAMS) {
    await_inputs();
    gated_delta_tokens<0>(GATED_DELTA_RULE_ARGS, GdnNorm{});
}

#define GATED_DELTA_RULE_NORMED(C, CLUSTER_ATTRIBUTE)                                                                 \
    extern "C" __global__ void __launch_bounds__(GDN_MAX_WARPS * 32, 1) CLUSTER_ATTRIBUTE                             \
        gated_delta_rule_normed_c##C##_bf16(GATED_DELTA_RULE_PARAMS, const bf16_t* __restrict__ z, long long z_s0,     \
                                            long long z_s1, const bf16_t* __restrict__ norm_w, float eps) {           \
        await_inputs();                                                                                               \
        gated_delta_tokens<C>(GATED_DELTA_RULE_ARGS, GdnNorm{z, z_s0, z_s1, norm_w, eps});                            \
    }
GATED_DELTA_RULE_NORMED(1, )
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
GATED_DELTA_RULE_NORMED(2, __cluster_dims__(2, 1, 1))
GATED_DELTA_RULE_NORMED(4, __cluster_dims__(4, 1, 1))
#endif


// ---- Mamba-2 selective scan ----------------------------------------------------------------------------
// Per token of a sequence and head h: delta = clip(softplus(dt + dt_bias), dt_min, dt_max);
// state = exp(delta A) state + delta x (x) B; y = state.C + D x. A warp owns SSM_ROWS head dims p of one
// head and keeps their state rows [p, n] in registers (lane holds n = lane + 32 m, m < NPL), so warps
// never wait for each other; y_p is a warp sum. The next token's inputs are loaded while this one computes.
// x [T, Hm, P] (strides x_s0, x_s1), dt [T, Hm] (row stride dt_s0), B / C [T, G, N] (strides s0, s1),
// A / D / dt_bias [Hm] fp32, state [S, Hm, P, N] fp32, out [T, Hm, P]. starts == null: sequence b is row b
// (decode). Sequences of at least `chunk_from` tokens are left to chunked_scan.cu (INT_MAX: none).
// Grid (ceil(P / (SSM_WARPS * SSM_ROWS)), Hm, B), SSM_WARPS warps.
template <int NPL>
__device__ __forceinline__ void ssm_scan(const bf16_t* __restrict__ x, long long x_s0, long long x_s1,
                                         const bf16_t* __restrict__ dt, long long dt_s0, const float* __restrict__ A,
                                         const float* __restrict__ D, const float* __restrict__ dt_bias,
                                         const bf16_t* __restrict__ B, long long b_s0, long long b_s1,
                                         const bf16_t* __restrict__ C, long long c_s0, long long c_s1,
                                         float* __restrict__ state, const int* __restrict__ starts,
                                         const int* __restrict__ slots, bf16_t* __restrict__ out, int heads, int groups,
                                         int head_dim, int state_size, float dt_min, float dt_max, int chunk_from,
                                         const int* __restrict__ checkpoints) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int h = blockIdx.y, seq = blockIdx.z, group = h / (heads / groups);
    const int p0 = (blockIdx.x * SSM_WARPS + warp) * SSM_ROWS;
    if (p0 >= head_dim) return;
    const int r0 = starts ? starts[seq] : seq, r1 = starts ? starts[seq + 1] : seq + 1;
    if (r1 - r0 >= chunk_from) return;  // chunked_scan.cu's
    const long long slot = slots[seq];
    float* rows = slot >= 0 ? state + (slot * heads + h) * (long long)head_dim * state_size : nullptr;
    float s[SSM_ROWS][NPL];
#pragma unroll
    for (int r = 0; r < SSM_ROWS; ++r)
#pragma unroll
        for (int m = 0; m < NPL; ++m) {
            const int p = p0 + r, n = lane + 32 * m;
            s[r][m] = (rows && p < head_dim && n < state_size) ? rows[(long long)p * state_size + n] : 0.0f;
        }
    auto store = [&](float* __restrict__ to) {  // this warp's rows of the state
#pragma unroll
        for (int r = 0; r < SSM_ROWS; ++r)
#pragma unroll
            for (int m = 0; m < NPL; ++m) {
                const int p = p0 + r, n = lane + 32 * m;
                if (p < head_dim && n < state_size) to[(long long)p * state_size + n] = s[r][m];
            }
    };
    const float a = A[h], d = D[h], bias = dt_bias[h];
    float nx[SSM_ROWS], nb[NPL], nc[NPL], ndt = 0.0f;  // the next token's inputs
    auto load = [&](long long t) {
#pragma unroll
        for (int r = 0; r < SSM_ROWS; ++r)
            nx[r] = p0 + r < head_dim ? bf16_to_float(x[t * x_s0 + h * x_s1 + p0 + r]) : 0.0f;
#pragma unroll
        for (int m = 0; m < NPL; ++m) {
            const int n = lane + 32 * m;
            nb[m] = n < state_size ? bf16_to_float(B[t * b_s0 + group * b_s1 + n]) : 0.0f;
            nc[m] = n < state_size ? bf16_to_float(C[t * c_s0 + group * c_s1 + n]) : 0.0f;
        }
        ndt = bf16_to_float(dt[t * dt_s0 + h]);
    };
    if (r0 < r1) load(r0);
    for (long long t = r0; t < r1; ++t) {
        float xs[SSM_ROWS], bs[NPL], cs[NPL];
#pragma unroll
        for (int r = 0; r < SSM_ROWS; ++r) xs[r] = nx[r];
#pragma unroll
        for (int m = 0; m < NPL; ++m) {
            bs[m] = nb[m];
            cs[m] = nc[m];
        }
        const float delta = mamba_step(ndt, bias, dt_min, dt_max);
        if (t + 1 < r1) load(t + 1);
        const float decay = expf(delta * a);
#pragma unroll
        for (int r = 0; r < SSM_ROWS; ++r) {
            const float dx = delta * xs[r];
            float acc = 0.0f;
#pragma unroll
            for (int m = 0; m < NPL; ++m) {
                s[r][m] = __fmaf_rn(decay, s[r][m], dx * bs[m]);
                acc = __fmaf_rn(s[r][m], cs[m], acc);
            }
            acc = warp_sum(acc);
            if (lane == r && p0 + r < head_dim)
                out[(t * heads + h) * head_dim + p0 + r] = float_to_bf16(__fmaf_rn(d, xs[r], acc));
        }
        const long long checkpoint = checkpoints ? checkpoints[t] : -1;
        if (checkpoint >= 0) store(state + (checkpoint * heads + h) * (long long)head_dim * state_size);
    }
    if (rows && r1 > r0) store(rows);
}

#define SSM_SCAN_KERNEL(NPL)                                                                                       \
    extern "C" __global__ void __launch_bounds__(SSM_WARPS * 32) mamba2_scan_n##NPL##_bf16(                         \
        MAMBA2_SCAN_PARAMS, const int* __restrict__ checkpoints) {                                                     \
        await_inputs();                                                                                                \
        ssm_scan<NPL>(x, x_s0, x_s1, dt, dt_s0, A, D, dt_bias, B, b_s0, b_s1, C, c_s0, c_s1, state, starts, slots,   \
                      out, heads, groups, head_dim, state_size, dt_min, dt_max, chunk_from, checkpoints);            \
    }
SSM_SCAN_KERNEL(1)
SSM_SCAN_KERNEL(2)
SSM_SCAN_KERNEL(4)
SSM_SCAN_KERNEL(8)

// ---- gated RMSNorms and squared ReLU -------------------------------------------------------------------
// A warp per row of d elements. Row r is (outer, inner) = (r / inner_count, r % inner_count), at element
// offsets outer * s_outer + inner * s_inner in x and in the gate, with weight + inner * w_inner.
// gate_first (Mamba-2's gated_rms_norm): h = x silu(gate), out = h / rms(h) * w; otherwise (the gated delta
// net's rms_norm_silu_gate): out = x / rms(x) * w * silu(gate). rms(h) = sqrt(mean(h^2) + eps). out [rows, d].
extern "C" __global__ void gated_rms_norm_bf16(const bf16_t* __restrict__ x, long long x_so, long long x_si,
                                               const bf16_t* __restrict__ gate, long long g_so, long long g_si,
                                               int inner_count, const bf16_t* __restrict__ weight, long long w_si,
                                               bf16_t* __restrict__ out, float eps, int d, long long rows, int gate_first) {
    await_inputs();
    const long long r = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;
    const int lane = threadIdx.x & 31;
    const long long outer = r / inner_count, inner = r - outer * inner_count;
    const bf16_t* xr = x + outer * x_so + inner * x_si;
    const bf16_t* gr = gate + outer * g_so + inner * g_si;
    const bf16_t* wr = weight + inner * w_si;
    float sq = 0.0f;
    for (int i = lane; i < d; i += 32) {
        float h = bf16_to_float(xr[i]);
        if (gate_first) h *= silu_f(bf16_to_float(gr[i]));
        sq = __fmaf_rn(h, h, sq);
    }
    const float inv = 1.0f / sqrtf(__fadd_rn(__fdiv_rn(warp_sum(sq), (float)d), eps));
    for (int i = lane; i < d; i += 32) {
        const float gv = silu_f(bf16_to_float(gr[i]));
        float h = bf16_to_float(xr[i]);
        if (gate_first) h *= gv;
        float o = h * inv * bf16_to_float(wr[i]);
        if (!gate_first) o *= gv;
        out[r * d + i] = float_to_bf16(o);
    }
}

// out = max(x, 0)^2 for x [rows, cols] (row stride ldx) into out (row stride ldo).
extern "C" __global__ void relu_squared_bf16(const bf16_t* __restrict__ x, long long ldx, bf16_t* __restrict__ out,
                                             long long ldo, int cols, long long rows) {
    await_inputs();
    const long long total = rows * cols;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / cols;
        const int c = (int)(i - r * cols);
        const float v = fmaxf(bf16_to_float(x[r * ldx + c]), 0.0f);
        out[r * ldo + c] = float_to_bf16(v * v);
    }
}
