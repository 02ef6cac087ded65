"""The Python package against the CLI, on the host (no GPU): every tensor of a pack holding
every layout decodes bit for bit as `metrale-pack dump` writes it, its stored bytes equal
`dump --raw`, `verify` equals `verify --json`, `convert` chooses layouts as the CLI does.

METRALE_BIN names the CLI (default: the repository's target/release/metrale-pack)."""

import ctypes
import gc
import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

import metrale_pack

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("METRALE_BIN", str(ROOT / "target" / "release" / "metrale-pack"))
ALL = ["nvfp4", "nvfp4_t", "nvfp4_mmq", "q4k_mmq", "fp8", "w8a8", "bf16", "q2g128", "affine", "ggml"]


def cli(*args):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True)


def gen(tmp, name, dtype, hidden=256, inter=512, layers=2):
    src = tmp / name
    r = cli("gen-model", src, hidden, inter, layers, dtype, "llama")
    assert r.returncode == 0, r.stderr
    return src


@pytest.fixture(scope="module")
def every_layout(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pack")
    src = gen(tmp, "m.gguf", "F16")
    out = tmp / "m.mpk.gguf"
    m = metrale_pack.convert(src, out, layouts=ALL)
    return src, out, m


def test_manifest_and_tensor_list(every_layout):
    src, out, m = every_layout
    p = metrale_pack.open(out)
    assert p.manifest["layouts"] == m["layouts"] == ALL
    names = p.tensor_names()
    assert names == [t["name"] for t in p.manifest["tensors"]]
    for layout in ALL:
        assert any(n.endswith("." + layout) or ("." + layout + ".") in n for n in names), layout


def test_every_tensor_decodes_as_the_cli_dumps_it(every_layout, tmp_path):
    src, out, _ = every_layout
    p = metrale_pack.open(out)
    seen = set()
    for name in p.tensor_names():
        for decode in (True, False):
            npy = tmp_path / "t.npy"
            r = cli("dump", out, name, "-o", npy, *([] if decode else ["--raw"]))
            if decode and r.returncode != 0:
                # A part of a multi-part blob decodes under its blob's name (the CLI refuses
                # nothing else): both refuse alike.
                with pytest.raises(ValueError):
                    p.tensor(name)
                continue
            assert r.returncode == 0, (name, r.stderr)
            want = np.load(npy)
            got = p.tensor(name, decode=decode)
            assert got.dtype == want.dtype and got.shape == want.shape, name
            assert got.tobytes() == want.tobytes(), name
            parts = name.split(".")
            if decode and len(parts) > 3 and parts[3] in ALL:
                seen.add(parts[3])
    assert set(ALL) <= seen, seen


def test_verify_equals_the_cli_report(every_layout, tmp_path):
    src, out, _ = every_layout
    p = metrale_pack.open(out)
    for source in (None, src):
        got = p.verify(source)
        args = ["verify", out, "--json"] + ([] if source is None else ["--source", source])
        r = cli(*args)
        assert r.returncode == 0, r.stderr
        assert got == json.loads(r.stdout)
        assert got["ok"]
    # A changed byte: both report the tensor, ok false.
    bad = tmp_path / "bad.mpk.gguf"
    img = bytearray(out.read_bytes())
    img[-100] ^= 0x40
    bad.write_bytes(bytes(img))
    got = metrale_pack.open(bad).verify()
    r = cli("verify", bad, "--json")
    assert r.returncode == 1
    assert got == json.loads(r.stdout) and not got["ok"]
    assert got["checksum_mismatches"] or got["nonzero_padding"]


def test_convert_reports_progress_and_raises_what_the_callback_raises(tmp_path):
    src = gen(tmp_path, "p.gguf", "F16")
    seen = []
    metrale_pack.convert(src, tmp_path / "p.mpk.gguf", layouts=["bf16"],
                         progress=lambda done, total: seen.append((done, total)))
    assert seen and all(0 <= d <= t for d, t in seen)
    assert seen[-1][0] == seen[-1][1] > 0
    assert len({t for _, t in seen}) == 1

    def boom(done, total):
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        metrale_pack.convert(src, tmp_path / "q.mpk.gguf", layouts=["bf16"], progress=boom)


def test_convert_chooses_and_refuses_as_the_cli(tmp_path):
    q8 = gen(tmp_path, "q8.gguf", "Q8_0")
    # A named set that re-quantizes the Q8_0 weights is refused, by both.
    with pytest.raises(ValueError, match="re-quantize"):
        metrale_pack.convert(q8, tmp_path / "a.mpk.gguf", layouts=["nvfp4"])
    assert not (tmp_path / "a.mpk.gguf").exists()
    r = cli("convert", q8, "-o", tmp_path / "a.mpk.gguf", "--layouts", "nvfp4")
    assert r.returncode == 1 and "re-quantize" in r.stderr
    m = metrale_pack.convert(q8, tmp_path / "b.mpk.gguf", layouts=["bf16"])
    assert m["layouts"] == ["bf16"]
    # The default carries Q8_0 in `affine`, the same bytes by both.
    m = metrale_pack.convert(q8, tmp_path / "e.mpk.gguf")
    assert m["layouts"] == ["affine"]
    r = cli("convert", q8, "-o", tmp_path / "f.mpk.gguf")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "e.mpk.gguf").read_bytes() == (tmp_path / "f.mpk.gguf").read_bytes()
    q4k = gen(tmp_path, "q4k.gguf", "Q4_K")
    m = metrale_pack.convert(q4k, tmp_path / "c.mpk.gguf")
    assert m["layouts"] == ["q4k_mmq"] and m["options"]["q4k_down"] == "q4k"
    r = cli("convert", q4k, "-o", tmp_path / "d.mpk.gguf")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "c.mpk.gguf").read_bytes() == (tmp_path / "d.mpk.gguf").read_bytes()


def test_errors_name_the_file(tmp_path):
    with pytest.raises(ValueError, match="nope.mpk.gguf"):
        metrale_pack.open(tmp_path / "nope.mpk.gguf")
    with pytest.raises(ValueError, match="unknown layout"):
        metrale_pack.convert(tmp_path / "x.gguf", tmp_path / "y.mpk.gguf", layouts=["nvfp5"])


def test_load_on_the_host_backend_returns_the_packs_bytes(every_layout):
    src, out, _ = every_layout
    p = metrale_pack.open(out)
    before = metrale_pack._native.host_live_allocations()
    m = metrale_pack.load(out, verify_checksums=True)
    names = m.tensor_names()
    assert names and set(names) <= set(p.tensor_names())
    for name in names:
        got = m.tensor(name)
        assert got.tobytes() == p.tensor(name, decode=False).tobytes(), name
        ffn = m.layout(name)
        if ".ffn_" in name and name.split(".")[3:4] and name.split(".")[3] in ALL:
            assert ffn is not None and ffn["layout"] == name.split(".")[3], name
    # A passthrough F32 tensor keeps its dtype and shape.
    norm = m.tensor("blk.0.ffn_norm.weight")
    assert norm.dtype == np.float32 and norm.shape == (256,)
    assert metrale_pack._native.host_live_allocations() > before
    m.close()
    assert metrale_pack._native.host_live_allocations() == before
    with pytest.raises(ValueError, match="closed"):
        m.tensor(names[0])


def test_a_hundred_loads_free_what_they_take(every_layout):
    src, out, _ = every_layout
    before = metrale_pack._native.host_live_allocations()
    for _ in range(100):
        m = metrale_pack.load(out)
        assert m.tensor_names()
        del m
    assert metrale_pack._native.host_live_allocations() == before
    with pytest.raises(ValueError, match="expected"):
        metrale_pack.load(out, device="tpu:0")


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    """DLPack's DLTensor (dlpack.h), read from a capsule without taking it."""
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.c_void_p), ("byte_offset", ctypes.c_uint64)]


def _peek(capsule):
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    t = _DLTensor.from_address(get(capsule, b"dltensor"))
    return ((t.device.device_type, t.device.device_id), (t.dtype.code, t.dtype.bits, t.dtype.lanes),
            [t.shape[i] for i in range(t.ndim)], t.strides)


# The DLPack dtype (code, bits) of each pack type exported typed; the rest go as uint8 bytes.
_DL = {"F32": (2, 32), "F16": (2, 16), "BF16": (4, 16), "I8": (0, 8), "I16": (0, 16),
       "I32": (0, 32)}


def test_dlpack_exports_every_device_tensor_without_a_copy_and_holds_the_pack(every_layout):
    """Every device tensor through DLPack: its bytes equal the pack's (numpy.from_dlpack of the
    raw export), the typed export carries the tensor's dtype and shape, the exported memory is
    the device buffer itself (no copy), and the loaded pack lives until the last exported array
    is gone, even after close()."""
    _, out, _ = every_layout
    p = metrale_pack.open(out)
    before = metrale_pack._native.host_live_allocations()
    m = metrale_pack.load(out)
    arrays = {}
    for name in m.tensor_names():
        raw = np.from_dlpack(m.dlpack(name, raw=True))
        assert raw.dtype == np.uint8 and raw.tobytes() == p.tensor(name, decode=False).tobytes()
        arrays[name] = raw
        ty = m._m.tensor(name)[2]
        dev, dtype, shape, strides = _peek(m._m.dlpack(name, False))
        assert dev == (1, 0) and strides is None
        if ty in _DL and m.layout(name) is None:
            assert dtype == (*_DL[ty], 1), (name, ty, dtype)
            assert shape == list(m._m.tensor(name)[1]), name
        else:
            assert dtype == (1, 8, 1) and shape == [raw.size], (name, ty)
    norm = np.from_dlpack(m.dlpack("blk.0.ffn_norm.weight"))
    assert norm.dtype == np.float32 and norm.shape == (256,)
    assert np.array_equal(norm, m.tensor("blk.0.ffn_norm.weight"))
    # No copy: two exports of one tensor share their memory.
    again = np.from_dlpack(m.dlpack("blk.0.ffn_norm.weight"))
    assert np.shares_memory(norm, again)
    m.close()
    with pytest.raises(ValueError, match="closed"):
        np.from_dlpack(m.dlpack("blk.0.ffn_norm.weight"))
    # Closed, but the arrays still hold it: the bytes are still there.
    assert metrale_pack._native.host_live_allocations() > before
    for name, a in arrays.items():
        assert a.tobytes() == p.tensor(name, decode=False).tobytes(), name
    del arrays, norm, again, raw, a
    gc.collect()
    assert metrale_pack._native.host_live_allocations() == before


def test_forward_equals_the_cli_arm_bit_for_bit(tmp_path):
    """The layer's forward from Python equals `metrale-pack ffn-apply` (the Rust host backend,
    the same arm) bit for bit, and is close to the float64 FFN of the pack's own weights."""
    src = gen(tmp_path, "f.gguf", "F16")
    out = tmp_path / "f.mpk.gguf"
    metrale_pack.convert(src, out, layouts=["bf16"])
    rng = np.random.default_rng(5)
    x = rng.standard_normal((8, 256)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = cli("ffn-apply", out, "--layer", 1, "--arm", "bf16", tmp_path / "x.npy", tmp_path / "y.npy")
    assert r.returncode == 0, r.stderr
    m = metrale_pack.load(out)
    y = m.forward(1, x)
    assert y.tobytes() == np.load(tmp_path / "y.npy").tobytes()
    p = metrale_pack.open(out)
    g, u, d = (p.tensor(f"blk.1.ffn_{w}.bf16").astype(np.float64) for w in ("gate", "up", "down"))
    h = x.astype(np.float64) @ g.T
    ref = ((h / (1 + np.exp(-h))) * (x.astype(np.float64) @ u.T)) @ d.T
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 1e-2
    one = m.forward(1, x[:1])
    assert np.linalg.norm(one - ref[:1]) / np.linalg.norm(ref[:1]) < 1e-2
    with pytest.raises(ValueError, match="rows"):
        m._m.forward(1, b"\x00" * 12, 1)
    # Through DLPack (what a torch caller passes): the same bits, written into `out`.
    out = np.full_like(x, np.nan)
    assert m.forward_into(1, x, out) is out
    assert out.tobytes() == y.tobytes()
    assert m.forward_into(1, x[:1]).tobytes() == one.tobytes()
    for bad, why in [(x.astype(np.float64), "float32"), (np.ascontiguousarray(x[:, :128]), "256"),
                     (np.ones((256, 8), np.float32).T, "strided")]:
        with pytest.raises(ValueError, match=why):
            m.forward_into(1, bad, np.empty((bad.shape[0], 256), np.float32))
    with pytest.raises(ValueError, match="rows"):
        m.forward_into(1, x, np.empty((3, 256), np.float32))
    with pytest.raises(ValueError, match="dltensor"):
        m._m.forward_dlpack(1, b"not a capsule", x.__dlpack__(), 0)


def test_forward_by_arm_equals_the_cli_for_every_arm(every_layout, tmp_path):
    """`forward(layer, x, arm=...)` equals `metrale-pack ffn-apply --arm` (the Rust host
    backend) bit for bit for every arm a pack holding every layout offers, on 5 rows (prefill)
    and on one (decode); an arm the layer lacks is refused, naming the arms it has."""
    _, out, _ = every_layout
    m = metrale_pack.load(out)
    arms = m.arms(1)
    assert {"bf16", "fp8", "w8a8 fixed (W8A8)", "nvfp4", "nvfp4 fixed (W4A4)", "q2g128", "q4k"} <= set(arms), arms
    assert m.arms(99) == []
    rng = np.random.default_rng(11)
    for rows in (5, 1):
        x = rng.standard_normal((rows, 256)).astype(np.float32)
        np.save(tmp_path / "x.npy", x)
        for arm in arms:
            r = cli("ffn-apply", out, "--layer", 1, "--arm", arm, tmp_path / "x.npy", tmp_path / "y.npy")
            assert r.returncode == 0, (arm, r.stderr)
            y = m.forward(1, x, arm=arm)
            assert y.tobytes() == np.load(tmp_path / "y.npy").tobytes(), (arm, rows)
    with pytest.raises(ValueError, match="no arm .*its arms: bf16"):
        m.forward(1, x, arm="nope")
    with pytest.raises(ValueError, match="rows"):
        m._m.forward_arm(1, "bf16", b"\x00" * 12, 1)
