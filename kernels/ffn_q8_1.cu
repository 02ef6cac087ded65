// Activations to q8_1 blocks for the layouts' MMQ GEMMs and the block-format engine's GEMVs: per 32 values `f16 d, f16 s, i8 qs[32]` (36 bytes), d = amax / 127 (stored f16), q = roundf(x * (1/d))
// with the f32 d, s = the sum of the unquantized inputs (stored f16), summed by a warp
// butterfly (xor 16, 8, 4, 2, 1) whose order the CPU twin reproduces
// (src/gpu/reference.rs `quantize_row_q8_1_act`): bit-identical.

#include "common.cuh"

// One warp's q8_1 block from its 32 values (lane l holds value l of the block, 0 past k): the
// 32 codes at `qs`, d and s as one word at `ds` (4-aligned).
__device__ __forceinline__ void q8_1_block(float v, int lane, unsigned char* __restrict__ qs, unsigned char* __restrict__ ds) {
    float amax, sum;
    warp_amax_sum(v, amax, sum);
    const float d = __fdiv_rn(amax, 127.0f);
    const float id = d != 0.f ? __fdiv_rn(1.0f, d) : 0.f;
    qs[lane] = (unsigned char)(signed char)(int)roundf(__fmul_rn(v, id));
    if (lane == 0) {
        // d and s as one aligned 32-bit store (blocks are 36 bytes, so 4-aligned). Four byte
        // stores of the two halves lost their low bytes on the H200 (NVRTC 13.0, sm_90, seen
        // by gpu-check on 2026-11-30: the high bytes were right, the low ones 0).
        const unsigned int hd = __half_as_ushort(__float2half_rn(d));
        const unsigned int hs = __half_as_ushort(__float2half_rn(sum));
        *reinterpret_cast<unsigned int*>(ds) = hd | (hs << 16);
    }
}

// Block b of row r of m rows of kp values in the blocks' layout (`split` 0: 36-byte blocks) or
// split (`split` 1, the one-row engine GEMV's, `ggml_gemv1`: every row's codes first, i8
// [m, kp], then every block's d and s, [m, kp / 32] words; the same bytes, the codes of a block
// 32-aligned where a warp's lanes read them in 16-byte words): its codes and its d-and-s word.
__device__ __forceinline__ void q8_1_at(unsigned char* out, int split, int m, int kp, int r, int b,
                                        unsigned char*& qs, unsigned char*& ds) {
    const size_t blk = (size_t)r * (kp / 32) + b;
    if (split) {
        qs = out + (size_t)r * kp + 32 * (size_t)b;
        ds = out + (size_t)m * kp + 4 * blk;
    } else {
        ds = out + blk * MP_Q8_1_BYTES;
        qs = ds + 4;
    }
}

// The dependent launch's prologue (common.cuh, pdl_wait) and this warp's block: lane, block b
// of row r, of a grid (ceil(kp / 32 / 8), m) of 256 threads; false past the last.
__device__ __forceinline__ bool q8_1_slot(int m, int kp, int& lane, int& b, int& r) {
    pdl_trigger();
    pdl_wait();
    lane = threadIdx.x & 31;
    b = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    r = blockIdx.y;
    return b < kp / 32 && r < m;
}

// x f32 [m, k] -> out [m, kp/32] blocks (x beyond k is 0), in the blocks' layout or split
// (q8_1_at). One warp per block. A dependent launch (common.cuh, pdl_wait). Grid
// (ceil(kp / 32 / 8), m), block 256.
__device__ __forceinline__ void q8_1_rows(const float* __restrict__ x, int m, int k, int kp, unsigned char* __restrict__ out,
                                          int split) {
    int lane, b, r;
    if (!q8_1_slot(m, kp, lane, b, r)) return;
    const int e = b * 32 + lane;
    unsigned char *qs, *ds;
    q8_1_at(out, split, m, kp, r, b, qs, ds);
    q8_1_block(e < k ? x[(size_t)r * k + e] : 0.f, lane, qs, ds);
}
extern "C" __global__ void quantize_act_q8_1(const float* __restrict__ x, int m, int k, int kp,
                                             unsigned char* __restrict__ out) {
    q8_1_rows(x, m, k, kp, out, 0);
}
extern "C" __global__ void quantize_act_q8_1s(const float* __restrict__ x, int m, int k, int kp,
                                              unsigned char* __restrict__ out) {
    q8_1_rows(x, m, k, kp, out, 1);
}

// The gated product act(g) * u (act 0: SiLU, 1: GELU; common.cuh's act_silu_mul and
// act_gelu_mul, as act_mul_* computes it) of g, u f32 [m, k] at row stride ld, to q8_1 blocks
// as quantize_act_q8_1 makes them: act_mul_* then quantize_act_q8_1 in one launch, bit for bit.
// In the blocks' layout or split (`_q8_1s`). A dependent launch. Grid (ceil(kp / 32 / 8), m),
// block 256.
__device__ __forceinline__ void q8_1_act_rows(const float* __restrict__ g, const float* __restrict__ u, int act, int m,
                                              int k, int ld, int kp, unsigned char* __restrict__ out, int split) {
    int lane, b, r;
    if (!q8_1_slot(m, kp, lane, b, r)) return;
    const int e = b * 32 + lane;
    float v = 0.f;
    if (e < k) {
        const float gv = g[(size_t)r * ld + e], uv = u[(size_t)r * ld + e];
        v = act == 0 ? act_silu_mul(gv, uv) : act_gelu_mul(gv, uv);
    }
    unsigned char *qs, *ds;
    q8_1_at(out, split, m, kp, r, b, qs, ds);
    q8_1_block(v, lane, qs, ds);
}
extern "C" __global__ void quantize_act_mul_q8_1(const float* __restrict__ g, const float* __restrict__ u, int act, int m,
                                                 int k, int ld, int kp, unsigned char* __restrict__ out) {
    q8_1_act_rows(g, u, act, m, k, ld, kp, out, 0);
}
extern "C" __global__ void quantize_act_mul_q8_1s(const float* __restrict__ g, const float* __restrict__ u, int act, int m,
                                                  int k, int ld, int kp, unsigned char* __restrict__ out) {
    q8_1_act_rows(g, u, act, m, k, ld, kp, out, 1);
}
