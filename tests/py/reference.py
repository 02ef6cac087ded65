"""Independent references for the interop tests: gguf-py 0.19.0 (dequantize) and libgguf 0.2.2
(ggml's reference quantizers). Called by tests/common/mod.rs as
    python3 tests/py/reference.py dequant TYPE raw_u8.npy out_f32.npy
    python3 tests/py/reference.py quant TYPE in_f32.npy out_u8.npy   (input shape [rows, cols])
    python3 tests/py/reference.py sizes out.json
    python3 tests/py/reference.py tensors FILE.gguf out.json          (GGUFReader's tensor table)
"""
import json
import sys

import numpy as np


def main() -> None:
    cmd = sys.argv[1]
    if cmd == "dequant":
        import gguf
        from gguf import quants
        qtype = gguf.GGMLQuantizationType[sys.argv[2]]
        raw = np.load(sys.argv[3])
        out = quants.dequantize(raw, qtype).astype(np.float32, copy=False).reshape(-1)
        np.save(sys.argv[4], out)
    elif cmd == "quant":
        import libgguf
        import gguf
        qtype = int(gguf.GGMLQuantizationType[sys.argv[2]])
        x = np.ascontiguousarray(np.load(sys.argv[3]), dtype=np.float32)
        out = libgguf.quantize_rows(x, qtype)
        np.save(sys.argv[4], np.ascontiguousarray(out).view(np.uint8).reshape(-1))
    elif cmd == "sizes":
        from gguf.constants import GGML_QUANT_SIZES
        json.dump({t.name: list(v) for t, v in GGML_QUANT_SIZES.items()}, open(sys.argv[2], "w"))
    elif cmd == "tensors":
        from gguf import GGUFReader
        r = GGUFReader(sys.argv[2])
        out = {
            "alignment": int(r.alignment),
            "tensors": [
                {
                    "name": t.name,
                    "type": t.tensor_type.name,
                    "shape": [int(d) for d in reversed(t.shape.tolist())],
                    "offset": int(t.data_offset),
                    "bytes": int(t.n_bytes),
                }
                for t in r.tensors
            ],
            "kv": sorted(r.fields.keys()),
        }
        json.dump(out, open(sys.argv[3], "w"))
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
