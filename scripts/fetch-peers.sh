#!/usr/bin/env bash
# Here, before a device run of scripts/gpu-peers.sh: the peers' wheels from PyPI into
# .gpu-bin/peers/ (the carried folder), for the device's Python 3.12 on x86_64. Nothing can be
# fetched there; `pip install --no-deps --no-index` installs them.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu-bin/peers
python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --platform manylinux_2_28_x86_64 -d .gpu-bin/peers \
  instanttensor==0.2.2 fastsafetensors==0.5.0
ls -la .gpu-bin/peers
