#!/usr/bin/env bash
# On the GPU machine (carry .gpu-bin, holding the binary and the package's wheel unpacked in
# .gpu-bin/py: scripts/gpu-build.sh then `pip wheel`/maturin here): a generated llama-8B-FFN-shaped
# pack (LAYERS layers, default 24, bf16 layout), its segment as safetensors, then
# scripts/gpu_python_load.py and `bench-load` on the same pack; with .gpu-bin/libmetrale_pack_c.so
# (capi/, built here) the C ABI is checked on CUDA too.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
bin=.gpu-bin/metrale-pack
w="${TMPDIR:-/tmp}/metrale-py"
mkdir -p "$w"
export PYTHONPATH="$PWD/.gpu-bin/py"
# The C ABI's library, when carried: checked on CUDA through ctypes by gpu_python_load.py.
[ -f .gpu-bin/libmetrale_pack_c.so ] && export METRALE_CAPI_LIB="$PWD/.gpu-bin/libmetrale_pack_c.so"
rc=0
t=$(date +%s)
if [ -n "${WHOLE:-}" ]; then  # WHOLE=1: the llama-8B-shaped whole model (16.06 GB: attention, head, vocab 128256)
  "$bin" gen-model "$w/src.gguf" 4096 14336 32 BF16 llama --whole --vocab 128256 --kv-dim 1024 > /dev/null || rc=1
else
  "$bin" gen-model "$w/src.gguf" 4096 14336 "${LAYERS:-24}" F16 > /dev/null || rc=1
fi
"$bin" -q convert "$w/src.gguf" -o "$w/pack.mpk.gguf" --layouts bf16 || rc=1
rm -f "$w/src.gguf"
"$bin" export-segment "$w/pack.mpk.gguf" "$w/segment.safetensors" > /dev/null || rc=1
cat "$w/pack.mpk.gguf" "$w/segment.safetensors" > /dev/null
echo "prepared in $(( $(date +%s) - t )) s"
timeout 200 python3 scripts/gpu_python_load.py "$w/pack.mpk.gguf" "$w/segment.safetensors" "$bin" "$out/python-load.json" || rc=1
timeout 60 "$bin" bench-load "$w/pack.mpk.gguf" --io staged 2>&1 | grep -E "ceiling|^warm" || rc=1
exit $rc
