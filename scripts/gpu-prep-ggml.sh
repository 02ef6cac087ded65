#!/usr/bin/env bash
# Here, before a device run of scripts/gpu-ggml.sh: the binary (scripts/gpu-build.sh), llama.cpp's
# ggml sources for the peer (../shared/tools/ggml-peer.sh prepare) and two GGUF files for
# `gpu-check --load-source` written by ggml's own quantizers and gguf-py (tests/py/reference.py
# kmix_gguf): `kmix`, a Gemma-3-270M-shaped Q4_K_M of hidden 640 (Q5_0 fallbacks, Q6_K downs,
# GELU), `iqmix`, the IQ1-IQ3 types mixed per projection (SiLU), and `nvmix`, NVFP4 with a
# Q6_K down (SiLU). Packed into
# .gpu-bin/peer.tar.xz, which gpu-ggml.sh unpacks; then
#   device run, carry [".gpu-bin"]:
#   GGML_SOURCE=".gpu-bin/kmix/model.gguf .gpu-bin/iqmix/model.gguf .gpu-bin/nvmix/model.gguf" bash scripts/gpu-ggml.sh
set -euo pipefail
cd "$(dirname "$0")/.."
py=${METRALE_PYTHON:-$HOME/.cache/metrale-pack/venv/bin/python}
bash scripts/gpu-build.sh
cd .gpu-bin
rm -rf ggml-peer kmix iqmix nvmix peer.tar.xz
mkdir -p kmix iqmix nvmix
bash ../../shared/tools/ggml-peer.sh prepare ggml-peer
cp ../../shared/tools/ggml-peer.sh .
"$py" ../tests/py/reference.py kmix_gguf kmix 640 2048 gelu \
  "Q4_K/Q4_K/Q6_K;Q4_K/Q4_K/Q4_K"
"$py" ../tests/py/reference.py kmix_gguf iqmix 512 1024 silu \
  "IQ2_XXS/IQ2_XS/IQ3_XXS;IQ2_S/IQ3_S/IQ1_M;IQ1_S/IQ1_M/IQ2_S"
"$py" ../tests/py/reference.py kmix_gguf nvmix 256 512 silu "NVFP4/NVFP4/NVFP4;NVFP4/NVFP4/Q6_K" \
  "gate=0.0021,up=0.0019,down=0.0023"
rm -f kmix/*.npy iqmix/*.npy nvmix/*.npy
tar cJf peer.tar.xz ggml-peer kmix iqmix nvmix
rm -rf ggml-peer kmix iqmix nvmix
cd ..
# The carry limit is 64 MiB for the tracked tree and .gpu-bin together.
du -sh .gpu-bin
git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1
