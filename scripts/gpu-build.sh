#!/usr/bin/env bash
# Build the GPU test and bench binary here (release, stripped) into .gpu-bin/, the one
# git-ignored folder the device run carries: `device run` with carry [".gpu-bin"] and the
# command `bash scripts/gpu-run.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin metrale-pack
mkdir -p .gpu-bin
cp target/release/metrale-pack .gpu-bin/
ls -la .gpu-bin
