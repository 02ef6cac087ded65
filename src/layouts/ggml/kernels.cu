// The block-format engine's decode GEMV (issue 56; formats.md, "ggml"): one kernel for every GGUF
// block type the `ggml` layout carries, over q8_1 activations (`quantize_act_q8_1`,
// kernels/ffn_q8_1.cu: per 32 values f16 d, f16 s = the sum of the unquantized values, i8
// qs[32]). A type is a `ggml_dot<TY>` (its block's codes as int8 lanes through dp4a, then its
// scales) and a case line in `ggml_gemv`. Block layouts: ggml's ggml-common.h (formats.md,
// "ggml"; ../shared/REFERENCE.md, "Blocks"). CPU twin: src/layouts/ggml/twin.rs
// `ggml_gemv_row`, bit for bit: every float operation below is one IEEE operation
// (__fmul_rn, __fadd_rn: nothing contracted into an FMA), and the lanes' sums meet in the same
// butterfly.

#include "common.cuh"

// 4 bytes at p (any alignment: blocks of 18, 22 and 34 bytes) as a little-endian word.
__device__ __forceinline__ int ggml_u32(const unsigned char* p) {
    return (int)((unsigned int)p[0] | ((unsigned int)p[1] << 8) | ((unsigned int)p[2] << 16) |
                 ((unsigned int)p[3] << 24));
}

// Four 4-bit codes (one per byte of `v`) with their fifth bits: bits bit0 .. bit0+3 of `qh`
// into bit 4 of bytes 0 .. 3.
__device__ __forceinline__ int ggml_with_high(unsigned int v, unsigned int qh, int bit0) {
    const unsigned int h = qh >> bit0;
    return (int)(v | ((h & 1u) << 4) | ((h & 2u) << 11) | ((h & 4u) << 18) | ((h & 8u) << 25));
}

// The 6-bit scale and min of sub-block j of a Q4_K/Q5_K super-block's 12 scale bytes.
__device__ __forceinline__ void ggml_scale_min_k4(int j, const unsigned char* q, int* sc, int* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// The 16-entry value tables: IQ4_NL's and IQ4_XS's non-linear values (ggml-common.h
// `kvalues_iq4nl`), and MXFP4's E2M1 values doubled (`kvalues_mxfp4`; the block scale carries
// the half). converters/iq4.rs and converters/mxfp4.rs hold the same tables.
__constant__ signed char GGML_KV_IQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
__constant__ signed char GGML_KV_MXFP4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// Four 4-bit indices (one per byte of `v`) through a 16-entry table into four int8 lanes.
__device__ __forceinline__ int ggml_table4(unsigned int v, const signed char* table) {
    return (int)((unsigned int)(unsigned char)table[v & 15u] | ((unsigned int)(unsigned char)table[(v >> 8) & 15u] << 8) |
                 ((unsigned int)(unsigned char)table[(v >> 16) & 15u] << 16) |
                 ((unsigned int)(unsigned char)table[(v >> 24) & 15u] << 24));
}

// The integer dot product of 16 index bytes `qs` (low nibbles: values 0..15; high: 16..31)
// through `table` with a q8_1 block's 32 codes.
__device__ __forceinline__ int ggml_table_dot(const unsigned char* qs, const int* aq, const signed char* table) {
    int s = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned int v = (unsigned int)ggml_u32(qs + 4 * i);
        s = __dp4a(ggml_table4(v & 0x0F0F0F0Fu, table), aq[i], s);
        s = __dp4a(ggml_table4((v >> 4) & 0x0F0F0F0Fu, table), aq[4 + i], s);
    }
    return s;
}

// The dot product of 32-value block b of a weight row `w` with one q8_1 block `a`.
template <int TY>
__device__ __forceinline__ float ggml_dot(const unsigned char* w, int b, const unsigned char* a);

// Q4_0, 18 bytes per 32: f16 d, qs[16]; element l < 16 is the low nibble of qs[l], element
// 16 + l its high nibble; value d * (q - 8).
template <>
__device__ __forceinline__ float ggml_dot<2>(const unsigned char* w, int b, const unsigned char* a) {
    const unsigned char* blk = w + (size_t)b * MP_GGML_Q4_0_BYTES;
    const int* aq = reinterpret_cast<const int*>(a + 4);
    int s = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned int v = (unsigned int)ggml_u32(blk + 2 + 4 * i);
        s = __dp4a((int)(v & 0x0F0F0F0Fu), aq[i], s);
        s = __dp4a((int)((v >> 4) & 0x0F0F0F0Fu), aq[4 + i], s);
    }
    const float t = __fadd_rn(__fmul_rn(f16_at(a), (float)s), -__fmul_rn(8.0f, f16_at(a + 2)));
    return __fmul_rn(f16_at(blk), t);
}

// Q4_1, 20 bytes per 32: f16 d, f16 m, qs[16] (as Q4_0); value d * q + m.
template <>
__device__ __forceinline__ float ggml_dot<3>(const unsigned char* w, int b, const unsigned char* a) {
    const unsigned char* blk = w + (size_t)b * MP_GGML_Q4_1_BYTES;
    const int* aq = reinterpret_cast<const int*>(a + 4);
    int s = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned int v = (unsigned int)ggml_u32(blk + 4 + 4 * i);
        s = __dp4a((int)(v & 0x0F0F0F0Fu), aq[i], s);
        s = __dp4a((int)((v >> 4) & 0x0F0F0F0Fu), aq[4 + i], s);
    }
    const float dd = __fmul_rn(f16_at(blk), f16_at(a));
    return __fadd_rn(__fmul_rn(dd, (float)s), __fmul_rn(f16_at(blk + 2), f16_at(a + 2)));
}

// Q5_0, 22 bytes per 32: f16 d, qh[4] (bit l: the fifth bit of element l), qs[16] (as Q4_0);
// value d * (q - 16).
template <>
__device__ __forceinline__ float ggml_dot<6>(const unsigned char* w, int b, const unsigned char* a) {
    const unsigned char* blk = w + (size_t)b * MP_GGML_Q5_0_BYTES;
    const int* aq = reinterpret_cast<const int*>(a + 4);
    const unsigned int qh = (unsigned int)ggml_u32(blk + 2);
    int s = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned int v = (unsigned int)ggml_u32(blk + 6 + 4 * i);
        s = __dp4a(ggml_with_high(v & 0x0F0F0F0Fu, qh, 4 * i), aq[i], s);
        s = __dp4a(ggml_with_high((v >> 4) & 0x0F0F0F0Fu, qh, 16 + 4 * i), aq[4 + i], s);
    }
    const float t = __fadd_rn(__fmul_rn(f16_at(a), (float)s), -__fmul_rn(16.0f, f16_at(a + 2)));
    return __fmul_rn(f16_at(blk), t);
}

// Q5_1, 24 bytes per 32: f16 d, f16 m, qh[4], qs[16] (as Q5_0); value d * q + m.
template <>
__device__ __forceinline__ float ggml_dot<7>(const unsigned char* w, int b, const unsigned char* a) {
    const unsigned char* blk = w + (size_t)b * MP_GGML_Q5_1_BYTES;
    const int* aq = reinterpret_cast<const int*>(a + 4);
    const unsigned int qh = (unsigned int)ggml_u32(blk + 4);
    int s = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned int v = (unsigned int)ggml_u32(blk + 8 + 4 * i);
        s = __dp4a(ggml_with_high(v & 0x0F0F0F0Fu, qh, 4 * i), aq[i], s);
        s = __dp4a(ggml_with_high((v >> 4) & 0x0F0F0F0Fu, qh, 16 + 4 * i), aq[4 + i], s);
    }
    const float dd = __fmul_rn(f16_at(blk), f16_at(a));
    return __fadd_rn(__fmul_rn(dd, (float)s), __fmul_rn(f16_at(blk + 2), f16_at(a + 2)));
}

// Q8_0, 34 bytes per 32: f16 d, i8 qs[32]; value d * q.
template <>
__device__ __forceinline__ float ggml_dot<8>(const unsigned char* w, int b, const unsigned char* a) {
    const unsigned char* blk = w + (size_t)b * MP_GGML_Q8_0_BYTES;
    const int* aq = reinterpret_cast<const int*>(a + 4);
    int s = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) s = __dp4a(ggml_u32(blk + 2 + 4 * i), aq[i], s);
    return __fmul_rn(f16_at(blk), __fmul_rn(f16_at(a), (float)s));
}

// Q2_K, 84 bytes per 256: scales[16] (low nibble scale, high nibble min, one per 16 values),
// qs[64], f16 d, f16 dmin. Sub-block j = 4 h + t: element l is bits 2t, 2t+1 of qs[32 h + l];
// values 0..15 under scales[8 h + 2 t], 16..31 under scales[8 h + 2 t + 1]; value
// d * sc * q - dmin * m. The scale and min products in integers: (d da) sum sc s - (dmin da)
// sum m (1 . qa).
template <>
__device__ __forceinline__ float ggml_dot<10>(const unsigned char* w, int b, const unsigned char* a) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_Q2K_BYTES;
    const int j = b & 7, h = j >> 2, t = j & 3;
    const unsigned char* qs = blk + 16 + 32 * h;
    const int* aq = reinterpret_cast<const int*>(a + 4);
    int s[2] = {0, 0}, u[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        s[i >> 2] = __dp4a((int)(((unsigned int)ggml_u32(qs + 4 * i) >> (2 * t)) & 0x03030303u), aq[i], s[i >> 2]);
        u[i >> 2] = __dp4a(0x01010101, aq[i], u[i >> 2]);
    }
    const int sc0 = blk[8 * h + 2 * t], sc1 = blk[8 * h + 2 * t + 1];
    const int sd = (sc0 & 15) * s[0] + (sc1 & 15) * s[1], sm = (sc0 >> 4) * u[0] + (sc1 >> 4) * u[1];
    const float da = f16_at(a);
    return __fadd_rn(__fmul_rn(__fmul_rn(f16_at(blk + 80), da), (float)sd),
                     -__fmul_rn(__fmul_rn(f16_at(blk + 82), da), (float)sm));
}

// Q3_K's 6-bit sub-block scale `is` (0..15) from its 12 packed bytes, less 32: the low 4 bits
// in byte is (is < 8) or the high nibble of byte is - 8, the high 2 bits in byte 8 + is % 4 at
// bit 2 (is / 4) (ggml's dequantize_row_q3_K, converters/q3_k.rs).
__device__ __forceinline__ int ggml_q3k_scale(const unsigned char* sc, int is) {
    const int lo = is < 8 ? (sc[is] & 15) : (sc[is - 8] >> 4);
    const int hi = (sc[8 + (is & 3)] >> (2 * (is >> 2))) & 3;
    return (lo | (hi << 4)) - 32;
}

// Q3_K, 110 bytes per 256: hmask[32], qs[64], scales[12], f16 d. Sub-block j = 4 h + t:
// element l is bits 2t, 2t+1 of qs[32 h + l], less 4 where bit j of hmask[l] is clear (the
// code with that bit as bit 2, less 4); values 0..15 and 16..31 under the scales 2j and
// 2j + 1; value d * (sc - 32) * q.
template <>
__device__ __forceinline__ float ggml_dot<11>(const unsigned char* w, int b, const unsigned char* a) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_Q3K_BYTES;
    const int j = b & 7, h = j >> 2, t = j & 3;
    const unsigned char* qs = blk + 32 + 32 * h;
    const int* aq = reinterpret_cast<const int*>(a + 4);
    int s[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const unsigned int lo = ((unsigned int)ggml_u32(qs + 4 * i) >> (2 * t)) & 0x03030303u;
        const unsigned int hb = (((unsigned int)ggml_u32(blk + 4 * i) >> j) & 0x01010101u) << 2;
        s[i >> 2] = __dp4a((int)(lo | hb), aq[i], s[i >> 2]);
        s[i >> 2] = __dp4a((int)0xFCFCFCFCu, aq[i], s[i >> 2]);
    }
    const int sc0 = ggml_q3k_scale(blk + 96, 2 * j), sc1 = ggml_q3k_scale(blk + 96, 2 * j + 1);
    return __fmul_rn(f16_at(blk + 108), __fmul_rn(f16_at(a), (float)(sc0 * s[0] + sc1 * s[1])));
}

// IQ4_NL, 18 bytes per 32: f16 d, qs[16] (indices as Q4_0's codes); value d * kvalues[q].
template <>
__device__ __forceinline__ float ggml_dot<20>(const unsigned char* w, int b, const unsigned char* a) {
    const unsigned char* blk = w + (size_t)b * MP_GGML_IQ4_NL_BYTES;
    const int s = ggml_table_dot(blk + 2, reinterpret_cast<const int*>(a + 4), GGML_KV_IQ4NL);
    return __fmul_rn(f16_at(blk), __fmul_rn(f16_at(a), (float)s));
}

// IQ4_XS, 136 bytes per 256: f16 d, u16 scales_h, scales_l[4], qs[128]; sub-block j's 6-bit
// scale ls is nibble j of scales_l with bits 2j, 2j+1 of scales_h above it; its 16 index
// bytes qs[16 j ..] as IQ4_NL's; value d * (ls - 32) * kvalues[q].
template <>
__device__ __forceinline__ float ggml_dot<23>(const unsigned char* w, int b, const unsigned char* a) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_IQ4_XS_BYTES;
    const int j = b & 7;
    const int s = ggml_table_dot(blk + 8 + 16 * j, reinterpret_cast<const int*>(a + 4), GGML_KV_IQ4NL);
    const unsigned int sh = (unsigned int)blk[2] | ((unsigned int)blk[3] << 8);
    const int ls = (int)(((blk[4 + j / 2] >> (4 * (j & 1))) & 15u) | (((sh >> (2 * j)) & 3u) << 4)) - 32;
    return __fmul_rn(f16_at(blk), __fmul_rn(f16_at(a), (float)(ls * s)));
}

// MXFP4, 17 bytes per 32: E8M0 e, qs[16] (indices as Q4_0's codes); value
// 2^(e - 128) * kvalues_mxfp4[q] (ggml's e8m0_to_fp32_half: the doubled table's half).
template <>
__device__ __forceinline__ float ggml_dot<39>(const unsigned char* w, int b, const unsigned char* a) {
    const unsigned char* blk = w + (size_t)b * MP_GGML_MXFP4_BYTES;
    const int s = ggml_table_dot(blk + 1, reinterpret_cast<const int*>(a + 4), GGML_KV_MXFP4);
    const unsigned int e = blk[0];
    const float d = __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
    return __fmul_rn(d, __fmul_rn(f16_at(a), (float)s));
}

// Sub-block j (32 values) of a Q4_K or Q5_K super-block at `blk` whose codes (0..31) give
// `s` against the q8_1 block `a`: (d * sc) * (da * s) - (dmin * m) * sa.
__device__ __forceinline__ float ggml_kquant_sub(const unsigned char* blk, int j, int s, const unsigned char* a) {
    int sc, m;
    ggml_scale_min_k4(j, blk + 4, &sc, &m);
    const float dsc = __fmul_rn(f16_at(blk), (float)sc);
    const float dm = __fmul_rn(f16_at(blk + 2), (float)m);
    return __fadd_rn(__fmul_rn(dsc, __fmul_rn(f16_at(a), (float)s)), -__fmul_rn(dm, f16_at(a + 2)));
}

// Q4_K, 144 bytes per 256: f16 d, f16 dmin, scales[12], qs[128]; sub-block j is the low
// (j even) or high (j odd) nibbles of qs[32 (j / 2) ..][..32]; value d * sc * q - dmin * m.
template <>
__device__ __forceinline__ float ggml_dot<12>(const unsigned char* w, int b, const unsigned char* a) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_Q4K_BYTES;
    const int j = b & 7;
    const unsigned char* qs = blk + 16 + 32 * (j >> 1);
    const int* aq = reinterpret_cast<const int*>(a + 4);
    int s = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) s = __dp4a((int)(((unsigned int)ggml_u32(qs + 4 * i) >> (4 * (j & 1))) & 0x0F0F0F0Fu), aq[i], s);
    return ggml_kquant_sub(blk, j, s, a);
}

// Q5_K, 176 bytes per 256: f16 d, f16 dmin, scales[12], qh[32], qs[128] (as Q4_K); bit j of
// qh[l] is the fifth bit of element l of sub-block j.
template <>
__device__ __forceinline__ float ggml_dot<13>(const unsigned char* w, int b, const unsigned char* a) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_Q5K_BYTES;
    const int j = b & 7;
    const unsigned char* qs = blk + 48 + 32 * (j >> 1);
    const int* aq = reinterpret_cast<const int*>(a + 4);
    int s = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const unsigned int lo = ((unsigned int)ggml_u32(qs + 4 * i) >> (4 * (j & 1))) & 0x0F0F0F0Fu;
        const unsigned int hi = (((unsigned int)ggml_u32(blk + 16 + 4 * i) >> j) & 0x01010101u) << 4;
        s = __dp4a((int)(lo | hi), aq[i], s);
    }
    return ggml_kquant_sub(blk, j, s, a);
}

// Q6_K, 210 bytes per 256: ql[128], qh[64], i8 scales[16], f16 d. Sub-block j = 4 h + t (h the
// half of 128, t its quarter): element l is ql[64 h + 32 (t & 1) + l] >> 4 (t >> 1) & 15 with
// bits 2t, 2t+1 of qh[32 h + l] above them, less 32; values 0..15 scaled by scales[8 h + 2 t],
// 16..31 by scales[8 h + 2 t + 1]; value d * scale * q.
template <>
__device__ __forceinline__ float ggml_dot<14>(const unsigned char* w, int b, const unsigned char* a) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_Q6K_BYTES;
    const int j = b & 7, h = j >> 2, t = j & 3;
    const unsigned char* ql = blk + 64 * h + 32 * (t & 1);
    const unsigned char* qh = blk + 128 + 32 * h;
    const int* aq = reinterpret_cast<const int*>(a + 4);
    int s[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const unsigned int lo = ((unsigned int)ggml_u32(ql + 4 * i) >> (4 * (t >> 1))) & 0x0F0F0F0Fu;
        const unsigned int hi = (((unsigned int)ggml_u32(qh + 4 * i) >> (2 * t)) & 0x03030303u) << 4;
        // (q - 32) . a as q . a + (-32, -32, -32, -32) . a: the codes 0..63 are signed bytes as
        // they are.
        s[i >> 2] = __dp4a((int)(lo | hi), aq[i], s[i >> 2]);
        s[i >> 2] = __dp4a((int)0xE0E0E0E0u, aq[i], s[i >> 2]);
    }
    const int sc0 = (int)(signed char)blk[192 + 8 * h + 2 * t], sc1 = (int)(signed char)blk[192 + 8 * h + 2 * t + 1];
    return __fmul_rn(f16_at(blk + 208), __fmul_rn(f16_at(a), (float)(sc0 * s[0] + sc1 * s[1])));
}

// y[r, j] = sum over the 32-value blocks b of weight row j of ggml_dot<TY>(row j, b, q8_1
// block b of activation row r), for r < m <= MP_GGML_GEMV_MAX_M. One warp per weight row: lane
// l takes blocks l, l + 32, ... in order (an f32 sum per activation row), then the lanes' sums
// meet in a butterfly (xor 16, 8, 4, 2, 1). Rows of `row_bytes` bytes.
template <int TY>
__device__ __forceinline__ void ggml_gemv_rows(const unsigned char* __restrict__ xq, int m,
                                               const unsigned char* __restrict__ w, size_t row_bytes,
                                               float* __restrict__ y, int n, int kp, int ldy) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int j = blockIdx.x * (blockDim.x >> 5) + warp;
    if (j >= n) return;
    const int nb = kp / MP_GGML_QK;
    const unsigned char* row = w + (size_t)j * row_bytes;
    float acc[MP_GGML_GEMV_MAX_M];
#pragma unroll
    for (int r = 0; r < MP_GGML_GEMV_MAX_M; ++r) acc[r] = 0.f;
    for (int b = lane; b < nb; b += 32) {
#pragma unroll
        for (int r = 0; r < MP_GGML_GEMV_MAX_M; ++r) {
            if (r >= m) break;
            acc[r] = __fadd_rn(acc[r], ggml_dot<TY>(row, b, xq + ((size_t)r * nb + b) * MP_Q8_1_BYTES));
        }
    }
#pragma unroll
    for (int r = 0; r < MP_GGML_GEMV_MAX_M; ++r) {
        float t = acc[r];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) t = __fadd_rn(t, __shfl_xor_sync(0xffffffffu, t, o));
        if (lane == 0 && r < m) y[(size_t)r * ldy + j] = t;
    }
}

// The engine's GEMV: `xq` q8_1 blocks [m, kp / 32], `w` n rows of kp / qk blocks of GGUF type
// `ty` (its id), y [m, n] with row stride ldy. A type this module lacks writes nothing (the
// layer refuses it when its weights are installed). Grid ceil(n / 8), block 256.
extern "C" __global__ void ggml_gemv(const unsigned char* xq, int m, const unsigned char* w, int ty, float* y, int n,
                                     int kp, int ldy) {
    switch (ty) {
        case 2: ggml_gemv_rows<2>(xq, m, w, (size_t)kp / MP_GGML_QK * MP_GGML_Q4_0_BYTES, y, n, kp, ldy); break;
        case 3: ggml_gemv_rows<3>(xq, m, w, (size_t)kp / MP_GGML_QK * MP_GGML_Q4_1_BYTES, y, n, kp, ldy); break;
        case 6: ggml_gemv_rows<6>(xq, m, w, (size_t)kp / MP_GGML_QK * MP_GGML_Q5_0_BYTES, y, n, kp, ldy); break;
        case 7: ggml_gemv_rows<7>(xq, m, w, (size_t)kp / MP_GGML_QK * MP_GGML_Q5_1_BYTES, y, n, kp, ldy); break;
        case 11: ggml_gemv_rows<11>(xq, m, w, (size_t)kp / MP_GGML_QK_K * MP_GGML_Q3K_BYTES, y, n, kp, ldy); break;
        case 10: ggml_gemv_rows<10>(xq, m, w, (size_t)kp / MP_GGML_QK_K * MP_GGML_Q2K_BYTES, y, n, kp, ldy); break;
        case 20: ggml_gemv_rows<20>(xq, m, w, (size_t)kp / MP_GGML_QK * MP_GGML_IQ4_NL_BYTES, y, n, kp, ldy); break;
        case 23: ggml_gemv_rows<23>(xq, m, w, (size_t)kp / MP_GGML_QK_K * MP_GGML_IQ4_XS_BYTES, y, n, kp, ldy); break;
        case 39: ggml_gemv_rows<39>(xq, m, w, (size_t)kp / MP_GGML_QK * MP_GGML_MXFP4_BYTES, y, n, kp, ldy); break;
        case 8: ggml_gemv_rows<8>(xq, m, w, (size_t)kp / MP_GGML_QK * MP_GGML_Q8_0_BYTES, y, n, kp, ldy); break;
        case 12: ggml_gemv_rows<12>(xq, m, w, (size_t)kp / MP_GGML_QK_K * MP_Q4K_BYTES, y, n, kp, ldy); break;
        case 13: ggml_gemv_rows<13>(xq, m, w, (size_t)kp / MP_GGML_QK_K * MP_GGML_Q5K_BYTES, y, n, kp, ldy); break;
        case 14: ggml_gemv_rows<14>(xq, m, w, (size_t)kp / MP_GGML_QK_K * MP_GGML_Q6K_BYTES, y, n, kp, ldy); break;
        default: break;
    }
}

// ---- The prefill's dequantization: weights to BF16 for the BF16 GEMM ----
//
// ggml_values<TY>(row, b, v): the 32 values of 32-value block b of a weight row as f32, each
// by the operations converters/ (gguf-py's decode, bit for bit) does in its order, so the BF16
// rounding after is the twin's `bf16(converters::decode_ggml(..))`.

template <int TY>
__device__ __forceinline__ void ggml_values(const unsigned char* w, int b, float (&v)[32]);

// Q4_0: d * (q - 8); Q5_0: d * (q - 16) with the fifth bits.
template <>
__device__ __forceinline__ void ggml_values<2>(const unsigned char* w, int b, float (&v)[32]) {
    const unsigned char* blk = w + (size_t)b * MP_GGML_Q4_0_BYTES;
    const float d = f16_at(blk);
    for (int l = 0; l < 16; ++l) {
        v[l] = __fmul_rn(d, (float)((blk[2 + l] & 15) - 8));
        v[l + 16] = __fmul_rn(d, (float)((blk[2 + l] >> 4) - 8));
    }
}
template <>
__device__ __forceinline__ void ggml_values<6>(const unsigned char* w, int b, float (&v)[32]) {
    const unsigned char* blk = w + (size_t)b * MP_GGML_Q5_0_BYTES;
    const float d = f16_at(blk);
    const unsigned int qh = (unsigned int)ggml_u32(blk + 2);
    for (int l = 0; l < 16; ++l) {
        v[l] = __fmul_rn(d, (float)((int)((blk[6 + l] & 15) | (((qh >> l) & 1) << 4)) - 16));
        v[l + 16] = __fmul_rn(d, (float)((int)((blk[6 + l] >> 4) | (((qh >> (l + 16)) & 1) << 4)) - 16));
    }
}
// Q4_1: d * q + m; Q5_1 the same with the fifth bits.
template <>
__device__ __forceinline__ void ggml_values<3>(const unsigned char* w, int b, float (&v)[32]) {
    const unsigned char* blk = w + (size_t)b * MP_GGML_Q4_1_BYTES;
    const float d = f16_at(blk), m = f16_at(blk + 2);
    for (int l = 0; l < 16; ++l) {
        v[l] = __fadd_rn(__fmul_rn(d, (float)(blk[4 + l] & 15)), m);
        v[l + 16] = __fadd_rn(__fmul_rn(d, (float)(blk[4 + l] >> 4)), m);
    }
}
template <>
__device__ __forceinline__ void ggml_values<7>(const unsigned char* w, int b, float (&v)[32]) {
    const unsigned char* blk = w + (size_t)b * MP_GGML_Q5_1_BYTES;
    const float d = f16_at(blk), m = f16_at(blk + 2);
    const unsigned int qh = (unsigned int)ggml_u32(blk + 4);
    for (int l = 0; l < 16; ++l) {
        v[l] = __fadd_rn(__fmul_rn(d, (float)((blk[8 + l] & 15) | (((qh >> l) & 1) << 4))), m);
        v[l + 16] = __fadd_rn(__fmul_rn(d, (float)((blk[8 + l] >> 4) | (((qh >> (l + 16)) & 1) << 4))), m);
    }
}
// Q8_0: q * d.
template <>
__device__ __forceinline__ void ggml_values<8>(const unsigned char* w, int b, float (&v)[32]) {
    const unsigned char* blk = w + (size_t)b * MP_GGML_Q8_0_BYTES;
    const float d = f16_at(blk);
    for (int l = 0; l < 32; ++l) v[l] = __fmul_rn((float)(signed char)blk[2 + l], d);
}
// Q2_K: (d * sc) * q - dmin * m per 16 values.
template <>
__device__ __forceinline__ void ggml_values<10>(const unsigned char* w, int b, float (&v)[32]) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_Q2K_BYTES;
    const int j = b & 7, h = j >> 2, t = j & 3;
    const float d = f16_at(blk + 80), dmin = f16_at(blk + 82);
    for (int l = 0; l < 32; ++l) {
        const int sc = blk[8 * h + 2 * t + (l >> 4)];
        const float dl = __fmul_rn(d, (float)(sc & 15)), ml = __fmul_rn(dmin, (float)(sc >> 4));
        v[l] = __fadd_rn(__fmul_rn(dl, (float)((blk[16 + 32 * h + l] >> (2 * t)) & 3)), -ml);
    }
}
// Q3_K: (d * (sc - 32)) * q per 16 values.
template <>
__device__ __forceinline__ void ggml_values<11>(const unsigned char* w, int b, float (&v)[32]) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_Q3K_BYTES;
    const int j = b & 7, h = j >> 2, t = j & 3;
    const float d = f16_at(blk + 108);
    for (int l = 0; l < 32; ++l) {
        const float dl = __fmul_rn(d, (float)ggml_q3k_scale(blk + 96, 2 * j + (l >> 4)));
        const int q = (int)((blk[32 + 32 * h + l] >> (2 * t)) & 3) - (((blk[l] >> j) & 1) ? 0 : 4);
        v[l] = __fmul_rn(dl, (float)q);
    }
}
// Q4_K, Q5_K: (d * sc) * q - dmin * m per 32 values.
template <>
__device__ __forceinline__ void ggml_values<12>(const unsigned char* w, int b, float (&v)[32]) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_Q4K_BYTES;
    const int j = b & 7;
    int sc, m;
    ggml_scale_min_k4(j, blk + 4, &sc, &m);
    const float dl = __fmul_rn(f16_at(blk), (float)sc), ml = __fmul_rn(f16_at(blk + 2), (float)m);
    for (int l = 0; l < 32; ++l) v[l] = __fadd_rn(__fmul_rn(dl, (float)((blk[16 + 32 * (j >> 1) + l] >> (4 * (j & 1))) & 15)), -ml);
}
template <>
__device__ __forceinline__ void ggml_values<13>(const unsigned char* w, int b, float (&v)[32]) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_Q5K_BYTES;
    const int j = b & 7;
    int sc, m;
    ggml_scale_min_k4(j, blk + 4, &sc, &m);
    const float dl = __fmul_rn(f16_at(blk), (float)sc), ml = __fmul_rn(f16_at(blk + 2), (float)m);
    for (int l = 0; l < 32; ++l) {
        const int q = ((blk[48 + 32 * (j >> 1) + l] >> (4 * (j & 1))) & 15) | (((blk[16 + l] >> j) & 1) << 4);
        v[l] = __fadd_rn(__fmul_rn(dl, (float)q), -ml);
    }
}
// Q6_K: (d * sc) * (q - 32) per 16 values.
template <>
__device__ __forceinline__ void ggml_values<14>(const unsigned char* w, int b, float (&v)[32]) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_Q6K_BYTES;
    const int j = b & 7, h = j >> 2, t = j & 3;
    const float d = f16_at(blk + 208);
    for (int l = 0; l < 32; ++l) {
        const int lo = (blk[64 * h + 32 * (t & 1) + l] >> (4 * (t >> 1))) & 15;
        const int hi = (blk[128 + 32 * h + l] >> (2 * t)) & 3;
        const float dl = __fmul_rn(d, (float)(signed char)blk[192 + 8 * h + 2 * t + (l >> 4)]);
        v[l] = __fmul_rn(dl, (float)((lo | (hi << 4)) - 32));
    }
}
// IQ4_NL: d * kvalues[q]; IQ4_XS: (d * (ls - 32)) * kvalues[q]; MXFP4: 2^(e - 128) * kvalues[q].
__device__ __forceinline__ void ggml_table_values(const unsigned char* qs, float scale, const signed char* table,
                                                  float (&v)[32]) {
    for (int l = 0; l < 16; ++l) {
        v[l] = __fmul_rn(scale, (float)table[qs[l] & 15]);
        v[l + 16] = __fmul_rn(scale, (float)table[qs[l] >> 4]);
    }
}
template <>
__device__ __forceinline__ void ggml_values<20>(const unsigned char* w, int b, float (&v)[32]) {
    const unsigned char* blk = w + (size_t)b * MP_GGML_IQ4_NL_BYTES;
    ggml_table_values(blk + 2, f16_at(blk), GGML_KV_IQ4NL, v);
}
template <>
__device__ __forceinline__ void ggml_values<23>(const unsigned char* w, int b, float (&v)[32]) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_IQ4_XS_BYTES;
    const int j = b & 7;
    const unsigned int sh = (unsigned int)blk[2] | ((unsigned int)blk[3] << 8);
    const int ls = (int)(((blk[4 + j / 2] >> (4 * (j & 1))) & 15u) | (((sh >> (2 * j)) & 3u) << 4)) - 32;
    ggml_table_values(blk + 8 + 16 * j, __fmul_rn(f16_at(blk), (float)ls), GGML_KV_IQ4NL, v);
}
template <>
__device__ __forceinline__ void ggml_values<39>(const unsigned char* w, int b, float (&v)[32]) {
    const unsigned char* blk = w + (size_t)b * MP_GGML_MXFP4_BYTES;
    const unsigned int e = blk[0];
    ggml_table_values(blk + 1, __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23), GGML_KV_MXFP4, v);
}

template <int TY>
__device__ __forceinline__ void ggml_dequant_rows(const unsigned char* __restrict__ w, size_t row_bytes, int n, int kp,
                                                  unsigned int* __restrict__ out) {
    const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int nb = kp / MP_GGML_QK;
    if (id >= (long long)n * nb) return;
    const int j = (int)(id / nb), b = (int)(id % nb);
    float v[32];
    ggml_values<TY>(w + (size_t)j * row_bytes, b, v);
    unsigned int* o = out + ((size_t)j * kp + (size_t)b * MP_GGML_QK) / 2;
    for (int l = 0; l < 16; ++l) o[l] = pack2_bf16(v[2 * l], v[2 * l + 1]);
}

// The prefill's dequantization: `w` (n rows of kp values of type `ty`) to BF16 [n, kp], each
// value gguf-py's decode rounded to nearest even. One thread per 32-value block of a row.
// Grid ceil(n * kp / 32 / 256), block 256.
extern "C" __global__ void ggml_dequant_bf16(const unsigned char* w, int ty, int n, int kp, unsigned short* out) {
    unsigned int* o = reinterpret_cast<unsigned int*>(out);
    switch (ty) {
        case 2: ggml_dequant_rows<2>(w, (size_t)kp / MP_GGML_QK * MP_GGML_Q4_0_BYTES, n, kp, o); break;
        case 3: ggml_dequant_rows<3>(w, (size_t)kp / MP_GGML_QK * MP_GGML_Q4_1_BYTES, n, kp, o); break;
        case 6: ggml_dequant_rows<6>(w, (size_t)kp / MP_GGML_QK * MP_GGML_Q5_0_BYTES, n, kp, o); break;
        case 7: ggml_dequant_rows<7>(w, (size_t)kp / MP_GGML_QK * MP_GGML_Q5_1_BYTES, n, kp, o); break;
        case 8: ggml_dequant_rows<8>(w, (size_t)kp / MP_GGML_QK * MP_GGML_Q8_0_BYTES, n, kp, o); break;
        case 11: ggml_dequant_rows<11>(w, (size_t)kp / MP_GGML_QK_K * MP_GGML_Q3K_BYTES, n, kp, o); break;
        case 10: ggml_dequant_rows<10>(w, (size_t)kp / MP_GGML_QK_K * MP_GGML_Q2K_BYTES, n, kp, o); break;
        case 12: ggml_dequant_rows<12>(w, (size_t)kp / MP_GGML_QK_K * MP_Q4K_BYTES, n, kp, o); break;
        case 13: ggml_dequant_rows<13>(w, (size_t)kp / MP_GGML_QK_K * MP_GGML_Q5K_BYTES, n, kp, o); break;
        case 14: ggml_dequant_rows<14>(w, (size_t)kp / MP_GGML_QK_K * MP_GGML_Q6K_BYTES, n, kp, o); break;
        case 20: ggml_dequant_rows<20>(w, (size_t)kp / MP_GGML_QK * MP_GGML_IQ4_NL_BYTES, n, kp, o); break;
        case 23: ggml_dequant_rows<23>(w, (size_t)kp / MP_GGML_QK_K * MP_GGML_IQ4_XS_BYTES, n, kp, o); break;
        case 39: ggml_dequant_rows<39>(w, (size_t)kp / MP_GGML_QK * MP_GGML_MXFP4_BYTES, n, kp, o); break;
        default: break;
    }
}
