// bench-gpu's streaming probe (the decode-roofline issue): the practical read ceiling of a decode
// kernel's grid. Block b reads the 16-byte words [b per, min((b + 1) per, count)) of p, each
// thread keeping PROBE_U loads in flight, with no arithmetic but an XOR, and stores the XOR of
// their 32-bit lanes as sink[b], so no read can be elided. CPU twin: src/gpu/reference.rs
// `stream_probe`. Grid ceil(count / per), block 256.

#include "common.cuh"

// ---- host-emulated: begin (tests/cuda_emu.rs compiles this module as C++) ----

#define PROBE_U 4

extern "C" __global__ void stream_probe(const uint4* p, int count, int per, unsigned int* sink) {
    __shared__ int red[32];
    const int b0 = blockIdx.x * per, end = min(b0 + per, count), step = blockDim.x;
    int acc = 0;
    for (int i = b0 + threadIdx.x; i < end; i += step * PROBE_U) {
        uint4 v[PROBE_U];
#pragma unroll
        for (int u = 0; u < PROBE_U; ++u) v[u] = i + step * u < end ? ldg_stream(p + i + step * u) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < PROBE_U; ++u) acc ^= (int)(v[u].x ^ v[u].y ^ v[u].z ^ v[u].w);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        int t = 0;
        for (int e = 0; e < (int)(blockDim.x >> 5); ++e) t ^= red[e];
        sink[blockIdx.x] = (unsigned int)t;
    }
}

// ---- host-emulated: end ----
