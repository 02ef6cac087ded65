#!/usr/bin/env bash
# Convert throughput (source MB/s) at 1 and 2 threads and peak RSS, on the real SmolLM2 GGUF and
# on a generated llama-8B-FFN-shaped F16 model of >= 4 GB (hidden 4096, inter 14336, 12 layers).
# Default layouts (nvfp4,nvfp4_mmq). Usage: scripts/bench-convert.sh [WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-${TMPDIR:-/tmp}/metrale-bench}"
mkdir -p "$work"
cargo build --release -q --bin metrale-pack
smol="$(scripts/fetch-model.sh smollm2)"
big="$work/gen-4096x14336x12-f16.gguf"
[ -f "$big" ] || ./target/release/metrale-pack gen-model "$big" 4096 14336 12 F16
printf '%-34s %8s %10s %12s %10s\n' model threads "src MB" "MB/s" "peak RSS"
for src in "$smol" "$big"; do
  for t in 1 2; do
    cat "$src" > /dev/null # page cache warm, as for every run
    line=$(./target/release/metrale-pack convert "$src" -o "$work/out.mpk.gguf" --threads "$t" --allow-requantize 2>&1 | tail -1)
    mbs=$(sed -E 's/.*: ([0-9.]+) MB\/s.*/\1/' <<<"$line")
    rss=$(sed -E 's/.*peak RSS ([0-9]+ MB).*/\1/' <<<"$line")
    printf '%-34s %8s %10.0f %12s %10s\n' "$(basename "$src")" "$t" "$(($(stat -c %s "$src") / 1000000))" "$mbs" "$rss"
  done
done
rm -f "$work/out.mpk.gguf"
