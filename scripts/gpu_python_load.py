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
import os
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

# forward_into on torch CUDA tensors: torch's legacy default stream, then a side stream, against
# the host-rows forward above (the same arm, so the same bits).
xt = torch.from_numpy(x).cuda()
outs = {}
outs["default stream"] = m.forward_into(1, xt)
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    xs = xt * 1.0  # made on the side stream, so forward_into must order after it
    outs["side stream"] = m.forward_into(1, xs, torch.empty_like(xs))
torch.cuda.synchronize()
for k, v in outs.items():
    key = "forward_into_" + k.replace(" ", "_") + "_equal"
    res[key] = v.cpu().numpy().tobytes() == y.tobytes()
    print(f"forward_into(layer 1, 8 rows, torch CUDA tensors, {k}) == forward bit for bit: {res[key]}")

# The C ABI on CUDA through ctypes (METRALE_CAPI_LIB: libmetrale_pack_c.so).
lib = os.environ.get("METRALE_CAPI_LIB")
if lib:
    import ctypes as C

    c = C.CDLL(lib)
    cuda = C.CDLL("libcuda.so.1")

    class Tensor(C.Structure):
        _fields_ = [("name", C.c_char_p), ("type", C.c_char_p), ("source_type", C.c_char_p),
                    ("ffn_json", C.c_char_p), ("data", C.c_uint64), ("bytes", C.c_uint64),
                    ("ndim", C.c_int32), ("shape", C.c_uint64 * 8)]

    c.mp_load.restype = C.c_void_p
    c.mp_load.argtypes = [C.c_char_p, C.c_char_p, C.c_int, C.c_size_t]
    c.mp_last_error.restype = C.c_char_p
    c.mp_free.argtypes = [C.c_void_p]
    for f in ("mp_device_type", "mp_device_id"):
        getattr(c, f).argtypes = [C.c_void_p]
        getattr(c, f).restype = C.c_int32
    for f in ("mp_hidden_size", "mp_tensor_count"):
        getattr(c, f).argtypes = [C.c_void_p]
        getattr(c, f).restype = C.c_size_t
    c.mp_tensor_at.argtypes = [C.c_void_p, C.c_size_t, C.POINTER(Tensor)]
    c.mp_forward.argtypes = [C.c_void_p, C.c_size_t, C.c_void_p, C.c_void_p, C.c_size_t]
    c.mp_forward_device.argtypes = [C.c_void_p, C.c_size_t, C.c_uint64, C.c_uint64, C.c_size_t, C.c_uint64]
    h = c.mp_load(pack.encode(), b"cuda:0", 0, 16)
    if not h:
        print("C ABI: mp_load failed:", c.mp_last_error())
        res["capi_ok"] = False
    else:
        ok = c.mp_device_type(h) == 2 and c.mp_device_id(h) == 0 and c.mp_hidden_size(h) == hidden
        ok = ok and c.mp_tensor_count(h) == len(ts)
        # Every tensor's bytes at the reported device address equal the package's torch tensor's.
        for i in range(c.mp_tensor_count(h)):
            t = Tensor()
            ok = ok and c.mp_tensor_at(h, i, C.byref(t)) == 0
            name = t.name.decode()
            mine = ts[name].contiguous().view(torch.uint8).flatten()
            got = torch.empty(t.bytes, dtype=torch.uint8, device="cuda")
            # Both live in the device's primary context (the library retains it, as torch does).
            torch.cuda.synchronize()
            ok = ok and cuda.cuMemcpyDtoD_v2(C.c_uint64(got.data_ptr()), C.c_uint64(t.data), C.c_size_t(t.bytes)) == 0
            torch.cuda.synchronize()
            ok = ok and bool(torch.equal(got, mine))
        yh = np.empty_like(x)
        ok_f = c.mp_forward(h, 1, x.ctypes.data, yh.ctypes.data, 8) == 0 and yh.tobytes() == y.tobytes()
        yd = torch.empty_like(xt)
        st = torch.cuda.Stream()
        with torch.cuda.stream(st):
            xd = xt * 1.0
            rc = c.mp_forward_device(h, 1, xd.data_ptr(), yd.data_ptr(), 8, st.cuda_stream)
        torch.cuda.synchronize()
        ok_d = rc == 0 and yd.cpu().numpy().tobytes() == y.tobytes()
        c.mp_free(h)
        res["capi_ok"] = bool(ok and ok_f and ok_d)
        print(f"C ABI on cuda:0: device, hidden size, {len(ts)} tensors' bytes at their addresses: {ok}; "
              f"mp_forward == forward: {ok_f}; mp_forward_device on a side stream == forward: {ok_d}")
json.dump(res, open(out, "w"), indent=1)
