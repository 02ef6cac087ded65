// The block-format engine's stages (issue 56; `kernels.rs` places this after kernels.cu's IQ
// entries): each type's block geometry, a row's and a stage's bytes, and a stage's 16-byte
// words read from global memory or copied into shared memory by cp.async.

// Each engine type's block geometry, by its GGUF id (128: the engine's own NF4): bytes and values per block (the K-quants'
// super-block) from sizes.rs. GGML_ENGINE_TYPES lists the ids once, for the kernels' switches.
template <int TY> struct GgmlGeo;
#define GGML_GEO(TY, BYTES, ELEMS) \
    template <> struct GgmlGeo<TY> { static constexpr int bytes = BYTES, elems = ELEMS; };
GGML_GEO(2, MP_GGML_Q4_0_BYTES, MP_GGML_QK)
GGML_GEO(3, MP_GGML_Q4_1_BYTES, MP_GGML_QK)
GGML_GEO(6, MP_GGML_Q5_0_BYTES, MP_GGML_QK)
GGML_GEO(7, MP_GGML_Q5_1_BYTES, MP_GGML_QK)
GGML_GEO(8, MP_GGML_Q8_0_BYTES, MP_GGML_QK)
GGML_GEO(10, MP_GGML_Q2K_BYTES, MP_GGML_QK_K)
GGML_GEO(11, MP_GGML_Q3K_BYTES, MP_GGML_QK_K)
GGML_GEO(12, MP_Q4K_BYTES, MP_GGML_QK_K)
GGML_GEO(13, MP_GGML_Q5K_BYTES, MP_GGML_QK_K)
GGML_GEO(14, MP_GGML_Q6K_BYTES, MP_GGML_QK_K)
GGML_GEO(20, MP_GGML_IQ4_NL_BYTES, MP_GGML_QK)
GGML_GEO(23, MP_GGML_IQ4_XS_BYTES, MP_GGML_QK_K)
GGML_GEO(39, MP_GGML_MXFP4_BYTES, MP_GGML_QK)
GGML_GEO(40, MP_GGML_NVFP4_BYTES, MP_GGML_QK_NVFP4)
GGML_GEO(16, MP_GGML_IQ2_XXS_BYTES, MP_GGML_QK_K)
GGML_GEO(17, MP_GGML_IQ2_XS_BYTES, MP_GGML_QK_K)
GGML_GEO(18, MP_GGML_IQ3_XXS_BYTES, MP_GGML_QK_K)
GGML_GEO(21, MP_GGML_IQ3_S_BYTES, MP_GGML_QK_K)
GGML_GEO(22, MP_GGML_IQ2_S_BYTES, MP_GGML_QK_K)
GGML_GEO(19, MP_GGML_IQ1_S_BYTES, MP_GGML_QK_K)
GGML_GEO(29, MP_GGML_IQ1_M_BYTES, MP_GGML_QK_K)
GGML_GEO(128, MP_GGML_NF4_BYTES, MP_GGML_QK_NF4)
#define GGML_ENGINE_TYPES(X) \
    X(2) X(3) X(6) X(7) X(8) X(10) X(11) X(12) X(13) X(14) X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23) X(29) X(39) X(40) X(128)

// The bytes of a row of kp values of type TY.
template <int TY>
__device__ __forceinline__ size_t ggml_row_bytes(int kp) {
    return (size_t)kp / GgmlGeo<TY>::elems * GgmlGeo<TY>::bytes;
}

// The bytes of one MP_GGML_STAGE-value stage of a row of type TY (64 blocks of 32, 8
// super-blocks of 256): whole 16-byte words for every type (sizes.rs asserts it).
template <int TY>
__device__ constexpr int ggml_stage_bytes() {
    return MP_GGML_STAGE / GgmlGeo<TY>::elems * GgmlGeo<TY>::bytes;
}

// The 16-byte word at `at` (a multiple of 16) of a buffer of `total` bytes: whole, or where it
// runs past the end, its bytes inside (zeros after).
__device__ __forceinline__ uint4 ggml_word(const unsigned char* base, size_t at, size_t total) {
    if (at + 16 <= total) return __ldg(reinterpret_cast<const uint4*>(base + at));
    unsigned int v[4] = {0u, 0u, 0u, 0u};
    for (int i = 0; i < 16 && at + i < total; ++i) v[i >> 2] |= (unsigned int)base[at + i] << (8 * (i & 3));
    return make_uint4(v[0], v[1], v[2], v[3]);
}

// The 16-byte word at `at` (a multiple of 16) of a buffer of `total` bytes into `dst` (shared
// memory, 16-aligned) by cp.async, as ggml_word reads it (the bytes past the end as zeros);
// the copies a thread issued since its last ggml_cp_commit form a group, and ggml_cp_wait<N>
// waits until at most N of its groups are in flight. The C++ emulation lands each copy as late
// as the device may, at the wait that retires its group: a buffer read before its wait holds
// its old bytes there, and the GEMV then differs from its twin (tests/cuda_emu_ggml.rs).
#ifdef METRALE_CUDA_EMU
struct GgmlCpEmu {
    // The groups in flight, oldest first; the last one still open.
    std::vector<std::vector<std::pair<unsigned char*, uint4>>> groups =
        std::vector<std::vector<std::pair<unsigned char*, uint4>>>(1);
};
static thread_local GgmlCpEmu ggml_cp_emu;
#endif
__device__ __forceinline__ void ggml_cp_word(unsigned char* dst, const unsigned char* base, size_t at, size_t total) {
    const int bytes = at >= total ? 0 : total - at >= 16 ? 16 : (int)(total - at);
#ifndef METRALE_CUDA_EMU
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(bytes ? base + at : base), "r"(bytes)
                 : "memory");
#else
    ggml_cp_emu.groups.back().push_back({dst, ggml_word(base, at, total)});
    (void)bytes;
#endif
}
// ggml_cp_word for a word wholly inside the buffer: no bounds.
__device__ __forceinline__ void ggml_cp_whole(unsigned char* dst, const unsigned char* src) {
#ifndef METRALE_CUDA_EMU
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
#else
    ggml_cp_emu.groups.back().push_back({dst, __ldg(reinterpret_cast<const uint4*>(src))});
#endif
}
__device__ __forceinline__ void ggml_cp_commit() {
#ifndef METRALE_CUDA_EMU
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#else
    ggml_cp_emu.groups.emplace_back();
#endif
}
template <int N>
__device__ __forceinline__ void ggml_cp_wait() {
#ifndef METRALE_CUDA_EMU
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#else
    auto& g = ggml_cp_emu.groups;
    while (g.size() - 1 > (size_t)N) {
        for (const auto& [dst, v] : g.front()) std::memcpy(dst, &v, 16);
        g.erase(g.begin());
    }
#endif
}
