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
// The same three bytes q[j % 4], q[j % 4 + 4], q[j % 4 + 8] serve every j, selected after:
// no branch where a warp's lanes take different sub-blocks.
__device__ __forceinline__ void ggml_scale_min_k4(int j, const unsigned char* q, int* sc, int* m) {
    const int x = q[j & 3], y = q[(j & 3) + 4], z = q[(j & 3) + 8];
    *sc = j < 4 ? (x & 63) : ((z & 0xF) | ((x >> 6) << 4));
    *m = j < 4 ? (y & 63) : ((z >> 4) | ((y >> 6) << 4));
}

// The 16-entry value tables as four words of int8 lanes each, entry i in byte i % 4 of word
// i / 4: IQ4_NL's and IQ4_XS's non-linear values (ggml-common.h `kvalues_iq4nl`), and MXFP4's
// E2M1 values doubled (`kvalues_mxfp4`; the block scale carries the half), and bitsandbytes'
// NF4 values times 2^13 as 128 hi + lo (`NF4_HI`, `NF4_LO`). converters/iq4.rs,
// converters/mxfp4.rs and converters/bnb.rs hold the same tables.
#define GGML_TAB_IQ4NL 0
#define GGML_TAB_MXFP4 1
#define GGML_TAB_NF4HI 2
#define GGML_TAB_NF4LO 3
#define GGML_PACK4(a, b, c, d) \
    ((unsigned int)(unsigned char)(a) | ((unsigned int)(unsigned char)(b) << 8) | \
     ((unsigned int)(unsigned char)(c) << 16) | ((unsigned int)(unsigned char)(d) << 24))
template <int TAB>
__device__ __forceinline__ unsigned int ggml_table_word(int i) {
    if constexpr (TAB == GGML_TAB_IQ4NL) {
        return i == 0 ? GGML_PACK4(-127, -104, -83, -65) : i == 1 ? GGML_PACK4(-49, -35, -22, -10)
             : i == 2 ? GGML_PACK4(1, 13, 25, 38) : GGML_PACK4(53, 69, 89, 113);
    } else if constexpr (TAB == GGML_TAB_MXFP4) {
        return i == 0 ? GGML_PACK4(0, 1, 2, 3) : i == 1 ? GGML_PACK4(4, 6, 8, 12)
             : i == 2 ? GGML_PACK4(0, -1, -2, -3) : GGML_PACK4(-4, -6, -8, -12);
    } else if constexpr (TAB == GGML_TAB_NF4HI) {
        // -64 -45 -34 -25 | -18 -12 -6 0 | 5 10 16 22 | 28 36 46 64 (as words: no size literals)
        return i == 0 ? 0xe7ded3c0u : i == 1 ? 0x00faf4eeu : i == 2 ? 0x16100a05u : 0x402e241cu;
    } else {
        // 0 57 51 -35 | -26 22 22 0 | 12 38 -32 -48 | 26 1 34 0
        return i == 0 ? 0xdd333900u : i == 1 ? 0x001616e6u : i == 2 ? 0xd0e0260cu : 0x0022011au;
    }
}

// Eight 4-bit indices, the low and high nibbles of the four bytes of `v`, through the table TAB:
// `lo` the low nibbles' values as int8 lanes (lane i: byte i's), `hi` the high nibbles'. Each
// nibble is itself a byte-permute selector, of which __byte_perm reads the low three bits: two
// bytes' four nibbles pick their entries in the table's low half (words 0, 1) and in its high
// half (words 2, 3) with one permute each, a third takes each entry from the half the nibble's
// fourth bit names; two more gather the low and the high nibbles' values. Eight permutes for
// eight values (the technique of ggml's get_int_from_table_16, vecdotq.cuh), where a mask and
// a select per four values took about twice the instructions, the GEMV's bound for these types.
template <int TAB>
__device__ __forceinline__ void ggml_table8(unsigned int v, int& lo, int& hi) {
    unsigned int r[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const unsigned int s = (v >> (16 * h)) & 0xFFFFu;  // bytes 2h, 2h + 1: lo, hi, lo, hi
        const unsigned int a = __byte_perm(ggml_table_word<TAB>(0), ggml_table_word<TAB>(1), s);
        const unsigned int b = __byte_perm(ggml_table_word<TAB>(2), ggml_table_word<TAB>(3), s);
        r[h] = __byte_perm(a, b, 0x3210u | ((s & 0x8888u) >> 1));
    }
    lo = (int)__byte_perm(r[0], r[1], 0x6420u);
    hi = (int)__byte_perm(r[0], r[1], 0x7531u);
}

// ---- The GEMV: a block's codes as int8 lanes, then its scales ----
//
// A type is two functions over block b of a row at `w` (the row's stage in shared memory):
// ggml_codes<TY> writes its 32 codes as 8 words of int8 lanes, value l in lane l % 4 of word
// l / 4, each already less the type's offset where that fits int8 (Q3_K's 4, Q6_K's 32), so
// that the dp4a with the q8_1 codes of one activation block gives the integer sums s0 (words
// 0..3: values 0..15) and s1 (words 4..7: values 16..31); ggml_scale<TY> turns them into the
// block's share of y. The codes come once per block for every activation row. The integer
// sums are the twin's whatever their order (integers), and every float operation is the
// twin's, in its order (`ggml_gemv_row`, src/layouts/ggml/twin.rs).

// 4 bytes at p as a little-endian word, p a multiple of A bytes: one load (A >= 4), two
// halves (A == 2), or the two aligned words around it through a byte permute (A == 1; reads
// up to 3 bytes past the word).
template <int A>
__device__ __forceinline__ unsigned int ggml_w32(const unsigned char* p) {
    if constexpr (A >= 4) {
        return *reinterpret_cast<const unsigned int*>(p);
    } else if constexpr (A == 2) {
        const unsigned short* h = reinterpret_cast<const unsigned short*>(p);
        return (unsigned int)h[0] | ((unsigned int)h[1] << 16);
    } else {
        const unsigned int* q = reinterpret_cast<const unsigned int*>(p - ((size_t)p & 3));
        return __byte_perm(q[0], q[1], 0x3210u + 0x1111u * (unsigned int)((size_t)p & 3));
    }
}

// N words at p (a multiple of A bytes): 16-byte loads (A >= 16), 4-byte loads (A >= 4), or
// below that the N + 1 aligned words around them through a byte permute each (reads up to 3
// bytes past the last word): N + 1 shared-memory loads where two 2-byte halves a word took 2N,
// the one-row GEMV's bound for the 2-aligned blocks (Q4_0, Q5_0, Q8_0, IQ4_NL, Q6_K, ...).
template <int A, int N>
__device__ __forceinline__ void ggml_w32xn(const unsigned char* p, unsigned int (&v)[N]) {
    if constexpr (A >= 16) {
#pragma unroll
        for (int i = 0; i < N / 4; ++i) {
            const uint4 a = reinterpret_cast<const uint4*>(p)[i];
            v[4 * i] = a.x, v[4 * i + 1] = a.y, v[4 * i + 2] = a.z, v[4 * i + 3] = a.w;
        }
    } else if constexpr (A >= 4) {
#pragma unroll
        for (int i = 0; i < N; ++i) v[i] = reinterpret_cast<const unsigned int*>(p)[i];
    } else {
        // p less its offset as a pointer (not an integer) keeps its memory space: shared-memory
        // loads, not generic ones.
        const unsigned int* q = reinterpret_cast<const unsigned int*>(p - ((size_t)p & 3));
        const unsigned int sel = 0x3210u + 0x1111u * (unsigned int)((size_t)p & 3);
        unsigned int u[N + 1];
#pragma unroll
        for (int i = 0; i <= N; ++i) u[i] = q[i];
#pragma unroll
        for (int i = 0; i < N; ++i) v[i] = __byte_perm(u[i], u[i + 1], sel);
    }
}

// Eight words at p (a multiple of A bytes).
template <int A>
__device__ __forceinline__ void ggml_w32x8(const unsigned char* p, unsigned int (&v)[8]) {
    ggml_w32xn<A, 8>(p, v);
}

// Four words at p (a multiple of A bytes).
template <int A>
__device__ __forceinline__ void ggml_w32x4(const unsigned char* p, unsigned int (&v)[4]) {
    ggml_w32xn<A, 4>(p, v);
}

// 16 index bytes (low nibbles: values 0..15, high: 16..31) through the table TAB as codes.
template <int TAB, int A>
__device__ __forceinline__ void ggml_table_codes(const unsigned char* qs, int (&q)[8]) {
    unsigned int v[4];
    ggml_w32x4<A>(qs, v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        ggml_table8<TAB>(v[i], q[i], q[4 + i]);
    }
}

// The 4-bit codes of 16 bytes at qs (a multiple of A): low nibbles values 0..15, high 16..31.
template <int A>
__device__ __forceinline__ void ggml_nibble_codes(const unsigned char* qs, int (&q)[8]) {
    unsigned int v[4];
    ggml_w32x4<A>(qs, v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        q[i] = (int)(v[i] & 0x0F0F0F0Fu);
        q[4 + i] = (int)((v[i] >> 4) & 0x0F0F0F0Fu);
    }
}

template <int TY>
__device__ __forceinline__ void ggml_codes(const unsigned char* w, int b, int (&q)[8]);
template <int TY>
__device__ __forceinline__ float ggml_scale(const unsigned char* w, int b, int s0, int s1, float da, float sa, const int* aq);
template <int TY>
__device__ __forceinline__ void ggml_values(const unsigned char* w, int b, float (&v)[32]);

// Q4_0, 18 bytes per 32: f16 d, qs[16]; element l < 16 is the low nibble of qs[l], element
// 16 + l its high nibble; value d * (q - 8): d * (da * s - 8 * sa).
template <>
__device__ __forceinline__ void ggml_codes<2>(const unsigned char* w, int b, int (&q)[8]) {
    ggml_nibble_codes<2>(w + (size_t)b * MP_GGML_Q4_0_BYTES + 2, q);
}
template <>
__device__ __forceinline__ float ggml_scale<2>(const unsigned char* w, int b, int s0, int s1, float da, float sa, const int* aq) {
    const float t = __fadd_rn(__fmul_rn(da, (float)(s0 + s1)), -__fmul_rn(8.0f, sa));
    return __fmul_rn(f16_at(w + (size_t)b * MP_GGML_Q4_0_BYTES), t);
}

// Q4_1, 20 bytes per 32: f16 d, f16 m, qs[16] (as Q4_0); value d * q + m:
// (d * da) * s + m * sa.
__device__ __forceinline__ float ggml_offset_scale(const unsigned char* blk, int s, float da, float sa) {
    const float dd = __fmul_rn(f16_at(blk), da);
    return __fadd_rn(__fmul_rn(dd, (float)s), __fmul_rn(f16_at(blk + 2), sa));
}
template <>
__device__ __forceinline__ void ggml_codes<3>(const unsigned char* w, int b, int (&q)[8]) {
    ggml_nibble_codes<4>(w + (size_t)b * MP_GGML_Q4_1_BYTES + 4, q);
}
template <>
__device__ __forceinline__ float ggml_scale<3>(const unsigned char* w, int b, int s0, int s1, float da, float sa, const int* aq) {
    return ggml_offset_scale(w + (size_t)b * MP_GGML_Q4_1_BYTES, s0 + s1, da, sa);
}

// The codes of Q5_0 and Q5_1: qh (bit l: the fifth bit of element l) and qs (as Q4_0).
template <int A>
__device__ __forceinline__ void ggml_q5_codes(const unsigned char* qh, const unsigned char* qs, int (&q)[8]) {
    const unsigned int h = ggml_w32<A>(qh);
    unsigned int v[4];
    ggml_w32x4<A>(qs, v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        q[i] = ggml_with_high(v[i] & 0x0F0F0F0Fu, h, 4 * i);
        q[4 + i] = ggml_with_high((v[i] >> 4) & 0x0F0F0F0Fu, h, 16 + 4 * i);
    }
}

// Q5_0, 22 bytes per 32: f16 d, qh[4], qs[16]; value d * (q - 16).
template <>
__device__ __forceinline__ void ggml_codes<6>(const unsigned char* w, int b, int (&q)[8]) {
    const unsigned char* blk = w + (size_t)b * MP_GGML_Q5_0_BYTES;
    ggml_q5_codes<2>(blk + 2, blk + 6, q);
}
template <>
__device__ __forceinline__ float ggml_scale<6>(const unsigned char* w, int b, int s0, int s1, float da, float sa, const int* aq) {
    const float t = __fadd_rn(__fmul_rn(da, (float)(s0 + s1)), -__fmul_rn(16.0f, sa));
    return __fmul_rn(f16_at(w + (size_t)b * MP_GGML_Q5_0_BYTES), t);
}

// Q5_1, 24 bytes per 32: f16 d, f16 m, qh[4], qs[16]; value d * q + m.
template <>
__device__ __forceinline__ void ggml_codes<7>(const unsigned char* w, int b, int (&q)[8]) {
    const unsigned char* blk = w + (size_t)b * MP_GGML_Q5_1_BYTES;
    ggml_q5_codes<4>(blk + 4, blk + 8, q);
}
template <>
__device__ __forceinline__ float ggml_scale<7>(const unsigned char* w, int b, int s0, int s1, float da, float sa, const int* aq) {
    return ggml_offset_scale(w + (size_t)b * MP_GGML_Q5_1_BYTES, s0 + s1, da, sa);
}

// Q8_0, 34 bytes per 32: f16 d, i8 qs[32]; value d * q.
template <>
__device__ __forceinline__ void ggml_codes<8>(const unsigned char* w, int b, int (&q)[8]) {
    unsigned int v[8];
    ggml_w32x8<2>(w + (size_t)b * MP_GGML_Q8_0_BYTES + 2, v);
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = (int)v[i];
}
template <>
__device__ __forceinline__ float ggml_scale<8>(const unsigned char* w, int b, int s0, int s1, float da, float sa, const int* aq) {
    return __fmul_rn(f16_at(w + (size_t)b * MP_GGML_Q8_0_BYTES), __fmul_rn(da, (float)(s0 + s1)));
}

// Q2_K, 84 bytes per 256: scales[16] (low nibble scale, high nibble min, one per 16 values),
// qs[64], f16 d, f16 dmin. Sub-block j = 4 h + t: element l is bits 2t, 2t+1 of qs[32 h + l];
// values 0..15 under scales[8 h + 2 t], 16..31 under scales[8 h + 2 t + 1]; value
// d * sc * q - dmin * m: (d da) (sc0 s0 + sc1 s1) - (dmin da) (m0 u0 + m1 u1), u the sums
// of the activation codes per 16.
template <>
__device__ __forceinline__ void ggml_codes<10>(const unsigned char* w, int b, int (&q)[8]) {
    const int j = b & 7, h = j >> 2, t = j & 3;
    unsigned int v[8];
    ggml_w32x8<4>(w + (size_t)(b >> 3) * MP_GGML_Q2K_BYTES + 16 + 32 * h, v);
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = (int)((v[i] >> (2 * t)) & 0x03030303u);
}
template <>
__device__ __forceinline__ float ggml_scale<10>(const unsigned char* w, int b, int s0, int s1, float da, float sa, const int* aq) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_Q2K_BYTES;
    const int j = b & 7, h = j >> 2, t = j & 3;
    int u0 = 0, u1 = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        u0 = __dp4a(0x01010101, aq[i], u0);
        u1 = __dp4a(0x01010101, aq[4 + i], u1);
    }
    const int sc0 = blk[8 * h + 2 * t], sc1 = blk[8 * h + 2 * t + 1];
    const int sd = (sc0 & 15) * s0 + (sc1 & 15) * s1, sm = (sc0 >> 4) * u0 + (sc1 >> 4) * u1;
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
// element l is bits 2t, 2t+1 of qs[32 h + l], less 4 where bit j of hmask[l] is clear (as an
// int8 lane: the two bits under 0xFC); values 0..15 and 16..31 under the scales 2j and
// 2j + 1; value d * (sc - 32) * q.
template <>
__device__ __forceinline__ void ggml_codes<11>(const unsigned char* w, int b, int (&q)[8]) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_Q3K_BYTES;
    const int j = b & 7, h = j >> 2, t = j & 3;
    unsigned int v[8], m[8];
    ggml_w32x8<2>(blk + 32 + 32 * h, v);
    ggml_w32x8<2>(blk, m);
#pragma unroll
    for (int i = 0; i < 8; ++i)
        q[i] = (int)(((v[i] >> (2 * t)) & 0x03030303u) | ((~(m[i] >> j) & 0x01010101u) * 0xFCu));
}
template <>
__device__ __forceinline__ float ggml_scale<11>(const unsigned char* w, int b, int s0, int s1, float da, float sa, const int* aq) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_Q3K_BYTES;
    const int j = b & 7;
    const int sc0 = ggml_q3k_scale(blk + 96, 2 * j), sc1 = ggml_q3k_scale(blk + 96, 2 * j + 1);
    return __fmul_rn(f16_at(blk + 108), __fmul_rn(da, (float)(sc0 * s0 + sc1 * s1)));
}

// IQ4_NL, 18 bytes per 32: f16 d, qs[16] (indices as Q4_0's codes); value d * kvalues[q].
template <>
__device__ __forceinline__ void ggml_codes<20>(const unsigned char* w, int b, int (&q)[8]) {
    ggml_table_codes<GGML_TAB_IQ4NL, 2>(w + (size_t)b * MP_GGML_IQ4_NL_BYTES + 2, q);
}
template <>
__device__ __forceinline__ float ggml_scale<20>(const unsigned char* w, int b, int s0, int s1, float da, float sa, const int* aq) {
    return __fmul_rn(f16_at(w + (size_t)b * MP_GGML_IQ4_NL_BYTES), __fmul_rn(da, (float)(s0 + s1)));
}

// IQ4_XS, 136 bytes per 256: f16 d, u16 scales_h, scales_l[4], qs[128]; sub-block j's 6-bit
// scale ls is nibble j of scales_l with bits 2j, 2j+1 of scales_h above it; its 16 index
// bytes qs[16 j ..] as IQ4_NL's; value d * (ls - 32) * kvalues[q].
template <>
__device__ __forceinline__ void ggml_codes<23>(const unsigned char* w, int b, int (&q)[8]) {
    ggml_table_codes<GGML_TAB_IQ4NL, 8>(w + (size_t)(b >> 3) * MP_GGML_IQ4_XS_BYTES + 8 + 16 * (b & 7), q);
}
template <>
__device__ __forceinline__ float ggml_scale<23>(const unsigned char* w, int b, int s0, int s1, float da, float sa, const int* aq) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_IQ4_XS_BYTES;
    const int j = b & 7;
    const unsigned int sh = (unsigned int)blk[2] | ((unsigned int)blk[3] << 8);
    const int ls = (int)(((blk[4 + j / 2] >> (4 * (j & 1))) & 15u) | (((sh >> (2 * j)) & 3u) << 4)) - 32;
    return __fmul_rn(f16_at(blk), __fmul_rn(da, (float)(ls * (s0 + s1))));
}

// MXFP4, 17 bytes per 32: E8M0 e, qs[16] (indices as Q4_0's codes); value
// 2^(e - 128) * kvalues_mxfp4[q] (ggml's e8m0_to_fp32_half: the doubled table's half).
__device__ __forceinline__ float ggml_e8m0_half(unsigned int e) {
    return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}
template <>
__device__ __forceinline__ void ggml_codes<39>(const unsigned char* w, int b, int (&q)[8]) {
    ggml_table_codes<GGML_TAB_MXFP4, 1>(w + (size_t)b * MP_GGML_MXFP4_BYTES + 1, q);
}
template <>
__device__ __forceinline__ float ggml_scale<39>(const unsigned char* w, int b, int s0, int s1, float da, float sa, const int* aq) {
    const float d = ggml_e8m0_half(w[(size_t)b * MP_GGML_MXFP4_BYTES]);
    return __fmul_rn(d, __fmul_rn(da, (float)(s0 + s1)));
}

// NF4 (the engine's own type 128, bitsandbytes; converters/bnb.rs), 36 bytes per 64 values
// of a row: f32 absmax, then two halves of 16 code bytes, each as Q4_0's codes; value
// NF4[q] * absmax. The engine's 32-value block b is half b % 2 of 64-value block b / 2. The
// dot product takes NF4[q] * 2^13 rounded (`NF4_X8192`, within 5.7e-5 of the absmax) as
// 128 hi + lo: the hi lanes are the block's codes (s0 + s1), the lo lanes' sum against the
// activation codes `aq` is taken here; value (absmax * 2^-13) * (da * (128 (s0 + s1) + lo)).
template <>
__device__ __forceinline__ void ggml_codes<128>(const unsigned char* w, int b, int (&q)[8]) {
    ggml_table_codes<GGML_TAB_NF4HI, 4>(w + (size_t)(b >> 1) * MP_GGML_NF4_BYTES + 4 + 16 * (b & 1), q);
}
template <>
__device__ __forceinline__ float ggml_scale<128>(const unsigned char* w, int b, int s0, int s1, float da, float sa, const int* aq) {
    const unsigned char* blk = w + (size_t)(b >> 1) * MP_GGML_NF4_BYTES;
    int lo[8];
    ggml_table_codes<GGML_TAB_NF4LO, 4>(blk + 4 + 16 * (b & 1), lo);
    int l = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) l = __dp4a(lo[i], aq[i], l);
    const float d = __fmul_rn(*reinterpret_cast<const float*>(blk), 1.f / 8192.f);
    return __fmul_rn(d, __fmul_rn(da, (float)(128 * (s0 + s1) + l)));
}

// NVFP4 (GGUF type 40), 36 bytes per 64: UE4M3 d[4] (one per 16 values), qs[32]; element e
// of sub-block k (0..3) is the low (e < 8) or high nibble of qs[8 k + e % 8]; value
// ue4m3_half(d[k]) * kvalues_mxfp4[q]. The engine's 32-value block b is the half b % 2 of
// 64-value block b / 2: sub-blocks 2 (b % 2) (s0) and 2 (b % 2) + 1 (s1). The per-tensor f32
// scale (the `.scale` tensor) is not part of the block: the GEMV's `sc` carries it.
// ggml's UE4M3 with its half (gguf-py `NVFP4.ue4m3_to_fp32`, converters/nvfp4.rs): bit 7
// ignored, exponent e = bits 3..6, mantissa m = bits 0..2; e = 0: m 2^-10, else (8 + m)
// 2^(e - 11) (exact in f32); the byte 0x7F is zero.
__device__ __forceinline__ float ggml_ue4m3_half(unsigned int x) {
    const unsigned int e = (x >> 3) & 15u, m = x & 7u;
    const float p = __uint_as_float(((e == 0u ? 1u : e) + 116u) << 23);  // 2^(max(e, 1) - 11)
    return x == 0x7Fu ? 0.f : __fmul_rn((float)(m | (e == 0u ? 0u : 8u)), p);
}
template <>
__device__ __forceinline__ void ggml_codes<40>(const unsigned char* w, int b, int (&q)[8]) {
    const unsigned char* qs = w + (size_t)(b >> 1) * MP_GGML_NVFP4_BYTES + 4 + 16 * (b & 1);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const unsigned int v0 = ggml_w32<4>(qs + 8 * k), v1 = ggml_w32<4>(qs + 8 * k + 4);
        ggml_table8<GGML_TAB_MXFP4>(v0, q[4 * k + 0], q[4 * k + 2]);
        ggml_table8<GGML_TAB_MXFP4>(v1, q[4 * k + 1], q[4 * k + 3]);
    }
}
template <>
__device__ __forceinline__ float ggml_scale<40>(const unsigned char* w, int b, int s0, int s1, float da, float sa, const int* aq) {
    const unsigned char* d = w + (size_t)(b >> 1) * MP_GGML_NVFP4_BYTES + 2 * (b & 1);
    const float t = __fadd_rn(__fmul_rn(ggml_ue4m3_half(d[0]), (float)s0), __fmul_rn(ggml_ue4m3_half(d[1]), (float)s1));
    return __fmul_rn(da, t);
}

// Sub-block j (32 values) of a Q4_K or Q5_K super-block at `blk` whose codes (0..31) give
// `s` against the q8_1 block `a`: (d * sc) * (da * s) - (dmin * m) * sa.
__device__ __forceinline__ float ggml_kquant_sub(const unsigned char* blk, int j, int s, float da, float sa) {
    int sc, m;
    ggml_scale_min_k4(j, blk + 4, &sc, &m);
    const float dsc = __fmul_rn(f16_at(blk), (float)sc);
    const float dm = __fmul_rn(f16_at(blk + 2), (float)m);
    return __fadd_rn(__fmul_rn(dsc, __fmul_rn(da, (float)s)), -__fmul_rn(dm, sa));
}

// Q4_K, 144 bytes per 256: f16 d, f16 dmin, scales[12], qs[128]; sub-block j is the low
// (j even) or high (j odd) nibbles of qs[32 (j / 2) ..][..32]; value d * sc * q - dmin * m.
template <>
__device__ __forceinline__ void ggml_codes<12>(const unsigned char* w, int b, int (&q)[8]) {
    const int j = b & 7;
    unsigned int v[8];
    ggml_w32x8<16>(w + (size_t)(b >> 3) * MP_Q4K_BYTES + 16 + 32 * (j >> 1), v);
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = (int)((v[i] >> (4 * (j & 1))) & 0x0F0F0F0Fu);
}
template <>
__device__ __forceinline__ float ggml_scale<12>(const unsigned char* w, int b, int s0, int s1, float da, float sa, const int* aq) {
    return ggml_kquant_sub(w + (size_t)(b >> 3) * MP_Q4K_BYTES, b & 7, s0 + s1, da, sa);
}

// Q5_K, 176 bytes per 256: f16 d, f16 dmin, scales[12], qh[32], qs[128] (as Q4_K); bit j of
// qh[l] is the fifth bit of element l of sub-block j.
template <>
__device__ __forceinline__ void ggml_codes<13>(const unsigned char* w, int b, int (&q)[8]) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_Q5K_BYTES;
    const int j = b & 7;
    unsigned int v[8], h[8];
    ggml_w32x8<16>(blk + 48 + 32 * (j >> 1), v);
    ggml_w32x8<16>(blk + 16, h);
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = (int)(((v[i] >> (4 * (j & 1))) & 0x0F0F0F0Fu) | (((h[i] >> j) & 0x01010101u) << 4));
}
template <>
__device__ __forceinline__ float ggml_scale<13>(const unsigned char* w, int b, int s0, int s1, float da, float sa, const int* aq) {
    return ggml_kquant_sub(w + (size_t)(b >> 3) * MP_GGML_Q5K_BYTES, b & 7, s0 + s1, da, sa);
}

// Q6_K, 210 bytes per 256: ql[128], qh[64], i8 scales[16], f16 d. Sub-block j = 4 h + t (h the
// half of 128, t its quarter): element l is ql[64 h + 32 (t & 1) + l] >> 4 (t >> 1) & 15 with
// bits 2t, 2t+1 of qh[32 h + l] above them, less 32 (as an int8 lane: the low 5 bits, under
// 0xE0 where the sixth is clear); values 0..15 scaled by scales[8 h + 2 t], 16..31 by
// scales[8 h + 2 t + 1]; value d * scale * q.
template <>
__device__ __forceinline__ void ggml_codes<14>(const unsigned char* w, int b, int (&q)[8]) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_Q6K_BYTES;
    const int j = b & 7, h = j >> 2, t = j & 3;
    unsigned int lo[8], hi[8];
    ggml_w32x8<2>(blk + 64 * h + 32 * (t & 1), lo);
    ggml_w32x8<2>(blk + 128 + 32 * h, hi);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const unsigned int x = ((lo[i] >> (4 * (t >> 1))) & 0x0F0F0F0Fu) | (((hi[i] >> (2 * t)) & 0x03030303u) << 4);
        q[i] = (int)((x & 0x1F1F1F1Fu) | ((~(x >> 5) & 0x01010101u) * 0xE0u));
    }
}
template <>
__device__ __forceinline__ float ggml_scale<14>(const unsigned char* w, int b, int s0, int s1, float da, float sa, const int* aq) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_Q6K_BYTES;
    const int j = b & 7, h = j >> 2, t = j & 3;
    const int sc0 = (int)(signed char)blk[192 + 8 * h + 2 * t], sc1 = (int)(signed char)blk[192 + 8 * h + 2 * t + 1];
    return __fmul_rn(f16_at(blk + 208), __fmul_rn(da, (float)(sc0 * s0 + sc1 * s1)));
}

// ---- the IQ entries: the grids (grids.rs), then kernels_iq.cuh; then kernels_stage.cuh ----

// y[r, j] = sum over the 32-value blocks b of weight row j of block b's share against q8_1
// block b of activation row r, for r < m <= M. One warp per weight row, which it reads a stage
// at a time: the stage's bytes as 16-byte words (coalesced) into the warp's stage buffer in
// shared memory (MP_GGML_STAGE_BYTES_MAX + 32 bytes; GGML_STAGE_STRIDE), where each lane takes
// its blocks. A block sits there at a multiple of gcd(its bytes, 16), as in the row (the stage
// starts at the row's offset modulo 16), which each type's ggml_codes reads by. Lane l takes
// blocks l, l + 32, ... in order (an f32 sum per activation row), then the lanes' sums meet in
// a butterfly (xor 16, 8, 4, 2, 1), times the projection's output scale `sc` (llama.cpp's
// per-tensor `.scale`; 1 where the source has none).
//
// The next stages' bytes in flight while one is multiplied: BUFS = 0, the next stage's words
// in registers, stored into the one buffer between two warp barriers; BUFS >= 2, a ring of BUFS
// buffers filled by cp.async, BUFS - 1 stages in flight without registers (`ggml_gemv1`).
//
// SA (`ggml_gemv_sa`): the launch block's 8 warps share each stage's q8_1 activation blocks,
// which its 256 threads first copy as 16-byte words into `act` (MP_GGML_GEMV_MAX_M rows of
// GGML_ACT_WORDS words: a row's 64 blocks of 36 bytes from the 16-byte word below their
// start), between two barriers; each lane then reads its blocks' words there (a stride of 9
// words: no bank conflicts) instead of from global memory, where a warp's 4-byte loads at a
// 36-byte stride touch 9 lines each, once per warp. The sums are the same, in the same order.
//
// SPLIT (`ggml_gemv1`, `ggml_gemv_split`): the activations split (kernels/ffn_q8_1.cu, q8_1_at:
// every row's codes, then every block's d and s), which a lane reads from global memory (L1) as
// two 16-byte words and one 4-byte word a block; for one row (ONE) a stage's before its
// weights are waited for.
#define GGML_ACT_WORDS (64 * MP_Q8_1_BYTES / 16 + 1)
#define GGML_STAGE_STRIDE (MP_GGML_STAGE_BYTES_MAX + 32)
template <int TY, int M, int BUFS, bool SA, bool SPLIT>
__device__ __forceinline__ void ggml_gemv_rows(const unsigned char* __restrict__ xq, int m,
                                               const unsigned char* __restrict__ w, float sc, float* __restrict__ y, int n,
                                               int kp, int ldy, unsigned char* stage, uint4* act) {
    static_assert(BUFS == 0 || (BUFS >= 2 && !SA), "a register stage, or a cp.async ring without SA");
    static_assert(!(SA && SPLIT), "shared activations are blocks");
    constexpr bool ONE = SPLIT && M == 1;  // `ggml_gemv1`
    const size_t row_bytes = ggml_row_bytes<TY>(kp);
    constexpr int SB = ggml_stage_bytes<TY>();
    constexpr int WORDS = SB / 16 + 1;  // a stage's bytes from the 16-byte word below its start
    constexpr int PER_LANE = (WORDS + 31) / 32;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int j = blockIdx.x * (blockDim.x >> 5) + warp;
    // Without SA a warp past the last row has nothing to do; with it, it still copies its share
    // of the activations and meets the barriers.
    const bool active = j < n;
    if (!SA && !active) return;
    const int nb = kp / MP_GGML_QK;
    const int stages = (nb + 63) / 64;
    const size_t total = (size_t)n * row_bytes;
    const size_t row0 = (size_t)j * row_bytes;
    // Stage s's bytes from the 16-byte word below its start (SB is whole words): `wrow` + s SB;
    // all inside the buffer while s SB <= room (every stage but the last rows' last ones).
    auto stage_base = [&](int s) { return (row0 + (size_t)s * SB) & ~(size_t)15; };
    const unsigned char* wrow = w + (row0 & ~(size_t)15);
    const long long room = (long long)total - (long long)(row0 & ~(size_t)15) - 16 * WORDS;
    float acc[M];
#pragma unroll
    for (int r = 0; r < M; ++r) acc[r] = 0.f;
    uint4 next[BUFS == 0 ? PER_LANE : 1];
    // A stage's words: where they all lie inside the buffer (every stage but the last rows'
    // last ones), without a bound per word.
    auto load = [&](int s) {
        if (!active) return;
        const size_t base = stage_base(s);
        const bool whole = (long long)s * SB <= room;
        const uint4* src = reinterpret_cast<const uint4*>(wrow + (size_t)s * SB);
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i)
            if (lane + 32 * i < WORDS)
                next[i] = whole ? __ldg(src + lane + 32 * i) : ggml_word(w, base + 16 * (size_t)(lane + 32 * i), total);
    };
    // Stage s into ring buffer `slot`, as one cp.async group (empty past the last stage).
    auto issue = [&](int s, int slot) {
        if (s < stages) {
            unsigned char* dst = stage + slot * GGML_STAGE_STRIDE;
            if ((long long)s * SB <= room) {
                const unsigned char* src = wrow + (size_t)s * SB;
#pragma unroll
                for (int i = 0; i < PER_LANE; ++i)
                    if (lane + 32 * i < WORDS) ggml_cp_whole(dst + 16 * (lane + 32 * i), src + 16 * (lane + 32 * i));
            } else {
                const size_t base = stage_base(s);
                for (int i = lane; i < WORDS; i += 32) ggml_cp_word(dst + 16 * i, w, base + 16 * (size_t)i, total);
            }
        }
        ggml_cp_commit();
    };
    if constexpr (BUFS == 0) {
        load(0);
    } else {
#pragma unroll
        for (int s = 0; s + 1 < BUFS; ++s) issue(s, s);
    }
    pdl_wait();  // the first stages' weights in flight under the previous launch's tail
    int slot = 0;  // s % BUFS
    for (int s = 0; s < stages; ++s) {
        // One row (`ggml_gemv1`): the stage's activation codes and words loaded before its
        // weights are waited for (a block past the row's end loads the last block's, unused).
        int pa[2][8];
        unsigned int pds[2];
        if constexpr (ONE) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int bb = min(64 * s + lane + 32 * h, nb - 1);
                const int4* c = reinterpret_cast<const int4*>(xq + 32 * (size_t)bb);
                const int4 c0 = __ldg(c), c1 = __ldg(c + 1);
                pa[h][0] = c0.x, pa[h][1] = c0.y, pa[h][2] = c0.z, pa[h][3] = c0.w;
                pa[h][4] = c1.x, pa[h][5] = c1.y, pa[h][6] = c1.z, pa[h][7] = c1.w;
                pds[h] = __ldg(reinterpret_cast<const unsigned int*>(xq + (size_t)kp) + bb);
            }
        }
        if constexpr (SA) {
            __syncthreads();  // every warp is done with the previous stage's activations
            const size_t xtotal = (size_t)m * nb * MP_Q8_1_BYTES;
            for (int i = threadIdx.x; i < m * GGML_ACT_WORDS; i += blockDim.x) {
                const int r = i / GGML_ACT_WORDS, wd = i % GGML_ACT_WORDS;
                const size_t at = (((size_t)r * nb + 64 * (size_t)s) * MP_Q8_1_BYTES & ~(size_t)15) + 16 * (size_t)wd;
                act[r * GGML_ACT_WORDS + wd] = ggml_word(xq, at, xtotal);
            }
            __syncthreads();
            if (!active) continue;
        }
        const unsigned char* buf = stage;
        if constexpr (BUFS == 0) {
            __syncwarp();  // every lane is done with the previous stage's bytes
#pragma unroll
            for (int i = 0; i < PER_LANE; ++i)
                if (lane + 32 * i < WORDS) reinterpret_cast<uint4*>(stage)[lane + 32 * i] = next[i];
            __syncwarp();
            if (s + 1 < stages) load(s + 1);
        } else {
            ggml_cp_wait<BUFS - 2>();  // this lane's copies of stage s have landed
            __syncwarp();  // every lane's have, and every lane is done with stage s - 1's buffer
            issue(s + BUFS - 1, slot == 0 ? BUFS - 1 : slot - 1);  // into stage s - 1's buffer
            buf = stage + slot * GGML_STAGE_STRIDE;
            slot = slot + 1 == BUFS ? 0 : slot + 1;
        }
        const unsigned char* blocks = buf + ((row0 + (size_t)s * SB) & 15);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int lb = lane + 32 * h, b = 64 * s + lb;
            // Split activations (`ggml_gemv1`, `ggml_gemv_split`): both blocks computed without
            // a branch between them (a block past the row's end reads the stage buffer's stale
            // bytes and the row's last activation block, and adds nothing), so a lane's two
            // blocks overlap.
            if (!SPLIT && b >= nb) break;
            int q[8];
            ggml_codes<TY>(blocks, lb, q);
#pragma unroll
            for (int r = 0; r < M; ++r) {
                if (r >= m) break;
                // The q8_1 block: its f16 d and s as one word, its 32 codes.
                unsigned int ds;
                const int* aq;
                int split[8];
                if constexpr (ONE) {
                    ds = pds[h];
                    aq = pa[h];
                } else if constexpr (SPLIT) {
                    // Two 16-byte words of codes (32-aligned), the d-and-s word: a warp's
                    // loads read 1 KB of codes and 128 bytes of words, each byte once, where
                    // the blocks' 36-byte stride has each 4-byte load touch 9 lines.
                    const int bc = min(b, nb - 1);
                    const int4* c = reinterpret_cast<const int4*>(xq + (size_t)r * kp + 32 * (size_t)bc);
                    const int4 c0 = __ldg(c), c1 = __ldg(c + 1);
                    split[0] = c0.x, split[1] = c0.y, split[2] = c0.z, split[3] = c0.w;
                    split[4] = c1.x, split[5] = c1.y, split[6] = c1.z, split[7] = c1.w;
                    ds = __ldg(reinterpret_cast<const unsigned int*>(xq + (size_t)m * kp) + (size_t)r * nb + bc);
                    aq = split;
                } else {
                    // Blocks of 36 bytes: 4-aligned.
                    const unsigned char* a;
                    if constexpr (SA) {
                        const size_t first = ((size_t)r * nb + 64 * (size_t)s) * MP_Q8_1_BYTES;
                        a = reinterpret_cast<const unsigned char*>(act + r * GGML_ACT_WORDS) + (first & 15) +
                            (size_t)lb * MP_Q8_1_BYTES;
                    } else {
                        a = xq + ((size_t)r * nb + b) * MP_Q8_1_BYTES;
                    }
                    ds = *reinterpret_cast<const unsigned int*>(a);
                    aq = reinterpret_cast<const int*>(a + 4);
                }
                const float da = __half2float(__ushort_as_half((unsigned short)(ds & 0xFFFFu)));
                const float sa = __half2float(__ushort_as_half((unsigned short)(ds >> 16)));
                int s0 = 0, s1 = 0;
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    s0 = __dp4a(q[i], aq[i], s0);
                    s1 = __dp4a(q[4 + i], aq[4 + i], s1);
                }
                const float part = ggml_scale<TY>(blocks, lb, s0, s1, da, sa, aq);
                if (!SPLIT || b < nb) acc[r] = __fadd_rn(acc[r], part);
            }
        }
    }
    if (!active) return;
#pragma unroll
    for (int r = 0; r < M; ++r) {
        float t = acc[r];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) t = __fadd_rn(t, __shfl_xor_sync(0xffffffffu, t, o));
        if (lane == 0 && r < m) y[(size_t)r * ldy + j] = __fmul_rn(t, sc);
    }
}

// The engine's GEMV: `xq` q8_1 blocks [m, kp / 32]; for each of `projs` projections (1 or 2:
// gate and up on one input in one launch) its `w` (`w2`), n rows of kp / qk blocks of GGUF
// type `ty` (`ty2`, its id), times its output scale `sc` (`sc2`), into y (y2) [m, n] with row
// stride ldy. A type this module lacks writes nothing (the layer refuses it when its weights
// are installed). A dependent launch (common.cuh, pdl_wait). Grid (ceil(n / warps), projs),
// a warp per weight row; the same sums from every form. `ggml_gemv` (8 warps): m <=
// MP_GGML_GEMV_MAX_M, the next stage in registers. `ggml_gemv_sa` (the layer's from 2 rows):
// the same, the activations shared by the launch block's warps through shared memory (SA
// above). `ggml_gemv1` (the layer's for one row), MP_GGML_GEMV1_WARPS warps: MP_GGML_GEMV1_BUFS stage
// buffers a warp filled by cp.async, registers for MP_GGML_GEMV1_BLOCKS launch blocks an SM, its
// `xq` split (`quantize_act_q8_1s`; SPLIT above).
template <int M, int BUFS, bool SA, bool SPLIT>
__device__ __forceinline__ void ggml_gemv_any(const unsigned char* xq, int m, const unsigned char* w, int ty, float sc,
                                              float* y, const unsigned char* w2, int ty2, float sc2, float* y2,
                                              int n, int kp, int ldy, unsigned char* st, uint4* act) {
    if (blockIdx.y == 1) w = w2, ty = ty2, sc = sc2, y = y2;
    switch (ty) {
#define GGML_GEMV_CASE(TY) \
    case TY: ggml_gemv_rows<TY, M, BUFS, SA, SPLIT>(xq, m, w, sc, y, n, kp, ldy, st, act); break;
        GGML_ENGINE_TYPES(GGML_GEMV_CASE)
#undef GGML_GEMV_CASE
        default: pdl_wait(); break;
    }
}
extern "C" __global__ void ggml_gemv(const unsigned char* xq, int m, const unsigned char* w, int ty, float sc, float* y,
                                     const unsigned char* w2, int ty2, float sc2, float* y2, int projs, int n, int kp,
                                     int ldy) {
    pdl_trigger();
    __shared__ __align__(16) unsigned char stages[8][GGML_STAGE_STRIDE];
    ggml_gemv_any<MP_GGML_GEMV_MAX_M, 0, false, false>(xq, m, w, ty, sc, y, w2, ty2, sc2, y2, n, kp, ldy,
                                                stages[threadIdx.x >> 5], nullptr);
}
extern "C" __global__ void ggml_gemv_sa(const unsigned char* xq, int m, const unsigned char* w, int ty, float sc,
                                        float* y, const unsigned char* w2, int ty2, float sc2, float* y2, int projs,
                                        int n, int kp, int ldy) {
    pdl_trigger();
    __shared__ __align__(16) unsigned char stages[8][GGML_STAGE_STRIDE];
    __shared__ uint4 act[MP_GGML_GEMV_MAX_M * GGML_ACT_WORDS];
    ggml_gemv_any<MP_GGML_GEMV_MAX_M, 0, true, false>(xq, m, w, ty, sc, y, w2, ty2, sc2, y2, n, kp, ldy,
                                               stages[threadIdx.x >> 5], act);
}
extern "C" __global__ void __launch_bounds__(32 * MP_GGML_GEMV1_WARPS, MP_GGML_GEMV1_BLOCKS) ggml_gemv1(
    const unsigned char* xq, int m, const unsigned char* w, int ty, float sc, float* y, const unsigned char* w2,
    int ty2, float sc2, float* y2, int projs, int n, int kp, int ldy) {
    pdl_trigger();
    __shared__ __align__(16) unsigned char stages[MP_GGML_GEMV1_WARPS][MP_GGML_GEMV1_BUFS * GGML_STAGE_STRIDE];
    ggml_gemv_any<1, MP_GGML_GEMV1_BUFS, false, true>(xq, m, w, ty, sc, y, w2, ty2, sc2, y2, n, kp, ldy,
                                             stages[threadIdx.x >> 5], nullptr);
}
// A/B (issue 56): `ggml_gemv1`'s form for up to MP_GGML_GEMV_SPLIT_M rows, its activations split,
// registers for as many launch blocks an SM.
extern "C" __global__ void __launch_bounds__(32 * MP_GGML_GEMV1_WARPS, MP_GGML_GEMV1_BLOCKS) ggml_gemv_split(
    const unsigned char* xq, int m, const unsigned char* w, int ty, float sc, float* y, const unsigned char* w2,
    int ty2, float sc2, float* y2, int projs, int n, int kp, int ldy) {
    pdl_trigger();
    __shared__ __align__(16) unsigned char stages[MP_GGML_GEMV1_WARPS][MP_GGML_GEMV1_BUFS * GGML_STAGE_STRIDE];
    ggml_gemv_any<MP_GGML_GEMV_SPLIT_M, MP_GGML_GEMV1_BUFS, false, true>(xq, m, w, ty, sc, y, w2, ty2, sc2, y2, n, kp,
                                                                         ldy, stages[threadIdx.x >> 5], nullptr);
}
// The same form for up to MP_GGML_GEMV_SPLIT4_M rows (`ggml_gemv_split4`), registers for
// MP_GGML_GEMV1_BLOCKS launch blocks an SM (32 warps: one wave of the llama-8B down
// projection's 4096 rows on 132 SMs). For eight rows the form (85 registers, 24 warps an SM)
// measured slower than `ggml_gemv_sa` on the down shape (H200, session 35).
extern "C" __global__ void __launch_bounds__(32 * MP_GGML_GEMV1_WARPS, MP_GGML_GEMV1_BLOCKS) ggml_gemv_split4(
    const unsigned char* xq, int m, const unsigned char* w, int ty, float sc, float* y, const unsigned char* w2,
    int ty2, float sc2, float* y2, int projs, int n, int kp, int ldy) {
    pdl_trigger();
    __shared__ __align__(16) unsigned char stages[MP_GGML_GEMV1_WARPS][MP_GGML_GEMV1_BUFS * GGML_STAGE_STRIDE];
    ggml_gemv_any<MP_GGML_GEMV_SPLIT4_M, MP_GGML_GEMV1_BUFS, false, true>(xq, m, w, ty, sc, y, w2, ty2, sc2, y2, n, kp,
                                                                          ldy, stages[threadIdx.x >> 5], nullptr);
}
