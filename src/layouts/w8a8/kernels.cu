// W8A8: per-row FP8 activations x per-row FP8 weights (the `w8a8` pack layout) on Hopper's FP8
// tensor cores (mma.sync m16n8k32 e4m3, f32 accumulation).
// Contract and CPU twins: src/gpu/reference.rs `quantize_row_fp8`, `w8a8_row`.
// The tile shape and k order are fixed, so a row's output bits do not depend on how many rows
// share the launch (the fixed --activation-quantization path relies on it).

#include "common.cuh"

// ---- host-emulated: begin (tests/cuda_emu.rs compiles the quantizer, the GEMM and the GEMV as C++) ----

// x f32 [m, k] -> q e4m3 [m, kp] (zero padded), sx f32 [m]: sx = amax / 448, q = e4m3_satfinite(x / sx).
// Grid (column blocks, m), block MP_FP8_QUANT_THREADS: every block of row r takes the amax of the
// whole row (a max, so the same value in every block) and quantizes its share of the columns, so a
// few rows (decode) spread over many blocks with the bits of one block per row. A row is read twice
// (amax, codes); with 1024-thread blocks the rows in flight are few enough (two blocks per
// multiprocessor) that the second read mostly comes from L2.
// The quantizer over row r's values x(i), i < k (both kernels below).
template <class X>
__device__ __forceinline__ void quantize_fp8_row_of(X x, int r, int k, int kp, unsigned char* __restrict__ q, float* __restrict__ sx) {
    unsigned char* qr = q + (size_t)r * kp;
    float amax = 0.f;
    for (int i = threadIdx.x; i < k; i += blockDim.x) amax = fmaxf(amax, fabsf(x(i)));
    amax = block_amax(amax);
    const float scale = amax / 448.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < kp; i += gridDim.x * blockDim.x) {
        unsigned char c = 0;
        if (i < k && scale != 0.f) c = (unsigned char)__nv_cvt_float_to_fp8(__fdiv_rn(x(i), scale), __NV_SATFINITE, __NV_E4M3);
        qr[i] = c;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) sx[r] = scale;
}

extern "C" __global__ void quantize_act_fp8_row(const float* __restrict__ x, int m, int k, int kp,
                                                unsigned char* __restrict__ q, float* __restrict__ sx) {
    const int r = blockIdx.y;
    if (r >= m) return;
    const float* xr = x + (size_t)r * k;
    quantize_fp8_row_of([&](int i) { return xr[i]; }, r, k, kp, q, sx);
}

// Row blockIdx.y of act(g, u) (act 0: SiLU, 1: GELU; common.cuh's products) handed to
// `quant(x, r)` as the value functor x(i) of its columns: both fused quantizers below.
template <class Q>
__device__ __forceinline__ void act_mul_rows(Q quant, const float* __restrict__ g, const float* __restrict__ u, int gs, int us, int act,
                                             int m) {
    const int r = blockIdx.y;
    if (r >= m) return;
    const float* gr = g + (size_t)r * gs;
    const float* ur = u + (size_t)r * us;
    if (act == 0)
        quant([&](int i) { return act_silu_mul(gr[i], ur[i]); }, r);
    else
        quant([&](int i) { return act_gelu_mul(gr[i], ur[i]); }, r);
}

// The W8A8 down projection's input without the f32 product in memory: q, sx of the rows
// act(g, u) (act 0: SiLU, 1: GELU; common.cuh's act_silu_mul / act_gelu_mul, as act_mul_silu /
// act_mul_gelu compute them), so bit for bit quantize_act_fp8_row over act_mul's output. g and u
// [m, k] with row strides gs and us; grid and block as quantize_act_fp8_row (each pass computes
// the product again from g and u: g and u read twice, instead of the product written once and
// read twice).
extern "C" __global__ void quantize_act_mul_fp8_row(const float* __restrict__ g, const float* __restrict__ u, int gs, int us, int act,
                                                    int m, int k, int kp, unsigned char* __restrict__ q, float* __restrict__ sx) {
    act_mul_rows([&](auto x, int r) { quantize_fp8_row_of(x, r, k, kp, q, sx); }, g, u, gs, us, act, m);
}

// Per-group FP8 activations for the FP8 (block-scaled weight) arm's W8A8 prefill: x f32 [m, k]
// -> q e4m3 [m, kp] (zero padded), sx f32 [m, kp / 128]: for each group of 128 columns,
// sx = amax / 448 and q = e4m3_satfinite(x / sx), an all-zero group scale 0 and codes 0 (twin
// src/gpu/reference.rs `quantize_row_fp8_g128`). One warp per group, lane l holding columns
// l + 32 e (e < 4); grid (ceil(kp / 128 / 8), m), block 256.
template <class X>
__device__ __forceinline__ void quantize_fp8_g128_of(X x, int r, int k, int kp, unsigned char* __restrict__ q, float* __restrict__ sx) {
    const int g = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (g * 128 >= kp) return;
    float v[4], amax = 0.f;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const int i = g * 128 + lane + 32 * e;
        v[e] = i < k ? x(i) : 0.f;
        amax = fmaxf(amax, fabsf(v[e]));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float scale = amax / 448.0f;
    unsigned char* qr = q + (size_t)r * kp + g * 128;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        unsigned char c = 0;
        if (scale != 0.f) c = (unsigned char)__nv_cvt_float_to_fp8(__fdiv_rn(v[e], scale), __NV_SATFINITE, __NV_E4M3);
        qr[lane + 32 * e] = c;
    }
    if (lane == 0) sx[(size_t)r * (kp / 128) + g] = scale;
}

extern "C" __global__ void quantize_act_fp8_g128(const float* __restrict__ x, int m, int k, int kp, unsigned char* __restrict__ q,
                                                 float* __restrict__ sx) {
    const int r = blockIdx.y;
    if (r >= m) return;
    const float* xr = x + (size_t)r * k;
    quantize_fp8_g128_of([&](int i) { return xr[i]; }, r, k, kp, q, sx);
}

// The same over act(g, u) (act 0: SiLU, 1: GELU; common.cuh's products, as act_mul_* compute
// them): bit for bit quantize_act_fp8_g128 over act_mul's output, without the f32 product.
extern "C" __global__ void quantize_act_mul_fp8_g128(const float* __restrict__ g, const float* __restrict__ u, int gs, int us, int act,
                                                     int m, int k, int kp, unsigned char* __restrict__ q, float* __restrict__ sx) {
    act_mul_rows([&](auto x, int r) { quantize_fp8_g128_of(x, r, k, kp, q, sx); }, g, u, gs, us, act, m);
}

// c += a . b, one m16n8k32 e4m3 tensor-core MMA with f32 accumulation (the fragment layout of
// common.cuh's int8 m16n8k32; tests/cuda_emu/prelude.h defines a host stand-in).
#ifndef METRALE_CUDA_EMU
__device__ __forceinline__ void mma_e4m3(float* c, const unsigned int* a, const unsigned int* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif


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

// The decode GEMV of the W8A8 arm (m <= 16; `METRALE_W8A8_DECODE_GEMV`, off by default until it
// has run on a GPU): the same bits as w8a8_gemm. Every output (r, j) sees the same MMA
// instruction with the same operands at the same fragment positions (activation row r at A row
// r % 16, weight row j at B column j % 8) over the same k steps (32 at a time, in order, from a
// zero accumulator), and the same epilogue (acc * sx[r]) * sw[j]. What differs is the tiling:
// one warp per 8 outputs over all of k, operands loaded straight from global memory (no shared
// tile), so a decode call has n / 8 warps instead of n / 128 blocks. Grid ceil(n / 32), block 128.
#define W8A8_GEMV_UNROLL 8
extern "C" __global__ void w8a8_gemv(const unsigned char* __restrict__ q, const float* __restrict__ sx, int m,
                                     const unsigned char* __restrict__ w, const float* __restrict__ sw,
                                     float* __restrict__ y, int n, int kp, int ldy) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int n0 = (blockIdx.x * (blockDim.x >> 5) + warp) * 8;
    if (n0 >= n) return;
    // A rows g and g + 8 (zero past m), B column n0 + g (zero past n).
    const bool ra = g < m, rb = g + 8 < m, cw = n0 + g < n;
    const unsigned char* qa = q + (size_t)(ra ? g : 0) * kp + t4 * 4;
    const unsigned char* qb = q + (size_t)(rb ? g + 8 : 0) * kp + t4 * 4;
    const unsigned char* wr = w + (size_t)(cw ? n0 + g : 0) * kp + t4 * 4;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int k0 = 0; k0 < kp; k0 += 32 * W8A8_GEMV_UNROLL) {
        unsigned int af[W8A8_GEMV_UNROLL][4], bf[W8A8_GEMV_UNROLL][2];
#pragma unroll
        for (int u = 0; u < W8A8_GEMV_UNROLL; ++u) {
            const int k = k0 + 32 * u;
            const bool live = k < kp;
            const auto word = [&](const unsigned char* p, bool on, int off) {
                return on && live ? __ldg(reinterpret_cast<const unsigned int*>(p + k + off)) : 0u;
            };
            af[u][0] = word(qa, ra, 0);
            af[u][1] = word(qb, rb, 0);
            af[u][2] = word(qa, ra, 16);
            af[u][3] = word(qb, rb, 16);
            bf[u][0] = word(wr, cw, 0);
            bf[u][1] = word(wr, cw, 16);
        }
#pragma unroll
        for (int u = 0; u < W8A8_GEMV_UNROLL; ++u)
            if (k0 + 32 * u < kp) mma_e4m3(acc, af[u], bf[u]);
    }
    // C fragment: rows g, g + 8 (e / 2), columns 2 t4 + e % 2.
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const int r = g + 8 * (e >> 1), c = n0 + 2 * t4 + (e & 1);
        if (r < m && c < n) y[(size_t)r * ldy + c] = acc[e] * sx[r] * sw[c];
    }
}

// ---- host-emulated: end ----
