// W8A8: per-row FP8 activations x per-row FP8 weights (the `w8a8` pack layout) on Hopper's FP8
// tensor cores (mma.sync m16n8k32 e4m3, f32 accumulation).
// Contract and CPU twins: src/gpu/reference.rs `quantize_row_fp8`, `w8a8_row`.
// The tile shape and k order are fixed, so a row's output bits do not depend on how many rows
// share the launch (the fixed --activation-quantization path relies on it).

#include "common.cuh"

// x f32 [m, k] -> q e4m3 [m, kp] (zero padded), sx f32 [m]: sx = amax / 448, q = e4m3_satfinite(x / sx).
// Grid m, block 256.
extern "C" __global__ void quantize_act_fp8_row(const float* __restrict__ x, int m, int k, int kp,
                                                unsigned char* __restrict__ q, float* __restrict__ sx) {
    const int r = blockIdx.x;
    if (r >= m) return;
    const float* xr = x + (size_t)r * k;
    float amax = 0.f;
    for (int i = threadIdx.x; i < k; i += blockDim.x) amax = fmaxf(amax, fabsf(xr[i]));
    amax = block_amax(amax);
    const float scale = amax / 448.0f;
    unsigned char* qr = q + (size_t)r * kp;
    for (int i = threadIdx.x; i < kp; i += blockDim.x) {
        unsigned char c = 0;
        if (i < k && scale != 0.f) c = (unsigned char)__nv_cvt_float_to_fp8(__fdiv_rn(xr[i], scale), __NV_SATFINITE, __NV_E4M3);
        qr[i] = c;
    }
    if (threadIdx.x == 0) sx[r] = scale;
}

__device__ __forceinline__ void mma_e4m3(float* c, const unsigned int* a, const unsigned int* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// y[r, j] = (acc * sx[r]) * sw[j], acc = sum_i e4m3(q[r, i]) * e4m3(w[j, i]); j < n, r < m.
// q [m, kp], w [n, kp] (kp % 64 == 0), y row stride ldy. Tile 64 x 128 x 64, 4 warps (2 x 2).
// Grid (ceil(n / 128), ceil(m / 64)), block 128.
extern "C" __global__ void w8a8_gemm(const unsigned char* __restrict__ q, const float* __restrict__ sx, int m,
                                     const unsigned char* __restrict__ w, const float* __restrict__ sw,
                                     float* __restrict__ y, int n, int kp, int ldy) {
    constexpr int BM = 64, BN = 128, BK = 64, PAD = 16;
    __shared__ __align__(16) unsigned char As[BM][BK + PAD];
    __shared__ __align__(16) unsigned char Bs[BN][BK + PAD];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm0 = (warp >> 1) * 32, wn0 = (warp & 1) * 64;
    const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
    const int g = lane >> 2, t4 = lane & 3;
    float acc[2][8][4];
    mmq_zero(acc);
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (int k0 = 0; k0 < kp; k0 += BK) {
#pragma unroll
        for (int v = 0; v < 2; ++v) {  // A: 64 rows x 4 uint4
            const int idx = tid + v * 128, row = idx >> 2, col = (idx & 3) * 16;
            const int gr = m0 + row;
            *reinterpret_cast<uint4*>(&As[row][col]) = gr < m ? __ldg(reinterpret_cast<const uint4*>(q + (size_t)gr * kp + k0 + col)) : zero;
        }
#pragma unroll
        for (int v = 0; v < 4; ++v) {  // B: 128 rows x 4 uint4
            const int idx = tid + v * 128, row = idx >> 2, col = (idx & 3) * 16;
            const int gn = n0 + row;
            *reinterpret_cast<uint4*>(&Bs[row][col]) = gn < n ? __ldg(reinterpret_cast<const uint4*>(w + (size_t)gn * kp + k0 + col)) : zero;
        }
        __syncthreads();
#pragma unroll
        for (int ks = 0; ks < BK; ks += 32) {
            unsigned int af[2][4], bfr[8][2];
#pragma unroll
            for (int a = 0; a < 2; ++a) {
                const int r = wm0 + a * 16 + g, c = ks + t4 * 4;
                af[a][0] = *reinterpret_cast<const unsigned int*>(&As[r][c]);
                af[a][1] = *reinterpret_cast<const unsigned int*>(&As[r + 8][c]);
                af[a][2] = *reinterpret_cast<const unsigned int*>(&As[r][c + 16]);
                af[a][3] = *reinterpret_cast<const unsigned int*>(&As[r + 8][c + 16]);
            }
#pragma unroll
            for (int b = 0; b < 8; ++b) {
                const int r = wn0 + b * 8 + g, c = ks + t4 * 4;
                bfr[b][0] = *reinterpret_cast<const unsigned int*>(&Bs[r][c]);
                bfr[b][1] = *reinterpret_cast<const unsigned int*>(&Bs[r][c + 16]);
            }
#pragma unroll
            for (int a = 0; a < 2; ++a)
#pragma unroll
                for (int b = 0; b < 8; ++b) mma_e4m3(acc[a][b], af[a], bfr[b]);
        }
        __syncthreads();
    }
    mmq_write_y(acc, m0 + wm0, n0 + wn0, lane, m, n, y, ldy, [&](int r, int c, float v) { return v * sx[r] * sw[c]; });
}
