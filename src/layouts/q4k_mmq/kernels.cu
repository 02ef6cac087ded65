// The Q4_K MMQ prefill arm, the q4k_mmq decode GEMVs and finalize_q4k_load's GPU encoders. Numerics contract and CPU
// twins: converters/q4_k.rs + converters/kquant.rs (the Q4_K encoder, ggml's
// quantize_row_q4_K_ref), converters/layouts/q4k_mmq.rs (int8 rows), src/gpu/reference.rs
// (`q4k_mmq_row`, `requant_row_bf16_int8`, `int8_row`).
//
// tests/cuda_emu.rs compiles this whole module as C++ on the host (no device-only intrinsics
// beyond those it stands in for) and checks it against the CPU twins.
//
// The encoders must give the converter's bytes exactly: every float operation below is one
// IEEE operation in ggml's order (__fadd_rn, __fmul_rn, __fdiv_rn, __fsqrt_rn), so NVRTC cannot
// contract them into fused multiply-adds that ggml's x86 build does not have.

#include "common.cuh"

// Element i (< k) of row j of an `nvfp4` weight as f32: (E2M1 * e4m3(scale)) * g, as the
// converter's decode_padded computes it; 0 beyond k.
__device__ __forceinline__ float nvfp4_at(const unsigned char* codes, const unsigned char* scales, float g, int kp_nv,
                                          int j, int i, int k) {
    if (i >= k) return 0.f;
    const unsigned int c = (codes[(size_t)j * (kp_nv / 2) + i / 2] >> (4 * (i & 1))) & 0xfu;
    return __fmul_rn(__fmul_rn(E2M1_VALUES[c], e4m3_to_f32(scales[(size_t)j * (kp_nv / 16) + i / 16])), g);
}

__device__ __forceinline__ int nearest_int_q(float f) {
    const float val = __fadd_rn(f, 12582912.0f);
    return (__float_as_int(val) & 0x007fffff) - 0x00400000;
}

__device__ __forceinline__ int clamp_q(int v, int hi) { return v < 0 ? 0 : (v > hi ? hi : v); }

// ggml make_qkx2_quants(32, nmax 15, rmin -1, rdelta 0.1, nstep 20, use_mad false).
__device__ void make_qkx2_32(const float* x, const float* w, unsigned char* l, unsigned char* laux, float* scale_out,
                             float* min_out) {
    const int n = 32, nmax = 15, nstep = 20;
    const float rmin = -1.0f, rdelta = 0.1f;
    float mn = x[0], mx = x[0];
    float sum_w = w[0];
    float sum_x = __fmul_rn(sum_w, x[0]);
    for (int i = 1; i < n; ++i) {
        if (x[i] < mn) mn = x[i];
        if (x[i] > mx) mx = x[i];
        sum_w = __fadd_rn(sum_w, w[i]);
        sum_x = __fadd_rn(sum_x, __fmul_rn(w[i], x[i]));
    }
    if (mn > 0.f) mn = 0.f;
    if (mx == mn) {
        for (int i = 0; i < n; ++i) l[i] = 0;
        *scale_out = 0.f;
        *min_out = -mn;
        return;
    }
    float iscale = __fdiv_rn((float)nmax, __fadd_rn(mx, -mn));
    float scale = __fdiv_rn(1.0f, iscale);
    float best_mad = 0.f;
    for (int i = 0; i < n; ++i) {
        const int q = clamp_q(nearest_int_q(__fmul_rn(iscale, __fadd_rn(x[i], -mn))), nmax);
        l[i] = (unsigned char)q;
        const float diff = __fadd_rn(__fadd_rn(__fmul_rn(scale, (float)q), mn), -x[i]);
        best_mad = __fadd_rn(best_mad, __fmul_rn(w[i], __fmul_rn(diff, diff)));
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = __fdiv_rn(__fadd_rn(__fadd_rn(rmin, __fmul_rn(rdelta, (float)is)), (float)nmax), __fadd_rn(mx, -mn));
        float sum_l = 0.f, sum_l2 = 0.f, sum_xl = 0.f;
        for (int i = 0; i < n; ++i) {
            const int q = clamp_q(nearest_int_q(__fmul_rn(iscale, __fadd_rn(x[i], -mn))), nmax);
            laux[i] = (unsigned char)q;
            const float lf = (float)q;
            sum_l = __fadd_rn(sum_l, __fmul_rn(w[i], lf));
            sum_l2 = __fadd_rn(sum_l2, __fmul_rn(__fmul_rn(w[i], lf), lf));
            sum_xl = __fadd_rn(sum_xl, __fmul_rn(__fmul_rn(w[i], lf), x[i]));
        }
        const float d = __fadd_rn(__fmul_rn(sum_w, sum_l2), -__fmul_rn(sum_l, sum_l));
        if (d > 0.f) {
            float this_scale = __fdiv_rn(__fadd_rn(__fmul_rn(sum_w, sum_xl), -__fmul_rn(sum_x, sum_l)), d);
            float this_min = __fdiv_rn(__fadd_rn(__fmul_rn(sum_l2, sum_x), -__fmul_rn(sum_l, sum_xl)), d);
            if (this_min > 0.f) {
                this_min = 0.f;
                this_scale = __fdiv_rn(sum_xl, sum_l2);
            }
            float mad = 0.f;
            for (int i = 0; i < n; ++i) {
                const float diff = __fadd_rn(__fadd_rn(__fmul_rn(this_scale, (float)laux[i]), this_min), -x[i]);
                mad = __fadd_rn(mad, __fmul_rn(w[i], __fmul_rn(diff, diff)));
            }
            if (mad < best_mad) {
                for (int i = 0; i < n; ++i) l[i] = laux[i];
                best_mad = mad;
                scale = this_scale;
                mn = this_min;
            }
        }
    }
    *scale_out = scale;
    *min_out = -mn;
}

__device__ __forceinline__ void scale_min_k4(int j, const unsigned char* q, int* sc, int* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// finalize_q4k_load's encoder: an `nvfp4` weight [n, k] -> Q4_K rows (kp_q / 256 blocks of 144
// bytes per row), quantize_row_q4_K_ref on each 256-value super-block. One thread per super-block.
// Grid ceil(n * kp_q / 256 / 64), block 64.
extern "C" __global__ void nvfp4_to_q4k(const unsigned char* __restrict__ codes, const unsigned char* __restrict__ scales,
                                        float g, int n, int k, int kp_nv, int kp_q, unsigned char* __restrict__ out) {
    const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int nsb = kp_q / 256;
    if (id >= (long long)n * nsb) return;
    const int j = (int)(id / nsb), sb = (int)(id % nsb);
    float x[256];
    for (int e = 0; e < 256; ++e) x[e] = nvfp4_at(codes, scales, g, kp_nv, j, sb * 256 + e, k);
    unsigned char l[256], laux[32];
    float wts[32], mins[8], scs[8];
    float max_scale = 0.f, max_min = 0.f;
    for (int b = 0; b < 8; ++b) {
        const float* xs = x + 32 * b;
        float sum_x2 = 0.f;
        for (int i = 0; i < 32; ++i) sum_x2 = __fadd_rn(sum_x2, __fmul_rn(xs[i], xs[i]));
        const float av_x = __fsqrt_rn(__fdiv_rn(sum_x2, 32.0f));
        for (int i = 0; i < 32; ++i) wts[i] = __fadd_rn(av_x, fabsf(xs[i]));
        make_qkx2_32(xs, wts, l + 32 * b, laux, &scs[b], &mins[b]);
        if (scs[b] > max_scale) max_scale = scs[b];
        if (mins[b] > max_min) max_min = mins[b];
    }
    const float inv_scale = max_scale > 0.f ? __fdiv_rn(63.0f, max_scale) : 0.f;
    const float inv_min = max_min > 0.f ? __fdiv_rn(63.0f, max_min) : 0.f;
    unsigned char sc12[12];
    for (int i = 0; i < 12; ++i) sc12[i] = 0;
    for (int b = 0; b < 8; ++b) {
        const int ls = min((int)(unsigned char)nearest_int_q(__fmul_rn(inv_scale, scs[b])), 63);
        const int lm = min((int)(unsigned char)nearest_int_q(__fmul_rn(inv_min, mins[b])), 63);
        if (b < 4) {
            sc12[b] = (unsigned char)ls;
            sc12[b + 4] = (unsigned char)lm;
        } else {
            sc12[b + 4] = (unsigned char)((ls & 0xF) | ((lm & 0xF) << 4));
            sc12[b - 4] |= (unsigned char)((ls >> 4) << 6);
            sc12[b] |= (unsigned char)((lm >> 4) << 6);
        }
    }
    const __half hd = __float2half_rn(__fdiv_rn(max_scale, 63.0f));
    const __half hm = __float2half_rn(__fdiv_rn(max_min, 63.0f));
    const float df = __half2float(hd), dminf = __half2float(hm);
    for (int b = 0; b < 8; ++b) {
        int sc, m;
        scale_min_k4(b, sc12, &sc, &m);
        const float d = __fmul_rn(df, (float)sc);
        if (d == 0.f) continue;
        const float dm = __fmul_rn(dminf, (float)m);
        for (int i = 0; i < 32; ++i)
            l[32 * b + i] = (unsigned char)min(max(nearest_int_q(__fdiv_rn(__fadd_rn(x[32 * b + i], dm), d)), 0), 15);
    }
    unsigned char* blk = out + ((size_t)j * nsb + sb) * MP_Q4K_BYTES;
    const unsigned short ud = __half_as_ushort(hd), um = __half_as_ushort(hm);
    blk[0] = ud & 0xff;
    blk[1] = ud >> 8;
    blk[2] = um & 0xff;
    blk[3] = um >> 8;
    for (int i = 0; i < 12; ++i) blk[4 + i] = sc12[i];
    for (int c = 0; c < 4; ++c)
        for (int i = 0; i < 32; ++i) blk[16 + 32 * c + i] = (unsigned char)(l[64 * c + i] | (l[64 * c + 32 + i] << 4));
}

// finalize_q4k_load's int8 down: per row d = amax / 127, q = roundf(x * (1/d)), codes [n, kp_q]
// (zero beyond k), f32 scales [n]. One block per row. Grid n, block 256.
extern "C" __global__ void nvfp4_to_int8_rows(const unsigned char* __restrict__ codes, const unsigned char* __restrict__ scales,
                                              float g, int n, int k, int kp_nv, int kp_q, unsigned char* __restrict__ qc,
                                              float* __restrict__ qs) {
    const int j = blockIdx.x;
    if (j >= n) return;
    float amax = 0.f;
    for (int i = threadIdx.x; i < k; i += blockDim.x) amax = fmaxf(amax, fabsf(nvfp4_at(codes, scales, g, kp_nv, j, i, k)));
    amax = block_amax(amax);
    const float d = __fdiv_rn(amax, 127.0f);
    const float id = d != 0.f ? __fdiv_rn(1.0f, d) : 0.f;
    if (threadIdx.x == 0) qs[j] = d;
    for (int i = threadIdx.x; i < kp_q; i += blockDim.x) {
        const float v = nvfp4_at(codes, scales, g, kp_nv, j, i, k);
        qc[(size_t)j * kp_q + i] = (unsigned char)(signed char)(int)roundf(__fmul_rn(v, id));
    }
}

// The Q4_K MMQ GEMM over q8_1 activation blocks (quantize_act_q8_1, module ffn_q8_1):
// y[r, j] = sum_superblocks sum_sub (d*sc * dx * sum_l q * xq - dmin*m * sx), on the int8 MMQ
// tile of common.cuh. A 128-value stage is half a super-block: its 64 bytes of `qs` hold the
// low nibbles of sub-blocks 2p (p = 0, 1) and the high nibbles of 2p+1.
// Grid (ceil(n / 128), ceil(m / 64)), block 128.
struct Q4kStage {
    // Per thread: 4 x 16 bytes of `qs` and the head of row n0 + threadIdx.x.
    struct Regs {
        uint4 qs[4];
        uint4 head;
    };
    static __device__ __forceinline__ void fetch(const unsigned char* __restrict__ w, int n, int kp, int n0, int k0, Regs& r) {
        const int nsb = kp / 256, sb = k0 / 256, half = (k0 / 128) & 1, tid = threadIdx.x;
        const uint4 zero = {0u, 0u, 0u, 0u};
#pragma unroll
        for (int v = 0; v < 4; ++v) {
            const int row = (tid >> 2) + 32 * v, part = tid & 3, gn = n0 + row;
            r.qs[v] = gn < n ? __ldg(reinterpret_cast<const uint4*>(w + ((size_t)gn * nsb + sb) * MP_Q4K_BYTES + 16 + 64 * half + 16 * part)) : zero;
        }
        const int gn = n0 + tid;
        r.head = gn < n ? __ldg(reinterpret_cast<const uint4*>(w + ((size_t)gn * nsb + sb) * MP_Q4K_BYTES)) : zero;
    }
    static __device__ __forceinline__ void store(const Regs& r, int k0, MmqTile& t) {
        const int half = (k0 / 128) & 1, tid = threadIdx.x;
        const unsigned int lo4 = 0x0F0F0F0Fu;
#pragma unroll
        for (int v = 0; v < 4; ++v) {
            const int row = (tid >> 2) + 32 * v, part = tid & 3, at = 64 * (part >> 1) + 16 * (part & 1);
            const uint4 q = r.qs[v];
            const uint4 lo = {q.x & lo4, q.y & lo4, q.z & lo4, q.w & lo4};
            const uint4 hi = {(q.x >> 4) & lo4, (q.y >> 4) & lo4, (q.z >> 4) & lo4, (q.w >> 4) & lo4};
            *reinterpret_cast<uint4*>(&t.b[row][at]) = lo;
            *reinterpret_cast<uint4*>(&t.b[row][at + 32]) = hi;
        }
        // A zero head (rows past n) gives wa = wb = 0.
        const float d = __half2float(__ushort_as_half((unsigned short)(r.head.x & 0xffffu)));
        const float dmin = __half2float(__ushort_as_half((unsigned short)(r.head.x >> 16)));
#pragma unroll
        for (int c = 0; c < MMQ_CHUNKS; ++c) {
            int sc, mm;
            if (half == 0)
                scale_min_k4_head(c, r.head, &sc, &mm);
            else
                scale_min_k4_head(4 + c, r.head, &sc, &mm);
            t.wa[tid][c] = d * (float)sc;
            t.wb[tid][c] = dmin * (float)mm;
        }
    }
};

extern "C" __global__ void __launch_bounds__(128) q4k_mmq_gemm(const unsigned char* __restrict__ xq, int m, const unsigned char* __restrict__ w,
                                                               float* __restrict__ y, int n, int kp, int ldy) {
    mmq_q8_1_gemm<Q4kStage>(xq, m, w, y, n, kp, ldy);
}

// The int8 down GEMM's activation requantization: per row a = bf16_rn(x), d = amax(a) / 127,
// q = roundf(a * (1/d)); codes [m, kp] (zero beyond k), f32 scales [m]. Grid m, block 256.
extern "C" __global__ void requant_a_bf16_int8(const float* __restrict__ x, int m, int k, int kp,
                                               unsigned char* __restrict__ qc, float* __restrict__ qs) {
    const int r = blockIdx.x;
    if (r >= m) return;
    const float* xr = x + (size_t)r * k;
    float amax = 0.f;
    for (int i = threadIdx.x; i < k; i += blockDim.x) amax = fmaxf(amax, fabsf(__bfloat162float(__float2bfloat16_rn(xr[i]))));
    amax = block_amax(amax);
    const float d = __fdiv_rn(amax, 127.0f);
    const float id = d != 0.f ? __fdiv_rn(1.0f, d) : 0.f;
    if (threadIdx.x == 0) qs[r] = d;
    for (int i = threadIdx.x; i < kp; i += blockDim.x) {
        const float a = i < k ? __bfloat162float(__float2bfloat16_rn(xr[i])) : 0.f;
        qc[(size_t)r * kp + i] = (unsigned char)(signed char)(int)roundf(__fmul_rn(a, id));
    }
}

// The int8 down GEMM: y[r, j] = ((float)sum_i a[r, i] * w[j, i]) * sa[r] * sw[j], the integer
// sum exact (int8 tensor-core MMAs into s32), on the MMQ tile of common.cuh. aq [m, kp],
// wq [n, kp], kp % 128 == 0. Grid (ceil(n / 128), ceil(m / 64)), block 128.
extern "C" __global__ void __launch_bounds__(128) q4k_mmq_int8_down_gemm(const unsigned char* __restrict__ aq, const float* __restrict__ sa, int m,
                                                                   const unsigned char* __restrict__ wq, const float* __restrict__ sw,
                                                                   float* __restrict__ y, int n, int kp, int ldy) {
    __shared__ __align__(16) MmqTile t;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm0 = (warp >> 1) * 32, wn0 = (warp & 1) * 64;
    const int n0 = blockIdx.x * MMQ_BN, m0 = blockIdx.y * MMQ_BM;
    int acc[2][8][4];
    mmq_zero(acc);
    const uint4 zero = {0u, 0u, 0u, 0u};
    // One stage in registers while the previous one computes: A 64 rows x 8 x 16 bytes (4 per
    // thread), B 128 rows x 8 x 16 bytes (8 per thread).
    uint4 ra[4], rb[8];
    auto fetch = [&](int k0) {
#pragma unroll
        for (int v = 0; v < 4; ++v) {
            const int row = (tid >> 3) + 16 * v, gr = m0 + row;
            ra[v] = gr < m ? __ldg(reinterpret_cast<const uint4*>(aq + (size_t)gr * kp + k0 + 16 * (tid & 7))) : zero;
        }
#pragma unroll
        for (int v = 0; v < 8; ++v) {
            const int row = (tid >> 3) + 16 * v, gn = n0 + row;
            rb[v] = gn < n ? __ldg(reinterpret_cast<const uint4*>(wq + (size_t)gn * kp + k0 + 16 * (tid & 7))) : zero;
        }
    };
    fetch(0);
    for (int k0 = 0; k0 < kp; k0 += MMQ_BK) {
#pragma unroll
        for (int v = 0; v < 4; ++v) *reinterpret_cast<uint4*>(&t.a[(tid >> 3) + 16 * v][16 * (tid & 7)]) = ra[v];
#pragma unroll
        for (int v = 0; v < 8; ++v) *reinterpret_cast<uint4*>(&t.b[(tid >> 3) + 16 * v][16 * (tid & 7)]) = rb[v];
        __syncthreads();
        if (k0 + MMQ_BK < kp) fetch(k0 + MMQ_BK);
#pragma unroll
        for (int c = 0; c < MMQ_CHUNKS; ++c) mmq_mma_k32(t, c * 32, wm0, wn0, lane, acc);
        __syncthreads();
    }
    mmq_write_y(acc, m0 + wm0, n0 + wn0, lane, m, n, y, ldy,
                [&](int r, int c, int v) { return __fmul_rn(__fmul_rn((float)v, sa[r]), sw[c]); });
}

// ---- Decode GEMVs over the q4k_mmq bytes themselves (f32 activations) ----
//
// The `q4k_mmq` layout serves decode with no second layout: gate and up (and down with
// `--q4k-down q4k`) through `q4k_gemv`, the int8 down rows through `int8_rows_gemv`, each
// reading the pack's bytes as they are. CPU twins: src/gpu/reference.rs `q4k_row`,
// `int8_rows_row` (f64). M activation rows (m <= M) share each weight load.

// Load 4 consecutive f32 of activation row r at column e (0 beyond k): one 16-byte load when the
// row is 16-byte aligned and all 4 are in range, else one by one (the same values either way).
__device__ __forceinline__ float4 x4_at(const float* __restrict__ x, int r, int k, int e) {
    const float* p = x + (size_t)r * k + e;
    if ((k & 3) == 0 && e + 4 <= k) return __ldg(reinterpret_cast<const float4*>(p));
    float4 v;
    v.x = e < k ? p[0] : 0.f;
    v.y = e + 1 < k ? p[1] : 0.f;
    v.z = e + 2 < k ? p[2] : 0.f;
    v.w = e + 3 < k ? p[3] : 0.f;
    return v;
}

// Byte b of `w` (0..255) as an exact f32: the byte placed in the mantissa of 2^23 (one PRMT)
// and 2^23 subtracted (one FADD), in place of a quarter-rate I2F.
template <int B>
__device__ __forceinline__ float byte_f32(unsigned int w) {
    return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u | B)) - 8388608.0f;
}

// Byte b of `w` read as an int8 offset by 128 (the code XOR 0x80) back to the code as an exact
// f32: the same PRMT, and 2^23 + 128 subtracted.
template <int B>
__device__ __forceinline__ float i8_f32(unsigned int w) {
    return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u | B)) - 8388736.0f;
}

// sum over the 4 bytes b of `w` of byte_b * x.{b}: bytes 0..15 (nibbles) or 0..255.
__device__ __forceinline__ float dot4(unsigned int w, float4 x) {
    return byte_f32<0>(w) * x.x + byte_f32<1>(w) * x.y + byte_f32<2>(w) * x.z + byte_f32<3>(w) * x.w;
}

__device__ __forceinline__ float sum4(float4 x) { return (x.x + x.y) + (x.z + x.w); }

// y[r, j] = sum over super-blocks and sub-blocks s of (d * sc_s) * sum_l q * x - (dmin * m_s) *
// sum_l x. One warp per R consecutive output rows, so that each activation load serves R rows;
// each lane takes 32 weights of a row per load (a 16-byte load: a warp reads 4 super-blocks'
// 512 code bytes of a row at once), so that decoding a super-block's head (d, dmin, the 6-bit
// scales and mins) is paid once per 32 weights, and the codes become f32 by PRMT and FADD. The
// first version (4 bytes a lane, one row a warp, I2F) issued ~10 instructions per weight and
// ran at 13% of DRAM bandwidth, compute-bound (Nsight Compute, 2026-12-02).
// Lane t: super-block s0 + t / 8 of the group of 4, code bytes qs[32p + l0 .. +16) with
// p = (t % 8) / 2, l0 = 16 (t % 2): their low nibbles are elements l0 .. l0+16 of sub-block 2p,
// their high nibbles the same of sub-block 2p+1 (ggml's Q4_K: pair p holds qs[32p .. 32p+32)).
// Grid ceil(n / (8 R)), block 256.
template <int M, int R>
__device__ __forceinline__ void q4k_gemv_rows(const float* __restrict__ x, int m, const unsigned char* __restrict__ w,
                                              float* __restrict__ y, int n, int k, int kp, int ldy) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int j0 = (blockIdx.x * (blockDim.x >> 5) + warp) * R;
    if (j0 >= n) return;
    const int nsb = kp / 256, g = lane >> 3, p = (lane & 7) >> 1, l0 = 16 * (lane & 1);
    float acc[R][M];
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
        for (int r = 0; r < M; ++r) acc[i][r] = 0.f;
    const uint4 zero = {0u, 0u, 0u, 0u};
    for (int s0 = 0; s0 < nsb; s0 += 4) {
        const int sb = s0 + g;
        uint4 qv[R], hd[R];
#pragma unroll
        for (int i = 0; i < R; ++i) {
            const bool in = sb < nsb && j0 + i < n;
            const unsigned char* blk = w + ((size_t)(j0 + i) * nsb + sb) * MP_Q4K_BYTES;
            qv[i] = in ? __ldg(reinterpret_cast<const uint4*>(blk + 16 + 32 * p + l0)) : zero;
            hd[i] = in ? __ldg(reinterpret_cast<const uint4*>(blk)) : zero;
        }
        // d * sc and dmin * m of both sub-blocks, per row (a zero head: zero weights).
        float wa[R], wb[R], wc[R], wd[R];
#pragma unroll
        for (int i = 0; i < R; ++i) {
            const float d = __half2float(__ushort_as_half((unsigned short)(hd[i].x & 0xffffu)));
            const float dmin = __half2float(__ushort_as_half((unsigned short)(hd[i].x >> 16)));
            int sca, ma, scb, mb;
            scale_min_k4_head(2 * p, hd[i], &sca, &ma);
            scale_min_k4_head(2 * p + 1, hd[i], &scb, &mb);
            wa[i] = d * (float)sca;
            wb[i] = dmin * (float)ma;
            wc[i] = d * (float)scb;
            wd[i] = dmin * (float)mb;
        }
        const int ea = sb * 256 + 64 * p + l0;
#pragma unroll
        for (int r = 0; r < M; ++r) {
            if (r >= m || sb >= nsb) continue;
            // Sub-block 2p (low nibbles), then 2p+1 (high nibbles): 16 activations live at once.
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float4 xs[4];
#pragma unroll
                for (int v = 0; v < 4; ++v) xs[v] = x4_at(x, r, k, ea + 32 * h + 4 * v);
                const float sum = (sum4(xs[0]) + sum4(xs[1])) + (sum4(xs[2]) + sum4(xs[3]));
#pragma unroll
                for (int i = 0; i < R; ++i) {
                    const unsigned int words[4] = {qv[i].x, qv[i].y, qv[i].z, qv[i].w};
                    float dot = 0.f;
#pragma unroll
                    for (int v = 0; v < 4; ++v) dot += dot4((words[v] >> (4 * h)) & 0x0F0F0F0Fu, xs[v]);
                    acc[i][r] += h == 0 ? wa[i] * dot - wb[i] * sum : wc[i] * dot - wd[i] * sum;
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
        for (int r = 0; r < M; ++r) {
            float t = acc[i][r];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
            if (lane == 0 && r < m && j0 + i < n) y[(size_t)r * ldy + j0 + i] = t;
        }
}

// Decode, one row.
extern "C" __global__ void __launch_bounds__(256, 3) q4k_gemv(const float* __restrict__ x, int m, const unsigned char* __restrict__ w,
                                    float* __restrict__ y, int n, int k, int kp, int ldy) {
    q4k_gemv_rows<1, MP_Q4K_GEMV_ROWS / 8>(x, m, w, y, n, k, kp, ldy);
}

// Two to four rows (forward_k2, forward_k3, verify m <= 4).
extern "C" __global__ void q4k_gemv_batch4(const float* __restrict__ x, int m, const unsigned char* __restrict__ w,
                                           float* __restrict__ y, int n, int k, int kp, int ldy) {
    q4k_gemv_rows<4, MP_Q4K_GEMV_M_ROWS / 8>(x, m, w, y, n, k, kp, ldy);
}

// y[r, j] = sw[j] * sum_e wq[j, e] * x[r, e] over int8 rows `[n, kp]` (the `q4k_mmq` down's
// default storage) with f32 row scales. One warp per R consecutive output rows (each activation
// load serves R rows); lane t reads 16 code bytes of each 512-column chunk (a row's 512 bytes
// coalesced), U chunks of the R rows loaded before any is used; each code becomes f32 by PRMT
// and FADD (`i8_f32`).
// Grid ceil(n / (8 R)), block 256.
template <int M, int R, int U>
__device__ __forceinline__ void int8_rows_gemv_rows(const float* __restrict__ x, int m, const unsigned char* __restrict__ wq,
                                                    const float* __restrict__ sw, float* __restrict__ y, int n, int k, int kp,
                                                    int ldy) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int j0 = (blockIdx.x * (blockDim.x >> 5) + warp) * R;
    if (j0 >= n) return;
    float acc[R][M];
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
        for (int r = 0; r < M; ++r) acc[i][r] = 0.f;
    const uint4 zero = {0u, 0u, 0u, 0u};
    for (int c0 = 0; c0 < kp; c0 += 512 * U) {
        uint4 qv[U][R];
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int i = 0; i < R; ++i) {
                const int e = c0 + 512 * u + 16 * lane;
                qv[u][i] = e < kp && j0 + i < n ? __ldg(reinterpret_cast<const uint4*>(wq + (size_t)(j0 + i) * kp + e)) : zero;
            }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int e0 = c0 + 512 * u + 16 * lane;
            if (e0 >= kp) break;
#pragma unroll
            for (int r = 0; r < M; ++r) {
                if (r >= m) continue;
                float4 xv[4];
#pragma unroll
                for (int v = 0; v < 4; ++v) xv[v] = x4_at(x, r, k, e0 + 4 * v);
#pragma unroll
                for (int i = 0; i < R; ++i) {
                    const unsigned int words[4] = {qv[u][i].x, qv[u][i].y, qv[u][i].z, qv[u][i].w};
                    float part = 0.f;
#pragma unroll
                    for (int v = 0; v < 4; ++v) {
                        // Each code offset by 128 (0..255) in the mantissa of 2^23, less 2^23 + 128.
                        const unsigned int b = words[v] ^ 0x80808080u;
                        part += i8_f32<0>(b) * xv[v].x + i8_f32<1>(b) * xv[v].y + i8_f32<2>(b) * xv[v].z +
                                i8_f32<3>(b) * xv[v].w;
                    }
                    acc[i][r] += part;
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < R; ++i) {
        const float s = j0 + i < n ? sw[j0 + i] : 0.f;
#pragma unroll
        for (int r = 0; r < M; ++r) {
            float t = acc[i][r];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
            if (lane == 0 && r < m && j0 + i < n) y[(size_t)r * ldy + j0 + i] = s * t;
        }
    }
}

extern "C" __global__ void int8_rows_gemv(const float* __restrict__ x, int m, const unsigned char* __restrict__ wq,
                                          const float* __restrict__ sw, float* __restrict__ y, int n, int k, int kp, int ldy) {
    int8_rows_gemv_rows<1, MP_INT8_GEMV_ROWS / 8, 2>(x, m, wq, sw, y, n, k, kp, ldy);
}

extern "C" __global__ void int8_rows_gemv_batch4(const float* __restrict__ x, int m, const unsigned char* __restrict__ wq,
                                                 const float* __restrict__ sw, float* __restrict__ y, int n, int k, int kp,
                                                 int ldy) {
    int8_rows_gemv_rows<4, MP_INT8_GEMV_M_ROWS / 8, 2>(x, m, wq, sw, y, n, k, kp, ldy);
}
