#!/usr/bin/env bash
# On the GPU machine: compute-sanitizer's four tools over `gpu-check --quick`, one section or
# arm group per process so that each fits a device call, run side by side; plus a PyTorch probe of
# cuBLAS alone (scripts/sanitize_cublas.py). Logs and a summary go to $OUT.
#   BIN:  the binary (default .gpu-bin/metrale-pack); OLD: a second binary whose layer checks
#   also run under initcheck (to compare a change), if it exists.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
bin="${BIN:-.gpu-bin/metrale-pack}"
old="${OLD:-.gpu-bin/metrale-pack-nozero}"
cs="${CS:-compute-sanitizer}"
limit="${SAN_TIMEOUT:-500}"
# The plain run first: it checks the binary, and compiles every module once so no sanitizer run
# spends its time in NVRTC.
t0=$(date +%s)
"$bin" gpu-check --quick > "$out/plain.txt" 2> "$out/plain.err"
echo "plain gpu-check --quick rc=$? secs=$(( $(date +%s) - t0 ))"; grep -v " PASS$" "$out/plain.txt" | tail -15
run() {
  local name=$1; shift
  local t0=$(date +%s)
  timeout "$limit" "$cs" --print-limit 200 "$@" > "$out/$name.log" 2>&1
  echo "$name rc=$? secs=$(( $(date +%s) - t0 ))" >> "$out/rc.txt"
}
q="gpu-check --quick"
for tool in memcheck synccheck initcheck; do
  run "$tool-all" --tool "$tool" "$bin" $q &
done
run racecheck-kernels --tool racecheck "$bin" $q --sections kernels &
run racecheck-load --tool racecheck "$bin" $q --sections load &
for g in "fp8,w8a8" "bf16" "nvfp4 t,nvfp4 gelu,nvfp4 mmq,nvfp4 lora,nvfp4 w4a4" "q2,q4k,ksplit,silu fused"; do
  tag=$(echo "$g" | tr ' ,' '_+')
  run "racecheck-layers-$tag" --tool racecheck "$bin" $q --sections layers --arms "$g" &
  [ -x "$old" ] && run "initcheck-old-layers-$tag" --tool initcheck "$old" $q --sections layers --arms "$g" &
done
[ -x "$old" ] && run initcheck-old-kernels --tool initcheck "$old" $q --sections kernels &
run cublas-initcheck --tool initcheck python3 scripts/sanitize_cublas.py init &
run cublas-racecheck --tool racecheck python3 scripts/sanitize_cublas.py race &
python3 scripts/sanitize_cublas.py repeat > "$out/cublas-repeat.log" 2>&1 &
wait
sort "$out/rc.txt"
for f in "$out"/*.log; do
  n=$(basename "$f" .log)
  summ=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|checks took|GPU check failed|Error:" "$f" | tr '\n' ' ')
  echo "== $n: $summ"
  # Where the reports are: kernel names, most frequent first.
  grep -oE "(at|in) (0x[0-9a-f]+ in )?[A-Za-z_][A-Za-z0-9_]*(\(|<| )" "$f" | grep -oE "[A-Za-z_][A-Za-z0-9_]*(\(|<| )$" \
    | tr -d '(< ' | sort | uniq -c | sort -rn | head -6
done
cat "$out/cublas-repeat.log"
