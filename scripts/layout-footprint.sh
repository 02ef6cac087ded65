#!/usr/bin/env bash
# Issue 55's measure: for each built-in layout, how many source files outside its folder
# (src/layouts/TAG/) name it: its tag or its `Layout` variant, as a whole word, in the library,
# the converters and the kernels (tests, scripts and docs not counted). `-v` lists the files.
set -euo pipefail
cd "$(dirname "$0")/.."
verbose="${1:-}"
for pair in affine:Affine bf16:Bf16 fp8:Fp8 lora:Lora nvfp4:Nvfp4 nvfp4_mmq:Nvfp4Mmq \
  nvfp4_t:Nvfp4T q2g128:Q2g128 q4k_mmq:Q4kMmq w8a8:W8a8; do
  tag="${pair%%:*}" var="${pair##*:}"
  files=$(git ls-files src converters kernels build.rs | grep -E '\.(rs|cu|cuh)$' \
    | grep -v "^src/layouts/$tag/" | xargs grep -lwE "$tag|$var" || true)
  printf '%-10s %3d\n' "$tag" "$(printf '%s' "$files" | grep -c . || true)"
  [ "$verbose" = -v ] && printf '%s\n' "$files" | sed 's/^/    /'
done
