// FP8 E4M3 ("fn": no infinities, 0x7f / 0xff NaN, largest finite 448) bytes to and from bf16 and float, shared
// by the W8A16 weight kernels (gemm_core.cuh) and the fp8 KV cache (paged_kv.cuh, elementwise.cu).
#pragma once
#include "common.cuh"

// The bf16 bits of an E4M3 byte, exactly: every E4M3 value is a bf16 value (finite values; the NaN encodings
// 0x7f / 0xff, absent from weights and caches, read as ±480). The byte's exponent and mantissa are placed in a
// float's (bias 127 instead of 7) and the float multiplied by 2^120; E4M3 subnormals land on float subnormals,
// which the product normalises (kernels are compiled without flush-to-zero).
__device__ __forceinline__ unsigned e4m3_to_bf16_bits(unsigned b) {
    return __float_as_uint(__uint_as_float(((b & 0x80u) << 24) | ((b & 0x7fu) << 20)) * 0x1p120f) >> 16;
}

// a * b + (-0) on bf16 pairs: the product of each half, rounded once (exact where it is representable), with
// subnormal inputs kept (bf16 arithmetic has no flush-to-zero). fma rather than mul: sm_80 has no mul.bf16x2.
__device__ __forceinline__ unsigned bf16x2_mul(unsigned a, unsigned b) {
    unsigned d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
    return d;
}

// The four E4M3 bytes of `word` as two bf16 pairs, exactly (the values e4m3_to_bf16_bits gives): `lo` holds
// bytes 0 and 1, `hi` bytes 2 and 3 (the first of each in the low half). A byte moved to the top of a 16-bit
// half (one prmt) has its sign in place; its exponent and mantissa move 4 bits down into a bf16's, which reads
// the value times 2^-120 (E4M3 subnormals land on bf16 subnormals); one bf16 product by 2^120 per pair
// restores it exactly. Five integer/bf16 operations per pair instead of a float conversion per byte.
__device__ __forceinline__ void e4m3x4_to_bf16x2(unsigned word, unsigned& lo, unsigned& hi) {
    const unsigned two_pow_120 = 0x7b807b80u;  // bf16 2^120 in both halves
    const unsigned a = __byte_perm(word, 0u, 0x1404), b = __byte_perm(word, 0u, 0x3424);
    lo = bf16x2_mul((a & 0x80008000u) | ((a & 0x7f007f00u) >> 4), two_pow_120);
    hi = bf16x2_mul((b & 0x80008000u) | ((b & 0x7f007f00u) >> 4), two_pow_120);
}

// Eight E4M3 bytes (elements 0 .. 7 from the low byte of raw.x) as eight bf16 values, two a word.
__device__ __forceinline__ uint4 e4m3x8_to_bf16x8(uint2 raw) {
    uint4 v;
    e4m3x4_to_bf16x2(raw.x, v.x, v.y);
    e4m3x4_to_bf16x2(raw.y, v.z, v.w);
    return v;
}

// The E4M3 byte of x rounded to nearest even, saturating: |x| >= 448 gives ±448 (what ml_dtypes gives for x
// clipped to ±448 first, `atlas_core.backends.kv_dtypes.quantize_kv`); NaN gives 0x7f with x's sign.
__device__ __forceinline__ unsigned char float_to_e4m3(float x) {
    const unsigned sign = (__float_as_uint(x) >> 24) & 0x80u;
    const float a = fabsf(x);
    unsigned bits;
    if (a != a) {
        bits = 0x7fu;
    } else if (a >= 448.0f) {
        bits = 0x7eu;
    } else if (a < 0.015625f) {  // below 2^-6, the smallest normal: steps of 2^-9 (a count of 8 is 2^-6 itself)
        bits = (unsigned)__float2int_rn(a * 512.0f);
    } else {  // the 23-bit mantissa rounded to 3 bits, ties to even; a carry moves into the exponent
        unsigned v = __float_as_uint(a);
        v += 0x7ffffu + ((v >> 20) & 1u);
        bits = (((v >> 23) - 120u) << 3) | ((v >> 20) & 7u);
    }
    return (unsigned char)(sign | bits);
}
