"""The package's exceptions (issue #55): every failure is a `metrale_pack.Error` (a `ValueError`)
of the kind that says what went wrong; the handles print what they hold; the wheel ships its
type stubs."""

import importlib.resources
import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

import metrale_pack as mp

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("METRALE_BIN", str(ROOT / "target" / "release" / "metrale-pack"))


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("errors")
    src = tmp / "m.gguf"
    r = subprocess.run([BIN, "gen-model", str(src), "64", "128", "2", "F16", "llama"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = tmp / "m.mpk.gguf"
    mp.convert(src, out, layouts=["bf16"])
    return src, out


def test_every_kind_is_an_error_and_a_value_error():
    for cls in [mp.FormatError, mp.UnsupportedError, mp.IoError, mp.DeviceError, mp.ArgumentError]:
        assert issubclass(cls, mp.Error) and issubclass(cls, ValueError), cls
        assert cls.__module__ == "metrale_pack", cls.__module__
    assert mp.Error is not ValueError


def test_each_failure_raises_its_kind(pack, tmp_path):
    src, out = pack
    with pytest.raises(mp.IoError, match="nonexistent"):
        mp.open(tmp_path / "nonexistent.mpk.gguf")
    bad = tmp_path / "bad.gguf"
    # Version 3, then a tensor count and nothing after it: truncated.
    bad.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (5).to_bytes(8, "little"))
    with pytest.raises(mp.FormatError, match="bad.gguf"):
        mp.open(bad)
    old = tmp_path / "old.gguf"
    old.write_bytes(b"GGUF" + (1).to_bytes(4, "little") + bytes(16))
    with pytest.raises(mp.UnsupportedError, match="version 1"):
        mp.open(old)
    with pytest.raises(mp.IoError, match="same file"):
        mp.convert(src, src, layouts=["bf16"])
    with pytest.raises(mp.ArgumentError, match="unknown layout"):
        mp.convert(src, tmp_path / "o.mpk.gguf", layouts=["nope"])
    with pytest.raises(mp.ArgumentError, match="max_rows"):
        mp.load(out, max_rows=2**40)
    with pytest.raises(mp.ArgumentError, match="tpu"):
        mp.load(out, device="tpu")
    m = mp.load(out)
    with pytest.raises(mp.ArgumentError):
        m.forward(0, np.zeros(64, dtype=np.float32))
    with pytest.raises(mp.ArgumentError, match="no device tensor"):
        m.tensor("no.such.tensor")
    m.close()


def test_a_format_this_tool_does_not_read_is_unsupported(tmp_path):
    folder = tmp_path / "quanto"
    folder.mkdir()
    fixture = ROOT / "tests" / "fixtures" / "ct-w4a16-bf16"
    for f in fixture.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "quanto", "weights": "qint4"}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(mp.UnsupportedError, match="qint4"):
        mp.convert(folder, tmp_path / "o.mpk.gguf")


def test_a_cuda_load_without_a_device_is_a_device_error(pack):
    _, out = pack
    try:
        m = mp.load(out, device="cuda")
    except mp.DeviceError:
        return
    m.close()
    pytest.skip("a CUDA device is present")


def test_the_handles_print_what_they_hold(pack):
    _, out = pack
    p = mp.open(out)
    r = repr(p)
    assert str(out) in r and "bf16" in r and "2 FFN layers" in r, r
    m = mp.load(out)
    r = repr(m)
    assert str(out) in r and "'cpu'" in r and "device tensors" in r, r
    assert repr(m.dlpack("blk.0.ffn_gate.bf16")) == "DeviceTensor('blk.0.ffn_gate.bf16')"
    m.close()
    assert "closed" in repr(m)


def test_the_package_ships_its_type_stubs():
    files = importlib.resources.files("metrale_pack")
    assert files.joinpath("py.typed").is_file()
    stub = files.joinpath("__init__.pyi").read_text()
    for name in ["class Pack", "def convert", "def load", "class ArgumentError(Error)"]:
        assert name in stub, name
