/* The C ABI end to end on the host backend (python/tests/test_capi.py builds and runs it):
 *
 *   mp-smoke PACK LAYER ROWS X.raw Y.raw
 *
 * Prints a line per device tensor (name, type, source type, bytes, shape, FNV-1a 64 of its
 * bytes read at its address, whether it has an FFN descriptor), runs FFN layer LAYER on the
 * ROWS f32 rows of X.raw and writes them to Y.raw; checks the error paths. Exits non-zero on
 * any failure. */
#include "metrale_pack.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what) {
    fprintf(stderr, "mp-smoke: %s: %s\n", what, mp_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: mp-smoke PACK LAYER ROWS X.raw Y.raw\n");
        return 2;
    }
    if (mp_load("/nonexistent/x.mpk.gguf", "cpu", 0, 4) != NULL ||
        strstr(mp_last_error(), "/nonexistent/x.mpk.gguf") == NULL)
        return fail("a missing pack must fail naming its path");
    if (mp_load(argv[1], "tpu:0", 0, 4) != NULL || strstr(mp_last_error(), "expected") == NULL)
        return fail("an unknown device must fail");
    size_t layer = (size_t)atol(argv[2]), rows = (size_t)atol(argv[3]);
    mp_model *m = mp_load(argv[1], "cpu", 1, rows);
    if (m == NULL) return fail("mp_load");
    if (mp_device_type(m) != MP_DEVICE_CPU || mp_device_id(m) != 0) return fail("device");
    size_t n = mp_tensor_count(m), hidden = mp_hidden_size(m);
    if (n == 0 || hidden == 0) return fail("empty model");
    for (size_t i = 0; i < n; i++) {
        mp_tensor t;
        if (mp_tensor_at(m, i, &t) != 0) return fail("mp_tensor_at");
        if (mp_tensor_index(m, t.name) != (int64_t)i) return fail("mp_tensor_index");
        uint64_t h = 0xcbf29ce484222325ull;
        const unsigned char *p = (const unsigned char *)(uintptr_t)t.data;
        for (uint64_t j = 0; j < t.bytes; j++) h = (h ^ p[j]) * 0x100000001b3ull;
        printf("%s\t%s\t%s\t%llu\t", t.name, t.type, t.source_type, (unsigned long long)t.bytes);
        for (int32_t d = 0; d < t.ndim; d++)
            printf("%s%llu", d ? "," : "", (unsigned long long)t.shape[d]);
        printf("\t%016llx\t%d\n", (unsigned long long)h, t.ffn_json != NULL);
    }
    if (mp_tensor_index(m, "no.such.tensor") != -1) return fail("a missing name");
    if (mp_tensor_at(m, n, NULL) != -1) return fail("an index past the end");
    float *x = malloc(rows * hidden * 4), *y = malloc(rows * hidden * 4);
    FILE *f = fopen(argv[4], "rb");
    if (!f || fread(x, 4, rows * hidden, f) != rows * hidden) return fail("reading X");
    fclose(f);
    if (mp_forward(m, layer, x, y, rows) != 0) return fail("mp_forward");
    if (mp_forward(m, 999, x, y, rows) != -1 || strstr(mp_last_error(), "999") == NULL)
        return fail("a missing layer must fail naming it");
    if (mp_forward_device(m, layer, 1, 1, rows, 0) != -1) return fail("device forward on cpu");
    f = fopen(argv[5], "wb");
    if (!f || fwrite(y, 4, rows * hidden, f) != rows * hidden) return fail("writing Y");
    fclose(f);
    free(x);
    free(y);
    mp_free(m);
    mp_free(NULL);
    return 0;
}
