// Tensor-core fragments shared by the kernels on mma.sync.m16n8k16 (the GEMMs, attention_mma.cu for prefill,
// attention_decode.cu for decode, gated_delta_chunked.cu): the mma itself, ldmatrix loads from shared memory, bf16
// packing of accumulators into A fragments, and the reductions over the 4 lanes that hold one row of an accumulator.
#pragma once
#include "common.cuh"

#define LOG2E 1.4426950408889634f

// c += a b on the tensor cores: a 16 x 16 bf16 A fragment (a0..a3), a 16 x 8 B fragment (b0, b1), fp32 c0..c3.
__device__ __forceinline__ void mma_16816(float& c0, float& c1, float& c2, float& c3, unsigned a0, unsigned a1,
                                          unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The same with the accumulators c[0..3] of one fragment.
__device__ __forceinline__ void mma_16816(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                          unsigned b1) {
    mma_16816(c[0], c[1], c[2], c[3], a0, a1, a2, a3, b0, b1);
}

__device__ __forceinline__ void ldmatrix_x4(unsigned* r, const bf16_t* p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned* r, const bf16_t* p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    return (unsigned)float_to_bf16(lo) | ((unsigned)float_to_bf16(hi) << 16);
}

// pack_bf16 in one instruction (sm_80 and later) for values that are not NaN: the same round-to-nearest-even bits
// (a NaN would become the canonical one, where float_to_bf16 keeps its payload).
__device__ __forceinline__ unsigned pack_bf16_finite(float lo, float hi) {
    unsigned packed;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(hi), "f"(lo));
    return packed;
}

// Rows 16 w .. 16 w + 15 (A fragments from a row-major bf16 tile) times the row-major tile b [16 ks .., 16 nd ..]:
// acc[2 nd], acc[2 nd + 1] += a (k-step ks) b, for nd < ND.
template <int ND>
__device__ __forceinline__ void mma_rows(float (*acc)[4], const unsigned (&a)[4], const bf16_t* b, int stride, int ks,
                                         int lane) {
#pragma unroll
    for (int nd = 0; nd < ND; ++nd) {
        unsigned f[4];
        ldmatrix_x4_trans(f, b + (ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * stride + nd * 16 + (lane >> 4) * 8);
        mma_16816(acc[2 * nd], a[0], a[1], a[2], a[3], f[0], f[1]);
        mma_16816(acc[2 * nd + 1], a[0], a[1], a[2], a[3], f[2], f[3]);
    }
}

__device__ __forceinline__ void load_rows_a(unsigned (&a)[4], const bf16_t* tile, int stride, int row0, int ks, int lane) {
    ldmatrix_x4(a, tile + (row0 + (lane & 15)) * stride + ks * 16 + (lane >> 4) * 8);
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// The visibility of the scores of a lane's two rows, r0 (s[n][0..1]) and r1 (s[n][2..3]), over N n-tiles of keys
// k0 + 8 n + 2 qd + e: a row at position p sees keys from key_start up to its last one (causal, or its image's end)
// and, with a sliding window, after p - window. Unseen scores become -inf; mx0 / mx1 return the lane's max of each
// row (unscaled: the caller multiplies it by the scale, which must be positive, and so gets the max of the scaled
// scores with the same rounding).
struct RowMasks {
    int key_start, last0, last1, p0, p1, window;
};

template <int N>
__device__ __forceinline__ void mask_scores(float (&s)[N][4], int k0, int qd, const RowMasks& m, float& mx0,
                                            float& mx1) {
    mx0 = mx1 = NEG_INF;
#pragma unroll
    for (int n = 0; n < N; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int kpos = k0 + n * 8 + 2 * qd + e;
            const bool seen = kpos >= m.key_start;
            const bool v0 = seen && kpos <= m.last0 && (m.window <= 0 || kpos > m.p0 - m.window);
            const bool v1 = seen && kpos <= m.last1 && (m.window <= 0 || kpos > m.p1 - m.window);
            s[n][e] = v0 ? s[n][e] : NEG_INF;
            s[n][2 + e] = v1 ? s[n][2 + e] : NEG_INF;
            mx0 = fmaxf(mx0, s[n][e]);
            mx1 = fmaxf(mx1, s[n][2 + e]);
        }
}

// mask_scores' maxima for a tile every score of which is seen (the scores stay as they are), as a tree of
// pairwise maxima (short dependency chains; max is exact, so the order changes no bits). N a power of two.
template <int N>
__device__ __forceinline__ void row_maxima(const float (&s)[N][4], float& mx0, float& mx1) {
    float m[N][2];
#pragma unroll
    for (int n = 0; n < N; ++n) {
        m[n][0] = fmaxf(s[n][0], s[n][1]);
        m[n][1] = fmaxf(s[n][2], s[n][3]);
    }
#pragma unroll
    for (int width = N / 2; width > 0; width /= 2)
#pragma unroll
        for (int n = 0; n < width; ++n) {
            m[n][0] = fmaxf(m[n][0], m[n + width][0]);
            m[n][1] = fmaxf(m[n][1], m[n + width][1]);
        }
    mx0 = m[0][0];
    mx1 = m[0][1];
}

// 2^x in one instruction (ex2.approx.ftz): results below 2^-126 (P of a score that far below its row's max) are
// 0 instead of subnormal, which a softmax weight relative to the row max's 1 does not notice.
__device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// P = exp2(s scale2 - base) (scores into log2 units and the row's scaled max off in one fma) of the two rows' N
// n-tiles as bf16 pairs, the A fragments of P V (pa[n][0] row r0, pa[n][1] row r1, keys 8 n + 2 qd and + 1), and
// this lane's sums of each row's unrounded values.
template <int N>
__device__ __forceinline__ void exp2_pack(const float (&s)[N][4], float scale2, float base0, float base1,
                                          unsigned (&pa)[N][2], float& sum0, float& sum1) {
    sum0 = sum1 = 0.0f;
#pragma unroll
    for (int n = 0; n < N; ++n) {
        const float e00 = exp2_ftz(fmaf(s[n][0], scale2, -base0)), e01 = exp2_ftz(fmaf(s[n][1], scale2, -base0));
        const float e10 = exp2_ftz(fmaf(s[n][2], scale2, -base1)), e11 = exp2_ftz(fmaf(s[n][3], scale2, -base1));
        sum0 += e00 + e01;
        sum1 += e10 + e11;
        pa[n][0] = pack_bf16_finite(e00, e01);  // NaN only from NaN or infinite scores (a payload then differs)
        pa[n][1] = pack_bf16_finite(e10, e11);
    }
}
