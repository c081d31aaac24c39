// out[M, N] = x[M, K] @ w[N, K]^T (+ bias[N]) for dense layers: one block per output tile (gemm_core.cuh).
#include "activations.cuh"
#include "gemm_fp8.cuh"
#include "gemm_gated.cuh"
#include "gemm_gguf.cuh"
#include "gemm_gguf_blocks.cuh"
#include "gemm_nvfp4.cuh"

#ifndef GGUF_TYPE
#define GEMM_KERNEL(MT, NT, U, VEC, SUFFIX, MIN_BLOCKS)                                                              \
    extern "C" __global__ void __launch_bounds__(GEMM_KSPLIT * 32, MIN_BLOCKS)                                      \
        gemm_bf16_m##MT##_n##NT##_##SUFFIX(const bf16_t* __restrict__ x, long long ldx, const bf16_t* __restrict__ w, \
                                          const bf16_t* __restrict__ bias, bf16_t* __restrict__ out, long long ldo,   \
                                          int M, int N, int K) { await_inputs();                                      \
        gemm_tile<MT, NT, U, VEC, const bf16_t*>(x, ldx, nullptr, w, bias, out, ldo, blockIdx.y * (MT * 16), M,    \
                                  blockIdx.x * (NT * 8), N, K);                                                       \
    }

// One m-tile (at most 16 rows: decode): two blocks per SM and 16 weight chunks in flight per thread,
// so that weight streaming runs near the memory bandwidth. Two m-tiles: prefill-sized products.
GEMM_KERNEL(1, 1, 16, true, vec, 2)
GEMM_KERNEL(1, 2, 8, true, vec, 2)
GEMM_KERNEL(1, 4, 4, true, vec, 2)
GEMM_KERNEL(2, 4, 2, true, vec, 1)
GEMM_KERNEL(1, 1, 8, false, any, 2)
GEMM_KERNEL(1, 2, 4, false, any, 2)
GEMM_KERNEL(1, 4, 2, false, any, 2)
GEMM_KERNEL(2, 4, 2, false, any, 1)

// A gated feed-forward's first product of at most 16 rows (decode) with its gate applied (gated_tile): w [2N, K] =
// [gate | up], out [M, N]; a block takes 8 units (their gate and up n-tiles), as gemm_bf16_m1_n2_vec takes 16
// columns.
#define GEMM_GATED_KERNEL(NAME, GATE)                                                                                  \
    extern "C" __global__ void __launch_bounds__(GEMM_KSPLIT * 32, 2)                                                 \
        NAME(const bf16_t* __restrict__ x, long long ldx, const bf16_t* __restrict__ w, const bf16_t* __restrict__ bias, \
             bf16_t* __restrict__ out, long long ldo, int M, int N, int K) {                                           \
        await_inputs();                                                                                                \
        gated_tile<1, 2, 8, true>(x, ldx, GatedRows{w, N}, bias, out, ldo, blockIdx.y * 16, M, blockIdx.x * 8, K,     \
                                  GATE{});                                                                             \
    }

GEMM_GATED_KERNEL(gemm_bf16_silu_mul_m1_n2_vec, Silu)
GEMM_GATED_KERNEL(gemm_bf16_gelu_tanh_mul_m1_n2_vec, GeluTanh)

// The same products over an FP8 E4M3 weight with block scales (gemm_fp8.cuh: Fp8Weight): scales
// [ceil(N / bn), ceil(K / bk)]. The quantized kinds also have `vec8` kernels (VEC_LOW8, gemm_core.cuh) for
// products of at most 8 rows: their freed x registers let the weight loads run further ahead.
#define GEMM_FP8_KERNEL(MT, NT, U, VEC, SUFFIX, MIN_BLOCKS)                                                           \
    extern "C" __global__ void __launch_bounds__(GEMM_KSPLIT * 32, MIN_BLOCKS) gemm_fp8_m##MT##_n##NT##_##SUFFIX(    \
        const bf16_t* __restrict__ x, long long ldx, const unsigned char* __restrict__ w,                            \
        const float* __restrict__ scales, int bn, int bk, const bf16_t* __restrict__ bias, bf16_t* __restrict__ out, \
        long long ldo, int M, int N, int K) { await_inputs();                                                         \
        gemm_tile<MT, NT, U, VEC, Fp8Weight>(x, ldx, nullptr, Fp8Weight{w, scales, bn, bk}, bias, out, ldo,           \
                                             blockIdx.y * (MT * 16), M, blockIdx.x * (NT * 8), N, K);                \
    }

GEMM_FP8_KERNEL(1, 1, 8, VEC_LOW8, vec8, 2)
GEMM_FP8_KERNEL(1, 2, 8, VEC_LOW8, vec8, 2)
// `vec8x3`: three blocks an SM (at most 85 registers a thread), for products whose blocks would fill
// one and a half waves of two an SM (gemm_shapes.low8_loads).
GEMM_FP8_KERNEL(1, 2, 4, VEC_LOW8, vec8x3, 3)
GEMM_FP8_KERNEL(1, 1, 8, true, vec, 2)
GEMM_FP8_KERNEL(1, 2, 4, true, vec, 2)
GEMM_FP8_KERNEL(1, 4, 2, true, vec, 2)
GEMM_FP8_KERNEL(2, 4, 2, true, vec, 1)
GEMM_FP8_KERNEL(1, 1, 8, false, any, 2)
GEMM_FP8_KERNEL(1, 2, 4, false, any, 2)
GEMM_FP8_KERNEL(1, 4, 2, false, any, 2)
GEMM_FP8_KERNEL(2, 4, 2, false, any, 1)

#endif

// The same products over an NVFP4 weight (gemm_nvfp4.cuh: packed E2M1 rows with their group scales and factor)
// and over a GGUF Q8_0 weight (gemm_gguf.cuh: 34-byte blocks of an f16 scale and 32 int8 codes): W is the operand.
#define GEMM_ROWS_KERNEL(NAME, W, MT, NT, U, VEC, SUFFIX, MIN_BLOCKS)                                                \
    extern "C" __global__ void __launch_bounds__(GEMM_KSPLIT * 32, MIN_BLOCKS) NAME##_m##MT##_n##NT##_##SUFFIX(     \
        const bf16_t* __restrict__ x, long long ldx, const unsigned char* __restrict__ w,                            \
        const bf16_t* __restrict__ bias, bf16_t* __restrict__ out, long long ldo, int M, int N, int K) {               \
        await_inputs();                                                                                                \
        gemm_tile<MT, NT, U, VEC, W>(x, ldx, nullptr, W{w}, bias, out, ldo, blockIdx.y * (MT * 16), M,                \
                                     blockIdx.x * (NT * 8), N, K);                                                    \
    }
#define GEMM_ROWS_KERNELS(NAME, W)                          \
    GEMM_ROWS_KERNEL(NAME, W, 1, 1, 8, VEC_LOW8, vec8, 2)  \
    GEMM_ROWS_KERNEL(NAME, W, 1, 2, 4, VEC_LOW8, vec8, 2)  \
    GEMM_ROWS_KERNEL(NAME, W, 1, 1, 8, true, vec, 2)       \
    GEMM_ROWS_KERNEL(NAME, W, 1, 2, 4, true, vec, 2)       \
    GEMM_ROWS_KERNEL(NAME, W, 1, 4, 2, true, vec, 2)       \
    GEMM_ROWS_KERNEL(NAME, W, 2, 4, 2, true, vec, 1)       \
    GEMM_ROWS_KERNEL(NAME, W, 1, 1, 8, false, any, 2)      \
    GEMM_ROWS_KERNEL(NAME, W, 1, 2, 4, false, any, 2)      \
    GEMM_ROWS_KERNEL(NAME, W, 1, 4, 2, false, any, 2)      \
    GEMM_ROWS_KERNEL(NAME, W, 2, 4, 2, false, any, 1)

#ifndef GGUF_TYPE
GEMM_ROWS_KERNELS(gemm_nvfp4, Nvfp4Weight)
GEMM_ROWS_KERNELS(gemm_gguf_q8_0, Q8_0Weight)
GEMM_ROWS_KERNEL(gemm_nvfp4, Nvfp4Weight, 1, 2, 8, VEC_LOW8, vec8x3, 3)
GEMM_ROWS_KERNEL(gemm_gguf_q8_0, Q8_0Weight, 1, 2, 4, VEC_LOW8, vec8x3, 3)
#else
// Built with GGUF_TYPE (a GGML type id, registry dtype gguf_q4_0 ... gguf_q6_k): that format's kernels alone.
GGUF_KERNELS(GEMM_ROWS_KERNELS)
#endif
