// NVFP4 arms over the `nvfp4` pack layout (ModelOpt bytes): codes [n, kp/2] (element 2i in the
// low nibble), E4M3 scales [n, kp/16], f32 global scale g.
// w[j, i] = E2M1[code] * e4m3(scale[j, i/16]) * g. sm_90 has no FP4 tensor cores: codes are
// decoded in registers. Contract and CPU twins: src/gpu/reference.rs `nvfp4_row`, and
// converters/layouts/nvfp4_mmq.rs for the repack. Requirements: k % 32 == 0, kp % 64 == 0.

#include <cuda_fp8.h>

__constant__ float E2M1[16] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f, -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

__device__ __forceinline__ float e4m3f(unsigned int b) {
    __nv_fp8_e4m3 v;
    v.__x = (__nv_fp8_storage_t)(b & 0xffu);
    return (float)v;
}

// y[r, j] = g * sum_groups e4m3(s) * sum_{i in group} E2M1[c] * x[r, i], one warp per R rows,
// 16 code bytes (32 elements, two scale groups) per lane per step.
template <int M, int R>
__device__ __forceinline__ void gemv_nvfp4(const float* __restrict__ x, int m, const unsigned char* __restrict__ codes,
                                           const unsigned char* __restrict__ scales, float g, float* __restrict__ y,
                                           int n, int k, int kp, int ldy) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int j0 = (blockIdx.x * (blockDim.x >> 5) + warp) * R;
    if (j0 >= n) return;
    float acc[M][R];
#pragma unroll
    for (int r = 0; r < M; ++r)
#pragma unroll
        for (int q = 0; q < R; ++q) acc[r][q] = 0.f;
    for (int kk = lane * 32; kk < k; kk += 1024) {
        uint4 v[R];
        unsigned short sc[R];
#pragma unroll
        for (int q = 0; q < R; ++q) {
            const int row = min(j0 + q, n - 1);
            v[q] = __ldg(reinterpret_cast<const uint4*>(codes + (size_t)row * (kp / 2) + kk / 2));
            sc[q] = __ldg(reinterpret_cast<const unsigned short*>(scales + (size_t)row * (kp / 16) + kk / 16));
        }
#pragma unroll
        for (int r = 0; r < M; ++r) {
            if (r >= m) continue;
            const float4* xr = reinterpret_cast<const float4*>(x + (size_t)r * k + kk);
            float xv[32];
#pragma unroll
            for (int t = 0; t < 8; ++t) {
                const float4 a = __ldg(xr + t);
                xv[4 * t] = a.x;
                xv[4 * t + 1] = a.y;
                xv[4 * t + 2] = a.z;
                xv[4 * t + 3] = a.w;
            }
#pragma unroll
            for (int q = 0; q < R; ++q) {
                const unsigned int words[4] = {v[q].x, v[q].y, v[q].z, v[q].w};
                float part[2] = {0.f, 0.f};
#pragma unroll
                for (int i = 0; i < 32; ++i) {
                    const unsigned int c = (words[i >> 3] >> (4 * (i & 7))) & 0xfu;
                    part[i >> 4] += E2M1[c] * xv[i];
                }
                acc[r][q] += part[0] * e4m3f(sc[q]) + part[1] * e4m3f(sc[q] >> 8);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < M; ++r)
#pragma unroll
        for (int q = 0; q < R; ++q) {
            float t = acc[r][q];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
            if (lane == 0 && r < m && j0 + q < n) y[(size_t)r * ldy + j0 + q] = t * g;
        }
}

// One projection, m <= 4. Grid ceil(n / 32), block 256.
extern "C" __global__ void w4a16_gemv(const float* x, int m, const unsigned char* codes, const unsigned char* scales, float g,
                                      float* y, int n, int k, int kp, int ldy) {
    gemv_nvfp4<4, 4>(x, m, codes, scales, g, y, n, k, kp, ldy);
}

// Gate and up in one launch (blockIdx.y 0: gate, 1: up), m <= 4. Grid (ceil(n / 32), 2), block 256.
extern "C" __global__ void w4a16_gemv_dual(const float* x, int m, const unsigned char* cg, const unsigned char* sg, float gg,
                                           float* yg, const unsigned char* cu, const unsigned char* su, float gu, float* yu,
                                           int n, int k, int kp, int ldy) {
    if (blockIdx.y == 0) gemv_nvfp4<4, 4>(x, m, cg, sg, gg, yg, n, k, kp, ldy);
    else gemv_nvfp4<4, 4>(x, m, cu, su, gu, yu, n, k, kp, ldy);
}

// finalize_nvfp4_mmq_load's repack: nvfp4 -> nvfp4_mmq tiles (128 rows x 64 k, 4608 bytes:
// scales[128][4] then codes[128][32]), padding rows zero. One thread per (tile, row).
// Grid ceil(np / 128 * kp / 64 * 128 / 256), block 256.
extern "C" __global__ void nvfp4_mmq_repack(const unsigned char* __restrict__ codes, const unsigned char* __restrict__ scales,
                                            int n, int np, int kp, unsigned char* __restrict__ out) {
    const int kt = kp / 64;
    const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long total = (long long)(np / 128) * kt * 128;
    if (id >= total) return;
    const int r = (int)(id % 128);
    const long long tile = id / 128;  // t * kt + s
    const int s = (int)(tile % kt);
    const int t = (int)(tile / kt);
    const int row = t * 128 + r;
    unsigned char* base = out + tile * 4608;
    unsigned int sv = 0;
    uint4 c0 = make_uint4(0, 0, 0, 0), c1 = make_uint4(0, 0, 0, 0);
    if (row < n) {
        const unsigned char* sp = scales + (size_t)row * (kp / 16) + s * 4;
        sv = (unsigned int)sp[0] | ((unsigned int)sp[1] << 8) | ((unsigned int)sp[2] << 16) | ((unsigned int)sp[3] << 24);
        const uint4* cp = reinterpret_cast<const uint4*>(codes + (size_t)row * (kp / 2) + s * 32);
        c0 = cp[0];
        c1 = cp[1];
    }
    *reinterpret_cast<unsigned int*>(base + r * 4) = sv;
    uint4* dst = reinterpret_cast<uint4*>(base + 512 + r * 32);
    dst[0] = c0;
    dst[1] = c1;
}
