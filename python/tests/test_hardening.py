"""The third hardening round (issue #54) on the Python and C surfaces, each finding as a test:
`convert` never destroys an input; `max_rows` is checked and a refused load leaves the process
usable; a bad DLPack capsule is refused before any read; Ctrl-C and a raising progress callback
stop a convert and write nothing; threads converting into one output each succeed; a `Pack`
reads the file it opened; the C ABI's `mp_last_error` follows every call and a second `mp_free`
is an error (ctypes on libmetrale_pack_c, METRALE_CAPI_LIB)."""

import ctypes
import os
import pathlib
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

import metrale_pack

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("METRALE_BIN", str(ROOT / "target" / "release" / "metrale-pack"))
LIB = os.environ.get("METRALE_CAPI_LIB")


def gen(tmp, name, dtype="F16", hidden=64, inter=128, layers=2):
    src = tmp / name
    r = subprocess.run([BIN, "gen-model", str(src), str(hidden), str(inter), str(layers), dtype, "llama"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return src


def listing(d):
    return sorted(p.name for p in pathlib.Path(d).iterdir())


def test_convert_never_replaces_an_input(tmp_path):
    src = gen(tmp_path, "m.gguf")
    before = src.read_bytes()
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.gguf").symlink_to(src)
    os.link(src, tmp_path / "hard.gguf")
    here = os.getcwd()
    os.chdir(tmp_path / "sub")
    try:
        for out in [src, "../m.gguf", "./../sub/../m.gguf", tmp_path / "link.gguf", tmp_path / "hard.gguf"]:
            with pytest.raises(ValueError, match="same file"):
                metrale_pack.convert(src, out, layouts=["bf16"])
    finally:
        os.chdir(here)
    assert src.read_bytes() == before
    # A safetensors folder's config.json and weights are inputs too.
    folder = tmp_path / "st"
    folder.mkdir()
    fixture = ROOT / "tests" / "fixtures" / "ct-w4a16-bf16"
    for f in fixture.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    for side in ["config.json", "model.safetensors"]:
        was = (folder / side).read_bytes()
        with pytest.raises(ValueError, match="same file"):
            metrale_pack.convert(folder, folder / side, layouts=["bf16"])
        assert (folder / side).read_bytes() == was, side


def test_max_rows_is_checked_and_a_refused_load_leaves_the_process_usable(tmp_path):
    src = gen(tmp_path, "m.gguf")
    out = tmp_path / "m.mpk.gguf"
    metrale_pack.convert(src, out, layouts=["bf16"])
    for rows in [65537, 10**6, 2**40, 2**62 + 16, 2**64 - 1]:
        with pytest.raises(ValueError, match="max_rows"):
            metrale_pack.load(out, max_rows=rows)
    with pytest.raises((ValueError, OverflowError)):
        metrale_pack.load(out, max_rows=2**64)
    # The shared host backend still loads and forwards (no poisoned lock), 17 rows included.
    m = metrale_pack.load(out, max_rows=64)
    x = np.random.default_rng(1).standard_normal((17, 64)).astype(np.float32)
    y = m.forward(1, x)
    assert y.shape == x.shape and np.isfinite(y).all()
    m.close()


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class Hostile:
    """An object whose __dlpack__ hands out a hand-made `dltensor` capsule (kept alive here)."""

    def __init__(self, data, ndim, shape):
        self.shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        self.m = DLManagedTensor()
        t = self.m.dl_tensor
        t.data, t.ndim, t.byte_offset = data, ndim, 0
        t.device = DLDevice(1, 0)
        t.dtype = DLDataType(2, 32, 1)
        t.shape = ctypes.cast(self.shape, ctypes.POINTER(ctypes.c_int64))
        t.strides = None

    def __dlpack__(self, **_):
        return _new_capsule(ctypes.addressof(self.m), b"dltensor", None)


def test_a_bad_dlpack_capsule_is_refused_before_any_read(tmp_path):
    src = gen(tmp_path, "m.gguf")
    out = tmp_path / "m.mpk.gguf"
    metrale_pack.convert(src, out, layouts=["bf16"])
    m = metrale_pack.load(out)
    good = np.zeros((1, 64), dtype=np.float32)
    for bad, words in [
        (Hostile(None, 2, [1, 64]), "data is NULL"),
        (Hostile(None, 9, [1] * 9), "ndim 9"),
        (Hostile(None, -1, [1]), "ndim -1"),
        (Hostile(good.ctypes.data, 2, [-1, 64]), "negative"),
    ]:
        with pytest.raises(ValueError, match=words):
            m._m.forward_dlpack(0, bad.__dlpack__(), good.__dlpack__(), 0)
        with pytest.raises(ValueError, match=words):
            m.forward_into(0, bad, good)
    # A good call still works after them.
    y = m.forward_into(0, np.ones((1, 64), dtype=np.float32))
    assert np.isfinite(y).all()
    m.close()


def test_a_raising_progress_callback_stops_the_convert_and_writes_nothing(tmp_path):
    # Large enough that the convert outlasts the first wait (50 ms) by far.
    src = gen(tmp_path, "m.gguf", hidden=1024, inter=2816, layers=4)
    out = tmp_path / "out.mpk.gguf"
    calls = []

    def progress(done, total):
        calls.append((done, total))
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        metrale_pack.convert(src, out, layouts=["bf16"], progress=progress)
    assert len(calls) == 1
    assert listing(tmp_path) == ["m.gguf"]
    # Without the exception the same convert writes its pack.
    seen = []
    metrale_pack.convert(src, out, layouts=["bf16"], progress=lambda d, t: seen.append((d, t)))
    assert seen and seen[-1][0] == seen[-1][1]
    assert listing(tmp_path) == ["m.gguf", "out.mpk.gguf"]


CTRL_C = r"""
import os, signal, sys, threading, metrale_pack
src, out = sys.argv[1], sys.argv[2]
# Python leaves SIGINT alone when it starts ignored (a background job of a shell without job
# control): install the KeyboardInterrupt handler whatever the parent did.
signal.signal(signal.SIGINT, signal.default_int_handler)
started = threading.Event()
def interrupt():
    started.wait()
    os.kill(os.getpid(), signal.SIGINT)
threading.Thread(target=interrupt, daemon=True).start()
try:
    metrale_pack.convert(src, out, layouts=["nvfp4", "fp8", "w8a8", "bf16"],
                         progress=lambda d, t: started.set())
except KeyboardInterrupt:
    print("interrupted")
    sys.exit(3)
print("finished")
"""


def test_ctrl_c_stops_a_convert_and_writes_nothing(tmp_path):
    # Large enough that the convert is still running when the signal arrives.
    src = gen(tmp_path, "m.gguf", hidden=1024, inter=2816, layers=12)
    out = tmp_path / "out.mpk.gguf"
    r = subprocess.run([sys.executable, "-c", CTRL_C, str(src), str(out)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert "interrupted" in r.stdout
    assert listing(tmp_path) == ["m.gguf"]


def test_threads_converting_into_one_output_each_succeed(tmp_path):
    src = gen(tmp_path, "m.gguf")
    out = tmp_path / "p.mpk.gguf"
    errors = []

    def one():
        try:
            metrale_pack.convert(src, out, layouts=["bf16"])
        except Exception as e:  # noqa: BLE001 - collected for the assertion
            errors.append(e)

    ts = [threading.Thread(target=one) for _ in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == []
    assert metrale_pack.open(out).verify()["ok"]
    assert listing(tmp_path) == ["m.gguf", "p.mpk.gguf"]


def test_a_pack_reads_the_file_it_opened(tmp_path):
    a, b = gen(tmp_path, "a.gguf"), gen(tmp_path, "b.gguf", hidden=128)
    pa, pb = tmp_path / "pa.mpk.gguf", tmp_path / "pb.mpk.gguf"
    metrale_pack.convert(a, pa, layouts=["bf16"])
    metrale_pack.convert(b, pb, layouts=["bf16"])
    p = metrale_pack.open(pa)
    want = {n: p.tensor(n).copy() for n in p.tensor_names()}
    raw = p.tensor("blk.0.ffn_gate.bf16", decode=False).copy()
    os.replace(pb, pa)  # the path now names another pack
    for n, v in want.items():
        got = p.tensor(n)
        assert got.shape == v.shape and got.tobytes() == v.tobytes(), n
    assert p.tensor("blk.0.ffn_gate.bf16", decode=False).tobytes() == raw.tobytes()
    assert p.verify()["ok"]


@pytest.mark.skipif(not LIB, reason="METRALE_CAPI_LIB names libmetrale_pack_c's folder")
def test_the_c_abi_reports_every_failure_clears_on_success_and_refuses_a_second_free(tmp_path):
    lib = ctypes.CDLL(str(pathlib.Path(LIB) / "libmetrale_pack_c.so"))
    lib.mp_load.restype = ctypes.c_void_p
    lib.mp_load.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_size_t]
    lib.mp_last_error.restype = ctypes.c_char_p
    lib.mp_free.restype = ctypes.c_int
    lib.mp_free.argtypes = [ctypes.c_void_p]
    lib.mp_tensor_index.restype = ctypes.c_int64
    lib.mp_tensor_index.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.mp_hidden_size.restype = ctypes.c_size_t
    lib.mp_hidden_size.argtypes = [ctypes.c_void_p]
    src = gen(tmp_path, "m.gguf")
    out = tmp_path / "m.mpk.gguf"
    metrale_pack.convert(src, out, layouts=["bf16"])
    path = str(out).encode()

    # max_rows past the limit: refused by name, the process still loads.
    for rows in [2**40, 2**62 + 16, 2**64 - 1]:
        assert lib.mp_load(path, b"cpu", 0, rows) is None
        assert b"max_rows" in lib.mp_last_error()
    m = lib.mp_load(path, b"cpu", 0, 4)
    assert m, lib.mp_last_error()
    assert lib.mp_last_error() == b""

    # A failed lookup says why; the next success clears it.
    assert lib.mp_tensor_index(m, b"no.such.tensor") == -1
    assert b"no.such.tensor" in lib.mp_last_error()
    assert lib.mp_hidden_size(m) == 64
    assert lib.mp_last_error() == b""
    assert lib.mp_tensor_index(m, b"blk.0.ffn_gate.bf16") >= 0
    assert lib.mp_last_error() == b""

    # A second free is an error, not a double free; a freed handle is refused.
    assert lib.mp_free(m) == 0
    assert lib.mp_free(m) == -1
    assert b"not a live model" in lib.mp_last_error()
    assert lib.mp_hidden_size(m) == 0
    assert b"not a live model" in lib.mp_last_error()
    assert lib.mp_free(None) == 0
    assert lib.mp_last_error() == b""
