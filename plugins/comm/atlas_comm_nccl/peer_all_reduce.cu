// One-shot all-reduce through peer memory (CUDA IPC over NVLink), for the small sums of decode steps.
// Compiled by NVRTC at run time (`peer_reduce.py`), without system or CUDA headers.
//
// Every rank owns one allocation that the other ranks have mapped: FLAG_BYTES of arrival flags
// ([BLOCKS][MAX_RANKS] 64-bit call counts, written by the peers: they never wrap), then two halves (by the call's parity) of one slot of
// `slot_bytes` per rank. A call runs BLOCKS blocks on every rank; block b of every rank handles the same
// 16-byte vectors, and blocks past the vectors (a call of fewer than BLOCKS * THREADS) only count the call,
// so that every block's count, and so the call's parity, stays the same. It writes its vectors of `in` into its own slot of every rank's allocation (stores to
// peers are posted: nothing waits for them), raises its flag in every rank's allocation (a release: it lands
// after the vectors), waits until every rank's block b has raised its flag for this call, then sums the
// slots in rank order in fp32 from its own memory (the same bits on every rank) and writes `out` (which may
// be `in`). One one-way trip over the link between arrivals, and no reads of a peer's memory.
//
// Why a half is free when a call writes it: a rank starts call k + 2 after its call k + 1 has finished,
// and that call waited for every rank's block 0 (at least) to arrive at call k + 1, which each rank launches
// only after its call k (whose reads of that half) has finished.

#define MAX_RANKS 8
#ifndef BLOCKS
#define BLOCKS 32  // the loader passes its own (`peer_reduce.BLOCKS`)
#endif
#define THREADS 256
#define FLAG_BYTES 4096
static_assert(BLOCKS * MAX_RANKS * 8 <= FLAG_BYTES, "the arrival flags must fit their region");

typedef unsigned short half_bits_t;

__device__ __forceinline__ unsigned long long load_acquire(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void store_release(unsigned long long* p, unsigned long long v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// 16 bytes another GPU wrote into this one's memory, read past L1.
__device__ __forceinline__ uint4 load_landed(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ float half_to_float(half_bits_t h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ half_bits_t float_to_half(float f) {
    half_bits_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ half_bits_t float_to_bf16(float f) {
    half_bits_t h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// KIND 0: float32 (4 values a vector), 1: bfloat16, 2: float16 (8 values a vector).
template <int KIND>
__device__ __forceinline__ void unpack(uint4 v, float* out) {
    const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if (KIND == 0) {
            out[i] = __uint_as_float(words[i]);
        } else if (KIND == 1) {
            out[2 * i] = __uint_as_float(words[i] << 16);
            out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
        } else {
            out[2 * i] = half_to_float((half_bits_t)(words[i] & 0xffffu));
            out[2 * i + 1] = half_to_float((half_bits_t)(words[i] >> 16));
        }
    }
}

template <int KIND>
__device__ __forceinline__ uint4 pack(const float* in) {
    unsigned words[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if (KIND == 0) {
            words[i] = __float_as_uint(in[i]);
        } else if (KIND == 1) {
            words[i] = (unsigned)float_to_bf16(in[2 * i]) | ((unsigned)float_to_bf16(in[2 * i + 1]) << 16);
        } else {
            words[i] = (unsigned)float_to_half(in[2 * i]) | ((unsigned)float_to_half(in[2 * i + 1]) << 16);
        }
    }
    return make_uint4(words[0], words[1], words[2], words[3]);
}

// bases[r]: rank r's allocation as this rank maps it. counters[b]: how many calls block b has made here (64-bit:
// a block that waits out 2^32 calls idle must not read an old flag as this call's).
// timeout_ns: a rank that has not arrived by then is gone or stuck: the kernel traps (the rank's CUDA work
// fails) instead of waiting forever.
template <int KIND>
__device__ __forceinline__ void peer_all_reduce(const uint4* in, uint4* out, long long vectors,
                                                const unsigned long long* bases, unsigned long long* counters, int rank,
                                                int world, long long slot_bytes, unsigned long long timeout_ns) {
    constexpr int VALUES = KIND == 0 ? 4 : 8;
    __shared__ unsigned long long call;
    if (threadIdx.x == 0) {
        const unsigned long long next = counters[blockIdx.x] + 1;
        counters[blockIdx.x] = next;
        call = next;
    }
    __syncthreads();
    const long long active = min((long long)BLOCKS, (vectors + THREADS - 1) / THREADS);
    if (blockIdx.x >= active) return;  // no vectors for this block: it only counts the call
    const unsigned long long flag = call;
    const long long half = FLAG_BYTES + (long long)(flag & 1ull) * world * slot_bytes;
    const long long stride = active * THREADS;
    const long long first = (long long)blockIdx.x * THREADS + threadIdx.x;
    for (long long v = first; v < vectors; v += stride) {
        const uint4 value = in[v];
        for (int r = 0; r < world; ++r)
            reinterpret_cast<uint4*>(reinterpret_cast<char*>(bases[r]) + half + rank * slot_bytes)[v] = value;
    }
    __syncthreads();
    if (threadIdx.x < world) {
        store_release(reinterpret_cast<unsigned long long*>(bases[threadIdx.x]) + blockIdx.x * MAX_RANKS + rank, flag);
        const unsigned long long* arrived =
            reinterpret_cast<const unsigned long long*>(bases[rank]) + blockIdx.x * MAX_RANKS + threadIdx.x;
        const unsigned long long start = global_ns();
        while (load_acquire(arrived) < flag) {
            if (global_ns() - start > timeout_ns) __trap();
        }
    }
    __syncthreads();
    const char* slots = reinterpret_cast<const char*>(bases[rank]) + half;
    for (long long v = first; v < vectors; v += stride) {
        float sum[VALUES], part[VALUES];
        unpack<KIND>(load_landed(reinterpret_cast<const uint4*>(slots) + v), sum);
        for (int r = 1; r < world; ++r) {
            unpack<KIND>(load_landed(reinterpret_cast<const uint4*>(slots + r * slot_bytes) + v), part);
#pragma unroll
            for (int i = 0; i < VALUES; ++i) sum[i] = __fadd_rn(sum[i], part[i]);
        }
        out[v] = pack<KIND>(sum);
    }
}

#define PEER_ALL_REDUCE(NAME, KIND)                                                                             \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                       \
        NAME(const uint4* in, uint4* out, long long vectors, const unsigned long long* bases, unsigned long long* counters, \
             int rank, int world, long long slot_bytes, unsigned long long timeout_ns) {                         \
        peer_all_reduce<KIND>(in, out, vectors, bases, counters, rank, world, slot_bytes, timeout_ns);           \
    }

PEER_ALL_REDUCE(peer_all_reduce_f32, 0)
PEER_ALL_REDUCE(peer_all_reduce_bf16, 1)
PEER_ALL_REDUCE(peer_all_reduce_f16, 2)
