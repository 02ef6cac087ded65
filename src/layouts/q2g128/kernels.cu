// Packed q2g128 arms (`q2g128` pack layout: per row kp/128 blocks of 34 bytes, `f16 d` then
// `u8 qs[32]`; element 32s + l is bits 2s..2s+2 of qs[l]; value d * (q - 2)). Numerics contract
// and CPU twins: src/gpu/reference.rs (`q2_row`, `q2_dequant_bf16`, `quantize_row_q8_1_act`,
// `q2_mmq_row`).

#include "common.cuh"

// y[r, j] = sum_blocks d * sum_e (q - 2) * x[r, e]. One warp per output row j (lane l owns
// code byte l of every block: elements l, 32+l, 64+l, 96+l), M activation rows (m <= M).
// Grid ceil(n / 8), block 256.
template <int M>
__device__ __forceinline__ void q2_gemv(const float* __restrict__ x, int m, const unsigned char* __restrict__ w,
                                        float* __restrict__ y, int n, int k, int kp, int ldy) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int j = blockIdx.x * (blockDim.x >> 5) + warp;
    if (j >= n) return;
    const unsigned char* row = w + (size_t)j * (kp / 128) * MP_Q2G128_BYTES;
    float acc[M];
#pragma unroll
    for (int r = 0; r < M; ++r) acc[r] = 0.f;
    // Q2_GEMV_U blocks' code bytes and scales are loaded before any is used, so that many
    // loads per lane are in flight (one at a time left the GEMV latency-bound). Blocks past the
    // row's end get d = 0 and are skipped. The sums run in block order either way.
    constexpr int Q2_GEMV_U = 8;
    const int nb = kp / 128;
    for (int b0 = 0; b0 < nb; b0 += Q2_GEMV_U) {
        unsigned int qbs[Q2_GEMV_U];
        float ds[Q2_GEMV_U];
#pragma unroll
        for (int u = 0; u < Q2_GEMV_U; ++u) {
            const unsigned char* blk = row + (size_t)(b0 + u) * MP_Q2G128_BYTES;
            const bool in = b0 + u < nb;
            qbs[u] = in ? __ldg(blk + 2 + lane) : 0u;
            ds[u] = in ? f16_at(blk) : 0.f;
        }
#pragma unroll
        for (int u = 0; u < Q2_GEMV_U; ++u) {
            const int b = b0 + u;
            if (b >= nb) break;
            const unsigned int qb = qbs[u];
            const float d = ds[u];
#pragma unroll
            for (int r = 0; r < M; ++r) {
                if (r >= m) continue;
                float part = 0.f;
#pragma unroll
                for (int s = 0; s < 4; ++s) {
                    const int e = b * 128 + 32 * s + lane;
                    const float xv = e < k ? x[(size_t)r * k + e] : 0.f;
                    part += (float)((int)((qb >> (2 * s)) & 3u) - 2) * xv;
                }
                acc[r] += d * part;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < M; ++r) {
        float t = acc[r];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        if (lane == 0 && r < m) y[(size_t)r * ldy + j] = t;
    }
}

// Decode, one row.
extern "C" __global__ void q2g128_gemv(const float* x, int m, const unsigned char* w, float* y, int n, int k, int kp,
                                         int ldy) {
    q2_gemv<1>(x, m, w, y, n, k, kp, ldy);
}

// forward_km_q2: 2 and 3 rows (up to 4).
extern "C" __global__ void q2g128_gemv_batchm(const float* x, int m, const unsigned char* w, float* y, int n, int k,
                                                int kp, int ldy) {
    q2_gemv<4>(x, m, w, y, n, k, kp, ldy);
}

// out bf16 [n, kp] = bf16_rn(d * (q - 2)). One thread per (row, block, byte). Grid
// ceil(n * kp / 128 * 32 / 256), block 256.
extern "C" __global__ void q2g128_dequant_bf16(const unsigned char* __restrict__ w, int n, int kp,
                                                   __nv_bfloat16* __restrict__ out) {
    const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long total = (long long)n * (kp / 128) * 32;
    if (id >= total) return;
    const int l = (int)(id % 32);
    const long long blkid = id / 32;  // row * (kp/128) + b
    const unsigned char* blk = w + blkid * MP_Q2G128_BYTES;
    const float d = f16_at(blk);
    const unsigned int qb = blk[2 + l];
    __nv_bfloat16* o = out + blkid * 128;
#pragma unroll
    for (int s = 0; s < 4; ++s) o[32 * s + l] = __float2bfloat16_rn(d * (float)((int)((qb >> (2 * s)) & 3u) - 2));
}

// The Q2 MMQ GEMM over q8_1 activation blocks (quantize_act_q8_1, module ffn_q8_1):
// y[r, j] = sum_blocks dw * sum_{s<4} (dx[4b+s] * sum_l q * xq - 2 * sx[4b+s]), the zero point
// folded through the sum of the unquantized inputs, on the int8 MMQ tile of common.cuh
// (wa = dw, wb = 2 dw). A 128-value stage is one block: byte l of `qs` holds element l of the
// four 32-value chunks in bits 2s..2s+1. Grid (ceil(n / 128), ceil(m / 64)), block 128.
struct Q2Stage {
    // Per thread: 8 x 4 bytes of `qs` and the f16 d of row n0 + threadIdx.x.
    struct Regs {
        unsigned int q[8];
        unsigned int d;
    };
    static __device__ __forceinline__ void fetch(const unsigned char* __restrict__ w, int n, int kp, int n0, int k0, Regs& r) {
        const int nb = kp / 128, b = k0 / 128, tid = threadIdx.x;
#pragma unroll
        for (int v = 0; v < 8; ++v) {
            const int row = (tid >> 3) + 16 * v, u = tid & 7, gn = n0 + row;
            unsigned int q = 0u;
            if (gn < n) {
                // 34-byte blocks: only 2-byte alignment.
                const unsigned short* p = reinterpret_cast<const unsigned short*>(w + ((size_t)gn * nb + b) * MP_Q2G128_BYTES + 2 + 4 * u);
                q = (unsigned int)__ldg(p) | ((unsigned int)__ldg(p + 1) << 16);
            }
            r.q[v] = q;
        }
        const int gn = n0 + tid;
        r.d = gn < n ? (unsigned int)__ldg(reinterpret_cast<const unsigned short*>(w + ((size_t)gn * nb + b) * MP_Q2G128_BYTES)) : 0u;
    }
    static __device__ __forceinline__ void store(const Regs& r, int, MmqTile& t) {
        const int tid = threadIdx.x;
#pragma unroll
        for (int v = 0; v < 8; ++v) {
            const int row = (tid >> 3) + 16 * v, u = tid & 7;
#pragma unroll
            for (int s = 0; s < 4; ++s) *reinterpret_cast<unsigned int*>(&t.b[row][32 * s + 4 * u]) = (r.q[v] >> (2 * s)) & 0x03030303u;
        }
        const float d = __half2float(__ushort_as_half((unsigned short)r.d));
#pragma unroll
        for (int c = 0; c < MMQ_CHUNKS; ++c) {
            t.wa[tid][c] = d;
            t.wb[tid][c] = 2.f * d;
        }
    }
};

extern "C" __global__ void __launch_bounds__(128) q2g128_mmq_gemm(const unsigned char* __restrict__ xq, int m, const unsigned char* __restrict__ w,
                                                                float* __restrict__ y, int n, int kp, int ldy) {
    mmq_q8_1_gemm<Q2Stage>(xq, m, w, y, n, kp, ldy);
}
