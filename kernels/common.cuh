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

// a * b on bf16 pairs, each half rounded to nearest even (PTX mul.rn.bf16x2, sm_90).
#ifndef METRALE_CUDA_EMU
__device__ __forceinline__ unsigned int bf16x2_mul(unsigned int a, unsigned int b) {
    unsigned int r;
    asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
#endif

// A 16-byte read-only weight load that does not allocate in L1 (PTX
// ld.global.nc.L1::no_allocate): a decode GEMV reads each weight once per call, and the
// activations every block re-reads stay in L1. tests/cuda_emu/prelude.h has the host stand-in.
#ifndef METRALE_CUDA_EMU
__device__ __forceinline__ uint4 ldg_stream(const void* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}
#endif

// Programmatic dependent launch (PTX griddepcontrol, sm_90; CUDA programming guide,
// "Programmatic Dependent Launch and Synchronization"). A kernel marked `dependent` in
// src/gpu/table.rs is launched with programmatic stream serialization, so it may start while
// the kernel before it in the stream still runs; it calls pdl_trigger() at entry (its own
// dependents may then launch once every block of it has started) and pdl_wait() before its
// first read of anything an earlier launch wrote and before its first write. Reads of the
// weights (written at load, long before) may come first: a decode GEMV issues its first loads,
// then waits, so its DRAM traffic starts under the previous kernel's tail. Without the launch
// attribute (the legacy order, or a device below sm_90) both are no-ops. The host stand-ins
// (tests/cuda_emu/prelude.h) do nothing: the emulator runs launches in order.
#ifndef METRALE_CUDA_EMU
__device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
#endif

// The sums acc[r][q] (r < m activation rows, q < R weight rows) of every thread of a block of
// W warps, reduced and stored as y[r, j0 + q] (j0 + q < n): a shuffle tree in each warp, then the
// W warp sums added in warp order. Every thread of the block must call it.
template <int M, int R, int W>
__device__ __forceinline__ void block_sum_rows(float (&acc)[M][R], int m, float* __restrict__ y, int j0, int n, int ldy) {
    __shared__ float red[W][M][R];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < M; ++r) {
        if (r >= m) break;
#pragma unroll
        for (int q = 0; q < R; ++q) {
            float v = acc[r][q];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0) red[warp][r][q] = v;
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < M * R; i += blockDim.x) {
        const int r = i / R, q = i % R;
        if (r >= m || j0 + q >= n) continue;
        float t = 0.f;
#pragma unroll
        for (int e = 0; e < W; ++e) t += red[e][r][q];
        y[(size_t)r * ldy + j0 + q] = t;
    }
}

// The 16 E2M1 (FP4) values by code: bit 3 is the sign (NVIDIA's NVFP4 format: E2M1 with an E4M3 scale per 16 values; formats.md, "nvfp4").
__constant__ float E2M1_VALUES[16] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f,
                                      -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

// N consecutive f32 from p (16-byte aligned) into out, as N / 4 read-only float4 loads.
template <int N>
__device__ __forceinline__ void load_f32s(const float* __restrict__ p, float (&out)[N]) {
    const float4* p4 = reinterpret_cast<const float4*>(p);
#pragma unroll
    for (int t = 0; t < N / 4; ++t) {
        const float4 a = __ldg(p4 + t);
        out[4 * t] = a.x;
        out[4 * t + 1] = a.y;
        out[4 * t + 2] = a.z;
        out[4 * t + 3] = a.w;
    }
}

// The gated activations' products (the contract: src/gpu/reference.rs `silu_mul`, `gelu_mul`):
// one definition for act_mul_silu / act_mul_gelu and for the fused FP8 quantizer
// (quantize_act_mul_fp8_row), so the fused codes are those of the unfused chain bit for bit.
__device__ __forceinline__ float act_silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }
__device__ __forceinline__ float act_gelu_mul(float g, float u) {
    return 0.5f * g * (1.0f + tanhf(0.7978846f * (g + 0.044715f * g * g * g))) * u;
}

// Over the 32 lanes of a warp, each holding one value v of a group: the largest |v| and the f32
// sum of the values, both in the butterfly order xor 16, 8, 4, 2, 1 (every lane gets both). The
// int8 activation quantizers' group statistics (quantize_act_q8_1, affine_quantize_act; the CPU
// twin is src/gpu/reference.rs `warp_group_q8`).
__device__ __forceinline__ void warp_amax_sum(float v, float& amax, float& sum) {
    amax = fabsf(v);
    sum = v;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, o));
    }
}

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

// c += a . b: one m16n8k32 int8 tensor-core MMA with exact s32 accumulation (mma.sync, sm_80+).
// Fragments (PTX ISA, "Matrix fragments for mma.m16n8k32", 8-bit types; g = lane / 4,
// t = lane % 4): a[0], a[2] hold A's row g at k 4t..4t+3 and 16+4t..16+4t+3, a[1], a[3] row g+8;
// b[0], b[1] hold B's column g at k 4t.. and 16+4t..; c[0], c[1] are row g, columns 2t, 2t+1,
// c[2], c[3] row g+8. tests/cuda_emu/prelude.h defines a host stand-in with the same layout.
#ifndef METRALE_CUDA_EMU
__device__ __forceinline__ void mma_m16n8k32_s8(int* c, const unsigned int* a, const unsigned int* b) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

// ---- The int8 MMQ tile (the layouts' GEMMs over q8_1 activations, the int8 down GEMM). A block computes 64 rows x 128 outputs, 128 k per stage, with 4 warps of 32 x 64
// (2 x 8 MMAs of m16n8k32 per 32 k). Shared rows are 144 bytes: 36 words, so the fragment
// loads of the 8 groups x 4 lanes fall in 32 different banks.
#define MMQ_BM 64
#define MMQ_BN 128
#define MMQ_BK 128
#define MMQ_LD (MMQ_BK + 16)
#define MMQ_CHUNKS (MMQ_BK / 32)
#define MMQ_THREADS 128  // 4 warps; the stage loaders assume it (one weight row per thread)

struct MmqTile {
    unsigned char a[MMQ_BM][MMQ_LD];       // activation codes (s8), row-major in k
    unsigned char b[MMQ_BN][MMQ_LD];       // weight codes (s8), one row per output
    float dx[MMQ_BM][MMQ_CHUNKS];          // q8_1 d per row and 32-value chunk
    float sx[MMQ_BM][MMQ_CHUNKS];          // q8_1 s (sum of the unquantized inputs)
    float wa[MMQ_BN][MMQ_CHUNKS];          // the weight format's scale per output and chunk
    float wb[MMQ_BN][MMQ_CHUNKS];          // its offset term (the zero point times its scale)
};

// v as f32, exactly, for |v| < 2^22, in two full-rate operations instead of the conversion unit
// (I2F runs at a fraction of the FP32 rate): the bits of 1.5 * 2^23 plus v are the float
// 1.5 * 2^23 + v (its ulp is 1), and subtracting 1.5 * 2^23 is exact.
__device__ __forceinline__ float small_int_to_f32(int v) { return __int_as_float(0x4B400000 + v) - 12582912.0f; }

// Zero a warp's 2 x 8 fragment accumulators (float sums or exact int sums).
template <class T>
__device__ __forceinline__ void mmq_zero(T (*acc)[8][4]) {
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int b = 0; b < 8; ++b)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[a][b][e] = T(0);
}

// Write a warp's 2 x 8 fragments, whose top-left output is (r0, c0), as
// y[r, c] = value(r, c, acc) for r < m, c < n (the C fragment layout of the m16n8k32 MMAs,
// int8 here and e4m3 in ffn_w8a8.cu).
template <class T, class F>
__device__ __forceinline__ void mmq_write_y(const T (*acc)[8][4], int r0, int c0, int lane, int m, int n, float* __restrict__ y,
                                            int ldy, F value) {
    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int b = 0; b < 8; ++b)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = r0 + a * 16 + g + 8 * h, c = c0 + b * 8 + t4 * 2;
                if (r >= m) continue;
                if (c < n) y[(size_t)r * ldy + c] = value(r, c, acc[a][b][2 * h]);
                if (c + 1 < n) y[(size_t)r * ldy + c + 1] = value(r, c + 1, acc[a][b][2 * h + 1]);
            }
}

// ci[a][b] += the int8 products of the warp's 2 x 8 fragments over the 32 k at column ks.
__device__ __forceinline__ void mmq_mma_k32(const MmqTile& t, int ks, int wm0, int wn0, int lane, int (*ci)[8][4]) {
    const int g = lane >> 2, c = ks + (lane & 3) * 4;
    unsigned int af[2][4], bf[8][2];
#pragma unroll
    for (int a = 0; a < 2; ++a) {
        const int r = wm0 + a * 16 + g;
        af[a][0] = *reinterpret_cast<const unsigned int*>(&t.a[r][c]);
        af[a][1] = *reinterpret_cast<const unsigned int*>(&t.a[r + 8][c]);
        af[a][2] = *reinterpret_cast<const unsigned int*>(&t.a[r][c + 16]);
        af[a][3] = *reinterpret_cast<const unsigned int*>(&t.a[r + 8][c + 16]);
    }
#pragma unroll
    for (int b = 0; b < 8; ++b) {
        const int r = wn0 + b * 8 + g;
        bf[b][0] = *reinterpret_cast<const unsigned int*>(&t.b[r][c]);
        bf[b][1] = *reinterpret_cast<const unsigned int*>(&t.b[r][c + 16]);
    }
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int b = 0; b < 8; ++b) mma_m16n8k32_s8(ci[a][b], af[a], bf[b]);
}

// One stage of q8_1 activations (64 rows x 4 blocks) held in registers while the previous
// stage computes: 16 code words and 2 (d, s) words per thread (block of MMQ_THREADS).
struct MmqActRegs {
    unsigned int code[16];
    unsigned int ds[2];
};

__device__ __forceinline__ void mmq_fetch_q8_1(const unsigned char* __restrict__ xq, int m, int m0, int nblk, int k0, MmqActRegs& r) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int v = 0; v < 16; ++v) {
        // q8_1 codes start 4 bytes into a 36-byte block, so the words are aligned.
        const int row = (tid >> 5) + 4 * v, c = (tid >> 3) & 3, wd = tid & 7, gr = m0 + row;
        const unsigned char* xb = xq + ((size_t)gr * nblk + k0 / 32 + c) * MP_Q8_1_BYTES;
        r.code[v] = gr < m ? __ldg(reinterpret_cast<const unsigned int*>(xb + 4) + wd) : 0u;
    }
#pragma unroll
    for (int v = 0; v < 2; ++v) {
        const int idx = tid + MMQ_THREADS * v, row = idx >> 2, c = idx & 3, gr = m0 + row;
        r.ds[v] = gr < m ? __ldg(reinterpret_cast<const unsigned int*>(xq + ((size_t)gr * nblk + k0 / 32 + c) * MP_Q8_1_BYTES)) : 0u;
    }
}

__device__ __forceinline__ void mmq_store_q8_1(const MmqActRegs& r, MmqTile& t) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int v = 0; v < 16; ++v) {
        const int row = (tid >> 5) + 4 * v, c = (tid >> 3) & 3, wd = tid & 7;
        *reinterpret_cast<unsigned int*>(&t.a[row][c * 32 + wd * 4]) = r.code[v];
    }
#pragma unroll
    for (int v = 0; v < 2; ++v) {
        const int idx = tid + MMQ_THREADS * v, row = idx >> 2, c = idx & 3;
        t.dx[row][c] = __half2float(__ushort_as_half((unsigned short)(r.ds[v] & 0xffffu)));
        t.sx[row][c] = __half2float(__ushort_as_half((unsigned short)(r.ds[v] >> 16)));
    }
}

// The q8_1 MMQ GEMM: y[r, j] = sum over 32-value chunks c of
// (wa[j, c] * dx[r, c]) * dot_c(r, j) - wb[j, c] * sx[r, c], where dot_c is the exact int8 dot
// product of row r's q8_1 codes and output j's weight codes (tensor cores; |dot_c| <= 32 * 127
// * 15, so small_int_to_f32 is exact), dx, sx the q8_1 block's d and s, and wa, wb what the
// weight format makes of its scales (Q4_K: d*sc, dmin*m; Q2_0: d, 2d). The weight format's
// `Stage` fetches one 128-k stage of outputs n0..n0+127 into registers (`Stage::Regs`,
// `Stage::fetch(w, n, kp, n0, k0, regs)`) and stores it as codes and wa, wb
// (`Stage::store(regs, k0, t)`; zeros past n), so the next stage's loads are in flight while
// this one computes. xq [m, kp/32] blocks of 36 bytes; kp % 128 == 0.
// Grid (ceil(n / 128), ceil(m / 64)), block MMQ_THREADS.
template <class Stage>
__device__ __forceinline__ void mmq_q8_1_gemm(const unsigned char* __restrict__ xq, int m, const unsigned char* __restrict__ w,
                                              float* __restrict__ y, int n, int kp, int ldy) {
    __shared__ __align__(16) MmqTile t;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm0 = (warp >> 1) * 32, wn0 = (warp & 1) * 64;
    const int n0 = blockIdx.x * MMQ_BN, m0 = blockIdx.y * MMQ_BM;
    const int g = lane >> 2, t4 = lane & 3, nblk = kp / 32;
    float acc[2][8][4];
    mmq_zero(acc);
    MmqActRegs ar;
    typename Stage::Regs wr;
    mmq_fetch_q8_1(xq, m, m0, nblk, 0, ar);
    Stage::fetch(w, n, kp, n0, 0, wr);
    for (int k0 = 0; k0 < kp; k0 += MMQ_BK) {
        mmq_store_q8_1(ar, t);
        Stage::store(wr, k0, t);
        __syncthreads();
        if (k0 + MMQ_BK < kp) {
            mmq_fetch_q8_1(xq, m, m0, nblk, k0 + MMQ_BK, ar);
            Stage::fetch(w, n, kp, n0, k0 + MMQ_BK, wr);
        }
        // One chunk at a time (unrolling them spilled: 255 registers).
#pragma unroll 1
        for (int c = 0; c < MMQ_CHUNKS; ++c) {
            int ci[2][8][4];
            mmq_zero(ci);
            mmq_mma_k32(t, c * 32, wm0, wn0, lane, ci);
            float dxr[2][2], sxr[2][2];
#pragma unroll
            for (int a = 0; a < 2; ++a)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    dxr[a][h] = t.dx[wm0 + a * 16 + g + 8 * h][c];
                    sxr[a][h] = t.sx[wm0 + a * 16 + g + 8 * h][c];
                }
#pragma unroll
            for (int b = 0; b < 8; ++b)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int col = wn0 + b * 8 + t4 * 2 + e;
                    const float wa = t.wa[col][c], wb = t.wb[col][c];
#pragma unroll
                    for (int a = 0; a < 2; ++a)
#pragma unroll
                        for (int h = 0; h < 2; ++h)
                            acc[a][b][2 * h + e] += (wa * dxr[a][h]) * small_int_to_f32(ci[a][b][2 * h + e]) - wb * sxr[a][h];
                }
        }
        __syncthreads();
    }
    mmq_write_y(acc, m0 + wm0, n0 + wn0, lane, m, n, y, ldy, [](int, int, float v) { return v; });
}

// Byte i of a Q4_K block's 16-byte head (f16 d, f16 dmin, 12 bytes of packed scales).
__device__ __forceinline__ unsigned int q4k_head_byte(const uint4& h, int i) {
    const unsigned int v = i < 4 ? h.x : i < 8 ? h.y : i < 12 ? h.z : h.w;
    return (v >> (8 * (i & 3))) & 0xffu;
}

// ggml's get_scale_min_k4 (ggml-quants.c) on the head in registers (q[i] is head byte 4 + i).
__device__ __forceinline__ void scale_min_k4_head(int j, const uint4& h, int* sc, int* m) {
    if (j < 4) {
        *sc = (int)(q4k_head_byte(h, 4 + j) & 63u);
        *m = (int)(q4k_head_byte(h, 8 + j) & 63u);
    } else {
        *sc = (int)((q4k_head_byte(h, 8 + j) & 0xFu) | ((q4k_head_byte(h, j) >> 6) << 4));
        *m = (int)((q4k_head_byte(h, 8 + j) >> 4) | ((q4k_head_byte(h, 4 + j) >> 6) << 4));
    }
}

// ---- host-emulated: end ----

// c += a . b, one m16n8k16 bf16 tensor-core MMA with f32 accumulation (mma.sync, sm_80+).
__device__ __forceinline__ void mma_m16n8k16_bf16(float* c, const unsigned int* a, const unsigned int* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
