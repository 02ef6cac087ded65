#!/usr/bin/env bash
# The device tool carries at most 64 MiB per call, and a warm machine keeps its files between
# calls. To get a larger file (the real SmolLM2 GGUF, 98 MB) there: split it here into numbered
# 48 MiB parts, one folder per call, then join them there with scripts/join-on-device.sh.
#   scripts/split-for-device.sh FILE .gpu-data      -> .gpu-data/p1/part.00, .gpu-data/p2/part.01, ... + SHA256
# Carry .gpu-data/pN (and .gpu-bin) in call N, each command copying its part to /tmp/gpu-parts/,
# the calls back to back while the machine is warm; the last call joins.
set -euo pipefail
file="$1"; dest="$2"
rm -rf "$dest"; mkdir -p "$dest/split"
split -b "${PART_SIZE:-48M}" -d "$file" "$dest/split/part."
i=1
for p in "$dest"/split/part.*; do
  mkdir -p "$dest/p$i"; mv "$p" "$dest/p$i/"; i=$((i + 1))
done
rmdir "$dest/split"
sha256sum "$file" | cut -d' ' -f1 > "$dest/p1/SHA256"
ls -la "$dest"/p*
