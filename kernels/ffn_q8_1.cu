// Activations to q8_1 blocks for the MMQ GEMMs (the q2g128 arm; the Q4_K MMQ arm): per 32
// values `f16 d, f16 s, i8 qs[32]` (36 bytes), d = amax / 127 (stored f16), q = roundf(x * (1/d))
// with the f32 d, s = the sum of the unquantized inputs (stored f16), summed by a warp
// butterfly (xor 16, 8, 4, 2, 1) whose order the CPU twin reproduces
// (src/gpu/reference.rs `quantize_row_q8_1_act`): bit-identical.

#include "common.cuh"

// x f32 [m, k] -> out [m, kp/32] blocks (x beyond k is 0). One warp per block. A dependent
// launch (common.cuh, pdl_wait).
// Grid (ceil(kp / 32 / 8), m), block 256.
extern "C" __global__ void quantize_act_q8_1(const float* __restrict__ x, int m, int k, int kp,
                                             unsigned char* __restrict__ out) {
    pdl_trigger();
    pdl_wait();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int b = blockIdx.x * (blockDim.x >> 5) + warp, r = blockIdx.y;
    if (b >= kp / 32 || r >= m) return;
    const int e = b * 32 + lane;
    const float v = e < k ? x[(size_t)r * k + e] : 0.f;
    float amax, sum;
    warp_amax_sum(v, amax, sum);
    const float d = __fdiv_rn(amax, 127.0f);
    const float id = d != 0.f ? __fdiv_rn(1.0f, d) : 0.f;
    unsigned char* blk = out + ((size_t)r * (kp / 32) + b) * MP_Q8_1_BYTES;
    blk[4 + lane] = (unsigned char)(signed char)(int)roundf(__fmul_rn(v, id));
    if (lane == 0) {
        // d and s as one aligned 32-bit store (blocks are 36 bytes, so 4-aligned). Four byte
        // stores of the two halves lost their low bytes on the H200 (NVRTC 13.0, sm_90, seen
        // by gpu-check on 2026-11-30: the high bytes were right, the low ones 0).
        const unsigned int hd = __half_as_ushort(__float2half_rn(d));
        const unsigned int hs = __half_as_ushort(__float2half_rn(sum));
        *reinterpret_cast<unsigned int*>(blk) = hd | (hs << 16);
    }
}
