// BF16 weight x f32 activation GEMV for decode (the `bf16` pack layout: [n, kp] row-major).
// y[r, j] = sum_{i < k} bf16(w[j, i]) * x[r, i]; m <= 4; k % 8 == 0. Prefill uses cuBLAS.
// Contract and CPU twin: src/gpu/reference.rs `bf16_row`. Grid ceil(n / MP_BF16_GEMV_ROWS),
// block 256.

#include <cuda_bf16.h>

// ---- host-emulated: begin (tests/cuda_emu.rs compiles this module as C++) ----

// Rows per warp: each x load (two float4 per 8 weights) serves BF16_R rows, so the f32
// activations do not outweigh the weight stream in L1 (one row per warp read 2 bytes of x per
// byte of weight). Each lane keeps BF16_STEPS 16-byte loads per row in flight.
#define BF16_R (MP_BF16_GEMV_ROWS / 8)
#define BF16_STEPS 4

extern "C" __global__ void bf16_gemv_batch4(const float* __restrict__ x, int m, const __nv_bfloat16* __restrict__ w,
                                            float* __restrict__ y, int n, int k, int kp, int ldy) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int j0 = (blockIdx.x * (blockDim.x >> 5) + warp) * BF16_R;
    if (j0 >= n) return;
    float acc[4][BF16_R];
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int q = 0; q < BF16_R; ++q) acc[r][q] = 0.f;
    const __nv_bfloat16* wr[BF16_R];
#pragma unroll
    for (int q = 0; q < BF16_R; ++q) wr[q] = w + (size_t)min(j0 + q, n - 1) * kp;  // rows past n: never stored
    for (int k0 = lane * 8; k0 < k; k0 += 256 * BF16_STEPS) {
        uint4 v[BF16_STEPS][BF16_R];
#pragma unroll
        for (int s = 0; s < BF16_STEPS; ++s)
#pragma unroll
            for (int q = 0; q < BF16_R; ++q)
                v[s][q] = k0 + 256 * s < k ? __ldg(reinterpret_cast<const uint4*>(wr[q] + k0 + 256 * s)) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int s = 0; s < BF16_STEPS; ++s) {
            const int kk = k0 + 256 * s;
            if (kk >= k) break;
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                if (r >= m) break;
                const float4* xr = reinterpret_cast<const float4*>(x + (size_t)r * k + kk);
                const float4 a = __ldg(xr), b = __ldg(xr + 1);
                const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                for (int q = 0; q < BF16_R; ++q) {
                    const unsigned int words[4] = {v[s][q].x, v[s][q].y, v[s][q].z, v[s][q].w};
                    float t = 0.f;
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        t += __uint_as_float(words[i] << 16) * xv[2 * i];
                        t += __uint_as_float(words[i] & 0xffff0000u) * xv[2 * i + 1];
                    }
                    acc[r][q] += t;
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int q = 0; q < BF16_R; ++q) {
            float v = acc[r][q];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0 && r < m && j0 + q < n) y[(size_t)r * ldy + j0 + q] = v;
        }
}

// ---- host-emulated: end ----
