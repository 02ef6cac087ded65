// The engine's IQ entries (issue 56): IQ2_XXS (16), IQ2_XS (17), IQ3_XXS (18), IQ1_S (19), IQ3_S
// (21), IQ2_S (22) and IQ1_M (29). Spliced into kernels.cu at its marker, after the grids (grids.rs: each grid row
// its values as bytes, from the converters' tables, gguf-py's). Block layouts: ggml-common.h
// (`block_iq2_xxs` .. `block_iq3_s`; formats.md, "ggml"; converters/iq2.rs, iq3.rs). A
// value is (scale) * grid * sign: the codes are the grid bytes with their signs applied as int8
// lanes (every grid value is below 64), so the integer sums s0 (values 0..15) and s1 (16..31)
// carry the signs and the scale is applied once per 16 or 32 values.

// Four grid bytes `g` with the bytes whose bit of `signs` (bits 0..3) is set negated.
__device__ __forceinline__ int ggml_signed4(unsigned int g, unsigned int signs) {
    const unsigned int m = (((signs & 15u) * 0x00204081u) & 0x01010101u) * 0xFFu;
    return (int)__vsub4(g ^ m, m);
}

// `ksigns_iq2xs[i]`: the 7 sign bits of i with the eighth making their count even.
__device__ __forceinline__ unsigned int ggml_ksigns(unsigned int i) {
    i &= 127u;
    return i | ((__popc(i) & 1u) << 7);
}

// Eight values of an IQ2 grid row (a 64-bit word) with their 8 sign bits, into two code words.
__device__ __forceinline__ void ggml_iq2_row(unsigned long long g, unsigned int signs, int* q) {
    q[0] = ggml_signed4((unsigned int)g, signs);
    q[1] = ggml_signed4((unsigned int)(g >> 32), signs >> 4);
}

// The values of an 8-value IQ2 row: (db * grid) * sign, gguf-py's order (converters/iq2.rs).
__device__ __forceinline__ void ggml_iq2_values(unsigned long long g, unsigned int signs, float db, float* v) {
    for (int i = 0; i < 8; ++i) {
        const float x = __fmul_rn(db, (float)((g >> (8 * i)) & 0xFFu));
        v[i] = (signs >> i) & 1u ? -x : x;
    }
}

// IQ2_XXS, 66 bytes per 256: f16 d, then per 32 values two u32: aux0 (four grid indices, a byte
// each, into the 256-row grid) and aux1 (four 7-bit sign indices, `ksigns`, then the 4-bit
// scale ls in bits 28..31); value d * (0.5 + ls) * 0.25 * grid * sign:
// (d / 8) * (da * ((2 ls + 1) * s)).
template <>
__device__ __forceinline__ void ggml_codes<16>(const unsigned char* w, int b, int (&q)[8]) {
    const unsigned char* sub = w + (size_t)(b >> 3) * MP_GGML_IQ2_XXS_BYTES + 2 + 8 * (b & 7);
    const unsigned int aux0 = ggml_w32<2>(sub), aux1 = ggml_w32<2>(sub + 4);
#pragma unroll
    for (int l = 0; l < 4; ++l)
        ggml_iq2_row(ggml_iq2xxs_grid[(aux0 >> (8 * l)) & 0xFFu], ggml_ksigns(aux1 >> (7 * l)), q + 2 * l);
}
template <>
__device__ __forceinline__ float ggml_scale<16>(const unsigned char* w, int b, int s0, int s1, float da, float sa, const int* aq) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_IQ2_XXS_BYTES;
    const int ls = (int)(ggml_w32<2>(blk + 2 + 8 * (b & 7) + 4) >> 28);
    return __fmul_rn(__fmul_rn(f16_at(blk), 0.125f), __fmul_rn(da, (float)((2 * ls + 1) * (s0 + s1))));
}
template <>
__device__ __forceinline__ void ggml_values<16>(const unsigned char* w, int b, float (&v)[32]) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_IQ2_XXS_BYTES;
    const unsigned char* sub = blk + 2 + 8 * (b & 7);
    const unsigned int aux0 = (unsigned int)ggml_u32(sub), aux1 = (unsigned int)ggml_u32(sub + 4);
    const float db = __fmul_rn(__fmul_rn(f16_at(blk), __fadd_rn(0.5f, (float)(aux1 >> 28))), 0.25f);
    for (int l = 0; l < 4; ++l)
        ggml_iq2_values(ggml_iq2xxs_grid[(aux0 >> (8 * l)) & 0xFFu], ggml_ksigns(aux1 >> (7 * l)), db, v + 8 * l);
}

// The two 4-bit scales of sub-block j of an IQ2_XS/IQ2_S super-block: scales[j]'s low nibble for
// values 0..15, its high nibble for 16..31; (d / 8) * (da * ((2 ls0 + 1) s0 + (2 ls1 + 1) s1)).
__device__ __forceinline__ float ggml_iq2_scale16(const unsigned char* blk, int sc_at, int j, int s0, int s1, float da) {
    const int ls = blk[sc_at + j];
    const int t = (2 * (ls & 15) + 1) * s0 + (2 * (ls >> 4) + 1) * s1;
    return __fmul_rn(__fmul_rn(f16_at(blk), 0.125f), __fmul_rn(da, (float)t));
}
// The values' scale d * (0.5 + ls) * 0.25 of 8-value group t (0..3) of sub-block j.
__device__ __forceinline__ float ggml_iq2_db16(const unsigned char* blk, int sc_at, int j, int t) {
    const int ls = (blk[sc_at + j] >> (4 * (t >> 1))) & 15;
    return __fmul_rn(__fmul_rn(f16_at(blk), __fadd_rn(0.5f, (float)ls)), 0.25f);
}

// IQ2_XS, 74 bytes per 256: f16 d, per 8 values a u16 (grid index in its low 9 bits into the
// 512-row grid, a 7-bit sign index above), then scales[8] (ggml_iq2_scale16).
template <>
__device__ __forceinline__ void ggml_codes<17>(const unsigned char* w, int b, int (&q)[8]) {
    const unsigned char* sub = w + (size_t)(b >> 3) * MP_GGML_IQ2_XS_BYTES + 2 + 8 * (b & 7);
    const unsigned int lo = ggml_w32<2>(sub), hi = ggml_w32<2>(sub + 4);
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        const unsigned int x = ((t < 2 ? lo : hi) >> (16 * (t & 1))) & 0xFFFFu;
        ggml_iq2_row(ggml_iq2xs_grid[x & 511u], ggml_ksigns(x >> 9), q + 2 * t);
    }
}
template <>
__device__ __forceinline__ float ggml_scale<17>(const unsigned char* w, int b, int s0, int s1, float da, float sa, const int* aq) {
    return ggml_iq2_scale16(w + (size_t)(b >> 3) * MP_GGML_IQ2_XS_BYTES, 66, b & 7, s0, s1, da);
}
template <>
__device__ __forceinline__ void ggml_values<17>(const unsigned char* w, int b, float (&v)[32]) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_IQ2_XS_BYTES;
    const int j = b & 7;
    for (int t = 0; t < 4; ++t) {
        const unsigned int x = (unsigned int)blk[2 + 8 * j + 2 * t] | ((unsigned int)blk[3 + 8 * j + 2 * t] << 8);
        ggml_iq2_values(ggml_iq2xs_grid[x & 511u], ggml_ksigns(x >> 9), ggml_iq2_db16(blk, 66, j, t), v + 8 * t);
    }
}

// IQ2_S, 82 bytes per 256: f16 d, qs[32] (the low 8 bits of each 8-value group's index into the
// 1024-row grid), signs[32] (a byte per group), qh[8] (two high index bits per group), then
// scales[8] (ggml_iq2_scale16).
__device__ __forceinline__ unsigned int ggml_iq2s_index(const unsigned char* blk, int g) {
    return (unsigned int)blk[2 + g] | (((unsigned int)blk[66 + g / 4] >> (2 * (g & 3))) & 3u) << 8;
}
template <>
__device__ __forceinline__ void ggml_codes<22>(const unsigned char* w, int b, int (&q)[8]) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_IQ2_S_BYTES;
    const int j = b & 7;
    const unsigned int signs = ggml_w32<2>(blk + 2 + 32 + 4 * j);
#pragma unroll
    for (int t = 0; t < 4; ++t)
        ggml_iq2_row(ggml_iq2s_grid[ggml_iq2s_index(blk, 4 * j + t)], signs >> (8 * t), q + 2 * t);
}
template <>
__device__ __forceinline__ float ggml_scale<22>(const unsigned char* w, int b, int s0, int s1, float da, float sa, const int* aq) {
    return ggml_iq2_scale16(w + (size_t)(b >> 3) * MP_GGML_IQ2_S_BYTES, 74, b & 7, s0, s1, da);
}
template <>
__device__ __forceinline__ void ggml_values<22>(const unsigned char* w, int b, float (&v)[32]) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_IQ2_S_BYTES;
    const int j = b & 7;
    for (int t = 0; t < 4; ++t)
        ggml_iq2_values(ggml_iq2s_grid[ggml_iq2s_index(blk, 4 * j + t)], blk[2 + 32 + 4 * j + t], ggml_iq2_db16(blk, 74, j, t),
                        v + 8 * t);
}

// IQ3_XXS, 98 bytes per 256: f16 d, 64 grid-index bytes (4 values each, into the 256-row grid),
// then per 32 values a u32 (four 7-bit sign indices, `ksigns`, one per 8 values, then the 4-bit
// scale ls in bits 28..31); value d * (0.5 + ls) * 0.5 * grid * sign:
// (d / 4) * (da * ((2 ls + 1) * s)).
template <>
__device__ __forceinline__ void ggml_codes<18>(const unsigned char* w, int b, int (&q)[8]) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_IQ3_XXS_BYTES;
    const int j = b & 7;
    const unsigned int aux = ggml_w32<2>(blk + 66 + 4 * j);
    const unsigned int i0 = ggml_w32<2>(blk + 2 + 8 * j), i1 = ggml_w32<2>(blk + 6 + 8 * j);
#pragma unroll
    for (int g = 0; g < 8; ++g) {
        const unsigned int idx = ((g < 4 ? i0 : i1) >> (8 * (g & 3))) & 0xFFu;
        q[g] = ggml_signed4(ggml_iq3xxs_grid[idx], ggml_ksigns(aux >> (7 * (g >> 1))) >> (4 * (g & 1)));
    }
}
template <>
__device__ __forceinline__ float ggml_scale<18>(const unsigned char* w, int b, int s0, int s1, float da, float sa, const int* aq) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_IQ3_XXS_BYTES;
    const int ls = (int)(ggml_w32<2>(blk + 66 + 4 * (b & 7)) >> 28);
    return __fmul_rn(__fmul_rn(f16_at(blk), 0.25f), __fmul_rn(da, (float)((2 * ls + 1) * (s0 + s1))));
}
template <>
__device__ __forceinline__ void ggml_values<18>(const unsigned char* w, int b, float (&v)[32]) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_IQ3_XXS_BYTES;
    const int j = b & 7;
    const unsigned int aux = (unsigned int)ggml_u32(blk + 66 + 4 * j);
    const float db = __fmul_rn(__fmul_rn(f16_at(blk), __fadd_rn(0.5f, (float)(aux >> 28))), 0.5f);
    for (int e = 0; e < 32; ++e) {
        const unsigned int g = ggml_iq3xxs_grid[blk[2 + 8 * j + e / 4]];
        const float x = __fmul_rn(db, (float)((g >> (8 * (e & 3))) & 0xFFu));
        v[e] = (ggml_ksigns(aux >> (7 * (e >> 3))) >> (e & 7)) & 1u ? -x : x;
    }
}

// IQ3_S, 110 bytes per 256: f16 d, qs[64] (the low 8 bits of each 4-value group's index into the
// 512-row grid), qh[8] (the ninth bits, one per group), signs[32] (a bit per value), scales[4]
// (a 4-bit scale ls per 32 values); value d * (1 + 2 ls) * grid * sign.
__device__ __forceinline__ unsigned int ggml_iq3s_index(const unsigned char* blk, int g) {
    return (unsigned int)blk[2 + g] | (((unsigned int)blk[66 + g / 8] >> (g & 7)) & 1u) << 8;
}
template <>
__device__ __forceinline__ void ggml_codes<21>(const unsigned char* w, int b, int (&q)[8]) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_IQ3_S_BYTES;
    const int j = b & 7;
    const unsigned int signs = ggml_w32<2>(blk + 74 + 4 * j);
#pragma unroll
    for (int g = 0; g < 8; ++g) q[g] = ggml_signed4(ggml_iq3s_grid[ggml_iq3s_index(blk, 8 * j + g)], signs >> (4 * g));
}
template <>
__device__ __forceinline__ float ggml_scale<21>(const unsigned char* w, int b, int s0, int s1, float da, float sa, const int* aq) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_IQ3_S_BYTES;
    const int j = b & 7;
    const int ls = (blk[106 + j / 2] >> (4 * (j & 1))) & 15;
    return __fmul_rn(f16_at(blk), __fmul_rn(da, (float)((1 + 2 * ls) * (s0 + s1))));
}
template <>
__device__ __forceinline__ void ggml_values<21>(const unsigned char* w, int b, float (&v)[32]) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_IQ3_S_BYTES;
    const int j = b & 7;
    const int ls = (blk[106 + j / 2] >> (4 * (j & 1))) & 15;
    const float db = __fmul_rn(f16_at(blk), (float)(1 + 2 * ls));
    for (int e = 0; e < 32; ++e) {
        const unsigned int g = ggml_iq3s_grid[ggml_iq3s_index(blk, 8 * j + e / 4)];
        const float x = __fmul_rn(db, (float)((g >> (8 * (e & 3))) & 0xFFu));
        v[e] = (blk[74 + 4 * j + e / 8] >> (e & 7)) & 1u ? -x : x;
    }
}

// IQ1: each value (d * (2 ls + 1)) * (g + delta), g in {-1, 0, 1} from the 2048-row grid, delta
// +-1/8 (IQ1S_DELTA): the codes are 8 g + sign(delta) (in -9 .. 9) and the scale carries the 1/8.
// An 8-value row's two code words: the grid bytes times 8 (per byte) plus +-1 (per byte).
__device__ __forceinline__ void ggml_iq1_row(unsigned long long g, bool neg, int* q) {
    const unsigned int dl = neg ? 0xFFFFFFFFu : 0x01010101u;
    q[0] = (int)__vadd4(((unsigned int)g << 3) & 0xF8F8F8F8u, dl);
    q[1] = (int)__vadd4(((unsigned int)(g >> 32) << 3) & 0xF8F8F8F8u, dl);
}
// The values of an 8-value IQ1 row: dl * (g + delta), gguf-py's order (converters/iq1.rs).
__device__ __forceinline__ void ggml_iq1_values(unsigned long long g, bool neg, float dl, float* v) {
    const float delta = neg ? -0.125f : 0.125f;
    for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(dl, __fadd_rn((float)(signed char)(g >> (8 * i)), delta));
}

// IQ1_S, 50 bytes per 256: f16 d, qs[32] (the low 8 bits of each 8-value group's index), then per
// 32 values a u16 qh (three high index bits per group at bits 3l, the 3-bit scale ls at bits
// 12..14, the delta's sign at bit 15): (d / 8) * (da * ((2 ls + 1) * s)).
__device__ __forceinline__ unsigned int ggml_iq1s_qh(const unsigned char* blk, int j) {
    return (unsigned int)blk[2 + 32 + 2 * j] | ((unsigned int)blk[2 + 32 + 2 * j + 1] << 8);
}
template <>
__device__ __forceinline__ void ggml_codes<19>(const unsigned char* w, int b, int (&q)[8]) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_IQ1_S_BYTES;
    const int j = b & 7;
    const unsigned int qh = ggml_iq1s_qh(blk, j);
#pragma unroll
    for (int l = 0; l < 4; ++l)
        ggml_iq1_row(ggml_iq1s_grid[blk[2 + 4 * j + l] | (((qh >> (3 * l)) & 7u) << 8)], (qh >> 15) & 1u, q + 2 * l);
}
template <>
__device__ __forceinline__ float ggml_scale<19>(const unsigned char* w, int b, int s0, int s1, float da, float sa, const int* aq) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_IQ1_S_BYTES;
    const int ls = (int)((ggml_iq1s_qh(blk, b & 7) >> 12) & 7u);
    return __fmul_rn(__fmul_rn(f16_at(blk), 0.125f), __fmul_rn(da, (float)((2 * ls + 1) * (s0 + s1))));
}
template <>
__device__ __forceinline__ void ggml_values<19>(const unsigned char* w, int b, float (&v)[32]) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_IQ1_S_BYTES;
    const int j = b & 7;
    const unsigned int qh = ggml_iq1s_qh(blk, j);
    const float dl = __fmul_rn(f16_at(blk), (float)(2 * ((qh >> 12) & 7u) + 1));
    for (int l = 0; l < 4; ++l)
        ggml_iq1_values(ggml_iq1s_grid[blk[2 + 4 * j + l] | (((qh >> (3 * l)) & 7u) << 8)], (qh >> 15) & 1u, dl, v + 8 * l);
}

// IQ1_M, 56 bytes per 256: qs[32] (the low index bits, a byte per 8-value group), qh[16] (a
// nibble per group: three high index bits, the delta's sign in bit 3), scales: four u16, each
// four 3-bit scales (one per 16 values) under a nibble of the f16 d (first word lowest):
// (d / 8) * (da * ((2 ls0 + 1) * s0 + (2 ls1 + 1) * s1)).
__device__ __forceinline__ unsigned int ggml_iq1m_sc(const unsigned char* blk, int i) {
    return (unsigned int)blk[48 + 2 * i] | ((unsigned int)blk[48 + 2 * i + 1] << 8);
}
__device__ __forceinline__ float ggml_iq1m_d(const unsigned char* blk) {
    const unsigned int bits = (ggml_iq1m_sc(blk, 0) >> 12) | ((ggml_iq1m_sc(blk, 1) >> 12) << 4) |
                              ((ggml_iq1m_sc(blk, 2) >> 12) << 8) | ((ggml_iq1m_sc(blk, 3) >> 12) << 12);
    return __half2float(__ushort_as_half((unsigned short)bits));
}
// The 3-bit scale of 16-value unit u (0..15) of the super-block.
__device__ __forceinline__ int ggml_iq1m_ls(const unsigned char* blk, int u) {
    return (int)((ggml_iq1m_sc(blk, u / 4) >> (3 * (u & 3))) & 7u);
}
// Group t's nibble of qh.
__device__ __forceinline__ unsigned int ggml_iq1m_nib(const unsigned char* blk, int t) {
    return ((unsigned int)blk[32 + t / 2] >> (4 * (t & 1))) & 15u;
}
template <>
__device__ __forceinline__ void ggml_codes<29>(const unsigned char* w, int b, int (&q)[8]) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_IQ1_M_BYTES;
    const int j = b & 7;
#pragma unroll
    for (int l = 0; l < 4; ++l) {
        const unsigned int nib = ggml_iq1m_nib(blk, 4 * j + l);
        ggml_iq1_row(ggml_iq1s_grid[blk[4 * j + l] | ((nib & 7u) << 8)], (nib >> 3) & 1u, q + 2 * l);
    }
}
template <>
__device__ __forceinline__ float ggml_scale<29>(const unsigned char* w, int b, int s0, int s1, float da, float sa, const int* aq) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_IQ1_M_BYTES;
    const int j = b & 7;
    const int t = (2 * ggml_iq1m_ls(blk, 2 * j) + 1) * s0 + (2 * ggml_iq1m_ls(blk, 2 * j + 1) + 1) * s1;
    return __fmul_rn(__fmul_rn(ggml_iq1m_d(blk), 0.125f), __fmul_rn(da, (float)t));
}
template <>
__device__ __forceinline__ void ggml_values<29>(const unsigned char* w, int b, float (&v)[32]) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_IQ1_M_BYTES;
    const int j = b & 7;
    const float d = ggml_iq1m_d(blk);
    for (int l = 0; l < 4; ++l) {
        const int t = 4 * j + l;
        const unsigned int nib = ggml_iq1m_nib(blk, t);
        const float dl = __fmul_rn(d, (float)(2 * ggml_iq1m_ls(blk, t / 2) + 1));
        ggml_iq1_values(ggml_iq1s_grid[blk[t] | ((nib & 7u) << 8)], (nib >> 3) & 1u, dl, v + 8 * l);
    }
}
