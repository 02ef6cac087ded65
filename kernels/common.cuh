// Helpers shared by the kernel modules. A module includes this file by name; src/gpu/kernels.rs
// replaces that include line by this text before NVRTC sees the source (so the kernel cache key
// covers it too). No kernel entry points here.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

// ---- host-emulated: begin (tests/cuda_emu.rs compiles this part as C++) ----

// An E4M3 ("fn") byte as f32 (exact).
__device__ __forceinline__ float e4m3_to_f32(unsigned int b) {
    __nv_fp8_e4m3 v;
    v.__x = (__nv_fp8_storage_t)(b & 0xffu);
    return (float)v;
}

// A little-endian IEEE half at p as f32 (exact; p need not be aligned).
__device__ __forceinline__ float f16_at(const unsigned char* p) {
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

// Two f32 rounded to bf16 (nearest even), packed low/high into one 32-bit MMA operand word.
__device__ __forceinline__ unsigned int pack2_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned int*>(&v);
}

// The 16 E2M1 (FP4) values by code: bit 3 is the sign (REFERENCE.md, NVFP4).
__constant__ float E2M1_VALUES[16] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f,
                                      -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

// The maximum of v >= 0 over every thread of the block (blockDim.x a multiple of 32, at most
// 1024). Every thread of the block must call it; all receive the result. Exact (max is exact).
__device__ __forceinline__ float block_amax(float v) {
    __shared__ float red[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        float t = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) t = fmaxf(t, __shfl_xor_sync(0xffffffffu, t, o));
        if (threadIdx.x == 0) red[0] = t;
    }
    __syncthreads();
    return red[0];
}

// ---- host-emulated: end ----

// c += a . b, one m16n8k16 bf16 tensor-core MMA with f32 accumulation (mma.sync, sm_80+).
__device__ __forceinline__ void mma_m16n8k16_bf16(float* c, const unsigned int* a, const unsigned int* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
