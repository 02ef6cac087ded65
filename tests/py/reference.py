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
    elif cmd == "quant_py":
        # gguf-py's own quantizers (BF16 = ggml_compute_fp32_to_bf16; F16 = numpy's IEEE cast).
        import gguf
        from gguf import quants
        x = np.ascontiguousarray(np.load(sys.argv[3]), dtype=np.float32)
        if sys.argv[2] == "F16":
            out = x.astype(np.float16)
        else:
            out = quants.quantize(x, gguf.GGMLQuantizationType[sys.argv[2]])
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
    elif cmd == "gguf_tensor":
        # gguf-py's own reader and dequantizer, in the logical (row-major) shape.
        import gguf
        from gguf import GGUFReader, quants
        r = GGUFReader(sys.argv[2])
        t = next(t for t in r.tensors if t.name == sys.argv[3])
        if sys.argv[5] == "raw":
            np.save(sys.argv[4], np.asarray(t.data).view(np.uint8).reshape(-1))
        else:
            shape = [int(d) for d in reversed(t.shape.tolist())]
            data = quants.dequantize(np.asarray(t.data), t.tensor_type)
            np.save(sys.argv[4], np.asarray(data, dtype=np.float32).reshape(shape))
    elif cmd == "st_tensor":
        # An independent safetensors read: header JSON + numpy view of the data.
        raw = open(sys.argv[2], "rb").read()
        n = int.from_bytes(raw[:8], "little")
        hdr = json.loads(raw[8:8 + n])
        info = hdr[sys.argv[3]]
        b, e = info["data_offsets"]
        dt = {"F32": np.float32, "F16": np.float16, "I64": np.int64}[info["dtype"]]
        a = np.frombuffer(raw[8 + n + b:8 + n + e], dtype=dt).astype(np.float32).reshape(info["shape"])
        np.save(sys.argv[4], a)
    elif cmd == "nvfp4_modelopt":
        # ModelOpt NVFP4 decode from the published convention, in float64:
        # w = E2M1[code] * e4m3(scale) * scale_2, even element in the low nibble.
        codes = np.load(sys.argv[2]).astype(np.uint8)
        scales = np.load(sys.argv[3]).astype(np.uint8)
        s2 = float(sys.argv[4])
        n = int(sys.argv[5])
        e2m1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])
        lo, hi = codes & 15, codes >> 4
        q = np.stack([lo, hi], axis=-1).reshape(n, -1)
        e = ((scales >> 3) & 15).astype(np.int64); m = (scales & 7).astype(np.float64)
        sc = np.where(e == 0, m * 2.0 ** -9, (1 + m / 8) * 2.0 ** (e - 7)).reshape(n, -1)
        w = e2m1[q] * np.repeat(sc, 16, axis=1) * s2
        np.save(sys.argv[6], w.astype(np.float64))
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
