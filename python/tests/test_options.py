"""One options model: every convert option of the library's table (`options::CONVERT`, read
here as `CONVERT_OPTIONS`) is a keyword of `metrale_pack.convert` (typed in the stubs), a name of
C's `mp_convert` (listed by `mp_convert_option`) and a flag of `metrale-pack convert`; each one
reaches the library (a value it refuses is refused naming it), and set ones are recorded in the
pack. METRALE_CAPI_LIB names the folder holding libmetrale_pack_c.so; the C part is skipped
without it."""

import ast
import ctypes
import json
import os
import pathlib
import subprocess

import pytest

import metrale_pack

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("METRALE_BIN", str(ROOT / "target" / "release" / "metrale-pack"))
LIB = os.environ.get("METRALE_CAPI_LIB")
NAMES = [name for name, _, _ in metrale_pack.CONVERT_OPTIONS]
# A value each kind refuses, in words.
BAD = {"switch": "maybe", "count": "many", "words": "", "path": ""}


def bad(kind):
    return BAD.get(kind, "none of them")


def stub_keywords():
    tree = ast.parse((ROOT / "python" / "metrale_pack" / "__init__.pyi").read_text())
    f = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "convert")
    return [a.arg for a in f.args.kwonlyargs if a.arg != "progress"]


def test_the_table_is_the_cli_flags_and_the_stub_keywords():
    assert len(NAMES) >= 9 and len(set(NAMES)) == len(NAMES)
    assert stub_keywords() == NAMES
    help = subprocess.run([BIN, "convert", "--help"], capture_output=True, text=True).stdout
    for name in NAMES:
        assert "--" + name.replace("_", "-") in help, name


def test_every_keyword_reaches_the_library(tmp_path):
    missing = tmp_path / "missing.gguf"
    for name, kind, _ in metrale_pack.CONVERT_OPTIONS:
        with pytest.raises(metrale_pack.ArgumentError, match=f"^{name}: ") as e:
            metrale_pack.convert(missing, tmp_path / "o.mpk.gguf", **{name: bad(kind)})
        assert "no such" not in str(e.value)
    with pytest.raises(metrale_pack.ArgumentError, match="no such convert option"):
        metrale_pack.convert(missing, tmp_path / "o.mpk.gguf", tpp=2)


def gen(tmp_path):
    src = tmp_path / "m.gguf"
    r = subprocess.run([BIN, "gen-model", str(src), "128", "256", "1", "F16", "llama"], capture_output=True)
    assert r.returncode == 0, r.stderr
    return src


def test_options_set_in_python_are_in_the_pack(tmp_path):
    src, out = gen(tmp_path), tmp_path / "p.mpk.gguf"
    m = metrale_pack.convert(src, out, layouts=["bf16"], host_tensors=["token_embd.*"], threads=1,
                             q4k_down=None)
    assert m["layouts"] == ["bf16"] and m["options"]["host_tensors"] == ["token_embd.*"]


@pytest.fixture
def capi():
    if not LIB:
        pytest.skip("METRALE_CAPI_LIB missing")
    lib = ctypes.CDLL(os.path.join(LIB, "libmetrale_pack_c.so"))
    lib.mp_convert_option.restype = ctypes.c_char_p
    lib.mp_convert_option.argtypes = [ctypes.c_size_t, ctypes.POINTER(ctypes.c_char_p),
                                      ctypes.POINTER(ctypes.c_char_p)]
    lib.mp_convert.restype = ctypes.c_int
    lib.mp_convert.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p),
                               ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t]
    lib.mp_last_error.restype = ctypes.c_char_p
    return lib


def c_convert(lib, src, out, pairs):
    names = (ctypes.c_char_p * max(len(pairs), 1))(*[n.encode() for n, _ in pairs])
    values = (ctypes.c_char_p * max(len(pairs), 1))(*[v.encode() for _, v in pairs])
    rc = lib.mp_convert(str(src).encode(), str(out).encode(), names, values, len(pairs))
    return rc, lib.mp_last_error().decode()


def test_c_lists_and_takes_every_option(capi, tmp_path):
    listed, i = [], 0
    while True:
        kind, help = ctypes.c_char_p(), ctypes.c_char_p()
        name = capi.mp_convert_option(i, ctypes.byref(kind), ctypes.byref(help))
        if name is None:
            break
        listed.append((name.decode(), kind.value.decode(), help.value.decode()))
        i += 1
    assert listed == [tuple(o) for o in metrale_pack.CONVERT_OPTIONS]
    missing = tmp_path / "missing.gguf"
    for name, kind, _ in listed:
        rc, err = c_convert(capi, missing, tmp_path / "o.mpk.gguf", [(name, bad(kind))])
        assert rc == -1 and err.startswith(f"{name}: ") and "no such" not in err, err
    rc, err = c_convert(capi, missing, tmp_path / "o.mpk.gguf", [("tpp", "2")])
    assert rc == -1 and "no such convert option" in err, err
    # A convert through C writes the pack Python reads, the options recorded.
    src, out = gen(tmp_path), tmp_path / "c.mpk.gguf"
    rc, err = c_convert(capi, src, out, [("layouts", "bf16"), ("host_tensors", "token_embd.*")])
    assert rc == 0 and err == "", err
    m = metrale_pack.open(out).manifest
    assert m["layouts"] == ["bf16"] and m["options"]["host_tensors"] == ["token_embd.*"]
    # A source that is not there: the library's error, the pack not written.
    rc, err = c_convert(capi, missing, tmp_path / "d.mpk.gguf", [])
    assert rc == -1 and "missing.gguf" in err and not (tmp_path / "d.mpk.gguf").exists()
