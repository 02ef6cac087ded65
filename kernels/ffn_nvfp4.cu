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

// ---- Prefill base GEMM: bf16 mma.sync m16n8k16 over the nvfp4 layout ----
// Every E2M1 value times its E4M3 scale is exact in bf16, so the weight tile is decoded to bf16
// exactly; activations round to bf16; f32 accumulation; the global scale is applied at the end.
// y[r, j] = g * sum_i bf16(x[r, i]) * E2M1[c(j, i)] * e4m3(s(j, i/16)). Tile 64 x 128 x 32, 4 warps.
// Grid (ceil(n / 128), ceil(m / 64)), block 128.
__device__ __forceinline__ void mma_bf16_t(float* c, const unsigned int* a, const unsigned int* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

#include <cuda_bf16.h>

__device__ __forceinline__ unsigned int pack2_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned int*>(&v);
}

extern "C" __global__ void w4a16_gemm(const float* __restrict__ x, int m, const unsigned char* __restrict__ codes,
                                      const unsigned char* __restrict__ scales, float g, float* __restrict__ y,
                                      int n, int k, int kp, int ldy) {
    constexpr int BM = 64, BN = 128, BK = 32, PAD = 8;
    __shared__ __align__(16) __nv_bfloat16 As[BM][BK + PAD];
    __shared__ __align__(16) __nv_bfloat16 Bs[BN][BK + PAD];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm0 = (warp >> 1) * 32, wn0 = (warp & 1) * 64;
    const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
    const int gq = lane >> 2, t4 = lane & 3;
    float acc[2][8][4];
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int b = 0; b < 8; ++b)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[a][b][c] = 0.f;
    for (int k0 = 0; k0 < k; k0 += BK) {
        // A: 64 rows x 8 float4.
#pragma unroll
        for (int v = 0; v < 4; ++v) {
            const int idx = tid + v * 128, row = idx >> 3, col = (idx & 7) * 4;
            const int gr = m0 + row, gc = k0 + col;
            const float4 t = (gr < m && gc < k) ? __ldg(reinterpret_cast<const float4*>(x + (size_t)gr * k + gc)) : make_float4(0.f, 0.f, 0.f, 0.f);
            unsigned int* d = reinterpret_cast<unsigned int*>(&As[row][col]);
            d[0] = pack2_bf16(t.x, t.y);
            d[1] = pack2_bf16(t.z, t.w);
        }
        // B: one row (32 elements: 16 code bytes, 2 scale bytes) per thread.
        {
            const int row = tid, gn = n0 + row;
            unsigned int* d = reinterpret_cast<unsigned int*>(&Bs[row][0]);
            if (gn < n) {
                const uint4 v = __ldg(reinterpret_cast<const uint4*>(codes + (size_t)gn * (kp / 2) + k0 / 2));
                const unsigned short sc = __ldg(reinterpret_cast<const unsigned short*>(scales + (size_t)gn * (kp / 16) + k0 / 16));
                const float s0 = e4m3f(sc), s1 = e4m3f(sc >> 8);
                const unsigned int words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int q = 0; q < 16; ++q) {
                    const unsigned int lo = (words[q >> 2] >> (8 * (q & 3))) & 0xfu;
                    const unsigned int hi = (words[q >> 2] >> (8 * (q & 3) + 4)) & 0xfu;
                    const float s = q < 8 ? s0 : s1;
                    d[q] = pack2_bf16(E2M1[lo] * s, E2M1[hi] * s);
                }
            } else {
#pragma unroll
                for (int q = 0; q < 16; ++q) d[q] = 0u;
            }
        }
        __syncthreads();
#pragma unroll
        for (int ks = 0; ks < BK; ks += 16) {
            unsigned int af[2][4], bfr[8][2];
#pragma unroll
            for (int a = 0; a < 2; ++a) {
                const int r = wm0 + a * 16 + gq, c = ks + t4 * 2;
                af[a][0] = *reinterpret_cast<const unsigned int*>(&As[r][c]);
                af[a][1] = *reinterpret_cast<const unsigned int*>(&As[r + 8][c]);
                af[a][2] = *reinterpret_cast<const unsigned int*>(&As[r][c + 8]);
                af[a][3] = *reinterpret_cast<const unsigned int*>(&As[r + 8][c + 8]);
            }
#pragma unroll
            for (int b = 0; b < 8; ++b) {
                const int r = wn0 + b * 8 + gq, c = ks + t4 * 2;
                bfr[b][0] = *reinterpret_cast<const unsigned int*>(&Bs[r][c]);
                bfr[b][1] = *reinterpret_cast<const unsigned int*>(&Bs[r][c + 8]);
            }
#pragma unroll
            for (int a = 0; a < 2; ++a)
#pragma unroll
                for (int b = 0; b < 8; ++b) mma_bf16_t(acc[a][b], af[a], bfr[b]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int b = 0; b < 8; ++b) {
            const int r = m0 + wm0 + a * 16 + gq, c = n0 + wn0 + b * 8 + t4 * 2;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int rr = r + 8 * h;
                if (rr >= m) continue;
                if (c < n) y[(size_t)rr * ldy + c] = acc[a][b][2 * h] * g;
                if (c + 1 < n) y[(size_t)rr * ldy + c + 1] = acc[a][b][2 * h + 1] * g;
            }
        }
}
