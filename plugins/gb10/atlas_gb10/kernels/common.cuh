// Shared helpers of every atlas-gb10 kernel. Compiled by NVRTC at run time (and by nvcc for the
// compile-only checks), so this header uses no system or CUDA headers: bf16 is handled as raw bits.
#pragma once

typedef unsigned short bf16_t;  // bfloat16 storage (the same bits as ml_dtypes.bfloat16)

__device__ __forceinline__ float bf16_to_float(bf16_t v) { return __uint_as_float(((unsigned)v) << 16); }

// Round to nearest even, NaN stays NaN (quietened), infinities stay infinite: what ml_dtypes does.
__device__ __forceinline__ bf16_t float_to_bf16(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7f800000u) == 0x7f800000u) {
        return (u & 0x007fffffu) ? (bf16_t)((u >> 16) | 0x40u) : (bf16_t)(u >> 16);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

// The two bf16 halves of a 32-bit word (low half = lower address = lower index).
__device__ __forceinline__ float bf16_lo(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

#define NEG_INF (__int_as_float(0xff800000))

// The first statement of every kernel (after `prefetch_l2` of its weights, if any). Decode graphs launch kernels
// programmatically (Hopper and later: `launch.py`), so a kernel's blocks may start while the kernel before it
// still runs; this waits until the kernels before it have finished and their writes are visible, then lets the
// next kernel's blocks start (they wait here in turn), which overlaps a launch with the previous kernel's tail.
// Without a programmatic launch, and before sm_90, it does nothing. The loader launches programmatically only
// kernels whose code holds the wait (`compiler.py`).
__device__ __forceinline__ void await_inputs() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Warm the L2 with the `bytes` at p (nothing for a null p), its 128-byte lines spread over `threads` threads (t:
// this one). For constant parameters only (weights, which no kernel writes): the one thing a kernel may do before
// `await_inputs()`, so that under a programmatic launch their reads overlap the previous kernel's tail.
__device__ __forceinline__ void prefetch_l2(const void* p, long long bytes, int t, int threads) {
    if (!p) return;
    for (long long offset = 128LL * t; offset < bytes; offset += 128LL * threads)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(static_cast<const char*>(p) + offset));
}

// The bytes of dynamic shared memory this launch gave the block.
__device__ __forceinline__ unsigned dynamic_shared_bytes() {
    unsigned bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
    return bytes;
}
