// Tensor-core fragments shared by the attention kernels on mma.sync.m16n8k16 (attention_mma.cu for prefill,
// attention_decode.cu for decode): ldmatrix loads from shared memory, bf16 packing of probabilities, and the
// reductions over the 4 lanes that hold one row of an accumulator fragment.
#pragma once
#include "common.cuh"

#define LOG2E 1.4426950408889634f

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

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
