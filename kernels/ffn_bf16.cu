// BF16 weight x f32 activation GEMV for decode (the `bf16` pack layout: [n, kp] row-major).
// y[r, j] = sum_{i < k} bf16(w[j, i]) * x[r, i]; m <= 4; k % 8 == 0. Prefill uses cuBLAS.
// Contract and CPU twin: src/gpu/reference.rs `bf16_row`. Grid ceil(n / 8), block 256.

#include <cuda_bf16.h>

extern "C" __global__ void bf16_gemv_batch4(const float* __restrict__ x, int m, const __nv_bfloat16* __restrict__ w,
                                            float* __restrict__ y, int n, int k, int kp, int ldy) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int j = blockIdx.x * (blockDim.x >> 5) + warp;
    if (j >= n) return;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    const __nv_bfloat16* wr = w + (size_t)j * kp;
#pragma unroll 2
    for (int kk = lane * 8; kk < k; kk += 256) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(wr + kk));
        const unsigned int words[4] = {v.x, v.y, v.z, v.w};
        float wf[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            wf[2 * i] = __uint_as_float(words[i] << 16);
            wf[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
        }
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            if (r < m) {
                const float4* xr = reinterpret_cast<const float4*>(x + (size_t)r * k + kk);
                const float4 a = __ldg(xr), b = __ldg(xr + 1);
                acc[r] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x + wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        float v = acc[r];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0 && r < m) y[(size_t)r * ldy + j] = v;
    }
}
