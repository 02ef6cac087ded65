// LoRA on the NVFP4 arms: y += scaling * B (A x), A bf16 [r, k], B bf16 [n, r] (the `lora` pack
// layout), f32 activations and sums. Numerics contract and CPU twin: src/gpu/reference.rs
// `lora_a_row`, `lora_b_row`.

#include <cuda_bf16.h>

// xa[row, t] = sum_i A[t, i] * x[row, i] (x at row stride ldx), t < r.
// One warp per (row, t). Grid (ceil(r / 8), m), block 256.
extern "C" __global__ void lora_a(const float* __restrict__ x, int m, int k, int ldx, const __nv_bfloat16* __restrict__ a,
                                  int r, float* __restrict__ xa) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int t = blockIdx.x * (blockDim.x >> 5) + warp, row = blockIdx.y;
    if (t >= r || row >= m) return;
    const float* xr = x + (size_t)row * ldx;
    const __nv_bfloat16* ar = a + (size_t)t * k;
    float s = 0.f;
    for (int i = lane; i < k; i += 32) s += __bfloat162float(ar[i]) * xr[i];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) xa[(size_t)row * r + t] = s;
}

// y[row, j] += scaling * sum_t B[j, t] * xa[row, t], j < n (y at row stride ldy).
// Grid (ceil(n / 256), m), block 256.
extern "C" __global__ void lora_b_add(const float* __restrict__ xa, int m, int r, const __nv_bfloat16* __restrict__ b,
                                      float scaling, float* __restrict__ y, int n, int ldy) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x, row = blockIdx.y;
    if (j >= n || row >= m) return;
    const float* xr = xa + (size_t)row * r;
    const __nv_bfloat16* br = b + (size_t)j * r;
    float s = 0.f;
    for (int t = 0; t < r; ++t) s += __bfloat162float(br[t]) * xr[t];
    y[(size_t)row * ldy + j] += scaling * s;
}
