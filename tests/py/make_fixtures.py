#!/usr/bin/env python3
"""Write the real-toolchain fixtures under tests/fixtures/ (run by hand, not in CI: needs torch).

Each fixture is a small llama-shaped checkpoint (hidden 256, a small vocabulary) written by the
library itself, with the library's own decompression as the reference:

- compressed-tensors: NVFP4 (W4A16 one file and two shards, W4A4), MXFP4 (MXFP4A16, `ONLY=mxfp4`),
  FP8 per tensor, per channel
  and block 128x128, each from a bf16 and an f32 model, with intermediate sizes 384 (a multiple
  of 128) and 320 (not). Scales come from the library's own `calculate_qparams` /
  `generate_gparam` over the weights' min/max (what llm-compressor's min-max observer feeds it);
  the model is compressed with `ModelCompressor.compress_model` and saved with
  `save_pretrained` + `update_config`; the reference is `ModelCompressor.decompress_model` on the
  model loaded back from disk.
- NVIDIA ModelOpt: `mtq.quantize(model, NVFP4_DEFAULT_CFG, forward_loop)` and
  `export_hf_checkpoint`; the reference is ModelOpt's own NVFP4 dequantization of each weight.
- AutoAWQ 0.2.9 (GEMM packing) and AutoGPTQ 0.7.1 (`ONLY=awq`, `ONLY=gptq`; see their
  sections for the environment each needs): the reference is the library's own dequantization.
- bitsandbytes (`ONLY=bnb`, CPU, with accelerate): NF4 and FP4 (double-quantized absmax or not)
  and LLM.int8, written by transformers' `BitsAndBytesConfig` flow; the reference is bitsandbytes'
  own dequantization.
- PEFT: LoRA adapters on gate/up/down of the bf16 base (default scaling, rslora, rank_pattern,
  alpha_pattern, some projections only, DoRA, lora_bias, attention targets); the reference is
  PEFT's own `get_delta_weight` per module.

The references are stored as SHA-256 digests of the f32 little-endian bytes (and, where the
library decompresses into bf16, of its bf16 bytes) in each fixture's `expected.json`, so the
repository holds the checkpoints but not a float copy of every weight.

Usage: python tests/py/make_fixtures.py [OUT_DIR]   (default: tests/fixtures)
"""

import hashlib
import json
import os
import shutil
import sys

import torch

OUT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "fixtures"))
HIDDEN = 256
VOCAB = 64


def versions():
    import importlib.metadata as md

    out = {"torch": torch.__version__}
    for p in ["compressed-tensors", "nvidia-modelopt", "peft", "transformers", "safetensors", "autoawq", "auto-gptq",
              "bitsandbytes", "accelerate"]:
        try:
            out[p] = md.version(p)
        except md.PackageNotFoundError:
            pass
    return out


def llama(inter, layers, dtype, seed):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        hidden_size=HIDDEN,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        architectures=["LlamaForCausalLM"],
    )
    m = LlamaForCausalLM(cfg).to(dtype)
    # Weights of a trained model's scale (not the init's tiny std), with a few outlier rows.
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.ndim == 2:
                p.copy_((torch.randn(p.shape) * 0.05).to(dtype))
                p[0, :8] *= 20
    m.eval()
    return m


def digest(t):
    return hashlib.sha256(t.detach().contiguous().cpu().numpy().tobytes()).hexdigest()


def f32_digest(t):
    return digest(t.to(torch.float32))


def bf16_digest(t):
    return hashlib.sha256(t.detach().to(torch.bfloat16).contiguous().view(torch.int16).cpu().numpy().tobytes()).hexdigest()


def fresh(name):
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return d


def write_expected(d, expected):
    expected["versions"] = versions()
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")


# --------------------------------------------------------------------------------------------
# compressed-tensors


# Integer schemes not among the presets: (bits, strategy, group_size, symmetric, int8 activations).
CT_INT_CUSTOM = {
    "int8-tensor-asym": (8, "tensor", None, False, True),
    "int4-g32-asym": (4, "group", 32, False, False),
    "int4-channel-asym": (4, "channel", None, False, False),
}


def ct_scheme(kind):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme, preset_name_to_scheme

    if kind in CT_INT_CUSTOM:
        bits, strategy, group, sym, acts = CT_INT_CUSTOM[kind]
        w = QuantizationArgs(num_bits=bits, type="int", strategy=strategy, group_size=group, symmetric=sym)
        a = QuantizationArgs(num_bits=8, type="int", strategy="token", symmetric=True, dynamic=True) if acts else None
        return QuantizationScheme(targets=["Linear"], weights=w, input_activations=a)
    preset = {
        "fp8-tensor": "FP8",
        "fp8-channel": "FP8_DYNAMIC",
        "fp8-block": "FP8_BLOCK",
        "nvfp4a16": "NVFP4A16",
        "nvfp4": "NVFP4",
        "mxfp4a16": "MXFP4A16",
        "int8-w8a8": "W8A8",
        "w4a16": "W4A16",
        "w4a16-asym": "W4A16_ASYM",
        "w8a16": "W8A16",
        "w3a16": "W3A16",
    }[kind]
    s = preset_name_to_scheme(preset, ["Linear"])
    assert isinstance(s, QuantizationScheme)
    return s


def ct_calibrate(model, kind):
    """Weight scales (and NVFP4 global scales) from the library's own functions over each
    weight's min/max, as llm-compressor's min-max observer computes them."""
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam
    from compressed_tensors.quantization import QuantizationStrategy

    for name, mod in model.named_modules():
        scheme = getattr(mod, "quantization_scheme", None)
        if scheme is None or scheme.weights is None:
            continue
        args = scheme.weights
        w = mod.weight.detach()
        n, k = w.shape
        gs = None
        if args.strategy == QuantizationStrategy.TENSOR:
            lo, hi = torch.aminmax(w)
        elif args.strategy == QuantizationStrategy.CHANNEL:
            lo, hi = w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
        elif args.strategy == QuantizationStrategy.BLOCK:
            bn, bk = args.block_structure
            gn, gk = -(-n // bn), -(-k // bk)
            pad = torch.zeros(gn * bn, gk * bk, dtype=w.dtype)
            pad[:n, :k] = w
            b = pad.reshape(gn, bn, gk, bk).transpose(1, 2).reshape(gn, gk, bn * bk)
            lo, hi = b.amin(dim=-1), b.amax(dim=-1)
        elif args.strategy == QuantizationStrategy.GROUP:
            g = args.group_size
            b = w.reshape(n, k // g, g)
            lo, hi = b.amin(dim=-1), b.amax(dim=-1)
        elif args.strategy == QuantizationStrategy.TENSOR_GROUP:
            g = args.group_size
            gl, gh = torch.aminmax(w)
            gs = generate_gparam(gl, gh)
            mod.weight_global_scale.data.copy_(gs.to(mod.weight_global_scale.dtype))
            b = w.reshape(n, k // g, g)
            lo, hi = b.amin(dim=-1), b.amax(dim=-1)
        else:
            raise ValueError(args.strategy)
        scale, zp = calculate_qparams(lo, hi, args, global_scale=gs)
        mod.weight_scale.data.copy_(scale.reshape(mod.weight_scale.shape).to(mod.weight_scale.dtype))
        if hasattr(mod, "weight_zero_point"):
            mod.weight_zero_point.data.copy_(zp.reshape(mod.weight_zero_point.shape).to(mod.weight_zero_point.dtype))
        ia = scheme.input_activations
        if ia is not None and hasattr(mod, "input_global_scale"):
            # A fixed calibration activation range (what a calibration pass would have observed).
            torch.manual_seed(7)
            x = torch.randn(64, k) * 2.0
            mod.input_global_scale.data.copy_(generate_gparam(x.min(), x.max()).to(mod.input_global_scale.dtype))


def ct_write(name, kind, dtype, inter, layers=1, shards=False, seed=1):
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config
    from compressed_tensors.compressors import ModelCompressor

    d = fresh(name)
    model = llama(inter, layers, dtype, seed)
    scheme = ct_scheme(kind)
    qcfg = QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"])
    apply_quantization_config(model, qcfg)
    ct_calibrate(model, kind)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(d, max_shard_size="600KB" if shards else "1GB")
    compressor.update_config(d)
    # The library's own decompression of what was written, loaded back from disk.
    ref = ct_reference(d, dtype, scheme.weights)
    exp = {"library": "compressed-tensors", "scheme": kind, "model_dtype": str(dtype).replace("torch.", ""),
           "intermediate_size": inter, "hidden_size": HIDDEN, "layers": layers, "weights": ref}
    write_expected(d, exp)
    return d


def ct_exact_f32(d, name, args):
    """The library's own `dequantize` on the stored tensors, everything in f32."""
    from safetensors import safe_open
    from compressed_tensors.quantization.lifecycle.forward import dequantize
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8

    base = name[: -len(".weight")]
    files = [f for f in os.listdir(d) if f.endswith(".safetensors")]
    t = {}
    for f in files:
        with safe_open(os.path.join(d, f), "pt") as h:
            for k in h.keys():
                if k.startswith(base + "."):
                    t[k[len(base) + 1 :]] = h.get_tensor(k)
    if "weight_shape" in t:
        # pack-quantized integers: the library's own decompression, with f32 scales.
        from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
        from compressed_tensors.quantization import QuantizationScheme

        sd = dict(t)
        sd["weight_scale"] = sd["weight_scale"].to(torch.float32)
        scheme = QuantizationScheme(targets=["Linear"], weights=args)
        return PackedQuantizationCompressor.decompress(sd, scheme)["weight"]
    if "weight_packed" in t and "weight_global_scale" not in t:
        # MXFP4: E8M0 group scales, the library's own decompression of them.
        from compressed_tensors.compressors.mx_utils import decompress_mx_scale

        p = t["weight_packed"]
        q = unpack_fp4_from_uint8(p, p.shape[0], p.shape[1] * 2, dtype=torch.float32)
        scale = decompress_mx_scale(t["weight_scale"]).to(torch.float32)
        return dequantize(x_q=q, scale=scale, args=args, dtype=torch.float32)
    if "weight_packed" in t:
        p = t["weight_packed"]
        q = unpack_fp4_from_uint8(p, p.shape[0], p.shape[1] * 2, dtype=torch.float32)
        return dequantize(x_q=q, scale=t["weight_scale"].to(torch.float32), args=args,
                          global_scale=t["weight_global_scale"].to(torch.float32), dtype=torch.float32)
    return dequantize(x_q=t["weight"], scale=t["weight_scale"].to(torch.float32), zero_point=t.get("weight_zero_point"),
                      args=args, dtype=torch.float32)


def ct_reference(d, dtype, args):
    from transformers import AutoModelForCausalLM
    from transformers.utils.quantization_config import CompressedTensorsConfig

    m = AutoModelForCausalLM.from_pretrained(
        d, dtype=dtype, quantization_config=CompressedTensorsConfig(run_compressed=False)
    )
    out = {}
    for name, mod in m.named_modules():
        if name.endswith(("gate_proj", "up_proj", "down_proj", "q_proj", "o_proj")) and hasattr(mod, "weight"):
            w = mod.weight.detach()
            exact = ct_exact_f32(d, name + ".weight", args)
            # The library's own decompression rounds into the model dtype; in f32 it is exact.
            assert torch.equal(exact.to(w.dtype), w), name
            out[name + ".weight"] = {
                "shape": list(w.shape),
                "lib_dtype": str(w.dtype).replace("torch.", ""),
                "sha256_lib": digest(w.view(torch.int16) if w.dtype == torch.bfloat16 else w),
                "sha256_f32": f32_digest(exact),
                "amax": float(w.float().abs().max()),
            }
    return out


# --------------------------------------------------------------------------------------------
# Architectures whose FFN is not three separate projections in every layer: Phi-3 (a fused
# gate_up_proj) and Qwen2-MoE with dense layers between the expert layers.


def arch_write(name, kind, seed=11):
    import transformers

    torch.manual_seed(seed)
    d = fresh(name)
    if kind == "phi3":
        cfg = transformers.Phi3Config(hidden_size=HIDDEN, intermediate_size=384, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4, vocab_size=VOCAB,
                                      max_position_embeddings=128, pad_token_id=0, tie_word_embeddings=False)
        m = transformers.Phi3ForCausalLM(cfg).to(torch.bfloat16)
    else:
        cfg = transformers.Qwen2MoeConfig(hidden_size=HIDDEN, intermediate_size=384, moe_intermediate_size=128,
                                          shared_expert_intermediate_size=256, num_experts=4, num_experts_per_tok=2,
                                          num_hidden_layers=4, mlp_only_layers=[0, 2], num_attention_heads=4,
                                          num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=128,
                                          tie_word_embeddings=False)
        m = transformers.Qwen2MoeForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for _, p in m.named_parameters():
            if p.ndim >= 2:
                p.copy_((torch.randn(p.shape) * 0.05).to(p.dtype))
    m.save_pretrained(d)
    # The reference: each dense layer's gate, up and down as the model's own forward splits them.
    out = {}
    for i, layer in enumerate(m.model.layers):
        mlp = layer.mlp
        if kind == "phi3":
            gu = mlp.gate_up_proj.weight.detach()
            gate, up = gu.chunk(2, dim=0)
        elif hasattr(mlp, "gate_proj"):
            gate, up = mlp.gate_proj.weight.detach(), mlp.up_proj.weight.detach()
        else:
            continue
        for proj, w in [("gate", gate), ("up", up), ("down", mlp.down_proj.weight.detach())]:
            out[f"{i}.{proj}"] = {"shape": list(w.shape), "sha256_f32": f32_digest(w)}
    write_expected(d, {"library": "transformers", "architecture": kind, "dense_layers": sorted({int(k.split(".")[0]) for k in out}),
                       "tensors": sorted(__import__("safetensors").safe_open(os.path.join(d, "model.safetensors"), "pt").keys()),
                       "weights": out})


# --------------------------------------------------------------------------------------------
# AutoAWQ's GEMM packing (the legacy `qweight` / `qzeros` / `scales` format transformers loads
# with `quant_method: awq`), written by the library's own `WQLinear_GEMM.from_linear` from
# min-max asymmetric group scales (what AWQ's `pseudo_quantize_tensor` computes, without the
# activation-aware search, which changes the values and not the format). AutoAWQ 0.2.9's package
# __init__ imports model code that transformers 5 no longer has, so its `awq` package is mounted
# without running it (AWQ_SRC: the unpacked sdist).


def awq_write(name, group=128, inter=384, seed=5):
    import sys
    import types

    src = os.environ["AWQ_SRC"]
    pkg = types.ModuleType("awq")
    pkg.__path__ = [os.path.join(src, "awq")]
    sys.modules["awq"] = pkg
    from awq.modules.linear.gemm import WQLinear_GEMM
    from awq.utils.packing_utils import dequantize_gemm
    from safetensors.torch import save_file

    d = fresh(name)
    model = llama(inter, 1, torch.float16, seed)
    sd = {}
    out = {}
    for mname, mod in model.named_modules():
        if not isinstance(mod, torch.nn.Linear) or mname == "lm_head":
            continue
        w = mod.weight.detach().float()
        n, k = w.shape
        g = w.reshape(n, k // group, group)
        lo, hi = g.amin(-1), g.amax(-1)
        scales = ((hi - lo).clamp(min=1e-5) / 15).half()  # [n, G]
        zeros = torch.clamp(-torch.round(lo / scales.float()), 0, 15)  # [n, G]
        q = WQLinear_GEMM.from_linear(mod.float().cpu(), 4, group, scales=scales.t().contiguous().float(),
                                      zeros=zeros.t().contiguous())
        q.qweight, q.qzeros, q.scales = q.qweight.cpu(), q.qzeros.cpu(), q.scales.cpu()
        for t in ["qweight", "qzeros", "scales"]:
            sd[f"{mname}.{t}"] = getattr(q, t).contiguous()
        lib = dequantize_gemm(q.qweight, q.qzeros, q.scales, 4, group).t().contiguous()  # f16 [n, k]
        exact = dequantize_gemm(q.qweight, q.qzeros, q.scales.float(), 4, group).t().contiguous()
        assert torch.equal(exact.half(), lib), mname
        out[mname + ".weight"] = {"shape": [n, k], "lib_dtype": "float16", "sha256_lib": digest(lib.view(torch.int16)),
                                  "sha256_f32": f32_digest(exact), "amax": float(lib.float().abs().max())}
    for pname, p in model.named_parameters():
        mod = pname.rsplit(".", 1)[0]
        if f"{mod}.qweight" not in sd:
            sd[pname] = p.detach().contiguous()
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group, "version": "gemm", "zero_point": True}
    cfg["torch_dtype"] = "float16"
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    exp = {"library": "autoawq 0.2.9 (WQLinear_GEMM.from_linear, dequantize_gemm)", "scheme": f"awq-gemm-g{group}",
           "model_dtype": "float16", "intermediate_size": inter,
           "hidden_size": HIDDEN, "layers": 1, "weights": out}
    write_expected(d, exp)


# --------------------------------------------------------------------------------------------
# GPTQ's own packing (AutoGPTQ 0.7.1: `quant_method: gptq`, the v1 zero points), written by the
# library's whole flow: `AutoGPTQForCausalLM.from_pretrained`, `quantize` (the GPTQ algorithm
# on random calibration tokens) and `save_quantized`. AutoGPTQ 0.7.1 needs transformers 4.x and
# asks for CUDA; nothing in its quantization needs a GPU, so its device constant, the
# `is_available` check at load and the timing `synchronize` are pointed at the CPU (run with
# PYTHONPATH holding transformers 4.40 and peft 0.10; `datasets`, which it imports and this
# never calls, may be a stand-in). The reference is the library's own `QuantLinear.forward`
# (the class AutoGPTQ picks for the scheme) on the identity: its F16 weights, and with F32
# scales the exact ones.


def gptq_reference(d, bits, group, desc_act):
    from safetensors import safe_open
    from auto_gptq.utils.import_utils import dynamically_import_QuantLinear

    ql_cls = dynamically_import_QuantLinear(use_triton=False, desc_act=desc_act, group_size=group, bits=bits,
                                            disable_exllama=True, disable_exllamav2=True)
    f = safe_open(os.path.join(d, [x for x in os.listdir(d) if x.endswith(".safetensors")][0]), "pt")
    out = {}
    for key in sorted(f.keys()):
        if not key.endswith(".qweight"):
            continue
        base = key[: -len(".qweight")]
        t = {s: f.get_tensor(f"{base}.{s}") for s in ["qweight", "qzeros", "scales", "g_idx"]}
        bias = f.get_tensor(f"{base}.bias")
        assert not bias.any(), base  # llama has no biases: AutoGPTQ writes zeros
        k, n = t["g_idx"].shape[0], t["scales"].shape[1]
        weights = {}
        for dt in [torch.float16, torch.float32]:
            ql = ql_cls(bits=bits, group_size=group if group > 0 else k, infeatures=k, outfeatures=n, bias=False)
            ql.qweight, ql.qzeros, ql.g_idx = t["qweight"], t["qzeros"], t["g_idx"]
            ql.scales = t["scales"].to(dt)
            with torch.no_grad():
                weights[dt] = ql(torch.eye(k, dtype=dt)).t().contiguous()  # [n, k]
        lib, exact = weights[torch.float16], weights[torch.float32]
        assert torch.equal(exact.half(), lib), base
        out[base + ".weight"] = {"shape": [n, k], "lib_dtype": "float16", "sha256_lib": digest(lib.view(torch.int16)),
                                 "sha256_f32": f32_digest(exact), "amax": float(lib.float().abs().max())}
    return out


def gptq_write(name, bits=4, group=128, desc_act=False, sym=True, inter=384, seed=7):
    import tempfile

    import auto_gptq.modeling._base as gbase
    from auto_gptq import AutoGPTQForCausalLM, BaseQuantizeConfig

    gbase.CUDA_0 = torch.device("cpu")
    torch.cuda.synchronize = lambda *a, **k: None
    d = fresh(name)
    with tempfile.TemporaryDirectory() as src:
        llama(inter, 1, torch.float16, seed).save_pretrained(src, safe_serialization=True)
        avail = torch.cuda.is_available
        torch.cuda.is_available = lambda: True
        try:
            qc = BaseQuantizeConfig(bits=bits, group_size=group, desc_act=desc_act, sym=sym)
            model = AutoGPTQForCausalLM.from_pretrained(src, qc, torch_dtype=torch.float16)
        finally:
            torch.cuda.is_available = avail
        g = torch.Generator().manual_seed(seed)
        examples = [{"input_ids": torch.randint(0, VOCAB, (1, 64), generator=g),
                     "attention_mask": torch.ones(1, 64, dtype=torch.long)} for _ in range(8)]
        model.quantize(examples)
        model.save_quantized(d, use_safetensors=True)
    exp = {"library": "auto-gptq 0.7.1 (quantize, save_quantized; QuantLinear.forward)",
           "scheme": f"gptq-{bits}bit-g{group}-{'desc' if desc_act else 'nodesc'}-{'sym' if sym else 'asym'}",
           "model_dtype": "float16", "intermediate_size": inter, "hidden_size": HIDDEN, "layers": 1,
           "weights": gptq_reference(d, bits, group, desc_act)}
    write_expected(d, exp)


# --------------------------------------------------------------------------------------------
# NVIDIA ModelOpt


def modelopt_write(name, cfg_name="NVFP4_DEFAULT_CFG", inter=384, layers=2, seed=3):
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor
    from safetensors import safe_open

    d = fresh(name)
    model = llama(inter, layers, torch.bfloat16, seed)
    torch.manual_seed(11)
    calib = [torch.randint(0, VOCAB, (2, 16)) for _ in range(4)]

    def forward_loop(m):
        for ids in calib:
            m(input_ids=ids)

    mtq.quantize(model, getattr(mtq, cfg_name), forward_loop)
    with torch.inference_mode():
        export_hf_checkpoint(model, export_dir=d)
    # ModelOpt's own dequantization of every exported NVFP4 weight.
    t = {}
    for f in os.listdir(d):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(d, f), "pt") as h:
                for k in h.keys():
                    t[k] = h.get_tensor(k)
    from modelopt.torch.quantization.qtensor.fp8_tensor import FP8QTensor

    weights = {}
    for k, v in t.items():
        if k.endswith(".weight") and v.dtype == torch.float8_e4m3fn:
            base = k[: -len(".weight")]
            q = FP8QTensor(v.shape, torch.bfloat16, v)
            w32 = q.dequantize(dtype=torch.float32, scale=t[base + ".weight_scale"])
            wl = q.dequantize(dtype=torch.bfloat16, scale=t[base + ".weight_scale"])
            weights[k] = {"shape": list(v.shape), "lib_dtype": "bfloat16",
                          "sha256_lib": digest(wl.view(torch.int16)), "sha256_f32": f32_digest(w32),
                          "amax": float(w32.abs().max())}
            continue
        if not k.endswith(".weight") or v.dtype != torch.uint8:
            continue
        base = k[: -len(".weight")]
        n, kh = v.shape
        q = NVFP4QTensor(torch.Size([n, kh * 2]), torch.bfloat16, v)
        w32 = q.dequantize(dtype=torch.float32, scale=t[base + ".weight_scale"],
                           double_scale=t[base + ".weight_scale_2"], block_sizes={-1: 16})
        wl = q.dequantize(dtype=torch.bfloat16, scale=t[base + ".weight_scale"],
                          double_scale=t[base + ".weight_scale_2"], block_sizes={-1: 16})
        weights[k] = {"shape": [n, kh * 2], "lib_dtype": "bfloat16",
                      "sha256_lib": digest(wl.view(torch.int16)), "sha256_f32": f32_digest(w32),
                      "amax": float(w32.abs().max())}
    scalars = {k: [list(v.shape), v.float().reshape(-1).tolist()] for k, v in t.items()
               if k.endswith(("weight_scale_2", "input_scale"))}
    write_expected(d, {"library": "nvidia-modelopt", "scheme": cfg_name, "model_dtype": "bfloat16",
                       "intermediate_size": inter, "hidden_size": HIDDEN, "layers": layers,
                       "weights": weights, "scalars": scalars})
    return d


# --------------------------------------------------------------------------------------------
# PEFT


def peft_base(d, inter=384, layers=2):
    model = llama(inter, layers, torch.bfloat16, seed=5)
    model.save_pretrained(d)
    return model


def peft_write(base_dir, name, seed, **kw):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    d = fresh(name)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.bfloat16)
    cfg = LoraConfig(r=kw.pop("r", 8), lora_alpha=kw.pop("lora_alpha", 16), lora_dropout=0.0, **kw)
    model = get_peft_model(base, cfg)
    torch.manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.copy_((torch.randn(p.shape) * 0.1).to(p.dtype))
    model.save_pretrained(d)
    mods = {}
    for n, m in model.named_modules():
        if hasattr(m, "lora_A") and "default" in getattr(m, "lora_A", {}):
            delta = m.get_delta_weight("default")
            mods[n] = {
                "r": m.r["default"],
                "scaling": float(m.scaling["default"]),
                "sha256_a": digest(m.lora_A["default"].weight.detach().float()),
                "sha256_b": digest(m.lora_B["default"].weight.detach().float()),
                "delta_sha256_f32": f32_digest(delta),
                "delta_amax": float(delta.float().abs().max()),
            }
    write_expected(d, {"library": "peft", "modules": mods})
    return d



# --------------------------------------------------------------------------------------------
# bitsandbytes (`quant_method: bitsandbytes`), written by transformers' own flow: the float
# model saved, loaded back with `BitsAndBytesConfig` (bitsandbytes quantizes each Linear as it
# is placed on the device; `device_map="cpu"` runs its CPU backend, no GPU needed) and saved
# with `save_pretrained`. 4-bit: `weight` U8 `[n k / 2, 1]` (two codes a byte, the first in the
# high nibble), `weight.absmax` (F32 per block, or U8 with `nested_absmax`, `nested_quant_map`
# and the offset in the JSON `weight.quant_state.bitsandbytes__nf4` when double-quantized),
# `weight.quant_map` (the 16-value table). LLM.int8: `weight` I8 `[n, k]`, `SCB` F32 `[n]`
# (each row's absmax) and `weight_format`. The reference is the library's own dequantization
# (`bnb.functional.dequantize_4bit` with the weight's quant state; `int8_vectorwise_dequant`),
# in f32 and in the model dtype, on the model loaded back from disk. Needs accelerate.


def bnb_reference(d, dtype):
    import copy

    import bitsandbytes as bnb
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(d, dtype=dtype, device_map="cpu")
    out = {}
    for name, mod in m.named_modules():
        if not name.endswith(("gate_proj", "up_proj", "down_proj", "q_proj", "o_proj")):
            continue
        w = mod.weight
        if isinstance(mod, bnb.nn.Linear4bit):
            qs = copy.copy(w.quant_state)
            qs.dtype = torch.float32
            exact = bnb.functional.dequantize_4bit(w.data, qs)
            lib = bnb.functional.dequantize_4bit(w.data, w.quant_state)
        else:
            exact = bnb.functional.int8_vectorwise_dequant(w.data, w.SCB)
            lib = exact.to(dtype)
        assert torch.equal(exact.to(lib.dtype), lib), name
        out[name + ".weight"] = {
            "shape": list(lib.shape),
            "lib_dtype": str(lib.dtype).replace("torch.", ""),
            "sha256_lib": digest(lib.view(torch.int16)),
            "sha256_f32": f32_digest(exact),
            "amax": float(lib.float().abs().max()),
        }
    return out


def bnb_write(name, dtype, inter=384, layers=1, seed=31, **cfg):
    import tempfile

    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    d = fresh(name)
    model = llama(inter, layers, dtype, seed)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        q = AutoModelForCausalLM.from_pretrained(
            tmp, quantization_config=BitsAndBytesConfig(**cfg), device_map="cpu", dtype=dtype
        )
        q.save_pretrained(d)
    write_expected(d, {"library": "bitsandbytes (transformers BitsAndBytesConfig, save_pretrained)",
                       "scheme": name, "config": {k: str(v) for k, v in cfg.items()},
                       "model_dtype": str(dtype).replace("torch.", ""), "intermediate_size": inter,
                       "hidden_size": HIDDEN, "layers": layers, "weights": bnb_reference(d, dtype)})

def main():
    os.makedirs(OUT, exist_ok=True)
    which = os.environ.get("ONLY", "ct,modelopt,peft").split(",")
    if "ct" in which:
        for kind in ["fp8-tensor", "fp8-channel", "fp8-block"]:
            for dtype in [torch.bfloat16, torch.float32]:
                for inter in [384, 320]:
                    dn = "bf16" if dtype == torch.bfloat16 else "f32"
                    ct_write(f"ct-{kind}-{dn}-i{inter}", kind, dtype, inter)
        ct_write("ct-nvfp4a16-bf16", "nvfp4a16", torch.bfloat16, 384)
        ct_write("ct-nvfp4a16-bf16-sharded", "nvfp4a16", torch.bfloat16, 384, layers=2, shards=True)
        ct_write("ct-nvfp4-w4a4-bf16", "nvfp4", torch.bfloat16, 384)
    if "mxfp4" in which:
        # llm-compressor's MXFP4A16: E2M1 codes, an E8M0 scale per 32 (one layer; two layers
        # with an intermediate of 320, not whole blocks of 256 but of 32).
        ct_write("ct-mxfp4a16-bf16-i384", "mxfp4a16", torch.bfloat16, 384)
        ct_write("ct-mxfp4a16-bf16-i320", "mxfp4a16", torch.bfloat16, 320, layers=2)
    if "ctint" in which:
        for kind in ["int8-w8a8", "int8-tensor-asym", "w4a16", "w4a16-asym", "w8a16", "w3a16", "int4-channel-asym"]:
            ct_write(f"ct-{kind}-bf16", kind, torch.bfloat16, 384)
        ct_write("ct-int4-g32-asym-f32", "int4-g32-asym", torch.float32, 384)
    if "awq" in which:
        awq_write("awq-gemm-g128-f16")
        awq_write("awq-gemm-g64-f16", group=64, seed=6)
    if "gptq" in which:
        gptq_write("gptq-4bit-g128-desc-sym-f16", desc_act=True)
        gptq_write("gptq-4bit-g128-sym-f16", seed=8)
        gptq_write("gptq-4bit-g64-asym-f16", group=64, sym=False, seed=9)
        gptq_write("gptq-8bit-channel-asym-f16", bits=8, group=-1, sym=False, seed=10)
        gptq_write("gptq-2bit-g64-sym-f16", bits=2, group=64, seed=11)
    if "bnb" in which:
        bnb_write("bnb-nf4-dq-bf16", torch.bfloat16, load_in_4bit=True, bnb_4bit_quant_type="nf4",
                  bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)
        bnb_write("bnb-nf4-f16-i320", torch.float16, inter=320, layers=2, seed=32, load_in_4bit=True,
                  bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float16)
        bnb_write("bnb-fp4-dq-bf16", torch.bfloat16, seed=33, load_in_4bit=True, bnb_4bit_quant_type="fp4",
                  bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)
        bnb_write("bnb-int8-f16", torch.float16, seed=34, load_in_8bit=True)
        bnb_write("bnb-int8-bf16-i320", torch.bfloat16, inter=320, layers=2, seed=35, load_in_8bit=True)
    if "arch" in which:
        arch_write("phi3-bf16", "phi3")
        arch_write("qwen2moe-mixed-bf16", "qwen2moe")
    if "modelopt" in which:
        modelopt_write("modelopt-nvfp4")
        modelopt_write("modelopt-fp8", "FP8_DEFAULT_CFG")
    if "peft" in which:
        base = fresh("peft-base")
        peft_base(base)
        mlp = ["gate_proj", "up_proj", "down_proj"]
        peft_write(base, "peft-lora-default", 21, target_modules=mlp)
        peft_write(base, "peft-lora-rslora", 22, target_modules=mlp, use_rslora=True)
        peft_write(base, "peft-lora-alpha-pattern", 23, target_modules=mlp, alpha_pattern={"down_proj": 64})
        peft_write(base, "peft-lora-rank-pattern", 24, target_modules=mlp, rank_pattern={"down_proj": 4})
        peft_write(base, "peft-lora-gate-up-only", 25, target_modules=["gate_proj", "up_proj"])
        peft_write(base, "peft-lora-layer0-only", 26, target_modules=mlp, layers_to_transform=[0])
        peft_write(base, "peft-dora", 27, target_modules=mlp, use_dora=True)
        peft_write(base, "peft-lora-bias", 28, target_modules=mlp, lora_bias=True)
        peft_write(base, "peft-lora-attention", 29, target_modules=mlp + ["q_proj", "v_proj"])


if __name__ == "__main__":
    main()
