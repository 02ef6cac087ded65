"""The peers of `metrale-pack bench-load`: time a safetensors loader putting every tensor of a
file on GPU 0, on a safetensors file holding the same bytes as a pack's device segment (made by
`metrale-pack export-segment PACK OUT.safetensors`), page cache warm, median of 3 runs in one
process. Runs on the device machine (PyTorch and safetensors are installed there; InstantTensor
and fastsafetensors travel as wheels, `scripts/fetch-peers.sh`).

    python3 scripts/peer_loaders.py LOADER FILE
    LOADER: safetensors | instanttensor | instanttensor-buffered | fastsafetensors

instanttensor reads a file on disk with direct I/O (io_uring) by default and a tmpfs file through
its mapping; instanttensor-buffered asks for its buffered backends (page cache) on disk.
"""
import sys
import time

import torch


def load_safetensors(path):
    from safetensors.torch import load_file

    return list(load_file(path, device="cuda").values())


def load_instanttensor(path, buffered=False):
    from instanttensor import BackendPolicy, safe_open

    kw = {"backend": BackendPolicy.BUFFERED} if buffered else {}
    with safe_open(path, framework="pt", device=0, **kw) as f:
        return [t for _, t in f.tensors()]


def load_fastsafetensors(path):
    from fastsafetensors import fastsafe_open

    with fastsafe_open(filenames=[path], nogds=True, device="cuda:0") as f:
        return [f.get_tensor(k) for k in f.keys()]


LOADERS = {
    "safetensors": load_safetensors,
    "instanttensor": load_instanttensor,
    "instanttensor-buffered": lambda p: load_instanttensor(p, buffered=True),
    "fastsafetensors": load_fastsafetensors,
}


def main():
    name, path = sys.argv[1], sys.argv[2]
    load = LOADERS[name]
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    times, nbytes = [], 0
    for _ in range(3):
        t = time.perf_counter()
        ts = load(path)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        assert all(x.is_cuda for x in ts), f"{name}: a tensor is not on the GPU"
        nbytes = sum(x.numel() * x.element_size() for x in ts)
        del ts
        torch.cuda.empty_cache()
    med = sorted(times)[1]
    runs = ", ".join(f"{x:.3f}" for x in times)
    print(
        f"peer {name}: {med:.3f} s (median of 3: {runs}) for {nbytes / 1e9:.2f} GB = "
        f"{nbytes / med / 1e9:.1f} GB/s, {path}"
    )


if __name__ == "__main__":
    main()
