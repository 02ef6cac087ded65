#!/usr/bin/env bash
# On the GPU machine: where the engine's one-row GEMV (`ggml_gemv1`) spends its time (issue 56:
# 14.5 us for the 33 MB Q4_K down projection on an H100 and on an H200 alike, so not bound by
# DRAM). bench-gpu's `ggml kernel` lines for TYPES (default Q4_K,IQ4_XS) under Nsight Compute
# (clock control off), the `ggml_gemv1` launches only: SKIP launches skipped, then COUNT
# profiled (the first are the gate shape's; the down shape's follow that type's gate lines:
# SKIP=240 reaches the first type's first down launch, per_call's 12 x 20 gate launches before it).
# Per launch: duration, DRAM and SM throughput against peak, occupancy, registers, the warp
# stall reasons and the issue slots. Logs to $OUT.
#   here: bash scripts/gpu-build.sh; device run, carry [".gpu-bin"]:
#   TYPES=Q4_K SKIP=0 COUNT=2 bash scripts/gpu-ggml-profile.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "no ncu on this machine"; exit 1; }
METRALE_BENCH_ARMS="ggml kernel" METRALE_BENCH_GGML_TYPES="${TYPES:-Q4_K,IQ4_XS}" \
  "$ncu" --clock-control none -k regex:'^ggml_gemv1$' --launch-skip "${SKIP:-0}" --launch-count "${COUNT:-2}" \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section MemoryWorkloadAnalysis --section SchedulerStats \
  .gpu-bin/metrale-pack bench-gpu > "$out/ggml-profile.txt" 2>&1
grep -E "ggml_gemv1|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Grid Size|Block Size|Warp Cycles Per Issued|Issue Slot|Issued Warp|No Eligible|Stall|Mem Busy|Max Bandwidth" \
  "$out/ggml-profile.txt" | head -200
