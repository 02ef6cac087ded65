// Activation kernels of the dense FFN. Numerics contract: src/gpu/reference.rs.
// Row-major f32 with explicit row strides, so the fused FP8 gate+up output ([m, 2*interp]) feeds
// them without a copy. Grid: (ceil(cols / 256), rows), block 256. The products are common.cuh's
// act_silu_mul / act_gelu_mul, shared with the fused FP8 quantizer.

#include "common.cuh"

extern "C" __global__ void act_mul_silu(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ out,
                                        int rows, int cols, int gs, int us, int os) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int r = blockIdx.y;
    if (c >= cols || r >= rows) return;
    const float gv = g[(size_t)r * gs + c];
    const float uv = u[(size_t)r * us + c];
    out[(size_t)r * os + c] = act_silu_mul(gv, uv);
}

extern "C" __global__ void act_mul_gelu(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ out,
                                        int rows, int cols, int gs, int us, int os) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int r = blockIdx.y;
    if (c >= cols || r >= rows) return;
    const float gv = g[(size_t)r * gs + c];
    const float uv = u[(size_t)r * us + c];
    out[(size_t)r * os + c] = act_gelu_mul(gv, uv);
}

#include <cuda_bf16.h>

// x f32 [count] -> y bf16 [count], nearest even. Grid ceil(count / 256), block 256.
extern "C" __global__ void f32_to_bf16(const float* __restrict__ x, __nv_bfloat16* __restrict__ y, int count) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) y[i] = __float2bfloat16_rn(x[i]);
}
