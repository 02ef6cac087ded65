// One kernel launch from a command file: u32 name length, name, u32 gx, gy, block, u32 nargs,
// then per argument a tag byte: 'P' u64 length + bytes (a buffer), 'I' i32, 'F' f32, 'T' a
// tensor map (u64 length + bytes, then u64 row bytes, u64 rows, u32 box rows, u32 box bytes).
// Writes every 'P' buffer back, in order (u64 length + bytes), to the output file.
struct EmuArg {
    char tag;
    std::vector<unsigned char> buf;
    int32_t i = 0;
    float f = 0.f;
    uint64_t row_bytes = 0, rows = 0;
    uint32_t box_rows = 0, box_bytes = 0;
};

static bool read_all(FILE* f, void* p, size_t n) { return std::fread(p, 1, n, f) == n; }

int main(int argc, char** argv) {
    if (argc != 3) return 2;
    FILE* in = std::fopen(argv[1], "rb");
    if (!in) return 3;
    uint32_t len, gx, gy, bx, nargs;
    if (!read_all(in, &len, 4)) return 4;
    std::string name(len, '\0');
    if (!read_all(in, name.data(), len) || !read_all(in, &gx, 4) || !read_all(in, &gy, 4) ||
        !read_all(in, &bx, 4) || !read_all(in, &nargs, 4))
        return 4;
    std::vector<EmuArg> a(nargs);
    for (auto& x : a) {
        if (!read_all(in, &x.tag, 1)) return 5;
        if (x.tag == 'P' || x.tag == 'T') {
            uint64_t n;
            if (!read_all(in, &n, 8)) return 5;
            x.buf.resize(n);
            if (!read_all(in, x.buf.data(), n)) return 5;
            if (x.tag == 'T' && !(read_all(in, &x.row_bytes, 8) && read_all(in, &x.rows, 8) &&
                                  read_all(in, &x.box_rows, 4) && read_all(in, &x.box_bytes, 4)))
                return 5;
            if (x.tag == 'T' && x.row_bytes * x.rows > x.buf.size()) return 5;
        } else if (x.tag == 'I') {
            if (!read_all(in, &x.i, 4)) return 5;
        } else if (x.tag == 'F') {
            if (!read_all(in, &x.f, 4)) return 5;
        } else {
            return 5;
        }
    }
    std::fclose(in);
    // An empty buffer is a null pointer (an optional argument left out).
    auto P = [&](int i) { return a[i].buf.empty() ? nullptr : (void*)a[i].buf.data(); };
    auto I = [&](int i) { return (int)a[i].i; };
    auto F = [&](int i) { return a[i].f; };
    auto T = [&](int i) { return MpTmap{a[i].buf.data(), a[i].row_bytes, a[i].rows, a[i].box_rows, a[i].box_bytes}; };
    typedef const unsigned char* cu8;
    typedef unsigned char* u8;
    if (name == "quantize_act_q8_1")
        emu_launch(gx, gy, bx, [&] { quantize_act_q8_1((const float*)P(0), I(1), I(2), I(3), (u8)P(4)); });
    else if (name == "q2g128_gemv")
        emu_launch(gx, gy, bx, [&] { q2g128_gemv((const float*)P(0), I(1), (cu8)P(2), (float*)P(3), I(4), I(5), I(6), I(7)); });
    else if (name == "q2g128_gemv_batchm")
        emu_launch(gx, gy, bx, [&] { q2g128_gemv_batchm((const float*)P(0), I(1), (cu8)P(2), (float*)P(3), I(4), I(5), I(6), I(7)); });
    else if (name == "q2g128_dequant_bf16")
        emu_launch(gx, gy, bx, [&] { q2g128_dequant_bf16((cu8)P(0), I(1), I(2), (__nv_bfloat16*)P(3)); });
    else if (name == "q2g128_mmq_gemm")
        emu_launch(gx, gy, bx, [&] { q2g128_mmq_gemm((cu8)P(0), I(1), (cu8)P(2), (float*)P(3), I(4), I(5), I(6)); });
    else if (name == "q4k_mmq_gemm")
        emu_launch(gx, gy, bx, [&] { q4k_mmq_gemm((cu8)P(0), I(1), (cu8)P(2), (float*)P(3), I(4), I(5), I(6)); });
    else if (name == "ggml_dequant_bf16")
        emu_launch(gx, gy, bx, [&] { ggml_dequant_bf16((cu8)P(0), I(1), F(2), I(3), I(4), (unsigned short*)P(5)); });
    else if (name == "quantize_act_mul_q8_1")
        emu_launch(gx, gy, bx, [&] { quantize_act_mul_q8_1((const float*)P(0), (const float*)P(1), I(2), I(3), I(4), I(5), I(6), (u8)P(7)); });
    else if (name == "quantize_act_q8_1s")
        emu_launch(gx, gy, bx, [&] { quantize_act_q8_1s((const float*)P(0), I(1), I(2), I(3), (u8)P(4)); });
    else if (name == "quantize_act_mul_q8_1s")
        emu_launch(gx, gy, bx, [&] { quantize_act_mul_q8_1s((const float*)P(0), (const float*)P(1), I(2), I(3), I(4), I(5), I(6), (u8)P(7)); });
    else if (name == "ggml_gemv")
        emu_launch(gx, gy, bx, [&] { ggml_gemv((cu8)P(0), I(1), (cu8)P(2), I(3), F(4), (float*)P(5), (cu8)P(6), I(7), F(8), (float*)P(9), I(10), I(11), I(12), I(13)); });
    else if (name == "ggml_gemv_sa")
        emu_launch(gx, gy, bx, [&] { ggml_gemv_sa((cu8)P(0), I(1), (cu8)P(2), I(3), F(4), (float*)P(5), (cu8)P(6), I(7), F(8), (float*)P(9), I(10), I(11), I(12), I(13)); });
    else if (name == "ggml_gemv_split")
        emu_launch(gx, gy, bx, [&] { ggml_gemv_split((cu8)P(0), I(1), (cu8)P(2), I(3), F(4), (float*)P(5), (cu8)P(6), I(7), F(8), (float*)P(9), I(10), I(11), I(12), I(13)); });
    else if (name == "ggml_gemv_split4")
        emu_launch(gx, gy, bx, [&] { ggml_gemv_split4((cu8)P(0), I(1), (cu8)P(2), I(3), F(4), (float*)P(5), (cu8)P(6), I(7), F(8), (float*)P(9), I(10), I(11), I(12), I(13)); });
    else if (name == "ggml_gemv1")
        emu_launch(gx, gy, bx, [&] { ggml_gemv1((cu8)P(0), I(1), (cu8)P(2), I(3), F(4), (float*)P(5), (cu8)P(6), I(7), F(8), (float*)P(9), I(10), I(11), I(12), I(13)); });
    else if (name == "q4k_gemv")
        emu_launch(gx, gy, bx, [&] { q4k_gemv((const float*)P(0), I(1), (cu8)P(2), (float*)P(3), I(4), I(5), I(6), I(7)); });
    else if (name == "q4k_gemv_batch4")
        emu_launch(gx, gy, bx, [&] { q4k_gemv_batch4((const float*)P(0), I(1), (cu8)P(2), (float*)P(3), I(4), I(5), I(6), I(7)); });
    else if (name == "int8_rows_gemv")
        emu_launch(gx, gy, bx, [&] { int8_rows_gemv((const float*)P(0), I(1), (cu8)P(2), (const float*)P(3), (float*)P(4), I(5), I(6), I(7), I(8)); });
    else if (name == "int8_rows_gemv_batch4")
        emu_launch(gx, gy, bx, [&] { int8_rows_gemv_batch4((const float*)P(0), I(1), (cu8)P(2), (const float*)P(3), (float*)P(4), I(5), I(6), I(7), I(8)); });
    else if (name == "nvfp4_to_q4k")
        emu_launch(gx, gy, bx, [&] { nvfp4_to_q4k((cu8)P(0), (cu8)P(1), F(2), I(3), I(4), I(5), I(6), (u8)P(7)); });
    else if (name == "nvfp4_to_int8_rows")
        emu_launch(gx, gy, bx, [&] { nvfp4_to_int8_rows((cu8)P(0), (cu8)P(1), F(2), I(3), I(4), I(5), I(6), (u8)P(7), (float*)P(8)); });
    else if (name == "requant_a_bf16_int8")
        emu_launch(gx, gy, bx, [&] { requant_a_bf16_int8((const float*)P(0), I(1), I(2), I(3), (u8)P(4), (float*)P(5)); });
    else if (name == "q4k_mmq_int8_down_gemm")
        emu_launch(gx, gy, bx, [&] { q4k_mmq_int8_down_gemm((cu8)P(0), (const float*)P(1), I(2), (cu8)P(3), (const float*)P(4), (float*)P(5), I(6), I(7), I(8)); });
    else if (name == "w4a16_gemv")
        emu_launch(gx, gy, bx, [&] { w4a16_gemv((const float*)P(0), I(1), (cu8)P(2), (cu8)P(3), F(4), (float*)P(5), I(6), I(7), I(8), I(9)); });

    else if (name == "w8a16_gemv_batch4")
        emu_launch(gx, gy, bx, [&] { w8a16_gemv_batch4((const float*)P(0), I(1), (cu8)P(2), (const float*)P(3), (float*)P(4), I(5), I(6), I(7), I(8)); });
    else if (name == "w8a16_gemv_mma")
        emu_launch(gx, gy, bx, [&] { w8a16_gemv_mma((const float*)P(0), I(1), (cu8)P(2), (const float*)P(3), (float*)P(4), I(5), I(6), I(7), I(8)); });
    else if (name == "w8a16_gemv_mma_ilp")
        emu_launch(gx, gy, bx, [&] { w8a16_gemv_mma_ilp((const float*)P(0), I(1), (cu8)P(2), (const float*)P(3), (float*)P(4), I(5), I(6), I(7), I(8)); });
    else if (name == "w8a16_gemv_batch16")
        emu_launch(gx, gy, bx, [&] { w8a16_gemv_batch16((const float*)P(0), I(1), (cu8)P(2), (const float*)P(3), (float*)P(4), I(5), I(6), I(7), I(8)); });
    else if (name == "affine4_gemv_ks")
        emu_launch(gx, gy, bx, [&] { affine4_gemv_ks((const signed char*)P(0), (const float*)P(1), I(2), (cu8)P(3), (cu8)P(4), (float*)P(5), (cu8)P(6), (cu8)P(7), (float*)P(8), I(9), I(10), I(11), I(12), I(13), I(14)); });
    else if (name == "affine8_gemv_ks")
        emu_launch(gx, gy, bx, [&] { affine8_gemv_ks((const signed char*)P(0), (const float*)P(1), I(2), (cu8)P(3), (cu8)P(4), (float*)P(5), (cu8)P(6), (cu8)P(7), (float*)P(8), I(9), I(10), I(11), I(12), I(13), I(14)); });
    else if (name == "affine4_gemv_act")
        emu_launch(gx, gy, bx, [&] { affine4_gemv_act((const signed char*)P(0), (const float*)P(1), I(2), (cu8)P(3), (cu8)P(4), (float*)P(5), (cu8)P(6), (cu8)P(7), (float*)P(8), I(9), I(10), I(11), I(12), I(13), (signed char*)P(14), (float*)P(15), I(16), I(17), (unsigned*)P(18)); });
    else if (name == "affine8_gemv_act")
        emu_launch(gx, gy, bx, [&] { affine8_gemv_act((const signed char*)P(0), (const float*)P(1), I(2), (cu8)P(3), (cu8)P(4), (float*)P(5), (cu8)P(6), (cu8)P(7), (float*)P(8), I(9), I(10), I(11), I(12), I(13), (signed char*)P(14), (float*)P(15), I(16), I(17), (unsigned*)P(18)); });
    else if (name == "affine4_gemv")
        emu_launch(gx, gy, bx, [&] { affine4_gemv((const signed char*)P(0), (const float*)P(1), I(2), (cu8)P(3), (cu8)P(4), (float*)P(5), (cu8)P(6), (cu8)P(7), (float*)P(8), I(9), I(10), I(11), I(12), I(13), I(14)); });
    else if (name == "affine4_gemv_batch4")
        emu_launch(gx, gy, bx, [&] { affine4_gemv_batch4((const signed char*)P(0), (const float*)P(1), I(2), (cu8)P(3), (cu8)P(4), (float*)P(5), (cu8)P(6), (cu8)P(7), (float*)P(8), I(9), I(10), I(11), I(12), I(13), I(14)); });
    else if (name == "affine4_gemv_batch16")
        emu_launch(gx, gy, bx, [&] { affine4_gemv_batch16((const signed char*)P(0), (const float*)P(1), I(2), (cu8)P(3), (cu8)P(4), (float*)P(5), (cu8)P(6), (cu8)P(7), (float*)P(8), I(9), I(10), I(11), I(12), I(13), I(14)); });
    else if (name == "affine8_gemv")
        emu_launch(gx, gy, bx, [&] { affine8_gemv((const signed char*)P(0), (const float*)P(1), I(2), (cu8)P(3), (cu8)P(4), (float*)P(5), (cu8)P(6), (cu8)P(7), (float*)P(8), I(9), I(10), I(11), I(12), I(13), I(14)); });
    else if (name == "affine8_gemv_batch4")
        emu_launch(gx, gy, bx, [&] { affine8_gemv_batch4((const signed char*)P(0), (const float*)P(1), I(2), (cu8)P(3), (cu8)P(4), (float*)P(5), (cu8)P(6), (cu8)P(7), (float*)P(8), I(9), I(10), I(11), I(12), I(13), I(14)); });
    else if (name == "affine8_gemv_batch16")
        emu_launch(gx, gy, bx, [&] { affine8_gemv_batch16((const signed char*)P(0), (const float*)P(1), I(2), (cu8)P(3), (cu8)P(4), (float*)P(5), (cu8)P(6), (cu8)P(7), (float*)P(8), I(9), I(10), I(11), I(12), I(13), I(14)); });
    else if (name == "affine_from_ggml")
        emu_launch(gx, gy, bx, [&] { affine_from_ggml((cu8)P(0), I(1), I(2), I(3), I(4), (u8)P(5), (u8)P(6), (unsigned*)P(7)); });
    else if (name == "affine_from_awq")
        emu_launch(gx, gy, bx, [&] { affine_from_awq((const unsigned int*)P(0), (const unsigned int*)P(1), (const unsigned short*)P(2), I(3), I(4), I(5), I(6), I(7), (unsigned char*)P(8), (unsigned char*)P(9), (unsigned int*)P(10)); });
    else if (name == "affine_from_gptq")
        emu_launch(gx, gy, bx, [&] { affine_from_gptq((const unsigned int*)P(0), (const unsigned int*)P(1), (const unsigned short*)P(2), (const int*)P(3), I(4), I(5), I(6), I(7), I(8), I(9), (unsigned char*)P(10), (unsigned char*)P(11), (unsigned int*)P(12)); });
    else if (name == "affine_gather_bf16")
        emu_launch(gx, gy, bx, [&] { affine_gather_bf16((const float*)P(0), (const float*)P(1), I(2), (const unsigned int*)P(3), I(4), I(5), I(6), (__nv_bfloat16*)P(7)); });
    else if (name == "affine_quantize_act")
        emu_launch(gx, gy, bx, [&] { affine_quantize_act((const float*)P(0), (const float*)P(1), I(2), I(3), I(4), I(5), I(6), I(7), (signed char*)P(8), (float*)P(9), (const unsigned int*)P(10)); });
    else if (name == "affine_dequant_bf16")
        emu_launch(gx, gy, bx, [&] { affine_dequant_bf16((cu8)P(0), (cu8)P(1), I(2), I(3), I(4), I(5), I(6), (__nv_bfloat16*)P(7), (const unsigned int*)P(8)); });
    else if (name == "bf16_gemv_batch4")
        emu_launch(gx, gy, bx, [&] { bf16_gemv_batch4((const float*)P(0), I(1), (const __nv_bfloat16*)P(2), (float*)P(3), I(4), I(5), I(6), I(7)); });
    else if (name == "w8a16_gemv_batch4_cvt")
        emu_launch(gx, gy, bx, [&] { w8a16_gemv_batch4_cvt((const float*)P(0), I(1), (cu8)P(2), (const float*)P(3), (float*)P(4), I(5), I(6), I(7), I(8)); });
    else if (name == "blob_rules")
        emu_launch(gx, gy, bx, [&] { blob_rules((cu8)P(0), I(1), I(2), I(3), (unsigned int*)P(4), I(5)); });
    else if (name == "stream_probe")
        emu_launch(gx, gy, bx, [&] { stream_probe((const uint4*)P(0), I(1), I(2), (unsigned int*)P(3)); });
    else if (name == "w8a8_gemm")
        emu_launch(gx, gy, bx, [&] { w8a8_gemm((cu8)P(0), (const float*)P(1), I(2), (cu8)P(3), (const float*)P(4), (float*)P(5), I(6), I(7), I(8)); });
    else if (name == "w8a8_gemv")
        emu_launch(gx, gy, bx, [&] { w8a8_gemv((cu8)P(0), (const float*)P(1), I(2), (cu8)P(3), (const float*)P(4), (float*)P(5), I(6), I(7), I(8)); });
    else if (name == "quantize_act_fp8_g128")
        emu_launch(gx, gy, bx, [&] { quantize_act_fp8_g128((const float*)P(0), I(1), I(2), I(3), (u8)P(4), (float*)P(5)); });
    else if (name == "quantize_act_mul_fp8_g128")
        emu_launch(gx, gy, bx, [&] { quantize_act_mul_fp8_g128((const float*)P(0), (const float*)P(1), I(2), I(3), I(4), I(5), I(6), I(7), (u8)P(8), (float*)P(9)); });
    else if (name == "fp8_wgmma")
        emu_launch(gx, gy, bx, [&] { fp8_wgmma(T(0), (const float*)P(1), I(2), T(3), (const float*)P(4), (float*)P(5), I(6), I(7), I(8)); });
    else if (name == "quantize_act_mul_fp8_row")
        emu_launch(gx, gy, bx, [&] { quantize_act_mul_fp8_row((const float*)P(0), (const float*)P(1), I(2), I(3), I(4), I(5), I(6), I(7), (u8)P(8), (float*)P(9)); });
    else if (name == "quantize_act_fp8_row")
        emu_launch(gx, gy, bx, [&] { quantize_act_fp8_row((const float*)P(0), I(1), I(2), I(3), (u8)P(4), (float*)P(5)); });
    else if (name == "int8_wgmma")
        emu_launch(gx, gy, bx, [&] { int8_wgmma(T(0), (const float*)P(1), I(2), T(3), (const float*)P(4), (float*)P(5), I(6), I(7), I(8)); });
    else if (name == "nvfp4_wgmma")
        emu_launch(gx, gy, bx, [&] { nvfp4_wgmma(T(0), I(1), (cu8)P(2), F(3), (float*)P(4), I(5), I(6), I(7), I(8), I(9)); });
    else if (name == "q4k_wgmma")
        emu_launch(gx, gy, bx, [&] { q4k_wgmma(T(0), I(1), (cu8)P(2), (float*)P(3), I(4), I(5), I(6), I(7)); });
    else if (name == "w8a8_wgmma")
        emu_launch(gx, gy, bx, [&] { w8a8_wgmma(T(0), (const float*)P(1), I(2), T(3), (const float*)P(4), (float*)P(5), I(6), I(7), I(8)); });
    else if (name == "w8a8_wgmma_m64")
        emu_launch(gx, gy, bx, [&] { w8a8_wgmma_m64((cu8)P(0), (const float*)P(1), I(2), (cu8)P(3), (const float*)P(4), (float*)P(5), I(6), I(7), I(8)); });
    else if (name == "nvfp4_proj_small_m16")
        emu_launch(gx, gy, bx, [&] { nvfp4_proj_small_m16((const float*)P(0), I(1), (cu8)P(2), (cu8)P(3), F(4), (float*)P(5), I(6), I(7), I(8), I(9)); });
    else if (name == "w4a16_gemv_ksplit")
        emu_launch(gx, gy, bx, [&] { w4a16_gemv_ksplit((const float*)P(0), I(1), (cu8)P(2), (cu8)P(3), F(4), (float*)P(5), I(6), I(7), I(8), I(9)); });
    else if (name == "w4a16_gemv_silu_down")
        emu_launch(gx, gy, bx, [&] { w4a16_gemv_silu_down((const float*)P(0), (const float*)P(1), I(2), (cu8)P(3), (cu8)P(4), F(5), (float*)P(6), I(7), I(8), I(9), I(10), I(11)); });
    else if (name == "lora_a")
        emu_launch(gx, gy, bx, [&] { lora_a((const float*)P(0), I(1), I(2), I(3), (const __nv_bfloat16*)P(4), I(5), (float*)P(6)); });
    else if (name == "lora_b_add")
        emu_launch(gx, gy, bx, [&] { lora_b_add((const float*)P(0), I(1), I(2), (const __nv_bfloat16*)P(3), F(4), (float*)P(5), I(6), I(7)); });
    else
        return 6;
    FILE* out = std::fopen(argv[2], "wb");
    if (!out) return 7;
    for (auto& x : a)
        if (x.tag == 'P') {
            const uint64_t n = x.buf.size();
            std::fwrite(&n, 8, 1, out);
            std::fwrite(x.buf.data(), 1, n, out);
        }
    std::fclose(out);
    return 0;
}
