#!/usr/bin/env bash
# On the GPU machine: the KL / top-1 / perplexity table of every layout of the real SmolLM2
# (issue: what a pack costs in model quality). The SmolLM2 GGUF arrives in parts
# (scripts/split-for-device.sh; PART=.gpu-data/pN, the last with STEP=run), the gguf wheel with
# the last part.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp}"
bin=.gpu-bin/metrale-pack
w="${TMPDIR:-/tmp}/metrale-quality"
mkdir -p "$w"
if [ "${STEP:-part}" = part ]; then
  bash scripts/join-on-device.sh "$PART" /tmp/gpu-parts
  exit 0
fi
bash scripts/join-on-device.sh "$PART" /tmp/gpu-parts --join "$w/smollm2.gguf" || exit 1
python3 -m pip install -q --no-deps --no-index --target "$w/pylib" "$PART"/gguf-*.whl || exit 1
$bin convert "$w/smollm2.gguf" -o "$w/all.mpk.gguf" --layouts nvfp4,nvfp4_t,nvfp4_mmq,q4k_mmq,fp8,w8a8,bf16,q2g128 --allow-requantize \
  > "$out/convert.txt" 2>&1 || exit 1
# The metrale_pack wheel, unpacked into .gpu-bin/py here (scripts/gpu-python.sh's note), runs
# the CUDA arms (--arms).
PYTHONPATH="$w/pylib:$PWD/.gpu-bin/py" python3 scripts/quality_kl.py "$w/smollm2.gguf" "$w/all.mpk.gguf" "$out/quality.json" \
  --record "$w/acts" --arms > "$out/quality.txt" 2> "$out/quality.err"
rc=$?
grep -v "it/s\]" "$out/quality.txt"; tail -3 "$out/quality.err" | cut -c1-300
# Every arm of every layer on the recorded real activations, against the float64 FFN.
$bin check-activations "$w/all.mpk.gguf" --source "$w/smollm2.gguf" --inputs "$w/acts" --max-rows 512 \
  > "$out/activations.txt" 2> "$out/activations.err" || rc=1
head -5 "$out/activations.txt"; tail -3 "$out/activations.err"
exit $rc
