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

// Bytes `byte` and `byte` + 1 of word as a bf16 pair (the first in the low half).
__device__ __forceinline__ unsigned e4m3_pair(unsigned word, int byte) {
    return e4m3_to_bf16_bits((word >> (8 * byte)) & 0xffu) | (e4m3_to_bf16_bits((word >> (8 * byte + 8)) & 0xffu) << 16);
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
