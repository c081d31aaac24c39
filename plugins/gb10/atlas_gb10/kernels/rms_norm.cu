// The fused residual-add RMSNorm on bf16 activations (Backend.rms_norm): s = x (+ residual), normed =
// s / sqrt(mean(s^2) + eps) * weight, in a scalar form for any row and a 16-byte form for aligned rows.
//
// Every kernel computes each row with a fixed thread layout that depends only on the row width,
// never on the number of rows, so a row's result is bitwise the same in any batch.

#include "common.cuh"

// Rows are addressed as (outer, inner) = (r / inner_count, r % inner_count) with element strides
// (s_outer, s_inner) for x and for the residual; the last axis is contiguous. This covers [T, H] and per-head [T, heads, D] views.
__device__ __forceinline__ long long row_offset(long long s_outer, long long s_inner, int inner_count, long long r) {
    return (r / inner_count) * s_outer + (r % inner_count) * s_inner;
}

// s = x (+ residual); normed = s / sqrt(mean(s^2) + eps) * weight; both outputs contiguous [rows, D].
// The residual stream output is rounded to bf16 first and the norm is taken of the rounded sum.
// One warp per row when D <= 1024 (blockDim 128 = 4 rows per block), else one 256-thread block per row.
__device__ __forceinline__ float rms_partial(const bf16_t* x, const bf16_t* res, int d, int lane, int stride) {
    float acc = 0.0f;
    for (int i = lane; i < d; i += stride) {
        float v = bf16_to_float(x[i]);
        if (res) v = bf16_to_float(float_to_bf16(__fadd_rn(v, bf16_to_float(res[i]))));
        acc = __fmaf_rn(v, v, acc);
    }
    return acc;
}

__device__ __forceinline__ void rms_write(const bf16_t* x, const bf16_t* res, const bf16_t* w, bf16_t* normed,
                                          bf16_t* summed, int d, int lane, int stride, float inv) {
    for (int i = lane; i < d; i += stride) {
        float v = bf16_to_float(x[i]);
        if (res) {
            bf16_t s = float_to_bf16(__fadd_rn(v, bf16_to_float(res[i])));
            summed[i] = s;
            v = bf16_to_float(s);
        } else if (summed) {
            summed[i] = x[i];
        }
        normed[i] = float_to_bf16(__fmul_rn(__fmul_rn(v, inv), bf16_to_float(w[i])));
    }
}

extern "C" __global__ void rms_norm_warp_bf16(const bf16_t* __restrict__ x, long long x_so, long long x_si,
                                              const bf16_t* __restrict__ res, long long r_so, long long r_si, int inner_count,
                                              const bf16_t* __restrict__ weight, bf16_t* __restrict__ normed,
                                              bf16_t* __restrict__ summed, float eps, int d, long long rows) {
    await_inputs();
    const long long r = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (r >= rows) return;
    const int lane = threadIdx.x & 31;
    const bf16_t* xr = x + row_offset(x_so, x_si, inner_count, r);
    const bf16_t* rr = res ? res + row_offset(r_so, r_si, inner_count, r) : nullptr;
    float sq = warp_sum(rms_partial(xr, rr, d, lane, 32));
    sq = __shfl_sync(0xffffffffu, sq, 0);
    const float inv = 1.0f / sqrtf(__fadd_rn(__fdiv_rn(sq, (float)d), eps));
    rms_write(xr, rr, weight, normed + r * d, summed ? summed + r * d : nullptr, d, lane, 32, inv);
}

extern "C" __global__ void rms_norm_block_bf16(const bf16_t* __restrict__ x, long long x_so, long long x_si,
                                               const bf16_t* __restrict__ res, long long r_so, long long r_si, int inner_count,
                                               const bf16_t* __restrict__ weight, bf16_t* __restrict__ normed,
                                               bf16_t* __restrict__ summed, float eps, int d, long long rows) {
    await_inputs();
    __shared__ float partial[8];
    const long long r = blockIdx.x;
    const bf16_t* xr = x + row_offset(x_so, x_si, inner_count, r);
    const bf16_t* rr = res ? res + row_offset(r_so, r_si, inner_count, r) : nullptr;
    float sq = warp_sum(rms_partial(xr, rr, d, threadIdx.x, 256));
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x / 32] = sq;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < 8; ++w) total = __fadd_rn(total, partial[w]);
    const float inv = 1.0f / sqrtf(__fadd_rn(__fdiv_rn(total, (float)d), eps));
    rms_write(xr, rr, weight, normed + r * d, summed ? summed + r * d : nullptr, d, threadIdx.x, 256, inv);
}

// RMSNorm with 16-byte accesses: rows of D % 8 == 0 elements, 16-byte aligned. The row stays in
// registers between the sum of squares and the write (at most RMS_CHUNKS chunks of 8 per thread): a warp per
// row for D <= 256, a 128-thread block per row for D <= 1024, a 256-thread block per row above that.
#define RMS_CHUNKS 4

template <int THREADS>
__device__ __forceinline__ void rms_norm_vec(const bf16_t* __restrict__ x, long long x_so, long long x_si,
                                             const bf16_t* __restrict__ res, long long r_so, long long r_si,
                                             int inner_count, const bf16_t* __restrict__ weight,
                                             bf16_t* __restrict__ normed, bf16_t* __restrict__ summed, float eps, int d,
                                             long long r, int t) {
    const uint4* xr = reinterpret_cast<const uint4*>(x + row_offset(x_so, x_si, inner_count, r));
    const uint4* rr = res ? reinterpret_cast<const uint4*>(res + row_offset(r_so, r_si, inner_count, r)) : nullptr;
    const int chunks = d / 8;
    const uint4* wr = reinterpret_cast<const uint4*>(weight);
    float v[RMS_CHUNKS][8];
    uint4 wv[RMS_CHUNKS];  // loaded with the row: one memory round trip before the sum
    float sq = 0.0f;
#pragma unroll
    for (int k = 0; k < RMS_CHUNKS; ++k) {
        const int ch = t + k * THREADS;
        if (ch < chunks) {
            wv[k] = wr[ch];
            const uint4 a = xr[ch];
            const unsigned aw[4] = {a.x, a.y, a.z, a.w};
            unsigned bw[4] = {0u, 0u, 0u, 0u};
            if (rr) {
                const uint4 b = rr[ch];
                bw[0] = b.x; bw[1] = b.y; bw[2] = b.z; bw[3] = b.w;
            }
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                float value = (e & 1) ? bf16_hi(aw[e / 2]) : bf16_lo(aw[e / 2]);
                if (rr) value = bf16_to_float(float_to_bf16(__fadd_rn(value, (e & 1) ? bf16_hi(bw[e / 2]) : bf16_lo(bw[e / 2]))));
                v[k][e] = value;
                sq = __fmaf_rn(value, value, sq);
            }
        }
    }
    sq = warp_sum(sq);
    if (THREADS > 32) {
        __shared__ float partial[THREADS / 32];
        if ((t & 31) == 0) partial[t / 32] = sq;
        __syncthreads();
        sq = 0.0f;
#pragma unroll
        for (int w = 0; w < THREADS / 32; ++w) sq = __fadd_rn(sq, partial[w]);
    } else {
        sq = __shfl_sync(0xffffffffu, sq, 0);
    }
    const float inv = 1.0f / sqrtf(__fadd_rn(__fdiv_rn(sq, (float)d), eps));
    uint4* nr = reinterpret_cast<uint4*>(normed + r * d);
    uint4* sr = summed ? reinterpret_cast<uint4*>(summed + r * d) : nullptr;
#pragma unroll
    for (int k = 0; k < RMS_CHUNKS; ++k) {
        const int ch = t + k * THREADS;
        if (ch < chunks) {
            const unsigned ww[4] = {wv[k].x, wv[k].y, wv[k].z, wv[k].w};
            unsigned out[4], sum[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float n0 = __fmul_rn(__fmul_rn(v[k][2 * e], inv), bf16_lo(ww[e]));
                const float n1 = __fmul_rn(__fmul_rn(v[k][2 * e + 1], inv), bf16_hi(ww[e]));
                out[e] = (unsigned)float_to_bf16(n0) | ((unsigned)float_to_bf16(n1) << 16);
                sum[e] = (unsigned)float_to_bf16(v[k][2 * e]) | ((unsigned)float_to_bf16(v[k][2 * e + 1]) << 16);
            }
            const uint4 o = {out[0], out[1], out[2], out[3]};
            nr[ch] = o;
            if (sr) {
                const uint4 so = {sum[0], sum[1], sum[2], sum[3]};
                sr[ch] = so;
            }
        }
    }
}

extern "C" __global__ void rms_norm_warp_vec_bf16(const bf16_t* __restrict__ x, long long x_so, long long x_si,
                                                  const bf16_t* __restrict__ res, long long r_so, long long r_si,
                                                  int inner_count, const bf16_t* __restrict__ weight,
                                                  bf16_t* __restrict__ normed, bf16_t* __restrict__ summed, float eps,
                                                  int d, long long rows) {
    prefetch_l2(weight, 2LL * d, threadIdx.x, blockDim.x);
    await_inputs();
    const long long r = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (r >= rows) return;
    rms_norm_vec<32>(x, x_so, x_si, res, r_so, r_si, inner_count, weight, normed, summed, eps, d, r, threadIdx.x & 31);
}

// A block of THREADS per row: 128 for rows of 33 to 128 chunks (measured faster than a warp a row on an H100 even
// at one row: the sum's serial chain is a quarter as long; the same kernel for every batch keeps rows batch
// invariant), 256 for wider rows.
#define RMS_NORM_BLOCK_VEC_KERNEL(NAME, THREADS)                                                                      \
    extern "C" __global__ void NAME(const bf16_t* __restrict__ x, long long x_so, long long x_si,                   \
                                    const bf16_t* __restrict__ res, long long r_so, long long r_si, int inner_count, \
                                    const bf16_t* __restrict__ weight, bf16_t* __restrict__ normed,                  \
                                    bf16_t* __restrict__ summed, float eps, int d, long long rows) {                 \
        prefetch_l2(weight, 2LL * d, threadIdx.x, blockDim.x);                                                       \
        await_inputs();                                                                                              \
        rms_norm_vec<THREADS>(x, x_so, x_si, res, r_so, r_si, inner_count, weight, normed, summed, eps, d,           \
                              blockIdx.x, threadIdx.x);                                                              \
    }

RMS_NORM_BLOCK_VEC_KERNEL(rms_norm_quad_vec_bf16, 128)
RMS_NORM_BLOCK_VEC_KERNEL(rms_norm_block_vec_bf16, 256)
