#!/usr/bin/env bash
# On the GPU machine (scripts/gpu-build.sh and scripts/fetch-peers.sh here first; carry
# .gpu-bin): a generated llama-8B-FFN-shaped model (24 layers, bf16 layout, 8.46 GB device
# segment) loaded by `metrale-pack bench-load`, and the same bytes (the segment written as
# safetensors by export-segment) by InstantTensor 0.2.2, fastsafetensors 0.5.0 and safetensors,
# warm from the page cache and then from tmpfs (/dev/shm), each loader in its own process.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
bin=.gpu-bin/metrale-pack
w="${TMPDIR:-/tmp}/metrale-peers"
shm=/dev/shm/metrale-peers
mkdir -p "$w" "$shm"
rc=0
python3 -m pip install -q --no-deps --no-index --target "$w/pylib" .gpu-bin/peers/*.whl || rc=1
export PYTHONPATH="$w/pylib"
python3 -c 'import instanttensor, fastsafetensors; print("peers:", instanttensor.__file__, fastsafetensors.__file__)' || rc=1
t=$(date +%s)
"$bin" gen-model "$w/src.gguf" 4096 14336 24 F16 > /dev/null || rc=1
"$bin" -q convert "$w/src.gguf" -o "$w/pack.mpk.gguf" --layouts bf16 || rc=1
rm -f "$w/src.gguf"
"$bin" export-segment "$w/pack.mpk.gguf" "$w/segment.safetensors" > /dev/null || rc=1
echo "prepared in $(( $(date +%s) - t )) s: $(stat -c %s "$w/pack.mpk.gguf") byte pack, $(stat -c %s "$w/segment.safetensors") byte segment"
peers() {
  for l in instanttensor instanttensor-buffered fastsafetensors safetensors; do
    timeout 120 python3 scripts/peer_loaders.py "$l" "$1" 2>&1 | grep -E "^peer |Error|error" | tail -2 || rc=1
  done
}
echo "== page cache"
cat "$w/pack.mpk.gguf" > /dev/null
# LOAD_ARGS (say "--probe --sweep") adds to the page-cache run; its lines are kept too.
timeout 300 "$bin" bench-load "$w/pack.mpk.gguf" ${LOAD_ARGS:-} 2>&1 | grep -E "^device|ceiling|^warm|^  ring|^probe|^sweep" || rc=1
peers "$w/segment.safetensors"
echo "== tmpfs ($shm)"
cp "$w/pack.mpk.gguf" "$shm/" && rm -f "$w/pack.mpk.gguf"
timeout 150 "$bin" bench-load "$shm/pack.mpk.gguf" 2>&1 | grep -E "^device|ceiling|^warm|^  ring" || rc=1
rm -f "$shm/pack.mpk.gguf"
cp "$w/segment.safetensors" "$shm/" && rm -f "$w/segment.safetensors"
peers "$shm/segment.safetensors"
rm -rf "$shm"
exit $rc
