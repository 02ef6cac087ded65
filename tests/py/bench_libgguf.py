"""Times libgguf.quantize_rows (ggml's reference quantizers) on an f32 .npy: prints
`TYPE seconds` per type, best of N runs. Used by benches/encode.rs as the peer measurement."""
import sys
import time

import gguf
import libgguf
import numpy as np

x = np.ascontiguousarray(np.load(sys.argv[1]), dtype=np.float32)
reps = int(sys.argv[2])
for name in sys.argv[3:]:
    q = int(gguf.GGMLQuantizationType[name])
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        libgguf.quantize_rows(x, q)
        best = min(best, time.perf_counter() - t)
    print(name, best, flush=True)
