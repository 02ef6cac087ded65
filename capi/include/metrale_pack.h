/* metrale_pack.h: the C ABI of metrale-pack (capi/, libmetrale_pack_c: link with -lmetrale_pack_c).
 *
 * Convert a checkpoint into a pack with the command line's options. Load a pack onto a CUDA device (the primary context, which the CUDA runtime and torch use
 * too) or onto the host backend, look up its device tensors (type, shape, address: no copy),
 * run a dense FFN layer, free it. Every function is safe to call from any thread; a model is
 * used by one thread at a time. On failure a function returns NULL or -1 and
 * mp_last_error() says why (the file, tensor and field where the library names them). */
#ifndef METRALE_PACK_H
#define METRALE_PACK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Where a model's tensors live: DLPack's device types. */
#define MP_DEVICE_CPU 1
#define MP_DEVICE_CUDA 2

/* The most dimensions a tensor reports. */
#define MP_MAX_DIMS 8

/* The largest max_rows mp_load takes (the library's MAX_FORWARD_ROWS). */
#define MP_MAX_ROWS 65536

typedef struct mp_model mp_model;

/* One device tensor. The strings are owned by the model and live until mp_free. */
typedef struct {
    const char *name;        /* its name in the pack */
    const char *type;        /* its type in the pack: "F32", "F16", "BF16", "Q4_1", ... "I8" for FFN blobs */
    const char *source_type; /* the source's type name ("BF16", "F8_E4M3", ...) */
    const char *ffn_json;    /* an FFN blob's layout descriptor (its manifest entry) as JSON, or NULL */
    uint64_t data;           /* its address: device memory (CUDA) or host memory (CPU) */
    uint64_t bytes;          /* its length in bytes */
    int32_t ndim;            /* dimensions in shape (row-major; [bytes] for an FFN blob) */
    uint64_t shape[MP_MAX_DIMS];
} mp_tensor;

/* Why the last call on this thread failed ("" after a call that succeeded); valid until the
 * thread's next call. */
const char *mp_last_error(void);

/* Convert the checkpoint `src` (a GGUF file, a safetensors file or a folder of shards) into a
 * pack at `out`, as `metrale-pack convert` does, with `count` options: `names[i]` one of the
 * options mp_convert_option lists (the command line's flags, in snake_case: "layouts", "tp",
 * "allow_requantize", ...), `values[i]` its value in words ("bf16,fp8", "2", "true"). The pack is
 * written whole or not at all. Returns 0, or -1 (an unknown name, a value the option does not
 * take, a source refused). */
int mp_convert(const char *src, const char *out, const char *const *names,
               const char *const *values, size_t count);

/* The convert option at `index` (0, 1, ...): its name, and in `kind` ("switch", "count",
 * "words", "path", "choice:A|B") and `help` what it takes; NULL past the last one. The strings
 * are static. */
const char *mp_convert_option(size_t index, const char **kind, const char **help);

/* Load the pack at `path` onto `device` ("cuda", "cuda:N" or "cpu"): every device tensor
 * copied, every dense FFN layer installed and checked with one row; forward calls take up to
 * `max_rows` rows (at most MP_MAX_ROWS: a larger number is refused, not allocated).
 * `verify_checksums` reads every tensor back against the manifest. */
mp_model *mp_load(const char *path, const char *device, int verify_checksums, size_t max_rows);

/* Free the model: its device memory, layers and context. Returns 0 (NULL is ignored), or -1
 * for a pointer that is no live model (freed before, or not from mp_load): every handle is
 * checked against the library's registry, so a second free is an error, not a double free. */
int mp_free(mp_model *model);

/* The DLPack device type (MP_DEVICE_*) and device ordinal of the model's tensors. */
int32_t mp_device_type(const mp_model *model);
int32_t mp_device_id(const mp_model *model);

/* The model's hidden size (the width of forward's rows). */
size_t mp_hidden_size(const mp_model *model);

/* How many device tensors the model has, and tensor `index` (0-based, pack order). */
size_t mp_tensor_count(const mp_model *model);
int mp_tensor_at(const mp_model *model, size_t index, mp_tensor *out);

/* The index of device tensor `name`, or -1 (mp_last_error names what was missing). */
int64_t mp_tensor_index(const mp_model *model, const char *name);

/* Dense FFN layer `layer` on `rows` f32 rows [rows, hidden] at `x` into `y`, both in host
 * memory, through the arm the routing picks for that many rows. */
int mp_forward(mp_model *model, size_t layer, const float *x, float *y, size_t rows);

/* The same on device memory (CUDA models): `x` and `y` device addresses of f32 [rows, hidden],
 * queued on the CUstream `stream` (0: the legacy default stream), `x` read in place. */
int mp_forward_device(mp_model *model, size_t layer, uint64_t x, uint64_t y, size_t rows,
                      uint64_t stream);

#ifdef __cplusplus
}
#endif

#endif
