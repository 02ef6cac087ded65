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
// IQ4_NL: d * kvalues[q]; IQ4_XS: (d * (ls - 32)) * kvalues[q]; MXFP4: 2^(e - 128) * kvalues[q]:
// the 16 index bytes at qs through the table TAB (byte permutes, as the GEMV's codes).
template <int TAB>
__device__ __forceinline__ void ggml_table_values(const unsigned char* qs, float scale, float (&v)[32]) {
    for (int i = 0; i < 4; ++i) {
        const unsigned int x = (unsigned int)ggml_u32(qs + 4 * i);
        int l, h;
        ggml_table8<TAB>(x, l, h);
        const unsigned int lo = (unsigned int)l, hi = (unsigned int)h;
        for (int c = 0; c < 4; ++c) {
            v[4 * i + c] = __fmul_rn(scale, (float)(signed char)(lo >> (8 * c)));
            v[16 + 4 * i + c] = __fmul_rn(scale, (float)(signed char)(hi >> (8 * c)));
        }
    }
}
template <>
__device__ __forceinline__ void ggml_values<20>(const unsigned char* w, int b, float (&v)[32]) {
    const unsigned char* blk = w + (size_t)b * MP_GGML_IQ4_NL_BYTES;
    ggml_table_values<GGML_TAB_IQ4NL>(blk + 2, f16_at(blk), v);
}
template <>
__device__ __forceinline__ void ggml_values<23>(const unsigned char* w, int b, float (&v)[32]) {
    const unsigned char* blk = w + (size_t)(b >> 3) * MP_GGML_IQ4_XS_BYTES;
    const int j = b & 7;
    const unsigned int sh = (unsigned int)blk[2] | ((unsigned int)blk[3] << 8);
    const int ls = (int)(((blk[4 + j / 2] >> (4 * (j & 1))) & 15u) | (((sh >> (2 * j)) & 3u) << 4)) - 32;
    ggml_table_values<GGML_TAB_IQ4NL>(blk + 8 + 16 * j, __fmul_rn(f16_at(blk), (float)ls), v);
}
template <>
__device__ __forceinline__ void ggml_values<39>(const unsigned char* w, int b, float (&v)[32]) {
    const unsigned char* blk = w + (size_t)b * MP_GGML_MXFP4_BYTES;
    ggml_table_values<GGML_TAB_MXFP4>(blk + 1, ggml_e8m0_half(blk[0]), v);
}

template <>
__device__ __forceinline__ void ggml_values<40>(const unsigned char* w, int b, float (&v)[32]) {
    const unsigned char* blk = w + (size_t)(b >> 1) * MP_GGML_NVFP4_BYTES;
    for (int l = 0; l < 32; ++l) {
        const int k = 2 * (b & 1) + (l >> 4), e = l & 15;
        const int q = (blk[4 + 8 * k + (e & 7)] >> (e < 8 ? 0 : 4)) & 15;
        v[l] = __fmul_rn(ggml_ue4m3_half(blk[k]), (float)(signed char)(ggml_table_word<GGML_TAB_MXFP4>(q >> 2) >> (8 * (q & 3))));
    }
}

// NF4: NF4[q] * absmax, the f32 table's bits (converters/bnb.rs `NF4`, bitsandbytes' own), read
// from a launch block's copy in shared memory that ggml_dequant_rows<128> fills first: the 16
// values lie in 16 banks, so a warp's reads never conflict, where a constant-memory read at a
// different index per lane is serialized (213 us for the llama-8B down shape on an H100,
// against 60 for IQ4_NL; session 34).
__shared__ float ggml_nf4_smem[16];
__constant__ unsigned int GGML_NF4_BITS[16] = {0xbf800000u, 0xbf3239b1u, 0xbf066b30u, 0xbeca32a0u,
                                               0xbe91a24du, 0xbe3d353fu, 0xbdba7871u, 0x00000000u,
                                               0x3da2faffu, 0x3e24cae3u, 0x3e7c04ddu, 0x3ead033au,
                                               0x3ee1a4b8u, 0x3f1007abu, 0x3f3913b3u, 0x3f800000u};
template <>
__device__ __forceinline__ void ggml_values<128>(const unsigned char* w, int b, float (&v)[32]) {
    const unsigned char* blk = w + (size_t)(b >> 1) * MP_GGML_NF4_BYTES;
    const float am = __uint_as_float((unsigned int)ggml_u32(blk));
    const unsigned char* qs = blk + 4 + 16 * (b & 1);
    for (int l = 0; l < 32; ++l) {
        const int q = (qs[l & 15] >> (4 * (l >> 4))) & 15;
        v[l] = __fmul_rn(ggml_nf4_smem[q], am);
    }
}

// Thread t of the launch's block takes 32-value block id = blockIdx.x * 256 + t of the weight
// (row id / nb, block id % nb), its values to BF16 in `tile` (256 x 64 bytes of shared
// memory); then the launch's block writes its blocks' outputs, which lie one after another in
// `out`, as 16-byte words, a word per thread at a time (coalesced).
template <int TY>
__device__ __forceinline__ void ggml_dequant_rows(const unsigned char* __restrict__ w, float sc, int n, int kp,
                                                  uint4* __restrict__ out, uint4* tile) {
    const size_t row_bytes = ggml_row_bytes<TY>(kp);
    const long long id0 = (long long)blockIdx.x * blockDim.x, id = id0 + threadIdx.x;
    const int nb = kp / MP_GGML_QK;
    const long long blocks = (long long)n * nb;
    if constexpr (TY == 128) {
        if (threadIdx.x < 16) ggml_nf4_smem[threadIdx.x] = __uint_as_float(GGML_NF4_BITS[threadIdx.x]);
        __syncthreads();
    }
    if (id < blocks) {
        const int j = (int)(id / nb), b = (int)(id % nb);
        float v[32];
        ggml_values<TY>(w + (size_t)j * row_bytes, b, v);
        for (int l = 0; l < 32; ++l) v[l] = __fmul_rn(v[l], sc);
        for (int c = 0; c < 4; ++c)
            tile[4 * threadIdx.x + c] = make_uint4(pack2_bf16(v[8 * c], v[8 * c + 1]), pack2_bf16(v[8 * c + 2], v[8 * c + 3]),
                                                   pack2_bf16(v[8 * c + 4], v[8 * c + 5]), pack2_bf16(v[8 * c + 6], v[8 * c + 7]));
    }
    __syncthreads();
    for (int c = 0; c < 4; ++c) {
        const int at = threadIdx.x + (int)blockDim.x * c;  // word `at` of this launch block's outputs
        if (id0 + at / 4 < blocks) out[(size_t)id0 * 4 + at] = tile[at];
    }
}

// The prefill's dequantization: `w` (n rows of kp values of type `ty`) to BF16 [n, kp], each
// value gguf-py's decode times the output scale `sc`, rounded to nearest even; `out` 16-byte
// aligned. One thread per 32-value
// block of a row. Grid ceil(n * kp / 32 / 256), block 256.
extern "C" __global__ void ggml_dequant_bf16(const unsigned char* w, int ty, float sc, int n, int kp, unsigned short* out) {
    __shared__ uint4 tile[256 * 4];
    uint4* o = reinterpret_cast<uint4*>(out);
    switch (ty) {
#define GGML_DEQUANT_CASE(TY) \
    case TY: ggml_dequant_rows<TY>(w, sc, n, kp, o, tile); break;
        GGML_ENGINE_TYPES(GGML_DEQUANT_CASE)
#undef GGML_DEQUANT_CASE
        default: break;
    }
}
