#!/usr/bin/env bash
# Byte-identity of packs across a refactor: convert the same sources with two binaries and `cmp`.
#   scripts/compare-packs.sh OLD_BIN NEW_BIN [ADAPTER_DIR]
# Sources: the real SmolLM2 Q4_1 GGUF with every layout but lora, and with q4k_mmq's Q4_K down;
# with ADAPTER_DIR (a PEFT adapter for SmolLM2's shapes) the nvfp4+lora pack; and the
# compressed-tensors, ModelOpt and PEFT-base fixtures with every layout but lora and affine;
# SmolLM2 and the AutoAWQ, GPTQ and compressed-tensors integer fixtures in `affine`.
set -euo pipefail
cd "$(dirname "$0")/.."
old=$1; new=$2; adapter=${3:-}
smol=$(scripts/fetch-model.sh smollm2)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
all=nvfp4,nvfp4_t,nvfp4_mmq,q4k_mmq,fp8,w8a8,bf16,q2g128
cases=("$smol|--layouts $all" "$smol|--layouts q4k_mmq --q4k-down q4k" "$smol|--layouts affine")
# Every source here is quantized: both binaries need the flag (so OLD_BIN is at least the
# session-13 binary that has it).
rq=--allow-requantize
[ -n "$adapter" ] && cases+=("$smol|--layouts nvfp4,lora --lora $adapter")
for fx in ct-fp8-block-bf16-i384 ct-fp8-channel-f32-i320 modelopt-nvfp4 modelopt-fp8 ct-nvfp4a16-bf16 peft-base; do
  cases+=("tests/fixtures/$fx|--layouts $all")
done
# A PEFT adapter on the NVFP4 base, from the fixtures.
cases+=("tests/fixtures/peft-base|--layouts nvfp4,lora --lora tests/fixtures/peft-lora-default")
# The integer checkpoints in the layout that carries them.
for fx in awq-gemm-g128-f16 gptq-4bit-g128-desc-sym-f16 gptq-8bit-channel-asym-f16 ct-w4a16-asym-bf16 ct-int8-w8a8-bf16; do
  cases+=("tests/fixtures/$fx|--layouts affine")
done
fail=0
for i in "${!cases[@]}"; do
  src=${cases[$i]%%|*}; args=${cases[$i]#*|}
  "$old" convert "$src" -o "$tmp/old.mpk.gguf" $args $rq > /dev/null 2>&1
  "$new" convert "$src" -o "$tmp/new.mpk.gguf" $args $rq > /dev/null 2>&1
  if cmp -s "$tmp/old.mpk.gguf" "$tmp/new.mpk.gguf"; then r=identical; else r=DIFFERENT; fail=1; fi
  echo "$r $(stat -c %s "$tmp/new.mpk.gguf") bytes  $(basename "$src") $args"
done
exit $fail
