// Affine integer groups (`affine` pack layout, formats.md "Affine integer groups"): codes
// `[n, kp]` row-major (4-bit pairs, value 2i in the low nibble, or bytes), and per group of
// MP_AFFINE_GROUP values of a row a half scale s and a half offset b (4 bytes, s first);
// w = s * q + b. kp % 128 == 0. Contract and CPU twins: src/gpu/reference.rs `affine_row`,
// `affine_dequant_bf16`.

#include "common.cuh"

// ---- host-emulated: begin (tests/cuda_emu.rs compiles this module as C++) ----

// The f32 value of an integer code q < 2^23 without a conversion instruction: 2^23 + q has q in
// its low mantissa bits, and subtracting 2^23 is exact.
__device__ __forceinline__ float affine_code_f32(unsigned int q) {
    return __uint_as_float(0x4B000000u | q) - 8388608.f;
}

// y[r, j] = sum_{i < k} w[j, i] * x[r, i], w[j, i] = fmaf(s, q, b) (the product s * q is exact,
// so this is the codec's decode bit for bit). A block of T threads computes R weight rows
// j0 = R blockIdx.x ..: its threads split kp in 16-byte code chunks (128 / BITS values, thread
// t takes chunks t, t + T, ...), each activation load serving the R rows, as the BF16 GEMV
// does; block_sum_rows adds the threads' partial sums. A chunk lies in one group (16 and 32
// values divide the group of 32), so its s and b are one 4-byte load per row. T = 128 at 4
// bits (a 4096-value row is 128 chunks), 256 at 8; R = MP_AFFINE_GEMV_ROWS (4): at 8 rows and
// 256 threads the 4-bit GEMV held 128 registers (187 in its batch-4 form), two blocks (one) an
// SM, and ran at 31% of the copy ceiling (6% at m = 4), each block's long decode after its one
// load round overlapping little (BENCHMARKS.md, "The affine layout").
template <int M, int R, int BITS, int T>
__device__ __forceinline__ void gemv_affine(const float* __restrict__ x, int m, const unsigned char* __restrict__ codes,
                                            const unsigned char* __restrict__ sb, float* __restrict__ y, int n, int k,
                                            int kp, int ldy) {
    constexpr int PER = 128 / BITS;  // values per 16-byte chunk
    constexpr int VPW = 32 / BITS;   // values per 32-bit word
    constexpr unsigned int MASK = (1u << BITS) - 1u;
    const int j0 = blockIdx.x * R, chunks = kp / PER;
    const size_t row_bytes = (size_t)kp * BITS / 8, row_groups = (size_t)kp / MP_AFFINE_GROUP;
    // Whole chunks of x are read with 16-byte loads when every row starts 16-byte aligned.
    const bool vec = (k & 3) == 0;
    float acc[M][R];
#pragma unroll
    for (int r = 0; r < M; ++r)
#pragma unroll
        for (int q = 0; q < R; ++q) acc[r][q] = 0.f;
    int rows[R];
#pragma unroll
    for (int q = 0; q < R; ++q) rows[q] = min(j0 + q, n - 1);  // rows past n: never stored
    for (int c = threadIdx.x; c < chunks; c += T) {
        uint4 v[R];
        unsigned int p[R];
#pragma unroll
        for (int q = 0; q < R; ++q) {
            v[q] = ldg_stream(codes + rows[q] * row_bytes + 16 * (size_t)c);
            p[q] = __ldg(reinterpret_cast<const unsigned int*>(sb + 4 * (rows[q] * row_groups + (size_t)c * PER / MP_AFFINE_GROUP)));
        }
        const int i0 = PER * c;
        const bool whole = vec && i0 + PER <= k;
#pragma unroll
        for (int wd = 0; wd < 4; ++wd) {
            const int iw = i0 + VPW * wd;
            float xv[M][VPW];
#pragma unroll
            for (int r = 0; r < M; ++r) {
                if (r >= m) break;
                const float* xr = x + (size_t)r * k + iw;
                if (whole) {
#pragma unroll
                    for (int e = 0; e < VPW; e += 4) {
                        const float4 a = __ldg(reinterpret_cast<const float4*>(xr + e));
                        xv[r][e] = a.x;
                        xv[r][e + 1] = a.y;
                        xv[r][e + 2] = a.z;
                        xv[r][e + 3] = a.w;
                    }
                } else {
#pragma unroll
                    for (int e = 0; e < VPW; ++e) xv[r][e] = iw + e < k ? xr[e] : 0.f;
                }
            }
#pragma unroll
            for (int q = 0; q < R; ++q) {
                const unsigned int word = wd == 0 ? v[q].x : wd == 1 ? v[q].y : wd == 2 ? v[q].z : v[q].w;
                const float s = __half2float(__ushort_as_half((unsigned short)(p[q] & 0xffffu)));
                const float b = __half2float(__ushort_as_half((unsigned short)(p[q] >> 16)));
#pragma unroll
                for (int e = 0; e < VPW; ++e) {
                    const float w = fmaf(s, affine_code_f32((word >> (BITS * e)) & MASK), b);
#pragma unroll
                    for (int r = 0; r < M; ++r) {
                        if (r >= m) break;
                        acc[r][q] = fmaf(w, xv[r][e], acc[r][q]);
                    }
                }
            }
        }
    }
    block_sum_rows<M, R, T / 32>(acc, m, y, j0, n, ldy);
}

// Decode, one row; 4-bit codes. Grid ceil(n / MP_AFFINE_GEMV_ROWS), block MP_AFFINE4_THREADS.
extern "C" __global__ void affine4_gemv(const float* x, int m, const unsigned char* codes, const unsigned char* sb,
                                        float* y, int n, int k, int kp, int ldy) {
    gemv_affine<1, MP_AFFINE_GEMV_ROWS, 4, MP_AFFINE4_THREADS>(x, m, codes, sb, y, n, k, kp, ldy);
}

// m <= 4; 4-bit codes.
extern "C" __global__ void affine4_gemv_batch4(const float* x, int m, const unsigned char* codes,
                                               const unsigned char* sb, float* y, int n, int k, int kp, int ldy) {
    gemv_affine<4, MP_AFFINE_GEMV_ROWS, 4, MP_AFFINE4_THREADS>(x, m, codes, sb, y, n, k, kp, ldy);
}

// Decode, one row; 8-bit codes. Block MP_AFFINE8_THREADS.
extern "C" __global__ void affine8_gemv(const float* x, int m, const unsigned char* codes, const unsigned char* sb,
                                        float* y, int n, int k, int kp, int ldy) {
    gemv_affine<1, MP_AFFINE_GEMV_ROWS, 8, MP_AFFINE8_THREADS>(x, m, codes, sb, y, n, k, kp, ldy);
}

// m <= 4; 8-bit codes.
extern "C" __global__ void affine8_gemv_batch4(const float* x, int m, const unsigned char* codes,
                                               const unsigned char* sb, float* y, int n, int k, int kp, int ldy) {
    gemv_affine<4, MP_AFFINE_GEMV_ROWS, 8, MP_AFFINE8_THREADS>(x, m, codes, sb, y, n, k, kp, ldy);
}

// BF16 `[n, kp]`, each bf16_rn(fmaf(s, q, b)): the prefill's weights for the BF16 GEMM. One
// thread per 16-byte code chunk (32 values at 4 bits, 16 at 8; one group's s and b), written
// as 16-byte stores: one byte a thread and two-byte stores ran at a fifth of the copy ceiling.
// Grid ceil(n * kp * bits / 8 / 16 / 256), block 256.
extern "C" __global__ void affine_dequant_bf16(const unsigned char* __restrict__ codes,
                                               const unsigned char* __restrict__ sb, int n, int kp, int bits,
                                               __nv_bfloat16* __restrict__ out) {
    const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long chunks = (long long)n * kp * bits / 128;
    if (id >= chunks) return;
    const int per = 128 / bits;               // values per chunk
    const long long i0 = id * per;            // its first value: row * kp + column
    const long long g = i0 / MP_AFFINE_GROUP;  // its group (row-major over [n, kp / group])
    const unsigned int pair = __ldg(reinterpret_cast<const unsigned int*>(sb) + g);
    const float s = __half2float(__ushort_as_half((unsigned short)(pair & 0xffffu)));
    const float b = __half2float(__ushort_as_half((unsigned short)(pair >> 16)));
    const uint4 c = __ldg(reinterpret_cast<const uint4*>(codes) + id);
    const unsigned int words[4] = {c.x, c.y, c.z, c.w};
    uint4* o = reinterpret_cast<uint4*>(out + i0);
    for (int q = 0; q < per / 8; ++q) {  // 8 values (one 16-byte store) at a time
        unsigned int packed[4];
        for (int e = 0; e < 4; ++e) {
            const int v = 8 * q + 2 * e;  // values v and v + 1 of the chunk
            const int vpw = 32 / bits;
            const unsigned int mask = (1u << bits) - 1u;
            const unsigned int q0 = (words[v / vpw] >> (bits * (v % vpw))) & mask;
            const unsigned int q1 = (words[(v + 1) / vpw] >> (bits * ((v + 1) % vpw))) & mask;
            packed[e] = pack2_bf16(fmaf(s, affine_code_f32(q0), b), fmaf(s, affine_code_f32(q1), b));
        }
        o[q] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    }
}

// ---- host-emulated: end ----
