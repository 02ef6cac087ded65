// Host stand-ins for the CUDA builtins the emulated kernel modules use, so their sources
// compile as plain C++ (tests/cuda_emu.rs). Each does what the CUDA builtin is documented to do:
// one IEEE single operation, round-to-nearest-even (the compiler runs with -ffp-contract=off,
// so nothing is fused), exact or nearest-even conversions. A block runs as blockDim.x host
// threads: __syncthreads is a block barrier and __shfl_xor_sync exchanges through a per-warp
// slot array between two warp barriers; `__shared__` variables are statics (blocks run one
// after another).
#include <algorithm>
#include <barrier>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#define __device__
#define __forceinline__ inline
#define __global__
#define __constant__ static const
#define __shared__ static
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __grid_constant__
// common.cuh leaves its inline-PTX MMA to the stand-in below.
#define METRALE_CUDA_EMU 1

struct EmuDim3 {
    unsigned x = 0, y = 0, z = 0;
};
static EmuDim3 blockIdx, blockDim, gridDim;
static thread_local EmuDim3 threadIdx;

struct EmuWarp {
    std::barrier<> bar{32};
    float f[32];
    int i[32];
    unsigned mma[32][6];  // each lane's a[0..3], b[0..1] for the MMA stand-in
};
static thread_local EmuWarp* emu_warp = nullptr;
static thread_local std::barrier<>* emu_block = nullptr;

static inline void __syncthreads() { emu_block->arrive_and_wait(); }
static inline float __shfl_xor_sync(unsigned, float v, int o) {
    const int l = threadIdx.x & 31;
    emu_warp->f[l] = v;
    emu_warp->bar.arrive_and_wait();
    const float r = emu_warp->f[l ^ o];
    emu_warp->bar.arrive_and_wait();
    return r;
}
static inline int __shfl_xor_sync(unsigned, int v, int o) {
    const int l = threadIdx.x & 31;
    emu_warp->i[l] = v;
    emu_warp->bar.arrive_and_wait();
    const int r = emu_warp->i[l ^ o];
    emu_warp->bar.arrive_and_wait();
    return r;
}

// mma.sync m16n8k32 s8.s8.s32 (layout in common.cuh): every lane posts its fragments, then
// computes its four outputs from the whole warp's.
// Every lane posts its A and B fragment registers for the others to read (then a warp barrier).
static inline void emu_mma_post(const unsigned* a, const unsigned* b) {
    const int l = threadIdx.x & 31;
    for (int r = 0; r < 4; ++r) emu_warp->mma[l][r] = a[r];
    emu_warp->mma[l][4] = b[0];
    emu_warp->mma[l][5] = b[1];
    emu_warp->bar.arrive_and_wait();
}
// The PTX mma.sync fragment layout, for P elements per 32-bit register (4 for 8-bit types, 2 for
// bf16), over the posted registers: A[row][k] is element k % P of lane 4 (row % 8) + (k % 4P) / P,
// register (row >= 8) + 2 (k >= 4P); B[k][col] is element k % P of lane 4 col + (k % 4P) / P,
// register 4 + (k >= 4P).
template <int P>
static inline unsigned emu_frag_a(int row, int k) {
    return emu_warp->mma[4 * (row % 8) + (k % (4 * P)) / P][(row >= 8) + 2 * (k >= 4 * P)];
}
template <int P>
static inline unsigned emu_frag_b(int k, int col) {
    return emu_warp->mma[4 * col + (k % (4 * P)) / P][4 + (k >= 4 * P)];
}
static inline void mma_m16n8k32_s8(int* c, const unsigned* a, const unsigned* b) {
    const int l = threadIdx.x & 31, g = l >> 2, t = l & 3;
    emu_mma_post(a, b);
    auto A = [&](int row, int k) { return (int)(int8_t)(emu_frag_a<4>(row, k) >> (8 * (k % 4))); };
    auto B = [&](int k, int col) { return (int)(int8_t)(emu_frag_b<4>(k, col) >> (8 * (k % 4))); };
    for (int e = 0; e < 4; ++e) {
        const int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
        int s = 0;
        for (int k = 0; k < 32; ++k) s += A(row, k) * B(k, col);
        c[e] += s;
    }
    emu_warp->bar.arrive_and_wait();
}

// mma.sync m16n8k16 bf16.bf16.f32 (layout in common.cuh's mma_m16n8k16_bf16): every lane posts
// its fragments; each output adds the exact f64 sum of its 16 products to c, rounded once to f32
// (the device accumulates in at least f32 in an unspecified order; the tests' tolerance covers it).
static inline float emu_bf16_half(unsigned w, int hi) {
    const uint32_t u = (hi ? (w >> 16) : (w & 0xffffu)) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
// An f32-accumulating MMA over K k values after emu_mma_post: each output adds the exact f64 sum
// of its K products A(row, k) * B(k, col), read from the posted fragments, to c, rounded once.
template <int K, class FA, class FB>
static inline void emu_mma_f32(float* c, FA A, FB B) {
    const int l = threadIdx.x & 31, g = l >> 2, t = l & 3;
    for (int e = 0; e < 4; ++e) {
        const int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
        double s = c[e];
        for (int k = 0; k < K; ++k) s += (double)A(row, k) * (double)B(k, col);
        c[e] = (float)s;
    }
    emu_warp->bar.arrive_and_wait();
}
static inline void mma_m16n8k16_bf16(float* c, const unsigned* a, const unsigned* b) {
    emu_mma_post(a, b);
    auto A = [](int row, int k) { return emu_bf16_half(emu_frag_a<2>(row, k), k % 2); };
    auto B = [](int k, int col) { return emu_bf16_half(emu_frag_b<2>(k, col), k % 2); };
    emu_mma_f32<16>(c, A, B);
}

// PTX prmt's default mode with selector nibbles 0..7 (the kernels never set a nibble's bit 3).
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const uint64_t pool = (uint64_t)x | ((uint64_t)y << 32);
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)((pool >> (8 * ((s >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
    return r;
}

static inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
static inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
static inline float __fsqrt_rn(float a) { volatile float r = std::sqrt(a); return r; }
static inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
static inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
static inline int __float_as_int(float f) {
    int i;
    std::memcpy(&i, &f, 4);
    return i;
}
template <class T>
static inline T __ldg(const T* p) { return *p; }
static inline unsigned atomicOr(unsigned* p, unsigned v) { return __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }
static inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned atomicMin(unsigned* p, unsigned v) {
    unsigned old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (v < old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
    return old;
}
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
template <class T>
static inline T __ldcg(const T* p) { return *p; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
// Per-byte addition modulo 256 (PTX vadd4 without saturation).
static inline unsigned __vadd4(unsigned a, unsigned b) {
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)(uint8_t)((a >> (8 * i)) + (b >> (8 * i))) << (8 * i);
    return r;
}
// Per-byte subtraction modulo 256 (PTX vsub4 without saturation).
static inline unsigned __vsub4(unsigned a, unsigned b) {
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)(uint8_t)((a >> (8 * i)) - (b >> (8 * i))) << (8 * i);
    return r;
}
static inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
using std::max;
using std::min;

struct uint2 { unsigned x, y; };
struct int4 { int x, y, z, w; };
struct uint4 { unsigned x, y, z, w; };
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

// IEEE half.
struct __half { uint16_t x; };
static inline __half __float2half_rn(float f) {
    _Float16 h = (_Float16)f;  // round to nearest even
    __half r;
    std::memcpy(&r.x, &h, 2);
    return r;
}
static inline float __half2float(__half h) {
    _Float16 v;
    std::memcpy(&v, &h.x, 2);
    return (float)v;
}
static inline unsigned short __half_as_ushort(__half h) { return h.x; }
static inline __half __ushort_as_half(unsigned short u) { return __half{u}; }

// bfloat16: the top half of an f32, rounded to nearest even (NaN kept quiet).
struct __nv_bfloat16 { uint16_t x; };
struct __nv_bfloat162 { __nv_bfloat16 x, y; };
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{(uint16_t)((u >> 16) | 0x40u)};
    u += 0x7fffu + ((u >> 16) & 1u);
    return __nv_bfloat16{(uint16_t)(u >> 16)};
}
static inline float __bfloat162float(__nv_bfloat16 b) {
    const uint32_t u = (uint32_t)b.x << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
static inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
    return __nv_bfloat162{__float2bfloat16_rn(lo), __float2bfloat16_rn(hi)};
}
// common.cuh's programmatic-dependent-launch hooks: the emulator runs launches in order.
static inline void pdl_trigger() {}
static inline void pdl_wait() {}
// common.cuh's ldg_stream: a plain 16-byte load.
static inline uint4 ldg_stream(const void* p) {
    uint4 v;
    std::memcpy(&v, p, 16);
    return v;
}
// common.cuh's bf16x2_mul: each half's product rounded to nearest even.
static inline unsigned bf16x2_mul(unsigned a, unsigned b) {
    const float lo = emu_bf16_half(a, 0) * emu_bf16_half(b, 0), hi = emu_bf16_half(a, 1) * emu_bf16_half(b, 1);
    return (unsigned)__float2bfloat16_rn(lo).x | ((unsigned)__float2bfloat16_rn(hi).x << 16);
}

// E4M3 "fn": bias 7, S.1111.111 is NaN, subnormals m * 2^-9.
typedef uint8_t __nv_fp8_storage_t;
struct __nv_fp8_e4m3 {
    __nv_fp8_storage_t __x;
    operator float() const {
        const unsigned b = __x, s = b >> 7, e = (b >> 3) & 15u, m = b & 7u;
        float v;
        if (e == 15 && m == 7) v = NAN;
        else if (e == 0) v = std::ldexp((float)m, -9);
        else v = std::ldexp((float)(8 + m), (int)e - 10);
        return s ? -v : v;
    }
};

// __nv_cvt_float_to_fp8 for E4M3 ("fn": bias 7, largest finite 448 = 0x7E, NaN 0x7F): round to
// nearest even on the E4M3 grid (subnormal step 2^-9); __NV_SATFINITE clamps magnitudes above 448,
// infinities included, to 448; NaN stays NaN.
enum __nv_saturation_t { __NV_NOSAT, __NV_SATFINITE };
enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 };
static inline __nv_fp8_storage_t __nv_cvt_float_to_fp8(float x, __nv_saturation_t sat, __nv_fp8_interpretation_t) {
    const unsigned sign = std::signbit(x) ? 0x80u : 0u;
    if (std::isnan(x)) return (__nv_fp8_storage_t)(sign | 0x7Fu);
    const float a = std::fabs(x);
    if (a > 448.0f) return (__nv_fp8_storage_t)(sign | (sat == __NV_SATFINITE ? 0x7Eu : 0x7Fu));
    if (a < std::ldexp(1.0f, -6)) {  // subnormal: a / 2^-9 rounded (8 is the smallest normal)
        const unsigned q = (unsigned)std::nearbyint(std::ldexp(a, 9));
        return (__nv_fp8_storage_t)(sign | q);
    }
    int e;
    std::frexp(a, &e);  // a = f 2^e, f in [0.5, 1): exponent e - 1, 3 mantissa bits
    int exp = e - 1;
    unsigned q = (unsigned)std::nearbyint(std::ldexp(a, 3 - exp));  // 8..16
    if (q == 16) {
        q = 8;
        ++exp;
    }
    return (__nv_fp8_storage_t)(sign | ((unsigned)(exp + 7) << 3) | (q - 8));
}

// mma.sync m16n8k32 e4m3.e4m3.f32 (ffn_w8a8.cu's mma_e4m3; the 8-bit fragment layout of the int8
// MMA): each output adds the exact f64 sum of its 32 products to c, rounded once to f32, a
// function of its own A row, B column and c only (as the device's per-element result).
static inline float emu_e4m3(unsigned w, int byte) {
    __nv_fp8_e4m3 v;
    v.__x = (uint8_t)(w >> (8 * byte));
    return (float)v;
}
static inline void mma_e4m3(float* c, const unsigned* a, const unsigned* b) {
    emu_mma_post(a, b);
    auto A = [](int row, int k) { return emu_e4m3(emu_frag_a<4>(row, k), k % 4); };
    auto B = [](int k, int col) { return emu_e4m3(emu_frag_b<4>(k, col), k % 4); };
    emu_mma_f32<32>(c, A, B);
}

// ---- ffn_w8a8_wgmma.cu's PTX: the copies, fences and waits, and the wgmma itself ----
// Dynamic shared memory: one static window (blocks run one after another), its offsets the
// "shared addresses", 1024-byte aligned like the device's window.
alignas(1024) static unsigned char w8a8_wgmma_smem[256 << 10];
static inline unsigned smem_addr(const void* p) { return (unsigned)((const unsigned char*)p - w8a8_wgmma_smem); }
// cp.async lands at once here, so the commit, wait and proxy-fence stand-ins have nothing to do.
static inline void cp_async16(unsigned dst, const void* src, int bytes) {
    if (bytes) std::memcpy(w8a8_wgmma_smem + dst, src, 16);
    else std::memset(w8a8_wgmma_smem + dst, 0, 16);
}
static inline void cp_async_commit() {}
template <int N>
static inline void cp_async_wait() {}
static inline void fence_proxy_async() {}
static inline void wgmma_fence() {}
static inline void wgmma_commit() {}
// wgmma.wait_group.sync.aligned: every thread of the warpgroup executes it, and it returns once
// the warpgroup's wgmmas are done; here a wgmma is done when each thread has run its part, so
// the wait is a warpgroup barrier (one thread may then release the operands for all 128).
static thread_local std::barrier<>* emu_warpgroup = nullptr;
template <int N>
static inline void wgmma_wait() { emu_warpgroup->arrive_and_wait(); }
template <int R>
static inline void fence_regs(float*) {}
template <int R>
static inline void fence_regs(int*) {}
static inline void __syncwarp() { emu_warp->bar.arrive_and_wait(); }
// f64 -> bf16 bits rounded once to nearest even (finite values in bf16's normal range: the
// significand cut to 8 bits in the f64 itself, then an exact f32); smaller through f32.
static inline uint16_t emu_bf16_from_double(double v) {
    if (!(std::fabs(v) >= 1.1754943508222875e-38) || std::isinf(v)) return __float2bfloat16_rn((float)v).x;
    uint64_t b;
    std::memcpy(&b, &v, 8);
    const int drop = 52 - 7;
    b = (b + (1ull << (drop - 1)) - 1 + ((b >> drop) & 1)) & ~((1ull << drop) - 1);
    double r;
    std::memcpy(&r, &b, 8);
    return __float2bfloat16_rn((float)r).x;
}
// fma.rn.bf16x2: each half a * b + c exact (in f64), rounded once to bf16.
static inline unsigned bf16x2_fma(unsigned a, unsigned b, unsigned c) {
    unsigned r = 0;
    for (int h = 0; h < 2; ++h) {
        const double v = (double)emu_bf16_half(a, h) * (double)emu_bf16_half(b, h) + (double)emu_bf16_half(c, h);
        r |= (unsigned)emu_bf16_from_double(v) << (16 * h);
    }
    return r;
}
// ---- the TMA producer/consumer pipeline of `w8a8_wgmma`: tensor maps, mbarriers ----
// A tensor map here is its fields (the device's is the driver's opaque encoding of the same):
// `rows` rows of `row_bytes` bytes at `base`, boxes of box_rows x box_bytes, 128-byte swizzle.
struct MpTmap {
    const unsigned char* base;
    uint64_t row_bytes, rows;
    uint32_t box_rows, box_bytes;
};
static inline void tmap_prefetch(const MpTmap*) {}
// An mbarrier by its shared address: the arrivals still expected in the current phase, the
// transaction bytes still pending, and the phase's parity; a phase completes when both counts
// reach zero (then the arrivals re-arm). `try_wait.parity P` holds once phase P has completed,
// i.e. while the current parity differs from P; the waiter sleeps on a condition variable.
struct EmuMbar {
    int expected = 0, pending = 0;
    long tx = 0;
    unsigned parity = 0;
};
static std::mutex emu_mbar_mu;
static std::condition_variable emu_mbar_cv;
static std::map<unsigned, EmuMbar> emu_mbars;
static inline void emu_mbar_settle(EmuMbar& b) {
    if (b.pending == 0 && b.tx == 0) {
        b.parity ^= 1u;
        b.pending = b.expected;
        emu_mbar_cv.notify_all();
    }
}
static inline void mbar_init(unsigned bar, unsigned count) {
    std::lock_guard<std::mutex> g(emu_mbar_mu);
    emu_mbars[bar] = EmuMbar{(int)count, (int)count, 0, 0};
}
static inline void mbar_init_fence() {}
static inline void mbar_arrive(unsigned bar) {
    std::lock_guard<std::mutex> g(emu_mbar_mu);
    EmuMbar& b = emu_mbars.at(bar);
    if (--b.pending < 0) std::abort();
    emu_mbar_settle(b);
}
static inline void mbar_arrive_expect_tx(unsigned bar, unsigned bytes) {
    std::lock_guard<std::mutex> g(emu_mbar_mu);
    EmuMbar& b = emu_mbars.at(bar);
    b.tx += bytes;
    if (--b.pending < 0) std::abort();
    emu_mbar_settle(b);
}
static inline void mbar_wait(unsigned bar, unsigned parity) {
    std::unique_lock<std::mutex> g(emu_mbar_mu);
    emu_mbar_cv.wait(g, [&] { return emu_mbars.at(bar).parity != (parity & 1u); });
}
// cp.async.bulk.tensor.2d: the box at (byte c0, row c1) into shared memory at dst (1024-byte
// aligned), byte o of the box at dst + (o ^ (((o >> 7) & 7) << 4)) (the 128-byte swizzle, as the
// wgmma stand-in reads it back), zeros past the tensor's rows or bytes; then the box's bytes
// complete on `bar`. Box rows wider than the swizzle's 128 bytes or a misaligned dst abort.
static inline void tma_load_2d(unsigned dst, const MpTmap* map, int c0, int c1, unsigned bar) {
    if (map->box_bytes != 128 || dst % 1024 != 0) std::abort();
    for (uint32_t r = 0; r < map->box_rows; ++r)
        for (uint32_t b = 0; b < map->box_bytes; ++b) {
            const uint64_t row = (uint64_t)c1 + r, col = (uint64_t)c0 + b;
            const unsigned o = r * map->box_bytes + b;
            w8a8_wgmma_smem[dst + (o ^ (((o >> 7) & 7) << 4))] =
                row < map->rows && col < map->row_bytes ? map->base[row * map->row_bytes + col] : 0;
        }
    std::lock_guard<std::mutex> g(emu_mbar_mu);
    EmuMbar& b = emu_mbars.at(bar);
    b.tx -= (long)map->box_rows * map->box_bytes;
    emu_mbar_settle(b);
}
template <int N>
static inline void setmaxnreg_dec() {}
template <int N>
static inline void setmaxnreg_inc() {}
static inline int warpgroup_index() { return (int)(threadIdx.x >> 7); }

// Byte (row, kb) of a K-major operand from its descriptor, as the PTX ISA defines the 128-byte
// swizzle: rows of 128 bytes in 8-row atoms `stride byte offset` apart, then address bits [4:6]
// XOR bits [7:9]. Any other swizzle mode aborts (the kernel uses only this one).
static inline float emu_wgmma_operand(unsigned long long desc, int row, int kb) {
    if ((desc >> 62) != 1) std::abort();
    const unsigned start = (unsigned)(desc & 0x3FFF) << 4, sbo = (unsigned)((desc >> 32) & 0x3FFF) << 4;
    const unsigned addr = start + (unsigned)(row / 8) * sbo + (unsigned)(row % 8) * 128 + (unsigned)kb;
    __nv_fp8_e4m3 v;
    v.__x = w8a8_wgmma_smem[addr ^ (((addr >> 7) & 7) << 4)];
    return (float)v;
}
// Byte kb of row `row` of a K-major operand, through the descriptor as above.
static inline unsigned char emu_wgmma_byte(unsigned long long desc, int row, int kb) {
    if ((desc >> 62) != 1) std::abort();
    const unsigned start = (unsigned)(desc & 0x3FFF) << 4, sbo = (unsigned)((desc >> 32) & 0x3FFF) << 4;
    const unsigned addr = start + (unsigned)(row / 8) * sbo + (unsigned)(row % 8) * 128 + (unsigned)kb;
    return w8a8_wgmma_smem[addr ^ (((addr >> 7) & 7) << 4)];
}
// wgmma m64n128k16 bf16 (f32 accumulators) and m64n128k32 s8 (s32, exact), in wgmma_e4m3's
// layout below: each output the exact sum of its products added to d (or replacing it), the
// bf16 one rounded once to f32.
static inline void wgmma_bf16_n128(float* d, unsigned long long da, unsigned long long db, int accumulate) {
    const int t = threadIdx.x & 127, warp = t >> 5, lane = t & 31;
    auto val = [](unsigned long long desc, int row, int k) {
        return emu_bf16_half((unsigned)emu_wgmma_byte(desc, row, 2 * k) | ((unsigned)emu_wgmma_byte(desc, row, 2 * k + 1) << 8), 0);
    };
    for (int j = 0; j < 16; ++j)
        for (int h = 0; h < 2; ++h)
            for (int e = 0; e < 2; ++e) {
                const int row = 16 * warp + lane / 4 + 8 * h, col = 8 * j + 2 * (lane % 4) + e;
                double sum = 0.0;
                for (int k = 0; k < 16; ++k) sum += (double)val(da, row, k) * (double)val(db, col, k);
                float& o = d[4 * j + 2 * h + e];
                o = accumulate ? (float)((double)o + sum) : (float)sum;
            }
}
static inline void wgmma_s8_n128(int* d, unsigned long long da, unsigned long long db, int accumulate) {
    const int t = threadIdx.x & 127, warp = t >> 5, lane = t & 31;
    for (int j = 0; j < 16; ++j)
        for (int h = 0; h < 2; ++h)
            for (int e = 0; e < 2; ++e) {
                const int row = 16 * warp + lane / 4 + 8 * h, col = 8 * j + 2 * (lane % 4) + e;
                int sum = 0;
                for (int k = 0; k < 32; ++k) sum += (int)(int8_t)emu_wgmma_byte(da, row, k) * (int)(int8_t)emu_wgmma_byte(db, col, k);
                int& o = d[4 * j + 2 * h + e];
                o = accumulate ? o + sum : sum;
            }
}

// wgmma m64nNk32 e4m3 with f32 accumulators: this thread's N / 2 outputs (warp w of the
// warpgroup, lane l: d[4 j + 2 h + e] is row 16 w + l / 4 + 8 h, column 8 j + 2 (l % 4) + e),
// each the exact f64 sum of its 32 products, added to d (or replacing it) and rounded once: a
// function of its own A row, B row and d only. Completes at once, so the waits are empty.
template <int N>
static inline void wgmma_e4m3(float* d, unsigned long long da, unsigned long long db, int accumulate) {
    const int t = threadIdx.x & 127, warp = t >> 5, lane = t & 31;
    for (int j = 0; j < N / 8; ++j)
        for (int h = 0; h < 2; ++h)
            for (int e = 0; e < 2; ++e) {
                const int row = 16 * warp + lane / 4 + 8 * h, col = 8 * j + 2 * (lane % 4) + e;
                double sum = 0.0;
                for (int kb = 0; kb < 32; ++kb)
                    sum += (double)emu_wgmma_operand(da, row, kb) * (double)emu_wgmma_operand(db, col, kb);
                float& o = d[4 * j + 2 * h + e];
                o = accumulate ? (float)((double)o + sum) : (float)sum;
            }
}

// Run f() as every thread of a (gx, gy) grid of bx-thread blocks, one block at a time.
template <class F>
static void emu_launch(unsigned gx, unsigned gy, unsigned bx, F f) {
    blockDim.x = bx;
    gridDim.x = gx;
    gridDim.y = gy;
    for (unsigned y = 0; y < gy; ++y)
        for (unsigned x = 0; x < gx; ++x) {
            blockIdx.x = x;
            blockIdx.y = y;
            std::barrier<> blk(bx);
            std::vector<std::unique_ptr<EmuWarp>> warps;
            for (unsigned w = 0; w < (bx + 31) / 32; ++w) warps.push_back(std::make_unique<EmuWarp>());
            std::vector<std::unique_ptr<std::barrier<>>> groups;
            for (unsigned g = 0; g < (bx + 127) / 128; ++g)
                groups.push_back(std::make_unique<std::barrier<>>((std::ptrdiff_t)std::min(128u, bx - 128 * g)));
            std::vector<std::thread> ts;
            for (unsigned t = 0; t < bx; ++t)
                ts.emplace_back([&, t] {
                    threadIdx.x = t;
                    emu_block = &blk;
                    emu_warp = warps[t / 32].get();
                    emu_warpgroup = groups[t / 128].get();
                    f();
                    emu_warp->bar.arrive_and_drop();
                    emu_warpgroup->arrive_and_drop();
                    blk.arrive_and_drop();
                });
            for (auto& t : ts) t.join();
        }
}
