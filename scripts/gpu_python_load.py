"""On the GPU machine: the Python package's load of a pack into torch CUDA tensors against
`metrale-pack bench-load` and safetensors on the same bytes, in one run (scripts/gpu-python.sh).

    python3 scripts/gpu_python_load.py PACK SEGMENT.safetensors METRALE_BIN OUT.json

Times `metrale_pack.load(PACK, device="cuda:0")` plus every device tensor as a torch tensor
(DLPack, no copy), synchronized: the first load of the process (which pins the staging ring)
and three later ones; `safetensors.torch.load_file(SEGMENT, device="cuda")` (median of 3);
checks every torch tensor's bytes against safetensors' tensor of the same name (the segment
holds the same bytes), and the layer forward from Python against `metrale-pack ffn-apply` (the
Rust forward on the same GPU) bit for bit."""
import json
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

import metrale_pack

pack, seg, bin_, out = sys.argv[1:5]
torch.zeros(1, device="cuda")
torch.cuda.synchronize()
res = {"pack": pack}
loads = []
for i in range(4):
    t = time.perf_counter()
    m = metrale_pack.load(pack, device="cuda:0")
    ts = m.torch_tensors()
    torch.cuda.synchronize()
    loads.append(time.perf_counter() - t)
    if i < 3:
        del ts
        m.close()
res["load_s"] = loads
res["bytes"] = sum(t.numel() * t.element_size() for t in ts.values())
res["dtypes"] = sorted({str(t.dtype) for t in ts.values()})
print(f"metrale_pack.load + torch tensors: first {loads[0]:.3f} s, later {', '.join(f'{x:.3f}' for x in loads[1:])} s "
      f"for {res['bytes'] / 1e9:.2f} GB ({len(ts)} tensors, dtypes {res['dtypes']})")
from safetensors.torch import load_file

st_t = []
for _ in range(3):
    t = time.perf_counter()
    st = load_file(seg, device="cuda")
    torch.cuda.synchronize()
    st_t.append(time.perf_counter() - t)
res["safetensors_s"] = st_t
med = statistics.median(st_t)
print(f"safetensors.torch.load_file(device='cuda'): median {med:.3f} s ({', '.join(f'{x:.3f}' for x in st_t)})")
bad = [n for n, t in ts.items() if not torch.equal(t.contiguous().view(torch.uint8).flatten(), st[n].view(torch.uint8).flatten())]
res["bytes_equal"] = not bad and set(ts) == set(st)
print(f"every torch tensor's bytes equal safetensors' ({len(ts)} tensors): {res['bytes_equal']} {bad[:3]}")
hidden = next(t.shape[0] for n, t in ts.items() if n.endswith("ffn_norm.weight"))
x = np.random.default_rng(5).standard_normal((8, hidden)).astype(np.float32)
with tempfile.TemporaryDirectory() as d:
    np.save(f"{d}/x.npy", x)
    r = subprocess.run([bin_, "-q", "ffn-apply", pack, "--layer", "1", "--arm", "bf16", f"{d}/x.npy", f"{d}/y.npy"],
                       capture_output=True, text=True)
    y_rust = np.load(f"{d}/y.npy") if r.returncode == 0 else None
y = m.forward(1, x)
res["forward_equal"] = y_rust is not None and y.tobytes() == y_rust.tobytes()
print(f"forward(layer 1, 8 rows) from Python == ffn-apply --arm bf16 bit for bit: {res['forward_equal']} {r.stderr[-300:]}")
json.dump(res, open(out, "w"), indent=1)
