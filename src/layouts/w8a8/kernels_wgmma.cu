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
#include "wgmma.cuh"

// ---- host-emulated: begin (tests/cuda_emu.rs runs these kernels on stand-ins for wgmma.cuh's PTX) ----

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

// How the storers turn a finished tile's totals into outputs.
enum WgEpi { WG_EPI_ROW_COL, WG_EPI_AS_IS, WG_EPI_SCALAR };

// The storers of the warp-specialized kernels (the producer warpgroup's last NS threads; st their
// index): for each tile of this block, wait on `epi_full`, write the BM x BN tile from shared
// memory (row stride BN + MP_W8A8_WGMMA_EPI_PAD f32) to y, then arrive on `epi_empty`. Storer st
// takes the 4 columns 4 (st % (BN / 4)) .. of every (NS / (BN / 4))-th row from row
// st / (BN / 4); a warp writes 512 contiguous bytes of one row. EPI: WG_EPI_ROW_COL
// y = (total * sx[r]) * sw[j] (w8a8_gemm's order), WG_EPI_AS_IS y = total, WG_EPI_SCALAR
// y = total * g.
template <int BM, int BN, int EPI, int NS>
__device__ __forceinline__ void wgmma_storers(int st, const float* epi, unsigned epi_full, unsigned epi_empty, int m, int n, int mtiles,
                                              int tiles, const float* __restrict__ sx, const float* __restrict__ sw, float g,
                                              float* __restrict__ y, int ldy) {
    constexpr int QUADS = BN / 4, RSTEP = NS / QUADS, LD = BN + MP_W8A8_WGMMA_EPI_PAD;
    static_assert(NS % QUADS == 0, "whole rows per pass");
    const int c4 = st % QUADS, row0 = st / QUADS;
    unsigned ep = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int m0 = (tile % mtiles) * BM, col = (tile / mtiles) * BN + 4 * c4;
        const int rows = min(BM, m - m0);
        // The column scales before the wait (they do not depend on the tile's totals).
        float w4[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) w4[e] = EPI == WG_EPI_ROW_COL && col + e < n ? sw[col + e] : g;
        mbar_wait(epi_full, ep);
        if (col < n) {
            const bool vec = col + 3 < n && ((reinterpret_cast<size_t>(y + col) | ((size_t)ldy * 4)) & 15) == 0;
#pragma unroll 4
            for (int row = row0; row < rows; row += RSTEP) {
                const float4 v = *reinterpret_cast<const float4*>(epi + row * LD + 4 * c4);
                float* yr = y + (size_t)(m0 + row) * ldy + col;
                float o[4] = {v.x, v.y, v.z, v.w};
                if (EPI == WG_EPI_ROW_COL) {
                    const float s = sx[m0 + row];
#pragma unroll
                    for (int e = 0; e < 4; ++e) o[e] = (o[e] * s) * w4[e];
                } else if (EPI == WG_EPI_SCALAR) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) o[e] = o[e] * w4[e];
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
}

// A consumer's hand-over of a finished tile to the storers: wait until they are done with the
// previous one (`epi_empty`), write this thread's totals (the wgmma accumulator layout, as f32)
// into the shared output tile at `erow` (row stride LD), arrive on `epi_full`.
template <int BN, int LD, class T>
__device__ __forceinline__ void wgmma_hand_over(float* erow, const T* acc, unsigned epi_full, unsigned epi_empty, unsigned& ep) {
    mbar_wait(epi_empty, ep ^ 1);
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            *reinterpret_cast<float2*>(erow + 8 * h * LD + 8 * j) = make_float2((float)acc[4 * j + 2 * h], (float)acc[4 * j + 2 * h + 1]);
    mbar_arrive(epi_full);
    ep ^= 1;
}

// The int8 consumers (int8_wgmma): per stage the four k32 s8 wgmmas accumulate into one s32
// total (exact), the total carried across stages in the accumulator itself; at the end of a tile
// the totals go to the output tile as f32 (exact below 2^24 in magnitude; beyond, rounded once,
// as the mma.sync kernel's (float) conversion does).
template <int STAGES>
__device__ __forceinline__ void w8a8_wgmma_int8_consumer(int c, unsigned long long da0, unsigned long long db0, unsigned full,
                                                         unsigned empty, float* epi, unsigned epi_full, unsigned epi_empty, int mtiles,
                                                         int tiles, int ktiles) {
    constexpr int BN = 128, R = BN / 2, BM = MP_W8A8_WGMMA_BM, BK = MP_W8A8_WGMMA_BK, STAGE = (BM + BN) * BK;
    constexpr int LD = BN + MP_W8A8_WGMMA_EPI_PAD;
    const int t = threadIdx.x & 127, warp = t >> 5, lane = t & 31;
    float* erow = epi + (c * 64 + warp * 16 + (lane >> 2)) * LD + 2 * (lane & 3);
    int acc[R];
    unsigned slot = 0, phase = 0, ep = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        for (int kt = 0; kt < ktiles; ++kt) {
            mbar_wait(full + 8 * slot, phase);
            fence_regs<R>(acc);
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < BK / 32; ++ks) {
                const unsigned long long o = (slot * STAGE + ks * 32) >> 4;
                wgmma_s8_n128(acc, da0 + o, db0 + o, kt | ks);
            }
            wgmma_commit();
            wgmma_wait<0>();
            fence_regs<R>(acc);
            mbar_arrive(empty + 8 * slot);
            if (++slot == STAGES) {
                slot = 0;
                phase ^= 1;
            }
        }
        wgmma_hand_over<BN, LD>(erow, acc, epi_full, epi_empty, ep);
    }
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
template <int NC, int BN, int STAGES, bool BLOCK, bool INT8 = false>
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
            wgmma_storers<BM, BN, BLOCK ? WG_EPI_AS_IS : WG_EPI_ROW_COL, STORERS>(t - (128 - STORERS), epi, epi_full, epi_empty, m, n, mtiles,
                                                                               tiles, sx, sw, 1.f, y, ldy);
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
    if constexpr (INT8) {
        static_assert(BN == 128 && !BLOCK, "int8: m64n128k32 wgmmas, row and column scales");
        w8a8_wgmma_int8_consumer<STAGES>(c, da0, db0, full, empty, epi, epi_full, epi_empty, mtiles, tiles, ktiles);
        return;
    }
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
        wgmma_hand_over<BN, LD>(erow, acc, epi_full, epi_empty, ep);
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

// The Q4_K arm's int8 down GEMM on the tensor-core path: aq [m, kp] int8 activation codes with
// row scales sa [m] (requant_a_bf16_int8), wq [n, kp] int8 weight codes with row scales sw [n];
// y[r, j] = ((float)sum_i aq[r, i] wq[j, i] * sa[r]) * sw[j], the sum exact in s32: the bits of
// q4k_mmq_int8_down_gemm. Tiling, grid and shared memory as w8a8_wgmma; `aq` and `wq` are tensor
// maps of the same rule.
extern "C" __global__ void __launch_bounds__(MP_W8A8_WGMMA_THREADS, 1) int8_wgmma(const __grid_constant__ MpTmap aq, const float* __restrict__ sa, int m, const __grid_constant__ MpTmap wq, const float* __restrict__ sw, float* __restrict__ y, int n, int kp, int ldy) {
    w8a8_wgmma_ws<MP_W8A8_WGMMA_BM / 64, 128, MP_W8A8_WGMMA_STAGES, false, true>(&aq, sa, m, &wq, sw, y, n, kp, ldy);
}

// ---- The dequantizing wgmma GEMMs (nvfp4_wgmma, q4k_wgmma): bf16 x bf16 on the tensor cores ----
// A (activations, bf16 [m, k] in the il8 order: f32_to_bf16_il8, act_mul_*_il8) comes by TMA as in w8a8_wgmma (64 bf16 =
// one 128-byte swizzle row per k stage); B (the weights) is decoded straight into the stage's
// swizzled rows by two warpgroups of decoders, one weight row per thread, taking every other
// stage each, from registers loaded two of their stages ahead. Block: MP_DQ_WGMMA_THREADS = 512
// threads: warpgroups 0 and 1 the decoders (thread 0 of each also issues its stages' A copy),
// 2 and 3 the consumers of rows 0-63 and 64-127 (four m64n128k16 wgmmas per stage into f32
// accumulators carried across the stages, the next stage issued before the previous one is
// waited for, the totals stored straight from the accumulators). Tiles 128 x 128,
// MP_DQ_WGMMA_STAGES stages, a persistent grid and tile order as w8a8_wgmma; a stage's `full`
// barrier completes when its A bytes have landed and the decoders' 4 warps have arrived.

// The decoders' view of an `nvfp4_mmq` weight (tiles of 128 rows x 64 k: scales[128][4] E4M3,
// then codes[128][32], n-tile major): a k stage is one tile. Values are E2M1 * e4m3(s) * 2^-8,
// exact in bf16 (the w4a16 GEMVs' e2m1x8_bf16 code placement, in k order); the kernel scales
// the totals by 2^8 g.
struct DqNvfp4 {
    const unsigned char* tiles;
    int ktiles;
    struct Raw {
        uint4 c0, c1;
        unsigned s;
    };
    __device__ __forceinline__ Raw load(int n0, int row, int kt) const {
        const unsigned char* tp = tiles + ((size_t)(n0 / MP_NVFP4_MMQ_TILE_N) * ktiles + kt) * MP_NVFP4_MMQ_TILE_BYTES;
        const uint4* c = reinterpret_cast<const uint4*>(tp + MP_NVFP4_MMQ_TILE_N * 4 + row * 32);
        return Raw{__ldg(c), __ldg(c + 1), __ldg(reinterpret_cast<const unsigned*>(tp + row * 4))};
    }
    // The 64 values of a row as 8 chunks of 8 bf16 in the il8 order (formats.md, "The
    // dequantizing wgmma GEMMs": chunk c holds k = 8c + (0, 4, 1, 5, 2, 6, 3, 7)): word c holds
    // the codes of k = 8c + j in bits 4j .. 4j + 3, so codes j and j + 4 sit 16 bits apart and
    // one mask places both; a code becomes the bf16 bits ((c & 7) << 6) | ((c & 8) << 12) =
    // E2M1[c] * 2^-126, times the group's scale * 2^118 (the w4a16 GEMVs' e2m1x8_bf16).
    __device__ __forceinline__ void decode(const Raw& r, uint4 (&out)[8]) const {
        const unsigned w[8] = {r.c0.x, r.c0.y, r.c0.z, r.c0.w, r.c1.x, r.c1.y, r.c1.z, r.c1.w};
        unsigned s2[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const float v = e4m3_to_f32((r.s >> (8 * q)) & 0xffu) * 0x1p118f;
            s2[q] = pack2_bf16(v, v);
        }
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            const unsigned x = w[c], x8 = x >> 8, s = s2[c >> 1];
            out[c] = make_uint4(bf16x2_mul((x & 0x00070007u) * 64u + ((x & 0x00080008u) << 12), s),
                                bf16x2_mul((x & 0x00700070u) * 4u + ((x & 0x00800080u) << 8), s),
                                bf16x2_mul((x8 & 0x00070007u) * 64u + ((x8 & 0x00080008u) << 12), s),
                                bf16x2_mul((x8 & 0x00700070u) * 4u + ((x8 & 0x00800080u) << 8), s));
        }
    }
};

// The decoders' view of Q4_K rows ([n, kp / 256] blocks of 144 bytes: f16 d, f16 dmin, 12
// bytes of 6-bit scales and mins, 128 bytes of nibbles): k stage kt is chunk kt % 4 of block
// kt / 4, its 32 `qs` bytes holding sub-block 2c in the low nibbles (k 0..31) and 2c + 1 in
// the high ones (k 32..63). Contract (formats.md, "Q4_K on the bf16 tensor-core path"):
// d1 = bf16(f32(d) * sc), m1 = bf16(f32(dmin) * m), w = bf16(q * d1 - m1) rounded once (an
// exact bf16 fma: q is exact as 128 + q minus 128). Rows past n repeat row n - 1 (not stored).
struct DqQ4k {
    const unsigned char* w;
    int n, blocks;
    struct Raw {
        uint4 head, q0, q1;
        int c;
    };
    __device__ __forceinline__ Raw load(int n0, int row, int kt) const {
        const unsigned char* b = w + ((size_t)min(n0 + row, n - 1) * blocks + kt / 4) * MP_Q4K_BYTES;
        const uint4* q = reinterpret_cast<const uint4*>(b + 16 + 32 * (kt & 3));
        return Raw{__ldg(reinterpret_cast<const uint4*>(b)), __ldg(q), __ldg(q + 1), kt & 3};
    }
    __device__ __forceinline__ void decode(const Raw& r, uint4 (&out)[8]) const {
        const float d = __half2float(__ushort_as_half((unsigned short)(r.head.x & 0xffffu)));
        const float dmin = __half2float(__ushort_as_half((unsigned short)(r.head.x >> 16)));
        unsigned dd[2], mm[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            int sc, mn;
            scale_min_k4_head(2 * r.c + h, r.head, &sc, &mn);
            dd[h] = pack2_bf16(d * (float)sc, d * (float)sc);
            const float m1 = -(dmin * (float)mn);
            mm[h] = pack2_bf16(m1, m1);
        }
        const unsigned w[8] = {r.q0.x, r.q0.y, r.q0.z, r.q0.w, r.q1.x, r.q1.y, r.q1.z, r.q1.w};
        const unsigned one = 0x3f803f80u, m128 = 0xc300c300u;  // bf16 pairs (1, 1), (-128, -128)
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            // Chunk c: k 8c .. 8c + 7, the low nibbles of qs bytes 8c .. (c < 4) or the high
            // nibbles of bytes 8 (c - 4) .. (c >= 4), in the il8 order: pair j is the values of
            // bytes j and j + 4 of the chunk's 8 (one in each of its two words).
            const int h = c >> 2;
            const unsigned xa = w[2 * (c & 3)] >> (4 * h), xb = w[2 * (c & 3) + 1] >> (4 * h);
            unsigned p[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const unsigned t = __byte_perm(xa, xb, (unsigned)(j | ((4 + j) << 8)));
                const unsigned v = (t & 0x000f000fu) | 0x43004300u;  // bf16 pair (128 + q0, 128 + q1)
                p[j] = bf16x2_fma(bf16x2_fma(v, one, m128), dd[h], mm[h]);
            }
            out[c] = make_uint4(p[0], p[1], p[2], p[3]);
        }
    }
};

template <class DEC>
__device__ __forceinline__ void dq_wgmma_ws(const MpTmap* xmap, int m, const DEC dec, float g, float* __restrict__ y, int n, int kp,
                                            int ldy) {
    constexpr int BM = MP_DQ_WGMMA_BM, BN = MP_DQ_WGMMA_BN, BK = 128, STAGES = MP_DQ_WGMMA_STAGES, R = BN / 2;
    constexpr int TILE_A = BM * BK, STAGE = (BM + BN) * BK;
    static_assert(BM == 128 && BN == 128, "two consumer warpgroups of m64n128, one decoder per weight row");
    static_assert(STAGES % 2 == 0, "each decoder warpgroup owns every other slot");
    const unsigned base = (smem_addr(w8a8_wgmma_smem) + 1023u) & ~1023u;
    unsigned char* gbase = w8a8_wgmma_smem + (base - smem_addr(w8a8_wgmma_smem));
    const unsigned full = base + STAGES * STAGE, empty = full + 8 * STAGES;
    const int wg = warpgroup_index(), t = threadIdx.x & 127, lane = t & 31;
    const int mtiles = (m + BM - 1) / BM, tiles = mtiles * ((n + BN - 1) / BN), ktiles = kp / 64;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            // The decoders' 4 warps, and their first thread's expect_tx for the A copy.
            mbar_init(full + 8 * s, 4 + 1);
            // One arrival per consumer warpgroup.
            mbar_init(empty + 8 * s, 2);
        }
        mbar_init_fence();
    }
    __syncthreads();
    if (wg < 2) {
        // Decoder warpgroup d (= wg) owns the stages s = d, d + 2, ... of this block's (tile, k
        // stage) sequence: slots d, d + 2, ...; thread t decodes weight row n0 + t of each,
        // its raw bytes loaded two of its stages ahead, and thread 0 also issues the stage's A copy.
        const int d = wg;
        // This block's stages, and this warpgroup's share of them.
        const int mine = (int)(((long long)(tiles - (int)blockIdx.x + (int)gridDim.x - 1) / gridDim.x) * ktiles);
        const int count = mine > d ? (mine - d + 1) / 2 : 0;
        // A stage's place (k stage, m tile, n tile), stepped two stages at a time without a
        // division per step (a tile step adds gridDim.x = gq mtiles + gm).
        const int gq = (int)gridDim.x / mtiles, gm = (int)gridDim.x % mtiles;
        struct Pos {
            int kt, mt, nt;
        };
        auto settle = [&](Pos& p) {
            while (p.kt >= ktiles) {
                p.kt -= ktiles;
                p.mt += gm;
                p.nt += gq;
                if (p.mt >= mtiles) {
                    p.mt -= mtiles;
                    ++p.nt;
                }
            }
        };
        Pos lp{d, (int)blockIdx.x % mtiles, (int)blockIdx.x / mtiles};
        settle(lp);
        Pos sp = lp;
        int fetched = 0;
        auto fetch = [&](typename DEC::Raw& r) {
            if (fetched == count) return;
            r = dec.load(lp.nt * BN, t, lp.kt);
            lp.kt += 2;
            settle(lp);
            ++fetched;
        };
        if (t == 0) tmap_prefetch(xmap);
        typename DEC::Raw r0{}, r1{};
        fetch(r0);
        fetch(r1);
        unsigned char* brow = gbase + TILE_A + t * BK;
        unsigned slot = (unsigned)d, phase = 0;
        for (int i = 0; i < count; ++i) {
            typename DEC::Raw r2{};
            fetch(r2);
            uint4 o[8];
            dec.decode(r0, o);
            mbar_wait(empty + 8 * slot, phase ^ 1);
            if (t == 0) {
                mbar_arrive_expect_tx(full + 8 * slot, TILE_A);
                tma_load_2d(base + slot * STAGE, xmap, sp.kt * BK, sp.mt * BM, full + 8 * slot);
            }
            sp.kt += 2;
            settle(sp);
#pragma unroll
            for (int c = 0; c < 8; ++c) *reinterpret_cast<uint4*>(brow + slot * STAGE + ((c ^ (t & 7)) << 4)) = o[c];
            // Each thread's writes made visible to the tensor cores' (async) proxy, then one
            // arrival per warp.
            fence_proxy_async();
            __syncwarp();
            if (lane == 0) mbar_arrive(full + 8 * slot);
            r0 = r1;
            r1 = r2;
            slot += 2;
            if (slot >= (unsigned)STAGES) {
                slot -= STAGES;
                phase ^= 1;
            }
        }
        return;
    }
    const int c = wg - 2, warp = t >> 5;
    const unsigned long long da0 = wgmma_desc(base + (unsigned)(c * 64 * BK)), db0 = wgmma_desc(base + TILE_A);
    float acc[R];
    unsigned slot = 0, phase = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        unsigned prev = 0;
        for (int kt = 0; kt < ktiles; ++kt) {
            mbar_wait(full + 8 * slot, phase);
            fence_regs<R>(acc);
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < BK / 32; ++ks) {
                const unsigned long long o = (slot * STAGE + ks * 32) >> 4;
                wgmma_bf16_n128(acc, da0 + o, db0 + o, kt | ks);
            }
            wgmma_commit();
            // The previous stage's wgmmas are done once at most this one is pending: its slot
            // goes back to the decoders (wait_group is warpgroup-wide: one arrival).
            wgmma_wait<1>();
            fence_regs<R>(acc);
            if (kt > 0 && t == 0) mbar_arrive(empty + 8 * prev);
            prev = slot;
            if (++slot == STAGES) {
                slot = 0;
                phase ^= 1;
            }
        }
        wgmma_wait<0>();
        fence_regs<R>(acc);
        if (t == 0) mbar_arrive(empty + 8 * prev);
        // The stores straight from the accumulators: two neighbouring columns per 8-byte store
        // (a warp's quarter covers 32 contiguous bytes of a row).
        const int r0 = (tile % mtiles) * BM + c * 64 + warp * 16 + (lane >> 2), n0 = (tile / mtiles) * BN;
        const bool vec = ((reinterpret_cast<size_t>(y) | ((size_t)ldy * 4)) & 7) == 0;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = r0 + 8 * h, col = n0 + 8 * j + 2 * (lane & 3);
                if (r >= m || col >= n) continue;
                float* yr = y + (size_t)r * ldy + col;
                const float v0 = acc[4 * j + 2 * h] * g, v1 = acc[4 * j + 2 * h + 1] * g;
                if (vec && col + 1 < n) {
                    *reinterpret_cast<float2*>(yr) = make_float2(v0, v1);
                } else {
                    yr[0] = v0;
                    if (col + 1 < n) yr[1] = v1;
                }
            }
    }
}

// The NVFP4 prefill over `nvfp4_mmq` tiles: x a tensor map of the il8 bf16 activations [m, k] (box
// 64 x MP_DQ_WGMMA_BM, 128-byte swizzle), tiles as nvfp4_mmq_gemm's, np = n rounded up to 128,
// kp % 64 == 0. Same numerics as w4a16_gemm: exact bf16 weights, bf16 activations, f32
// accumulation, y = total * 2^8 g. Grid min(tiles, multiprocessors), block MP_DQ_WGMMA_THREADS,
// dynamic shared memory MP_DQ_WGMMA_SMEM.
extern "C" __global__ void __launch_bounds__(MP_DQ_WGMMA_THREADS, 1) nvfp4_wgmma(const __grid_constant__ MpTmap x, int m, const unsigned char* __restrict__ tiles, float g, float* __restrict__ y, int n, int np, int k, int kp, int ldy) {
    dq_wgmma_ws<DqNvfp4>(&x, m, DqNvfp4{tiles, kp / 64}, g * 256.f, y, n, kp, ldy);
}

// The Q4_K prefill on the bf16 tensor cores (formats.md, "Q4_K on the bf16 tensor-core path"):
// x as nvfp4_wgmma's, w canonical Q4_K rows [n, kp / 256] (the q4k_mmq layout), kp % 256 == 0;
// y = sum_k bf16(x) * w_bf16 in f32. Grid, block and shared memory as nvfp4_wgmma.
extern "C" __global__ void __launch_bounds__(MP_DQ_WGMMA_THREADS, 1) q4k_wgmma(const __grid_constant__ MpTmap x, int m, const unsigned char* __restrict__ w, float* __restrict__ y, int n, int k, int kp, int ldy) {
    dq_wgmma_ws<DqQ4k>(&x, m, DqQ4k{w, n, kp / 256}, 1.f, y, n, kp, ldy);
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
