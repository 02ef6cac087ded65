"""The README's Python block runs as written, on the host backend: `device="cuda:0"` becomes
`"cpu"`, and the two torch lines (`m.torch`, `forward_into`) are left out (no torch in CI;
`scripts/gpu_python_load.py` calls both on the H200). The pack it opens is a Q4_1 GGUF converted by
default (an `affine` pack, as the Quick start's), named as the README names it."""

import os
import pathlib
import re
import subprocess

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("METRALE_BIN", str(ROOT / "target" / "release" / "metrale-pack"))
HIDDEN = 256


def readme_python_block():
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 1, "the README has one Python block"
    return blocks[0]


def test_readme_python_block_runs(tmp_path, monkeypatch):
    src = tmp_path / "model.gguf"
    r = subprocess.run(
        [BIN, "gen-model", src, str(HIDDEN), "512", "2", "Q4_1", "--whole", "--vocab", "512",
         "--kv-dim", "128", "--head-dim", "64"],
        capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([BIN, "convert", src, "-o", tmp_path / "smollm2.mpk.gguf", "-q"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    monkeypatch.chdir(tmp_path)
    lines = []
    for line in readme_python_block().splitlines():
        if "m.torch(" in line or "forward_into" in line:
            continue
        lines.append(line.replace('device="cuda:0"', 'device="cpu"'))
    assert len(lines) >= 10, lines
    x = np.random.default_rng(0).standard_normal((3, HIDDEN), dtype=np.float32)
    ns = {"x": x}
    exec(compile("\n".join(lines), "README.md", "exec"), ns)
    # What the block's names hold after it ran.
    assert ns["w"].dtype == np.float32 and ns["w"].shape == (512, HIDDEN)
    assert ns["raw"].dtype == np.uint8
    assert ns["y"].shape == x.shape and np.isfinite(ns["y"]).all()
    assert "affine" in ns["p"].manifest["layouts"]
    assert (tmp_path / "model.mpk.gguf").is_file()
