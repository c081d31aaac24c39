// The scalar functions of the recurrent layers (recurrent.cu, chunked_scan.cu): SiLU, softplus, and the per-token
// gates of the gated delta net and of Mamba-2, so that every kernel computing a gate gives the same bits.
#pragma once
#include "common.cuh"

__device__ __forceinline__ float silu_f(float v) { return v / (1.0f + expf(-v)); }  // v -> -inf: -0, never NaN
__device__ __forceinline__ float softplus_f(float v) { return fmaxf(v, 0.0f) + log1pf(expf(-fabsf(v))); }

// The gated delta net's decay g = -exp(a_log) * softplus(a + dt_bias) and write strength beta = sigmoid(b).
__device__ __forceinline__ float gdn_decay(bf16_t a, float a_log, float dt_bias) {
    return -expf(a_log) * softplus_f(__fadd_rn(bf16_to_float(a), dt_bias));
}
__device__ __forceinline__ float gdn_beta(bf16_t b) { return 1.0f / (1.0f + expf(-bf16_to_float(b))); }

// Where a delta-rule kernel reads token t's gates of value head h: g and beta [T, Hv] fp32 as gdn_gates_bf16
// wrote them, or (g == null) computed from the a and b projections [T, Hv] (row strides lda, ldb) and the
// per-head a_log, dt_bias [Hv] fp32.
struct GdnGates {
    const float* __restrict__ g;
    const float* __restrict__ beta;
    const bf16_t* __restrict__ a;
    long long lda;
    const bf16_t* __restrict__ b;
    long long ldb;
    const float* __restrict__ a_log;
    const float* __restrict__ dt_bias;

    __device__ __forceinline__ float decay(long long t, int h, int heads) const {
        return g ? g[t * heads + h] : gdn_decay(a[t * lda + h], a_log[h], dt_bias[h]);
    }
    __device__ __forceinline__ float strength(long long t, int h, int heads) const {
        return beta ? beta[t * heads + h] : gdn_beta(b[t * ldb + h]);
    }
};

// The gated RMSNorm a delta-rule kernel applies to its output (recurrent.cu's _normed kernels): z [T, Hv, Dv]
// strided (z_s0, z_s1), the norm's weight [Dv], eps; z == null: none.
struct GdnNorm {
    const bf16_t* __restrict__ z = nullptr;
    long long z_s0 = 0, z_s1 = 0;
    const bf16_t* __restrict__ weight = nullptr;
    float eps = 0.0f;
};

// Thread-block clusters (sm_90 and later): a barrier over every thread of the cluster (release / acquire, so
// shared-memory writes before it are visible to the other blocks after it), and a float of block `rank`'s
// shared memory at the address `p` has in this block.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ float cluster_load(const float* p, unsigned rank) {
    unsigned remote;
    float value;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"((unsigned)__cvta_generic_to_shared(p)), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(value) : "r"(remote) : "memory");
    return value;
}

// Mamba-2's step delta = clip(softplus(dt + dt_bias), dt_min, dt_max); the state decays by exp(delta A).
__device__ __forceinline__ float mamba_step(float dt, float dt_bias, float dt_min, float dt_max) {
    return fminf(fmaxf(softplus_f(__fadd_rn(dt, dt_bias)), dt_min), dt_max);
}

// Mamba-2's gates as a chunked scan reads them (chunked_scan.cu): the log decay delta A and the write strength
// delta of token t, head h; dt [T, Hm] (row stride dt_s0), A / dt_bias [Hm] fp32.
struct SsdGates {
    const bf16_t* __restrict__ dt;
    long long dt_s0;
    const float* __restrict__ A;
    const float* __restrict__ dt_bias;
    float dt_min, dt_max;

    __device__ __forceinline__ float step(long long t, int h) const {
        return mamba_step(bf16_to_float(dt[t * dt_s0 + h]), dt_bias[h], dt_min, dt_max);
    }
    __device__ __forceinline__ float decay(long long t, int h, int) const { return step(t, h) * A[h]; }
    __device__ __forceinline__ float strength(long long t, int h, int) const { return step(t, h); }
};

#define GDN_GATE_PARAMS                                                                                               \
    const float *__restrict__ g, const float *__restrict__ beta, const bf16_t *__restrict__ gate_a, long long lda,   \
        const bf16_t *__restrict__ gate_b, long long ldb, const float *__restrict__ a_log,                            \
        const float *__restrict__ dt_bias
#define GDN_GATES GdnGates{g, beta, gate_a, lda, gate_b, ldb, a_log, dt_bias}

// The parameters of the Mamba-2 scan kernels, recurrent (recurrent.cu) and chunked (chunked_scan.cu) alike, so that
// the host passes one argument list to both: see recurrent.cu's ssm_scan.
#define MAMBA2_SCAN_PARAMS                                                                                            \
    const bf16_t *__restrict__ x, long long x_s0, long long x_s1, const bf16_t *__restrict__ dt, long long dt_s0,    \
        const float *__restrict__ A, const float *__restrict__ D, const float *__restrict__ dt_bias,                  \
        const bf16_t *__restrict__ B, long long b_s0, long long b_s1, const bf16_t *__restrict__ C, long long c_s0,    \
        long long c_s1, float *__restrict__ state, const int *__restrict__ starts, const int *__restrict__ slots,     \
        bf16_t *__restrict__ out, int heads, int groups, int head_dim, int state_size, float dt_min, float dt_max,     \
        int chunk_from
