"""The PyTorch peer of `metrale-pack bench-load`: time safetensors.torch.load_file(..., device="cuda")
on a safetensors file holding the same bytes as a pack's device segment (made by
`metrale-pack export-segment PACK OUT.safetensors`), warm page cache, median of 3.
Runs on the device machine (PyTorch and safetensors are installed there)."""
import sys
import time

import torch
from safetensors.torch import load_file

path = sys.argv[1]
with open(path, "rb") as f:
    while f.read(64 << 20):
        pass
torch.zeros(1, device="cuda")
torch.cuda.synchronize()
times = []
nbytes = 0
for _ in range(3):
    t = time.perf_counter()
    d = load_file(path, device="cuda")
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t)
    nbytes = sum(v.numel() * v.element_size() for v in d.values())
    del d
    torch.cuda.empty_cache()
med = sorted(times)[1]
print(f"pytorch peer: safetensors.torch.load_file(device='cuda') {med:.3f} s (median of 3) for {nbytes / 1e9:.2f} GB = {nbytes / med / 1e9:.1f} GB/s")
