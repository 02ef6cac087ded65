// Affine integer groups (`affine` pack layout, formats.md "Affine integer groups"): codes
// `[n, kp]` row-major (4-bit pairs, value 2i in the low nibble, or bytes), and per group of a
// row (32 << gshift values, or the whole row: gshift 31) a pair in one of three forms: 0, half
// s and half b, w = s * q + b (GGUF); 1, half s and the zero point z as a half, w = s * (q - z);
// 2, the same as two f32s (8 bytes). kp % 128 == 0. The decode GEMVs multiply the codes by activations quantized to
// int8 per group (`affine_quantize_act`, formats.md "The affine GEMVs, dequantization and GPU
// carry"). Contract and CPU
// twins: src/gpu/reference.rs `affine_quantize_act_row`, `affine_q8_row`, `affine_dequant_bf16`.

#include "common.cuh"

// ---- host-emulated: begin (tests/cuda_emu.rs compiles this module as C++) ----

// Pairs per row of kp / 32 groups of 32 at gshift (31: one pair a row).
__device__ __forceinline__ int affine_pairs_per_row(int groups32, int gshift) {
    return gshift >= 31 ? 1 : groups32 >> gshift;
}

// Pair i of sb in `form` as (s, t): t the offset b (form 0) or the zero point z (1, 2).
__device__ __forceinline__ float2 affine_pair(const unsigned char* __restrict__ sb, long long i, int form) {
    if (form == 2) {
        const uint2 w = __ldg(reinterpret_cast<const uint2*>(sb) + i);
        return make_float2(__uint_as_float(w.x), __uint_as_float(w.y));
    }
    const unsigned int w = __ldg(reinterpret_cast<const unsigned int*>(sb) + i);
    return make_float2(__half2float(__ushort_as_half((unsigned short)(w & 0xffffu))),
                       __half2float(__ushort_as_half((unsigned short)(w >> 16))));
}

// The f32 value of an integer code q < 2^23 without a conversion instruction: 2^23 + q has q in
// its low mantissa bits, and subtracting 2^23 is exact.
__device__ __forceinline__ float affine_code_f32(unsigned int q) {
    return __uint_as_float(0x4B000000u | q) - 8388608.f;
}

// The byte of value l (< 32) of a group in the quantized activations: for 4-bit codes each
// 8-value word of the group holds its even values in bytes 0-3 and its odd ones in 4-7, the
// order in which `word & 0x0F0F0F0F` and `(word >> 4) & 0x0F0F0F0F` hold the codes; for 8-bit
// codes the value order.
__device__ __forceinline__ int affine_act_pos(int l, int bits) {
    return bits == 4 ? (l & ~7) | ((l & 1) << 2) | ((l & 7) >> 1) : l;
}

// One group of 32 activations, value v in lane `lane` of a warp (every lane calls it): its int8
// codes into q[affine_act_pos(lane, bits)] and (d, sum, the codes' integer sum as int bits, 0)
// into o[0..4], as affine_quantize_act states them.
__device__ __forceinline__ void affine_quantize_group(float v, int lane, int bits, signed char* __restrict__ q32,
                                                      float* __restrict__ o) {
    float amax, sum;
    warp_amax_sum(v, amax, sum);
    const float d = __fdiv_rn(amax, 127.0f);
    const float id = d != 0.f ? __fdiv_rn(1.0f, d) : 0.f;
    const int q = (int)roundf(__fmul_rn(v, id));
    q32[affine_act_pos(lane, bits)] = (signed char)q;
    int qsum = q;
#pragma unroll
    for (int o2 = 16; o2 > 0; o2 >>= 1) qsum += __shfl_xor_sync(0xffffffffu, qsum, o2);
    if (lane == 0) {
        o[0] = d;
        o[1] = sum;
        o[2] = __int_as_float(qsum);
        o[3] = 0.f;
    }
}

// Activations for the affine GEMVs: v = x (act 0), silu(x) * u (1) or gelu(x) * u (2) at row
// stride ld, f32 [m, k], to int8 codes xq [m, kp] (positions affine_act_pos) and per group of 32
// xs [m, kp / 32] = (d, sum, the integer sum of the codes as int bits, 0): d = amax / 127,
// q = roundf(v * (1 / d)) with the f32 d, sum = the f32 sum of the group's v, both sums in the
// butterfly order (xor 16, 8, 4, 2, 1); values past k are 0. With perm (u32 [kp], else null:
// the weight's columns sorted by group, act-order) value c is the input's column perm[c] (a
// column past k reads 0). One warp per group. Grid (ceil(kp / 32 / 8), m), block 256.
extern "C" __global__ void affine_quantize_act(const float* __restrict__ x, const float* __restrict__ u, int act, int m,
                                               int k, int ld, int kp, int bits, signed char* __restrict__ xq,
                                               float* __restrict__ xs, const unsigned int* __restrict__ perm) {
    pdl_trigger();
    pdl_wait();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = blockIdx.x * (blockDim.x >> 5) + warp, r = blockIdx.y;
    if (g >= kp / 32 || r >= m) return;
    const int c = g * 32 + lane;
    const unsigned int src = perm != nullptr && c < k ? perm[c] : (unsigned int)c;
    float v = 0.f;
    if (c < k && src < (unsigned int)k) {
        const float a = x[(size_t)r * ld + src];
        v = act == 0 ? a : act == 1 ? act_silu_mul(a, u[(size_t)r * ld + src]) : act_gelu_mul(a, u[(size_t)r * ld + src]);
    }
    affine_quantize_group(v, lane, bits, xq + (size_t)r * kp + 32 * g, xs + 4 * ((size_t)r * (kp / 32) + g));
}

// y[r, j] = sum over groups of 32 of s * (d * dot) + (b + Z s) * sum, per activation row r < m
// and weight row j, s and b of the group's pair (b = -(s z) in f32 for the zero forms):
// dot = sum (q - Z) xq, the exact integer product of the group's codes q centred
// on Z = 2^(BITS - 1) and its activation codes (4 bytes a dp4a: 8-bit codes as the signed bytes
// q ^ 0x80, 4-bit ones as they are with Z times the codes' sum taken off), s and b the group's,
// d and sum the activations'. Centring shrinks the activation rounding's share (the weights'
// spread about Z, not about 0, multiplies it: for codes spread evenly over 0..15 its RMS falls
// by about 1.9x). A warp computes R weight rows (a block W warps): each
// lane takes whole groups (16 code bytes at 4 bits, 32 at 8; lane l groups l, l + 32, ...), U = 2
// groups' code loads in flight before their math, and the warp's partial sums meet in a
// shuffle tree. Per 4-bit weight about one instruction (two nibble masks and a dp4a per 8
// values, the group's float work per 32), where the f32-activation GEMV spent five and ran at
// 34-39% of the copy ceiling, bound by instruction issue (BENCHMARKS-history.md, "The affine layout").
// KS > 1 (the `_ks` forms, one projection of long rows: the down projection's 4096 rows give
// the one-warp form only 2048 warps): the block's W warps split k KS ways (warp w takes the
// groups of slice w % KS: lane l groups 32 (w % KS) + l, then every 32 KS), W / KS row sets of R
// rows each, the KS partial sums added in slice order through shared memory.
template <int M, int R, int BITS, int W, int KS = 1>
__device__ __forceinline__ void gemv_affine_q8(const signed char* __restrict__ xq, const float* __restrict__ xs, int m,
                                               const unsigned char* __restrict__ codes, const unsigned char* __restrict__ sb,
                                               float* __restrict__ y, int n, int kp, int form, int gshift, int ldy) {
    constexpr int CH = BITS / 4;  // 16-byte code chunks per group
    constexpr int U = 2;  // groups a lane loads before it multiplies (4 and 8 at 4 bits measured slower)
    static_assert(W % KS == 0, "whole row sets per block");
    __shared__ float red[KS > 1 ? W : 1][M][R];
    pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, ks = warp % KS;
    const int j0 = (blockIdx.x * (W / KS) + warp / KS) * R;
    if (KS == 1 && j0 >= n) return;  // a whole warp: nothing below waits on the block
    const int groups = kp / 32;
    const int prow = affine_pairs_per_row(groups, gshift);
    const size_t row_bytes = (size_t)kp * BITS / 8;
    float acc[M][R];
#pragma unroll
    for (int r = 0; r < M; ++r)
#pragma unroll
        for (int q = 0; q < R; ++q) acc[r][q] = 0.f;
    int rows[R];
#pragma unroll
    for (int q = 0; q < R; ++q) rows[q] = min(j0 + q, n - 1);  // rows past n: never stored
    const int first = 32 * ks + lane;
    for (int g0 = first; g0 < groups; g0 += 32 * U * KS) {
        uint4 v[U][R][CH];
        float2 p[U][R];
#pragma unroll
        for (int e = 0; e < U; ++e) {
            const int g = min(g0 + 32 * KS * e, groups - 1);  // past the end: loaded, not used
#pragma unroll
            for (int q = 0; q < R; ++q) {
#pragma unroll
                for (int h = 0; h < CH; ++h) v[e][q][h] = ldg_stream(codes + rows[q] * row_bytes + (size_t)g * 16 * CH + 16 * h);
                p[e][q] = affine_pair(sb, (long long)rows[q] * prow + (g >> gshift), form);
            }
        }
        // The activations are the previous launch's output: wait for it once, the first
        // groups' weight loads already in flight (common.cuh, pdl_wait).
        if (g0 == first) pdl_wait();
#pragma unroll
        for (int e = 0; e < U; ++e) {
            const int g = g0 + 32 * KS * e;
            if (g >= groups) break;
            // The codes as signed bytes for dp4a: 8 words a group.
            int cw[R][8];
            float s[R], b[R];
#pragma unroll
            for (int q = 0; q < R; ++q) {
#pragma unroll
                for (int h = 0; h < CH; ++h) {
                    const unsigned int w[4] = {v[e][q][h].x, v[e][q][h].y, v[e][q][h].z, v[e][q][h].w};
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        if (BITS == 4) {
                            cw[q][2 * i] = (int)(w[i] & 0x0F0F0F0Fu);
                            cw[q][2 * i + 1] = (int)((w[i] >> 4) & 0x0F0F0F0Fu);
                        } else {
                            cw[q][4 * h + i] = (int)(w[i] ^ 0x80808080u);
                        }
                    }
                }
                s[q] = p[e][q].x;
                const float off = form == 0 ? p[e][q].y : -(s[q] * p[e][q].y);
                b[q] = fmaf((float)(1 << (BITS - 1)), s[q], off);
            }
#pragma unroll
            for (int r = 0; r < M; ++r) {
                if (r >= m) break;
                const int4* a4 = reinterpret_cast<const int4*>(xq + (size_t)r * kp + 32 * (size_t)g);
                const int4 a0 = __ldg(a4), a1 = __ldg(a4 + 1);
                const int a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
                const float4 ds = __ldg(reinterpret_cast<const float4*>(xs) + (size_t)r * groups + g);
                const int zsum = BITS == 4 ? 8 * __float_as_int(ds.z) : 0;
#pragma unroll
                for (int q = 0; q < R; ++q) {
                    int dot = -zsum;
#pragma unroll
                    for (int i = 0; i < 8; ++i) dot = __dp4a(cw[q][i], a[i], dot);
                    acc[r][q] = fmaf(s[q], ds.x * (float)dot, acc[r][q]);
                    acc[r][q] = fmaf(b[q], ds.y, acc[r][q]);
                }
            }
        }
    }
    pdl_wait();  // a lane with no groups (kp < 32 * lane) stores nothing, but waits alike
#pragma unroll
    for (int r = 0; r < M; ++r) {
        if (r >= m) break;
#pragma unroll
        for (int q = 0; q < R; ++q) {
            float t = acc[r][q];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
            if (KS == 1) {
                if (lane == 0 && j0 + q < n) y[(size_t)r * ldy + j0 + q] = t;
            } else if (lane == 0) {
                red[warp][r][q] = t;
            }
        }
    }
    if (KS > 1) {
        __syncthreads();
        constexpr int SETS = W / KS;
        for (int i = threadIdx.x; i < SETS * M * R; i += blockDim.x) {
            const int set = i / (M * R), r = (i / R) % M, q = i % R;
            const int j = (blockIdx.x * SETS + set) * R + q;
            float t = 0.f;
#pragma unroll
            for (int e = 0; e < KS; ++e) t += red[set * KS + e][r][q];
            if (r < m && j < n) y[(size_t)r * ldy + j] = t;
        }
    }
}

// Decode, one activation row; 4-bit codes; blockIdx.y 0 the projection (cg, sg) into yg, 1 (gate and up
// in one launch) (cu, su) into yu. Grid (ceil(n / (MP_AFFINE_GEMV_ROWS * MP_AFFINE_GEMV_WARPS)),
// projs), block 32 * MP_AFFINE_GEMV_WARPS.
extern "C" __global__ void affine4_gemv(const signed char* xq, const float* xs, int m, const unsigned char* cg,
                                       const unsigned char* sg, float* yg, const unsigned char* cu,
                                       const unsigned char* su, float* yu, int projs, int n, int kp, int form, int gshift,
                                       int ldy) {
    const bool up = blockIdx.y == 1;
    gemv_affine_q8<1, MP_AFFINE_GEMV_ROWS, 4, MP_AFFINE_GEMV_WARPS>(xq, xs, m, up ? cu : cg, up ? su : sg, up ? yu : yg,
                                                                     n, kp, form, gshift, ldy);
}

// m <= 4; 4-bit codes; blockIdx.y 0 the projection (cg, sg) into yg, 1 (gate and up
// in one launch) (cu, su) into yu. Grid (ceil(n / (MP_AFFINE_GEMV_ROWS * MP_AFFINE_GEMV_WARPS)),
// projs), block 32 * MP_AFFINE_GEMV_WARPS.
extern "C" __global__ void affine4_gemv_batch4(const signed char* xq, const float* xs, int m, const unsigned char* cg,
                                              const unsigned char* sg, float* yg, const unsigned char* cu,
                                              const unsigned char* su, float* yu, int projs, int n, int kp, int form, int gshift,
                                       int ldy) {
    const bool up = blockIdx.y == 1;
    gemv_affine_q8<4, MP_AFFINE_GEMV_ROWS, 4, MP_AFFINE_GEMV_WARPS>(xq, xs, m, up ? cu : cg, up ? su : sg, up ? yu : yg,
                                                                     n, kp, form, gshift, ldy);
}

// m <= 16; 4-bit codes; blockIdx.y 0 the projection (cg, sg) into yg, 1 (gate and up
// in one launch) (cu, su) into yu. Grid (ceil(n / (MP_AFFINE_GEMV_ROWS * MP_AFFINE_GEMV_WARPS)),
// projs), block 32 * MP_AFFINE_GEMV_WARPS.
extern "C" __global__ void affine4_gemv_batch16(const signed char* xq, const float* xs, int m, const unsigned char* cg,
                                               const unsigned char* sg, float* yg, const unsigned char* cu,
                                               const unsigned char* su, float* yu, int projs, int n, int kp, int form, int gshift,
                                       int ldy) {
    const bool up = blockIdx.y == 1;
    gemv_affine_q8<16, MP_AFFINE_GEMV_ROWS, 4, MP_AFFINE_GEMV_WARPS>(xq, xs, m, up ? cu : cg, up ? su : sg, up ? yu : yg,
                                                                      n, kp, form, gshift, ldy);
}

// Decode, one activation row; 8-bit codes; blockIdx.y 0 the projection (cg, sg) into yg, 1 (gate and up
// in one launch) (cu, su) into yu. Grid (ceil(n / (MP_AFFINE_GEMV_ROWS * MP_AFFINE_GEMV_WARPS)),
// projs), block 32 * MP_AFFINE_GEMV_WARPS.
extern "C" __global__ void affine8_gemv(const signed char* xq, const float* xs, int m, const unsigned char* cg,
                                       const unsigned char* sg, float* yg, const unsigned char* cu,
                                       const unsigned char* su, float* yu, int projs, int n, int kp, int form, int gshift,
                                       int ldy) {
    const bool up = blockIdx.y == 1;
    gemv_affine_q8<1, MP_AFFINE_GEMV_ROWS, 8, MP_AFFINE_GEMV_WARPS>(xq, xs, m, up ? cu : cg, up ? su : sg, up ? yu : yg,
                                                                     n, kp, form, gshift, ldy);
}

// m <= 4; 8-bit codes; blockIdx.y 0 the projection (cg, sg) into yg, 1 (gate and up
// in one launch) (cu, su) into yu. Grid (ceil(n / (MP_AFFINE_GEMV_ROWS * MP_AFFINE_GEMV_WARPS)),
// projs), block 32 * MP_AFFINE_GEMV_WARPS.
extern "C" __global__ void affine8_gemv_batch4(const signed char* xq, const float* xs, int m, const unsigned char* cg,
                                              const unsigned char* sg, float* yg, const unsigned char* cu,
                                              const unsigned char* su, float* yu, int projs, int n, int kp, int form, int gshift,
                                       int ldy) {
    const bool up = blockIdx.y == 1;
    gemv_affine_q8<4, MP_AFFINE_GEMV_ROWS, 8, MP_AFFINE_GEMV_WARPS>(xq, xs, m, up ? cu : cg, up ? su : sg, up ? yu : yg,
                                                                     n, kp, form, gshift, ldy);
}

// m <= 16; 8-bit codes; blockIdx.y 0 the projection (cg, sg) into yg, 1 (gate and up
// in one launch) (cu, su) into yu. Grid (ceil(n / (MP_AFFINE_GEMV_ROWS * MP_AFFINE_GEMV_WARPS)),
// projs), block 32 * MP_AFFINE_GEMV_WARPS.
extern "C" __global__ void affine8_gemv_batch16(const signed char* xq, const float* xs, int m, const unsigned char* cg,
                                               const unsigned char* sg, float* yg, const unsigned char* cu,
                                               const unsigned char* su, float* yu, int projs, int n, int kp, int form, int gshift,
                                       int ldy) {
    const bool up = blockIdx.y == 1;
    gemv_affine_q8<16, MP_AFFINE_GEMV_ROWS, 8, MP_AFFINE_GEMV_WARPS>(xq, xs, m, up ? cu : cg, up ? su : sg, up ? yu : yg,
                                                                      n, kp, form, gshift, ldy);
}

// Decode, one activation row, one projection (cg, sg) into yg (cu, su, yu and projs unused: the
// shared signature), k split MP_AFFINE_GEMV_KS ways across a block's warps; 4-bit / 8-bit codes.
// Grid ceil(n / (MP_AFFINE_GEMV_ROWS * MP_AFFINE_GEMV_WARPS / MP_AFFINE_GEMV_KS)), block
// 32 * MP_AFFINE_GEMV_WARPS.
extern "C" __global__ void affine4_gemv_ks(const signed char* xq, const float* xs, int m, const unsigned char* cg,
                                          const unsigned char* sg, float* yg, const unsigned char* cu,
                                          const unsigned char* su, float* yu, int projs, int n, int kp, int form, int gshift,
                                          int ldy) {
    gemv_affine_q8<1, MP_AFFINE_GEMV_ROWS, 4, MP_AFFINE_GEMV_WARPS, MP_AFFINE_GEMV_KS>(xq, xs, m, cg, sg, yg, n, kp, form,
                                                                                        gshift, ldy);
}

extern "C" __global__ void affine8_gemv_ks(const signed char* xq, const float* xs, int m, const unsigned char* cg,
                                          const unsigned char* sg, float* yg, const unsigned char* cu,
                                          const unsigned char* su, float* yu, int projs, int n, int kp, int form, int gshift,
                                          int ldy) {
    gemv_affine_q8<1, MP_AFFINE_GEMV_ROWS, 8, MP_AFFINE_GEMV_WARPS, MP_AFFINE_GEMV_KS>(xq, xs, m, cg, sg, yg, n, kp, form,
                                                                                        gshift, ldy);
}

// The gate and up GEMVs of one activation row (blockIdx.y 0 gate (cg, sg) into yg, 1 up (cu, su)
// into yu, as affine{4,8}_gemv with projs 2) with the down projection's input quantization
// fused: the block that completes a group of 32 outputs of both (the last of the blocks that
// store its rows to arrive at the group's counter cnt[g]) forms v = silu(yg) * yu (act 1) or
// gelu(yg) * yu (act 2) of the group and quantizes it as affine_quantize_act does (the same
// affine_quantize_group, so the same bits) into dq [kpd] and ds [kpd / 32 x 4] for bitsd-bit
// weights, then sets the counter back to 0 for the next call (the counters are zero before the
// first). The block of the last group also writes the groups past n (to kpd) as zeros. No
// launch and no grid-wide wait between the projections and the down input; n, the
// intermediate size, is the down projection's k. Arrival: each warp's stores of y (lane 0's),
// its __threadfence, __syncthreads, one atomicAdd by thread 0 (the CUDA programming guide's
// "memory fence functions" example). Behind the lever `affine_fused_act` (off): measured slower
// than the separate quantizer on the H200 (BENCHMARKS.md, session 22). Grid (ceil(n / (MP_AFFINE_GEMV_ROWS *
// MP_AFFINE_GEMV_WARPS)), 2), block 32 * MP_AFFINE_GEMV_WARPS.
template <int BITS>
__device__ __forceinline__ void gemv_affine_act(const signed char* xq, const float* xs, int m, const unsigned char* cg,
                                                const unsigned char* sg, float* yg, const unsigned char* cu,
                                                const unsigned char* su, float* yu, int n, int kp, int form, int gshift,
                                                int act, signed char* dq, float* ds, int kpd, int bitsd,
                                                unsigned int* cnt) {
    constexpr int ROWS = MP_AFFINE_GEMV_ROWS * MP_AFFINE_GEMV_WARPS;
    static_assert(32 % ROWS == 0, "a block's rows lie in one group of 32");
    const bool up = blockIdx.y == 1;
    gemv_affine_q8<1, MP_AFFINE_GEMV_ROWS, BITS, MP_AFFINE_GEMV_WARPS>(xq, xs, m, up ? cu : cg, up ? su : sg,
                                                                      up ? yu : yg, n, kp, form, gshift, n);
    const int j0 = blockIdx.x * ROWS, g = j0 / 32;
    if (j0 >= n) return;  // the whole block
    __shared__ bool last;
    if ((threadIdx.x & 31) == 0) __threadfence();  // the stores of y (lane 0's), before the arrival
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned int blocks = 2u * (unsigned int)((min(32, n - 32 * g) + ROWS - 1) / ROWS);
        last = atomicAdd(cnt + g, 1u) == blocks - 1;
    }
    __syncthreads();
    if (!last || threadIdx.x >= 32) return;
    __threadfence();
    pdl_wait();  // (already passed in the GEMV; before this block's first write to dq and ds)
    const int lane = threadIdx.x, c = 32 * g + lane;
    float v = 0.f;
    if (c < n) {
        const float a = __ldcg(yg + c), b = __ldcg(yu + c);
        v = act == 1 ? act_silu_mul(a, b) : act_gelu_mul(a, b);
    }
    affine_quantize_group(v, lane, bitsd, dq + 32 * g, ds + 4 * g);
    if (lane == 0) cnt[g] = 0u;
    if (32 * (g + 1) >= n)  // the last group: the padding groups to kpd
        for (int p = g + 1; p < kpd / 32; ++p) affine_quantize_group(0.f, lane, bitsd, dq + 32 * p, ds + 4 * p);
}

extern "C" __global__ void affine4_gemv_act(const signed char* xq, const float* xs, int m, const unsigned char* cg,
                                           const unsigned char* sg, float* yg, const unsigned char* cu,
                                           const unsigned char* su, float* yu, int n, int kp, int form, int gshift,
                                           int act, signed char* dq, float* ds, int kpd, int bitsd, unsigned int* cnt) {
    gemv_affine_act<4>(xq, xs, m, cg, sg, yg, cu, su, yu, n, kp, form, gshift, act, dq, ds, kpd, bitsd, cnt);
}

extern "C" __global__ void affine8_gemv_act(const signed char* xq, const float* xs, int m, const unsigned char* cg,
                                           const unsigned char* sg, float* yg, const unsigned char* cu,
                                           const unsigned char* su, float* yu, int n, int kp, int form, int gshift,
                                           int act, signed char* dq, float* ds, int kpd, int bitsd, unsigned int* cnt) {
    gemv_affine_act<8>(xq, xs, m, cg, sg, yg, cu, su, yu, n, kp, form, gshift, act, dq, ds, kpd, bitsd, cnt);
}

// BF16 `[n, kp]`, each bf16_rn(w) of w = fmaf(s, q, b) (form 0) or s * (q - z) (forms 1, 2):
// the prefill's weights for the BF16 GEMM. One thread per 8 values (one 16-byte store; 4 code
// bytes at 4 bits, 8 at 8; its group's pair), so a warp's loads and stores are each one
// contiguous run. With perm (u32 [2 kp], else null: the columns stored sorted by group; the
// permutation, then its inverse inv) the thread's 8 values are source columns, column c read
// from stored column inv[c] (within the row's codes, so the reads stay in L1; an entry past kp
// gives 0) and stored in order, so the GEMM sees the source's column order.
// Grid ceil(n * kp / 8 / 256), block 256.
extern "C" __global__ void affine_dequant_bf16(const unsigned char* __restrict__ codes,
                                               const unsigned char* __restrict__ sb, int n, int kp, int bits, int form,
                                               int gshift, __nv_bfloat16* __restrict__ out,
                                               const unsigned int* __restrict__ perm) {
    const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (long long)n * kp / 8) return;
    const long long r = id * 8 / kp;
    const int g32 = (int)((id * 8 - r * kp) / 32);
    const float2 st = affine_pair(sb, r * affine_pairs_per_row(kp / 32, gshift) + (g32 >> gshift), form);
    unsigned int q[8];
    if (bits == 4) {
        const unsigned int w = __ldg(reinterpret_cast<const unsigned int*>(codes) + id);
#pragma unroll
        for (int e = 0; e < 8; ++e) q[e] = (w >> (4 * e)) & 0xFu;
    } else {
        const uint2 w = __ldg(reinterpret_cast<const uint2*>(codes) + id);
#pragma unroll
        for (int e = 0; e < 8; ++e) q[e] = ((e < 4 ? w.x : w.y) >> (8 * (e & 3))) & 0xFFu;
    }
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e)
        v[e] = form == 0 ? fmaf(st.x, affine_code_f32(q[e]), st.y) : __fmul_rn(st.x, affine_code_f32(q[e]) - st.y);
    if (perm != nullptr) {
        const unsigned int* inv = perm + kp;
        const int c0 = (int)(id * 8 - r * kp), prow = affine_pairs_per_row(kp / 32, gshift);
        const unsigned char* row = codes + r * (long long)kp * bits / 8;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const unsigned int sc = inv[c0 + e];
            v[e] = 0.f;
            if (sc < (unsigned int)kp) {
                const unsigned int q = bits == 4 ? (row[sc >> 1] >> (4 * (sc & 1))) & 0xFu : row[sc];
                const float2 p = affine_pair(sb, r * prow + ((int)(sc >> 5) >> gshift), form);
                v[e] = form == 0 ? fmaf(p.x, affine_code_f32(q), p.y) : __fmul_rn(p.x, affine_code_f32(q) - p.y);
            }
        }
    }
    unsigned int packed[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) packed[e] = pack2_bf16(v[2 * e], v[2 * e + 1]);
    reinterpret_cast<uint4*>(out)[id] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
}

// The prefill's BF16 activations: y[r, c] = bf16_rn(v[r, src]) for r < m, c < k, where v is x
// (act 0), silu(x) * u (1) or gelu(x) * u (2) (common.cuh's products), x and u f32 at row stride
// ld, and src = perm[c] (perm u32 [kp], its first k a permutation of 0..k: the weights' columns
// stored sorted by group, act-order; an entry past k gives 0) or c without perm. So one launch
// gives gate and up their input and the down projection its act-mul, already rounded and in the
// weights' stored column order. With perm, the row's values are staged in shared memory as BF16
// (coalesced reads) when k <= MP_AFFINE_GATHER_SMEM, then each thread writes its values in order
// (coalesced writes) reading the stage at perm[c]; a longer row is read from global memory at
// perm[c]. Grid (m), block 256.
__device__ __forceinline__ float affine_act_value(const float* __restrict__ x, const float* __restrict__ u, int act,
                                                  long long i) {
    return act == 0 ? x[i] : act == 1 ? act_silu_mul(x[i], u[i]) : act_gelu_mul(x[i], u[i]);
}

extern "C" __global__ void affine_gather_bf16(const float* __restrict__ x, const float* __restrict__ u, int act,
                                              const unsigned int* __restrict__ perm, int m, int k, int ld,
                                              __nv_bfloat16* __restrict__ y) {
    __shared__ __nv_bfloat16 row[MP_AFFINE_GATHER_SMEM];
    const int r = blockIdx.x;
    if (r >= m) return;
    const long long r0 = (long long)r * ld;
    __nv_bfloat16* yr = y + (long long)r * k;
    if (perm == nullptr) {
        for (int c = threadIdx.x; c < k; c += blockDim.x) yr[c] = __float2bfloat16_rn(affine_act_value(x, u, act, r0 + c));
        return;
    }
    const bool staged = k <= MP_AFFINE_GATHER_SMEM;
    if (staged) {
        for (int c = threadIdx.x; c < k; c += blockDim.x) row[c] = __float2bfloat16_rn(affine_act_value(x, u, act, r0 + c));
        __syncthreads();
    }
    for (int c = threadIdx.x; c < k; c += blockDim.x) {
        const unsigned int src = perm[c];
        __nv_bfloat16 v = __float2bfloat16_rn(0.f);
        if (src < (unsigned int)k) v = staged ? row[src] : __float2bfloat16_rn(affine_act_value(x, u, act, r0 + src));
        yr[c] = v;
    }
}

// GGUF Q4_0 / Q4_1 / Q8_0 blocks (ggml type ty 2 / 3 / 8) of [n, k] (k % 32 == 0), as a GGUF
// holds them, to the affine layout's codes [n, kp] and scale pairs [n, kp / 32]: the converter's
// bytes (converters/affine.rs `AffineGroups::from_ggml`, layouts/affine.rs `from_groups`), so an
// engine that loads the GGUF itself builds the same overlay. Groups past k get codes 0 and
// s = b = 0. A block the converter refuses (its d, or Q4_1's m, not finite; -z d not an exact
// half, z = 8 for Q4_0 and 128 for Q8_0) sets *bad to 1 and gets s = b = 0. One thread per
// group. Grid ceil(n * kp / 32 / 256), block 256.
extern "C" __global__ void affine_from_ggml(const unsigned char* __restrict__ raw, int ty, int n, int k, int kp,
                                            unsigned char* __restrict__ codes, unsigned char* __restrict__ sb,
                                            unsigned int* __restrict__ bad) {
    const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int gk = k / 32, gp = kp / 32, bits = ty == 8 ? 8 : 4;
    if (id >= (long long)n * gp) return;
    const long long r = id / gp;
    const int g = (int)(id % gp);
    unsigned char* out = codes + r * ((long long)kp * bits / 8) + (long long)g * 4 * bits;
    unsigned int pair = 0;
    if (g < gk) {
        const int bb = ty == 2 ? MP_Q4_0_BYTES : ty == 3 ? MP_Q4_1_BYTES : MP_Q8_0_BYTES;
        const unsigned char* b = raw + (r * gk + g) * bb;
        const unsigned int d = b[0] | (b[1] << 8);
        const bool finite_d = (d & 0x7C00u) != 0x7C00u;
        unsigned int off = 0;
        bool ok = finite_d;
        if (ty == 3) {
            off = b[2] | (b[3] << 8);
            ok = ok && (off & 0x7C00u) != 0x7C00u;
        } else if (finite_d) {
            const float v = -(float)(ty == 2 ? 8 : 128) * __half2float(__ushort_as_half((unsigned short)d));
            const __half h = __float2half_rn(v);
            ok = __half2float(h) == v && fabsf(v) <= 65504.f;
            off = __half_as_ushort(h);
        }
        if (ok) {
            pair = d | (off << 16);
        } else {
            atomicOr(bad, 1u);
        }
        if (bits == 4) {
            const unsigned char* qs = b + bb - 16;  // value j low in qs[j], j + 16 high
            for (int i = 0; i < 16; ++i) {
                const int j0 = 2 * i, j1 = 2 * i + 1;
                const unsigned int q0 = j0 < 16 ? qs[j0] & 0xFu : qs[j0 - 16] >> 4;
                const unsigned int q1 = j1 < 16 ? qs[j1] & 0xFu : qs[j1 - 16] >> 4;
                out[i] = (unsigned char)(q0 | (q1 << 4));
            }
        } else {
            for (int i = 0; i < 32; ++i) out[i] = (unsigned char)((int)(signed char)b[2 + i] + 128);
        }
    } else {
        for (int i = 0; i < 4 * bits; ++i) out[i] = 0;
    }
    reinterpret_cast<unsigned int*>(sb)[id] = pair;
}

// AutoAWQ GEMM int4 (qweight [k, n / 8] and qzeros [k / group, n / 8] int32 words, column
// 8c + o of a word at bits 4 * ((o >> 1) + 4 * (o & 1)); F16 scales [k / group, n]) of [n, k] to
// the affine layout's zero form 1: codes [n, kp] and per stored group of sgroup values the pair
// (half s, half z), the converter's bytes (converters/affine.rs `AffineGroups::from_int`,
// layouts/affine.rs `from_groups`). sgroup is group where it divides kp, else kp (one group a
// row: the codes past k are the row's zero point); other codes past k are 0 and their pairs 0.
// A scale that is not finite sets *bad (the converter refuses it). One thread per 32 values of
// a row. Grid ceil(n * kp / 32 / 256), block 256.
extern "C" __global__ void affine_from_awq(const unsigned int* __restrict__ qweight,
                                           const unsigned int* __restrict__ qzeros,
                                           const unsigned short* __restrict__ scales, int n, int k, int kp,
                                           int group, int sgroup, unsigned char* __restrict__ codes,
                                           unsigned char* __restrict__ sb, unsigned int* __restrict__ bad) {
    const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (long long)n * (kp / 32)) return;
    const int j = (int)(id / (kp / 32)), c0 = (int)(id % (kp / 32)) * 32;
    const int words = n / 8, shift = 4 * (((j % 8) >> 1) + 4 * (j % 2));
    const unsigned int zrow = (qzeros[j / 8] >> shift) & 0xFu;  // group 0's zero point
    const bool per_row = sgroup != group;
    unsigned char* out = codes + (long long)j * (kp / 2) + c0 / 2;
    for (int e = 0; e < 32; e += 2) {
        unsigned int q[2];
        for (int h = 0; h < 2; ++h) {
            const int c = c0 + e + h;
            q[h] = c < k ? (qweight[(long long)c * words + j / 8] >> shift) & 0xFu : per_row ? zrow : 0u;
        }
        out[e / 2] = (unsigned char)(q[0] | (q[1] << 4));
    }
    if (c0 % sgroup != 0) return;
    unsigned int pair = 0;
    if (c0 < k) {
        const int g = c0 / group;
        const unsigned int s = scales[(long long)g * n + j];
        const unsigned int z = (qzeros[(long long)g * words + j / 8] >> shift) & 0xFu;
        if ((s & 0x7C00u) == 0x7C00u) atomicOr(bad, 1u);
        pair = s | ((unsigned int)__half_as_ushort(__float2half_rn((float)z)) << 16);
    }
    reinterpret_cast<unsigned int*>(sb)[(long long)j * (kp / sgroup) + c0 / sgroup] = pair;
}

// GPTQ int2 / int4 / int8 in group order (qweight [k / per, n] and qzeros [k / group, n / per]
// int32 words, per = 32 / bits values a word, value i of a column at bits bits * (i % per); the
// v1 zero point is the field plus one; F16 scales [k / group, n]; g_idx [k] or null) of [n, k]
// to the affine layout's zero form 1 at sbits (4 for 2 and 4 bits, else 8): codes [n, kp] and
// per stored group of sgroup values the pair (half s, half z), the converter's bytes
// (converters/gptq.rs `to_int`, then groups.rs `from_int_grouped` and codec.rs `from_groups`). sgroup as in
// affine_from_awq. *bad gets 1 for a scale that is not finite, 2 for a zero point field of all
// ones, 4 for a g_idx entry other than c / group (act-order): the converter refuses each. One
// thread per 32 values of a row. Grid ceil(n * kp / 32 / 256), block 256.
extern "C" __global__ void affine_from_gptq(const unsigned int* __restrict__ qweight,
                                            const unsigned int* __restrict__ qzeros,
                                            const unsigned short* __restrict__ scales,
                                            const int* __restrict__ g_idx, int bits, int n, int k, int kp,
                                            int group, int sgroup, unsigned char* __restrict__ codes,
                                            unsigned char* __restrict__ sb, unsigned int* __restrict__ bad) {
    const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (long long)n * (kp / 32)) return;
    const int j = (int)(id / (kp / 32)), c0 = (int)(id % (kp / 32)) * 32;
    const int per = 32 / bits, zwords = n / per, sbits = bits <= 4 ? 4 : 8;
    const unsigned int mask = (1u << bits) - 1u;
    const int zshift = bits * (j % per);
    const unsigned int zrow = ((qzeros[j / per] >> zshift) & mask) + 1u;  // group 0's zero point
    const bool per_row = sgroup != group;
    unsigned char* out = codes + (long long)j * (kp * sbits / 8) + c0 * sbits / 8;
    for (int e = 0; e < 32; e += 2) {
        unsigned int q[2];
        for (int h = 0; h < 2; ++h) {
            const int c = c0 + e + h;
            if (c < k) {
                q[h] = (qweight[(long long)(c / per) * n + j] >> (bits * (c % per))) & mask;
                if (g_idx != nullptr && g_idx[c] != c / group) atomicOr(bad, 4u);
            } else {
                q[h] = per_row ? zrow : 0u;
            }
        }
        if (sbits == 4) {
            out[e / 2] = (unsigned char)(q[0] | (q[1] << 4));
        } else {
            out[e] = (unsigned char)q[0];
            out[e + 1] = (unsigned char)q[1];
        }
    }
    if (c0 % sgroup != 0) return;
    unsigned int pair = 0;
    if (c0 < k) {
        const int g = c0 / group;
        const unsigned int s = scales[(long long)g * n + j];
        const unsigned int zf = (qzeros[(long long)g * zwords + j / per] >> zshift) & mask;
        if ((s & 0x7C00u) == 0x7C00u) atomicOr(bad, 1u);
        if (zf == mask) atomicOr(bad, 2u);
        pair = s | ((unsigned int)__half_as_ushort(__float2half_rn((float)(zf + 1u))) << 16);
    }
    reinterpret_cast<unsigned int*>(sb)[(long long)j * (kp / sgroup) + c0 / sgroup] = pair;
}

// ---- host-emulated: end ----
