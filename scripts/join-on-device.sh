#!/usr/bin/env bash
# Collect a carried part (see scripts/split-for-device.sh) into PARTS_DIR; with --join OUT, join
# every part collected so far into OUT and check the SHA-256 the first part carried.
#   scripts/join-on-device.sh .gpu-data/p1 /tmp/gpu-parts
#   scripts/join-on-device.sh .gpu-data/p2 /tmp/gpu-parts --join /tmp/smollm2.gguf
set -euo pipefail
src="$1"; parts="$2"
mkdir -p "$parts"
cp "$src"/* "$parts"/
if [ "${3:-}" = "--join" ]; then
  out="$4"
  cat "$parts"/part.* > "$out"
  want=$(cat "$parts/SHA256"); got=$(sha256sum "$out" | cut -d' ' -f1)
  [ "$want" = "$got" ] || { echo "checksum mismatch: $got != $want" >&2; exit 1; }
  echo "joined $(ls "$parts"/part.* | wc -l) parts into $out ($(stat -c %s "$out") bytes), sha256 ok"
fi
