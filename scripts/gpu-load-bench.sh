#!/usr/bin/env bash
# On the GPU machine: the whole-model fast-start benchmarks (issue: whole-model fast start).
# STEP=whole: a generated llama-8B-shaped whole model (embedding, 32 layers of attention and FFN,
#   output head; BF16, 16.06 GB), converted with the bf16 layout, `bench-load --probe --sweep
#   --source`, then the PyTorch peer on the same bytes.
# STEP=small: the real SmolLM2 (joined from parts in /tmp/gpu-parts) and a generated 0.25 GB
#   whole model: bench-load each; `gpu-check --sections load` converting SmolLM2 and a GELU
#   whole model by every I/O mode.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
bin=.gpu-bin/metrale-pack
w="${TMPDIR:-/tmp}/metrale-whole"
mkdir -p "$w"
rc=0
# Each call may carry one part of the SmolLM2 GGUF (PART=.gpu-data/pN); collect it first.
[ -n "${PART:-}" ] && [ "${STEP:-}" != small ] && bash scripts/join-on-device.sh "$PART" /tmp/gpu-parts
case "${STEP:-whole}" in
part) ;;
whole)
  {
    t=$(date +%s%N)
    $bin gen-model "$w/src.gguf" 4096 14336 32 BF16 llama --whole --vocab 128256 --kv-dim 1024 || rc=1
    echo "gen-model: $(( ($(date +%s%N) - t) / 1000000 )) ms, $(stat -c %s "$w/src.gguf") bytes"
    t=$(date +%s%N)
    $bin convert "$w/src.gguf" -o "$w/pack.mpk.gguf" --layouts bf16 > /dev/null || rc=1
    echo "convert: $(( ($(date +%s%N) - t) / 1000000 )) ms, $(stat -c %s "$w/pack.mpk.gguf") bytes"
    $bin bench-load "$w/pack.mpk.gguf" --source "$w/src.gguf" --probe --sweep || rc=1
    rm -f "$w/src.gguf"
    $bin export-segment "$w/pack.mpk.gguf" "$w/segment.safetensors" || rc=1
    python3 scripts/peer_loaders.py safetensors "$w/segment.safetensors" || rc=1
    rm -f "$w/segment.safetensors"
  } > "$out/bench-load-whole.txt" 2> "$out/bench-load-whole.err"
  ;;
small)
  {
    bash scripts/join-on-device.sh "$PART" /tmp/gpu-parts --join "$w/smollm2.gguf" || rc=1
    $bin convert "$w/smollm2.gguf" -o "$w/smollm2.mpk.gguf" --allow-requantize > /dev/null || rc=1
    $bin bench-load "$w/smollm2.mpk.gguf" --source "$w/smollm2.gguf" --sweep || rc=1
    $bin gen-model "$w/small.gguf" 1024 4096 6 BF16 llama --whole --vocab 16000 --kv-dim 256 || rc=1
    $bin convert "$w/small.gguf" -o "$w/small.mpk.gguf" --layouts bf16 > /dev/null || rc=1
    ls -la "$w"/*.mpk.gguf
    $bin bench-load "$w/small.mpk.gguf" --source "$w/small.gguf" --sweep || rc=1
    $bin gen-model "$w/gelu.gguf" 1024 4096 4 F16 gemma --whole --vocab 8000 --kv-dim 256 || rc=1
  } > "$out/bench-load-small.txt" 2> "$out/bench-load-small.err"
  timeout 400 $bin gpu-check --sections load --load-source "$w/smollm2.gguf" --load-source "$w/gelu.gguf" \
    > "$out/gpu-check-load.txt" 2> "$out/gpu-check-load.err" || rc=1
  tail -3 "$out/gpu-check-load.txt"
  ;;
sizes)
  # Where Auto's register/ring threshold lies: whole models of about 1 and 4 GB, and the ring
  # sweep on the 16 GB model.
  {
    for l in 1 7; do
      $bin gen-model "$w/s$l.gguf" 4096 14336 $l BF16 llama --whole --vocab 32000 --kv-dim 1024 || rc=1
      $bin convert "$w/s$l.gguf" -o "$w/s$l.mpk.gguf" --layouts bf16 > /dev/null || rc=1
      rm -f "$w/s$l.gguf"
      $bin bench-load "$w/s$l.mpk.gguf" || rc=1
      rm -f "$w/s$l.mpk.gguf"
    done
    $bin gen-model "$w/src.gguf" 4096 14336 32 BF16 llama --whole --vocab 128256 --kv-dim 1024 || rc=1
    $bin convert "$w/src.gguf" -o "$w/pack.mpk.gguf" --layouts bf16 > /dev/null || rc=1
    rm -f "$w/src.gguf"
    $bin bench-load "$w/pack.mpk.gguf" --probe --sweep || rc=1
  } > "$out/bench-load-sizes.txt" 2> "$out/bench-load-sizes.err"
  ;;
peers)
  # The small packs again with this binary, each with the PyTorch peer on the same bytes.
  {
    bash scripts/join-on-device.sh "$PART" /tmp/gpu-parts --join "$w/smollm2.gguf" || rc=1
    $bin gen-model "$w/small.gguf" 1024 4096 6 BF16 llama --whole --vocab 16000 --kv-dim 256 || rc=1
    for m in smollm2 small; do
      args="--allow-requantize"; [ $m = small ] && args="--layouts bf16"
      $bin convert "$w/$m.gguf" -o "$w/$m.mpk.gguf" $args > /dev/null || rc=1
      $bin bench-load "$w/$m.mpk.gguf" --source "$w/$m.gguf" || rc=1
      $bin export-segment "$w/$m.mpk.gguf" "$w/$m.safetensors" || rc=1
      python3 scripts/peer_loaders.py safetensors "$w/$m.safetensors" || rc=1
    done
  } > "$out/bench-load-peers.txt" 2> "$out/bench-load-peers.err"
  ;;
map)
  # The arena backed piece by piece while the copies run, on the 16 GB whole model.
  {
    $bin gen-model "$w/src.gguf" 4096 14336 32 BF16 llama --whole --vocab 128256 --kv-dim 1024 || rc=1
    $bin convert "$w/src.gguf" -o "$w/pack.mpk.gguf" --layouts bf16 > /dev/null || rc=1
    rm -f "$w/src.gguf"
    $bin bench-load "$w/pack.mpk.gguf" --sweep || rc=1
  } > "$out/bench-load-map.txt" 2> "$out/bench-load-map.err"
  ;;
esac
tail -c 6000 "$out"/bench-load-*.txt
tail -5 "$out"/bench-load-*.err
exit $rc
