"""The C ABI (capi/, include/metrale_pack.h) from a C program (capi/tests/smoke.c) on the host
backend: every device tensor's type, shape and bytes at its reported address equal the pack's,
and the FFN layer through `mp_forward` equals the Python package's forward (the Rust host
backend) bit for bit. METRALE_CAPI_LIB names the folder holding libmetrale_pack_c.so (scripts/test.sh
builds it); skipped without it or without a C compiler."""

import os
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

import metrale_pack

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("METRALE_BIN", str(ROOT / "target" / "release" / "metrale-pack"))
LIB = os.environ.get("METRALE_CAPI_LIB")
CC = shutil.which("cc") or shutil.which("gcc")


def fnv64(b):
    h = 0xCBF29CE484222325
    for c in b:
        h = ((h ^ c) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


@pytest.mark.skipif(not LIB or not CC, reason="METRALE_CAPI_LIB or a C compiler missing")
def test_the_c_abi_reports_every_tensor_and_forwards_as_python(tmp_path):
    smoke = tmp_path / "mp-smoke"
    r = subprocess.run([CC, "-std=c11", "-Wall", "-Wextra", "-Werror", "-I", str(ROOT / "capi" / "include"),
                        str(ROOT / "capi" / "tests" / "smoke.c"), "-L", LIB, "-lmetrale_pack_c",
                        "-o", str(smoke)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    src, out = tmp_path / "m.gguf", tmp_path / "m.mpk.gguf"
    assert subprocess.run([BIN, "gen-model", str(src), "128", "256", "2", "F16", "llama"], capture_output=True).returncode == 0
    metrale_pack.convert(src, out, layouts=["bf16", "fp8"])
    x = np.random.default_rng(7).standard_normal((3, 128)).astype(np.float32)
    (tmp_path / "x.raw").write_bytes(x.tobytes())
    env = dict(os.environ, LD_LIBRARY_PATH=LIB)
    r = subprocess.run([str(smoke), str(out), "1", "3", str(tmp_path / "x.raw"), str(tmp_path / "y.raw")],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    p, m = metrale_pack.open(out), metrale_pack.load(out)
    lines = [l.split("\t") for l in r.stdout.splitlines()]
    assert [l[0] for l in lines] == m.tensor_names()
    for name, ty, source, nbytes, shape, h, ffn in lines:
        raw = p.tensor(name, decode=False).tobytes()
        _, want_shape, want_ty, want_ffn = m._m.tensor(name)
        assert (ty, int(nbytes), shape, int(h, 16)) == (
            want_ty, len(raw), ",".join(map(str, want_shape)), fnv64(raw)), name
        assert ffn == ("1" if want_ffn is not None else "0"), name
    y = np.frombuffer((tmp_path / "y.raw").read_bytes(), dtype="<f4").reshape(x.shape)
    assert y.tobytes() == m.forward(1, x).tobytes()
