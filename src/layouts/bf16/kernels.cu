// BF16 weight x f32 activation GEMV for decode (the `bf16` pack layout: [n, kp] row-major).
// y[r, j] = sum_{i < k} bf16(w[j, i]) * x[r, i]; m <= 4; k % 8 == 0. Prefill uses cuBLAS.
// Contract and CPU twin: src/gpu/reference.rs `bf16_row`.

#include "common.cuh"

// ---- host-emulated: begin (tests/cuda_emu.rs compiles this module as C++) ----

// A block of 8 warps computes R weight rows j0 = R blockIdx.x ..: its 256 threads split k in
// 16-byte chunks (8 weights; thread t takes chunks t, t + 256, ...), U chunks of each row in
// flight per thread, each activation load serving the R rows (so the f32 activations, 2 bytes
// per weight byte, add 2 / R to the weight stream, from L1/L2). block_sum_rows adds the threads'
// partial sums. Many small blocks (n / R) keep every SM streaming to the end of the call.
// R = 8, U = 1 measured best on the H200 of R in {4, 8, 16}, U in {1, 2, 4} (BENCHMARKS.md,
// "Decode GEMVs against their streaming probe"): 92-93% of the copy ceiling at m = 1, where
// 16 rows at a warp each (the previous form) ran 37.5-43.8 us a projection, 63-73%.
template <int M, int R, int U>
__device__ __forceinline__ void gemv_bf16(const float* __restrict__ x, int m, const __nv_bfloat16* __restrict__ w,
                                          float* __restrict__ y, int n, int k, int kp, int ldy) {
    constexpr int T = 256;
    pdl_trigger();
    const int j0 = blockIdx.x * R, chunks = k >> 3;
    float acc[M][R];
#pragma unroll
    for (int r = 0; r < M; ++r)
#pragma unroll
        for (int q = 0; q < R; ++q) acc[r][q] = 0.f;
    const __nv_bfloat16* wr[R];
#pragma unroll
    for (int q = 0; q < R; ++q) wr[q] = w + (size_t)min(j0 + q, n - 1) * kp;  // rows past n: never stored
    for (int c0 = threadIdx.x; c0 < chunks; c0 += T * U) {
        uint4 v[U][R];
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int q = 0; q < R; ++q)
                v[u][q] = c0 + T * u < chunks ? ldg_stream(wr[q] + 8 * (c0 + T * u)) : make_uint4(0, 0, 0, 0);
        // x is the previous launch's output: wait once, the first weight loads in flight.
        if (c0 == (int)threadIdx.x) pdl_wait();
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = c0 + T * u;
            if (c >= chunks) break;
#pragma unroll
            for (int r = 0; r < M; ++r) {
                if (r >= m) break;
                const float4* xr = reinterpret_cast<const float4*>(x + (size_t)r * k + 8 * c);
                const float4 a = __ldg(xr), b = __ldg(xr + 1);
                const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                for (int q = 0; q < R; ++q) {
                    const unsigned int words[4] = {v[u][q].x, v[u][q].y, v[u][q].z, v[u][q].w};
                    float t = 0.f;
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        t += __uint_as_float(words[i] << 16) * xv[2 * i];
                        t += __uint_as_float(words[i] & 0xffff0000u) * xv[2 * i + 1];
                    }
                    acc[r][q] += t;
                }
            }
        }
    }
    pdl_wait();  // a thread with no chunks (k < 8 * threadIdx.x) still takes part in the store
    block_sum_rows<M, R, T / 32>(acc, m, y, j0, n, ldy);
}

// m <= 4. Grid ceil(n / MP_BF16_GEMV_ROWS), block 256.
extern "C" __global__ void bf16_gemv_batch4(const float* x, int m, const __nv_bfloat16* w, float* y, int n, int k, int kp,
                                            int ldy) {
    gemv_bf16<4, MP_BF16_GEMV_ROWS, 1>(x, m, w, y, n, k, kp, ldy);
}

// ---- host-emulated: end ----
