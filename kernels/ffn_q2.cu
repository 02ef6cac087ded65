// Packed Q2_0-g128 arms (`q2g128` pack layout: per row kp/128 blocks of 34 bytes, `f16 d` then
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
    const unsigned char* row = w + (size_t)j * (kp / 128) * 34;
    float acc[M];
#pragma unroll
    for (int r = 0; r < M; ++r) acc[r] = 0.f;
    for (int b = 0; b < kp / 128; ++b) {
        const unsigned char* blk = row + (size_t)b * 34;
        const float d = f16_at(blk);
        const unsigned int qb = blk[2 + lane];
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
#pragma unroll
    for (int r = 0; r < M; ++r) {
        float t = acc[r];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        if (lane == 0 && r < m) y[(size_t)r * ldy + j] = t;
    }
}

// Decode, one row.
extern "C" __global__ void q2_0_gemv_vec(const float* x, int m, const unsigned char* w, float* y, int n, int k, int kp,
                                         int ldy) {
    q2_gemv<1>(x, m, w, y, n, k, kp, ldy);
}

// forward_km_q2: 2 and 3 rows (up to 4).
extern "C" __global__ void q2_0_gemv_vec_batchm(const float* x, int m, const unsigned char* w, float* y, int n, int k,
                                                int kp, int ldy) {
    q2_gemv<4>(x, m, w, y, n, k, kp, ldy);
}

// out bf16 [n, kp] = bf16_rn(d * (q - 2)). One thread per (row, block, byte). Grid
// ceil(n * kp / 128 * 32 / 256), block 256.
extern "C" __global__ void dequant_q2_0_gn_to_bf16(const unsigned char* __restrict__ w, int n, int kp,
                                                   __nv_bfloat16* __restrict__ out) {
    const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long total = (long long)n * (kp / 128) * 32;
    if (id >= total) return;
    const int l = (int)(id % 32);
    const long long blkid = id / 32;  // row * (kp/128) + b
    const unsigned char* blk = w + blkid * 34;
    const float d = f16_at(blk);
    const unsigned int qb = blk[2 + l];
    __nv_bfloat16* o = out + blkid * 128;
#pragma unroll
    for (int s = 0; s < 4; ++s) o[32 * s + l] = __float2bfloat16_rn(d * (float)((int)((qb >> (2 * s)) & 3u) - 2));
}

// The Q2 MMQ GEMM over q8_1 activation blocks (quantize_act_q8_1, module ffn_q8_1):
// y[r, j] = sum_blocks dw * sum_{s<4} (dx[4b+s] * sum_l q * xq - 2 * sx[4b+s]), the zero point
// folded through the sum of the unquantized inputs. One warp per (output j, 4 rows).
// Grid (ceil(n / 8), ceil(m / 4)), block 256.
extern "C" __global__ void q2_0_mmq_gemm(const unsigned char* __restrict__ xq, int m, const unsigned char* __restrict__ w,
                                         float* __restrict__ y, int n, int kp, int ldy) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int j = blockIdx.x * (blockDim.x >> 5) + warp, r0 = blockIdx.y * 4;
    if (j >= n) return;
    const unsigned char* row = w + (size_t)j * (kp / 128) * 34;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int b = 0; b < kp / 128; ++b) {
        const unsigned char* blk = row + (size_t)b * 34;
        const float dw = f16_at(blk);
        const unsigned int qb = blk[2 + lane];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int rr = r0 + r;
            if (rr >= m) continue;
#pragma unroll
            for (int s = 0; s < 4; ++s) {
                const unsigned char* xb = xq + ((size_t)rr * (kp / 32) + 4 * b + s) * 36;
                const int q = (int)((qb >> (2 * s)) & 3u);
                const int xv = (int)(signed char)xb[4 + lane];
                float t = f16_at(xb) * (float)(q * xv);
                if (lane == 0) t -= 2.f * f16_at(xb + 2);
                acc[r] += dw * t;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        float t = acc[r];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        if (lane == 0 && r0 + r < m) y[(size_t)(r0 + r) * ldy + j] = t;
    }
}
