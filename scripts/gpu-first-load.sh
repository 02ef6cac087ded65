#!/usr/bin/env bash
# On the GPU machine (carry .gpu-bin): the first load of a new process on small packs (one
# and three llama-8B FFN layers, bf16 layout: 0.35 and 1.06 GB), with the staging ring pinned
# while the driver starts (the default) and without it (METRALE_PREPIN=0: the first load
# registers the mapping), with the ring's first chunks whole (--no-ramp) against growing
# (the default), and with the side job (forward context, kernel modules) after the copy
# (--side-after) against beside it (the default), each in fresh processes, warm; the first
# `warm` line of each process is its first load. RUNS ("PREPIN ARGS;..." variants separated by
# ';') overrides the list of variants.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
bin=.gpu-bin/metrale-pack
w="${TMPDIR:-/tmp}/metrale-first"
mkdir -p "$w"
rc=0
for layers in 1 3; do
  p="$w/pack$layers.mpk.gguf"
  if [ ! -f "$p" ]; then
    $bin gen-model "$w/src.gguf" 4096 14336 "$layers" F16 > /dev/null &&
      $bin -q convert "$w/src.gguf" -o "$p" --layouts bf16 && rm -f "$w/src.gguf" || rc=1
  fi
  cat "$p" > /dev/null
  runs=("1" "1 --no-ramp" "1" "1 --no-ramp" "0" "1" "1 --no-ramp")
  [ -n "${RUNS:-}" ] && IFS=';' read -ra runs <<< "$RUNS"
  for run in "${runs[@]}"; do
    set -- $run
    prepin=$1
    shift
    echo "== $layers layer(s), METRALE_PREPIN=$prepin $*, a new process"
    t=$(date +%s%N)
    METRALE_PREPIN=$prepin timeout 120 $bin bench-load "$p" "$@" 2>&1 | grep -E "^device|ceiling|^warm|^  ring" | head -12 || rc=1
    echo "process wall clock $(( ($(date +%s%N) - t) / 1000000 )) ms"
  done
done
exit $rc
