// W8A8 prefill and decode on Hopper's own FP8 matrix path (sm_90a): `wgmma` m64nNk32 e4m3 with f32
// accumulators (SASS QGMMA), both operands in shared memory in the 128-byte swizzle. Same inputs,
// outputs and contract as `w8a8_gemm` (kernels/ffn_w8a8.cu; CPU twin src/gpu/reference.rs
// `w8a8_row`). Two tilings of one computation: `w8a8_wgmma` (prefill: 128 x 128 tiles on a
// persistent grid; one producer warpgroup fills the stages with the bulk tensor copy engine
// (TMA, `cp.async.bulk.tensor`) on mbarriers, two consumer warpgroups run the wgmmas) and
// `w8a8_wgmma_m64` (64 x 64 tiles, one warpgroup filling its own stages with cp.async, m <= 64:
// twice the blocks of the weight for decode).
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

// A tensor map (CUtensorMap, 128 bytes, 64-byte aligned) made by the host with
// cuTensorMapEncodeTiled and passed by value as a __grid_constant__ parameter (src/gpu/cuda.rs
// `encode_tmap`; the table's `t` kind).
struct __align__(64) MpTmap {
    unsigned long long opaque[16];
};
// mbarrier (PTX ISA "Parallel Synchronization and Communication Instructions: mbarrier"): a
// 64-bit shared-memory object with an arrival count and a transaction (byte) count; a phase
// completes when both reach zero, and `try_wait.parity P` is true once the phase of parity P
// has completed.
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialized barriers visible to the other threads and to the async proxy (TMA).
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrive, and expect `bytes` more of transaction (the TMA copies complete them).
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n.reg .pred p;\nMP_WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra MP_WAIT;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}
__device__ __forceinline__ void tmap_prefetch(const MpTmap* map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"((unsigned long long)map) : "memory");
}
// The box at (byte c0, row c1) of `map` into shared memory at `dst`, in the map's swizzle; rows
// and bytes past the tensor are written as zeros. Completes its bytes on mbarrier `bar`.
__device__ __forceinline__ void tma_load_2d(unsigned dst, const MpTmap* map, int c0, int c1, unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
        "l"((unsigned long long)map), "r"(bar), "r"(c0), "r"(c1)
        : "memory");
}
// Hand registers back (producer) or take them (consumers); every thread of the warpgroup.
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }
// The warpgroup index as a value the compiler knows is warp-uniform (a wgmma under a condition
// it cannot prove uniform is serialized, C7518).
__device__ __forceinline__ int warpgroup_index() { return __shfl_sync(0xffffffffu, (int)(threadIdx.x >> 7), 0); }

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

// One 128-k stage's four k32 wgmmas into `part`, from zero: A and B `off` bytes past the
// descriptors da and db (the stage's slot; a k32 step is 32 bytes further along the swizzled
// row), committed as one group. Both tilings issue their stages through it.
template <int BN>
__device__ __forceinline__ void wgmma_stage(float* part, unsigned long long da, unsigned long long db, unsigned off) {
    fence_regs<BN / 2>(part);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < MP_W8A8_WGMMA_BK / 32; ++ks) {
        const unsigned long long o = (off + ks * 32) >> 4;
        wgmma_e4m3<BN>(part, da + o, db + o, ks);
    }
    wgmma_commit();
}

// The epilogue: y[r, j] = (acc * sx[r]) * sw[j] for this thread's outputs of the 64 x BN
// warpgroup tile at rows r0.., columns n0.. (thread t of the warpgroup), rows past m and columns
// past n not stored.
template <int BN>
__device__ __forceinline__ void w8a8_wgmma_store(const float* acc, int t, int r0, const float* __restrict__ sx, int m, int n0,
                                                 const float* __restrict__ sw, float* __restrict__ y, int n, int ldy) {
    const int warp = t >> 5, lane = t & 31;
    const int rb = r0 + warp * 16 + (lane >> 2);
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = rb + 8 * h;
            if (r >= m) continue;
            const float s = sx[r];
            const int col = n0 + 8 * j + 2 * (lane & 3);
            float* yr = y + (size_t)r * ldy + col;
            // The thread's two neighbouring columns in one 8-byte store where both exist and the
            // address is 8-byte aligned, else one by one.
            if (col + 1 < n && (reinterpret_cast<size_t>(yr) & 7) == 0) {
                *reinterpret_cast<float2*>(yr) = make_float2((acc[4 * j + 2 * h] * s) * sw[col], (acc[4 * j + 2 * h + 1] * s) * sw[col + 1]);
            } else {
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (col + e < n) yr[e] = (acc[4 * j + 2 * h + e] * s) * sw[col + e];
            }
        }
    }
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
        wgmma_stage<BN>(part, da0, db0, rslot * STAGE);
        wgmma_wait<0>();
        add(acc, part);
        rslot = rslot + 1 == STAGES ? 0 : rslot + 1;
        wslot = wslot + 1 == STAGES ? 0 : wslot + 1;
    }
    cp_async_wait<0>();
    if (!active) return;
    w8a8_wgmma_store<BN>(acc, t, m0 + wg * 64, sx, m, n0, sw, y, n, ldy);
}

// Prefill tiling, warp-specialized on a persistent grid: MP_W8A8_WGMMA_BM x MP_W8A8_WGMMA_BN
// tiles, MP_W8A8_WGMMA_THREADS threads (warpgroup 0 the producer, warpgroups 1..NC the consumers
// of rows 0-63, 64-127, ...), MP_W8A8_WGMMA_STAGES stages; grid min(tiles, multiprocessors),
// block b taking tiles b, b + gridDim.x, ... in the order t -> (m tile t % mtiles, n tile
// t / mtiles), so the blocks in flight share weight tiles; dynamic shared memory
// MP_W8A8_WGMMA_SMEM bytes: the stages (A then B, 1024-aligned), the output tile (BM rows of
// BN + MP_W8A8_WGMMA_EPI_PAD f32), then the stages' `full` and `empty` mbarriers and the output
// tile's `epi_full` and `epi_empty`.
//
// Per stage s (slot s % STAGES, its use count u = s / STAGES): the producer thread waits until
// `empty` has completed phase u - 1 (the consumers are done reading the slot's last use), arms
// `full` with the stage's bytes and issues the two box copies (the activations' BM rows of 128
// k bytes, the weights' BN rows), which complete `full`'s phase u. Each consumer waits for that
// phase, issues its four k32 wgmmas into the partial accumulator, waits for them, arrives on
// `empty` (every consumer thread) and adds the partial into its f32 total: the same sums in
// the same order as the cp.async tiling. The producer runs up to STAGES stages ahead, across
// tile boundaries, so the next tile's copies overlap this tile's last stages and its stores.
//
// The stores are the producer warpgroup's other three warps' (the storers): at the end of a
// tile each consumer waits for `epi_empty` (the storers are done with the previous tile), writes
// its totals into the output tile in shared memory and arrives on `epi_full`, then starts the
// next tile; the storers scale the tile, y = (total * sx[r]) * sw[j] (w8a8_gemm's order), and
// write it 16 bytes a thread, while the consumers already run the next tile's wgmmas. (The
// row padding makes the consumers' 8-byte writes free of bank conflicts: a half-warp's four rows
// of 8 words start 8 banks apart.)
// (Two partials in turn, the next stage issued before this one is waited for, make ptxas
// serialize every wgmma: a partial read while the other's wgmmas are pending, C7514.)
//
// BLOCK (fp8_wgmma, the FP8 arm's W8A8 prefill): sx holds per-group activation scales [m, kp /
// 128] and sw the weight's block scales [np / 128, kp / 128], so stage kt's sum is scaled by
// sx[r, kt] * sw[n0 / 128, kt] as it is added (one FMA per output), and the stored tile is the
// total as it is (BN = 128 tiles are the weight's 128-row scale blocks).
template <int NC, int BN, int STAGES, bool BLOCK>
__device__ __forceinline__ void w8a8_wgmma_ws(const MpTmap* qmap, const float* __restrict__ sx, int m, const MpTmap* wmap,
                                              const float* __restrict__ sw, float* __restrict__ y, int n, int kp, int ldy) {
    constexpr int BM = 64 * NC, BK = MP_W8A8_WGMMA_BK, R = BN / 2;
    constexpr int TILE_A = BM * BK, STAGE = (BM + BN) * BK, LD = BN + MP_W8A8_WGMMA_EPI_PAD, STORERS = 96;
    const unsigned base = (smem_addr(w8a8_wgmma_smem) + 1023u) & ~1023u;
    float* epi = reinterpret_cast<float*>(w8a8_wgmma_smem + (base - smem_addr(w8a8_wgmma_smem)) + STAGES * STAGE);
    const unsigned full = base + STAGES * STAGE + BM * LD * 4, empty = full + 8 * STAGES;
    const unsigned epi_full = empty + 8 * STAGES, epi_empty = epi_full + 8;
    const int wg = warpgroup_index(), t = threadIdx.x & 127;
    const int mtiles = (m + BM - 1) / BM, tiles = mtiles * ((n + BN - 1) / BN), ktiles = kp / BK;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full + 8 * s, 1);
            mbar_init(empty + 8 * s, 128 * NC);
        }
        mbar_init(epi_full, 128 * NC);
        mbar_init(epi_empty, STORERS);
        mbar_init_fence();
    }
    __syncthreads();
    if (wg == 0) {
        setmaxnreg_dec<MP_W8A8_WGMMA_PRODUCER_REGS>();
        if (t >= 128 - STORERS) {
            // Storer st: the 4 columns 4 (st % (BN / 4)) .. of every (STORERS / (BN / 4))-th row
            // from row st / (BN / 4); a warp writes 512 contiguous bytes of one row.
            constexpr int QUADS = BN / 4, RSTEP = STORERS / QUADS;
            static_assert(STORERS % QUADS == 0, "whole rows per pass");
            const int st = t - (128 - STORERS), c4 = st % QUADS, row0 = st / QUADS;
            unsigned ep = 0;
            for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
                const int m0 = (tile % mtiles) * BM, col = (tile / mtiles) * BN + 4 * c4;
                const int rows = min(BM, m - m0);
                // The column scales before the wait (they do not depend on the tile's totals).
                float w4[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) w4[e] = !BLOCK && col + e < n ? sw[col + e] : 0.f;
                mbar_wait(epi_full, ep);
                if (col < n) {
                    const bool vec = col + 3 < n && ((reinterpret_cast<size_t>(y + col) | ((size_t)ldy * 4)) & 15) == 0;
#pragma unroll 4
                    for (int row = row0; row < rows; row += RSTEP) {
                        const float4 v = *reinterpret_cast<const float4*>(epi + row * LD + 4 * c4);
                        float* yr = y + (size_t)(m0 + row) * ldy + col;
                        float o[4] = {v.x, v.y, v.z, v.w};
                        if (!BLOCK) {
                            const float s = sx[m0 + row];
#pragma unroll
                            for (int e = 0; e < 4; ++e) o[e] = (o[e] * s) * w4[e];
                        }
                        if (vec) {
                            *reinterpret_cast<float4*>(yr) = make_float4(o[0], o[1], o[2], o[3]);
                        } else {
#pragma unroll
                            for (int e = 0; e < 4; ++e)
                                if (col + e < n) yr[e] = o[e];
                        }
                    }
                }
                mbar_arrive(epi_empty);
                ep ^= 1;
            }
            return;
        }
        if (t != 0) return;
        tmap_prefetch(qmap);
        tmap_prefetch(wmap);
        unsigned slot = 0, phase = 0;
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            const int m0 = (tile % mtiles) * BM, n0 = (tile / mtiles) * BN;
            for (int kt = 0; kt < ktiles; ++kt) {
                // A fresh barrier's "previous phase" (parity 1) counts as complete: the first
                // STAGES waits pass at once.
                mbar_wait(empty + 8 * slot, phase ^ 1);
                const unsigned dst = base + slot * STAGE;
                mbar_arrive_expect_tx(full + 8 * slot, STAGE);
                tma_load_2d(dst, qmap, kt * BK, m0, full + 8 * slot);
                tma_load_2d(dst + TILE_A, wmap, kt * BK, n0, full + 8 * slot);
                if (++slot == STAGES) {
                    slot = 0;
                    phase ^= 1;
                }
            }
        }
        return;
    }
    setmaxnreg_inc<MP_W8A8_WGMMA_CONSUMER_REGS>();
    const int c = wg - 1;
    const unsigned long long da0 = wgmma_desc(base + (unsigned)(c * 64 * BK)), db0 = wgmma_desc(base + TILE_A);
    float acc[R], part[R];
    unsigned slot = 0, phase = 0, ep = 0;
    // This thread's place in the output tile (the wgmma accumulator layout).
    const int warp = t >> 5, lane = t & 31;
    float* erow = epi + (c * 64 + warp * 16 + (lane >> 2)) * LD + 2 * (lane & 3);
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        // BLOCK: this thread's two rows (clamped: rows past m compute, but are not stored) and
        // the tile's scale-block row.
        const int ra = min((tile % mtiles) * BM + c * 64 + warp * 16 + (lane >> 2), m - 1), rb = min(ra + 8, m - 1);
        const float* sxa = sx + (size_t)ra * ktiles;
        const float* sxb = sx + (size_t)rb * ktiles;
        const float* swt = sw + (size_t)((tile / mtiles) * BN / 128) * ktiles;
#pragma unroll
        for (int i = 0; i < R; ++i) acc[i] = 0.f;
        for (int kt = 0; kt < ktiles; ++kt) {
            float fa = 1.f, fb = 1.f;
            if (BLOCK) {
                const float f = swt[kt];
                fa = sxa[kt] * f;
                fb = sxb[kt] * f;
            }
            mbar_wait(full + 8 * slot, phase);
            wgmma_stage<BN>(part, da0, db0, slot * STAGE);
            wgmma_wait<0>();
            fence_regs<R>(part);
            mbar_arrive(empty + 8 * slot);
            if (BLOCK) {
                // d[4 j + 2 h + e] is row 8 h further: index bit 1 picks the row's scale.
#pragma unroll
                for (int i = 0; i < R; ++i) acc[i] = fmaf(part[i], (i & 2) ? fb : fa, acc[i]);
            } else {
#pragma unroll
                for (int i = 0; i < R; ++i) acc[i] += part[i];
            }
            if (++slot == STAGES) {
                slot = 0;
                phase ^= 1;
            }
        }
        mbar_wait(epi_empty, ep ^ 1);
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                *reinterpret_cast<float2*>(erow + 8 * h * LD + 8 * j) = make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
        mbar_arrive(epi_full);
        ep ^= 1;
    }
}

// `q` and `w` are tensor maps of the activation codes [m, kp] and the weight codes [n, kp]: u8,
// box 128 bytes x MP_W8A8_WGMMA_BM (resp. _BN) rows, 128-byte swizzle (the table's `t` rule).
extern "C" __global__ void __launch_bounds__(MP_W8A8_WGMMA_THREADS, 1) w8a8_wgmma(const __grid_constant__ MpTmap q, const float* __restrict__ sx, int m,
                                                                                const __grid_constant__ MpTmap w, const float* __restrict__ sw,
                                                                                float* __restrict__ y, int n, int kp, int ldy) {
    constexpr int NC = MP_W8A8_WGMMA_BM / 64;
    static_assert(MP_W8A8_WGMMA_BN == 128 && MP_W8A8_WGMMA_THREADS == 128 * (NC + 1), "NC consumer warpgroups of m64n128");
    static_assert(MP_W8A8_WGMMA_STAGES * (MP_W8A8_WGMMA_BM + MP_W8A8_WGMMA_BN) * MP_W8A8_WGMMA_BK +
                          MP_W8A8_WGMMA_BM * (MP_W8A8_WGMMA_BN + MP_W8A8_WGMMA_EPI_PAD) * 4 + 1024 + 16 * MP_W8A8_WGMMA_STAGES + 16 <=
                      MP_W8A8_WGMMA_SMEM,
                  "smem");
    static_assert(MP_W8A8_WGMMA_PRODUCER_REGS % 8 == 0 && MP_W8A8_WGMMA_CONSUMER_REGS % 8 == 0 &&
                      128 * (MP_W8A8_WGMMA_PRODUCER_REGS + NC * MP_W8A8_WGMMA_CONSUMER_REGS) <= 65536,
                  "setmaxnreg: multiples of 8 within the register file");
    w8a8_wgmma_ws<NC, 128, MP_W8A8_WGMMA_STAGES, false>(&q, sx, m, &w, sw, y, n, kp, ldy);
}

// The FP8 arm's W8A8 prefill (formats.md, "FP8 weights with FP8 activations"): q [m, kp] e4m3
// activation codes with per-group scales sx [m, kp / 128] (quantize_act_fp8_g128), w the fp8
// layout's codes [np, kp] with block scales s [np / 128, kp / 128];
// y[r, j] = sum_kt stage_sum(r, j, kt) * (sx[r, kt] * s[j / 128, kt]), accumulated by FMA in stage
// order. Tiling, grid and shared memory as w8a8_wgmma.
extern "C" __global__ void __launch_bounds__(MP_W8A8_WGMMA_THREADS, 1) fp8_wgmma(const __grid_constant__ MpTmap q, const float* __restrict__ sx, int m, const __grid_constant__ MpTmap w, const float* __restrict__ s, float* __restrict__ y, int n, int kp, int ldy) {
    static_assert(MP_W8A8_WGMMA_BN == 128, "one tile column per weight scale block");
    w8a8_wgmma_ws<MP_W8A8_WGMMA_BM / 64, 128, MP_W8A8_WGMMA_STAGES, true>(&q, sx, m, &w, s, y, n, kp, ldy);
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
