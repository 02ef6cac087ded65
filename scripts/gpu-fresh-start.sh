#!/usr/bin/env bash
# On the GPU machine: a fresh machine's first load (an empty kernel cache, a new process)
# against the later loads of the same process, with the kernels embedded in the binary
# (`gpu::prebuilt`) and, for comparison in the same run, compiled by NVRTC at first use
# (METRALE_NO_PREBUILT=1). The pack: a generated llama-8B-FFN-shaped model, 24 layers, bf16
# layout (8.46 GB), loaded by the staged ring.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
bin=.gpu-bin/metrale-pack
big="${TMPDIR:-/tmp}/metrale-big"
mkdir -p "$big"
rc=0
if [ ! -f "$big/pack.mpk.gguf" ]; then
  $bin gen-model "$big/src.gguf" 4096 14336 24 F16 &&
    $bin convert "$big/src.gguf" -o "$big/pack.mpk.gguf" --layouts bf16 > /dev/null &&
    rm -f "$big/src.gguf" || rc=1
fi
for mode in prebuilt nvrtc; do
  cache=$(mktemp -d)
  echo "== $mode: a new process, kernel cache $cache (empty)"
  t=$(date +%s%N)
  if [ "$mode" = nvrtc ]; then
    METRALE_NO_PREBUILT=1 METRALE_KERNEL_CACHE="$cache" $bin bench-load "$big/pack.mpk.gguf" --io staged || rc=1
  else
    METRALE_KERNEL_CACHE="$cache" $bin bench-load "$big/pack.mpk.gguf" --io staged || rc=1
  fi
  echo "process wall clock $(( ($(date +%s%N) - t) / 1000000 )) ms; cubins NVRTC wrote: $(ls "$cache" | wc -l)"
done
exit $rc
