"""What a pack costs in model quality, on the GPU machine (PyTorch and transformers there; the
`gguf` wheel carried): run the real SmolLM2 (from its GGUF, through transformers) on the fixed
text tests/fixtures/text/quality.txt, then again with each layout's FFN weights in place of the
source's, decoded from the pack's bytes by tests/py/reference.py's independent decoders; report
the mean KL divergence of the next-token distribution against the source model, top-1 agreement
and the perplexity of both.

The activation-quantizing arms (W4A4 on the nvfp4 weights, W8A8 on the w8a8 weights) are
emulated in PyTorch from formats.md's rules (per-row NVFP4 / per-row FP8 activations before each
FFN projection); with --arms, the CUDA arms themselves then replace every layer's FFN output:
the pack loaded once onto the GPU by the `metrale_pack` package (python/; its wheel on
PYTHONPATH), each layer run through the arm by `Loaded.forward(layer, x, arm=...)`.

    python3 scripts/quality_kl.py SMOLLM2.gguf PACK.mpk.gguf OUT.json [--record DIR] [--arms]
"""
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "py"))
import reference  # noqa: E402


def e4m3(x):
    return x.clamp(-448, 448).to(torch.float8_e4m3fn).to(torch.float32)


def e2m1(v):
    """E2M1 nearest with ties to the even code, sign kept (formats.md)."""
    a = v.abs()
    q = torch.zeros_like(a)
    for lo, hi, val, lo_in, hi_in in [
        (0.25, 0.75, 0.5, False, False),
        (0.75, 1.25, 1.0, True, True),
        (1.25, 1.75, 1.5, False, False),
        (1.75, 2.5, 2.0, True, True),
        (2.5, 3.5, 3.0, False, False),
        (3.5, 5.0, 4.0, True, True),
    ]:
        m = ((a >= lo) if lo_in else (a > lo)) & ((a <= hi) if hi_in else (a < hi))
        q = torch.where(m, torch.full_like(a, val), q)
    q = torch.where(a > 5.0, torch.full_like(a, 6.0), q)
    return torch.copysign(q, v)


def act_nvfp4(x):
    """Per-row NVFP4 activations (g = amax / 2688, 16-element E4M3 group scales), dequantized."""
    shape = x.shape
    k = shape[-1]
    kp = (k + 63) // 64 * 64
    r = torch.nn.functional.pad(x.reshape(-1, k).float(), (0, kp - k))
    g = r.abs().amax(dim=1, keepdim=True) / 2688.0
    grp = r.reshape(r.shape[0], -1, 16)
    s = e4m3(grp.abs().amax(dim=2, keepdim=True) / (6.0 * g.unsqueeze(1)))
    den = s * g.unsqueeze(1)
    q = torch.where(den > 0, e2m1(grp / torch.where(den > 0, den, torch.ones_like(den))), torch.zeros_like(grp))
    return (q * den).reshape(r.shape)[:, :k].reshape(shape).to(x.dtype)


def act_fp8(x):
    """Per-row FP8 activations (scale = amax / 448), dequantized."""
    shape = x.shape
    r = x.reshape(-1, shape[-1]).float()
    sc = r.abs().amax(dim=1, keepdim=True) / 448.0
    q = torch.where(sc > 0, e4m3(r / torch.where(sc > 0, sc, torch.ones_like(sc))), torch.zeros_like(r))
    return (q * sc).reshape(shape).to(x.dtype)


def act_int8_groups(x):
    """The affine decode arm's activations (formats.md, `affine_quantize_act`): per group of 32
    values of a row, d = amax / 127 in f32, q = roundf(x * (1 / d)) (ties away from zero),
    dequantized d * q; values past k are 0."""
    shape = x.shape
    k = shape[-1]
    kp = (k + 31) // 32 * 32
    r = torch.nn.functional.pad(x.reshape(-1, k).float(), (0, kp - k)).reshape(-1, kp // 32, 32)
    d = r.abs().amax(dim=2, keepdim=True) / 127.0
    inv = torch.where(d > 0, 1.0 / torch.where(d > 0, d, torch.ones_like(d)), torch.zeros_like(d))
    v = r * inv
    q = torch.sign(v) * torch.floor(v.abs() + 0.5)
    return (q * d).reshape(-1, kp)[:, :k].reshape(shape).to(x.dtype)


def affine_centred(fe, part):
    """An `affine` blob's weights without their group offsets: s * (q - 2^(bits - 1)), the part
    the decode GEMVs multiply by the int8 activations (the offsets meet the exact sum of the
    activations: formats.md, "The affine GEMVs")."""
    n, k = fe["shape"]
    kp = fe["padded"][1]
    bits, group = int(fe["scalars"]["bits"]), int(fe["scalars"]["group"])
    form = int(fe["scalars"].get("form", 0))
    c = part("codes")
    q = np.stack([c & 15, c >> 4], axis=-1).reshape(n, kp) if bits == 4 else c.reshape(n, kp)
    dt = np.float32 if form == 2 else np.float16
    sb = part("scales").view(dt).astype(np.float64).reshape(n, kp // group, 2)
    s = np.repeat(sb[:, :, 0], group, axis=1)
    return (s * (q.astype(np.float64) - 2 ** (bits - 1)))[:n, :k]


def main():
    from gguf import GGUFReader
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src, pack_path, out_path = sys.argv[1], sys.argv[2], sys.argv[3]
    d, f = os.path.dirname(os.path.abspath(src)), os.path.basename(src)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32).to(dev).eval()
    text = open(os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "text", "quality.txt")).read()
    ids = torch.tensor([tok(text).input_ids], device=dev)
    layers = model.model.layers
    mlps = [l.mlp for l in layers]
    orig = [[m.gate_proj.weight.data.clone(), m.up_proj.weight.data.clone(), m.down_proj.weight.data.clone()] for m in mlps]

    @torch.no_grad()
    def run():
        return torch.log_softmax(model(ids).logits[0, :-1].double(), dim=-1)

    def ppl(logp):
        return math.exp(-logp.gather(1, ids[0, 1:, None]).mean().item())

    # With --record DIR: each layer's FFN input of the source run, f32 [tokens, hidden], as
    # DIR/layerN.npy (for `metrale-pack check-activations`).
    record = sys.argv[sys.argv.index("--record") + 1] if "--record" in sys.argv else None
    hooks = []
    if record:
        os.makedirs(record, exist_ok=True)
        for i, m in enumerate(mlps):
            def save(mod, inp, i=i):
                np.save(os.path.join(record, f"layer{i}.npy"), inp[0][0].detach().float().cpu().numpy())
            hooks.append(m.register_forward_pre_hook(save))
    base = run()
    for h in hooks:
        h.remove()
    rows = [{"variant": "source", "tokens": int(ids.shape[1]), "ppl": ppl(base), "kl": 0.0, "top1": 1.0}]
    print(f"device {dev} ({torch.cuda.get_device_name() if dev == 'cuda' else 'cpu'}), tokens {ids.shape[1]}, source perplexity {rows[0]['ppl']:.4f}")

    pr = GGUFReader(pack_path)
    fld = pr.fields["metrale.pack.manifest"]
    man = json.loads(bytes(fld.parts[fld.data[0]]).decode().rstrip())
    blob = {t.name: np.asarray(t.data).view(np.uint8).reshape(-1) for t in pr.tensors}
    ents = {}
    for e in man["tensors"]:
        fe = e.get("ffn")
        if fe and fe["part"] in ("", "codes"):
            ents[(fe["layout"], fe["layer"], fe["proj"])] = fe

    def install(layout):
        for i, m in enumerate(mlps):
            ws = {}
            for proj in ("gate", "up", "down", "gate_up"):
                fe = ents.get((layout, i, proj))
                if fe is None:
                    continue
                name = f"blk.{i}.ffn_{proj}.{layout}"
                w = reference.decode_layout(fe, lambda p, name=name: blob[f"{name}.{p}"] if p else blob[name])
                if proj == "gate_up":
                    half = w.shape[0] // 2
                    ws["gate"], ws["up"] = w[:half], w[half:]
                else:
                    ws[proj] = w
            for proj, lin in (("gate", m.gate_proj), ("up", m.up_proj), ("down", m.down_proj)):
                lin.weight.data.copy_(torch.from_numpy(ws[proj]).float())

    def restore():
        for m, (g, u, dn) in zip(mlps, orig):
            m.gate_proj.weight.data.copy_(g)
            m.up_proj.weight.data.copy_(u)
            m.down_proj.weight.data.copy_(dn)

    variants = [(l, None) for l in man["layouts"] if l != "lora"]
    if "affine" in man["layouts"]:
        variants.append(("affine", act_int8_groups))
    if "nvfp4" in man["layouts"]:
        variants.append(("nvfp4", act_nvfp4))
    if "w8a8" in man["layouts"]:
        variants.append(("w8a8", act_fp8))
    for layout, act in variants:
        install(layout)
        hooks = []
        if act is not None and layout == "affine":
            # y = W x + W_c (x_q - x): the offsets times the exact activations, the centred
            # weights times the quantized ones.
            for i, m in enumerate(mlps):
                for proj, lin in (("gate", m.gate_proj), ("up", m.up_proj), ("down", m.down_proj)):
                    name = f"blk.{i}.ffn_{proj}.affine"
                    wc = torch.from_numpy(affine_centred(ents[("affine", i, proj)],
                                                         lambda p, name=name: blob[f"{name}.{p}"])).float().to(dev)

                    def correct(mod, inp, out, wc=wc):
                        x = inp[0]
                        return out + (act_int8_groups(x) - x) @ wc.T
                    hooks.append(lin.register_forward_hook(correct))
        elif act is not None:
            for m in mlps:
                for lin in (m.gate_proj, m.up_proj, m.down_proj):
                    hooks.append(lin.register_forward_pre_hook(lambda mod, inp, act=act: (act(inp[0]),)))
        logp = run()
        for h in hooks:
            h.remove()
        restore()
        p = base.exp()
        kl = (p * (base - logp)).sum(dim=-1).mean().item()
        top1 = (base.argmax(-1) == logp.argmax(-1)).double().mean().item()
        name = layout if act is None else {"nvfp4": "nvfp4 + NVFP4 activations (W4A4, emulated)", "w8a8": "w8a8 + FP8 activations (W8A8, emulated)",
                                           "affine": "affine decode GEMVs: int8 activations per 32 (emulated)"}[layout]
        rows.append({"variant": name, "tokens": int(ids.shape[1]), "ppl": ppl(logp), "kl": kl, "top1": top1})
        print(f"{name:<48} KL {kl:.5f}  top-1 {100 * top1:.2f}%  ppl {rows[-1]['ppl']:.4f} (source {rows[0]['ppl']:.4f})")
    # With --arms: the activation-quantizing CUDA arms themselves, each layer's FFN output
    # replaced by the arm's (the pack loaded once by the metrale_pack package, the fixed path).
    if "--arms" in sys.argv:
        import metrale_pack
        loaded = metrale_pack.load(pack_path, device="cuda:0")
        for arm, label in [("nvfp4 fixed (W4A4)", "W4A4 (CUDA arm, nvfp4 weights)"),
                           ("w8a8 fixed (W8A8)", "W8A8 (CUDA arm, w8a8 weights)")]:
            if arm not in loaded.arms(0):
                continue

            def arm_forward(i, arm=arm):
                def f(x):
                    rows = np.ascontiguousarray(x[0].detach().float().cpu().numpy())
                    y = loaded.forward(i, rows, arm=arm)
                    return torch.from_numpy(y.copy()).to(x.device, x.dtype)[None]
                return f
            for i, m in enumerate(mlps):
                m.forward = arm_forward(i)
            logp = run()
            for m in mlps:
                del m.forward
            p = base.exp()
            kl = (p * (base - logp)).sum(dim=-1).mean().item()
            top1 = (base.argmax(-1) == logp.argmax(-1)).double().mean().item()
            rows.append({"variant": label, "tokens": int(ids.shape[1]), "ppl": ppl(logp), "kl": kl, "top1": top1})
            print(f"{label:<48} KL {kl:.5f}  top-1 {100 * top1:.2f}%  ppl {rows[-1]['ppl']:.4f} (source {rows[0]['ppl']:.4f})")
    json.dump(rows, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main()
