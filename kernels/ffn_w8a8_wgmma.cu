// W8A8 prefill and decode on Hopper's own FP8 matrix path (sm_90a): `wgmma` m64nNk32 e4m3 with f32
// accumulators (SASS QGMMA), both operands in shared memory in the 128-byte swizzle, filled by a
// cp.async pipeline. Same inputs, outputs and contract as `w8a8_gemm` (kernels/ffn_w8a8.cu; CPU
// twin src/gpu/reference.rs `w8a8_row`). Two tilings of one computation: `w8a8_wgmma` (128 x 128
// tiles, two consumer warpgroups, prefill) and `w8a8_wgmma_m64` (64 x 64 tiles, one warpgroup,
// m <= 64: twice the blocks of the weight for decode).
//
// Numerics (formats.md "The W8A8 wgmma GEMMs"): for each 128-byte k stage the four k32 wgmmas
// start from a zero accumulator, and that stage's tensor-core sum is added to an f32 total in
// stage order (Hopper's FP8 accumulator keeps fewer bits than f32 over long k; adding per 128
// keeps the error near 1e-4 of the output). An output's bits depend only on its own operands and
// that order, never on m, on the tiling or on which tile row it sits in, so the fixed path stays
// batch-invariant when every m runs through these kernels (gpu-check's fixed-path row checks the
// device agrees). Module compiled for sm_90a only (src/gpu/kernels.rs `module_arch`).
//
// Shared-memory layout per stage: A (activations) BM rows x 128 bytes, then B (weights) BN rows x
// 128 bytes; 16-byte chunk c of row r sits at r * 128 + ((c ^ (r % 8)) * 16), i.e. the address
// bits [4:6] XOR bits [7:9] of the 128-byte swizzle (PTX ISA, "Shared Memory Matrix Layout",
// swizzle mode 1), on a 1024-byte aligned base.

#include "common.cuh"

#ifndef METRALE_CUDA_EMU
extern __shared__ __align__(1024) unsigned char w8a8_wgmma_smem[];

__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// 16 bytes global -> shared, asynchronously; `bytes` = 0 writes 16 zero bytes.
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }
// Ordinary-proxy writes (cp.async) made visible to the async proxy (wgmma) after the barrier.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Wait until at most N committed wgmma groups of this warpgroup are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// Keeps the compiler from moving accumulator reads or writes across a wgmma fence or wait.
template <int R>
__device__ __forceinline__ void fence_regs(float* d) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (+)= A[64 x 32] . B[N x 32]^T from the two shared-memory descriptors; accumulate = 0
// overwrites d. Each thread of the warpgroup holds N / 2 of the 64 x N outputs: warp w, lane l,
// d[4 j + 2 h + e] = (row 16 w + l / 4 + 8 h, column 8 j + 2 (l % 4) + e).
template <int N>
__device__ __forceinline__ void wgmma_e4m3(float* d, unsigned long long da, unsigned long long db, int accumulate);
template <>
__device__ __forceinline__ void wgmma_e4m3<64>(float* d, unsigned long long da, unsigned long long db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(accumulate));
}
template <>
__device__ __forceinline__ void wgmma_e4m3<128>(float* d, unsigned long long da, unsigned long long db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(accumulate));
}
#endif

// ---- host-emulated: begin (tests/cuda_emu.rs runs these kernels on stand-ins for the PTX above) ----

// The shared-memory matrix descriptor of a K-major operand in the 128-byte swizzle: start
// address >> 4 (bits 0-13), leading byte offset 1 (bits 16-29, unused by this swizzle for
// K-major), stride byte offset 1024 >> 4 (bits 32-45: one 8-row x 128-byte atom to the next 8
// rows), swizzle mode 1 = 128 bytes (bits 62-63). PTX ISA, "Matrix Descriptor Format".
__device__ __forceinline__ unsigned long long wgmma_desc(unsigned addr) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}

// y[r, j] = (acc * sx[r]) * sw[j] as w8a8_gemm; q [m, kp], w [n, kp] e4m3 codes, kp % 128 == 0
// (the w8a8 layout's k alignment), y row stride ldy. Block tile (64 WGS) x BN, 128 WGS threads:
// warpgroup g owns rows 64 g .. 64 g + 63 of the tile; every thread also issues its share of the
// copies. Grid (ceil(m / BM), ceil(n / BN)): the m tiles vary fastest, so the blocks in flight
// share weight tiles and the weights stream from memory about once.
//
// Pipeline, per k stage kt: wait for this thread's copies of stage kt, fence, barrier (now every
// copy of stage kt is visible to the tensor cores, and every warpgroup has retired the wgmmas of
// stage kt - 1); copy stage kt + STAGES - 1 into the slot stage kt - 1 used; issue stage kt's
// four wgmmas into the partial accumulator, wait for them, and add the partial into the f32
// total. While one
// warpgroup adds, the other's wgmmas run, and the copies of the next stages are in flight.
// (Waiting for only the previous stage, with two alternating partials, made ptxas serialize
// every wgmma: it takes the partial read after `wgmma.wait_group 1` for a read of a pending
// accumulator, C7514.) The copies' addresses are computed once: a thread's chunks share one
// column (its 16-byte chunk c = tid % 8) and one swizzle (row % 8), so each copy in the loop
// is a pointer step and a slot offset; the descriptors likewise.
template <int WGS, int BN, int STAGES>
__device__ __forceinline__ void w8a8_wgmma_tiles(const unsigned char* __restrict__ q, const float* __restrict__ sx, int m,
                                                 const unsigned char* __restrict__ w, const float* __restrict__ sw,
                                                 float* __restrict__ y, int n, int kp, int ldy) {
    constexpr int BM = 64 * WGS, BK = MP_W8A8_WGMMA_BK, THREADS = 128 * WGS, R = BN / 2;
    constexpr int TILE_A = BM * BK, STAGE = (BM + BN) * BK;
    constexpr int CA = BM * 8 / THREADS, CB = BN * 8 / THREADS, ROWS_PER_PASS = THREADS / 8;
    static_assert(BK == 128, "one 128-byte swizzle row per k stage");
    static_assert(STAGES >= 2 && CA * THREADS == BM * 8 && CB * THREADS == BN * 8, "pipeline and copy shares");
    static_assert(ROWS_PER_PASS % 8 == 0, "a thread's rows share one swizzle phase");
    const unsigned base = (smem_addr(w8a8_wgmma_smem) + 1023u) & ~1023u;
    const int tid = threadIdx.x, wg = tid >> 7, t = tid & 127;
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    const int tiles = kp / BK;
    // A warpgroup whose 64 rows are all past m stores nothing.
    const bool active = m0 + wg * 64 < m;

    // This thread's copies: rows r0 + v ROWS_PER_PASS, chunk c, at the swizzled offset `dst`
    // (+ v ROWS_PER_PASS 128 bytes) of a stage; rows past m or n are zero-filled (size 0, their
    // source clamped to the last real row so every address stays inside the operand). The
    // sources step by one stage after each copy.
    const int r0 = tid >> 3, c = tid & 7;
    const unsigned dst = (unsigned)(r0 * 128 + ((c ^ (r0 & 7)) << 4));
    const unsigned char* srca[CA];
    const unsigned char* srcb[CB];
    int sizea[CA], sizeb[CB];
#pragma unroll
    for (int v = 0; v < CA; ++v) {
        const int r = m0 + r0 + v * ROWS_PER_PASS;
        sizea[v] = r < m ? 16 : 0;
        srca[v] = q + (size_t)min(r, m - 1) * kp + c * 16;
    }
#pragma unroll
    for (int v = 0; v < CB; ++v) {
        const int r = n0 + r0 + v * ROWS_PER_PASS;
        sizeb[v] = r < n ? 16 : 0;
        srcb[v] = w + (size_t)min(r, n - 1) * kp + c * 16;
    }
    auto load = [&](unsigned slot) {
        const unsigned sa = base + slot * STAGE + dst, sb = sa + TILE_A;
#pragma unroll
        for (int v = 0; v < CA; ++v) {
            cp_async16(sa + v * ROWS_PER_PASS * 128, srca[v], sizea[v]);
            srca[v] += BK;
        }
#pragma unroll
        for (int v = 0; v < CB; ++v) {
            cp_async16(sb + v * ROWS_PER_PASS * 128, srcb[v], sizeb[v]);
            srcb[v] += BK;
        }
    };
    // The descriptors of slot 0 (this warpgroup's A rows, and B); a slot and a k32 step add
    // their byte offset >> 4 to the start-address field (addresses stay below 2^18, so the
    // field does not carry).
    const unsigned long long da0 = wgmma_desc(base + (unsigned)(wg * 64 * BK)), db0 = wgmma_desc(base + TILE_A);
    // Stage kt's four k32 wgmmas (from `slot`) into `part`, from zero.
    auto issue = [&](unsigned slot, float* part) {
        fence_regs<R>(part);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < BK / 32; ++ks) {
            const unsigned long long off = (slot * STAGE + ks * 32) >> 4;
            wgmma_e4m3<BN>(part, da0 + off, db0 + off, ks);
        }
        wgmma_commit();
    };
    auto add = [&](float* acc, float* part) {
        fence_regs<R>(part);
#pragma unroll
        for (int i = 0; i < R; ++i) acc[i] += part[i];
    };

    float acc[R], part[R];
#pragma unroll
    for (int i = 0; i < R; ++i) acc[i] = 0.f;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < tiles) load((unsigned)s);
        cp_async_commit();
    }
    // The slots stage kt reads and stage kt + STAGES - 1 fills, stepped instead of divided.
    unsigned rslot = 0, wslot = STAGES - 1;
    for (int kt = 0; kt < tiles; ++kt) {
        cp_async_wait<STAGES - 2>();
        fence_proxy_async();
        __syncthreads();
        if (kt + STAGES - 1 < tiles) load(wslot);
        cp_async_commit();
        // Every warpgroup computes, also one whose rows are all past m (zeros, not stored): a
        // wgmma under a per-thread condition makes ptxas serialize every wgmma (C7518).
        issue(rslot, part);
        wgmma_wait<0>();
        add(acc, part);
        rslot = rslot + 1 == STAGES ? 0 : rslot + 1;
        wslot = wslot + 1 == STAGES ? 0 : wslot + 1;
    }
    cp_async_wait<0>();
    if (!active) return;
    const int warp = t >> 5, lane = t & 31;
    const int rb = m0 + wg * 64 + warp * 16 + (lane >> 2);
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = rb + 8 * h;
            if (r >= m) continue;
            const float s = sx[r];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int col = n0 + 8 * j + 2 * (lane & 3) + e;
                if (col < n) y[(size_t)r * ldy + col] = (acc[4 * j + 2 * h + e] * s) * sw[col];
            }
        }
    }
}

// Prefill tiling: MP_W8A8_WGMMA_BM x MP_W8A8_WGMMA_BN tiles, 256 threads, MP_W8A8_WGMMA_STAGES
// stages; grid (ceil(m / BM), ceil(n / BN)), dynamic shared memory MP_W8A8_WGMMA_SMEM bytes.
extern "C" __global__ void __launch_bounds__(256, 1) w8a8_wgmma(const unsigned char* __restrict__ q, const float* __restrict__ sx, int m,
                                                              const unsigned char* __restrict__ w, const float* __restrict__ sw,
                                                              float* __restrict__ y, int n, int kp, int ldy) {
    static_assert(MP_W8A8_WGMMA_BM == 128 && MP_W8A8_WGMMA_BN == 128, "two warpgroups of m64n128");
    static_assert(MP_W8A8_WGMMA_STAGES * (MP_W8A8_WGMMA_BM + MP_W8A8_WGMMA_BN) * MP_W8A8_WGMMA_BK + 1024 <= MP_W8A8_WGMMA_SMEM, "smem");
    w8a8_wgmma_tiles<2, 128, MP_W8A8_WGMMA_STAGES>(q, sx, m, w, sw, y, n, kp, ldy);
}

// Decode tiling (m <= 64): MP_W8A8_WGMMA_SMALL_BM x MP_W8A8_WGMMA_SMALL_BN tiles, 128 threads,
// MP_W8A8_WGMMA_SMALL_STAGES stages, two blocks per multiprocessor; grid (1, ceil(n / BN)),
// dynamic shared memory MP_W8A8_WGMMA_SMALL_SMEM bytes.
extern "C" __global__ void __launch_bounds__(128, 2) w8a8_wgmma_m64(const unsigned char* __restrict__ q, const float* __restrict__ sx, int m,
                                                                  const unsigned char* __restrict__ w, const float* __restrict__ sw,
                                                                  float* __restrict__ y, int n, int kp, int ldy) {
    static_assert(MP_W8A8_WGMMA_SMALL_BM == 64 && MP_W8A8_WGMMA_SMALL_BN == 64, "one warpgroup of m64n64");
    static_assert(MP_W8A8_WGMMA_SMALL_STAGES * (MP_W8A8_WGMMA_SMALL_BM + MP_W8A8_WGMMA_SMALL_BN) * MP_W8A8_WGMMA_BK + 1024 <= MP_W8A8_WGMMA_SMALL_SMEM, "smem");
    w8a8_wgmma_tiles<1, 64, MP_W8A8_WGMMA_SMALL_STAGES>(q, sx, m, w, sw, y, n, kp, ldy);
}

// ---- host-emulated: end ----
