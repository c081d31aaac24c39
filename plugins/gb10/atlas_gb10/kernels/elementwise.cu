// Row-wise and elementwise ops on bf16 activations: embedding, SiLU/GELU-tanh gating, decode-graph inputs, sigmoid
// gates, the Gemma family's and the vision towers' elementwise ops (the fused residual-add RMSNorm is in
// rms_norm.cu; the attention layer's inputs, RoPE and the KV writes, are in attention_inputs.cu).
//
// Every kernel computes each row with a fixed thread layout that depends only on the row width,
// never on the number of rows, so a row's result is bitwise the same in any batch.
#include "activations.cuh"

// out[t, :] = weight[ids[t], :]; one block per token.
extern "C" __global__ void embedding_bf16(const bf16_t* __restrict__ weight, const int* __restrict__ ids,
                                          bf16_t* __restrict__ out, int hidden) {
    await_inputs();
    const long long t = blockIdx.x;
    const bf16_t* src = weight + (long long)ids[t] * hidden;
    bf16_t* dst = out + t * hidden;
    if ((hidden & 7) == 0) {
        const uint4* s = reinterpret_cast<const uint4*>(src);
        uint4* d = reinterpret_cast<uint4*>(dst);
        for (int i = threadIdx.x; i < hidden / 8; i += blockDim.x) d[i] = s[i];
    } else {
        for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = src[i];
    }
}

// Gated activations: x [rows, 2I] = [gate | up] (row stride ldx) -> out [rows, I] (row stride ldo),
// out = act(gate) * up with fp32 math; 16-byte accesses where I, the row strides and the pointers allow.

// Output elements c .. c + N - 1 of row r (16-byte aligned when N == 8).
template <int N, typename Activation>
__device__ __forceinline__ void gated_elements(const bf16_t* __restrict__ x, long long ldx, bf16_t* __restrict__ out,
                                               long long ldo, int inner, long long r, int c, Activation act) {
    const bf16_t* gate = x + r * ldx + c;
    bf16_t* dst = out + r * ldo + c;
    if (N == 1) {
        *dst = float_to_bf16(act(bf16_to_float(*gate)) * bf16_to_float(gate[inner]));
        return;
    }
    const uint4 g = *reinterpret_cast<const uint4*>(gate), u = *reinterpret_cast<const uint4*>(gate + inner);
    const unsigned gw[4] = {g.x, g.y, g.z, g.w}, uw[4] = {u.x, u.y, u.z, u.w};
    unsigned o[4];
#pragma unroll
    for (int e = 0; e < 4; ++e)
        o[e] = (unsigned)float_to_bf16(act(bf16_lo(gw[e])) * bf16_lo(uw[e])) |
               ((unsigned)float_to_bf16(act(bf16_hi(gw[e])) * bf16_hi(uw[e])) << 16);
    *reinterpret_cast<uint4*>(dst) = make_uint4(o[0], o[1], o[2], o[3]);
}

// Every output element once, N at a time (a row's inner / N units), the grid striding over them; 32-bit index
// arithmetic where the units fit it.
template <int N, typename Activation>
__device__ __forceinline__ void gated_units(const bf16_t* __restrict__ x, long long ldx, bf16_t* __restrict__ out,
                                            long long ldo, int inner, long long rows, Activation act) {
    const int width = inner / N;
    const long long n = rows * width, first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    if (n <= 0x7fffffffLL - stride) {  // i + stride never overflows
        for (int i = (int)first; i < (int)n; i += (int)stride) {
            const int r = i / width;
            gated_elements<N>(x, ldx, out, ldo, inner, r, (i - r * width) * N, act);
        }
        return;
    }
    for (long long i = first; i < n; i += stride) {
        const long long r = i / width;
        gated_elements<N>(x, ldx, out, ldo, inner, r, (int)(i - r * width) * N, act);
    }
}

template <typename Activation>
__device__ void gated_mul(const bf16_t* __restrict__ x, long long ldx, bf16_t* __restrict__ out, long long ldo, int inner,
                          long long rows, Activation act) {
    const bool vec = (inner & 7) == 0 && (ldx & 7) == 0 && (ldo & 7) == 0 &&
                     (((unsigned long long)x | (unsigned long long)out) & 15) == 0;
    if (vec)
        gated_units<8>(x, ldx, out, ldo, inner, rows, act);
    else
        gated_units<1>(x, ldx, out, ldo, inner, rows, act);
}

extern "C" __global__ void silu_mul_bf16(const bf16_t* __restrict__ x, long long ldx, bf16_t* __restrict__ out,
                                         long long ldo, int inner, long long rows) {
    await_inputs();
    gated_mul(x, ldx, out, ldo, inner, rows, Silu{});
}

extern "C" __global__ void gelu_tanh_mul_bf16(const bf16_t* __restrict__ x, long long ldx, bf16_t* __restrict__ out,
                                              long long ldo, int inner, long long rows) {
    await_inputs();
    gated_mul(x, ldx, out, ldo, inner, rows, GeluTanh{});
}

// Fill the fixed input buffers of a captured decode graph from one step's batch of `b` sequences,
// padding the bucket up to `size` (context 0, KV slot -1, state slot -1: pad rows read and write nothing).
// One block per row of the bucket; block tables are copied `width` entries per row (dst row stride W).
extern "C" __global__ void decode_inputs(const int* __restrict__ ids, const int* __restrict__ positions,
                                         const int* __restrict__ seq_lens, const int* __restrict__ slots,
                                         const int* __restrict__ state_slots, const int* __restrict__ tables, int width,
                                         int b, int* __restrict__ d_ids, int* __restrict__ d_positions,
                                         int* __restrict__ d_seq_lens, int* __restrict__ d_slots,
                                         int* __restrict__ d_state_slots, int* __restrict__ d_tables, int table_stride) {
    await_inputs();
    const int row = blockIdx.x;
    const bool real = row < b;
    if (threadIdx.x == 0) {
        d_ids[row] = real ? ids[row] : 0;
        d_positions[row] = real ? positions[row] : 0;
        d_seq_lens[row] = real ? seq_lens[row] : 0;
        d_slots[row] = real ? slots[row] : -1;
        d_state_slots[row] = real ? state_slots[row] : -1;
    }
    if (real)
        for (int i = threadIdx.x; i < width; i += blockDim.x)
            d_tables[(long long)row * table_stride + i] = tables[(long long)row * width + i];
}

// out[r, c] = x[r, c] * sigmoid(gate[r, gate_cols == 1 ? 0 : c]) (Backend.sigmoid_gate), or with `accumulate`
// out[r, c] += that (Backend.sigmoid_gate_add: one rounding); fp32 math, out contiguous [rows, cols].
extern "C" __global__ void sigmoid_gate_bf16(const bf16_t* __restrict__ x, long long ldx, const bf16_t* __restrict__ gate,
                                             long long ldg, int gate_cols, bf16_t* out, int cols, long long rows,
                                             int accumulate) {
    await_inputs();
    const long long total = rows * cols;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / cols;
        const int c = (int)(i - r * cols);
        const float g = bf16_to_float(gate[r * ldg + (gate_cols == 1 ? 0 : c)]);
        const float y = bf16_to_float(x[r * ldx + c]) / (1.0f + expf(-g));
        out[i] = float_to_bf16(accumulate ? __fadd_rn(bf16_to_float(out[i]), y) : y);
    }
}

// The Gemma family's elementwise ops (its `gemma` op group): out[r, c] = op(x[r, c], y[r, c]) for rows of
// `cols` elements, x and y with their own row strides (one layer's slice of a stacked array included) and
// contiguous rows; out contiguous [rows, cols]; fp32 math. Unary ops ignore y (null).
struct SoftCap {
    float cap;
    __device__ float operator()(float x, float) const { return __fmul_rn(tanhf(__fdiv_rn(x, cap)), cap); }
};

struct Scale {
    float factor;
    __device__ float operator()(float x, float) const { return __fmul_rn(x, factor); }
};

struct AddScaled {
    float factor;
    __device__ float operator()(float x, float y) const { return __fmul_rn(__fadd_rn(x, y), factor); }
};

struct GeluTanhGate {
    __device__ float operator()(float gate, float up) const { return __fmul_rn(GeluTanh{}(gate), up); }
};

template <typename Op>
__device__ void map_rows(const bf16_t* __restrict__ x, long long ldx, const bf16_t* __restrict__ y, long long ldy,
                         bf16_t* __restrict__ out, int cols, long long rows, Op op) {
    const long long n = rows * cols;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / cols;
        const int c = (int)(i - r * cols);
        const float yv = y ? bf16_to_float(y[r * ldy + c]) : 0.0f;
        out[i] = float_to_bf16(op(bf16_to_float(x[r * ldx + c]), yv));
    }
}

#define MAP_KERNEL(NAME, OP)                                                                                         \
    extern "C" __global__ void NAME(const bf16_t* __restrict__ x, long long ldx, const bf16_t* __restrict__ y,       \
                                    long long ldy, bf16_t* __restrict__ out, int cols, long long rows, float value) {  \
        await_inputs();                                                                                                \
        map_rows(x, ldx, y, ldy, out, cols, rows, OP);                                                               \
    }

MAP_KERNEL(gemma_soft_cap_bf16, SoftCap{value})
MAP_KERNEL(gemma_scale_bf16, Scale{value})
MAP_KERNEL(gemma_add_scaled_bf16, AddScaled{value})
MAP_KERNEL(gemma_gelu_tanh_gate_bf16, GeluTanhGate{})

// The vision towers' ops (core's `vision` op group). GELU, exact (erf) or tanh-approximated, through
// map_rows; LayerNorm with bias: out[r, :] = (x - mean) / sqrt(var + eps) * weight + bias over rows of
// `cols` (x row stride ldx, out contiguous), fp32 math in two passes (the mean, then the centred
// variance), one 256-thread block per row.
struct GeluErf {
    __device__ float operator()(float x, float) const { return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f)); }
};

struct GeluTanhUnary {
    __device__ float operator()(float x, float) const { return GeluTanh{}(x); }
};

MAP_KERNEL(vision_gelu_erf_bf16, GeluErf{})
MAP_KERNEL(vision_gelu_tanh_bf16, GeluTanhUnary{})

#define LN_THREADS 256
__device__ __forceinline__ float block_sum(float v, float* partial) {
    v = warp_sum(v);
    __syncthreads();  // an earlier call's readers are done with `partial`
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < LN_THREADS / 32; ++w) total = __fadd_rn(total, partial[w]);
    return total;
}

extern "C" __global__ void __launch_bounds__(LN_THREADS) layer_norm_bf16(
    const bf16_t* __restrict__ x, long long ldx, const bf16_t* __restrict__ weight, const bf16_t* __restrict__ bias,
    bf16_t* __restrict__ out, int cols, float eps) {
    await_inputs();
    __shared__ float partial[LN_THREADS / 32];
    const bf16_t* row = x + (long long)blockIdx.x * ldx;
    float sum = 0.0f;
    for (int c = threadIdx.x; c < cols; c += LN_THREADS) sum = __fadd_rn(sum, bf16_to_float(row[c]));
    const float mean = __fdiv_rn(block_sum(sum, partial), (float)cols);
    float squares = 0.0f;
    for (int c = threadIdx.x; c < cols; c += LN_THREADS) {
        const float d = __fsub_rn(bf16_to_float(row[c]), mean);
        squares = __fmaf_rn(d, d, squares);
    }
    const float inv = rsqrtf(__fadd_rn(__fdiv_rn(block_sum(squares, partial), (float)cols), eps));
    bf16_t* dst = out + (long long)blockIdx.x * cols;
    for (int c = threadIdx.x; c < cols; c += LN_THREADS) {
        const float normed = __fmul_rn(__fsub_rn(bf16_to_float(row[c]), mean), inv);
        dst[c] = float_to_bf16(__fmaf_rn(normed, bf16_to_float(weight[c]), bf16_to_float(bias[c])));
    }
}

// The gemma group's clamp and pool_patches. clamp: out = x below `low` -> low, above `high` -> high (NaN stays),
// rows of `cols` with row stride ldx, out contiguous. pool_patches: out[o, c] = the mean of the kernel x kernel
// patches x[first[o] + i * width[o] + j, c] (i, j < kernel) of output o's block, summed in fp32 in (i, j) order;
// x [patches, C] with row stride ldx, out contiguous [outputs, C].
extern "C" __global__ void gemma_clamp_bf16(const bf16_t* __restrict__ x, long long ldx, bf16_t* __restrict__ out,
                                            int cols, long long rows, float low, float high) {
    await_inputs();
    const long long n = rows * cols;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / cols;
        const float v = bf16_to_float(x[r * ldx + (i - r * cols)]);
        out[i] = float_to_bf16(v < low ? low : (v > high ? high : v));
    }
}

extern "C" __global__ void gemma_pool_patches_bf16(const bf16_t* __restrict__ x, long long ldx,
                                                   const int* __restrict__ first, const int* __restrict__ width,
                                                   bf16_t* __restrict__ out, int channels, long long outputs, int kernel) {
    await_inputs();
    const long long n = outputs * channels;
    const float count = (float)(kernel * kernel);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const long long o = i / channels;
        const int c = (int)(i - o * channels);
        const long long base = first[o];
        const int w = width[o];
        float sum = 0.0f;
        for (int a = 0; a < kernel; ++a)
            for (int b = 0; b < kernel; ++b) sum = __fadd_rn(sum, bf16_to_float(x[(base + (long long)a * w + b) * ldx + c]));
        out[i] = float_to_bf16(__fdiv_rn(sum, count));
    }
}
