// Host stand-ins for the CUDA builtins that kernels/ffn_q4k.cu's host-emulated region uses, so
// that region compiles as plain C++ (tests/cuda_emu.rs). Each stand-in does what the CUDA
// builtin is documented to do: one IEEE single operation with round-to-nearest-even (the
// compiler is run with -ffp-contract=off so nothing is fused), f16 and E4M3 conversions exact
// or round-to-nearest-even.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#define __device__
#define __forceinline__ inline
#define __global__
#define __constant__ static const
#define __restrict__ __restrict

struct EmuDim3 {
    unsigned x = 0, y = 0, z = 0;
};
static EmuDim3 blockIdx, threadIdx, blockDim;

static inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
static inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
static inline float __fsqrt_rn(float a) { volatile float r = std::sqrt(a); return r; }
static inline int __float_as_int(float f) {
    int i;
    std::memcpy(&i, &f, 4);
    return i;
}

struct __half {
    uint16_t x;
};
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

// E4M3 "fn": bias 7, S.1111.111 is NaN, subnormals m * 2^-9.
static inline float e4m3_to_f32(unsigned int b) {
    b &= 0xffu;
    const unsigned s = b >> 7, e = (b >> 3) & 15u, m = b & 7u;
    float v;
    if (e == 15 && m == 7) v = NAN;
    else if (e == 0) v = std::ldexp((float)m, -9);
    else v = std::ldexp((float)(8 + m), (int)e - 10);
    return s ? -v : v;
}

static const float E2M1_VALUES[16] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f,
                                      -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};
using std::max;
using std::min;
