// Runs nvfp4_to_q4k over every thread of its grid, one after another (it has no inter-thread
// communication). Input: i32 n, k, kp_nv, kp_q; f32 g; codes; scales. Output: the Q4_K bytes.
int main(int argc, char** argv) {
    if (argc != 3) return 2;
    FILE* f = std::fopen(argv[1], "rb");
    if (!f) return 3;
    int32_t hdr[4];
    float g;
    if (std::fread(hdr, 4, 4, f) != 4 || std::fread(&g, 4, 1, f) != 1) return 4;
    const int n = hdr[0], k = hdr[1], kp_nv = hdr[2], kp_q = hdr[3];
    std::vector<unsigned char> codes((size_t)n * kp_nv / 2), scales((size_t)n * kp_nv / 16);
    if (std::fread(codes.data(), 1, codes.size(), f) != codes.size()) return 5;
    if (std::fread(scales.data(), 1, scales.size(), f) != scales.size()) return 6;
    std::fclose(f);
    std::vector<unsigned char> out((size_t)n * (kp_q / 256) * 144, 0xA5);
    blockDim.x = 64;
    const long long total = (long long)n * (kp_q / 256);
    for (long long id = 0; id < ((total + 63) / 64) * 64; ++id) {
        blockIdx.x = (unsigned)(id / 64);
        threadIdx.x = (unsigned)(id % 64);
        nvfp4_to_q4k(codes.data(), scales.data(), g, n, k, kp_nv, kp_q, out.data());
    }
    FILE* o = std::fopen(argv[2], "wb");
    if (!o || std::fwrite(out.data(), 1, out.size(), o) != out.size()) return 7;
    std::fclose(o);
    return 0;
}
