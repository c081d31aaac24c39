// Logits ops: row argmax (lowest index on ties), row log-softmax (fp32 out), penalties and biases in place.
// One 1024-thread block per row for the row reductions.
#include "common.cuh"

#define ROW_THREADS 1024

template <typename T>
__device__ __forceinline__ float load_logit(const T* p, long long i);
template <>
__device__ __forceinline__ float load_logit<bf16_t>(const bf16_t* p, long long i) { return bf16_to_float(p[i]); }
template <>
__device__ __forceinline__ float load_logit<float>(const float* p, long long i) { return p[i]; }

// (value, index) with the larger value winning and the lower index on ties; NaN never wins.
__device__ __forceinline__ void better(float& v, int& i, float ov, int oi) {
    if (ov > v || (ov == v && oi < i) || (v != v && ov == ov)) {
        v = ov;
        i = oi;
    }
}

template <typename T>
__device__ __forceinline__ void argmax_row(const T* __restrict__ logits, long long ld, int vocab, int* __restrict__ out) {
    __shared__ float sv[ROW_THREADS / 32];
    __shared__ int si[ROW_THREADS / 32];
    const T* row = logits + (long long)blockIdx.x * ld;
    float v = NEG_INF;
    int idx = 0x7fffffff;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) better(v, idx, load_logit<T>(row, j), j);
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        better(v, idx, __shfl_xor_sync(0xffffffffu, v, offset), __shfl_xor_sync(0xffffffffu, idx, offset));
    if ((threadIdx.x & 31) == 0) {
        sv[threadIdx.x / 32] = v;
        si[threadIdx.x / 32] = idx;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)blockDim.x / 32; ++w) better(v, idx, sv[w], si[w]);
        out[blockIdx.x] = idx < vocab ? idx : 0;
    }
}

extern "C" __global__ void argmax_bf16(const bf16_t* logits, long long ld, int vocab, int* out) {
    await_inputs();
    argmax_row<bf16_t>(logits, ld, vocab, out);
}
extern "C" __global__ void argmax_f32(const float* logits, long long ld, int vocab, int* out) {
    await_inputs();
    argmax_row<float>(logits, ld, vocab, out);
}

template <typename T>
__device__ __forceinline__ void log_softmax_row(const T* __restrict__ logits, long long ld, int vocab,
                                                float* __restrict__ out) {
    __shared__ float part[ROW_THREADS / 32];
    __shared__ float shared_max, shared_log_sum;
    const T* row = logits + (long long)blockIdx.x * ld;
    float* dst = out + (long long)blockIdx.x * vocab;
    float m = NEG_INF;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) m = fmaxf(m, load_logit<T>(row, j));
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = NEG_INF;
        for (int w = 0; w < (int)blockDim.x / 32; ++w) total = fmaxf(total, part[w]);
        shared_max = total;
    }
    __syncthreads();
    const float mx = shared_max;
    float s = 0.0f;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) s = __fadd_rn(s, expf(__fsub_rn(load_logit<T>(row, j), mx)));
    s = warp_sum(s);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int w = 0; w < (int)blockDim.x / 32; ++w) total = __fadd_rn(total, part[w]);
        shared_log_sum = logf(total);
    }
    __syncthreads();
    const float lse = shared_log_sum;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) dst[j] = __fsub_rn(__fsub_rn(load_logit<T>(row, j), mx), lse);
}

extern "C" __global__ void log_softmax_bf16(const bf16_t* logits, long long ld, int vocab, float* out) {
    await_inputs();
    log_softmax_row<bf16_t>(logits, ld, vocab, out);
}
extern "C" __global__ void log_softmax_f32(const float* logits, long long ld, int vocab, float* out) {
    await_inputs();
    log_softmax_row<float>(logits, ld, vocab, out);
}

// One thread per penalty entry (distinct (row, token) pairs): repetition, then frequency and presence.
extern "C" __global__ void apply_penalties_bf16(bf16_t* logits, long long ld, int entries, const int* rows,
                                                const int* tokens, const int* counts, const unsigned char* in_prompt,
                                                const float* repetition, const float* presence, const float* frequency) {
    await_inputs();
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= entries) return;
    const int r = rows[e];
    bf16_t* slot = logits + (long long)r * ld + tokens[e];
    float v = bf16_to_float(*slot);
    const int c = counts[e];
    if (in_prompt[e] || c > 0) {
        const float p = repetition[r];
        v = v > 0.0f ? __fdiv_rn(v, p) : __fmul_rn(v, p);
    }
    v = __fsub_rn(v, __fmul_rn(frequency[r], (float)c));
    if (c > 0) v = __fsub_rn(v, presence[r]);
    *slot = float_to_bf16(v);
}

// One thread per bias entry; (row, token) pairs are distinct (the host sums duplicates first).
extern "C" __global__ void add_biases_bf16(bf16_t* logits, long long ld, int entries, const int* rows,
                                           const int* tokens, const float* values) {
    await_inputs();
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= entries) return;
    bf16_t* slot = logits + (long long)rows[e] * ld + tokens[e];
    *slot = float_to_bf16(__fadd_rn(bf16_to_float(*slot), values[e]));
}
