"""cuBLAS alone, as PyTorch calls it, at the FFN shapes gpu-check uses (SmolLM2: hidden 576,
inter 1536), so that compute-sanitizer reports on cuBLAS's own kernels can be told apart from
ours.  Modes:
  init    C = A @ B into never-written memory, then read C with a plain kernel: initcheck reports
          those reads if it does not see cuBLAS's stores.
  race    the same products, for racecheck.
  repeat  each product 200 times on the same inputs: a real race in the GEMM would show up as
          results that differ bit for bit from run to run.
"""
import sys
import torch

torch.manual_seed(0)
dev = "cuda"
mode = sys.argv[1]
shapes = [(m, 1536, 576) for m in (5, 16, 17, 32, 64, 512)] + [(m, 576, 1536) for m in (5, 32, 512)]
for (m, n, k) in shapes:
    a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
    if mode in ("init", "race"):
        c = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
        torch.matmul(a, b, out=c)
        s = c.float().sum().item()
        print(f"m={m} n={n} k={k} sum={s:.3f}")
    else:
        first = torch.matmul(a, b)
        diff = 0
        for _ in range(200):
            diff += int((torch.matmul(a, b).view(torch.int16) != first.view(torch.int16)).sum())
        torch.cuda.synchronize()
        print(f"repeat m={m} n={n} k={k}: 200 runs, {diff} elements differ bit for bit from the first")
