// Activation kernels of the dense FFN. Numerics contract: src/gpu/reference.rs.
// Row-major f32 with explicit row strides, so the fused FP8 gate+up output ([m, 2*interp]) feeds
// them without a copy. Grid: (ceil(cols / 256), rows), block 256. The products are common.cuh's
// act_silu_mul / act_gelu_mul, shared with the fused FP8 quantizer.

#include "common.cuh"

// The il8 order of the dequantizing wgmma GEMMs' bf16 activations (formats.md, "The dequantizing
// wgmma GEMMs"): within each group of 8 columns, position p holds column IL8[p] (the order in
// which their decoders place a weight's values). Column c goes to position il8_pos(c).
__device__ __forceinline__ int il8_pos(int c) { return (c & ~7) | ((c & 3) << 1) | ((c >> 2) & 1); }

// This thread's product act(g, u) (SiLU or GELU) at row blockIdx.y, column c, into out at row
// stride os: as f32, or (IL8) rounded to bf16 (nearest even) at the column's il8 position.
template <bool SILU, bool IL8, class T>
__device__ __forceinline__ void act_mul_at(const float* __restrict__ g, const float* __restrict__ u, T* __restrict__ out, int rows, int cols,
                                           int gs, int us, int os) {
    pdl_trigger();
    pdl_wait();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int r = blockIdx.y;
    if (c >= cols || r >= rows) return;
    const float gv = g[(size_t)r * gs + c];
    const float uv = u[(size_t)r * us + c];
    const float v = SILU ? act_silu_mul(gv, uv) : act_gelu_mul(gv, uv);
    if constexpr (IL8) {
        out[(size_t)r * os + il8_pos(c)] = __float2bfloat16_rn(v);
    } else {
        out[(size_t)r * os + c] = v;
    }
}

extern "C" __global__ void act_mul_silu(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ out,
                                        int rows, int cols, int gs, int us, int os) {
    act_mul_at<true, false>(g, u, out, rows, cols, gs, us, os);
}

extern "C" __global__ void act_mul_gelu(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ out,
                                        int rows, int cols, int gs, int us, int os) {
    act_mul_at<false, false>(g, u, out, rows, cols, gs, us, os);
}

// The products rounded to bf16 (nearest even) into out [rows, cols] at row stride os in the
// il8 order (cols % 8 == 0): the dequantizing GEMMs' down input, the bits of act_mul_* followed
// by f32_to_bf16_il8.
extern "C" __global__ void act_mul_silu_il8(const float* __restrict__ g, const float* __restrict__ u, __nv_bfloat16* __restrict__ out,
                                            int rows, int cols, int gs, int us, int os) {
    act_mul_at<true, true>(g, u, out, rows, cols, gs, us, os);
}

extern "C" __global__ void act_mul_gelu_il8(const float* __restrict__ g, const float* __restrict__ u, __nv_bfloat16* __restrict__ out,
                                            int rows, int cols, int gs, int us, int os) {
    act_mul_at<false, true>(g, u, out, rows, cols, gs, us, os);
}

// x f32 [count] -> y bf16 [count] in the il8 order (count % 8 == 0), nearest even.
// Grid ceil(count / 256), block 256.
extern "C" __global__ void f32_to_bf16_il8(const float* __restrict__ x, __nv_bfloat16* __restrict__ y, int count) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) y[il8_pos(i)] = __float2bfloat16_rn(x[i]);
}

// x f32 [count] -> y bf16 [count], nearest even. Grid ceil(count / 256), block 256.
extern "C" __global__ void f32_to_bf16(const float* __restrict__ x, __nv_bfloat16* __restrict__ y, int count) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) y[i] = __float2bfloat16_rn(x[i]);
}
