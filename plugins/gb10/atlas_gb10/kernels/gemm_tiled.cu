// out[M, N] = x[M, K] @ w[N, K]^T (+ bias[N]) for prefill-sized dense products: 128 x 128 output tiles of
// gemm_tiled.cuh's tiled product.
#include "gemm_tiled.cuh"

extern "C" __global__ void __launch_bounds__(TG_THREADS, 2)
    gemm_tiled_bf16(const bf16_t* __restrict__ x, long long ldx, const bf16_t* __restrict__ w,
                    const bf16_t* __restrict__ bias, bf16_t* __restrict__ out, long long ldo, int M, int N, int K) {
    await_inputs();
    tiled_product<4>(x, ldx, nullptr, w, bias, out, ldo, blockIdx.y * 128, M, blockIdx.x * TG_BN, N, K, 0);
}
