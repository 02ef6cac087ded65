#!/usr/bin/env bash
# On the GPU machine: where a decode call's time goes (issue: decode at the memory roofline).
# A generated llama-8B FFN layer (4096 x 14336, BF16 source) converted with every decode layout;
# `ffn-apply` runs each arm once on one row under Nsight Compute (clock control off), which
# reports per kernel: duration, DRAM and SM throughput against peak, achieved occupancy,
# registers, and the warp stall reasons.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
bin="$PWD/.gpu-bin/metrale-pack"
w="${TMPDIR:-/tmp}/metrale-decode"
mkdir -p "$w"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
$bin gen-model "$w/l.gguf" 4096 14336 1 BF16 llama > /dev/null
$bin convert "$w/l.gguf" -o "$w/l.mpk.gguf" --layouts nvfp4,fp8,w8a8,bf16,q2g128,q4k_mmq > /dev/null
python3 -c "import numpy as np; np.save('$w/x.npy', np.random.default_rng(1).standard_normal((1, 4096)).astype(np.float32))"
# ARMS (one per line) limits the arms; default: every decode arm.
arms="${ARMS:-nvfp4
nvfp4 fixed (W4A4)
fp8
bf16
w8a8
q2g128
q4k}"
while IFS= read -r arm; do
  $bin ffn-apply "$w/l.mpk.gguf" --layer 0 --arm "$arm" "$w/x.npy" "$w/y.npy" 2> /dev/null  # compile and cache
  echo "=== $arm"
  "$ncu" --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --section MemoryWorkloadAnalysis \
    ${NCU_ARGS:-} "$bin" ffn-apply "$w/l.mpk.gguf" --layer 0 --arm "$arm" "$w/x.npy" "$w/y.npy" 2>&1
done <<< "$arms" > "$out/decode-profile.txt"
grep -E "^=== |^  [a-z_0-9]+.*\(|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Grid Size|Block Size|Warp Cycles Per Issued|Issue Slot|Mem Busy|Max Bandwidth" "$out/decode-profile.txt" | head -300
