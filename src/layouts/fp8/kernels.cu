// FP8 weight x f32 activation ("w8a16") projections over the `fp8` pack layout: E4M3 codes
// [np, kp] row-major with one f32 scale per 128x128 block ([np/128, kp/128]).
// y[r, j] = sum_kb s[j/128, kb] * sum_{i in kb} e4m3(w[j, i]) * a(x[r, i])   (j < n, i < k)
// a = identity (GEMVs, base GEMM) or round-to-bf16 (tensor-core GEMMs). Contract and CPU twin:
// src/gpu/reference.rs `fp8_block_row`. Requirements (checked by the layer): k % 16 == 0,
// kp % 128 == 0, np % 128 == 0, 16-byte aligned pointers.
// Common arguments: (x, m, w, s, y, n, k, kp, ldy); x row stride k, y row stride ldy.

#include "common.cuh"

// ---- host-emulated: begin (tests/cuda_emu.rs compiles the GEMVs as C++) ----

// ---- GEMV: one warp per R output rows and 1 / KS of k, 16 weight bytes per lane per row per step ----
// Each activation load (4 bytes per weight byte) is reused for R rows, so the f32 activations
// do not dominate the traffic of an FP8 weight stream. Rows j0..j0+R lie in one 128-row scale
// band (R divides 128). A block's 8 warps form 8 / KS row groups; the KS warps of a group take
// the k steps ks, ks + KS, ... and their sums are added in warp order through shared memory
// (KS = 2 gives the down projection, n = 4096 at llama-8B, 256 blocks instead of 128).
// Four E4M3 bytes of w as f32 times 2^-8, exactly, in byte order (v[i] from byte i): each byte's
// exponent and mantissa bits moved into an IEEE half's (a half's exponent bias, 15, is the
// E4M3 bias, 7, plus 8, and both formats' subnormals have the exponent field 0, so the half is
// the E4M3 value times 2^-8 for every finite code), then the two halves of a pair widened.
// Five integer operations and four conversions for four values, where e4m3_to_f32 takes three
// per value. The NaN codes 0x7f and 0xff, which no encoder of this project writes, read as
// +-480 here (formats.md, "fp8"). CVT = true: e4m3_to_f32 per byte (the previous decode,
// kept for bench-gpu's comparison).
template <bool CVT>
__device__ __forceinline__ void e4m3x4_f32_2m8(unsigned int w, float (&v)[4]) {
    if (CVT) {
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = e4m3_to_f32(w >> (8 * i)) * 0x1p-8f;
        return;
    }
    const unsigned int even = ((w << 7) & 0x3f803f80u) | ((w << 8) & 0x80008000u);  // bytes 0, 2
    const unsigned int odd = ((w >> 1) & 0x3f803f80u) | (w & 0x80008000u);          // bytes 1, 3
    v[0] = __half2float(__ushort_as_half((unsigned short)(even & 0xffffu)));
    v[2] = __half2float(__ushort_as_half((unsigned short)(even >> 16)));
    v[1] = __half2float(__ushort_as_half((unsigned short)(odd & 0xffffu)));
    v[3] = __half2float(__ushort_as_half((unsigned short)(odd >> 16)));
}

template <int M, int R, int KS, bool CVT = false>
__device__ __forceinline__ void gemv_fp8(const float* __restrict__ x, int m, const unsigned char* __restrict__ w,
                                         const float* __restrict__ s, float* __restrict__ y, int n, int k, int kp, int ldy) {
    constexpr int W = 8, G = W / KS;  // warps per block, row groups per block
    __shared__ float red[KS > 1 ? W : 1][M][R];
    pdl_trigger();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, ks = warp % KS;
    const int j0 = (blockIdx.x * G + warp / KS) * R;
    if (KS == 1 && j0 >= n) return;
    const int gk = kp >> 7;
    float acc[M][R];
#pragma unroll
    for (int r = 0; r < M; ++r)
#pragma unroll
        for (int q = 0; q < R; ++q) acc[r][q] = 0.f;
    const float* sr = s + (size_t)(j0 >> 7) * gk;
    // Rows j0.. < np (the layout pads rows to 128), so a group past n reads padding, never stored.
    for (int kk = (ks * 32 + lane) * 16; j0 < n && kk < k; kk += 512 * KS) {
        uint4 v[R];
#pragma unroll
        for (int q = 0; q < R; ++q) v[q] = __ldg(reinterpret_cast<const uint4*>(w + (size_t)(j0 + q) * kp + kk));
        const float sc256 = __ldg(sr + (kk >> 7)) * 256.0f;
        if (kk == (ks * 32 + lane) * 16) pdl_wait();  // x: the previous launch's (common.cuh)
#pragma unroll
        for (int r = 0; r < M; ++r) {
            if (r < m) {
                float xv[16];
                load_f32s(x + (size_t)r * k + kk, xv);
#pragma unroll
                for (int q = 0; q < R; ++q) {
                    const unsigned int words[4] = {v[q].x, v[q].y, v[q].z, v[q].w};
                    float p = 0.f;
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        float wv[4];
                        e4m3x4_f32_2m8<CVT>(words[i], wv);
#pragma unroll
                        for (int e = 0; e < 4; ++e) p += wv[e] * xv[4 * i + e];
                    }
                    acc[r][q] += p * sc256;  // the decode's 2^-8 back (exact)
                }
            }
        }
    }
    pdl_wait();  // a lane with no chunks stores alike
#pragma unroll
    for (int r = 0; r < M; ++r)
#pragma unroll
        for (int q = 0; q < R; ++q) {
            float t = acc[r][q];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
            if (KS == 1) {
                if (lane == 0 && r < m && j0 + q < n) y[(size_t)r * ldy + j0 + q] = t;
            } else if (lane == 0) {
                red[warp][r][q] = t;
            }
        }
    if (KS > 1) {
        __syncthreads();
        for (int i = threadIdx.x; i < G * M * R; i += blockDim.x) {
            const int grp = i / (M * R), r = (i / R) % M, q = i % R;
            const int j = (blockIdx.x * G + grp) * R + q;
            float t = 0.f;
#pragma unroll
            for (int e = 0; e < KS; ++e) t += red[grp * KS + e][r][q];
            if (r < m && j < n) y[(size_t)r * ldy + j] = t;
        }
    }
}

static_assert(MP_FP8_GEMV_ROWS == 8 / 2 * 4, "w8a16_gemv_batch4: 8 warps, KS = 2, R = 4");
// m <= 4. Grid ceil(n / MP_FP8_GEMV_ROWS), block 256 (4 row groups x 4 rows, k split in two).
extern "C" __global__ void w8a16_gemv_batch4(const float* x, int m, const unsigned char* w, const float* s, float* y,
                                             int n, int k, int kp, int ldy) {
    gemv_fp8<4, 4, 2>(x, m, w, s, y, n, k, kp, ldy);
}

// The same with the previous per-byte decode (bench-gpu's decode-kernel comparison).
extern "C" __global__ void w8a16_gemv_batch4_cvt(const float* x, int m, const unsigned char* w, const float* s, float* y,
                                                 int n, int k, int kp, int ldy) {
    gemv_fp8<4, 4, 2, true>(x, m, w, s, y, n, k, kp, ldy);
}

// m <= 16. Grid ceil(n / 16), block 256 (8 warps x 2 rows).
extern "C" __global__ void w8a16_gemv_batch16(const float* x, int m, const unsigned char* w, const float* s, float* y,
                                              int n, int k, int kp, int ldy) {
    gemv_fp8<16, 2, 1>(x, m, w, s, y, n, k, kp, ldy);
}

// ---- The FP8 decode GEMV on the bf16 tensor-core MMA (decode-roofline issue, second round) ----
// The FFMA GEMVs above spend a conversion per weight (E4M3 -> f32) and one FFMA per weight and
// activation row, so their time grows with m (2.4x the m = 1 time at m = 4 on the H200). Here a block owns 16 weight rows (one m16n8k16 A) and its W warps split k in
// 128-value chunks, one scale block each (warp w takes chunks w, w + W, ...). In a chunk, lane
// (g = lane / 4, t = lane % 4) loads the 32 code bytes at k0 = 128 c + 32 t of rows g and g + 8
// (two 16-byte loads each) and turns each 32-bit word q (bytes b0..b3 at k0 + 4q ..) into two
// bf16 pairs, (b0, b2) and (b1, b3), each exactly its E4M3 value (e4m3x4_bf16x2). They are A:
// (row g, k slots 2t, 2t+1) = (b0, b2), (row g, slots 2t+8, 2t+9) = (b1, b3), the same for row
// g + 8; B holds the same k of activation rows g (and g + 8 for NT = 2) rounded to bf16. Lanes of
// one t share k0, so A and B pair the same k. One MMA per word and row pair; the chunk's f32 sum
// times the block's f32 scale is added to the total, and the W warps' totals are added in warp
// order through shared memory. Contract (formats.md, "fp8"): activations rounded to bf16
// (`round Bf16`, the CPU twin `reference::fp8_block_row`), f32 accumulation.
#define F8G_ROWS MP_FP8_MMA_GEMV_ROWS
#define F8G_CHUNK 128

// The four E4M3 bytes of w as two bf16 pairs, exactly: even = (b0, b2), odd = (b1, b3) (low half
// first). Each byte's 7 magnitude bits go to a bf16's exponent low bits and mantissa top bits,
// its sign to the sign: the bf16 is the E4M3 value times 2^-120 for every code (both formats'
// subnormals have exponent field 0; the E4M3 bias 7 is bf16's 127 less 120), and one bf16
// multiply by 2^120 (0x7b80) restores it exactly (the smallest code, 2^-9, is a normal bf16).
// The NaN codes 0x7f and 0xff, which no encoder of this project writes, read as +-480, as in
// e4m3x4_f32_2m8. Five integer operations and two bf16 multiplies for four values.
__device__ __forceinline__ void e4m3x4_bf16x2(unsigned int w, unsigned int& even, unsigned int& odd) {
    const unsigned int two120 = 0x7b807b80u;
    even = bf16x2_mul(((w << 4) & 0x07f007f0u) | ((w << 8) & 0x80008000u), two120);
    odd = bf16x2_mul(((w >> 4) & 0x07f007f0u) | (w & 0x80008000u), two120);
}

// One lane's chunk: 32 code bytes of rows g and g + 8 at k0, and the chunk's block scale.
struct F8gChunk {
    uint4 a0, a1, b0, b1;
    float s;
};

// Chunk c of rows ra and rb (zero, and no load, past k: a chunk that starts below k lies inside
// kp, which is a multiple of 128).
__device__ __forceinline__ F8gChunk f8g_load(const unsigned char* __restrict__ ra, const unsigned char* __restrict__ rb,
                                             const float* __restrict__ sr, int c, int t, int k) {
    F8gChunk ch;
    if (c * F8G_CHUNK < k) {
        const int k0 = c * F8G_CHUNK + 32 * t;
        ch.a0 = ldg_stream(ra + k0);
        ch.a1 = ldg_stream(ra + k0 + 16);
        ch.b0 = ldg_stream(rb + k0);
        ch.b1 = ldg_stream(rb + k0 + 16);
        ch.s = __ldg(sr + c);
    } else {
        ch.a0 = make_uint4(0, 0, 0, 0);
        ch.a1 = ch.a0;
        ch.b0 = ch.a0;
        ch.b1 = ch.a0;
        ch.s = 0.f;
    }
    return ch;
}

// acc[nt] += s * (the chunk's MMA sum) for activation rows g + 8 nt (zero where r >= m or the
// word lies past k: k % 16 == 0, so a word of 4 values is wholly inside or outside). ILP (the
// bench-only `_ilp` form): every B fragment of the chunk loaded before the first MMA, and the
// MMAs alternate between two accumulators (two dependency chains of 4 instead of one of 8).
template <int NT, bool ILP = false>
__device__ __forceinline__ void f8g_mma_chunk(const F8gChunk& ch, const float* __restrict__ x, int m, int k, int k0, int g,
                                              float (&acc)[NT][4]) {
    if (ILP) {
        const unsigned int wa[8] = {ch.a0.x, ch.a0.y, ch.a0.z, ch.a0.w, ch.a1.x, ch.a1.y, ch.a1.z, ch.a1.w};
        const unsigned int wb[8] = {ch.b0.x, ch.b0.y, ch.b0.z, ch.b0.w, ch.b1.x, ch.b1.y, ch.b1.z, ch.b1.w};
        unsigned int bx[8][NT][2];
#pragma unroll
        for (int q = 0; q < 8; ++q)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const int r = g + 8 * nt, kk = k0 + 4 * q;
                float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
                if (r < m && kk < k) v = __ldg(reinterpret_cast<const float4*>(x + (size_t)r * k + kk));
                bx[q][nt][0] = pack2_bf16(v.x, v.z);
                bx[q][nt][1] = pack2_bf16(v.y, v.w);
            }
        float part[2][NT][4];
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) part[h][nt][e] = 0.f;
#pragma unroll
        for (int q = 0; q < 8; ++q) {
            unsigned int a[4];
            e4m3x4_bf16x2(wa[q], a[0], a[2]);
            e4m3x4_bf16x2(wb[q], a[1], a[3]);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) mma_m16n8k16_bf16(part[q & 1][nt], a, bx[q][nt]);
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[nt][e] += (part[0][nt][e] + part[1][nt][e]) * ch.s;
        return;
    }
    const unsigned int wa[8] = {ch.a0.x, ch.a0.y, ch.a0.z, ch.a0.w, ch.a1.x, ch.a1.y, ch.a1.z, ch.a1.w};
    const unsigned int wb[8] = {ch.b0.x, ch.b0.y, ch.b0.z, ch.b0.w, ch.b1.x, ch.b1.y, ch.b1.z, ch.b1.w};
    float part[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[nt][e] = 0.f;
#pragma unroll
    for (int q = 0; q < 8; ++q) {
        unsigned int a[4];
        e4m3x4_bf16x2(wa[q], a[0], a[2]);
        e4m3x4_bf16x2(wb[q], a[1], a[3]);
        const int kk = k0 + 4 * q;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const int r = g + 8 * nt;
            unsigned int b[2] = {0u, 0u};
            if (r < m && kk < k) {
                const float4 v = __ldg(reinterpret_cast<const float4*>(x + (size_t)r * k + kk));
                b[0] = pack2_bf16(v.x, v.z);
                b[1] = pack2_bf16(v.y, v.w);
            }
            mma_m16n8k16_bf16(part[nt], a, b);
        }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][e] += part[nt][e] * ch.s;
}

// y[r, j] = sum_kb s[j / 128, kb] * sum_{i in kb} e4m3(w[j, i]) * bf16(x[r, i]) for the 16 rows
// of block blockIdx.x, r < m <= 8 NT. Rows past n (< np: the layout pads rows to 128) are read,
// never stored.
template <int NT, int W, bool ILP = false>
__device__ __forceinline__ void gemv_fp8_mma(const float* __restrict__ x, int m, const unsigned char* __restrict__ w,
                                             const float* __restrict__ s, float* __restrict__ y, int n, int k, int kp,
                                             int ldy) {
    __shared__ float red[W][NT][32][4];
    pdl_trigger();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int j0 = blockIdx.x * F8G_ROWS;
    const unsigned char* ra = w + (size_t)(j0 + g) * kp;
    const unsigned char* rb = w + (size_t)(j0 + g + 8) * kp;
    const float* sr = s + (size_t)(j0 >> 7) * (kp >> 7);
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
    // One chunk in flight ahead of the one being multiplied.
    int c = warp;
    F8gChunk cur = f8g_load(ra, rb, sr, c, t, k);
    pdl_wait();  // x: the previous launch's, read from here on (common.cuh)
    for (; c * F8G_CHUNK < k; c += W) {
        const F8gChunk nxt = f8g_load(ra, rb, sr, c + W, t, k);
        f8g_mma_chunk<NT, ILP>(cur, x, m, k, c * F8G_CHUNK + 32 * t, g, acc);
        cur = nxt;
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) red[warp][nt][lane][e] = acc[nt][e];
    __syncthreads();
    // C fragment element e of lane l: weight row g + 8 (e / 2), activation row 2 t + e % 2.
    for (int i = threadIdx.x; i < NT * 32 * 4; i += blockDim.x) {
        const int nt = i / 128, l = (i / 4) % 32, e = i % 4;
        float sum = 0.f;
#pragma unroll
        for (int v = 0; v < W; ++v) sum += red[v][nt][l][e];
        const int row = j0 + (l >> 2) + 8 * (e >> 1), col = nt * 8 + 2 * (l & 3) + (e & 1);
        if (row < n && col < m) y[(size_t)col * ldy + row] = sum;
    }
}

static_assert(MP_FP8_MMA_GEMV_ROWS == 16, "one m16n8k16 A per block");
static_assert(128 % MP_FP8_MMA_GEMV_ROWS == 0, "a block's rows lie in one 128-row scale band");
// m <= 8. Grid ceil(n / MP_FP8_MMA_GEMV_ROWS), block 32 MP_FP8_MMA_GEMV_WARPS. (Forms with 16
// activation rows and with 16 warps for the down projection measured slower on the H200 at every
// m they could serve: BENCHMARKS.md, session 17.)
extern "C" __global__ void w8a16_gemv_mma(const float* x, int m, const unsigned char* w, const float* s, float* y, int n,
                                          int k, int kp, int ldy) {
    gemv_fp8_mma<1, MP_FP8_MMA_GEMV_WARPS>(x, m, w, s, y, n, k, kp, ldy);
}

// The same with the chunk's activation loads ahead of its MMAs and two accumulators (bench-gpu's
// comparison of what limits this GEMV; the layer never routes to it).
extern "C" __global__ void w8a16_gemv_mma_ilp(const float* x, int m, const unsigned char* w, const float* s, float* y,
                                              int n, int k, int kp, int ldy) {
    gemv_fp8_mma<1, MP_FP8_MMA_GEMV_WARPS, true>(x, m, w, s, y, n, k, kp, ldy);
}

// ---- host-emulated: end ----

// ---- Tensor-core GEMM: bf16 mma.sync m16n8k16, tile BM x 128 x 32, 4 warps ----
// Weights decode exactly to bf16 (E4M3 fits in bf16); activations round to bf16. A 128-row
// output tile shares one scale per 128-wide k block: partial sums per block, then scaled.
// The next k tile is loaded into registers while the current one is multiplied.
#define TC_BN 128
#define TC_BK 32
#define TC_PAD 8

template <int BM, int WARPS_M>
__device__ __forceinline__ void gemm_fp8_tc(const float* __restrict__ x, int m, const unsigned char* __restrict__ w,
                                            const float* __restrict__ s, float* __restrict__ y, int n, int k, int kp, int ldy) {
    constexpr int WARPS_N = 4 / WARPS_M;
    constexpr int WM = BM / WARPS_M, WN = TC_BN / WARPS_N;
    constexpr int MT = WM / 16, NT = WN / 8;
    constexpr int A_VEC = BM * TC_BK / 4 / 128;  // float4 per thread
    __shared__ __align__(16) __nv_bfloat16 As[BM][TC_BK + TC_PAD];
    __shared__ __align__(16) __nv_bfloat16 Bs[TC_BN][TC_BK + TC_PAD];

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm0 = (warp / WARPS_N) * WM, wn0 = (warp % WARPS_N) * WN;
    const int n0 = blockIdx.x * TC_BN, m0 = blockIdx.y * BM;
    const int gk = kp >> 7;
    const int g = lane >> 2, t4 = lane & 3;

    float acc[MT][NT][4], part[MT][NT][4];
#pragma unroll
    for (int a = 0; a < MT; ++a)
#pragma unroll
        for (int b = 0; b < NT; ++b)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[a][b][c] = part[a][b][c] = 0.f;

    float4 ra[A_VEC];
    uint4 rb[2];
    auto load = [&](int k0) {
#pragma unroll
        for (int v = 0; v < A_VEC; ++v) {
            const int idx = tid + v * 128;  // float4 index in the BM x 8 grid
            const int row = idx >> 3, col = (idx & 7) * 4;
            const int gr = m0 + row, gc = k0 + col;
            ra[v] = (gr < m && gc < k) ? __ldg(reinterpret_cast<const float4*>(x + (size_t)gr * k + gc)) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int v = 0; v < 2; ++v) {
            const int idx = tid + v * 128;  // uint4 index in the 128 x 2 grid
            const int row = idx >> 1, col = (idx & 1) * 16;
            rb[v] = __ldg(reinterpret_cast<const uint4*>(w + (size_t)(n0 + row) * kp + k0 + col));
        }
    };
    auto store = [&]() {
#pragma unroll
        for (int v = 0; v < A_VEC; ++v) {
            const int idx = tid + v * 128;
            const int row = idx >> 3, col = (idx & 7) * 4;
            unsigned int* d = reinterpret_cast<unsigned int*>(&As[row][col]);
            d[0] = pack2_bf16(ra[v].x, ra[v].y);
            d[1] = pack2_bf16(ra[v].z, ra[v].w);
        }
#pragma unroll
        for (int v = 0; v < 2; ++v) {
            const int idx = tid + v * 128;
            const int row = idx >> 1, col = (idx & 1) * 16;
            const unsigned int words[4] = {rb[v].x, rb[v].y, rb[v].z, rb[v].w};
            unsigned int* d = reinterpret_cast<unsigned int*>(&Bs[row][col]);
#pragma unroll
            for (int q = 0; q < 8; ++q) {
                const unsigned int wd = words[q >> 1] >> (16 * (q & 1));
                d[q] = pack2_bf16(e4m3_to_f32(wd), e4m3_to_f32(wd >> 8));
            }
        }
    };

    const int ktiles = (k + TC_BK - 1) / TC_BK;
    load(0);
    store();
    __syncthreads();
    for (int t = 0; t < ktiles; ++t) {
        if (t + 1 < ktiles) load((t + 1) * TC_BK);
#pragma unroll
        for (int ks = 0; ks < TC_BK; ks += 16) {
            unsigned int af[MT][4], bfr[NT][2];
#pragma unroll
            for (int a = 0; a < MT; ++a) {
                const int r = wm0 + a * 16 + g, c = ks + t4 * 2;
                af[a][0] = *reinterpret_cast<const unsigned int*>(&As[r][c]);
                af[a][1] = *reinterpret_cast<const unsigned int*>(&As[r + 8][c]);
                af[a][2] = *reinterpret_cast<const unsigned int*>(&As[r][c + 8]);
                af[a][3] = *reinterpret_cast<const unsigned int*>(&As[r + 8][c + 8]);
            }
#pragma unroll
            for (int b = 0; b < NT; ++b) {
                const int r = wn0 + b * 8 + g, c = ks + t4 * 2;
                bfr[b][0] = *reinterpret_cast<const unsigned int*>(&Bs[r][c]);
                bfr[b][1] = *reinterpret_cast<const unsigned int*>(&Bs[r][c + 8]);
            }
#pragma unroll
            for (int a = 0; a < MT; ++a)
#pragma unroll
                for (int b = 0; b < NT; ++b) mma_m16n8k16_bf16(part[a][b], af[a], bfr[b]);
        }
        const int k_end = (t + 1) * TC_BK;
        if ((k_end & 127) == 0 || t + 1 == ktiles) {
            const float sc = __ldg(s + (size_t)(n0 >> 7) * gk + (t * TC_BK >> 7));
#pragma unroll
            for (int a = 0; a < MT; ++a)
#pragma unroll
                for (int b = 0; b < NT; ++b)
#pragma unroll
                    for (int c = 0; c < 4; ++c) {
                        acc[a][b][c] += part[a][b][c] * sc;
                        part[a][b][c] = 0.f;
                    }
        }
        __syncthreads();
        if (t + 1 < ktiles) {
            store();
            __syncthreads();
        }
    }
#pragma unroll
    for (int a = 0; a < MT; ++a)
#pragma unroll
        for (int b = 0; b < NT; ++b) {
            const int r = m0 + wm0 + a * 16 + g, c = n0 + wn0 + b * 8 + t4 * 2;
            if (r < m) {
                if (c < n) y[(size_t)r * ldy + c] = acc[a][b][0];
                if (c + 1 < n) y[(size_t)r * ldy + c + 1] = acc[a][b][1];
            }
            if (r + 8 < m) {
                if (c < n) y[(size_t)(r + 8) * ldy + c] = acc[a][b][2];
                if (c + 1 < n) y[(size_t)(r + 8) * ldy + c + 1] = acc[a][b][3];
            }
        }
}

// m <= 16 rows (the layer launches twice for 17..32). Grid (np / 128, 1), block 128.
extern "C" __global__ void w8a16_gemm_m16(const float* x, int m, const unsigned char* w, const float* s, float* y,
                                          int n, int k, int kp, int ldy) {
    gemm_fp8_tc<16, 1>(x, m, w, s, y, n, k, kp, ldy);
}

// Any m. Grid (np / 128, ceil(m / 64)), block 128.
extern "C" __global__ void w8a16_gemm_pipelined(const float* x, int m, const unsigned char* w, const float* s, float* y,
                                                int n, int k, int kp, int ldy) {
    gemm_fp8_tc<64, 2>(x, m, w, s, y, n, k, kp, ldy);
}

// ---- Base GEMM: f32 SIMT, 64 x 64 tile, k step 32, each thread 4 x 4 outputs ----
// Exact f32 activations. Grid (ceil(n / 64), ceil(m / 64)), block 256.
extern "C" __global__ void w8a16_gemm(const float* __restrict__ x, int m, const unsigned char* __restrict__ w,
                                      const float* __restrict__ s, float* __restrict__ y, int n, int k, int kp, int ldy) {
    __shared__ float As[32][64 + 1];
    __shared__ float Bs[32][64 + 1];
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int n0 = blockIdx.x * 64, m0 = blockIdx.y * 64;
    const int gk = kp >> 7;
    float acc[4][4] = {}, part[4][4] = {};
    for (int k0 = 0; k0 < k; k0 += 32) {
        for (int i = threadIdx.x; i < 64 * 32; i += 256) {
            const int r = i >> 5, c = i & 31;
            const int gr = m0 + r, gc = k0 + c;
            As[c][r] = (gr < m && gc < k) ? x[(size_t)gr * k + gc] : 0.f;
            const int gn = n0 + r;
            Bs[c][r] = (gn < n && gc < k) ? e4m3_to_f32(w[(size_t)gn * kp + gc]) : 0.f;
        }
        __syncthreads();
#pragma unroll 8
        for (int c = 0; c < 32; ++c) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                a[i] = As[c][ty * 4 + i];
                b[i] = Bs[c][tx * 4 + i];
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) part[i][j] += a[i] * b[j];
        }
        __syncthreads();
        if (((k0 + 32) & 127) == 0 || k0 + 32 >= k) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int gn = n0 + tx * 4 + j;
                const float sc = gn < n ? s[(size_t)(gn >> 7) * gk + (k0 >> 7)] : 0.f;
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    acc[i][j] += part[i][j] * sc;
                    part[i][j] = 0.f;
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int r = m0 + ty * 4 + i, c = n0 + tx * 4 + j;
            if (r < m && c < n) y[(size_t)r * ldy + c] = acc[i][j];
        }
}
