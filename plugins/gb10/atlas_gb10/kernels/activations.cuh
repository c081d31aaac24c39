// The gate activations of the gated feed-forwards, fp32 math: shared by the gated elementwise kernels
// (elementwise.cu) and the products that gate in their epilogue (gemm_wgmma.cu), so both give the same bits.
#pragma once
#include "common.cuh"

struct Silu {
    __device__ float operator()(float g) const { return g / (1.0f + expf(-g)); }  // g -> -inf: g / inf = -0, never NaN
};

struct GeluTanh {
    __device__ float operator()(float g) const {
        return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
    }
};
