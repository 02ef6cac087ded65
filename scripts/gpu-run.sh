#!/usr/bin/env bash
# On the GPU machine: run every GPU check and benchmark with the binary from scripts/gpu-build.sh
# and print a short table. Logs go to $OUT when the device tool provides it.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
bin=.gpu-bin/metrale-pack
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
rc=0
if [ -z "${SKIP_GPU_CHECK:-}" ]; then
  timeout "${CHECK_TIMEOUT:-480}" "$bin" gpu-check ${GPU_CHECK_ARGS:-} > "$out/gpu-check.txt" 2> "$out/gpu-check.err" || rc=1
fi
if [ -z "${SKIP_BENCH_GPU:-}" ]; then
  timeout "${BENCH_TIMEOUT:-240}" "$bin" bench-gpu > "$out/bench-gpu.txt" 2> "$out/bench-gpu.err" || rc=1
fi
# Fast start: a generated >= 8 GB pack (llama-8B FFN shapes, 24 layers, BF16 layout) and its source.
big="${TMPDIR:-/tmp}/metrale-big"
mkdir -p "$big"
if [ -z "${SKIP_LOAD_BENCH:-}" ]; then
  timeout "${LOAD_TIMEOUT:-300}" bash -c "
    '$bin' gen-model '$big/src.gguf' 4096 14336 24 F16 &&
    '$bin' convert '$big/src.gguf' -o '$big/pack.mpk.gguf' --layouts bf16 &&
    '$bin' bench-load '$big/pack.mpk.gguf' --source '$big/src.gguf' ${LOAD_ARGS:-} &&
    '$bin' export-segment '$big/pack.mpk.gguf' '$big/segment.safetensors' &&
    python3 scripts/peer_loaders.py safetensors '$big/segment.safetensors'" > "$out/bench-load.txt" 2> "$out/bench-load.err" || rc=1
fi
# Which matrix instructions the sm_90a modules' cubins (embedded, or compiled by the runs above) issue:
# QGMMA/HGMMA/IGMMA is Hopper's wgmma path, HMMA/IMMA the mma.sync path.
cuobj=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
for c in kernels/prebuilt/*-sm_90a.cubin "$METRALE_KERNEL_CACHE"/*-sm_90a-*.cubin; do
  [ -f "$c" ] || continue
  echo "$(basename "$c"): $("$cuobj" -sass "$c" | grep -oE '\b(QGMMA|HGMMA|IGMMA|HMMA|IMMA)\.[A-Z0-9.x]+' | sort | uniq -c | tr '\n' ';')"
done > "$out/sass.txt" 2>&1
cat "$out/sass.txt"
[ -f "$out/gpu-check.txt" ] && { grep -v " PASS$" "$out/gpu-check.txt" | tail -40; tail -3 "$out/gpu-check.err"; }
[ -f "$out/bench-gpu.txt" ] && { cat "$out/bench-gpu.txt"; tail -3 "$out/bench-gpu.err"; }
cat "$out/bench-load.txt" 2>/dev/null; tail -4 "$out/bench-load.err" 2>/dev/null
exit $rc
