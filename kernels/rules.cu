// The element rules of a pack's blobs, checked on the bytes the load copied (formats.md, "Each
// layout's own rules"; src/layout's `ElementRule`): one launch per rule of a part, over its `n`
// elements, the lowest index of an element that breaks the rule stored into bad[slot] with an
// atomic minimum (the caller fills bad with 0xff bytes: none). The kinds:
//   0 halves: every half finite (exponent bits not all ones).
//   1 zero pairs: 4-byte pairs, the half scale finite and the half zero point an integer
//     code of the blob's width, 0 ..= top.
//   2 zero pairs f32: 8-byte pairs, the f32 scale finite, the f32 zero point as in 1.
//   3 f32: every f32 finite.
//   4 E4M3: no byte is the E4M3 NaN (S.1111.111).
// CPU twin: src/gpu/reference.rs `blob_rules`. Any grid of 256-thread blocks (the table's:
// ceil(n / RULES_BLOCK_ELEMS) blocks): thread t checks elements t, t + the grid's threads, ...

#include "common.cuh"

// ---- host-emulated: begin (tests/cuda_emu.rs compiles this module as C++) ----

__device__ __forceinline__ bool rule_code(float z, int top) {
    // NaN fails every comparison; infinity is its own truncation but above top.
    return z == truncf(z) && z >= 0.f && z <= (float)top;
}

__device__ __forceinline__ bool rule_f32(unsigned int u) { return (u & 0x7f800000u) != 0x7f800000u; }

__device__ __forceinline__ bool rule_half(unsigned int h) { return (h & 0x7c00u) != 0x7c00u; }

__device__ __forceinline__ bool rule_ok(const unsigned char* p, int i, int kind, int top) {
    switch (kind) {
        case 0:
            return rule_half(reinterpret_cast<const unsigned short*>(p)[i]);
        case 1: {
            const unsigned int w = reinterpret_cast<const unsigned int*>(p)[i];
            const float z = __half2float(__ushort_as_half((unsigned short)(w >> 16)));
            return rule_half(w & 0xffffu) && rule_code(z, top);
        }
        case 2: {
            const unsigned int* q = reinterpret_cast<const unsigned int*>(p) + 2 * (size_t)i;
            return rule_f32(q[0]) && rule_code(__uint_as_float(q[1]), top);
        }
        case 3:
            return rule_f32(reinterpret_cast<const unsigned int*>(p)[i]);
        default:
            return (p[i] & 0x7f) != 0x7f;
    }
}

extern "C" __global__ void blob_rules(const unsigned char* p, int n, int kind, int top, unsigned int* bad, int slot) {
    const int stride = gridDim.x * blockDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        if (!rule_ok(p, i, kind, top)) atomicMin(bad + slot, (unsigned int)i);
}

// ---- host-emulated: end ----
