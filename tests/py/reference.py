"""Independent references for the interop tests: gguf-py 0.19.0 (dequantize) and libgguf 0.2.2
(ggml's reference quantizers). Called by tests/common/mod.rs as
    python3 tests/py/reference.py dequant TYPE raw_u8.npy out_f32.npy
    python3 tests/py/reference.py quant TYPE in_f32.npy out_u8.npy   (input shape [rows, cols])
    python3 tests/py/reference.py sizes out.json
    python3 tests/py/reference.py tensors FILE.gguf out.json          (GGUFReader's tensor table)
    python3 tests/py/reference.py fidelity PACK SRC.gguf out.json     (the fidelity table, independently)
    python3 tests/py/reference.py tp_slice SRC.gguf OUT.gguf RANK N   (rank RANK of N's sliced source)
    python3 tests/py/reference.py kmix_gguf DIR HIDDEN INTER silu|gelu MIX (a llama-quantize-shaped K-quant mix)
"""
import json
import sys

import numpy as np


def arch_gguf(kind: str, out_dir: str) -> None:
    """A small GGUF written by gguf-py's GGUFWriter whose FFN is not gate/up/down in every layer:
    `phi3` (a fused ffn_up of 2*I rows, Q8_0 by gguf-py's quantizer, no ffn_gate),
    `qwen2moe-mixed` (dense layers 0 and 2, expert layers 1 and 3) or `qwen2moe` (experts only).
    Writes OUT_DIR/model.gguf and, per dense layer, gguf-py's own f32 dequantization of each
    weight as OUT_DIR/L.{gate,up,down}.npy (a fused weight split into its halves)."""
    import os
    import gguf
    from gguf import quants

    rng = np.random.default_rng(5)
    h, i, layers, experts, ie = 64, 96, 4, 4, 32
    arch = "phi3" if kind == "phi3" else "qwen2moe"
    w = gguf.GGUFWriter(os.path.join(out_dir, "model.gguf"), arch)
    w.add_block_count(layers)
    w.add_embedding_length(h)
    w.add_feed_forward_length(i)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    if arch == "qwen2moe":
        w.add_expert_count(experts)
        w.add_expert_used_count(2)
    w.add_tensor("token_embd.weight", rng.standard_normal((32, h)).astype(np.float32))
    q8 = gguf.GGMLQuantizationType.Q8_0
    for layer in range(layers):
        w.add_tensor(f"blk.{layer}.attn_norm.weight", np.ones(h, dtype=np.float32))
        dense = kind == "phi3" or (kind == "qwen2moe-mixed" and layer % 2 == 0)
        if not dense:
            for p, shape in [("gate_exps", (experts, ie, h)), ("up_exps", (experts, ie, h)), ("down_exps", (experts, h, ie))]:
                w.add_tensor(f"blk.{layer}.ffn_{p}.weight", (rng.standard_normal(shape) * 0.05).astype(np.float32))
            w.add_tensor(f"blk.{layer}.ffn_gate_inp.weight", rng.standard_normal((experts, h)).astype(np.float32))
            continue
        gate = (rng.standard_normal((i, h)) * 0.05).astype(np.float32)
        up = (rng.standard_normal((i, h)) * 0.05).astype(np.float32)
        down = (rng.standard_normal((h, i)) * 0.05).astype(np.float32)
        if kind == "phi3":
            fused = quants.quantize(np.concatenate([gate, up]), q8)
            w.add_tensor(f"blk.{layer}.ffn_up.weight", fused, raw_dtype=q8)
            deq = quants.dequantize(fused, q8).astype(np.float32)
            np.save(os.path.join(out_dir, f"{layer}.gate.npy"), deq[:i])
            np.save(os.path.join(out_dir, f"{layer}.up.npy"), deq[i:])
        else:
            w.add_tensor(f"blk.{layer}.ffn_gate.weight", gate)
            w.add_tensor(f"blk.{layer}.ffn_up.weight", up)
            np.save(os.path.join(out_dir, f"{layer}.gate.npy"), gate)
            np.save(os.path.join(out_dir, f"{layer}.up.npy"), up)
        w.add_tensor(f"blk.{layer}.ffn_down.weight", down)
        np.save(os.path.join(out_dir, f"{layer}.down.npy"), down)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


IQ_LAYERS = [("IQ2_XXS", "IQ3_S", "IQ4_XS"), ("IQ1_S", "IQ2_S", "IQ1_M"), ("IQ4_NL", "IQ2_XS", "IQ3_XXS")]


def iq_gguf(out_dir: str) -> None:
    """A llama-shaped GGUF whose FFN weights are the nine IQ types, each quantized by libgguf
    (ggml's own quantizers; an importance matrix of the weights' column mean squares where ggml
    requires one), written by gguf-py's GGUFWriter; and gguf-py's dequantization of each weight
    as OUT_DIR/NAME.npy."""
    import os
    import gguf
    import libgguf
    from gguf import quants

    rng = np.random.default_rng(11)
    h, i = 256, 512
    w = gguf.GGUFWriter(os.path.join(out_dir, "model.gguf"), "llama")
    w.add_block_count(len(IQ_LAYERS))
    w.add_embedding_length(h)
    w.add_feed_forward_length(i)
    w.add_head_count(4)
    for layer, types in enumerate(IQ_LAYERS):
        for proj, ty, shape in zip(["gate", "up", "down"], types, [(i, h), (i, h), (h, i)]):
            x = (rng.standard_normal(shape) * 0.05).astype(np.float32)
            qt = int(gguf.GGMLQuantizationType[ty])
            imatrix = np.mean(x * x, axis=0).astype(np.float32) + 1e-6 if libgguf.quantize_requires_imatrix(qt) else None
            q = np.ascontiguousarray(libgguf.quantize_rows(x, qt, imatrix=imatrix)).view(np.uint8).reshape(shape[0], -1)
            name = f"blk.{layer}.ffn_{proj}.weight"
            w.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType[ty])
            np.save(os.path.join(out_dir, name + ".npy"), quants.dequantize(q, gguf.GGMLQuantizationType[ty]).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def kquant_type(ty: str, row: int) -> str:
    """llama.cpp's fallback for a K-quant whose rows are not whole 256-value super-blocks
    (llama-quant.cpp, llama_tensor_get_type: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0)."""
    if row % 256 == 0 or not ty.endswith("_K"):
        return ty
    return {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}[ty]


def kmix_gguf(out_dir: str, hidden: int, inter: int, act: str, mix: str, scales: str = "") -> None:
    """A GGUF as llama-quantize writes a K-quant mix: per layer `gate/up/down` types from MIX
    (`Q4_K/Q4_K/Q6_K;Q4_K/Q4_K/Q4_K;...`), llama.cpp's fallback where a row is not whole
    super-blocks (`kquant_type`), each weight quantized by libgguf (ggml's quantizers) and
    written by gguf-py's GGUFWriter, with the attention and norm tensors of a llama (or, with
    ACT gelu, a gemma3) block in F32; and gguf-py's dequantization of each FFN weight as
    OUT_DIR/NAME.npy."""
    import os
    import gguf
    import libgguf
    from gguf import quants

    rng = np.random.default_rng(5)
    layers = [l.split("/") for l in mix.split(";")]
    arch = "gemma3" if act == "gelu" else "llama"
    w = gguf.GGUFWriter(os.path.join(out_dir, "model.gguf"), arch)
    w.add_block_count(len(layers))
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_context_length(128)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tensor("token_embd.weight", (rng.standard_normal((64, hidden)) * 0.02).astype(np.float32))
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    for layer, types in enumerate(layers):
        w.add_tensor(f"blk.{layer}.attn_norm.weight", np.ones(hidden, dtype=np.float32))
        w.add_tensor(f"blk.{layer}.ffn_norm.weight", np.ones(hidden, dtype=np.float32))
        scale_of = dict(item.split("=") for item in filter(None, scales.split(",")))
        for proj, ty, shape in zip(["gate", "up", "down"], types, [(inter, hidden), (inter, hidden), (hidden, inter)]):
            ty = kquant_type(ty, shape[1])
            x = (rng.standard_normal(shape) * 0.05).astype(np.float32)
            # With an output scale s the blocks hold x / s, as llama.cpp's converter splits
            # ModelOpt's NVFP4 weight into blocks and `weight_scale_2`.
            if proj in scale_of:
                x = (x / np.float32(scale_of[proj])).astype(np.float32)
            qt = gguf.GGMLQuantizationType[ty]
            imatrix = np.mean(x * x, axis=0).astype(np.float32) + 1e-6 if libgguf.quantize_requires_imatrix(int(qt)) else None
            q = np.ascontiguousarray(libgguf.quantize_rows(x, int(qt), imatrix=imatrix)).view(np.uint8).reshape(shape[0], -1)
            name = f"blk.{layer}.ffn_{proj}.weight"
            w.add_tensor(name, q, raw_dtype=qt)
            np.save(os.path.join(out_dir, name + ".npy"), quants.dequantize(q, qt).astype(np.float32))
            # SCALES "up=0.5,...": llama.cpp's optional per-tensor output scale, `blk.N.ffn_X.scale` [1].
            if proj in scale_of:
                w.add_tensor(f"blk.{layer}.ffn_{proj}.scale", np.array([float(scale_of[proj])], dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


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
    elif cmd == "kv_json":
        # Every metadata value as gguf-py reads it (GGUF.* header fields left out).
        from gguf import GGUFReader
        r = GGUFReader(sys.argv[2])
        out = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
        json.dump(out, open(sys.argv[3], "w"))
    elif cmd == "kv_string":
        # The bytes of one string KV, as gguf-py reads them.
        from gguf import GGUFReader
        f = GGUFReader(sys.argv[2]).fields[sys.argv[3]]
        open(sys.argv[4], "wb").write(bytes(f.parts[f.data[0]]))
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
    elif cmd == "fidelity":
        # The pack's fidelity table computed independently: every layout decoded here from its
        # bytes as formats.md specifies them (Q4_K blocks by gguf-py), every source weight by
        # gguf-py, the relative error in float64.
        fidelity(sys.argv[2], sys.argv[3], sys.argv[4])
    elif cmd == "iq_gguf":
        iq_gguf(sys.argv[2])
    elif cmd == "kmix_gguf":
        kmix_gguf(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6], *sys.argv[7:8])
    elif cmd == "iq_grid":
        from gguf import quants

        cls = getattr(quants, sys.argv[2])
        cls.init_grid()
        np.save(sys.argv[3], np.ascontiguousarray(cls.grid, dtype=np.float32).reshape(-1))
    elif cmd == "arch_gguf":
        arch_gguf(sys.argv[2], sys.argv[3])
    elif cmd == "tp_slice":
        tp_slice(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        raise SystemExit(f"unknown command {cmd}")


def tp_slice(src, out, r, n):
    """Rank r of n's slice of a GGUF model, written by gguf-py: FFN gate/up keep the rows of the
    rank's intermediate range [r*I//n, (r+1)*I//n), down those columns; attention q by head
    ranges, k/v by KV-head ranges (a KV head shared by n/kv ranks where kv < n), the output by
    q's columns. A cut through a quantization block leaves the tensor dequantized to F32 (gguf-py's
    dequantize); every other slice keeps the source's bytes. Metadata: the architecture, sizes,
    block count and feed_forward_length = the rank's range. The tensor-parallel tests convert
    this file with --tp 1 and compare with the --tp n pack's rank r, bit for bit."""
    import gguf
    from gguf import GGUFReader, GGUFWriter, quants
    from gguf.constants import GGML_QUANT_SIZES

    rd = GGUFReader(src)

    def field(k):
        f = rd.fields.get(k)
        if f is None:
            return None
        v = f.parts[f.data[0]]
        return bytes(v).decode() if f.types[0] == gguf.GGUFValueType.STRING else int(v[0])

    arch = field("general.architecture")
    inter = field(f"{arch}.feed_forward_length")
    heads, kv = field(f"{arch}.attention.head_count"), field(f"{arch}.attention.head_count_kv")
    lo, hi = r * inter // n, (r + 1) * inter // n
    # FFN slices are zero-padded to a multiple of 32 (formats.md, TP_INTER_ALIGN).
    pad = -(hi - lo) % 32
    w = GGUFWriter(out, arch)
    for key in ("embedding_length", "block_count"):
        w.add_uint32(f"{arch}.{key}", field(f"{arch}.{key}"))
    w.add_uint32(f"{arch}.feed_forward_length", hi - lo + pad)

    def head_range(rows, kind):
        if kind == "kv" and kv < n:
            hd = rows // kv
            h = r // (n // kv)
            return h * hd, (h + 1) * hd
        count = kv if kind == "kv" else heads
        per = rows // count * (count // n)
        return r * per, (r + 1) * per

    for t in rd.tensors:
        ty = t.tensor_type
        bs, ts = GGML_QUANT_SIZES[ty]
        raw = np.asarray(t.data)
        rows = int(t.shape[1]) if len(t.shape) > 1 else int(t.shape[0])
        cols = int(t.shape[0]) if len(t.shape) > 1 else 1
        raw = raw.view(np.uint8).reshape(rows, cols // bs * ts)
        name = t.name
        part = name.split(".")[-2] if name.count(".") >= 2 else ""
        cut = None
        if part in ("ffn_gate", "ffn_up"):
            cut = ("rows", lo, hi)
        elif part == "ffn_down":
            cut = ("cols", lo, hi)
        elif part == "attn_q":
            cut = ("rows",) + head_range(rows, "q")
        elif part in ("attn_k", "attn_v"):
            cut = ("rows",) + head_range(rows, "kv")
        elif part == "attn_output" and name.endswith(".weight"):
            cut = ("cols",) + head_range(cols, "q")
        zeros = pad if part.startswith("ffn_") else 0
        if cut is None:
            data = raw
        elif cut[0] == "rows":
            data = np.concatenate([raw[cut[1]:cut[2]], np.zeros((zeros, raw.shape[1]), np.uint8)])
        elif cut[1] % bs == 0 and cut[2] % bs == 0 and zeros % bs == 0:
            data = raw[:, cut[1] // bs * ts:cut[2] // bs * ts]
            data = np.concatenate([data, np.zeros((rows, zeros // bs * ts), np.uint8)], axis=1)
        else:
            full = quants.dequantize(raw, ty).astype(np.float32).reshape(rows, cols)
            cols_f32 = np.concatenate([full[:, cut[1]:cut[2]], np.zeros((rows, zeros), np.float32)], axis=1)
            w.add_tensor(name, np.ascontiguousarray(cols_f32))
            continue
        data = np.ascontiguousarray(data)
        if len(t.shape) == 1:
            data = data.reshape(-1)
        w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])


def e4m3(b):
    b = b.astype(np.int64)
    s = np.where(b >> 7, -1.0, 1.0)
    e, m = (b >> 3) & 15, (b & 7).astype(np.float64)
    return s * np.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * 2.0 ** (e - 7))


def decode_layout(fe, part):
    """One projection of one layout decoded from its bytes (float64, logical [n, k]) as formats.md
    specifies: `fe` its manifest `ffn` entry, `part(suffix)` its parts' bytes ("" for a single
    blob)."""
    import gguf
    from gguf import quants
    layout, proj = fe["layout"], fe["proj"]
    n, k = fe["shape"]
    np_, kp = fe["padded"]
    if layout == "nvfp4":
        c, s = part("codes").reshape(n, kp // 2), part("scales").reshape(n, kp // 16)
        q = np.stack([c & 15, c >> 4], axis=-1).reshape(n, kp)
        w = E2M1[q] * np.repeat(e4m3(s), 16, axis=1) * fe["scalars"]["global_scale"]
    elif layout == "nvfp4_t":
        c, s = part("codes").reshape(kp, np_ // 2), part("scales").reshape(kp // 16, np_)
        q = np.stack([c & 15, c >> 4], axis=-1).reshape(kp, np_).T
        w = E2M1[q] * np.repeat(e4m3(s).T, 16, axis=1) * fe["scalars"]["global_scale"]
    elif layout == "nvfp4_mmq":
        t = part("").reshape(np_ // 128, kp // 64, 4608)
        sc = t[:, :, :512].reshape(np_ // 128, kp // 64, 128, 4)
        cd = t[:, :, 512:].reshape(np_ // 128, kp // 64, 128, 32)
        q = np.stack([cd & 15, cd >> 4], axis=-1).reshape(np_ // 128, kp // 64, 128, 64)
        v = E2M1[q] * np.repeat(e4m3(sc), 16, axis=3)
        w = v.transpose(0, 2, 1, 3).reshape(np_, kp) * fe["scalars"]["global_scale"]
    elif layout == "q4k_mmq" and fe["part"] == "":
        w = np.asarray(quants.dequantize(part("").reshape(n, -1), gguf.GGMLQuantizationType.Q4_K), dtype=np.float64).reshape(n, kp)
    elif layout == "q4k_mmq":
        w = part("codes").view(np.int8).reshape(n, kp) * part("scales").view(np.float32).astype(np.float64)[:, None]
    elif layout == "fp8":
        c = e4m3(part("codes")).reshape(np_, kp)
        g = part("scales").view(np.float32).astype(np.float64).reshape(-1, kp // 128)
        w = c * np.repeat(np.repeat(g, 128, axis=0), 128, axis=1)[:np_]
        if proj == "gate_up":
            half, interp = n // 2, np_ // 2
            w = np.concatenate([w[:half], w[interp:interp + half]])
    elif layout == "w8a8":
        w = e4m3(part("codes")).reshape(n, kp) * part("scales").view(np.float32).astype(np.float64)[:, None]
    elif layout == "bf16":
        w = (part("").view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64).reshape(n, kp)
    elif layout == "q2g128":
        b = part("").reshape(n, kp // 128, 34)
        d = b[:, :, :2].copy().view(np.float16).astype(np.float64)
        qs = b[:, :, 2:]
        q = np.stack([(qs >> (2 * s)) & 3 for s in range(4)], axis=2).reshape(n, kp // 128, 128)
        w = (d * (q.astype(np.float64) - 2)).reshape(n, kp)
    elif layout == "affine":
        bits, group = int(fe["scalars"]["bits"]), int(fe["scalars"]["group"])
        form = int(fe["scalars"].get("form", 0))  # 0: s q + b; 1 (halves), 2 (f32): s (q - z)
        c = part("codes")
        q = np.stack([c & 15, c >> 4], axis=-1).reshape(n, kp) if bits == 4 else c.reshape(n, kp)
        dt = np.float32 if form == 2 else np.float16
        sb = part("scales").view(dt).astype(np.float64).reshape(n, kp // group, 2)
        s, t = (np.repeat(sb[:, :, i], group, axis=1) for i in (0, 1))
        w = s * q + t if form == 0 else s * (q - t)
    elif layout == "ggml":
        # The blob's GGUF blocks, decoded by gguf-py, its type the `type` scalar.
        qt = gguf.GGMLQuantizationType(int(fe["scalars"]["type"]))
        w = np.asarray(quants.dequantize(part("").reshape(n, -1), qt), dtype=np.float64).reshape(n, kp)
    else:
        raise SystemExit(f"no decoder for {layout}")
    return w[:n, :k]


def fidelity(pack_path, src_path, out_path):
    import gguf
    from gguf import GGUFReader, quants
    pr, sr = GGUFReader(pack_path), GGUFReader(src_path)
    f = pr.fields["metrale.pack.manifest"]
    man = json.loads(bytes(f.parts[f.data[0]]).decode().rstrip())
    blob = {t.name: np.asarray(t.data).view(np.uint8).reshape(-1) for t in pr.tensors}
    src = {}
    for t in sr.tensors:
        shape = [int(d) for d in reversed(t.shape.tolist())]
        src[t.name] = np.asarray(quants.dequantize(np.asarray(t.data), t.tensor_type), dtype=np.float64).reshape(shape)
    ents = {}
    for e in man["tensors"]:
        fe = e.get("ffn")
        # One entry per projection: the single part, or the codes (their scales are read
        # beside them).
        if fe and fe["layout"] != "lora" and fe["part"] in ("", "codes"):
            ents[(fe["layer"], fe["layout"], fe["proj"])] = fe
    acc = {}
    for (layer, layout, proj), fe in sorted(ents.items()):
        name = f"blk.{layer}.ffn_{proj}.{layout}"
        w = decode_layout(fe, lambda p, name=name: blob[f"{name}.{p}"] if p else blob[name])

        if proj == "gate_up":
            ref = np.concatenate([src[f"blk.{layer}.ffn_gate.weight"], src[f"blk.{layer}.ffn_up.weight"]])
        else:
            ref = src[f"blk.{layer}.ffn_{proj}.weight"]
        num, den = np.sum((w - ref) ** 2), np.sum(ref ** 2)
        rel = float(np.sqrt(num / den)) if den > 0 else float(np.sqrt(num))
        a = acc.setdefault((layout, proj), [0.0, -1.0, 0, 0])
        a[0] += rel
        if rel > a[1]:
            a[1], a[2] = rel, layer
        a[3] += 1
    out = [{"layout": l, "proj": p, "worst_rel_err": a[1], "worst_layer": a[2], "mean_rel_err": a[0] / a[3]}
           for (l, p), a in acc.items()]
    json.dump(out, open(out_path, "w"))


if __name__ == "__main__":
    main()
